//! `runtime serve`: an OpenAI-compatible HTTP server around one engine.
//!
//! ```text
//! POST /v1/chat/completions   messages -> the model's chat template -> reply (stream: SSE)
//! POST /v1/completions        prompt -> continuation (stream: SSE)
//! GET  /v1/models             the one model
//! GET  /health                {"status": "ok"}
//! GET  /metrics               Prometheus text: requests, tokens, queue, engine bytes/reuse/I/O wait
//! ```
//! The HTTP side (axum on a one-thread tokio runtime) checks a request, renders its chat
//! template and puts it on a bounded queue; the engine (this thread, in the rayon pool) answers
//! the queue in order ([`worker`]). A full queue answers 503 with Retry-After, so memory does not
//! grow with waiting clients; a client that disconnects cancels its generation.

pub mod api;
pub mod metrics;
pub mod worker;

use crate::chat::ChatTemplate;
use api::{ApiError, Endpoint, Input, ReplyHead};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics::Metrics;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use worker::{Event, Job, Worker};

/// Largest request body accepted (413 above it).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How long a client may take to send its body once its headers are in (408 after it).
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Bytes of request bodies held at once across every client still sending one (503 beyond):
/// a client that sends its headers and then stalls holds only what it sent, and nothing after
/// [`BODY_TIMEOUT`]; the queue's slots go to requests whose body is in.
pub const BODY_BYTES_IN_FLIGHT: usize = 4 << 20;

/// Bytes an event of a streamed reply adds to its token's text (an SSE chunk's JSON).
const EVENT_BYTES_PER_TOKEN: usize = 256;

/// The HTTP side's own memory: its thread, the tokio runtime, each connection's buffers.
const HTTP_RUNTIME_BYTES: u64 = 2 << 20;

/// What the server holds for its requests beyond the engine's plan, whatever clients send:
/// bodies being received ([`BODY_BYTES_IN_FLIGHT`], counted by their buffers' capacity and
/// held until parsed); one body at a time parsed into its JSON value and request (the HTTP
/// side is one thread, and a request too long for the context is refused before the next
/// await); every admitted request (the queue and the one answered) with its text, rendered
/// template and reply, each at most `ctx` tokens of the longest token's bytes, and its reply's
/// events; and the HTTP runtime. A streamed run's plan counts it (`StreamSettings::host_bytes`).
pub fn held_bytes(queue_capacity: usize, ctx: usize, max_token_bytes: usize) -> u64 {
    let max_text = ctx as u64 * max_token_bytes as u64;
    let per_request = 3 * max_text + (ctx * EVENT_BYTES_PER_TOKEN) as u64;
    (BODY_BYTES_IN_FLIGHT + 2 * MAX_BODY_BYTES) as u64
        + (queue_capacity as u64 + 1).saturating_mul(per_request)
        + HTTP_RUNTIME_BYTES
}

pub struct ServeConfig {
    pub addr: SocketAddr,
    /// Requests waiting beyond the one being answered; past it, 503.
    pub queue_capacity: usize,
    /// Checked on every request as `Authorization: Bearer <key>` (401 otherwise).
    pub api_key: Option<String>,
    /// The name `/v1/models` lists and replies carry.
    pub model_name: String,
}

