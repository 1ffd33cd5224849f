//! A fake OpenTelemetry collector (OTLP over HTTP, the JSON encoding): records what is POSTed
//! to `/v1/traces` and answers 200, so a test can read the spans a host exported. Also the
//! reader of a W3C `traceparent` header, checked strictly.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

type Received = Arc<Mutex<Vec<(String, Value)>>>;

/// A running fake collector; stops when dropped.
pub struct FakeCollector {
    url: String,
    received: Received,
    task: JoinHandle<()>,
}

impl FakeCollector {
    /// Starts a collector on `127.0.0.1:0`.
    pub async fn start() -> FakeCollector {
        async fn traces(State(received): State<Received>, headers: HeaderMap, body: Bytes) -> &'static str {
            let content_type =
                headers.get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
            received.lock().unwrap().push((content_type, body));
            "{}"
        }
        let received: Received = Arc::default();
        let app = Router::new().route("/v1/traces", post(traces)).with_state(Arc::clone(&received));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake collector");
        let url = format!("http://{}", listener.local_addr().expect("the collector's address"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeCollector { url, received, task }
    }

    /// The OTLP endpoint (base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` names it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every span exported so far, with the `service.name` of its resource. Every request must
    /// have been OTLP/HTTP JSON.
    pub fn spans(&self) -> Vec<(String, Value)> {
        let mut spans = Vec::new();
        for (content_type, body) in self.received.lock().unwrap().iter() {
            assert_eq!(content_type, "application/json", "the JSON encoding of OTLP/HTTP");
            for resource in body["resourceSpans"].as_array().expect("resourceSpans") {
                let service = attribute(&resource["resource"], "service.name").unwrap_or_default();
                for scope in resource["scopeSpans"].as_array().expect("scopeSpans") {
                    for span in scope["spans"].as_array().expect("spans") {
                        spans.push((service.clone(), span.clone()));
                    }
                }
            }
        }
        spans
    }
}

impl Drop for FakeCollector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An OTLP attribute's value as text (`stringValue`, `intValue` (a string or a number), ...).
pub fn attribute(holder: &Value, key: &str) -> Option<String> {
    let value = &holder["attributes"].as_array()?.iter().find(|a| a["key"] == key)?["value"];
    let (_, inner) = value.as_object()?.iter().next()?;
    Some(inner.as_str().map_or_else(|| inner.to_string(), str::to_owned))
}

/// A time field in nanoseconds (OTLP JSON writes 64-bit integers as strings or numbers).
pub fn nanos(span: &Value, key: &str) -> u128 {
    let value = &span[key];
    value.as_str().map_or_else(|| value.as_u64().map(u128::from), |s| s.parse().ok()).expect("a time")
}

/// A `traceparent` header's (trace id, parent span id), checking the W3C form
/// `00-<32 lowercase hex>-<16 lowercase hex>-01`.
pub fn traceparent(value: Option<String>) -> (String, String) {
    let value = value.expect("a traceparent header");
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    assert_eq!((parts[0], parts[3]), ("00", "01"), "{value}");
    for (part, len) in [(parts[1], 32), (parts[2], 16)] {
        let hex = part.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        assert!(part.len() == len && hex, "{value}");
    }
    (parts[1].to_owned(), parts[2].to_owned())
}
