//! `turnstone`: runs the server (`turnstone serve`) or talks to one (`chat`, `sessions`, `events`).

use std::process::ExitCode;

use clap::Parser;
use turnstone::cli::{self, Cli, Command, LogFormatArg};
use turnstone_telemetry::{LogFormat, Settings, Telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Cli::parse();
    let telemetry = match init_telemetry(&args) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match args.command {
        Command::Serve(serve) => cli::serve::run(serve).await,
        Command::Chat(chat) => cli::chat::run(&args.global, chat).await,
        Command::Sessions(list) => cli::sessions::run(&args.global, list).await,
        Command::Events(events) => cli::events::run(&args.global, events).await,
        Command::Smoke(smoke) => cli::smoke::run(&args.global, smoke).await,
        Command::McpNotes => cli::mcp_notes::run().await,
    };
    // The spans of the last turns go out before the process ends.
    telemetry.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default `warn`, and for `serve` its own notices
/// at `info`), so they never mix with output; `serve --otlp-endpoint` also exports traces.
fn init_telemetry(args: &Cli) -> Result<Telemetry, turnstone_telemetry::Error> {
    let (default_filter, otlp_endpoint) = match &args.command {
        Command::Serve(serve) => {
            let endpoint = serve.otlp_endpoint.clone().filter(|e| !e.trim().is_empty());
            (format!("warn,{}=info", cli::serve::LOG_TARGET), endpoint)
        }
        _ => ("warn".to_owned(), None),
    };
    let log_format = match args.logging.log_format {
        LogFormatArg::Text => LogFormat::Text,
        LogFormatArg::Json => LogFormat::Json,
    };
    let settings =
        Settings { log_format, default_filter, otlp_endpoint, service_name: "turnstone".to_owned() };
    turnstone_telemetry::init(&settings)
}
