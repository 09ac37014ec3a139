//! The one engine: takes requests from the bounded queue in order and generates, sending text to
//! the request's handler as it is decoded. A request whose client has gone is cancelled between
//! tokens (its channel is closed).

use super::api::{ApiError, Endpoint, Usage};
use super::metrics::Metrics;
use crate::generate::{Continuation, FinishReason, Session};
use crate::sampler::Sampler;
use crate::Opened;
use axum::http::StatusCode;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// A request, checked and rendered to prompt text, waiting for the engine.
pub struct Job {
    pub id: String,
    pub endpoint: Endpoint,
    pub stream: bool,
    pub prompt: String,
    /// Encode with the tokenizer's BOS (completions); a rendered chat template carries its own.
    pub add_special: bool,
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub events: UnboundedSender<Event>,
    pub received: std::time::Instant,
}

/// What the engine tells a request's handler, in order: Started or Failed, then Text pieces and
/// Done (or Failed, when generation breaks part-way).
#[derive(Debug)]
pub enum Event {
    Started,
    Text(String),
    Done { finish_reason: FinishReason, usage: Usage },
    Failed(ApiError),
}

pub struct Worker {
    pub opened: Opened,
    pub session: Session,
    /// Tokens that end a reply: the config's EOS and the tokenizer's end-of-turn tokens.
    pub end_ids: Vec<u32>,
    pub metrics: Arc<Metrics>,
}

impl Worker {
    pub fn new(opened: Opened, ctx: usize, metrics: Arc<Metrics>) -> crate::Result<Self> {
        let session = Session::new(&opened.model, ctx)?;
        let end_ids = crate::chat::end_of_turn_ids(&opened.model.config, &opened.tokenizer);
        Ok(Worker { opened, session, end_ids, metrics })
    }

    /// Answers jobs until every sender is gone.
    pub fn run(mut self, jobs: std::sync::mpsc::Receiver<Job>) {
        for job in jobs {
            self.metrics.queued.fetch_sub(1, Relaxed);
            let t = std::time::Instant::now();
            self.answer(job);
            self.metrics.busy_us.fetch_add(t.elapsed().as_micros() as u64, Relaxed);
            if let Some(e) = self.opened.engine() {
                e.refresh_io_stats();
                if let Ok(mut g) = self.metrics.engine.lock() {
                    *g = Some(e.stats.clone());
                }
            }
        }
    }

    fn answer(&mut self, job: Job) {
        let ep = job.endpoint.index();
        let waited_s = job.received.elapsed().as_secs_f64();
        if job.events.is_closed() {
            self.metrics.requests_cancelled[ep].fetch_add(1, Relaxed);
            eprintln!(
                "request {} {}: cancelled while queued ({waited_s:.2} s): the client went away",
                job.id,
                job.endpoint.name()
            );
            return;
        }
        let fail = |e: ApiError| {
            eprintln!("request {} {}: {} {}", job.id, job.endpoint.name(), e.status.as_u16(), e.message);
            let _ = job.events.send(Event::Failed(e));
        };
        let ctx = self.session.ctx();
        // bounded: a prompt that cannot fit is refused before it is tokenized whole
        let prompt_ids = match self.opened.tokenizer.encode_at_most(&job.prompt, job.add_special, ctx) {
            Ok(crate::tokenizer::Bounded::Whole(ids)) => ids,
            Ok(crate::tokenizer::Bounded::MoreThan(n)) => {
                self.metrics.requests_failed[ep].fetch_add(1, Relaxed);
                return fail(
                    ApiError::invalid(
                        format!("the prompt is more than {n} tokens; the context holds {ctx} (runtime serve --ctx)"),
                        None,
                    )
                    .with_code("context_length_exceeded"),
                );
            }
            Err(e) => {
                self.metrics.requests_failed[ep].fetch_add(1, Relaxed);
                return fail(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()));
            }
        };
        let refused = if prompt_ids.is_empty() {
            Some(ApiError::invalid("the prompt is empty", Some("prompt")))
        } else if prompt_ids.len() >= ctx {
            Some(ApiError::invalid(format!("the prompt is {} tokens; the context holds {ctx} (runtime serve --ctx), and at least one must be left to generate", prompt_ids.len()), None).with_code("context_length_exceeded"))
        } else {
            match job.max_tokens {
                Some(m) if prompt_ids.len() + m > ctx => Some(
                    ApiError::invalid(format!("the prompt ({} tokens) plus max_tokens ({m}) exceed the context of {ctx} tokens (runtime serve --ctx)", prompt_ids.len()), Some("max_tokens")).with_code("context_length_exceeded"),
                ),
                _ => None,
            }
        };
        if let Some(e) = refused {
            self.metrics.requests_failed[ep].fetch_add(1, Relaxed);
            return fail(e);
        }
        let max_new_tokens = job.max_tokens.unwrap_or(ctx - prompt_ids.len());
        let _ = job.events.send(Event::Started);
        let seed = job.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
        });
        let mut sampler = Sampler::new(job.temperature, job.top_p, seed);
        let c = Continuation {
            prompt_ids: &prompt_ids,
            max_new_tokens,
            end_ids: &self.end_ids,
            mask: &[],
            stop: &job.stop,
        };
        // a prompt of more than one batch logs its progress
        let id = &job.id;
        let mut logged = false;
        let mut log_progress = |done: usize, total: usize| {
            if done < total || logged {
                eprintln!("request {id}: prompt {done}/{total} tokens");
                logged = true;
            }
        };
        let (runner, tok) = self.opened.runner_and_tokenizer();
        let mut runner = runner.with_prompt_progress(&mut log_progress);
        let events = &job.events;
        let r = self.session.generate(&mut runner, tok, &c, &mut sampler, |piece| {
            if events.send(Event::Text(piece.to_string())).is_err() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        match r {
            Ok(rep) => {
                let usage = Usage {
                    prompt_tokens: rep.prompt_tokens,
                    completion_tokens: rep.generated_tokens,
                    cached_tokens: rep.reused_prompt_tokens,
                };
                let m = &self.metrics;
                m.prompt_tokens.fetch_add(rep.prompt_tokens as u64, Relaxed);
                m.prompt_tokens_cached.fetch_add(rep.reused_prompt_tokens as u64, Relaxed);
                m.generated_tokens.fetch_add(rep.generated_tokens as u64, Relaxed);
                let outcome = if rep.finish_reason == FinishReason::Cancelled {
                    &m.requests_cancelled[ep]
                } else {
                    &m.requests_ok[ep]
                };
                outcome.fetch_add(1, Relaxed);
                eprintln!(
                    "request {} {}{}: prompt {} tokens ({} cached, prefill {:.1} tok/s), {} generated, decode {:.1} tok/s, first text {}, queued {waited_s:.2} s, {}",
                    job.id,
                    job.endpoint.name(),
                    if job.stream { " stream" } else { "" },
                    rep.prompt_tokens,
                    rep.reused_prompt_tokens,
                    rep.prefill_tok_per_s,
                    rep.generated_tokens,
                    rep.decode_tok_per_s,
                    rep.first_text_s.map_or("-".into(), |s| format!("{s:.3} s")),
                    match rep.finish_reason {
                        FinishReason::Cancelled => "cancelled: the client went away",
                        f => f.as_str(),
                    }
                );
                let _ = job.events.send(Event::Done { finish_reason: rep.finish_reason, usage });
            }
            Err(e) => {
                self.metrics.requests_failed[ep].fetch_add(1, Relaxed);
                fail(ApiError::status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    formats::error::display_chain(&e),
                ));
            }
        }
    }
}
