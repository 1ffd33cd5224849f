//! An MCP server over stdio, a child process of the host: the local host (and its DynamoDB
//! backend) run one, started on a session's first step; a Lambda deployment refuses it
//! (`Config::check_for_functions`), so this file is not run on the template's functions.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::json;
use turnstone_engine::session::TurnStatus;
use turnstone_mcp::testing::{everything_stdio_command, python_stdio_command};
use turnstone_tests::TestHost;

const PATIENCE: Duration = Duration::from_secs(30);

fn config(servers: &[(&str, Vec<String>)]) -> String {
    let mut config =
        "[llm.scripted]\ntype = \"scripted\"\n\n[agent.demo]\nmodel = \"scripted-1\"\n".to_owned();
    for (name, command) in servers {
        let command = serde_json::to_string(command).unwrap();
        config +=
            &format!("\n[[agent.demo.mcp]]\nname = \"{name}\"\ncommand = {command}\napprove = \"never\"\n");
    }
    config
}

#[tokio::test(flavor = "multi_thread")]
async fn tools_of_stdio_servers_run_on_the_local_host() {
    let dir = tempfile::tempdir().unwrap();
    let servers = [("py", python_stdio_command()), ("everything", everything_stdio_command())];
    let host = TestHost::start(&config(&servers), dir.path()).await;
    let text =
        "/tool py__echo {\"text\": \"over stdio\"}\n/tool everything__echo {\"message\": \"from node\"}";
    let input =
        json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": text}});
    let turn = host.submit_ok("s-stdio", &input).await;
    assert_eq!(host.wait_turn_within("s-stdio", &turn, PATIENCE).await.status, TurnStatus::Completed);
    let messages = host.messages("s-stdio").await;
    let results: Vec<&str> =
        messages.iter().filter(|m| m["role"] == "tool").map(|m| m["content"].as_str().unwrap()).collect();
    assert_eq!(results.len(), 2, "{messages:?}");
    assert_eq!(results[0], "over stdio");
    assert!(results[1].contains("from node"), "{}", results[1]);
    host.stop().await;
}
