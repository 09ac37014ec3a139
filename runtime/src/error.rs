use formats::FormatError;
use std::path::PathBuf;

/// A run setting a caller chooses, as errors name it (a command line maps each to its flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Context,
    MemoryBudget,
    DensePrefix,
    SetScale,
    SlotShare,
    Task,
    BlockBytes,
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Setting::Context => "context",
            Setting::MemoryBudget => "memory budget",
            Setting::DensePrefix => "dense prefix",
            Setting::SetScale => "set scale",
            Setting::SlotShare => "slot share",
            Setting::Task => "task",
            Setting::BlockBytes => "block size",
        })
    }
}

/// Errors of the runtime library. Each names the file or the limit involved, and no flag of a
/// command line: a caller words them for its own interface ([`Setting`] says which setting).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Format(#[from] FormatError),

    #[error("{path}: cannot load tokenizer: {message}")]
    Tokenizer { path: PathBuf, message: String },

    #[error(
        "{path}: the tokenizer has {tokenizer_vocab} tokens but the model's embedding has only {model_vocab} rows"
    )]
    VocabMismatch { path: PathBuf, tokenizer_vocab: usize, model_vocab: usize },

    #[error("the sequence needs {needed} positions but the context holds {ctx} (prompt of {prompt_tokens} tokens); use a shorter prompt or a larger context")]
    ContextOverflow { needed: usize, ctx: usize, prompt_tokens: usize },

    /// A prompt longer than the context can hold, found before it was tokenized whole.
    #[error("the prompt is more than {max_tokens} tokens; the context holds {ctx}")]
    PromptTooLong { max_tokens: usize, ctx: usize },

    #[error("a context of {ctx} positions exceeds the model's max_position_embeddings {max}")]
    CtxTooLarge { ctx: usize, max: usize },

    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { token: u32, vocab: usize },

    #[error("{path}: the text tokenizes to {tokens} tokens; at least {needed} (2 x ctx) are needed")]
    TextTooShort { path: PathBuf, tokens: usize, needed: usize },

    /// A read or open that the OS refused (EIO, ENOENT, ...); `offset` where a read failed.
    #[error("{}: {source}{}", path.display(), offset.map(|o| format!(" (reading at byte offset {o})")).unwrap_or_default())]
    Io {
        path: PathBuf,
        offset: Option<u64>,
        #[source]
        source: std::io::Error,
    },

    /// Bytes that came back but are not what the file must hold there (a short file, a bad
    /// checksum found outside `formats`).
    #[error("{}: {what} at byte offset {offset}", path.display())]
    Corrupt { path: PathBuf, offset: u64, what: String },

    #[error("a memory budget of {budget} bytes is too small: this model needs at least {minimum} bytes ({:.1} MiB): {breakdown}", *minimum as f64 / 1048576.0)]
    BudgetTooSmall { budget: u64, minimum: u64, breakdown: String },

    /// A NaN or infinity in a layer's output or the logits: the weights or the input are broken,
    /// and nothing computed from them can be trusted.
    #[error("{what} is not finite (NaN or infinity) after {place}: a corrupt weight or an overflow; refusing to sample from it")]
    NonFinite { what: &'static str, place: String },

    /// A setting no run can use: `value` as given, and why.
    #[error("{setting} {value}: {why}")]
    Setting { setting: Setting, value: String, why: String },

    /// A broken invariant inside the runtime: a bug, not the input.
    #[error("internal error (a bug; please report it): {0}")]
    Internal(String),

    #[error("{0}")]
    Input(String),
}

pub type Result<T> = std::result::Result<T, RuntimeError>;
