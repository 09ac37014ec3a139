//! One module per subcommand: its flags (`Args`) and what it does (`run`).

pub mod bench;
pub mod chat;
pub mod eval;
pub mod perplexity;
pub mod plan;
pub mod probe_storage;
pub mod run;
pub mod serve;