/// What the handlers share.
pub struct AppState {
    jobs: Sender<Job>,
    template: Option<ChatTemplate>,
    template_missing: String,
    config: ServeConfig,
    /// The KV cache positions (a request's prompt plus max_tokens must fit).
    ctx: usize,
    /// No text longer than this can fit `ctx` tokens (`ctx x Tokenizer::max_token_bytes`): a
    /// request's text beyond it is refused before its template is rendered or it is tokenized.
    max_prompt_bytes: usize,
    metrics: Arc<Metrics>,
    /// Requests whose body is in (checked, queued, answered, streaming): the queue plus the one
    /// being answered; beyond that, 503. Together with `body_kib` the memory held for requests
    /// is bounded whatever the number of clients.
    admitted: Arc<tokio::sync::Semaphore>,
    /// KiB of bodies being received ([`BODY_BYTES_IN_FLIGHT`]).
    body_kib: Arc<tokio::sync::Semaphore>,
    next_id: AtomicU64,
    created: u64,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Serves `opened` until the process is stopped. `template`: the model's chat template (None:
/// /v1/chat/completions answers 400 naming `template_missing`). `on_listen` gets the bound
/// address (port 0 picks a free one) before the first request is taken.
pub fn serve(
    opened: crate::Opened,
    template: Option<ChatTemplate>,
    template_missing: String,
    ctx: usize,
    config: ServeConfig,
    on_listen: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let max_prompt_bytes = ctx.saturating_mul(opened.tokenizer.max_token_bytes);
    let worker = Worker::new(opened, ctx, metrics.clone())?;
    // the admission semaphore bounds what waits here (see AppState::admitted)
    let (jobs, queue) = std::sync::mpsc::channel::<Job>();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(config.addr))
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.addr))?;
    let addr = listener.local_addr()?;
    let admitted = Arc::new(tokio::sync::Semaphore::new(config.queue_capacity + 1));
    let state = Arc::new(AppState {
        jobs,
        template,
        template_missing,
        config,
        ctx,
        max_prompt_bytes,
        metrics,
        admitted,
        body_kib: Arc::new(tokio::sync::Semaphore::new(BODY_BYTES_IN_FLIGHT / 1024)),
        next_id: AtomicU64::new(1),
        created: unix_now(),
    });
    let app = router(state);
    let http = std::thread::Builder::new()
        .name("http".into())
        .spawn(move || rt.block_on(async move { axum::serve(listener, app).await }))?;
    on_listen(addr);
    // the engine answers until the HTTP side (the last sender) is gone
    worker.run(queue);
    match http.join() {
        Ok(r) => r.map_err(|e| anyhow::anyhow!("the HTTP server stopped: {e}")),
        Err(_) => anyhow::bail!("the HTTP server thread panicked"),
    }
}

/// The routes, with the API key check on every one of them.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_by_id))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(|| async {
            ApiError::status(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "no such endpoint: see /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::status(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method not allowed on this endpoint",
            )
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

/// The API key, on every route but `/health` (a load balancer's probe carries none). The
/// scheme is case-insensitive, as HTTP's auth schemes are (RFC 9110 11.1).
async fn authorize(State(s): State<Arc<AppState>>, req: Request, next: axum::middleware::Next) -> Response {
    if let Some(key) = s.config.api_key.as_ref().filter(|_| req.uri().path() != "/health") {
        let given = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        if given != Some(key.as_str()) {
            let mut e = ApiError::status(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "a valid API key is required: send 'Authorization: Bearer <key>' (runtime serve --api-key)",
            );
            e.code = Some("invalid_api_key");
            return e.into_response();
        }
    }
    next.run(req).await
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    Json(json!({"status": "ok", "queued": s.metrics.queued.load(Relaxed), "queue_capacity": s.config.queue_capacity}))
        .into_response()
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    Json(json!({"object": "list", "data": [{"id": s.config.model_name, "object": "model", "created": s.created, "owned_by": "local"}]})).into_response()
}

/// `GET /v1/models/{id}` (the OpenAI client's `models.retrieve`): the one model, or 404.
async fn model_by_id(State(s): State<Arc<AppState>>, axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    if id != s.config.model_name {
        let mut e = ApiError::status(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no model '{id}': this server runs '{}'", s.config.model_name),
        );
        e.code = Some("model_not_found");
        return e.into_response();
    }
    Json(json!({"id": s.config.model_name, "object": "model", "created": s.created, "owned_by": "local"}))
        .into_response()
}

