//! The OpenAI request bodies `runtime serve` accepts, checked field by field, and the JSON it
//! answers with (completions, chunks, errors).

use crate::chat::ChatMessage;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

/// An error as OpenAI's API reports it: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before retrying (503).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: param.map(str::to_string),
            code: None,
            retry_after_s: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn status(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, message: message.into(), param: None, code: None, retry_after_s: None }
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s {
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    pub const ALL: [Endpoint; 2] = [Endpoint::Chat, Endpoint::Completion];

    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completion => "completion",
        }
    }

    /// Its place in [`Endpoint::ALL`] (the metrics' per-endpoint counters).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What is asked for, checked.
#[derive(Debug, Clone)]
pub enum Input {
    Messages(Vec<ChatMessage>),
    Prompt(String),
}

#[derive(Debug, Clone)]
pub struct Request {
    pub input: Input,
    /// None: the rest of the context.
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

type Fields = Map<String, Value>;

fn type_error(param: &str, want: &str, got: &Value) -> ApiError {
    let got = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    ApiError::invalid(format!("'{param}' must be {want}, not {got}"), Some(param))
}

/// A field, None when absent or null.
fn field<'a>(f: &'a Fields, name: &str) -> Option<&'a Value> {
    f.get(name).filter(|v| !v.is_null())
}

fn number(f: &Fields, name: &str, lo: f64, hi: f64, lo_open: bool) -> Result<Option<f64>, ApiError> {
    let Some(v) = field(f, name) else { return Ok(None) };
    let x = v.as_f64().ok_or_else(|| type_error(name, "a number", v))?;
    let above = if lo_open { x > lo } else { x >= lo };
    if !(above && x <= hi) {
        let open = if lo_open { "(" } else { "[" };
        return Err(ApiError::invalid(format!("'{name}' is {x}: expected a value in {open}{lo}, {hi}]"), Some(name)));
    }
    Ok(Some(x))
}

fn boolean(f: &Fields, name: &str) -> Result<Option<bool>, ApiError> {
    match field(f, name) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| type_error(name, "a boolean", v)),
    }
}

fn positive_int(f: &Fields, name: &str) -> Result<Option<usize>, ApiError> {
    let Some(v) = field(f, name) else { return Ok(None) };
    match v.as_u64() {
        Some(n) if n >= 1 => Ok(Some(n.min(usize::MAX as u64) as usize)),
        _ if v.is_number() => Err(ApiError::invalid(format!("'{name}' is {v}: expected an integer >= 1"), Some(name))),
        _ => Err(type_error(name, "an integer", v)),
    }
}

/// Parameters this server does not implement: refused when they would change the answer, so a
/// client never gets output computed other than it asked.
fn refuse_unsupported(f: &Fields) -> Result<(), ApiError> {
    let unsupported = |name: &str, why: &str| {
        Err(ApiError::invalid(format!("'{name}' is not supported by this server ({why})"), Some(name)))
    };
    if let Some(n) = field(f, "n") {
        if n.as_u64() != Some(1) {
            return unsupported("n", "one choice per request");
        }
    }
    if let Some(b) = field(f, "best_of") {
        if b.as_u64() != Some(1) {
            return unsupported("best_of", "one choice per request");
        }
    }
    for name in ["frequency_penalty", "presence_penalty"] {
        if let Some(v) = field(f, name) {
            if v.as_f64() != Some(0.0) {
                return unsupported(name, "no repetition penalties");
            }
        }
    }
    for name in ["logprobs", "echo"] {
        if let Some(v) = field(f, name) {
            if v != &Value::Bool(false) && v.as_u64() != Some(0) {
                return unsupported(name, "text only");
            }
        }
    }
    if let Some(v) = field(f, "logit_bias") {
        if v.as_object().is_none_or(|m| !m.is_empty()) {
            return unsupported("logit_bias", "no logit biases");
        }
    }
    for name in ["tools", "functions", "suffix"] {
        if let Some(v) = field(f, name) {
            if v.as_array().is_none_or(|a| !a.is_empty()) && v.as_str().is_none_or(|s| !s.is_empty()) {
                return unsupported(name, "plain text generation");
            }
        }
    }
    if let Some(v) = field(f, "response_format") {
        if v.get("type").and_then(Value::as_str) != Some("text") {
            return unsupported("response_format", "text only");
        }
    }
    Ok(())
}

