//! `runtime chat`: the terminal chat.

use crate::mode::{open, ModeArgs};
use crate::report::{check_sampling, no_template};
use anyhow::Result;
use runtime::sampler::Sampler;
use std::io::Write;
use std::path::PathBuf;

/// The flags of `runtime chat`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory, or a prepared model's manifest.toml (streamed by default).
    pub model: PathBuf,
    /// A system message that opens the conversation (default: the template's own, if any).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.7)]
    pub temp: f32,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// KV cache positions: the whole conversation must fit (a streamed run's plan holds them).
    #[arg(long, default_value_t = 1024)]
    pub ctx: usize,
    #[command(flatten)]
    pub mode: ModeArgs,
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(args: Args) -> Result<()> {
    let Args { model, system, n, temp, top_p, seed, ctx, mode, threads: _ } = args;
    check_sampling(temp, top_p)?;
    if n == 0 {
        anyhow::bail!("-n 0: nothing to generate");
    }
    let (mut opened, _) = open(&model, &mode, ctx)?;
    let template =
        runtime::chat_template(&model, &opened)?.ok_or_else(|| anyhow::anyhow!("{}", no_template(&model)))?;
    chat(&mut opened, &template, system, n, ctx, Sampler::new(temp, top_p, seed))?;
    Ok(())
}

const HELP: &str = "/help lists these; /reset starts over; /quit (or Ctrl-D) ends; Ctrl-C stops a reply; a message that starts with / is sent as //...";

/// The terminal chat: one line per user message; the session keeps the conversation's KV cache,
/// so each turn computes only its new tokens.
fn chat(
    opened: &mut runtime::Opened,
    template: &runtime::chat::ChatTemplate,
    system: Option<String>,
    n: usize,
    ctx: usize,
    mut sampler: Sampler,
) -> Result<()> {
    use runtime::chat::ChatMessage;
    use runtime::generate::{Continuation, Session};
    use std::io::{BufRead, IsTerminal};
    let interactive = std::io::stdin().is_terminal();
    let opening: Vec<ChatMessage> = system.iter().map(|s| ChatMessage::new("system", s)).collect();
    let mut messages = opening.clone();
    let mut session = Session::new(&opened.model, ctx)?;
    let end_ids = runtime::chat::end_of_turn_ids(&opened.model.config, &opened.tokenizer);
    // Ctrl-C during a reply stops the reply, and the conversation goes on; at the prompt it
    // ends the chat, as in a shell
    let replying = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (replying, stop) = (replying.clone(), stop.clone());
        ctrlc::set_handler(move || {
            if replying.load(std::sync::atomic::Ordering::SeqCst) {
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
            } else {
                eprintln!();
                std::process::exit(130);
            }
        })?;
    }
    if interactive {
        eprintln!("chat: one line per message; {HELP}");
    }
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        let text = line.trim();
        match text {
            "" => continue,
            "/quit" | "/exit" => break,
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            "/reset" => {
                messages = opening.clone();
                session.reset();
                eprintln!("(conversation reset)");
                continue;
            }
            // (a message may start with a slash when it is doubled: "//etc" sends "/etc")
            t if t.starts_with('/') && !t.starts_with("//") => {
                eprintln!("unknown command {t}: {HELP}");
                continue;
            }
            _ => {}
        }
        let text = text.strip_prefix('/').filter(|t| t.starts_with('/')).unwrap_or(text);
        messages.push(ChatMessage::new("user", text));
        // bounded before the template renders it or the tokenizer sees it whole
        let text_bytes: usize = messages.iter().map(|m| m.content.len()).sum();
        if text_bytes > ctx.saturating_mul(opened.tokenizer.max_token_bytes) {
            messages.pop();
            eprintln!("the conversation is more than the context of {ctx} tokens holds (--ctx): /reset to start over");
            continue;
        }
        let prompt = template.render(&messages, true)?;
        let (mut runner, tok) = opened.runner_and_tokenizer();
        let ids = match tok.encode_at_most(&prompt, false, ctx)? {
            runtime::tokenizer::Bounded::Whole(ids) if ids.len() < ctx => ids,
            too_long => {
                messages.pop();
                let n = match too_long {
                    runtime::tokenizer::Bounded::Whole(ids) => ids.len().to_string(),
                    runtime::tokenizer::Bounded::MoreThan(n) => format!("more than {n}"),
                };
                eprintln!("the conversation is {n} tokens and the context holds {ctx} (--ctx): /reset to start over");
                continue;
            }
        };
        let c = Continuation {
            prompt_ids: &ids,
            max_new_tokens: n.min(ctx - ids.len()),
            end_ids: &end_ids,
            mask: &[],
            stop: &[],
        };
        let mut stdout = std::io::stdout();
        stop.store(false, std::sync::atomic::Ordering::SeqCst);
        replying.store(true, std::sync::atomic::Ordering::SeqCst);
        let r = session.generate(&mut runner, tok, &c, &mut sampler, |piece| {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
            match stop.load(std::sync::atomic::Ordering::SeqCst) {
                true => std::ops::ControlFlow::Break(()),
                false => std::ops::ControlFlow::Continue(()),
            }
        });
        replying.store(false, std::sync::atomic::Ordering::SeqCst);
        let r = r?;
        println!();
        eprintln!(
            "[prompt {} tokens, {} from earlier turns; {} generated at {:.1} tok/s{}]",
            r.prompt_tokens,
            r.reused_prompt_tokens,
            r.generated_tokens,
            r.decode_tok_per_s,
            match r.finish_reason {
                runtime::generate::FinishReason::Length => ", cut at -n",
                runtime::generate::FinishReason::Cancelled => ", stopped by Ctrl-C",
                _ => "",
            }
        );
        messages.push(ChatMessage::new("assistant", &r.text));
    }
    Ok(())
}
