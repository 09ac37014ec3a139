//! Chat templates: a model's `chat_template.jinja` (the GGUF's `tokenizer.chat_template`, kept by
//! `prep import`) rendered as transformers' `apply_chat_template` renders it.
//!
//! transformers compiles the template in a sandboxed Jinja2 environment with `trim_blocks` and
//! `lstrip_blocks`, the loop-controls extension, a `raise_exception(msg)` and a
//! `strftime_now(fmt)` global and a `tojson` filter that is Python's `json.dumps` (no HTML
//! escaping, `", "` and `": "` separators); it passes `messages`, `add_generation_prompt` and the
//! tokenizer's special tokens (`bos_token`, `eos_token`). This module does the same with
//! minijinja, whose pycompat callback supplies the Python string methods templates call
//! (`.strip()`, `.startswith()`, ...). tests/chat.rs pins strings transformers produced.

use crate::error::{Result, RuntimeError};
use crate::tokenizer::Tokenizer;
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One turn of a conversation, as OpenAI's API and transformers' templates see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// system, user, assistant or tool.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template and the special tokens it may print.
pub struct ChatTemplate {
    /// The file it came from (named in errors).
    pub path: PathBuf,
    env: Environment<'static>,
    pub bos_token: String,
    pub eos_token: String,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Loads and compiles `path`; `bos_token`/`eos_token` are the tokenizer's (empty when the
    /// model has none). A syntax error names the file and line.
    pub fn load(path: &Path, bos_token: &str, eos_token: &str) -> Result<Self> {
        let source = std::fs::read_to_string(path).map_err(|e| RuntimeError::Io {
            path: path.to_path_buf(),
            offset: None,
            source: e,
        })?;
        Self::from_source(path, source, bos_token, eos_token)
    }

    /// Loads the template beside a model with the special tokens of `tokenizer`.
    pub fn for_tokenizer(path: &Path, tokenizer: &Tokenizer, config: &formats::model_dir::ModelConfig) -> Result<Self> {
        let name = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i)).unwrap_or_default();
        Self::load(path, &name(config.bos_token_id), &name(config.eos_token_ids().first().copied()))
    }

    pub fn from_source(path: &Path, source: String, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", python_tojson);
        env.add_template_owned(NAME, source).map_err(|e| template_error(path, &e))?;
        Ok(ChatTemplate { path: path.to_path_buf(), env, bos_token: bos_token.into(), eos_token: eos_token.into() })
    }

    /// The prompt text of `messages`; with `add_generation_prompt`, ending where the assistant's
    /// reply begins. Errors (a template's raise_exception, an empty conversation) name the file.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        if messages.is_empty() {
            return Err(RuntimeError::Input("a chat needs at least one message".into()));
        }
        let t = self.env.get_template(NAME).map_err(|e| template_error(&self.path, &e))?;
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        t.render(ctx).map_err(|e| template_error(&self.path, &e))
    }
}

/// Special tokens that end a turn in the chat formats of the models we run.
const END_OF_TURN: [&str; 6] = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "</s>"];

/// The tokens that end a reply: the config's EOS and the tokenizer's end-of-turn specials.
pub fn end_of_turn_ids(config: &formats::model_dir::ModelConfig, tokenizer: &Tokenizer) -> Vec<u32> {
    let mut ids = config.eos_token_ids();
    for t in END_OF_TURN {
        if let Some(id) = tokenizer.special_token_id(t) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

fn template_error(path: &Path, e: &JinjaError) -> RuntimeError {
    let line = e.line().map(|l| format!(" (line {l})")).unwrap_or_default();
    let detail = e.detail().map(|d| format!(": {d}")).unwrap_or_default();
    RuntimeError::Input(format!("{}: chat template{line}: {}{detail}", path.display(), e.kind()))
}

/// transformers' `strftime_now(format)`: the local time, formatted by C's strftime.
fn strftime_now(format: String) -> std::result::Result<String, JinjaError> {
    let fmt = std::ffi::CString::new(format)
        .map_err(|_| JinjaError::new(ErrorKind::InvalidOperation, "strftime_now: NUL in the format"))?;
    let mut buf = vec![0u8; 256];
    // SAFETY: time/localtime_r write into the locals we pass; strftime writes at most buf.len()
    // bytes into buf and returns how many it wrote (0 on overflow), and fmt is NUL-terminated.
    let n = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&now, &mut tm);
        libc::strftime(buf.as_mut_ptr() as *mut libc::c_char, buf.len(), fmt.as_ptr(), &tm)
    };
    buf.truncate(n);
    String::from_utf8(buf).map_err(|_| JinjaError::new(ErrorKind::InvalidOperation, "strftime_now: not UTF-8"))
}

/// Python's `json.dumps(value, ensure_ascii=False)` (transformers' `tojson`), or with
/// `indent=N` its pretty form.
fn python_tojson(value: Value, kwargs: minijinja::value::Kwargs) -> std::result::Result<String, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let v = serde_json::to_value(&value).map_err(|e| JinjaError::new(ErrorKind::BadSerialization, e.to_string()))?;
    let mut out = String::new();
    write_python_json(&v, indent, 0, &mut out);
    Ok(out)
}

fn write_python_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                write_python_json(x, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, x)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                write_python_json(x, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpl(src: &str) -> ChatTemplate {
        ChatTemplate::from_source(Path::new("t.jinja"), src.into(), "<s>", "</s>").unwrap()
    }

    #[test]
    fn python_semantics() {
        let t = tmpl("{{ bos_token }}{% for m in messages %}{{ m.role + ': ' + m['content'].strip() }}\n{% endfor %}{{ messages | tojson }}");
        let out = t.render(&[ChatMessage::new("user", "  hi  ")], false).unwrap();
        assert_eq!(out, "<s>user: hi\n[{\"content\": \"  hi  \", \"role\": \"user\"}]");
    }

    #[test]
    fn raise_exception_and_syntax_errors_name_the_file() {
        let t = tmpl("{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}");
        let e = t.render(&[ChatMessage::new("user", "x")], true).unwrap_err().to_string();
        assert!(e.contains("t.jinja") && e.contains("system first"), "{e}");
        let e =
            ChatTemplate::from_source(Path::new("bad.jinja"), "{% for %}".into(), "", "").err().unwrap().to_string();
        assert!(e.contains("bad.jinja") && e.contains("line 1"), "{e}");
        assert!(tmpl("x").render(&[], true).is_err());
    }
}
