//! What a running host tells its operators: `GET /metrics` in the Prometheus text format, and
//! the same counters as CloudWatch Embedded Metric Format lines (what the Lambda functions
//! print), after real turns over HTTP against a fake model server; and the `traceparent` a
//! worker and a model provider receive (the exported spans: `tests/otlp.rs`).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use serde_json::{Value, json};
use turnstone_engine::protocol::Trigger;
use turnstone_engine::time::Timestamp;
use turnstone_runtime::trace::SpanContext;
use turnstone_tests::TestHost;
use turnstone_tests::fake::Reply;
use turnstone_tests::fake_collector::traceparent;
use turnstone_tests::fake_openai::FakeOpenAi;
use turnstone_tests::fake_worker::{FakeAnswer, FakeWorker};

fn config(openai: &FakeOpenAi, auth: &str) -> String {
    format!(
        r#"
[defaults]
llm = {{ timeout_secs = 5, max_retries = 2, backoff_base_secs = 0.05, backoff_max_secs = 0.1 }}

[llm.fake]
type = "openai"
base_url = "{}"
prices."gpt-fake" = {{ input = 2.5, output = 10.0 }}

[agent.paid]
model = "gpt-fake"
llm = "fake"
{auth}"#,
        openai.base_url()
    )
}

fn message(text: &str) -> Value {
    json!({"type": "client.message", "agent_id": "paid", "message": {"role": "user", "content": text}})
}

