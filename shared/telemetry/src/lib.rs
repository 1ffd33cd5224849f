//! Turnstone's logs and traces, as a process sets them up: logs to stderr as text or JSON lines
//! (filtered by `RUST_LOG`), and, given an OTLP endpoint, the runtime's trace spans exported
//! with OpenTelemetry (OTLP over HTTP, JSON encoding) in batches.
//!
//! The runtime creates the spans (`turnstone_runtime::trace`): plain `tracing` spans of target
//! [`TARGET`] whose ids are derived from the session and turn, carried as fields. An exporter
//! that let the OpenTelemetry SDK (or `tracing-opentelemetry`) pick span ids could not give a
//! turn the same trace across processes, nor a delivery the span id its worker already saw in
//! `traceparent`; so [`SpanExportLayer`] turns each closed span into the SDK's `SpanData` with
//! exactly those ids (and, for a `turn`, its real start and end) and hands it to the SDK's
//! batch processor, which exports through `opentelemetry-otlp`.
//!
//! The batch processor runs on a thread of its own; its HTTP requests run on the tokio runtime
//! that [`Telemetry::new`] was called on ([`TokioHttp`]), with the workspace's reqwest client.

mod export;

use std::io::IsTerminal;

use tracing::Subscriber;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

pub use export::SpanExportLayer;
pub use turnstone_runtime::trace::TARGET;

/// The standard variable naming an OTLP endpoint (the base URL; `/v1/traces` is appended).
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, the event's fields (`message`
    /// included) at the top level, and the current span's fields under `span` (a line logged
    /// during a delivery carries its `trace_id` and `span_id`).
    Json,
}

/// What a process asks for.
#[derive(Debug, Clone)]
pub struct Settings {
    pub log_format: LogFormat,
    /// The log filter when `RUST_LOG` is unset (an `EnvFilter` directive, e.g. `warn`).
    pub default_filter: String,
    /// The OTLP/HTTP base URL (`http://collector:4318`); `None` builds no exporter.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans, unless `OTEL_SERVICE_NAME` says otherwise.
    pub service_name: String,
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
    #[error("the OTLP exporter needs a tokio runtime to send from")]
    NoRuntime,
    #[error("a global tracing subscriber is already set")]
    AlreadySet,
}

/// What a process keeps while it runs: the exporter, to flush when it ends.
#[must_use = "dropping it without `shutdown` may lose the spans not yet exported"]
#[derive(Debug, Default)]
pub struct Telemetry {
    exporter: Option<SpanExportLayer>,
}

impl Telemetry {
    /// The subscriber for `settings` writing logs to stderr, and what to flush at the end.
    /// [`init`] installs it for the process; a test can install it for a thread
    /// (`tracing::subscriber::set_default`).
    pub fn new(settings: &Settings) -> Result<(Box<dyn Subscriber + Send + Sync>, Telemetry), Error> {
        let filter =
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.default_filter));
        let logs = match settings.log_format {
            LogFormat::Text => tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter(filter)
                .boxed(),
            LogFormat::Json => tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(false)
                .with_writer(std::io::stderr)
                .with_filter(filter)
                .boxed(),
        };
        let exporter = match &settings.otlp_endpoint {
            Some(endpoint) => Some(SpanExportLayer::otlp(endpoint, &settings.service_name)?),
            None => None,
        };
        // Only the trace spans go to the exporter, whatever the log filter says.
        let spans = exporter
            .clone()
            .map(|layer| layer.with_filter(tracing_subscriber::filter::filter_fn(|m| m.target() == TARGET)));
        let subscriber = Registry::default().with(logs).with(spans);
        Ok((Box::new(subscriber), Telemetry { exporter }))
    }

    /// Whether spans are exported.
    pub fn exports(&self) -> bool {
        self.exporter.is_some()
    }

    /// Exports the spans not yet sent and stops the exporter (a graceful shutdown's last step).
    pub async fn shutdown(self) {
        if let Some(exporter) = self.exporter {
            // The batch processor blocks until its last export is done, and that export runs
            // on this runtime: wait for it off the runtime's threads.
            let flushed = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
            if let Ok(Err(e)) | Err(e) = flushed.map_err(|e| e.to_string()) {
                tracing::warn!(error = %e, "the last spans could not be exported");
            }
        }
    }
}

/// Sets up logs (and traces, with an endpoint) for the whole process.
pub fn init(settings: &Settings) -> Result<Telemetry, Error> {
    let (subscriber, telemetry) = Telemetry::new(settings)?;
    tracing::subscriber::set_global_default(subscriber).map_err(|_| Error::AlreadySet)?;
    Ok(telemetry)
}