async fn metrics_text(State(s): State<Arc<AppState>>) -> Response {
    let body = s.metrics.render(s.config.queue_capacity, crate::bench::rss_bytes(), crate::bench::peak_rss_bytes());
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn chat_completions(State(s): State<Arc<AppState>>, body: Body) -> Response {
    answer(s, Endpoint::Chat, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(s): State<Arc<AppState>>, body: Body) -> Response {
    answer(s, Endpoint::Completion, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// 503 with Retry-After: about one request's time per waiting request.
fn busy(s: &AppState) -> ApiError {
    s.metrics.requests_rejected.fetch_add(1, Relaxed);
    let message = format!(
        "the server is busy: {} requests are waiting (runtime serve --queue); retry later",
        s.config.queue_capacity
    );
    let mut err = ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
    err.code = Some("queue_full");
    let busy_s = s.metrics.busy_us.load(Relaxed) as f64 / 1e6;
    let answered: u64 = s.metrics.requests_ok.iter().map(|c| c.load(Relaxed)).sum();
    err.retry_after_s =
        Some(((busy_s / answered.max(1) as f64) * s.config.queue_capacity as f64).ceil().max(1.0) as u64);
    err
}

/// The request body, read within [`BODY_TIMEOUT`] and at most [`MAX_BODY_BYTES`], its buffer's
/// capacity counted against [`BODY_BYTES_IN_FLIGHT`] (the permits come back with it: they are
/// returned once it is parsed).
async fn read_body(s: &AppState, body: Body) -> Result<(Vec<u8>, Vec<tokio::sync::OwnedSemaphorePermit>), ApiError> {
    use futures_util::StreamExt;
    let read = async {
        let mut frames = body.into_data_stream();
        let mut bytes: Vec<u8> = Vec::new();
        let mut held = Vec::new();
        while let Some(frame) = frames.next().await {
            let frame = frame.map_err(|e| {
                ApiError::status(StatusCode::BAD_REQUEST, "invalid_request_error", format!("reading the body: {e}"))
            })?;
            if bytes.len() + frame.len() > MAX_BODY_BYTES {
                return Err(ApiError::status(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    format!("the body exceeds {MAX_BODY_BYTES} bytes"),
                ));
            }
            let need = bytes.len() + frame.len();
            if need <= bytes.capacity() {
                bytes.extend_from_slice(&frame);
                continue;
            }
            // grow by doubling (up to the largest body), each new KiB of capacity counted
            let grown = need.max(2 * bytes.capacity()).min(MAX_BODY_BYTES);
            let kib = (grown.div_ceil(1024) - bytes.capacity().div_ceil(1024)) as u32;
            held.push(s.body_kib.clone().try_acquire_many_owned(kib).map_err(|_| {
                s.metrics.requests_rejected.fetch_add(1, Relaxed);
                let mut e = ApiError::status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    format!(
                        "the server is receiving {BODY_BYTES_IN_FLIGHT} bytes of request bodies already; retry later"
                    ),
                );
                e.retry_after_s = Some(1);
                e
            })?);
            bytes.reserve_exact(grown - bytes.len());
            bytes.extend_from_slice(&frame);
        }
        Ok((bytes, held))
    };
    tokio::time::timeout(BODY_TIMEOUT, read).await.unwrap_or_else(|_| {
        Err(ApiError::status(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("the body did not arrive within {} s", BODY_TIMEOUT.as_secs()),
        ))
    })
}

async fn answer(s: Arc<AppState>, endpoint: Endpoint, body: Body) -> Result<Response, ApiError> {
    // the body is parsed as JSON whatever its Content-Type says (curl -d sends form's)
    let (bytes, body_permits) = read_body(&s, body).await?;
    let req = api::parse(endpoint, &bytes)?;
    drop((bytes, body_permits));
    let permit = s.admitted.clone().try_acquire_owned().map_err(|_| busy(&s))?;
    // refused at the door when no prompt could fit; the engine checks prompt + max_tokens
    if let Some(m) = req.max_tokens.filter(|&m| m >= s.ctx) {
        return Err(ApiError::invalid(
            format!(
                "max_tokens {m} leaves no room for a prompt in the context of {} tokens (runtime serve --ctx)",
                s.ctx
            ),
            Some("max_tokens"),
        )
        .with_code("context_length_exceeded"));
    }
    let text_bytes: usize = match &req.input {
        Input::Messages(m) => m.iter().map(|m| m.content.len()).sum(),
        Input::Prompt(p) => p.len(),
    };
    if text_bytes > s.max_prompt_bytes {
        return Err(ApiError::invalid(
            format!(
                "the prompt's {text_bytes} bytes are more than the context of {} tokens can hold (runtime serve --ctx)",
                s.ctx
            ),
            None,
        )
        .with_code("context_length_exceeded"));
    }
    let (prompt, add_special) = match &req.input {
        Input::Messages(m) => {
            let t =
                s.template.as_ref().ok_or_else(|| ApiError::invalid(s.template_missing.clone(), Some("messages")))?;
            (t.render(m, true).map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?, false)
        }
        Input::Prompt(p) => (p.clone(), true),
    };
    let id = s.next_id.fetch_add(1, Relaxed);
    let head = ReplyHead {
        endpoint,
        id: format!("{}-{id}", if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" }),
        created: unix_now(),
        model: s.config.model_name.clone(),
    };
    let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        id: id.to_string(),
        endpoint,
        stream: req.stream,
        prompt,
        add_special,
        max_tokens: req.max_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed,
        stop: req.stop.clone(),
        events,
        received: std::time::Instant::now(),
    };
    s.metrics.queued.fetch_add(1, Relaxed);
    if s.jobs.send(job).is_err() {
        s.metrics.queued.fetch_sub(1, Relaxed);
        return Err(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the engine has stopped"));
    }
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Failed(e)) => return Err(e),
        _ => {
            return Err(ApiError::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "the engine dropped the request",
            ))
        }
    }
    if req.stream {
        return Ok(stream_reply(head, rx, req.include_usage, permit).into_response());
    }
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done { finish_reason, usage }) => {
                return Ok(Json(head.complete(&text, finish_reason.as_str(), &usage)).into_response())
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(Event::Started) | None => {
                return Err(ApiError::status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "the engine dropped the request",
                ))
            }
        }
    }
}

