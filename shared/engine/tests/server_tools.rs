//! Tool calls the engine runs itself (an MCP server's tools, `handler: "server"`): claimed
//! before they are sent, fenced by attempt, retried only when they cannot have run twice.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use turnstone_engine::ids::CallId;
use turnstone_engine::protocol::*;
use turnstone_engine::session::*;

/// An MCP tool of server `files`, `idempotent` as its annotations say.
fn mcp_tool(name: &str, idempotent: bool, approval: Option<Approval>) -> AgentTool {
    AgentTool {
        name: format!("files__{name}"),
        description: None,
        input: None,
        output: None,
        handler: Some(ToolHandler::Server),
        approval,
        mcp: Some(McpToolSource {
            server: "files".into(),
            tool: name.into(),
            timeout_secs: 10.0,
            idempotent,
        }),
    }
}

/// An engine-hosted session whose model asked for call `c1` of `tool`.
fn at_a_server_tool_call(tool: AgentTool) -> Harness {
    let name = tool.name.clone();
    let mut config = agent("m");
    config.tools = Some(vec![tool]);
    config.retry = Some(RetryPolicy {
        timeout_secs: Some(30.0),
        max_retries: 2,
        backoff_base_secs: 1.0,
        backoff_max_secs: 4.0,
    });
    let mut h = harness("s", init("demo", Some(config), false));
    h.exec(message("demo", "go"));
    h.run_llm(tool_calls(&[("c1", &name, r#"{"path":"a"}"#)]));
    h
}

fn due_tool(h: &Harness) -> Option<(CallId, u32)> {
    h.session.plan(h.now).effects.into_iter().find_map(|e| match e {
        Effect::RunToolCall { call_id, attempt } => Some((call_id, attempt)),
        _ => None,
    })
}

fn claim_tool(h: &mut Harness) -> (CallId, u32) {
    let (call_id, attempt) = due_tool(h).expect("a server tool call is due");
    h.exec(Command::ClaimToolCall { call_id: call_id.clone(), attempt });
    (call_id, attempt)
}

#[test]
fn a_server_tool_call_is_claimed_then_its_result_answers_the_model() {
    let mut h = at_a_server_tool_call(mcp_tool("read", false, None));
    let call = h.session.call(&"c1".into()).unwrap();
    assert_eq!((call.status, call.attempt), (CallStatus::Queued, 0), "nothing runs before the claim");
    assert!(h.due_llm().is_none());
    let (call_id, attempt) = claim_tool(&mut h);
    assert_eq!(attempt, 1);
    let call = h.session.call(&call_id).unwrap();
    assert!(call.is_pending());
    // The server's timeout plus the time the host has to report.
    assert_eq!(call.deadline.map(|d| d.0 - h.now.0), Some(20_000));
    assert!(due_tool(&h).is_none(), "a claimed call is not due again");
    assert_eq!(
        h.try_exec(Command::ClaimToolCall { call_id: call_id.clone(), attempt }).unwrap_err().code(),
        "stale_claim"
    );
    h.exec(Command::ToolCallFinished { call_id, attempt, outcome: Ok("hello".into()) });
    assert_eq!(h.path_texts().last().map(String::as_str), Some("Tool:hello"));
    h.run_llm(reply("done"));
    assert_eq!(h.last_turn().status, TurnStatus::Completed);
}

#[test]
fn a_result_with_an_image_is_recorded_as_parts_and_the_model_reads_them() {
    let mut h = at_a_server_tool_call(mcp_tool("chart", false, None));
    let (call_id, attempt) = claim_tool(&mut h);
    let parts = vec![
        ContentPart::Text { text: "the chart".into() },
        ContentPart::ImageUrl { image_url: UrlRef { url: "data:image/png;base64,iVBORw0K".into() } },
    ];
    h.exec(Command::ToolCallFinished { call_id, attempt, outcome: Ok(Content::Parts(parts.clone())) });
    let path = h.session.tree().active_path();
    let tool = path.last().unwrap();
    assert_eq!((tool.role, tool.content.clone()), (Role::Tool, Some(Content::Parts(parts.clone()))));
    let (next, _) = h.claim_llm();
    let call = h.session.call(&next).unwrap().clone();
    let request = h.session.llm_request(&call).unwrap();
    assert_eq!(request.messages.last().unwrap().content, Some(Content::Parts(parts)));
}

#[test]
fn a_result_larger_than_a_message_may_be_fails_the_call_saying_so() {
    let mut h = at_a_server_tool_call(mcp_tool("dump", false, None));
    let (call_id, attempt) = claim_tool(&mut h);
    let huge = "x".repeat(Limits::default().message_bytes + 1);
    h.exec(Command::ToolCallFinished { call_id, attempt, outcome: Ok(huge.into()) });
    let text = h.path_texts().last().cloned().unwrap_or_default();
    assert!(text.starts_with("Tool:the result is"), "{text}");
    assert!(text.contains("over the limit of 262144 (limits.message_bytes)"), "{text}");
    assert!(h.due_llm().is_some(), "the turn goes on");
}

#[test]
fn a_call_that_never_reached_its_server_is_sent_again_and_a_stale_attempt_is_refused() {
    let mut h = at_a_server_tool_call(mcp_tool("read", false, None));
    let (call_id, attempt) = claim_tool(&mut h);
    let not_sent =
        CallError { retryable: true, ..CallError::terminal("MCP server \"files\": connection refused") };
    h.exec(Command::ToolCallFinished { call_id: call_id.clone(), attempt, outcome: Err(not_sent) });
    assert_eq!(h.session.call(&call_id).unwrap().status, CallStatus::RetryScheduled);
    h.advance(5_000);
    h.exec(Command::Tick);
    let (_, second) = claim_tool(&mut h);
    assert_eq!(second, 2);
    let late = Command::ToolCallFinished { call_id: call_id.clone(), attempt: 1, outcome: Ok("late".into()) };
    assert_eq!(h.try_exec(late).unwrap_err().code(), "stale_attempt");
    h.exec(Command::ToolCallFinished { call_id, attempt: 2, outcome: Ok("hello".into()) });
    assert_eq!(h.path_texts().last().map(String::as_str), Some("Tool:hello"));
}

#[test]
fn a_call_whose_host_stopped_after_claiming_it_is_not_sent_twice() {
    let mut h = at_a_server_tool_call(mcp_tool("write", false, None));
    claim_tool(&mut h);
    // The host died: nothing reports; the deadline passes.
    h.advance(21_000);
    h.exec(Command::Tick);
    let text = h.path_texts().last().cloned().unwrap_or_default();
    assert!(text.starts_with("Tool:"), "the model is answered: {text}");
    assert!(text.contains("may have run") && text.contains("not sent again"), "{text}");
    assert!(h.session.call(&"c1".into()).is_none(), "settled for good");
    assert!(due_tool(&h).is_none());
    assert!(h.due_llm().is_some(), "the turn goes on");
}

#[test]
fn an_idempotent_tool_whose_host_stopped_is_sent_again() {
    let mut h = at_a_server_tool_call(mcp_tool("read", true, None));
    claim_tool(&mut h);
    h.advance(21_000);
    h.exec(Command::Tick);
    assert_eq!(h.session.call(&"c1".into()).unwrap().status, CallStatus::RetryScheduled);
    h.advance(5_000);
    h.exec(Command::Tick);
    assert_eq!(claim_tool(&mut h).1, 2);
}

#[test]
fn a_server_tool_needing_approval_runs_only_once_approved() {
    let mut h = at_a_server_tool_call(mcp_tool("delete", false, Some(Approval::Always)));
    assert!(due_tool(&h).is_none(), "waits for a person");
    let err = h.try_exec(Command::ClaimToolCall { call_id: "c1".into(), attempt: 1 }).unwrap_err();
    assert_eq!(err.code(), "stale_claim");
    h.exec(approval("c1", true, None));
    assert_eq!(claim_tool(&mut h), ("c1".into(), 1));
}

#[test]
fn nobody_but_the_engine_settles_a_server_tool_call() {
    let mut h = at_a_server_tool_call(mcp_tool("read", false, None));
    claim_tool(&mut h);
    let err = h.try_exec(client_result("c1", "forged")).unwrap_err();
    assert_eq!(err.code(), "not_a_client_call");
}

#[test]
fn an_agent_config_says_which_server_runs_a_server_tool() {
    let mut config = agent("m");
    config.tools = Some(vec![AgentTool { mcp: None, ..mcp_tool("read", false, None) }]);
    let err = config.validate().unwrap_err();
    assert_eq!(err.path, "tools[0].mcp");
    config.tools = Some(vec![AgentTool { handler: None, ..mcp_tool("read", false, None) }]);
    assert_eq!(config.validate().unwrap_err().path, "tools[0].handler");
}

#[test]
fn a_new_listing_of_mcp_tools_becomes_a_config_version_when_it_changes_anything() {
    let own = AgentTool {
        name: "own".into(),
        handler: Some(ToolHandler::Client),
        mcp: None,
        ..mcp_tool("x", false, None)
    };
    let mut config = agent("m");
    config.tools = Some(vec![own, mcp_tool("read", false, None)]);
    let mut h = harness("s", init("demo", Some(config), false));
    let same = vec![mcp_tool("read", false, None)];
    assert!(h.exec(Command::McpToolsListed { tools: same }).is_empty(), "nothing changed");
    let more = vec![mcp_tool("read", false, None), mcp_tool("extra", false, None)];
    assert_eq!(names(&h.exec(Command::McpToolsListed { tools: more })), ["agent.written"]);
    let names_now: Vec<&str> =
        h.session.current_agent().unwrap().tools().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names_now, ["own", "files__read", "files__extra"], "the agent's own tools first, kept");
    // The next model call offers the new tool.
    h.exec(message("demo", "go"));
    let (call_id, _) = h.claim_llm();
    let call = h.session.call(&call_id).unwrap().clone();
    let offered: Vec<String> =
        h.session.llm_request(&call).unwrap().tools.unwrap().into_iter().map(|t| t.name).collect();
    assert!(offered.contains(&"files__extra".to_owned()), "{offered:?}");
}

#[test]
fn a_listing_that_would_clash_with_another_tool_is_not_taken() {
    let mut config = agent("m");
    config.tools = Some(vec![mcp_tool("read", false, None)]);
    config.sub_agents = Some(vec![SubAgent { id: "files__write".into(), description: None }]);
    let mut h = harness("s", init("demo", Some(config), false));
    let clash = vec![mcp_tool("read", false, None), mcp_tool("write", false, None)];
    assert!(h.exec(Command::McpToolsListed { tools: clash }).is_empty());
    // A worker's session that wrote no config yet has none to change.
    let mut w = harness("w", init("w", None, true));
    assert!(w.exec(Command::McpToolsListed { tools: vec![mcp_tool("read", false, None)] }).is_empty());
}
