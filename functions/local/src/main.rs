//! `turnstone`: runs the server (`turnstone serve`) or talks to one (`chat`, `sessions`, `events`).

use std::process::ExitCode;

use clap::Parser;
use turnstone::cli::{self, Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Cli::parse();
    init_tracing();
    let result = match args.command {
        Command::Serve(serve) => cli::serve::run(serve).await,
        Command::Chat(chat) => cli::chat::run(&args.global, chat).await,
        Command::Sessions(list) => cli::sessions::run(&args.global, list).await,
        Command::Events(events) => cli::events::run(&args.global, events).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default `warn`), so they never mix with output.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}
