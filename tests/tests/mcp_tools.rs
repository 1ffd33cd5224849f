//! MCP tools end to end: an agent lists a real MCP server (the official Python SDK's, over
//! Streamable HTTP with a bearer token), its model (the scripted one) calls the server's tools
//! with `/tool <server>__<tool> {…}`, and the engine runs each call durably. Through the HTTP
//! API of a host in this process (SQLite, or with TURNSTONE_TEST_BACKEND the AWS backends).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use turnstone_engine::session::TurnStatus;
use turnstone_mcp::testing::{HttpServer, Log, free_port};
use turnstone_tests::host::BACKEND_ENV;
use turnstone_tests::{
    FakeAnthropic, FakeOpenAi, FakeOpenAiResponses, FakeToolCall, FakeWorker, Reply, TestHost,
};

const PATIENCE: Duration = Duration::from_secs(30);
const TOKEN: &str = "files-token";

/// The `demo` agent on the scripted model with MCP server `files` at `port`: its token from
/// `FILES_MCP_TOKEN`, destructive tools approved by a person, retries quick.
fn config(port: u16) -> String {
    format!(
        r#"
[llm.scripted]
type = "scripted"

[agent.demo]
model = "scripted-1"
retry = {{ timeout_secs = 30, max_retries = 6, backoff_base_secs = 0.5, backoff_max_secs = 2 }}

[[agent.demo.mcp]]
name = "files"
url = "http://127.0.0.1:{port}/mcp"
headers_env = {{ Authorization = "FILES_MCP_TOKEN" }}
tools = {{ exclude = ["slow"] }}
approve = "destructive"
timeout_secs = 5
"#
    )
}

async fn host(port: u16) -> (TestHost, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let env = |name: &str| (name == "FILES_MCP_TOKEN").then(|| format!("Bearer {TOKEN}"));
    let host = TestHost::start_with_env(&config(port), dir.path(), env).await;
    (host, dir)
}

fn message(text: &str) -> Value {
    json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": text}})
}

