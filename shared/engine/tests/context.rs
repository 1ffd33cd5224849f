//! The model's view of a long conversation (issue 40): compaction markers, what a request sends
//! through them, where a compaction may cut, and its fence.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::*;
use turnstone_engine::protocol::*;
use turnstone_engine::session::*;

fn harness_with(system: &str) -> Harness {
    let mut config = agent("m");
    config.system = Some(system.into());
    config.tools = Some(vec![client_tool("lookup"), client_tool("read")]);
    harness("s", init("a", Some(config), false))
}

/// `n` turns whose user message and reply take about `bytes` each.
fn turns(h: &mut Harness, n: usize, bytes: usize) {
    for i in 0..n {
        h.turn(&format!("question {i} {}", "q".repeat(bytes)), &format!("answer {i} {}", "a".repeat(bytes)));
    }
}

fn limits(window: u64) -> ContextLimits {
    ContextLimits { summary_max_tokens: 500, ..ContextLimits::with_window(window, 1_000) }
}

fn summary(text: &str) -> LlmResponse {
    let mut r = reply(text);
    r.usage = Some(serde_json::json!({"prompt_tokens": 900, "completion_tokens": 100}));
    r.cost = Some("0.01".into());
    r
}

/// Submits a message and claims its model call; returns the call and its request's estimate.
fn next_call(h: &mut Harness, text: &str) -> (CallRecord, u32) {
    h.submit(text);
    let (call_id, attempt) = h.claim_llm();
    (h.session.call(&call_id).unwrap().clone(), attempt)
}

fn plan(h: &Harness, call: &CallRecord, limits: &ContextLimits) -> Result<Option<CompactionPlan>, TooLarge> {
    let request = h.session.llm_request_with(call, &ViewOptions::from(limits)).unwrap();
    let estimate = h.session.prompt_estimate(call, &request, &ViewOptions::from(limits));
    h.session.plan_compaction(call, limits, limits.max_output, Session::fixed_tokens(&request), estimate)
}

fn texts(request: &LlmRequest) -> Vec<String> {
    request.messages.iter().map(|m| m.content_text()).collect()
}

#[test]
fn a_summary_replaces_what_it_covers_and_the_log_keeps_everything() {
    let mut h = harness_with("be brief");
    turns(&mut h, 8, 600);
    let (call, attempt) = next_call(&mut h, "the newest question");
    let limits = limits(3_000);
    let plan = plan(&h, &call, &limits).unwrap().expect("something to compact");
    assert_eq!(plan.compaction.kind, CompactionKind::Summary);
    assert!(plan.tokens_after < plan.tokens_before, "{plan:?}");
    // The summary covers whole exchanges: what is kept starts with a user message.
    let through = plan.compaction.through.clone();
    let path = h.session.tree().active_path();
    let at = path.iter().position(|m| m.id == through).unwrap();
    assert_eq!(path[at + 1].role, Role::User);
    let request = plan.summary_request("m", None, 10_000, 500);
    assert_eq!(request.messages.len(), 2);
    assert!(request.messages[1].content_text().contains("question 0"));
    assert!(!request.messages[1].content_text().contains("the newest question"));

    h.exec(Command::Compact {
        call_id: call.id.clone(),
        attempt,
        compaction: plan.compaction.clone(),
        response: Some(summary("SUMMARY: eight questions answered")),
        tokens_before: plan.tokens_before,
        tokens_after: plan.tokens_after,
        reason: "threshold".into(),
    });
    let call = h.session.call(&call.id).unwrap().clone();
    let marker = h.session.tree().head().cloned().unwrap();
    assert_eq!(call.anchor.as_ref(), Some(&marker), "the call reads from the marker");
    let request = h.session.llm_request(&call).unwrap();
    let sent = texts(&request);
    assert_eq!(sent[0], "be brief", "the system prompt stays first and unchanged");
    assert!(sent[1].starts_with(SUMMARY_PREFACE) && sent[1].contains("SUMMARY: eight questions"), "{sent:?}");
    assert!(sent.iter().all(|t| !t.contains("question 0 ")), "covered messages are not sent: {sent:?}");
    assert!(sent.last().unwrap().contains("the newest question"));
    // Nothing is lost: the active path holds every message and the marker.
    let path = h.session.tree().active_path();
    assert!(path.iter().any(|m| m.content_text().starts_with("question 0 ")));
    assert_eq!(path.last().unwrap().compaction.as_deref().map(|c| c.kind), Some(CompactionKind::Summary));
    // The compaction's usage counts toward the turn's and the session's.
    let calls_before = h.session.usage().llm_calls;
    h.finish_llm((call.id.clone(), attempt), "the newest answer");
    assert_eq!(h.session.usage().llm_calls, calls_before + 1);
    assert_eq!(h.last_turn().usage.llm_calls, 2, "the compaction and the answer");
    // Later requests send the summary and what came after it.
    let (call, _) = next_call(&mut h, "one more");
    let sent = texts(&h.session.llm_request(&call).unwrap());
    assert!(sent[1].contains("SUMMARY: eight questions"));
    assert!(sent.iter().any(|t| t == "the newest answer"));
}

