//! The runtime's trace spans as OpenTelemetry spans, exported over OTLP.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanEvents, SpanLinks, SpanProcessor};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Subscriber, span};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use turnstone_runtime::trace::{END_FIELD, START_FIELD};

use crate::Error;

/// How long one export request may take (OTLP's default timeout).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a shutdown waits for the last export.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);
/// The largest collector answer read (they are empty or a few bytes).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// A `tracing` layer that exports the closed spans it sees (filter it to the runtime's trace
/// spans) as OpenTelemetry spans with the ids their fields carry: `trace_id`, `span_id`,
/// `parent_id` (hex), [`START_FIELD`] and [`END_FIELD`] (Unix nanoseconds) when the span's
/// times are not its own creation and close, `outcome` (`ok` or `error`, with
/// `error.message`) as its status; every other field is an attribute. A span without valid ids
/// is not exported.
#[derive(Clone)]
pub struct SpanExportLayer {
    processor: Arc<dyn SpanProcessor>,
    scope: InstrumentationScope,
}

impl fmt::Debug for SpanExportLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpanExportLayer").finish_non_exhaustive()
    }
}

impl SpanExportLayer {
    /// Exports to the OTLP/HTTP endpoint at `base` (`/v1/traces` is appended, as for
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`) in the JSON encoding, in batches, sending from the
    /// current tokio runtime. `OTEL_EXPORTER_OTLP_HEADERS` adds headers (e.g. an API key).
    pub fn otlp(base: &str, service_name: &str) -> Result<SpanExportLayer, Error> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let client = turnstone_runtime::net::client().map_err(|e| Error::Exporter(e.to_string()))?;
        let endpoint = format!("{}/v1/traces", base.trim_end_matches('/'));
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(TokioHttp { client, runtime })
            .build()
            .map_err(|e| Error::Exporter(e.to_string()))?;
        let mut processor = BatchSpanProcessor::builder(exporter).build();
        let resource = match std::env::var("OTEL_SERVICE_NAME") {
            Ok(_) => Resource::builder().build(),
            Err(_) => Resource::builder().with_service_name(service_name.to_owned()).build(),
        };
        processor.set_resource(&resource);
        Ok(SpanExportLayer::new(Arc::new(processor)))
    }

    /// Exports through `processor` (for a processor of one's own, e.g. in a test).
    pub fn new(processor: Arc<dyn SpanProcessor>) -> SpanExportLayer {
        let scope =
            InstrumentationScope::builder("turnstone").with_version(env!("CARGO_PKG_VERSION")).build();
        SpanExportLayer { processor, scope }
    }

    /// Exports what is pending and stops (blocks until done: call it off async threads).
    pub fn shutdown(&self) -> Result<(), String> {
        self.processor.shutdown_with_timeout(SHUTDOWN_TIMEOUT).map_err(|e| e.to_string())
    }
}

/// A span being recorded.
struct Pending {
    name: &'static str,
    trace_id: Option<TraceId>,
    span_id: Option<SpanId>,
    parent_id: Option<SpanId>,
    start: SystemTime,
    end: Option<SystemTime>,
    outcome: Option<String>,
    error_message: Option<String>,
    attributes: Vec<KeyValue>,
}

impl Visit for Pending {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "trace_id" => self.trace_id = TraceId::from_hex(value).ok().filter(|id| *id != TraceId::INVALID),
            "span_id" => self.span_id = SpanId::from_hex(value).ok().filter(|id| *id != SpanId::INVALID),
            "parent_id" => self.parent_id = SpanId::from_hex(value).ok().filter(|id| *id != SpanId::INVALID),
            name => {
                match name {
                    "outcome" => self.outcome = Some(value.to_owned()),
                    "error.message" => self.error_message = Some(value.to_owned()),
                    _ => {}
                }
                self.attributes.push(KeyValue::new(name, value.to_owned()));
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%value` fields arrive here, formatted as they display.
        self.record_str(field, &format!("{value:?}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        match field.name() {
            START_FIELD => self.start = from_unix_nanos(value),
            END_FIELD => self.end = Some(from_unix_nanos(value)),
            name => self.attributes.push(KeyValue::new(name, value)),
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record_i64(field, i64::try_from(value).unwrap_or(i64::MAX));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.attributes.push(KeyValue::new(field.name(), value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.attributes.push(KeyValue::new(field.name(), value));
    }
}

fn from_unix_nanos(nanos: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))
}

#[allow(clippy::disallowed_methods)] // a span's wall-clock times: not the engine's replayed time
fn now() -> SystemTime {
    SystemTime::now()
}

impl<S> Layer<S> for SpanExportLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut pending = Pending {
            name: attrs.metadata().name(),
            trace_id: None,
            span_id: None,
            parent_id: None,
            start: now(),
            end: None,
            outcome: None,
            error_message: None,
            attributes: Vec::new(),
        };
        attrs.record(&mut pending);
        span.extensions_mut().insert(pending);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if let Some(pending) = span.extensions_mut().get_mut::<Pending>() {
            values.record(pending);
        }
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(pending) = span.extensions_mut().remove::<Pending>() else { return };
        let (Some(trace_id), Some(span_id)) = (pending.trace_id, pending.span_id) else { return };
        let status = match pending.outcome.as_deref() {
            Some("ok") => Status::Ok,
            Some("error") => Status::error(pending.error_message.unwrap_or_default()),
            _ => Status::Unset,
        };
        let kind = match pending.name {
            // Requests to another service: the worker, the model provider.
            "decision.deliver" | "llm.call" => SpanKind::Client,
            _ => SpanKind::Internal,
        };
        self.processor.on_end(SpanData {
            span_context: SpanContext::new(
                trace_id,
                span_id,
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: pending.parent_id.unwrap_or(SpanId::INVALID),
            // The parent may be in another process (a turn's span is emitted by whichever
            // process ends it), but it is no remote caller's.
            parent_span_is_remote: false,
            span_kind: kind,
            name: Cow::Borrowed(pending.name),
            start_time: pending.start,
            end_time: pending.end.unwrap_or_else(now),
            attributes: pending.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        });
    }
}

/// The exporter's HTTP client: the workspace's reqwest client, each request run on the tokio
/// runtime the exporter was built on (the batch processor's own thread has none).
#[derive(Debug)]
struct TokioHttp {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait]
impl HttpClient for TokioHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let exchange = async move {
            let mut request = reqwest::Request::try_from(request)?;
            *request.timeout_mut() = Some(EXPORT_TIMEOUT);
            let answer = client.execute(request).await?;
            let mut response = Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                response = response.header(name, value);
            }
            let body = turnstone_runtime::net::read_limited(answer, MAX_ANSWER_BYTES).await?;
            Ok::<_, HttpError>(response.body(Bytes::from(body))?)
        };
        self.runtime.spawn(exchange).await?
    }
}