fn message(i: usize, v: &Value) -> Result<ChatMessage, ApiError> {
    let param = format!("messages[{i}]");
    let m = v.as_object().ok_or_else(|| type_error(&param, "an object", v))?;
    let role = match m.get("role") {
        Some(Value::String(r)) => r.as_str(),
        Some(other) => return Err(type_error(&format!("{param}.role"), "a string", other)),
        None => return Err(ApiError::invalid(format!("'{param}.role' is missing"), Some(&format!("{param}.role")))),
    };
    let role = match role {
        "system" | "user" | "assistant" | "tool" => role,
        // OpenAI's newer name for system instructions
        "developer" => "system",
        r => {
            return Err(ApiError::invalid(
                format!("'{param}.role' is '{r}': expected system, user, assistant or tool"),
                Some(&format!("{param}.role")),
            ))
        }
    };
    let content = match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) if role == "assistant" => String::new(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let pp = format!("{param}.content[{j}]");
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => {
                        return Err(ApiError::invalid(format!("'{pp}.text' must be a string"), Some(&pp)))
                    }
                    (Some(t), _) => {
                        return Err(ApiError::invalid(
                            format!("'{pp}' is of type '{t}': this model reads text only"),
                            Some(&pp),
                        ))
                    }
                    (None, _) => return Err(ApiError::invalid(format!("'{pp}' has no type"), Some(&pp))),
                }
            }
            text
        }
        Some(other) => {
            return Err(type_error(&format!("{param}.content"), "a string or an array of text parts", other))
        }
        None => {
            return Err(ApiError::invalid(format!("'{param}.content' is missing"), Some(&format!("{param}.content"))))
        }
    };
    Ok(ChatMessage { role: role.to_string(), content })
}

/// Parses and checks a request body for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Request, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), None))?;
    let Value::Object(f) = v else {
        return Err(ApiError::invalid("the body must be a JSON object", None));
    };
    if let Some(m) = field(&f, "model") {
        if !m.is_string() {
            return Err(type_error("model", "a string", m));
        }
    }
    refuse_unsupported(&f)?;
    let input = match endpoint {
        Endpoint::Chat => {
            if f.contains_key("prompt") {
                return Err(ApiError::invalid(
                    "'prompt' belongs to /v1/completions; chat takes 'messages'",
                    Some("prompt"),
                ));
            }
            let m =
                field(&f, "messages").ok_or_else(|| ApiError::invalid("'messages' is required", Some("messages")))?;
            let list = m.as_array().ok_or_else(|| type_error("messages", "an array", m))?;
            if list.is_empty() {
                return Err(ApiError::invalid(
                    "'messages' is empty: a chat needs at least one message",
                    Some("messages"),
                ));
            }
            Input::Messages(list.iter().enumerate().map(|(i, v)| message(i, v)).collect::<Result<_, _>>()?)
        }
        Endpoint::Completion => {
            if f.contains_key("messages") {
                return Err(ApiError::invalid(
                    "'messages' belongs to /v1/chat/completions; completions take 'prompt'",
                    Some("messages"),
                ));
            }
            let p = field(&f, "prompt").ok_or_else(|| ApiError::invalid("'prompt' is required", Some("prompt")))?;
            Input::Prompt(match p {
                Value::String(s) => s.clone(),
                Value::Array(a) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
                Value::Array(_) => {
                    return Err(ApiError::invalid(
                        "'prompt' must be one string (one prompt per request)",
                        Some("prompt"),
                    ))
                }
                other => return Err(type_error("prompt", "a string", other)),
            })
        }
    };
    let max_tokens = match positive_int(&f, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => positive_int(&f, "max_tokens")?,
    };
    let stop = match field(&f, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 => a
            .iter()
            .map(|s| {
                s.as_str().map(str::to_string).ok_or_else(|| type_error("stop", "a string or an array of strings", s))
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(_)) => return Err(ApiError::invalid("'stop' has more than 4 sequences", Some("stop"))),
        Some(other) => return Err(type_error("stop", "a string or an array of strings", other)),
    };
    let seed = match field(&f, "seed") {
        None => None,
        Some(v) => {
            Some(v.as_i64().map(|s| s as u64).or(v.as_u64()).ok_or_else(|| type_error("seed", "an integer", v))?)
        }
    };
    let include_usage = match field(&f, "stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(type_error("stream_options.include_usage", "a boolean", other)),
        },
        Some(other) => return Err(type_error("stream_options", "an object", other)),
    };
    Ok(Request {
        input,
        max_tokens,
        // OpenAI's defaults
        temperature: number(&f, "temperature", 0.0, 2.0, false)?.unwrap_or(1.0) as f32,
        top_p: number(&f, "top_p", 0.0, 1.0, true)?.unwrap_or(1.0) as f32,
        seed,
        stop: stop.into_iter().filter(|s: &String| !s.is_empty()).collect(),
        stream: boolean(&f, "stream")?.unwrap_or(false),
        include_usage,
    })
}