/// Server-sent events: a chunk per piece of text, a last chunk with the finish reason, the
/// usage chunk when asked, then `[DONE]`. Dropping the stream (the client went away) closes the
/// channel, which cancels the generation.
fn stream_reply(
    head: ReplyHead,
    rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
    struct St {
        rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
        head: ReplyHead,
        first: bool,
        pending: std::collections::VecDeque<String>,
        done: bool,
        include_usage: bool,
        /// Held until the stream ends or the client goes away.
        _permit: tokio::sync::OwnedSemaphorePermit,
    }
    let st = St { rx, head, first: true, pending: Default::default(), done: false, include_usage, _permit: permit };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(data) = st.pending.pop_front() {
                return Some((Ok(SseEvent::default().data(data)), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(Event::Text(t)) => {
                    st.pending.push_back(st.head.chunk(Some(&t), st.first, None).to_string());
                    st.first = false;
                }
                Some(Event::Done { finish_reason, usage }) => {
                    if st.first {
                        st.pending.push_back(st.head.chunk(Some(""), true, None).to_string());
                    }
                    st.pending.push_back(st.head.chunk(None, false, Some(finish_reason.as_str())).to_string());
                    if st.include_usage {
                        st.pending.push_back(st.head.usage_chunk(&usage).to_string());
                    }
                    st.pending.push_back("[DONE]".into());
                    st.done = true;
                }
                Some(Event::Failed(e)) => {
                    // the status line is already sent: the error goes in the stream, as OpenAI does
                    st.pending.push_back(e.body().to_string());
                    st.pending.push_back("[DONE]".into());
                    st.done = true;
                }
                Some(Event::Started) => {}
                None => return None,
            }
        }
    });
    Sse::new(stream)
}
