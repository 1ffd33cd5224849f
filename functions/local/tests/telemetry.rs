//! `turnstone serve --log-format json --otlp-endpoint URL`, the real binary: every log line on
//! stderr is a JSON object, and a turn's spans reach an OTLP collector (a fake, over HTTP) by
//! the time the process has ended on SIGTERM (the exporter is flushed on graceful shutdown).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstone_runtime::trace::SpanContext;
use turnstone_tests::ApiClient;
use turnstone_tests::fake_collector::{FakeCollector, attribute};

#[tokio::test(flavor = "multi_thread")]
async fn serve_logs_json_and_exports_a_turns_spans_over_otlp() {
    let collector = FakeCollector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_turnstone"))
        .args(["serve", "--log-format", "json", "--addr", &addr, "--otlp-endpoint", collector.url()])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        // The flag wins over the standard variable.
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start turnstone serve");
    let api = ApiClient::new(format!("http://{addr}"));
    let started = Instant::now();
    while !matches!(api.http().get(format!("{}/healthz", api.url())).send().await, Ok(r) if r.status().is_success())
    {
        assert!(started.elapsed() < Duration::from_secs(30), "serve did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let input =
        json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "hi"}});
    let turn = api.submit_ok("s-bin", &input).await;
    api.wait_turn("s-bin", &turn).await;

    // A graceful stop: SIGTERM, then the process flushes its exporter and exits.
    // The shell's own `kill`: no procps needed.
    let term = Command::new("sh").args(["-c", &format!("kill -TERM {}", child.id())]).status().unwrap();
    assert!(term.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "INFO"
            && l["message"].as_str().is_some_and(|m| m.starts_with("turnstone listening on"))),
        "{text}"
    );

    let trace_id = SpanContext::turn("s-bin", &turn).trace_id.to_string();
    let spans = collector.spans();
    let in_trace: Vec<&Value> = spans.iter().map(|(_, s)| s).filter(|s| s["traceId"] == trace_id).collect();
    let names: Vec<&str> = in_trace.iter().filter_map(|s| s["name"].as_str()).collect();
    assert!(names.contains(&"turn") && names.contains(&"llm.call"), "{names:?}");
    let llm = in_trace.iter().find(|s| s["name"] == "llm.call").unwrap();
    assert_eq!(attribute(llm, "provider").as_deref(), Some("scripted"));
    assert!(spans.iter().all(|(service, _)| service == "turnstone"));
}
