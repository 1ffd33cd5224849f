//! Turnstone on AWS Lambda: what each function does with the events Lambda hands it, over the
//! shared engine ([`turnstone_runtime::assemble::Engine`], `Topology::Split`). The functions'
//! `main.rs` files only build the engine on DynamoDB and SQS and call one of these.
//!
//! - [`http`]: the `api` function (the router behind API Gateway's HTTP API, long-polls cut
//!   under its 30 s limit) and the `stream` function (the same router through a Function URL
//!   with response streaming, for the SSE log).
//! - [`sqs`]: the `dispatch` function: a batch of wake-ups, each session run once, failures
//!   reported per message (`ReportBatchItemFailures`).
//! - [`schedule`]: the `sweep` function: enqueue the sessions whose wake time passed.
//! - [`websocket`]: the `ahp` function: AHP behind API Gateway's WebSocket API.

pub mod http;
pub mod schedule;
pub mod sqs;
pub mod websocket;

/// What a function's `main` returns when it fails.
pub type Error = lambda_runtime::Error;

/// Logs as Lambda expects: one JSON object per line on standard output (what Lambda's advanced
/// logging controls parse, and what CloudWatch Logs Insights queries by field), at the level
/// `AWS_LAMBDA_LOG_LEVEL` (else `RUST_LOG`, else `INFO`) sets. A line logged during a trace
/// span (a decision delivery, a model call) carries the span's fields under `span`, its
/// `trace_id` included. Spans are not exported from Lambda (yet): the worker still gets its
/// `traceparent`. Returns when the function started, for [`ready`].
pub fn init_logging() -> std::time::Instant {
    use lambda_runtime::tracing::subscriber::{EnvFilter, filter::LevelFilter};
    let started = std::time::Instant::now();
    let level = std::env::var("AWS_LAMBDA_LOG_LEVEL").or_else(|_| std::env::var("RUST_LOG"));
    let level = level.ok().and_then(|l| l.parse::<LevelFilter>().ok()).unwrap_or(LevelFilter::INFO);
    let filter = EnvFilter::builder().with_default_directive(level.into()).from_env_lossy();
    let subscriber = lambda_runtime::tracing::subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        .with_env_filter(filter)
        .with_writer(std::io::stdout)
        .finish();
    // Set once per process; a second call (a test) keeps the first.
    let _ = lambda_runtime::tracing::subscriber::util::SubscriberInitExt::try_init(subscriber);
    started
}

/// The variable naming the CloudWatch namespace of the functions' EMF lines (the template sets
/// `Turnstone/<stage>`); unset: [`turnstone_runtime::metrics::EMF_NAMESPACE`].
pub const METRICS_NAMESPACE_VAR: &str = "TURNSTONE_METRICS_NAMESPACE";

/// Writes what the invocation committed, counted, as CloudWatch Embedded Metric Format lines
/// on standard output, where CloudWatch Logs turns them into metrics (in the namespace
/// [`METRICS_NAMESPACE_VAR`] names; see `turnstone_runtime::metrics`). Called once an
/// invocation's work is done.
pub fn emit_metrics(app: &turnstone_runtime::app::App) {
    use std::io::Write as _;
    static NAMESPACE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let namespace = NAMESPACE.get_or_init(|| {
        std::env::var(METRICS_NAMESPACE_VAR)
            .ok()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| turnstone_runtime::metrics::EMF_NAMESPACE.to_owned())
    });
    let lines = app.metrics().drain_emf(namespace, app.now());
    if lines.is_empty() {
        return;
    }
    let mut out = std::io::stdout().lock();
    for line in lines {
        // A metric line that cannot be written is lost, as a log line would be.
        let _ = writeln!(out, "{line}");
    }
}

/// Logs how long the function's own initialization took (configuration, secrets, clients),
/// before it takes its first event.
pub fn ready(started: std::time::Instant) {
    tracing::info!(init_ms = started.elapsed().as_millis() as u64, "initialized");
}