/// Token counts of one request, as OpenAI's `usage`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the KV cache of an earlier request.
    pub cached_tokens: usize,
}

impl Usage {
    pub fn json(&self) -> Value {
        json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
               "total_tokens": self.prompt_tokens + self.completion_tokens,
               "prompt_tokens_details": {"cached_tokens": self.cached_tokens}})
    }
}

/// The ids, creation time and model name shared by a reply and its chunks.
pub struct ReplyHead {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ReplyHead {
    /// The whole reply (stream false).
    pub fn complete(&self, text: &str, finish_reason: &str, usage: &Usage) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                json!({"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish_reason}],
                "usage": usage.json(), "system_fingerprint": null})
            }
            Endpoint::Completion => {
                json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}],
                "usage": usage.json(), "system_fingerprint": null})
            }
        }
    }

    /// One streamed chunk: `text` (chat: the first chunk also names the role), or the end.
    pub fn chunk(&self, text: Option<&str>, first: bool, finish_reason: Option<&str>) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                let delta = match (text, first) {
                    (Some(t), true) => json!({"role": "assistant", "content": t}),
                    (Some(t), false) => json!({"content": t}),
                    (None, _) => json!({}),
                };
                json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}], "system_fingerprint": null})
            }
            Endpoint::Completion => {
                json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish_reason}], "system_fingerprint": null})
            }
        }
    }

    /// The last chunk with `stream_options.include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        let object = if self.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [], "usage": usage.json()})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(endpoint: Endpoint, body: &str) -> String {
        let e = parse(endpoint, body.as_bytes()).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        format!("{} {:?}", e.message, e.param)
    }

    #[test]
    fn requests_are_checked_field_by_field() {
        let r = parse(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0,"stop":"\n","stream":true,"user":"x"}"#).unwrap();
        assert!(matches!(&r.input, Input::Messages(m) if m.len() == 1 && m[0].content == "hi"));
        assert_eq!(
            (r.max_tokens, r.temperature, r.stop.clone(), r.stream),
            (Some(5), 0.0, vec!["\n".to_string()], true)
        );
        let r = parse(
            Endpoint::Chat,
            br#"{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        assert!(matches!(&r.input, Input::Messages(m) if m[0].role == "system" && m[0].content == "ab"));
        assert_eq!((r.temperature, r.top_p, r.max_tokens), (1.0, 1.0, None));
        assert!(err(Endpoint::Chat, "{not json").contains("not valid JSON"));
        assert!(err(Endpoint::Chat, "[1]").contains("JSON object"));
        assert!(err(Endpoint::Chat, r#"{"messages":[]}"#).contains("empty"));
        assert!(err(Endpoint::Chat, r#"{"messages":"hi"}"#).contains("must be an array"));
        assert!(err(Endpoint::Chat, r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":"5"}"#)
            .contains("'max_tokens' must be an integer, not a string"));
        assert!(err(Endpoint::Chat, r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#)
            .contains("integer >= 1"));
        assert!(
            err(Endpoint::Chat, r#"{"messages":[{"role":"user","content":"x"}],"temperature":3}"#).contains("[0, 2]")
        );
        assert!(err(Endpoint::Chat, r#"{"messages":[{"role":"user","content":"x"}],"top_p":0}"#).contains("(0, 1]"));
        assert!(
            err(Endpoint::Chat, r#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#).contains("boolean")
        );
        assert!(err(Endpoint::Chat, r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#)
            .contains("'n' is not supported"));
        assert!(err(Endpoint::Chat, r#"{"messages":[{"role":"wizard","content":"x"}]}"#).contains("messages[0].role"));
        assert!(err(Endpoint::Chat, r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#)
            .contains("text only"));
        assert!(err(Endpoint::Chat, r#"{"model":7,"messages":[{"role":"user","content":"x"}]}"#)
            .contains("'model' must be a string"));
        assert!(err(Endpoint::Completion, r#"{"prompt":["a","b"]}"#).contains("one string"));
        assert!(err(Endpoint::Completion, r#"{"messages":[]}"#).contains("/v1/chat/completions"));
        assert!(err(Endpoint::Completion, r#"{"prompt":"a","stop":["1","2","3","4","5"]}"#).contains("more than 4"));
        let r = parse(Endpoint::Completion, br#"{"prompt":["a"],"seed":-1,"logprobs":null,"n":1}"#).unwrap();
        assert!(matches!(&r.input, Input::Prompt(p) if p == "a"));
        assert_eq!(r.seed, Some(u64::MAX));
    }
}
