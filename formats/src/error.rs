use std::path::PathBuf;

/// Every error a layout reader or writer can report. Each variant names the file and,
/// where a byte position is known, the offset, so a user can find what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: not a GGUF file (magic bytes {magic:02x?}, expected \"GGUF\")")]
    NotGguf { path: PathBuf, magic: [u8; 4] },

    #[error("{path}: GGUF version {version} is not supported (2 and 3 are)")]
    GgufVersion { path: PathBuf, version: u32 },

    #[error("{path}: truncated at byte offset {offset}: {what} needs {needed} bytes, file has {file_bytes}")]
    Truncated { path: PathBuf, offset: u64, what: String, needed: u64, file_bytes: u64 },

    #[error("{path}: corrupt at byte offset {offset}: {what}")]
    Corrupt { path: PathBuf, offset: u64, what: String },

    #[error("{path}: tensor '{tensor}' has GGML type {type_name} ({type_id}), which is not supported (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)")]
    UnsupportedTensorType { path: PathBuf, tensor: String, type_id: u32, type_name: String },

    #[error("{path}: tensor '{tensor}' is stored as GGML type '{type_name}', which is not computed (supported: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)")]
    UnsupportedStoredType { path: PathBuf, tensor: String, type_name: String },

    #[error("{path}: architecture '{arch}' is not supported (supported: llama, mistral, qwen2)")]
    UnsupportedArchitecture { path: PathBuf, arch: String },

    #[error("{path}: missing metadata key '{key}'")]
    MissingKey { path: PathBuf, key: String },

    #[error("{path}: metadata key '{key}' has the wrong type: expected {expected}")]
    WrongKeyType { path: PathBuf, key: String, expected: &'static str },

    #[error("{path}: missing tensor '{tensor}'")]
    MissingTensor { path: PathBuf, tensor: String },

    #[error("{path}: tensor '{tensor}' has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch { path: PathBuf, tensor: String, expected: Vec<usize>, actual: Vec<usize> },

    #[error("{path}: tensor '{tensor}' has dtype {dtype}, expected {expected}")]
    DtypeMismatch { path: PathBuf, tensor: String, dtype: String, expected: &'static str },

    #[error("{path}: invalid safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },

    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

impl FormatError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io { path: path.into(), source }
    }
    pub fn invalid(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        FormatError::Invalid { path: path.into(), what: what.into() }
    }
}

pub type Result<T> = std::result::Result<T, FormatError>;

/// An error and its causes on one line for a user: each cause is appended unless the message so
/// far already says it (most of our messages embed their OS or JSON cause, which a plain
/// chain would print twice).
pub fn display_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !msg.contains(&text) {
            msg = format!("{msg}: {text}");
        }
        cause = c.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_the_message_already_says_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let e = super::FormatError::io(std::path::Path::new("/x/model.gguf"), io);
        let text = super::display_chain(&e);
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
        assert!(text.contains("/x/model.gguf"), "{text}");
    }
}