/// Waits for a call awaiting approval in `session` and approves it.
async fn approve_waiting_call(host: &TestHost, session: &str) {
    let summary = host.wait_summary(session, PATIENCE, |s| !s.awaiting_approval.is_empty()).await;
    let waiting = serde_json::to_value(&summary.awaiting_approval).unwrap();
    let call_id = waiting[0]["id"].as_str().unwrap().to_owned();
    // The session shows it as a call of the MCP server, not yet sent.
    let mcp = serde_json::to_value(&summary.mcp_calls).unwrap();
    assert_eq!(mcp[0]["id"], call_id.as_str(), "{mcp}");
    assert_eq!(
        (&mcp[0]["server"], &mcp[0]["status"], &mcp[0]["attempt"]),
        (&json!("files"), &json!("queued"), &json!(0))
    );
    assert_eq!(mcp[0]["awaiting_approval"], true);
    let approve = json!({"type": "tool.approval", "id": call_id, "approved": true});
    let (status, body) = host.submit(session, &approve).await;
    assert_eq!(status, 202, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_model_calls_a_tool_of_an_mcp_server_and_reads_its_result() {
    let port = free_port();
    let _server = HttpServer::python(port, Some(TOKEN), None);
    let (host, _dir) = host(port).await;

    let turn = host.submit_ok("s-echo", &message(r#"/tool files__echo {"text": "hello from MCP"}"#)).await;
    assert_eq!(host.wait_turn_within("s-echo", &turn, PATIENCE).await.status, TurnStatus::Completed);
    assert_eq!(host.last_tool_result("s-echo").await, "hello from MCP");
    let messages = host.messages("s-echo").await;
    assert_eq!(messages.last().unwrap()["content"], "files__echo returned: hello from MCP");

    // Structured content, and a tool's own failure (isError), which the model reads.
    // Tools that do not say they only read are asked about (`approve = "destructive"`).
    let turn = host.submit_ok("s-echo", &message(r#"/tool files__add {"a": 2, "b": 3}"#)).await;
    approve_waiting_call(&host, "s-echo").await;
    assert_eq!(host.wait_turn_within("s-echo", &turn, PATIENCE).await.status, TurnStatus::Completed);
    assert!(host.last_tool_result("s-echo").await.contains("5"), "{}", host.last_tool_result("s-echo").await);
    // A sentence beside structured content: the tool message (the log, what workers, clients
    // and the console read, and what the model is sent) keeps both.
    let turn = host.submit_ok("s-echo", &message(r#"/tool files__tally {"a": 2, "b": 3}"#)).await;
    approve_waiting_call(&host, "s-echo").await;
    assert_eq!(host.wait_turn_within("s-echo", &turn, PATIENCE).await.status, TurnStatus::Completed);
    let tally = host.last_tool_result("s-echo").await;
    assert_eq!(tally, "The total of the two is 5.\n{\"terms\":[2.0,3.0],\"total\":5.0}");
    let turn = host.submit_ok("s-echo", &message(r#"/tool files__fail {"message": "disk on fire"}"#)).await;
    approve_waiting_call(&host, "s-echo").await;
    assert_eq!(host.wait_turn_within("s-echo", &turn, PATIENCE).await.status, TurnStatus::Completed);
    assert!(host.last_tool_result("s-echo").await.contains("disk on fire"));

    // An excluded tool is not offered: the scripted model says it does not know it.
    let turn = host.submit_ok("s-echo", &message(r#"/tool files__slow {"seconds": 0, "marker": "x"}"#)).await;
    let ended = host.wait_turn_within("s-echo", &turn, PATIENCE).await;
    assert_eq!(ended.status, TurnStatus::Completed);
    let said = host.messages("s-echo").await.last().unwrap()["content"].as_str().unwrap().to_owned();
    assert!(said.starts_with("Unknown tool \"files__slow\"") && said.contains("files__echo"), "{said}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_destructive_tool_runs_only_once_a_person_approves_it() {
    let port = free_port();
    let _server = HttpServer::python(port, Some(TOKEN), None);
    let (host, _dir) = host(port).await;

    let turn = host.submit_ok("s-delete", &message(r#"/tool files__delete_note {"id": "n1"}"#)).await;
    approve_waiting_call(&host, "s-delete").await;
    assert_eq!(host.wait_turn_within("s-delete", &turn, PATIENCE).await.status, TurnStatus::Completed);
    assert_eq!(host.last_tool_result("s-delete").await, "deleted n1");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_to_a_server_that_is_down_is_sent_again_once_it_is_back() {
    let port = free_port();
    let server = HttpServer::python(port, Some(TOKEN), None);
    let (host, _dir) = host(port).await;
    // The session lists the server's tools while it is up.
    let turn = host.submit_ok("s-down", &message(r#"/tool files__echo {"text": "first"}"#)).await;
    assert_eq!(host.wait_turn_within("s-down", &turn, PATIENCE).await.status, TurnStatus::Completed);

    server.kill();
    let turn = host.submit_ok("s-down", &message(r#"/tool files__echo {"text": "second"}"#)).await;
    // The first attempt finds nothing listening: never sent, so retried by the agent's policy
    // (six retries over about 9.5 s: the Python server takes a second or more to come back,
    // longer on a loaded machine).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _back = HttpServer::python(port, Some(TOKEN), None);
    assert_eq!(host.wait_turn_within("s-down", &turn, PATIENCE).await.status, TurnStatus::Completed);
    assert_eq!(host.last_tool_result("s-down").await, "second");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_refuses_the_token_fails_the_call_saying_so_and_the_turn_goes_on() {
    let port = free_port();
    let server = HttpServer::python(port, Some(TOKEN), None);
    let (host, _dir) = host(port).await;
    let turn = host.submit_ok("s-401", &message(r#"/tool files__echo {"text": "listed"}"#)).await;
    assert_eq!(host.wait_turn_within("s-401", &turn, PATIENCE).await.status, TurnStatus::Completed);
    server.kill();
    let log = Log::new("token");
    let _other = HttpServer::python(port, Some("another-token"), Some(&log.0));
    let turn = host.submit_ok("s-401", &message(r#"/tool files__echo {"text": "refused"}"#)).await;
    assert_eq!(host.wait_turn_within("s-401", &turn, PATIENCE).await.status, TurnStatus::Completed);
    let error = host.last_tool_result("s-401").await;
    assert!(error.contains("files") && error.contains("401"), "{error}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_the_server_adds_is_offered_from_the_next_turn_of_the_same_session() {
    let port = free_port();
    let _server = HttpServer::python(port, Some(TOKEN), None);
    let (host, _dir) = host(port).await;
    let turn = host.submit_ok("s-extra", &message("/tool files__enable_extra {}")).await;
    approve_waiting_call(&host, "s-extra").await;
    assert_eq!(host.wait_turn_within("s-extra", &turn, PATIENCE).await.status, TurnStatus::Completed);
    assert_eq!(host.last_tool_result("s-extra").await, "extra enabled");

    // On the template's functions the notice went to the dispatch function's connection (MCP
    // notifies the session that asked), and the API function, which lists for new turns, keeps
    // its listing until it is five minutes old: the next turn still offers the old list.
    if std::env::var(BACKEND_ENV).as_deref() == Ok("topology") {
        let turn = host.submit_ok("s-extra", &message("/tool files__extra {}")).await;
        assert_eq!(host.wait_turn_within("s-extra", &turn, PATIENCE).await.status, TurnStatus::Completed);
        let said = host.messages("s-extra").await.last().unwrap()["content"].as_str().unwrap().to_owned();
        assert!(said.starts_with("Unknown tool \"files__extra\""), "{said}");
        host.stop().await;
        return;
    }
    // The server said tools/list_changed: the next turn lists again and offers `extra`.
    let turn = host.submit_ok("s-extra", &message("/tool files__extra {}")).await;
    approve_waiting_call(&host, "s-extra").await;
    assert_eq!(host.wait_turn_within("s-extra", &turn, PATIENCE).await.status, TurnStatus::Completed);
    assert_eq!(host.last_tool_result("s-extra").await, "extra");
    // The session's log says what the model was offered from then on.
    let written =
        host.events("s-extra", 0).await.into_iter().filter(|e| e.event["type"] == "agent_written").count();
    assert_eq!(written, 1);
    host.stop().await;
}

/// An agent with a worker: the worker sees the MCP tools in `DecisionRequest.agent`, the calls
/// it accepts (or proposes) are run by the engine, never sent to it as `tool.execute`.
#[tokio::test(flavor = "multi_thread")]
async fn a_workers_agent_offers_mcp_tools_and_the_engine_runs_the_calls_it_accepts() {
    let port = free_port();
    let _server = HttpServer::python(port, Some(TOKEN), None);
    let worker = FakeWorker::accept_all(None).await;
    let config =
        config(port).replace("[agent.demo]\n", &format!("[agent.demo]\nworker = \"{}\"\n", worker.url()));
    let dir = tempfile::tempdir().unwrap();
    let env = |name: &str| (name == "FILES_MCP_TOKEN").then(|| format!("Bearer {TOKEN}"));
    let host = TestHost::start_with_env(&config, dir.path(), env).await;

    let turn = host.submit_ok("s-worker", &message(r#"/tool files__echo {"text": "via the worker"}"#)).await;
    assert_eq!(host.wait_turn_within("s-worker", &turn, PATIENCE).await.status, TurnStatus::Completed);
    assert_eq!(host.last_tool_result("s-worker").await, "via the worker");
    let records = worker.records();
    // The declared config, MCP tools included, as the worker sees it (in `proposed` at
    // `session.start`, then as the session's config).
    let offered = |r: &turnstone_tests::WorkerRecord| {
        let agent = r.request.agent.as_ref().or(r.request.proposed.agent.as_ref())?;
        agent.tools().iter().find(|t| t.name == "files__echo").cloned()
    };
    let echo = records.iter().find_map(offered).expect("the worker was shown the MCP tool");
    let source = echo.mcp.unwrap();
    assert_eq!((source.server.as_str(), source.tool.as_str()), ("files", "echo"));
    assert!(
        records.iter().all(|r| r.trigger_name() != "tool.execute"),
        "{:?}",
        records.iter().map(|r| r.trigger_name()).collect::<Vec<_>>()
    );
    host.stop().await;
}

/// An MCP tool's image reaches each provider's model in the shape its API takes (the strict
/// fakes refuse any other, as the APIs do): inside the tool result for Anthropic and the
/// Responses API, in a user message after the results for Chat Completions, whose tool
/// messages carry text only. The session keeps the tool message with the image as a part.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_an_mcp_tool_returns_reaches_each_providers_model() {
    let port = free_port();
    let _server = HttpServer::python(port, Some(TOKEN), None);
    let chat = FakeOpenAi::start().await;
    let claude = FakeAnthropic::start().await;
    let responses = FakeOpenAiResponses::start().await;
    for fake in [&*chat, &*claude, &*responses] {
        fake.push(Reply::tool_calls([FakeToolCall::new("call_1", "files__image", "{}")]));
        fake.push(Reply::text("A red dot."));
    }
    let mut config = String::new();
    for (llm, kind, url) in [
        ("chat", "openai", chat.base_url()),
        ("claude", "anthropic", claude.base_url()),
        ("responses", "openai-responses", responses.base_url()),
    ] {
        config.push_str(&format!(
            r#"
[llm.{llm}]
type = "{kind}"
base_url = "{url}"

[agent.{llm}]
model = "m-1"
llm = "{llm}"

[[agent.{llm}.mcp]]
name = "files"
url = "http://127.0.0.1:{port}/mcp"
headers_env = {{ Authorization = "FILES_MCP_TOKEN" }}
approve = "never"
"#
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let env = |name: &str| (name == "FILES_MCP_TOKEN").then(|| format!("Bearer {TOKEN}"));
    let host = TestHost::start_with_env(&config, dir.path(), env).await;
    for agent in ["chat", "claude", "responses"] {
        let session = format!("s-image-{agent}");
        let input = json!({"type": "client.message", "agent_id": agent, "message": {"role": "user", "content": "Draw."}});
        let turn = host.submit_ok(&session, &input).await;
        let ended = host.wait_turn_within(&session, &turn, PATIENCE).await;
        assert_eq!(ended.status, TurnStatus::Completed, "{agent}: {ended:?}");
        let messages = host.messages(&session).await;
        let tool = messages.iter().find(|m| m["role"] == "tool").unwrap();
        assert_eq!(tool["content"][0]["type"], "image_url", "{agent}: {tool}");
        assert!(
            tool["content"][0]["image_url"]["url"]
                .as_str()
                .unwrap()
                .starts_with("data:image/png;base64,iVBOR")
        );
    }
    let is_png = |url: &Value| url.as_str().is_some_and(|u| u.starts_with("data:image/png;base64,iVBOR"));
    // Chat Completions: the tool message says where the image went; a user message carries it.
    let sent = &chat.requests()[1].body["messages"];
    let tool = sent.as_array().unwrap().iter().position(|m| m["role"] == "tool").unwrap();
    assert!(sent[tool]["content"].as_str().unwrap().contains("follows in the next user message"), "{sent}");
    assert_eq!(sent[tool + 1]["role"], "user", "{sent}");
    assert!(is_png(&sent[tool + 1]["content"][1]["image_url"]["url"]), "{sent}");
    // Anthropic: an image block in the tool_result.
    let sent = &claude.requests()[1].body["messages"];
    let result = &sent.as_array().unwrap().last().unwrap()["content"][0];
    assert_eq!(
        (&result["type"], &result["content"][0]["type"]),
        (&json!("tool_result"), &json!("image")),
        "{sent}"
    );
    assert_eq!(result["content"][0]["source"]["media_type"], "image/png");
    // Responses: an input_image in the function_call_output.
    let sent = &responses.requests()[1].body["input"];
    let output = sent.as_array().unwrap().iter().find(|i| i["type"] == "function_call_output").unwrap();
    assert_eq!(output["output"][0]["type"], "input_image", "{sent}");
    assert!(is_png(&output["output"][0]["image_url"]), "{sent}");
    host.stop().await;
}
