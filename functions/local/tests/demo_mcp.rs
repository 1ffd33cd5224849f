//! The bundled demo's MCP server: `turnstone serve` with no configuration lists `notes`, a
//! stdio MCP server that is the binary itself (`turnstone mcp-notes`), and the scripted model
//! calls its tools: a reading one at once, a writing one once a person approves it.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstone_engine::session::TurnStatus;
use turnstone_tests::ApiClient;

const PATIENCE: Duration = Duration::from_secs(30);

/// `turnstone serve` on a free port, killed when dropped.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn serve_demo(data: &std::path::Path) -> (Serve, ApiClient) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(env!("CARGO_BIN_EXE_turnstone"))
        .args(["serve", "--addr", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let serve = Serve(child);
    let api = ApiClient::new(format!("http://127.0.0.1:{port}"));
    let started = Instant::now();
    while api.http().get(format!("{}/healthz", api.url())).send().await.is_err() {
        assert!(started.elapsed() < PATIENCE, "turnstone serve did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (serve, api)
}

async fn turn(api: &ApiClient, session: &str, text: &str) -> String {
    let input =
        json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": text}});
    api.submit_ok(session, &input).await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_agent_calls_the_tools_of_its_notes_mcp_server() {
    let dir = tempfile::tempdir().unwrap();
    let (_serve, api) = serve_demo(&dir.path().join("data")).await;

    let id = turn(&api, "s-notes", r#"/tool notes__count_words {"text": "one two three"}"#).await;
    assert_eq!(api.wait_turn("s-notes", &id).await.status, TurnStatus::Completed);
    assert_eq!(api.last_tool_result("s-notes").await, "3");

    // Writing a note is not read-only: a person approves it first.
    let id = turn(&api, "s-notes", r#"/tool notes__add_note {"text": "buy milk"}"#).await;
    let summary = api.wait_summary("s-notes", PATIENCE, |s| !s.awaiting_approval.is_empty()).await;
    let mcp: Value = serde_json::to_value(&summary.mcp_calls).unwrap();
    assert_eq!((&mcp[0]["server"], &mcp[0]["tool"]), (&json!("notes"), &json!("add_note")), "{mcp}");
    let call_id = mcp[0]["id"].as_str().unwrap();
    let (status, body) =
        api.submit("s-notes", &json!({"type": "tool.approval", "id": call_id, "approved": true})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(api.wait_turn("s-notes", &id).await.status, TurnStatus::Completed);
    assert_eq!(api.last_tool_result("s-notes").await, "noted (1 in all)");

    let id = turn(&api, "s-notes", "/tool notes__list_notes {}").await;
    assert_eq!(api.wait_turn("s-notes", &id).await.status, TurnStatus::Completed);
    assert_eq!(api.last_tool_result("s-notes").await, "1. buy milk");
}