#[test]
fn a_compaction_is_fenced_by_the_attempt_it_was_made_for() {
    let mut h = harness_with("s");
    turns(&mut h, 6, 600);
    let (call, attempt) = next_call(&mut h, "now");
    let plan = plan(&h, &call, &limits(2_500)).unwrap().unwrap();
    let compact = |attempt| Command::Compact {
        call_id: call.id.clone(),
        attempt,
        compaction: plan.compaction.clone(),
        response: Some(summary("S")),
        tokens_before: 1,
        tokens_after: 1,
        reason: "threshold".into(),
    };
    assert!(matches!(h.try_exec(compact(attempt + 1)), Err(Rejection::StaleClaim(_))));
    // The attempt times out: its compaction no longer lands.
    h.advance(200_000);
    h.exec(Command::Tick);
    assert!(matches!(h.try_exec(compact(attempt)), Err(Rejection::StaleClaim(_))));
    h.advance(60_000);
    h.exec(Command::Tick);
    // A `through` off the call's path is refused.
    let (call_id, attempt) = h.claim_llm();
    let bad = Command::Compact {
        call_id,
        attempt,
        compaction: Compaction { kind: CompactionKind::Summary, through: "msg_nowhere".into() },
        response: Some(summary("S")),
        tokens_before: 1,
        tokens_after: 1,
        reason: "threshold".into(),
    };
    assert!(matches!(h.try_exec(bad), Err(Rejection::InvalidInput(_))));
}

#[test]
fn a_cut_never_separates_a_tool_call_from_its_result() {
    let mut h = harness_with("s");
    h.submit("use the tools");
    for i in 0..8 {
        let id = format!("call_{i}");
        h.run_llm(tool_calls(&[(&id, "lookup", "{}")]));
        h.exec(client_result(&id, &"r".repeat(800)));
    }
    let Some((call_id, _)) = h.due_llm() else { panic!("no model call due") };
    h.claim_llm();
    let call = h.session.call(&call_id).unwrap().clone();
    let limits = ContextLimits { clear_tool_results: false, ..limits(3_000) };
    let plan = plan(&h, &call, &limits).unwrap().expect("a tool loop compacts inside its turn");
    let path = h.session.tree().active_path();
    let at = path.iter().position(|m| m.id == plan.compaction.through).unwrap();
    assert_ne!(path[at + 1].role, Role::Tool, "what is kept starts at no tool result");
    assert_eq!(path[at].role, Role::Tool, "a tool loop is cut after a result");
}

#[test]
fn clearing_tool_results_keeps_the_calls_and_stubs_the_bodies() {
    let mut h = harness_with("s");
    h.submit("use the tools");
    for i in 0..6 {
        let id = format!("call_{i}");
        h.run_llm(tool_calls(&[(&id, "lookup", "{}")]));
        h.exec(client_result(&id, &format!("result {i} {}", "r".repeat(1_500))));
    }
    h.claim_llm();
    let call = h.session.calls().iter().find(|c| c.is_server_llm()).unwrap().clone();
    let plan = plan(&h, &call, &limits(4_000)).unwrap().unwrap();
    assert_eq!(plan.compaction.kind, CompactionKind::ClearedToolResults, "{plan:?}");
    h.exec(Command::Compact {
        call_id: call.id.clone(),
        attempt: call.attempt,
        compaction: plan.compaction,
        response: None,
        tokens_before: plan.tokens_before,
        tokens_after: plan.tokens_after,
        reason: "threshold".into(),
    });
    let call = h.session.call(&call.id).unwrap().clone();
    let request = h.session.llm_request(&call).unwrap();
    let tools: Vec<&DraftMessage> =
        request.messages.iter().map(|m| &**m).filter(|m| m.role == Role::Tool).collect();
    assert_eq!(tools.len(), 6, "every result is still answered");
    assert!(tools[0].content_text().starts_with("[tool result cleared"), "{:?}", tools[0]);
    assert!(tools.last().unwrap().content_text().starts_with("result 5"), "the newest stays whole");
    let calls =
        request.messages.iter().filter(|m| !m.tool_calls.as_deref().unwrap_or_default().is_empty()).count();
    assert_eq!(calls, 6, "the calls stay");
}

