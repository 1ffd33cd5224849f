//! Traces exported over OTLP: a host running the pipeline `turnstone serve --otlp-endpoint`
//! sets up, against a fake collector, over real HTTP both ways.
//!
//! Its own test binary, with one test: a `tracing` subscriber set for one thread while tests
//! on other threads hit the same callsites first can miss spans (a callsite's interest is
//! cached process-wide as it registers), so the subscriber must be the only one in the process.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};
use turnstone_runtime::trace::SpanContext;
use turnstone_telemetry::{LogFormat, Settings, Telemetry};
use turnstone_tests::TestHost;
use turnstone_tests::fake::Reply;
use turnstone_tests::fake_collector::{FakeCollector, attribute, nanos, traceparent};
use turnstone_tests::fake_openai::FakeOpenAi;
use turnstone_tests::fake_worker::FakeWorker;

/// A worker agent whose steps the worker accepts and whose model the engine calls (`fake`).
fn worker_config(openai: &FakeOpenAi, worker: &FakeWorker) -> String {
    format!(
        "[llm.fake]\ntype = \"openai\"\nbase_url = \"{}\"\n\n[agent.traced]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nworker = \"{}\"\n",
        openai.base_url(),
        worker.url()
    )
}

/// A host exporting to a fake collector (the pipeline `turnstone serve --otlp-endpoint` sets
/// up, installed for this test's thread): a worker agent's turn, whose steps the worker accepts
/// and whose model call the engine makes. The exported spans are the turn's (`turn`,
/// `decision.deliver` for each delivery, `llm.call`), all in the turn's derived trace; the
/// span ids the worker and the model server saw in `traceparent` are those of the exported
/// `decision.deliver` and `llm.call` spans, children of the `turn` span.
// One thread: the subscriber is this thread's, so every task of the host must run on it.
#[tokio::test(flavor = "current_thread")]
async fn spans_are_exported_over_otlp_and_match_the_traceparent_the_worker_saw() {
    let collector = FakeCollector::start().await;
    let settings = Settings {
        log_format: LogFormat::Text,
        default_filter: "warn".to_owned(),
        otlp_endpoint: Some(collector.url().to_owned()),
        service_name: "turnstone-test".to_owned(),
    };
    let (subscriber, telemetry) = Telemetry::new(&settings).unwrap();
    assert!(telemetry.exports());
    let _installed = tracing::subscriber::set_default(subscriber);

    let openai = FakeOpenAi::start().await;
    openai.push(Reply::text("Fine."));
    let worker = FakeWorker::accept_all(None).await;
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(&worker_config(&openai, &worker), dir.path()).await;
    let input =
        json!({"type": "client.message", "agent_id": "traced", "message": {"role": "user", "content": "hi"}});
    let turn = host.submit_ok("s-otlp", &input).await;
    host.wait_turn("s-otlp", &turn).await;
    host.stop().await;
    // The graceful shutdown's last step: what is still batched goes out.
    telemetry.shutdown().await;

    let root = SpanContext::turn("s-otlp", &turn);
    let trace_id = root.trace_id.to_string();
    let spans = collector.spans();
    assert!(spans.iter().all(|(service, _)| service == "turnstone-test"));
    let in_trace: Vec<&Value> = spans.iter().map(|(_, s)| s).filter(|s| s["traceId"] == trace_id).collect();
    let named = |name: &str| in_trace.iter().copied().filter(|s| s["name"] == name).collect::<Vec<_>>();

    let turns = named("turn");
    assert_eq!(turns.len(), 1, "one turn span: {in_trace:#?}");
    let turn_span = turns[0];
    assert_eq!(turn_span["spanId"], root.span_id.to_string());
    assert!(turn_span["parentSpanId"].as_str().unwrap_or_default().is_empty(), "the trace's root");
    assert_eq!(attribute(turn_span, "session_id").as_deref(), Some("s-otlp"));
    assert_eq!(attribute(turn_span, "turn_id").as_deref(), Some(turn.as_str()));
    assert_eq!(attribute(turn_span, "agent_id").as_deref(), Some("traced"));
    assert_eq!(attribute(turn_span, "status").as_deref(), Some("completed"));
    assert_eq!(turn_span["status"]["code"], 1, "ok");
    let (start, end) = (nanos(turn_span, "startTimeUnixNano"), nanos(turn_span, "endTimeUnixNano"));
    assert!(start > 0 && start <= end, "{start}..{end}");

    // Every delivery of the turn: a `decision.deliver` span whose id the worker saw.
    let deliveries: Vec<_> =
        worker.records().into_iter().filter(|r| r.trigger_name() != "session.start").collect();
    assert!(deliveries.len() >= 2, "client.messages and llm.finished at least: {:?}", worker.trigger_names());
    let deliver_spans = named("decision.deliver");
    assert_eq!(deliver_spans.len(), deliveries.len(), "{deliver_spans:#?}");
    for record in &deliveries {
        let (seen_trace, seen_span) = traceparent(record.header("traceparent"));
        assert_eq!(seen_trace, trace_id);
        let span = deliver_spans
            .iter()
            .find(|s| s["spanId"] == seen_span)
            .unwrap_or_else(|| panic!("no exported span {seen_span} for {}", record.trigger_name()));
        assert_eq!(span["parentSpanId"], root.span_id.to_string(), "a child of the turn");
        assert_eq!(attribute(span, "decision_id").as_deref(), Some(record.request.decision_id.as_str()));
        assert_eq!(attribute(span, "attempt"), Some(record.request.attempts.to_string()));
        assert_eq!(attribute(span, "trigger").as_deref(), Some(record.trigger_name()));
        assert_eq!(span["status"]["code"], 1, "delivered");
        let (start, end) = (nanos(span, "startTimeUnixNano"), nanos(span, "endTimeUnixNano"));
        assert!(start <= end);
    }

    // The model call: an `llm.call` span, the one the model server saw.
    let llm_spans = named("llm.call");
    assert_eq!(llm_spans.len(), 1, "{llm_spans:#?}");
    let requests = openai.requests();
    assert_eq!(requests.len(), 1);
    let (seen_trace, seen_span) = traceparent(requests[0].header("traceparent"));
    assert_eq!(
        (seen_trace.as_str(), llm_spans[0]["spanId"].as_str()),
        (trace_id.as_str(), Some(seen_span.as_str()))
    );
    assert_eq!(llm_spans[0]["parentSpanId"], root.span_id.to_string());
    assert_eq!(attribute(llm_spans[0], "provider").as_deref(), Some("openai"));
    assert_eq!(attribute(llm_spans[0], "model").as_deref(), Some("gpt-fake"));
    assert_eq!(attribute(llm_spans[0], "attempt").as_deref(), Some("1"));

    // `session.start` came before the turn: a trace of its own, exported too.
    let start = worker.records().into_iter().find(|r| r.trigger_name() == "session.start").unwrap();
    let (start_trace, start_span) = traceparent(start.header("traceparent"));
    assert_ne!(start_trace, trace_id);
    assert!(spans.iter().any(|(_, s)| s["traceId"] == start_trace && s["spanId"] == start_span));
}