/// `name{labels}` -> value, for every sample line of a Prometheus text exposition; checks
/// that every sample's metric was declared with `# TYPE` first.
fn samples(text: &str) -> BTreeMap<String, f64> {
    let mut typed = Vec::new();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.push(rest.split(' ').next().unwrap().to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line:?}"));
        let name = key.split('{').next().unwrap();
        let family = ["_bucket", "_sum", "_count"].iter().fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
        assert!(typed.iter().any(|t| t == name || t == family), "{name} has no # TYPE line");
        out.insert(key.to_owned(), value.parse().unwrap_or_else(|_| panic!("not a number: {line:?}")));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_turns_calls_tokens_and_cost() {
    let openai = FakeOpenAi::start().await;
    // The first attempt fails and is retried; the second answers.
    openai.push(Reply::error(500, "overloaded"));
    openai.push(Reply::text("Hello.").usage(1000, 200));
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(&config(&openai, ""), dir.path()).await;
    // EMF lines as a Lambda function keeps them (the local host serves Prometheus only).
    host.app().metrics().collect_emf();
    let turn = host.submit_ok("s-m", &message("hi")).await;
    host.wait_turn("s-m", &turn).await;

    let response = host.http().get(format!("{}/metrics", host.url())).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let text = response.text().await.unwrap();
    let got = samples(&text);
    let at = |key: &str| got.get(key).copied().unwrap_or_else(|| panic!("no {key} in\n{text}"));
    assert_eq!(at(r#"turnstone_turns_started_total{agent="paid"}"#), 1.0);
    assert_eq!(at(r#"turnstone_turns_ended_total{agent="paid",status="completed"}"#), 1.0);
    assert_eq!(at(r#"turnstone_steps_total{agent="paid"}"#), 1.0);
    assert_eq!(at(r#"turnstone_call_attempts_total{agent="paid",kind="llm",result="retried"}"#), 1.0);
    assert_eq!(at(r#"turnstone_call_attempts_total{agent="paid",kind="llm",result="ok"}"#), 1.0);
    assert_eq!(at(r#"turnstone_tokens_total{agent="paid",model="gpt-fake",kind="input"}"#), 1000.0);
    assert_eq!(at(r#"turnstone_tokens_total{agent="paid",model="gpt-fake",kind="output"}"#), 200.0);
    // 1000 * 2.5 / 1e6 + 200 * 10 / 1e6 dollars.
    assert_eq!(at(r#"turnstone_cost_dollars_total{agent="paid",model="gpt-fake"}"#), 0.0045);
    assert_eq!(at(r#"turnstone_call_seconds_count{agent="paid",kind="llm"}"#), 2.0);
    assert_eq!(at(r#"turnstone_call_seconds_bucket{agent="paid",kind="llm",le="+Inf"}"#), 2.0);
    assert_eq!(at("turnstone_sessions_due"), 0.0);

    // The same counts as EMF lines, once: a drain takes them.
    let lines = host.app().metrics().drain_emf("Turnstone/test", Timestamp(1_800_000_000_000));
    let lines: Vec<Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let line = |dims: &[(&str, &str)]| {
        lines
            .iter()
            .find(|l| {
                let names = &l["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0];
                names.as_array().map(Vec::len) == Some(dims.len()) && dims.iter().all(|(k, v)| l[*k] == *v)
            })
            .unwrap_or_else(|| panic!("no line for {dims:?} in {lines:#?}"))
    };
    let agent = line(&[("agent", "paid")]);
    assert_eq!((agent["TurnsStarted"].clone(), agent["Steps"].clone()), (json!(1), json!(1)));
    assert_eq!(agent["_aws"]["Timestamp"], 1_800_000_000_000_i64);
    assert_eq!(agent["_aws"]["CloudWatchMetrics"][0]["Namespace"], "Turnstone/test");
    let declared: Vec<&str> = agent["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["Name"].as_str().unwrap())
        .collect();
    assert!(declared.contains(&"TurnsStarted") && declared.contains(&"Steps"), "{declared:?}");
    let ok = line(&[("agent", "paid"), ("kind", "llm"), ("result", "ok")]);
    assert_eq!(ok["CallAttempts"], 1);
    let latency = line(&[("agent", "paid"), ("kind", "llm")]);
    assert_eq!(latency["CallSeconds"].as_array().map(Vec::len), Some(2));
    let cost = line(&[("agent", "paid"), ("model", "gpt-fake")]);
    assert_eq!(cost["CostDollars"], 0.0045);
    assert!(
        host.app().metrics().drain_emf("Turnstone/test", Timestamp(0)).is_empty(),
        "a drain resets what it wrote"
    );
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_auth_on_only_an_admin_reads_metrics() {
    let openai = FakeOpenAi::start().await;
    let auth = "\n[auth]\napi_keys_env = \"KEYS\"\nadmin_keys_env = \"ADMINS\"\n";
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start_with_env(&config(&openai, auth), dir.path(), |name| match name {
        "KEYS" => Some("alice:key-alice".to_owned()),
        "ADMINS" => Some("root:key-root".to_owned()),
        _ => None,
    })
    .await;
    for (token, status) in [(None, 401), (Some("key-alice"), 403), (Some("key-root"), 200)] {
        let client = match token {
            Some(token) => host.with_token(token),
            None => (*host).clone(),
        };
        let (got, body) = client.get("/metrics").await;
        assert_eq!(got, status, "{token:?}: {body}");
    }
    host.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Traces

/// A worker agent whose steps the worker accepts and whose model the engine calls (`fake`).
fn worker_config(openai: &FakeOpenAi, worker: &FakeWorker) -> String {
    format!(
        r#"
[defaults]
llm = {{ timeout_secs = 5, max_retries = 1, backoff_base_secs = 0.05, backoff_max_secs = 0.1 }}
decision = {{ timeout_secs = 5, max_retries = 2, backoff_base_secs = 0.05, backoff_max_secs = 0.1 }}

[llm.fake]
type = "openai"
base_url = "{}"

[agent.traced]
model = "gpt-fake"
llm = "fake"
worker = "{}"
"#,
        openai.base_url(),
        worker.url()
    )
}

/// A worker that fails the first delivery (500) and accepts the retry: both deliveries, made
/// by different wake-ups, carry the turn's trace id (derived from the session and turn ids),
/// each with its own span id; the model call made for the same turn is in the same trace.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_keeps_its_trace_id_across_a_retried_delivery() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::text("Fine."));
    let worker = FakeWorker::start(None, |request, delivery_no| match &request.trigger {
        Trigger::ClientMessages(_) if delivery_no == 1 => FakeAnswer::Status(500, "{}".to_owned()),
        _ => FakeAnswer::Accept,
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(&worker_config(&openai, &worker), dir.path()).await;
    let input =
        json!({"type": "client.message", "agent_id": "traced", "message": {"role": "user", "content": "hi"}});
    let turn = host.submit_ok("s-retried", &input).await;
    host.wait_turn("s-retried", &turn).await;

    let expected = SpanContext::turn("s-retried", &turn);
    let first = worker.records().into_iter().find(|r| r.trigger_name() == "client.messages").unwrap();
    let deliveries = worker.deliveries_of(&first.request.decision_id);
    assert_eq!(deliveries.len(), 2, "one failed delivery and its retry");
    let seen: Vec<(String, String)> =
        deliveries.iter().map(|r| traceparent(r.header("traceparent"))).collect();
    for (trace_id, _) in &seen {
        assert_eq!(trace_id, &expected.trace_id.to_string());
    }
    assert_ne!(seen[0].1, seen[1].1, "each delivery attempt is its own span");
    for (record, (_, span_id)) in deliveries.iter().zip(&seen) {
        let derived = SpanContext::work(
            "s-retried",
            Some(&turn),
            "decision.deliver",
            &record.request.decision_id,
            record.request.attempts,
        );
        assert_eq!(span_id, &derived.span_id.to_string(), "attempt {}", record.request.attempts);
    }
    // Every other delivery of the turn (llm.finished...) and the model call: the same trace.
    // `session.start` comes before any turn: a trace of its own.
    for record in worker.records() {
        let (trace_id, _) = traceparent(record.header("traceparent"));
        if record.trigger_name() == "session.start" {
            assert_ne!(trace_id, seen[0].0);
        } else {
            assert_eq!(trace_id, seen[0].0, "{}", record.trigger_name());
        }
    }
    let model_calls = openai.requests();
    assert_eq!(model_calls.len(), 1);
    assert_eq!(traceparent(model_calls[0].header("traceparent")).0, seen[0].0);
    host.stop().await;
}

/// Labels come only from the configuration and the providers' known usage fields: a reply
/// naming its own model and inventing usage fields adds no series (each would be a metric the
/// host keeps for good, so a hostile provider or worker could grow the host without bound).
#[tokio::test(flavor = "multi_thread")]
async fn metric_labels_come_only_from_the_configuration_and_known_usage_fields() {
    let openai = FakeOpenAi::start().await;
    let body = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "attacker-model-1",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hello."}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "attacker_field_1": 5, "attacker_field_2": 6},
    });
    openai.push(Reply::raw(200, "application/json", body.to_string()));
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(&config(&openai, ""), dir.path()).await;
    let turn = host.submit_ok("s-labels", &message("hi")).await;
    host.wait_turn("s-labels", &turn).await;
    let text = host.http().get(format!("{}/metrics", host.url())).send().await.unwrap().text().await.unwrap();
    assert!(!text.contains("attacker"), "{text}");
    let got = samples(&text);
    assert_eq!(got.get(r#"turnstone_tokens_total{agent="paid",model="gpt-fake",kind="input"}"#), Some(&7.0));
    host.stop().await;
}
