//! `runtime serve`: the OpenAI-compatible HTTP server.

use crate::mode::{open, ModeArgs};
use crate::report::no_template;
use anyhow::Result;
use std::path::PathBuf;

/// The flags of `runtime serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory, or a prepared model's manifest.toml (streamed by default).
    pub model: PathBuf,
    /// Address to listen on: loopback unless another is asked for (e.g. 0.0.0.0).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// Port (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer <KEY>` on every request.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests that may wait for the engine; past that, 503 with Retry-After.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// KV cache positions: a request's prompt plus max_tokens must fit (a streamed run's plan
    /// holds them).
    #[arg(long, default_value_t = 1024)]
    pub ctx: usize,
    #[command(flatten)]
    pub mode: ModeArgs,
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(args: Args) -> Result<()> {
    let Args { model, host, port, api_key, queue, ctx, mode, threads: _ } = args;
    if queue == 0 {
        anyhow::bail!("--queue 0: at least one request must be able to wait");
    }
    if api_key.as_deref() == Some("") {
        anyhow::bail!("--api-key is empty");
    }
    // a streamed run's plan counts what the requests hold
    let (tokenizer, _) = runtime::load_tokenizer(&model)?;
    let mode = ModeArgs { host_bytes: runtime::serve::held_bytes(queue, ctx, tokenizer.max_token_bytes), ..mode };
    drop(tokenizer);
    let (opened, _) = open(&model, &mode, ctx)?;
    let template = runtime::chat_template(&model, &opened)?;
    if template.is_none() {
        eprintln!("note: {}: /v1/chat/completions will answer 400", no_template(&model));
    }
    if !host.is_loopback() && api_key.is_none() {
        eprintln!("note: listening on {host}, not loopback: anyone who can reach this machine can use the model (--api-key KEY to require a key)");
    }
    let model_name = match &opened.manifest {
        Some(m) => m.model_name.clone(),
        None => model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()),
    };
    let config = runtime::serve::ServeConfig {
        addr: std::net::SocketAddr::new(host, port),
        queue_capacity: queue,
        api_key,
        model_name,
    };
    runtime::serve::serve(opened, template, no_template(&model), ctx, config, |addr| {
        eprintln!("listening on http://{addr} (OpenAI API at http://{addr}/v1; context {ctx} tokens, queue {queue})");
    })?;
    Ok(())
}
