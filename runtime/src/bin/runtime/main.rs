//! `runtime`: run, score, serve and stream a model on the device. This file parses the command
//! line and hands each subcommand to its module in `commands/`.

mod commands;
mod mode;
mod report;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "runtime", version, about = "Run a model whose weights live on storage")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text after a prompt; prints prefill and decode tok/s.
    Run(commands::run::Args),
    /// Perplexity of a text file with llama-perplexity's protocol.
    Perplexity(commands::perplexity::Args),
    /// Zero-shot multiple-choice accuracy (lm-evaluation-harness's acc_norm).
    Eval(commands::eval::Args),
    /// Chat in the terminal through the model's chat template: one line per message, the KV
    /// cache of earlier turns kept; /reset starts over, Ctrl-D (or /quit) ends.
    Chat(commands::chat::Args),
    /// An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions (stream
    /// or not), GET /v1/models, /health and /metrics. One engine answers requests in order.
    Serve(commands::serve::Args),
    /// Measure this machine into a device file for the planner: random O_DIRECT reads (io_uring)
    /// at each block size and queue depth, memory bandwidth, and the dense decode rate of a model.
    ProbeStorage(commands::probe_storage::Args),
    /// The operating point --mem-budget gets and the decode rate the windowed roofline predicts
    /// for it on a device (Budgeting Bytes), with its parts; llama.cpp's on each --gguf too.
    Plan(commands::plan::Args),
    /// Decode speed of a streamed run and where the time and bytes go.
    Bench(commands::bench::Args),
}

impl Command {
    /// The research knobs given (`-X`), for `-X help`.
    fn experiment(&self) -> &[String] {
        match self {
            Command::Run(a) => &a.mode.experiment,
            Command::Perplexity(a) => &a.mode.experiment,
            Command::Eval(a) => &a.mode.experiment,
            Command::Bench(a) => &a.mode.experiment,
            Command::Chat(a) => &a.mode.experiment,
            Command::Serve(a) => &a.mode.experiment,
            Command::Plan(a) => &a.mode.experiment,
            Command::ProbeStorage(_) => &[],
        }
    }

    /// `--threads`, where the command takes it.
    fn threads(&self) -> Option<usize> {
        match self {
            Command::Run(a) => a.threads,
            Command::Perplexity(a) => a.threads,
            Command::Eval(a) => a.threads,
            Command::Bench(a) => a.threads,
            Command::Chat(a) => a.threads,
            Command::Serve(a) => a.threads,
            Command::ProbeStorage(a) => a.threads,
            Command::Plan(_) => None,
        }
    }

    fn run(self) -> anyhow::Result<()> {
        match self {
            Command::Run(a) => commands::run::run(a),
            Command::Perplexity(a) => commands::perplexity::run(a),
            Command::Eval(a) => commands::eval::run(a),
            Command::Chat(a) => commands::chat::run(a),
            Command::Serve(a) => commands::serve::run(a),
            Command::Plan(a) => commands::plan::run(a),
            Command::ProbeStorage(a) => commands::probe_storage::run(a),
            Command::Bench(a) => commands::bench::run(a),
        }
    }
}

/// Threads for the pool: 1..=4 x the cores (default: all cores).
fn pool_threads(threads: Option<usize>) -> std::result::Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match threads {
        None => Ok(0),
        Some(0) => Err("--threads 0: expected at least 1".into()),
        Some(t) if t > 4 * cores => {
            Err(format!("--threads {t}: this machine has {cores} cores (at most {} threads)", 4 * cores))
        }
        Some(t) => Ok(t),
    }
}

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        // a closed stdout (`runtime plan ... | head`) ends the process quietly, as other Unix
        // tools do; the server keeps Rust's default (ignored), so a client that goes away is an
        // EPIPE on its socket, not the end of the server
        // SAFETY: resetting one signal's disposition before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    if cli.command.experiment().iter().any(|x| x == "help") {
        println!("{}", mode::EXPERIMENT_HELP);
        return;
    }
    let n = match pool_threads(cli.command.threads()) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("runtime: error: {e}");
            std::process::exit(1);
        }
    };
    // The whole command runs inside the pool, so every parallel op forks from a worker thread
    // (cheap) instead of being injected from outside and waking a sleeping worker (~10s of us,
    // hundreds of times per decoded token).
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(n).build() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("runtime: error: cannot start {n} threads: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = pool.install(|| cli.command.run()) {
        eprintln!("runtime: error: {}", report::describe(&e));
        std::process::exit(1);
    }
}