#[test]
fn a_tool_result_is_cut_to_its_cap_in_the_view_only() {
    let mut h = harness_with("s");
    h.submit("read it");
    h.run_llm(tool_calls(&[("call_big", "read", "{}")]));
    let big = format!("HEAD{}TAIL", "x".repeat(30_000));
    h.exec(client_result("call_big", &big));
    h.claim_llm();
    let call = h.session.calls().iter().find(|c| c.is_server_llm()).unwrap().clone();
    let view = ViewOptions { tool_result_max_tokens: Some(1_000) };
    let request = h.session.llm_request_with(&call, &view).unwrap();
    let tool = request.messages.iter().find(|m| m.role == Role::Tool).unwrap().content_text();
    assert!(tool.len() < 3_200 && tool.starts_with("HEAD") && tool.ends_with("TAIL"), "{}", tool.len());
    assert!(tool.contains("bytes left out"));
    let logged =
        h.session.tree().active_path().into_iter().find(|m| m.role == Role::Tool).unwrap().content_text();
    assert_eq!(logged.len(), big.len(), "the log keeps it whole");
}

#[test]
fn the_newest_message_alone_past_the_window_cannot_be_compacted() {
    let mut h = harness_with("s");
    turns(&mut h, 3, 200);
    let (call, _) = next_call(&mut h, &"z".repeat(30_000));
    let err = plan(&h, &call, &limits(5_000)).unwrap_err();
    assert!(err.tokens > 5_000 && err.window == 5_000);
    assert!(err.to_string().contains("does not fit the model's context window"), "{err}");
}

#[test]
fn a_rewind_to_before_a_marker_leaves_its_summary_behind() {
    let mut h = harness_with("s");
    turns(&mut h, 6, 600);
    let before = h.session.tree().head().cloned();
    let (call, attempt) = next_call(&mut h, "now");
    let plan = plan(&h, &call, &limits(2_500)).unwrap().unwrap();
    h.exec(Command::Compact {
        call_id: call.id.clone(),
        attempt,
        compaction: plan.compaction,
        response: Some(summary("THE SUMMARY")),
        tokens_before: 1,
        tokens_after: 1,
        reason: "threshold".into(),
    });
    h.finish_llm((call.id, attempt), "done");
    h.exec(Command::Rewind { head: before });
    let (call, _) = next_call(&mut h, "again, on the old branch");
    let sent = texts(&h.session.llm_request(&call).unwrap());
    assert!(sent.iter().all(|t| !t.contains("THE SUMMARY")), "{sent:?}");
    assert!(sent.iter().any(|t| t.starts_with("question 0 ")));
}

#[test]
fn the_estimate_builds_on_what_the_provider_reported() {
    let mut h = harness_with("s");
    h.submit("first");
    let (call_id, attempt) = h.claim_llm();
    let mut response = reply("an answer");
    response.usage =
        Some(serde_json::json!({"input_tokens": 100, "cache_read_input_tokens": 19_900, "output_tokens": 5}));
    h.exec(Command::LlmCallFinished { call_id, attempt, outcome: Ok(response) });
    let (call, _) = next_call(&mut h, "second");
    let request = h.session.llm_request(&call).unwrap();
    let estimate = h.session.prompt_estimate(&call, &request, &ViewOptions::default());
    // 20,000 reported, plus the reply and the new message (a few dozen tokens).
    assert!((20_000..20_100).contains(&estimate), "{estimate}");
    // Without the report (a prompt too small to keep one), the whole view's bytes are counted.
    let whole: u64 = request.messages.iter().map(|m| message_tokens(m)).sum();
    assert!(whole < 100, "{whole}");
}
