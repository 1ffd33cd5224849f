//! The command line: arguments (clap derive) and one module per command.
//!
//! `serve` runs the server; `chat`, `sessions` and `events` are clients of its HTTP API
//! (`client`), reading event streams with `sse` and printing turns with `render`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub mod chat;
pub mod client;
pub mod events;
pub mod mcp_notes;
pub mod render;
pub mod serve;
pub mod sessions;
pub mod smoke;

/// Turnstone, a durable AI agent engine.
#[derive(Debug, Parser)]
#[command(name = "turnstone", version, about)]
pub struct Cli {
    /// Options every client command shares.
    #[command(flatten)]
    pub global: Global,
    /// How every command logs.
    #[command(flatten)]
    pub logging: Logging,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Where the server is and how to authenticate to it.
#[derive(Debug, Clone, Args)]
pub struct Global {
    /// The server's base URL.
    #[arg(long, global = true, env = "TURNSTONE_URL", default_value = "http://127.0.0.1:8787")]
    pub url: String,
    /// An API key, sent as `Authorization: Bearer <key>`.
    #[arg(long, global = true, env = "TURNSTONE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// How logs are written (to stderr, filtered by `RUST_LOG`).
#[derive(Debug, Clone, Args)]
pub struct Logging {
    /// `text` for people, `json` for one JSON object per line (for a log collector).
    #[arg(long, global = true, value_name = "text|json", default_value = "text")]
    pub log_format: LogFormatArg,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Talk to an agent: send MESSAGE and stream the reply, or without it read lines from stdin.
    Chat(ChatArgs),
    /// List sessions.
    Sessions(SessionsArgs),
    /// Print a session's events as `SEQ NAME JSON`, one per line.
    Events(EventsArgs),
    /// Serve a small notepad as an MCP server on stdin and stdout (the bundled demo agent's
    /// `notes` server).
    McpNotes,
    /// Check a deployment end to end (after `sam deploy`: `--url $ApiUrl --stream-url
    /// $StreamUrl`): one turn, its event stream, and the session disposed.
    Smoke(SmokeArgs),
}

/// `turnstone serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The address to listen on [default: the config's server.addr, else 127.0.0.1:8787].
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: Option<std::net::SocketAddr>,
    /// Where the local store keeps its data [default: the config's server.data_dir, else
    /// ./turnstone-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// How many sessions are run at once.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub workers: usize,
    /// Where sessions and wake-ups live: `local` (the embedded store) or `aws` (a DynamoDB
    /// table and an SQS queue; credentials and region from the usual AWS environment)
    /// [default: the config's server.backend, else local].
    #[arg(long, value_name = "local|aws")]
    pub backend: Option<BackendArg>,
    /// The AWS endpoint of the `aws` backend, e.g. a local stand-in such as moto [default: the
    /// config's server.aws.endpoint_url, else AWS].
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// The DynamoDB table of the `aws` backend [default: server.aws.table, else turnstone].
    #[arg(long, value_name = "NAME")]
    pub table: Option<String>,
    /// The SQS queue (name or URL) of the `aws` backend [default: server.aws.queue, else
    /// turnstone-wakeups].
    #[arg(long, value_name = "NAME|URL")]
    pub queue: Option<String>,
    /// Create the `aws` backend's table and queue (with its dead-letter queue) when missing.
    #[arg(long)]
    pub create: bool,
    /// Export traces (turns, decision deliveries, model and tool calls) with OpenTelemetry to
    /// this OTLP/HTTP endpoint, e.g. `http://localhost:4318` (`/v1/traces` is appended)
    /// [default: none, no export].
    #[arg(long, value_name = "URL", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    Local,
    Aws,
}

/// `turnstone chat`.
#[derive(Debug, Clone, Args)]
pub struct ChatArgs {
    /// The agent that runs a new session.
    #[arg(long, default_value = "demo")]
    pub agent: String,
    /// The session to talk in (default: a new one, `chat-<8 hex>`).
    #[arg(long)]
    pub session: Option<String>,
    /// Send this one message and exit once the turn ends.
    pub message: Option<String>,
}

/// `turnstone sessions`.
#[derive(Debug, Clone, Args)]
pub struct SessionsArgs {
    /// Only this agent's sessions.
    #[arg(long)]
    pub agent: Option<String>,
    /// How many sessions to show at most.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// `turnstone smoke`.
#[derive(Debug, Clone, Args)]
pub struct SmokeArgs {
    /// Where the event stream is served, when not at `--url` (on AWS: the stack's `StreamUrl`).
    #[arg(long)]
    pub stream_url: Option<String>,
    /// The agent the turn runs.
    #[arg(long, default_value = "demo")]
    pub agent: String,
    /// What the turn says.
    #[arg(long, default_value = "Hello from turnstone smoke.")]
    pub message: String,
    /// How long the turn may take, in seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
}

/// `turnstone events`.
#[derive(Debug, Clone, Args)]
pub struct EventsArgs {
    pub session: String,
    /// Only events after this sequence number.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Keep streaming new events (reconnecting where the stream left off).
    #[arg(long)]
    pub follow: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_commands_and_their_defaults() {
        let cli = Cli::try_parse_from(["turnstone", "serve"]).unwrap();
        let Command::Serve(serve) = cli.command else { panic!("not serve") };
        assert_eq!(serve.addr, None);
        assert_eq!(serve.data_dir, None);
        assert_eq!(serve.workers, 8);
        assert_eq!(serve.config, None);

        let cli = Cli::try_parse_from(["turnstone", "chat", "--url", "http://x:1", "hello there"]).unwrap();
        assert_eq!(cli.global.url, "http://x:1");
        let Command::Chat(chat) = cli.command else { panic!("not chat") };
        assert_eq!(chat.agent, "demo");
        assert_eq!(chat.session, None);
        assert_eq!(chat.message.as_deref(), Some("hello there"));

        let cli = Cli::try_parse_from(["turnstone", "events", "s1", "--after", "7", "--follow"]).unwrap();
        let Command::Events(events) = cli.command else { panic!("not events") };
        assert_eq!((events.session.as_str(), events.after, events.follow), ("s1", 7, true));

        let cli = Cli::try_parse_from(["turnstone", "sessions", "--agent", "a", "--limit", "3"]).unwrap();
        let Command::Sessions(list) = cli.command else { panic!("not sessions") };
        assert_eq!((list.agent.as_deref(), list.limit), (Some("a"), 3));
    }
}
