//! One test per rule of the session: each fails when its rule is broken.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use std::sync::Arc;

use common::*;
use serde_json::json;
use turnstone_engine::protocol::*;
use turnstone_engine::session::*;

fn submit(input: ClientInput, queue: bool) -> Command {
    Command::Submit { input, queue, origin: TurnOrigin::Client }
}

fn msg_with_turn(agent_id: &str, text: &str, turn_id: &str) -> Command {
    turn_message(agent_id, Some(turn_id), text)
}

fn respond(actions: Vec<Action>) -> DecisionResponse {
    DecisionResponse { actions: Some(actions), ..Default::default() }
}

fn tool(name: &str) -> AgentTool {
    AgentTool {
        name: name.into(),
        description: None,
        input: None,
        output: None,
        handler: None,
        approval: None,
        mcp: None,
    }
}

fn with_tools(tools: Vec<AgentTool>) -> AgentConfig {
    let mut a = agent("m");
    a.tools = Some(tools);
    a
}

/// A worker session with a turn running whose live decision is an llm.finished with `calls`.
fn worker_at_tool_calls(config: AgentConfig, calls: &[(&str, &str, &str)]) -> Harness {
    let mut h = harness("s", init("w", Some(config), true));
    h.accept();
    h.exec(message("w", "go"));
    h.accept();
    h.run_llm(tool_calls(calls));
    h
}

// ----- turns -----------------------------------------------------------------------------

#[test]
fn a_submit_during_a_turn_is_refused_naming_the_turn_unless_it_queues() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(msg_with_turn("demo", "one", "t1"));
    let err = h.try_exec(msg_with_turn("demo", "two", "t2")).unwrap_err();
    assert_eq!(err, Rejection::TurnAlreadyActive { turn_id: "t1".into() });
    assert!(err.to_string().contains("t1"));
    let mut queued = msg_with_turn("demo", "two", "t2");
    if let Command::Submit { queue, .. } = &mut queued {
        *queue = true;
    }
    assert_eq!(names(&h.exec(queued)), ["turn.queued"]);
}

#[test]
fn queued_inputs_start_in_arrival_order() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(msg_with_turn("demo", "one", "t1"));
    for (text, id) in [("two", "t2"), ("three", "t3")] {
        let mut c = msg_with_turn("demo", text, id);
        if let Command::Submit { queue, .. } = &mut c {
            *queue = true;
        }
        h.exec(c);
    }
    assert_eq!(h.session.queued_turn_ids(), ["t2", "t3"]);
    h.run_llm(reply("r1"));
    assert_eq!(h.session.active_turn_id().as_ref().map(|t| t.as_str()), Some("t2"));
    h.run_llm(reply("r2"));
    assert_eq!(h.session.active_turn_id().as_ref().map(|t| t.as_str()), Some("t3"));
    h.run_llm(reply("r3"));
    assert_eq!(
        h.path_texts(),
        ["User:one", "Assistant:r1", "User:two", "Assistant:r2", "User:three", "Assistant:r3"]
    );
}

#[test]
fn a_known_turn_id_returns_that_turn_and_writes_nothing() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(msg_with_turn("demo", "one", "t1"));
    h.run_llm(reply("r1"));
    assert!(h.exec(msg_with_turn("demo", "one again", "t1")).is_empty());
    assert_eq!(h.session.turn(&"t1".into()).map(|t| t.status), Some(TurnStatus::Completed));
}

#[test]
fn an_input_for_another_agent_is_refused() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    assert_eq!(h.try_exec(message("other", "hi")).unwrap_err().code(), "agent_mismatch");
}

#[test]
fn a_truncated_model_call_ends_the_turn_with_the_error() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(message("demo", "hi"));
    let mut r = reply("cut");
    r.finish_reason = Some("length".into());
    h.run_llm(r);
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Failed);
    assert!(turn.error.as_deref().unwrap().contains("truncated"));
    assert_eq!(h.path_texts(), ["User:hi"]);
}

#[test]
fn a_terminal_model_error_ends_the_turn_without_retry() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(message("demo", "hi"));
    h.fail_llm(CallError {
        error: "bad request".into(),
        code: Some(ErrorCode::ProviderError),
        detail: None,
        retryable: false,
    });
    assert_eq!(h.last_turn().status, TurnStatus::Failed);
    assert!(h.due_llm().is_none());
}

// ----- decisions -------------------------------------------------------------------------

#[test]
fn a_decision_has_an_id_attempts_and_a_deadline() {
    let mut h = harness("s", init("w", Some(agent("m")), true));
    let req = h.deliver();
    assert!(req.decision_id.as_str().starts_with("dec_"));
    assert_eq!(req.attempts, 1);
    let deadline =
        turnstone_engine::time::Timestamp::parse_rfc3339(req.deadline.as_deref().unwrap()).unwrap();
    assert_eq!(deadline.0 - h.now.0, 30_000);
    assert_eq!(req.identity.id.as_deref(), Some("owner-1"));
}

#[test]
fn triggers_wait_behind_the_live_decision() {
    let mut h =
        worker_at_tool_calls(with_tools(vec![tool("a"), tool("b")]), &[("c1", "a", "{}"), ("c2", "b", "{}")]);
    h.accept();
    // Two tool.execute triggers; only one decision is live.
    assert!(
        matches!(h.session.decision().as_ref().unwrap().trigger, Trigger::ToolExecute(ref t) if t.id == "c1")
    );
    assert_eq!(h.session.triggers().len(), 1);
}

#[test]
fn a_response_to_a_decision_that_is_not_live_is_a_no_op() {
    let mut h = harness("s", init("w", Some(agent("m")), true));
    let events = h.exec(Command::Answer {
        decision_id: "dec_unknown".into(),
        attempt: 1,
        response: Box::default(),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    assert!(events.is_empty());
}

#[test]
fn an_invalid_response_fails_the_decision_naming_the_field_and_writes_nothing() {
    let mut h = harness("s", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "hi"));
    let bad = Action::MessageSend(MessageSendAction {
        session_id: "stranger".into(),
        message: DraftMessage::user("x"),
    });
    let mut response = respond(vec![Action::LlmCall(LlmCallAction::default()), bad]);
    response.messages = Some(vec![DraftMessage::user("should not be written")]);
    let (_, events) = h.answer(response);
    assert_eq!(names(&events), ["decision.failed", "turn.ended"]);
    let error = h.last_turn().error.clone().unwrap();
    assert!(error.contains("invalid_response: actions[1].session_id"), "{error}");
    assert!(h.session.tree().is_empty());
}

#[test]
fn an_engine_hosted_agent_fails_a_trigger_only_a_worker_can_answer() {
    let mut h = harness("s", init("demo", Some(with_tools(vec![tool("a")])), false));
    h.exec(message("demo", "hi"));
    h.run_llm(tool_calls(&[("c1", "a", "{}")]));
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Failed);
    assert!(turn.error.as_deref().unwrap().contains("has no worker"), "{:?}", turn.error);
    assert!(h.session.tree().unanswered_tool_calls().is_empty());
}

// ----- proposals -------------------------------------------------------------------------

#[test]
fn tool_execute_with_invalid_input_or_an_unknown_tool_proposes_a_terminal_tool_error() {
    let schema = json!({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]});
    let typed = AgentTool { input: Some(schema), ..tool("count") };
    let mut h = worker_at_tool_calls(
        with_tools(vec![typed]),
        &[("c1", "count", r#"{"n":"x"}"#), ("c2", "ghost", "{}"), ("c3", "count", "oops")],
    );
    h.accept();
    let mut errors = Vec::new();
    for _ in 0..3 {
        let (req, _) = h.accept();
        let Trigger::ToolExecute(t) = &req.trigger else { panic!("{:?}", req.trigger) };
        let [Action::ToolError(e)] = req.proposed.actions() else { panic!("{:?}", req.proposed) };
        assert_eq!(e.retryable, Some(false));
        errors.push((t.id.clone(), e.error.clone(), t.input.clone()));
    }
    assert!(
        matches!(errors[0].2, ToolInput::Invalid { .. })
            && errors[0].1.contains("invalid arguments for tool count")
    );
    assert_eq!(errors[1].1, "unknown tool: ghost");
    assert!(
        matches!(errors[2].2, ToolInput::Malformed { .. }) && errors[2].1.contains("malformed arguments")
    );
}

#[test]
fn session_start_proposes_the_declared_config() {
    let mut h = harness("s", init("w", Some(agent("declared-model")), true));
    let req = h.deliver();
    assert_eq!(req.proposed.agent.as_ref().map(|a| a.model.as_str()), Some("declared-model"));
    assert_eq!(req.agent, None);
}

#[test]
fn the_system_prompt_is_prepended_at_call_time_and_never_stored() {
    let mut a = agent("m");
    a.system = Some("be brief".into());
    let mut h = harness("s", init("demo", Some(a), false));
    h.exec(message("demo", "hi"));
    let call = h.session.calls()[0].clone();
    let request = h.session.llm_request(&call).unwrap();
    assert_eq!(request.messages[0].role, Role::System);
    assert_eq!(request.messages[0].content_text(), "be brief");
    assert!(h.session.tree().nodes().all(|n| n.message.role != Role::System));
}

#[test]
fn explicit_messages_on_llm_call_suppress_the_system_prompt() {
    let mut a = agent("m");
    a.system = Some("be brief".into());
    let mut h = harness("s", init("w", Some(a), true));
    h.accept();
    h.exec(message("w", "hi"));
    let call = Action::LlmCall(LlmCallAction {
        messages: Some(vec![DraftMessage::user("only this")]),
        ..Default::default()
    });
    h.answer(respond(vec![call]));
    let request = h.session.llm_request(&h.session.calls()[0]).unwrap();
    assert_eq!(request.messages, vec![Arc::new(DraftMessage::user("only this"))]);
}

/// The times of a call's and a decision's steps, which the console's turn timeline draws.
#[test]
fn calls_and_decisions_record_when_each_step_happened() {
    fn timed(log: &[Event]) -> Vec<(&'static str, turnstone_engine::time::Timestamp)> {
        let at = |event: &Event| match event {
            Event::CallDispatched { at, .. }
            | Event::CallSettled { at, .. }
            | Event::CallRetryScheduled { at, .. }
            | Event::DecisionDispatched { at, .. }
            | Event::DecisionRetryScheduled { at, .. }
            | Event::DecisionResolved { at, .. }
            | Event::DecisionFailed { at, .. } => *at,
            _ => None,
        };
        log.iter().filter_map(|e| Some((e.name(), at(e)?))).collect()
    }

    // A worker's decision: delivered, failed, delivered again, answered.
    let mut h = harness("s", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "hi"));
    let start = h.log.len();
    h.advance(1_000);
    let delivered = h.now;
    let request = h.deliver();
    h.advance(500);
    let failed = h.now;
    let decision_id = request.decision_id.clone();
    h.exec(Command::DeliveryFailed {
        decision_id: decision_id.clone(),
        attempt: 1,
        error: "503".into(),
        retryable: true,
    });
    h.advance(10_000);
    let redelivered = h.now;
    h.claim_decision();
    h.advance(700);
    let answered = h.now;
    h.exec(Command::Answer {
        decision_id,
        attempt: 2,
        response: Box::new(request.proposed),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    assert_eq!(
        timed(&h.log[start..]),
        [
            ("decision.dispatched", delivered),
            ("decision.retry_scheduled", failed),
            ("decision.dispatched", redelivered),
            ("decision.resolved", answered)
        ]
    );

    // A model call: dispatched when claimed, settled when its answer came.
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(message("demo", "hi"));
    let start = h.log.len();
    let dispatched = h.now;
    let claim = h.claim_llm();
    h.advance(2_500);
    h.finish_llm(claim, "hello");
    assert_eq!(
        timed(&h.log[start..]),
        [("call.dispatched", dispatched), ("call.settled", dispatched.plus_ms(2_500))]
    );
}

// ----- message tree ----------------------------------------------------------------------

#[test]
fn new_from_is_computed_at_delivery_and_redeliveries_see_the_same() {
    let mut h = harness("s", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "hi"));
    let first = h.deliver();
    h.exec(Command::DeliveryFailed {
        decision_id: first.decision_id.clone(),
        attempt: 1,
        error: "503".into(),
        retryable: true,
    });
    h.advance(10_000);
    let second = h.deliver();
    let (Trigger::ClientMessages(a), Trigger::ClientMessages(b)) = (&first.trigger, &second.trigger) else {
        panic!()
    };
    assert_eq!((a.new_from, b.new_from), (0, 0));
    assert_eq!(first.trigger, second.trigger);
}

#[test]
fn an_echo_of_known_ids_writes_nothing_and_the_request_carries_path_and_tree() {
    let mut h = harness("s", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "hi"));
    h.accept();
    h.run_llm(reply("hello"));
    let req = h.deliver();
    assert_eq!(req.messages.len(), 1);
    assert_eq!(req.message_tree.nodes.len(), 1);
    let echo = DecisionResponse {
        messages: Some(req.messages.iter().map(Message::to_draft).collect()),
        ..Default::default()
    };
    let events = h.exec(Command::Answer {
        decision_id: req.decision_id,
        attempt: 1,
        response: Box::new(echo),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    assert_eq!(names(&events), ["decision.resolved"], "the worker vetoed the reply by not echoing it");
}

/// Answers the live decision with `messages` and `done`, as a worker sent `transcript`.
fn answer_done(h: &mut Harness, messages: Vec<DraftMessage>, transcript: Transcript) {
    let decision_id = h.session.decision().unwrap().id.clone();
    h.exec(Command::Answer {
        decision_id,
        attempt: 1,
        response: Box::new(DecisionResponse {
            messages: Some(messages),
            actions: Some(vec![Action::Done(DoneAction::default())]),
            ..Default::default()
        }),
        ignored_fields: Vec::new(),
        transcript,
    });
}

#[test]
fn a_windowed_request_cuts_the_recorded_part_of_a_view_and_an_echo_of_it_continues_at_the_head() {
    let last = |n: usize| Transcript::Last(n.try_into().unwrap());
    let ids_of = |messages: &[DraftMessage]| -> Vec<String> {
        messages.iter().map(|m| m.id.as_ref().map_or_else(|| m.content_text(), |id| id.to_string())).collect()
    };
    let mut h = harness("s", init("w", Some(agent("m")), true));
    h.accept();
    let recorded: Vec<DraftMessage> =
        ["a", "b", "c", "d"].iter().map(|id| DraftMessage::user(*id).with_id(*id)).collect();
    h.exec(client_messages("w", recorded.clone()));
    h.answer(DecisionResponse {
        messages: Some(recorded.clone()),
        actions: Some(vec![Action::Done(DoneAction::default())]),
        ..Default::default()
    });
    // The client's whole view, with one new message: the window keeps the last two recorded.
    let mut view = recorded.clone();
    view.push(DraftMessage::user("e"));
    h.exec(client_messages("w", view));
    let whole = h.session.decision_request().unwrap();
    let Trigger::ClientMessages(t) = &whole.trigger else { panic!() };
    assert_eq!(
        (ids_of(&t.messages), t.new_from),
        (vec!["a".into(), "b".into(), "c".into(), "d".into(), "e".into()], 4)
    );
    let windowed = h.session.decision_request_with(last(2)).unwrap();
    let Trigger::ClientMessages(t) = &windowed.trigger else { panic!() };
    assert_eq!((ids_of(&t.messages), t.new_from), (vec!["c".into(), "d".into(), "e".into()], 2));
    assert_eq!(windowed.messages.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["c", "d"]);
    assert_eq!(windowed.message_tree.nodes[0].parent_id.as_ref().map(|p| p.as_str()), Some("b"));
    // A window wider than the conversation is the whole request.
    assert_eq!(h.session.decision_request_with(last(50)).unwrap(), whole);
    // The worker echoes its window's view: "e" continues at the head, as with the whole view
    // (read from the root, the same answer would record c, d, e afresh as a new conversation).
    answer_done(&mut h, t.messages.clone(), last(2));
    let path: Vec<String> = h.session.tree().active_path().iter().map(|m| m.content_text()).collect();
    assert_eq!(path, ["a", "b", "c", "d", "e"]);
    // A fork after "b": the window counts back from the fork point, not from the head.
    h.exec(client_messages("w", vec![recorded[0].clone(), recorded[1].clone(), DraftMessage::user("x")]));
    let Trigger::ClientMessages(t) = h.session.decision_request_with(last(1)).unwrap().trigger else {
        panic!()
    };
    assert_eq!((ids_of(&t.messages), t.new_from), (vec!["b".into(), "x".into()], 1));
    // An answer whose first message is not a recorded one reads from the window's start (as a
    // whole-conversation answer reads from the root): the window [e] now reads [y].
    answer_done(&mut h, vec![DraftMessage::user("y")], last(1));
    let path: Vec<String> = h.session.tree().active_path().iter().map(|m| m.content_text()).collect();
    assert_eq!(path, ["a", "b", "c", "d", "y"]);
}

// ----- calls -----------------------------------------------------------------------------

#[test]
fn retry_policy_layers_action_over_agent_over_engine_default() {
    let agent_policy = RetryPolicy {
        timeout_secs: Some(7.0),
        max_retries: 1,
        backoff_base_secs: 1.0,
        backoff_max_secs: 2.0,
    };
    let action_policy = RetryPolicy {
        timeout_secs: Some(3.0),
        max_retries: 4,
        backoff_base_secs: 1.0,
        backoff_max_secs: 2.0,
    };
    let mut a = with_tools(vec![tool("a")]);
    a.retry = Some(agent_policy);
    let mut h = harness("s", init("w", Some(a), true));
    h.accept();
    h.exec(message("w", "go"));
    let call = |id: &str, retry| {
        Action::ToolCall(ToolCallAction {
            id: Some(id.into()),
            name: "a".into(),
            arguments: json!({}),
            handler: None,
            retry,
        })
    };
    let llm = Action::LlmCall(LlmCallAction { id: Some("l1".into()), ..Default::default() });
    h.answer(respond(vec![call("c1", None), call("c2", Some(action_policy)), llm]));
    assert_eq!(h.session.call(&"c1".into()).unwrap().policy, agent_policy);
    assert_eq!(h.session.call(&"c2".into()).unwrap().policy, action_policy);
    assert_eq!(h.session.call(&"l1".into()).unwrap().policy, agent_policy);
    // Without an agent policy, the engine default for the kind applies.
    let mut h = harness("s", init("w", Some(with_tools(vec![tool("a")])), true));
    h.accept();
    h.exec(message("w", "go"));
    h.answer(respond(vec![call("c1", None)]));
    assert_eq!(h.session.call(&"c1".into()).unwrap().policy, Defaults::default().tool);
}

#[test]
fn backoff_doubles_between_base_and_max() {
    let p = RetryPolicy { timeout_secs: None, max_retries: 9, backoff_base_secs: 1.0, backoff_max_secs: 5.0 };
    assert_eq!([1, 2, 3, 4, 5].map(|n| p.backoff_ms(n)), [1000, 2000, 4000, 5000, 5000]);
}

#[test]
fn a_timeout_is_a_retryable_deadline_exceeded_until_retries_run_out() {
    let policy = RetryPolicy {
        timeout_secs: Some(10.0),
        max_retries: 1,
        backoff_base_secs: 1.0,
        backoff_max_secs: 1.0,
    };
    let mut h = harness("s", init("w", Some(with_tools(vec![tool("slow")])), true));
    h.accept();
    h.exec(message("w", "go"));
    let c = Action::ToolCall(ToolCallAction {
        id: Some("c1".into()),
        name: "slow".into(),
        arguments: json!({}),
        handler: None,
        retry: Some(policy),
    });
    h.answer(respond(vec![c]));
    h.answer(DecisionResponse::default()); // tool.execute attempt 1: deferred
    h.advance(10_001);
    let events = h.exec(Command::Tick);
    assert_eq!(names(&events), ["call.retry_scheduled"]);
    let Event::CallRetryScheduled { error, .. } = &events[0] else { panic!() };
    assert_eq!(error.code, Some(ErrorCode::DeadlineExceeded));
    h.advance(1_100);
    h.exec(Command::Tick);
    let req = h.deliver();
    assert!(matches!(req.trigger, Trigger::ToolExecute(ref t) if t.attempt == 2));
    h.exec(Command::Answer {
        decision_id: req.decision_id,
        attempt: 1,
        response: Box::default(),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    // A late result for attempt 1 is refused by the fence.
    let late = Action::ToolResult(ToolResultAction {
        id: Some("c1".into()),
        attempt: Some(1),
        result: json!("late"),
    });
    let err = h.try_exec(Command::Settle { action: late }).unwrap_err();
    assert_eq!(err, Rejection::StaleAttempt { id: "c1".into(), attempt: 1, current: 2 });
    h.advance(10_001);
    h.exec(Command::Tick);
    let (req, _) = h.accept();
    let Trigger::ToolFinished(f) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert!(!f.ok && f.error.as_deref().unwrap().contains("deadline"));
}

#[test]
fn reusing_a_call_id_is_a_no_op() {
    let mut h = harness("s", init("w", Some(with_tools(vec![tool("a")])), true));
    h.accept();
    h.exec(message("w", "go"));
    let c = || {
        Action::ToolCall(ToolCallAction {
            id: Some("c1".into()),
            name: "a".into(),
            arguments: json!({"x": 1}),
            handler: None,
            retry: None,
        })
    };
    let (_, events) = h.answer(respond(vec![c(), c()]));
    assert_eq!(
        names(&events),
        [
            "decision.resolved",
            "call.created",
            "trigger.queued",
            "action.ignored",
            "decision.opened",
            "call.dispatched"
        ]
    );
}

#[test]
fn pending_calls_counts_tool_and_sub_agent_calls_only() {
    let mut h = harness("s", init("w", Some(with_tools(vec![tool("a")])), true));
    h.accept();
    h.exec(message("w", "go"));
    let c = Action::ToolCall(ToolCallAction {
        id: Some("c1".into()),
        name: "a".into(),
        arguments: json!({}),
        handler: None,
        retry: None,
    });
    h.answer(respond(vec![c, Action::LlmCall(LlmCallAction::default())]));
    assert_eq!(h.session.calls().len(), 2);
    assert_eq!(h.session.pending_calls(), 1);
}

#[test]
fn a_result_violating_the_output_schema_settles_as_a_terminal_error() {
    let typed = AgentTool { output: Some(json!({"type": "number"})), ..tool("count") };
    let mut h = worker_at_tool_calls(with_tools(vec![typed]), &[("c1", "count", "{}")]);
    h.accept();
    let req = h.deliver();
    let result =
        Action::ToolResult(ToolResultAction { id: None, attempt: None, result: json!("not a number") });
    h.exec(Command::Answer {
        decision_id: req.decision_id,
        attempt: 1,
        response: Box::new(respond(vec![result])),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    let (req, _) = h.accept();
    let Trigger::ToolFinished(f) = &req.trigger else { panic!() };
    assert!(!f.ok && f.error.as_deref().unwrap().contains("violates its output schema"), "{f:?}");
}

#[test]
fn a_worker_llm_call_in_openai_format_goes_out_and_comes_back_native() {
    let mut a = agent("gpt");
    a.handler = Some(LlmHandler::Worker);
    a.format = Some(LlmFormat::Openai);
    let mut h = harness("s", init("w", Some(a), true));
    h.accept();
    h.exec(message("w", "hi"));
    h.accept();
    let req = h.deliver();
    let Trigger::LlmExecute(t) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert_eq!(t.format, Some(LlmFormat::Openai));
    assert_eq!(t.request["messages"][0]["content"], json!("hi"));
    let native = json!({"id": "x", "object": "chat.completion", "model": "gpt", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hey"}, "finish_reason": "stop"}]});
    let result = Action::LlmResult(LlmResultAction { id: None, attempt: None, response: native });
    h.exec(Command::Answer {
        decision_id: req.decision_id,
        attempt: 1,
        response: Box::new(respond(vec![result])),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    h.accept();
    assert_eq!(h.path_texts(), ["User:hi", "Assistant:hey"]);
}

// ----- interrupts ------------------------------------------------------------------------

#[test]
fn a_paused_branch_accepts_settles_but_refuses_new_user_messages() {
    let mut h = harness(
        "s",
        init(
            "w",
            Some(with_tools(vec![AgentTool { handler: Some(ToolHandler::Client), ..tool("pick") }])),
            true,
        ),
    );
    // Raised outside any turn (at session.start), the interrupt pauses the branch with no
    // turn running. (Raised in a turn, it keeps the turn open: see
    // `done_with_an_open_interrupt_ends_the_turn_when_the_interrupt_is_resumed`.)
    let c = Action::ToolCall(ToolCallAction {
        id: Some("c1".into()),
        name: "pick".into(),
        arguments: json!({}),
        handler: None,
        retry: None,
    });
    let i = Action::Interrupt(InterruptAction {
        interrupt_id: Some("i1".into()),
        reason: "wait".into(),
        payload: None,
    });
    let req = h.deliver();
    let mut response = req.proposed.clone();
    response.actions = Some(vec![c, i]);
    h.exec(Command::Answer {
        decision_id: req.decision_id,
        attempt: req.attempts,
        response: Box::new(response),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    assert!(h.session.active_turn_id().is_none() && h.session.is_paused());
    let err = h.try_exec(message("w", "next")).unwrap_err();
    assert_eq!(err, Rejection::BranchPaused { interrupt_ids: vec!["i1".into()] });
    let settle = submit(
        ClientInput::ToolResult(ToolResultInput {
            id: "c1".into(),
            attempt: Some(1),
            result: Some(json!("x")),
        }),
        false,
    );
    assert_eq!(names(&h.exec(settle)), ["call.settled", "trigger.queued"]);
}

// ----- sub-agents ------------------------------------------------------------------------

#[test]
fn a_voided_delegation_cancels_the_child_and_its_children() {
    let mut boss = agent("m");
    boss.sub_agents = Some(vec![SubAgent { id: "mid".into(), description: None }]);
    let mut mid = agent("m");
    mid.sub_agents = Some(vec![SubAgent { id: "leaf".into(), description: None }]);
    let mut world = World::default();
    world.configs.insert("mid".into(), mid);
    world.sessions.insert("p".into(), harness("p", init("boss", Some(boss), false)));
    world.sessions.get_mut("p").unwrap().exec(message("boss", "go"));
    world.sessions.get_mut("p").unwrap().run_llm(tool_calls(&[("t1", "mid", r#"{"message":"m"}"#)]));
    world.route();
    let mid_id = world.sessions.keys().find(|k| k.as_str() != "p").cloned().unwrap();
    // The child delegates in turn: a grandchild.
    world.sessions.get_mut(&mid_id).unwrap().run_llm(tool_calls(&[("t2", "leaf", r#"{"message":"l"}"#)]));
    world.route();
    let leaf_id = world.sessions.keys().find(|k| k.as_str() != "p" && **k != mid_id).cloned().unwrap();
    assert_eq!(world.sessions[&leaf_id].session.ancestry(), ["p".into(), mid_id.clone()]);
    assert!(world.sessions[&leaf_id].session.active_turn().is_some());
    // Cancelling the parent cancels the child, whose cancel cancels the grandchild.
    world.sessions.get_mut("p").unwrap().exec(Command::Cancel { reason: "stop".into() });
    let routed = world.route();
    assert!(routed.contains(&"p:cancel_child".to_owned()), "{routed:?}");
    assert!(routed.contains(&format!("{mid_id}:cancel_child")), "{routed:?}");
    assert_eq!(world.sessions[&mid_id].last_turn().status, TurnStatus::Cancelled);
    assert_eq!(world.sessions[&leaf_id].last_turn().status, TurnStatus::Cancelled);
    // The cancelled child reports to its parent, whose delegation is already voided: a no-op.
    assert!(routed.contains(&format!("{mid_id}:notify_parent")));
}

// ----- state and config ------------------------------------------------------------------

#[test]
fn state_null_keeps_empty_object_clears_equal_writes_nothing() {
    let mut h = harness("s", init("w", Some(agent("m")), true));
    let with_state = |state: Option<serde_json::Value>| DecisionResponse { state, ..Default::default() };
    h.answer(with_state(Some(json!({"a": 1, "b": [1, 2]}))));
    assert_eq!(h.session.current_state(), json!({"a": 1, "b": [1, 2]}));
    h.exec(message("w", "x"));
    let (_, e) = h.answer(with_state(None));
    assert!(!names(&e).contains(&"state.written"));
    h.exec(Command::Cancel { reason: "r".into() });
    h.exec(message("w", "y"));
    let (_, e) = h.answer(with_state(Some(json!({"b": [1, 2], "a": 1}))));
    assert!(!names(&e).contains(&"state.written"), "key order does not matter");
    h.exec(Command::Cancel { reason: "r".into() });
    h.exec(message("w", "z"));
    let (_, e) = h.answer(with_state(Some(json!({"a": 1.0, "b": [1, 2]}))));
    assert!(names(&e).contains(&"state.written"), "1 differs from 1.0");
    h.exec(Command::Cancel { reason: "r".into() });
    h.exec(message("w", "w"));
    h.answer(with_state(Some(json!({}))));
    assert_eq!(h.session.current_state(), json!({}));
    // null in JSON parses to "keep".
    let parsed: DecisionResponse = parse_str(r#"{"state": null}"#).unwrap();
    assert_eq!(parsed.state, None);
}

#[test]
fn state_is_branch_scoped_and_a_fork_sees_the_state_of_its_point() {
    let mut h = harness("s", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(client_messages("w", vec![DraftMessage::user("a").with_id("a")]));
    let v1 = DecisionResponse {
        messages: Some(vec![DraftMessage::user("a").with_id("a")]),
        state: Some(json!(1)),
        actions: Some(vec![Action::Done(DoneAction::default())]),
        agent: None,
    };
    h.answer(v1);
    h.exec(client_messages(
        "w",
        vec![DraftMessage::user("a").with_id("a"), DraftMessage::user("b").with_id("b")],
    ));
    let v2 = DecisionResponse {
        messages: Some(vec![DraftMessage::user("a").with_id("a"), DraftMessage::user("b").with_id("b")]),
        state: Some(json!(2)),
        actions: Some(vec![Action::Done(DoneAction::default())]),
        agent: None,
    };
    h.answer(v2);
    assert_eq!(h.session.current_state(), json!(2));
    // Fork at "a": once recorded, the new branch sees the state written at "a". (The
    // client.messages decision itself still sees the recorded conversation, head at "b".)
    h.exec(client_messages("w", vec![DraftMessage::user("a").with_id("a"), DraftMessage::user("b2")]));
    let (req, _) = h.accept();
    assert_eq!(req.state, json!(2));
    assert_eq!(h.session.current_state(), json!(1));
    // The head had let version 0 go (it holds the current version only): the fork read it
    // back from the log and wrote it down again, so a replay holds it too.
    let restored: Vec<&Event> = h.log.iter().filter(|e| matches!(e, Event::StateRestored { .. })).collect();
    assert_eq!(restored, [&Event::StateRestored { index: 0, value: json!(1) }]);
    let snapshot = serde_json::to_value(&h.session).unwrap();
    assert_eq!(snapshot["states"]["held"].as_array().map(Vec::len), Some(1), "{}", snapshot["states"]);
    h.run_llm(reply("ok"));
    let req = h.deliver();
    assert_eq!(req.state, json!(1));
}

/// What a store keeps of each version comes in log order, states and agent configs
/// interleaved; the newest `k` (what a commit has not stored yet) are the tail of all of them.
#[test]
fn the_newest_version_entries_are_the_tail_of_all_of_them_in_log_order() {
    let mut h = harness("s", init("w", Some(agent("m")), true));
    h.accept();
    for turn in 0..6 {
        h.exec(message("w", &format!("turn {turn}")));
        let response = DecisionResponse {
            state: Some(json!(turn)),
            agent: (turn % 2 == 0).then(|| agent(&format!("m{turn}"))),
            actions: Some(vec![Action::Done(DoneAction::default())]),
            ..Default::default()
        };
        h.answer(response);
        let all = h.session.version_entries();
        assert_eq!(h.session.version_entry_count(), all.len());
        for k in 0..=all.len() + 1 {
            let tail = &all[all.len().saturating_sub(k)..];
            assert_eq!(h.session.newest_version_entries(k), tail, "k = {k}");
        }
    }
    assert!(h.session.version_entry_count() >= 9, "both kinds written");
}

#[test]
fn an_agent_in_a_response_supplies_the_defaults_of_its_own_actions() {
    let mut h = harness("s", init("w", Some(agent("old")), true));
    h.accept();
    h.exec(message("w", "hi"));
    let response = DecisionResponse {
        agent: Some(agent("new")),
        actions: Some(vec![Action::LlmCall(LlmCallAction::default())]),
        ..Default::default()
    };
    h.answer(response);
    let request = h.session.llm_request(&h.session.calls()[0]).unwrap();
    assert_eq!(request.model, "new");
    assert_eq!(h.session.current_agent().map(|a| a.model.as_str()), Some("new"));
}

fn client_messages(agent_id: &str, messages: Vec<DraftMessage>) -> Command {
    submit(
        ClientInput::Messages(ClientMessagesInput {
            agent_id: agent_id.into(),
            turn_id: None,
            messages,
            stream: None,
            client: None,
        }),
        false,
    )
}

// ----- usage -----------------------------------------------------------------------------

#[test]
fn usage_and_cost_accumulate_per_turn_and_per_session() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(message("demo", "one"));
    h.run_llm(reply("r1"));
    h.exec(message("demo", "two"));
    h.run_llm(reply("r2"));
    assert_eq!(h.session.usage().llm_calls, 2);
    assert_eq!(h.session.usage().tokens.get("prompt_tokens"), Some(&20));
    assert_eq!(h.session.usage().cost(), "0.002");
    assert!(h.session.turns().all(|t| t.usage.llm_calls == 1 && t.usage.cost() == "0.001"));
}

#[test]
fn events_survive_a_round_trip_through_json_values() {
    // Stores read events back through serde's buffered (tagged) path: every field must fit.
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(message("demo", "one"));
    h.run_llm(reply("r1"));
    for event in &h.log {
        let value = serde_json::to_value(event).unwrap();
        let back: Event = serde_json::from_value(value).unwrap();
        assert_eq!(&back, event);
    }
}

#[test]
fn what_a_step_writes_does_not_grow_with_the_transcript() {
    // Engine-hosted and worker-answered: the decision events keep the conversation by
    // reference (and trim echoed messages), so a step writes the same at turn 40 as at turn 2.
    for has_worker in [false, true] {
        let mut h = harness("s", init("a", Some(agent("m")), has_worker));
        if has_worker {
            h.accept();
        }
        let mut sizes = Vec::new();
        for i in 0..40 {
            let before = h.log.len();
            h.exec(message("a", &format!("message number {i} with some words in it")));
            if has_worker {
                h.accept();
            }
            h.run_llm(reply(&format!("reply number {i} with some words in it too")));
            if has_worker {
                h.accept();
            }
            let bytes: usize = h.log[before..].iter().map(|e| serde_json::to_string(e).unwrap().len()).sum();
            sizes.push(bytes);
        }
        let (early, late) = (sizes[1], sizes[39]);
        assert!(
            late < early + early / 10,
            "worker={has_worker}: turn 2 wrote {early} bytes, turn 40 wrote {late}"
        );
        // The worker still sees the whole conversation.
        if has_worker {
            h.exec(message("a", "last"));
            let req = h.deliver();
            let Trigger::ClientMessages(t) = &req.trigger else { panic!() };
            assert_eq!((t.messages.len(), t.new_from), (81, 80));
            assert_eq!(req.proposed.messages.as_ref().map(Vec::len), Some(81));
        }
    }
}

#[test]
fn the_head_keeps_recent_turns_and_the_log_keeps_the_rest() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    let mut first = None;
    for i in 0..(RECENT_TURNS + 8) {
        h.exec(msg_with_turn("demo", &format!("m{i}"), &format!("t{i}")));
        h.run_llm(reply(&format!("r{i}")));
        if i == 0 {
            first = h.session.turn(&"t0".into()).cloned();
        }
    }
    assert_eq!(h.session.turns().len(), RECENT_TURNS);
    assert!(h.session.turn(&"t0".into()).is_none() && h.session.knows_turn(&"t0".into()));
    // Resubmitting an evicted turn is still a no-op...
    assert!(h.exec(msg_with_turn("demo", "again", "t0")).is_empty());
    // ...and its record is rebuilt from the log, exactly.
    assert_eq!(turn_from_log(&"t0".into(), &h.log), first);
    assert_eq!(turn_from_log(&"t0".into(), &h.log).unwrap().data, Some(json!("r0")));
}

#[test]
fn the_head_does_not_grow_with_the_number_of_turns() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    let mut sizes = Vec::new();
    for i in 0..(PAST_TURN_IDS + RECENT_TURNS + 40) {
        h.exec(msg_with_turn("demo", &format!("m{i}"), &format!("turn-{i:04}")));
        h.run_llm(reply(&format!("r{i}")));
        sizes.push(serde_json::to_string(&h.session).unwrap().len());
    }
    let full = sizes[PAST_TURN_IDS + RECENT_TURNS + 5];
    let last = *sizes.last().unwrap();
    assert!(last <= full + full / 20, "the head grew from {full} to {last} bytes");
    assert_eq!(h.session.past_turn_ids().len(), PAST_TURN_IDS);
    assert!(h.session.closed_calls().len() <= RECENT_CLOSED_CALLS);
}

// ----- sub-agents reach only their own children --------------------------------------------

fn sid(id: &str) -> turnstone_engine::ids::SessionId {
    id.into()
}

fn spawn(session_id: &str, tool_call_id: &str, retry: Option<RetryPolicy>) -> Action {
    Action::SubAgentSpawn(SubAgentSpawnAction {
        session_id: session_id.into(),
        agent_id: "helper".into(),
        tool_call_id: tool_call_id.into(),
        retry,
    })
}

fn send(session_id: &str, text: &str) -> Action {
    Action::MessageSend(MessageSendAction {
        session_id: session_id.into(),
        message: DraftMessage::user(text),
    })
}

/// A worker session `p` with a turn running and a live client.messages decision.
/// A worker agent's session `p` in a turn; its agent declares the sub-agent `helper`.
fn worker_in_turn() -> Harness {
    let mut config = agent("m");
    config.sub_agents = Some(vec![SubAgent { id: "helper".into(), description: None }]);
    let mut h = harness("p", init("w", Some(config), true));
    h.accept();
    h.exec(message("w", "go"));
    h
}

#[test]
fn a_spawn_of_an_agent_the_config_does_not_declare_is_an_invalid_response() {
    let mut h = worker_in_turn();
    let mut other = spawn("c", "t1", None);
    if let Action::SubAgentSpawn(a) = &mut other {
        a.agent_id = "billing".into();
    }
    h.answer(respond(vec![spawn("ok", "t0", None), other]));
    assert_invalid_response(&h, "actions[1].agent_id");
    let error = h.last_turn().error.clone().unwrap();
    assert!(error.contains("\"billing\" is not one of this agent's sub_agents (helper)"), "{error}");
    // An agent that declares no sub-agents may spawn none.
    let mut h = harness("p", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "go"));
    h.answer(respond(vec![spawn("c", "t1", None)]));
    assert_invalid_response(&h, "actions[0].agent_id");
    assert!(h.last_turn().error.clone().unwrap().contains("it declares none"));
}

fn assert_invalid_response(h: &Harness, path: &str) {
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Failed, "{turn:?}");
    let error = turn.error.clone().unwrap();
    assert!(error.contains(&format!("invalid_response: {path}")), "{error}");
    assert!(h.session.outbox().is_empty(), "nothing of the response is written: {:?}", h.session.outbox());
}

#[test]
fn a_message_send_reaches_only_a_child_spawned_before_it() {
    // The send comes before its spawn: at that point the session is no child of this one.
    let mut h = worker_in_turn();
    h.answer(respond(vec![send("c", "task"), spawn("c", "t1", None)]));
    assert_invalid_response(&h, "actions[0].session_id");
    // A session this one never spawned.
    let mut h = worker_in_turn();
    h.answer(respond(vec![spawn("c", "t1", None), send("elsewhere", "task")]));
    assert_invalid_response(&h, "actions[1].session_id");
}

#[test]
fn a_spawn_naming_another_delegations_child_or_an_ancestor_is_refused() {
    let mut h = worker_in_turn();
    h.answer(respond(vec![spawn("c", "t1", None), spawn("c", "t2", None)]));
    assert_invalid_response(&h, "actions[1].session_id");
    // A child spawned by an earlier response, for another tool call.
    let mut h = worker_in_turn();
    let action = |name: &str| Command::Submit {
        input: ClientInput::Action(ClientActionInput {
            agent_id: "w".into(),
            turn_id: None,
            name: name.into(),
            args: None,
        }),
        queue: false,
        origin: TurnOrigin::Client,
    };
    h.answer(respond(vec![spawn("c", "t1", None), send("c", "task")]));
    h.exec(action("more"));
    h.answer(respond(vec![spawn("c", "t2", None)]));
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Failed, "{turn:?}");
    assert!(turn.error.as_deref().unwrap().contains("invalid_response: actions[0].session_id"), "{turn:?}");
    // This session itself.
    let mut h = worker_in_turn();
    h.answer(respond(vec![spawn("p", "t1", None)]));
    assert_invalid_response(&h, "actions[0].session_id");
}

#[test]
fn a_spawn_the_runtime_refuses_settles_the_delegation_and_the_turn_goes_on() {
    // The runtime finds the spawn's target exists and is not this session's child: it reports
    // the failure before the spawn is acknowledged. The delegation settles as a terminal error,
    // the message for the foreign session is withdrawn, nothing cancels it, the turn goes on.
    let mut h = worker_in_turn();
    h.answer(respond(vec![spawn("foreign", "t1", None), send("foreign", "task")]));
    let (seq, item) = h.session.outbox().iter().next().map(|(s, i)| (*s, i.clone())).unwrap();
    let Route::Spawn(spawned) = route(h.session.id(), item) else { panic!("a spawn") };
    // The runtime's check: the existing session is someone else's child (or a top-level one).
    let foreign = harness("foreign", init("helper", Some(agent("m")), false));
    let why = spawned.check_existing(&foreign.session).unwrap_err();
    assert!(why.contains("\"foreign\"") && why.contains("not available"), "{why}");
    // Nothing of the other session: not its agent, not that it has no parent.
    assert!(!why.contains("helper") && !why.contains("top-level"), "{why}");
    let mut ours = init("helper", Some(agent("m")), false);
    ours.parent = Some(spawned.parent.clone());
    assert_eq!(spawned.check_existing(&harness("foreign", ours).session), Ok(()), "a redelivered spawn");
    let (target, command) =
        spawned.failed(why.replace("not available", "not available: not this session's child"));
    assert_eq!(target, "p");
    h.exec(command);
    h.exec(Command::OutboxDelivered { seq });
    assert!(h.session.outbox().is_empty(), "{:?}", h.session.outbox());
    assert_eq!(h.session.active_turn().map(|t| t.status), Some(TurnStatus::Active));
    let (req, _) = h.accept();
    let Trigger::SubAgentFinished(f) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert!(!f.ok && f.error.as_deref().unwrap().contains("not this session's child"), "{f:?}");
    assert!(matches!(req.proposed.actions(), [Action::LlmCall(_)]), "{:?}", req.proposed);
    assert_eq!(h.session.calls().len(), 1, "the model is called again");
}

// ----- sub-agent retries -----------------------------------------------------------------

#[test]
fn a_delegation_with_retry_resends_the_task_after_a_timeout_or_a_retryable_failure() {
    let policy = RetryPolicy {
        timeout_secs: Some(10.0),
        max_retries: 2,
        backoff_base_secs: 1.0,
        backoff_max_secs: 1.0,
    };
    let mut world = World::default();
    let mut helper = agent("m");
    helper.retry = Some(RetryPolicy::NONE);
    world.configs.insert("helper".into(), helper);
    let mut parent = worker_in_turn();
    parent.answer(respond(vec![spawn("c", "t1", Some(policy)), send("c", "task")]));
    world.sessions.insert(sid("p"), parent);
    world.route();
    assert!(world.sessions[&sid("c")].session.active_turn().is_some());
    // Attempt 1 times out: the child's turn is cancelled and the task sent again after backoff.
    world.sessions.get_mut(&sid("p")).unwrap().advance(10_001);
    let events = world.sessions.get_mut(&sid("p")).unwrap().exec(Command::Tick);
    assert!(names(&events).contains(&"call.retry_scheduled"), "{:?}", names(&events));
    world.sessions.get_mut(&sid("p")).unwrap().advance(1_100);
    world.sessions.get_mut(&sid("p")).unwrap().exec(Command::Tick);
    let call = world.sessions[&sid("p")].session.call(&"t1".into()).cloned().unwrap();
    assert_eq!((call.attempt, call.status), (2, CallStatus::Pending));
    let routed = world.route();
    assert!(routed.contains(&"p:cancel_child".to_owned()), "{routed:?}");
    // The cancelled first turn reports back; the parent's attempt 2 does not take it for its own.
    assert!(routed.contains(&"c:notify_parent".to_owned()), "{routed:?}");
    let call = world.sessions[&sid("p")].session.call(&"t1".into()).cloned().unwrap();
    assert_eq!((call.attempt, call.status), (2, CallStatus::Pending));
    // Attempt 2: the child's model call fails with a retryable error (its own retries are none).
    let child = world.sessions.get_mut(&sid("c")).unwrap();
    assert_eq!(child.session.active_turn().map(|t| t.origin), Some(TurnOrigin::Parent));
    child.fail_llm(CallError {
        error: "slow down".into(),
        code: Some(ErrorCode::RateLimited),
        detail: None,
        retryable: true,
    });
    world.route();
    let call = world.sessions[&sid("p")].session.call(&"t1".into()).cloned().unwrap();
    assert_eq!(call.status, CallStatus::RetryScheduled, "{call:?}");
    world.sessions.get_mut(&sid("p")).unwrap().advance(1_100);
    world.sessions.get_mut(&sid("p")).unwrap().exec(Command::Tick);
    world.route();
    // Attempt 3 succeeds.
    world.sessions.get_mut(&sid("c")).unwrap().run_llm(reply("found it"));
    world.route();
    let child = &world.sessions[&sid("c")];
    let users = child.path_texts().into_iter().filter(|t| t == "User:task").count();
    assert_eq!(users, 3, "{:?}", child.path_texts());
    let (req, _) = world.sessions.get_mut(&sid("p")).unwrap().accept();
    let Trigger::SubAgentFinished(f) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert!(f.ok && f.result.as_deref() == Some("found it"), "{f:?}");
}

#[test]
fn a_child_failure_that_is_not_retryable_settles_the_delegation_at_once() {
    let policy =
        RetryPolicy { timeout_secs: None, max_retries: 3, backoff_base_secs: 1.0, backoff_max_secs: 1.0 };
    let mut world = World::default();
    let mut parent = worker_in_turn();
    parent.answer(respond(vec![spawn("c", "t1", Some(policy)), send("c", "task")]));
    world.sessions.insert(sid("p"), parent);
    world.route();
    let child = world.sessions.get_mut(&sid("c")).unwrap();
    child.fail_llm(CallError::terminal("bad request"));
    world.route();
    let (req, _) = world.sessions.get_mut(&sid("p")).unwrap().accept();
    let Trigger::SubAgentFinished(f) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert!(!f.ok && f.error.as_deref().unwrap().contains("bad request"), "{f:?}");
}

// ----- done with an open interrupt -------------------------------------------------------

#[test]
fn done_with_an_open_interrupt_ends_the_turn_when_the_interrupt_is_resumed() {
    let mut h = worker_in_turn();
    let i = Action::Interrupt(InterruptAction {
        interrupt_id: Some("i1".into()),
        reason: "approve?".into(),
        payload: None,
    });
    h.answer(respond(vec![i, Action::Done(DoneAction { data: Some(json!("bye")) })]));
    // The turn waits for the interrupt: a new message is told which turn runs, not paused for good.
    let turn_id = h.session.active_turn_id().cloned().expect("the turn stays open");
    let err = h.try_exec(message("w", "next")).unwrap_err();
    assert_eq!(err, Rejection::TurnAlreadyActive { turn_id: turn_id.clone() });
    // The resume ends the turn with done's data; the worker still gets the answer.
    let resume = submit(
        ClientInput::InterruptResume(InterruptResumeInput {
            interrupt_id: "i1".into(),
            payload: Some(json!("yes")),
        }),
        false,
    );
    h.exec(resume);
    let turn = h.session.turn(&turn_id).unwrap();
    assert_eq!((turn.status, turn.data.clone()), (TurnStatus::Completed, Some(json!("bye"))));
    let (req, _) = h.accept();
    assert!(matches!(req.trigger, Trigger::InterruptResumed(ref t) if t.payload == Some(json!("yes"))));
    assert!(req.proposed.actions().is_empty(), "outside its turn: {:?}", req.proposed);
    // And the next message starts a turn.
    h.exec(message("w", "next"));
    assert!(h.session.active_turn_id().is_some_and(|t| *t != turn_id));
}

#[test]
fn done_before_an_interrupt_of_the_same_response_waits_for_it_too() {
    let mut h = worker_in_turn();
    let i = Action::Interrupt(InterruptAction {
        interrupt_id: Some("i1".into()),
        reason: "ok?".into(),
        payload: None,
    });
    h.answer(respond(vec![Action::Done(DoneAction::default()), i]));
    let turn_id = h.session.active_turn_id().cloned().expect("the turn waits for i1");
    let resume = submit(
        ClientInput::InterruptResume(InterruptResumeInput { interrupt_id: "i1".into(), payload: None }),
        false,
    );
    h.exec(resume);
    assert_eq!(h.session.turn(&turn_id).map(|t| t.status), Some(TurnStatus::Completed));
    assert!(!h.session.is_paused());
}

#[test]
fn done_after_an_interrupt_of_an_earlier_response_waits_for_it_too() {
    let mut h = worker_in_turn();
    let interrupt = |id: &str| {
        Action::Interrupt(InterruptAction {
            interrupt_id: Some(id.into()),
            reason: "wait".into(),
            payload: None,
        })
    };
    h.answer(respond(vec![interrupt("i1"), interrupt("i2")]));
    let resume = |id: &str| {
        submit(
            ClientInput::InterruptResume(InterruptResumeInput { interrupt_id: id.into(), payload: None }),
            false,
        )
    };
    h.exec(resume("i1"));
    h.answer(respond(vec![Action::Done(DoneAction::default())]));
    assert!(h.session.active_turn_id().is_some(), "i2 is still open");
    h.exec(resume("i2"));
    assert!(h.session.active_turn_id().is_none());
    assert_eq!(h.last_turn().status, TurnStatus::Completed);
    assert!(!h.session.is_paused());
}

// ----- worker-run calls are bounded by their own timeout ----------------------------------

#[test]
fn a_worker_tool_is_bounded_by_its_own_timeout_not_the_decision_delivery_timeout() {
    let policy = RetryPolicy {
        timeout_secs: Some(60.0),
        max_retries: 0,
        backoff_base_secs: 1.0,
        backoff_max_secs: 1.0,
    };
    let mut h = harness("s", init("w", Some(with_tools(vec![tool("slow")])), true));
    h.accept();
    h.exec(message("w", "go"));
    let c = Action::ToolCall(ToolCallAction {
        id: Some("c1".into()),
        name: "slow".into(),
        arguments: json!({}),
        handler: None,
        retry: Some(policy),
    });
    h.answer(respond(vec![c]));
    let req = h.deliver();
    assert!(matches!(req.trigger, Trigger::ToolExecute(_)));
    assert_eq!(h.session.delivery_timeout_ms(), Some(60_000), "the runtime's HTTP bound");
    let deadline =
        turnstone_engine::time::Timestamp::parse_rfc3339(req.deadline.as_deref().unwrap()).unwrap();
    assert_eq!(deadline.0 - h.now.0, 60_000, "the delivery is bounded by the tool's timeout");
    // At 31 s the tool is still running: nothing happens, nothing is redelivered.
    h.advance(31_000);
    assert!(h.exec(Command::Tick).is_empty());
    assert!(h.due_decision().is_none());
    // At 60 s it times out, once, as the tool call's deadline_exceeded.
    h.advance(29_001);
    let events = h.exec(Command::Tick);
    assert!(names(&events).contains(&"call.settled"), "{:?}", names(&events));
    assert!(!names(&events).contains(&"decision.retry_scheduled"), "{:?}", names(&events));
    let (req, _) = h.accept();
    let Trigger::ToolFinished(f) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert!(!f.ok && f.error.as_deref().unwrap().contains("deadline"), "{f:?}");
    assert_eq!(h.session.active_turn().map(|t| t.status), Some(TurnStatus::Active));
    assert_eq!(h.session.delivery_timeout_ms(), Some(30_000), "other decisions: the decision policy's");
}

#[test]
fn a_message_is_delivered_only_to_a_child_of_its_sender() {
    let mut h = worker_in_turn();
    h.answer(respond(vec![spawn("c", "t1", None), send("c", "task")]));
    let item = h.session.outbox().values().nth(1).cloned().unwrap();
    let Route::Send(sent) = route(h.session.id(), item) else { panic!("a send") };
    let stranger = harness("c", init("helper", Some(agent("m")), false));
    let why = sent.check_target(&stranger.session).unwrap_err();
    assert!(why.contains("is not a child of session \"p\""), "{why}");
    let mut child = init("helper", Some(agent("m")), false);
    child.parent = Some(ParentLink { session_id: "p".into(), tool_call_id: "t1".into() });
    assert_eq!(sent.check_target(&harness("c", child).session), Ok(()));
}

// ----- client tools ----------------------------------------------------------------------

fn client_messages_with_tools(agent_id: &str, text: &str, tools: Vec<AgentTool>) -> Command {
    submit(
        ClientInput::Messages(ClientMessagesInput {
            agent_id: agent_id.into(),
            turn_id: None,
            messages: vec![DraftMessage::user(text)],
            stream: None,
            client: Some(ClientContext { tools: Some(tools), ..Default::default() }),
        }),
        false,
    )
}

#[test]
fn client_tools_are_run_by_the_client_whatever_their_handler_says() {
    // No worker: a client tool that says nothing of its handler (or says worker) is still the
    // client's, so the model's call to it waits for the client instead of failing the turn.
    for handler in [None, Some(ToolHandler::Worker)] {
        let mut h = harness("s", init("demo", Some(agent("m")), false));
        let pick = AgentTool { handler, ..tool("pick") };
        h.exec(client_messages_with_tools("demo", "pick a color", vec![pick]));
        h.run_llm(tool_calls(&[("c1", "pick", "{}")]));
        let turn = h.last_turn();
        assert_eq!(turn.status, TurnStatus::Active, "{:?}", turn.error);
        let call = h.session.call(&"c1".into()).expect("an open call");
        assert!(call.is_client_tool(), "{:?}", call.spec);
        assert_eq!((call.status, call.attempt), (CallStatus::Pending, 1));
    }
}

#[test]
fn a_client_message_may_bring_its_clients_tools_and_name_the_client_that_runs_them() {
    // The extension: `client.message` with a `client`, naming itself. Its tools are the
    // turn's, run by that client; the agent's own client tool stays anyone's.
    let mut h = harness(
        "s",
        init(
            "demo",
            Some(with_tools(vec![AgentTool { handler: Some(ToolHandler::Client), ..tool("ask") }])),
            false,
        ),
    );
    let client = ClientContext {
        tools: Some(vec![tool("readFile")]),
        client_id: Some("w1".into()),
        ..Default::default()
    };
    h.exec(submit(
        ClientInput::Message(ClientMessageInput {
            agent_id: "demo".into(),
            turn_id: Some("t1".into()),
            message: DraftMessage::user("read it"),
            stream: None,
            client: Some(client),
        }),
        false,
    ));
    let turn = Some(turnstone_engine::ids::TurnId::from("t1"));
    let offered: Vec<String> =
        h.session.offered_tools(turn.as_ref()).unwrap_or_default().into_iter().map(|t| t.name).collect();
    assert_eq!(offered, ["ask", "readFile"]);
    assert_eq!(h.session.tool_client("readFile", turn.as_ref()), Some("w1"));
    assert_eq!(h.session.tool_client("ask", turn.as_ref()), None, "the agent's own tool");
    h.run_llm(tool_calls(&[("c1", "readFile", "{}")]));
    assert!(h.session.call(&"c1".into()).expect("an open call").is_client_tool());
}

#[test]
fn a_worker_sees_the_turns_client_tools_in_agent_and_in_the_proposed_agent() {
    let mut h = harness("s", init("w", Some(with_tools(vec![tool("search")])), true));
    h.accept();
    h.exec(client_messages_with_tools("w", "pick a color", vec![tool("pick")]));
    let layered = vec![tool("search"), AgentTool { handler: Some(ToolHandler::Client), ..tool("pick") }];
    let (request, _) = h.accept();
    assert_eq!(request.agent.as_ref().map(|a| a.tools().to_vec()), Some(layered.clone()), "agent");
    assert_eq!(
        request.proposed.agent.as_ref().map(|a| a.tools().to_vec()),
        Some(layered.clone()),
        "proposed agent"
    );
    // Accepting the proposal keeps the client tools a layer of this turn, not the config's.
    assert_eq!(h.session.current_agent().map(|a| a.tools().to_vec()), Some(vec![tool("search")]));
    // Later decisions of the turn show them too; the model's call to one is the client's.
    h.run_llm(tool_calls(&[("c1", "pick", "{}")]));
    let (request, _) = h.accept();
    assert_eq!(request.agent.as_ref().map(|a| a.tools().to_vec()), Some(layered));
    assert!(h.session.call(&"c1".into()).expect("an open call").is_client_tool());
    // Once the turn is over, the layer is gone.
    h.exec(Command::Cancel { reason: "enough".into() });
    h.exec(message("w", "next"));
    let (request, _) = h.accept();
    assert_eq!(request.agent.as_ref().map(|a| a.tools().to_vec()), Some(vec![tool("search")]));
    assert_eq!(request.proposed.agent, None);
}

// ----- images ----------------------------------------------------------------------------

#[test]
fn images_of_a_model_response_reach_the_assistant_message() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(message("demo", "draw a cat"));
    let image = UrlRef { url: "data:image/png;base64,iVBORw0KGgo=".into() };
    let mut response = reply("Here it is");
    response.images = Some(vec![image.clone()]);
    h.run_llm(response);
    let path = h.session.tree().active_path();
    let assistant = path.last().expect("the assistant message");
    assert_eq!(
        assistant.content,
        Some(Content::Parts(vec![
            ContentPart::Text { text: "Here it is".into() },
            ContentPart::ImageUrl { image_url: image.clone() },
        ]))
    );
    // The turn's output is still the text, and the message round-trips.
    assert_eq!(h.last_turn().data, Some(json!("Here it is")));
    let text = serde_json::to_string(*assistant).unwrap();
    assert_eq!(&parse_str::<Message>(&text).unwrap(), *assistant);
    // An image without text: the parts are the images alone.
    h.exec(message("demo", "another, no words"));
    let mut response = reply("");
    response.content = None;
    response.images = Some(vec![image.clone()]);
    h.run_llm(response);
    let path = h.session.tree().active_path();
    assert_eq!(
        path.last().unwrap().content,
        Some(Content::Parts(vec![ContentPart::ImageUrl { image_url: image }]))
    );
}

// ----- worker answers are read leniently ---------------------------------------------------

#[test]
fn a_worker_answer_with_unknown_fields_is_accepted_and_its_resolution_names_them() {
    let mut h = harness("s", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "hi"));
    let request = h.deliver();
    // Many workers echo the request's ids for their own logs, and add their own fields.
    let body = format!(
        r#"{{"session_id": "{}", "decision_id": "{}", "actions": [{{"type": "done", "data": "bye", "trace": "t-1"}}]}}"#,
        request.session_id, request.decision_id
    );
    let (response, ignored) = parse_response(body.as_bytes()).expect("a lenient parse");
    assert_eq!(ignored, ["session_id", "decision_id", "actions[0].trace"]);
    let events = h.exec(Command::Answer {
        decision_id: request.decision_id.clone(),
        attempt: request.attempts,
        response: Box::new(response),
        ignored_fields: ignored,
        transcript: Default::default(),
    });
    let recorded = events.iter().find_map(|e| match e {
        Event::DecisionResolved { ignored_fields, .. } => Some(ignored_fields.clone()),
        _ => None,
    });
    assert_eq!(recorded.unwrap(), ["session_id", "decision_id", "actions[0].trace"]);
    assert_eq!(h.last_turn().status, TurnStatus::Completed);
    assert_eq!(h.last_turn().data, Some(json!("bye")));
    // Old events (without the field) still parse, and an empty list is not written.
    let resolved = h.log.iter().filter(|e| e.name() == "decision.resolved").collect::<Vec<_>>();
    let first = serde_json::to_value(resolved[0]).unwrap();
    assert!(first.get("ignored_fields").is_none(), "{first}");
    assert_eq!(&serde_json::from_value::<Event>(first).unwrap(), resolved[0]);
}

// ----- budgets -----------------------------------------------------------------------------

fn costing(mut response: LlmResponse, cost: &str) -> LlmResponse {
    response.cost = Some(cost.into());
    response
}

#[test]
fn a_turn_whose_cost_passes_max_cost_fails_with_budget_exceeded_and_voids_its_work() {
    let mut init = init("w", Some(with_tools(vec![tool("t")])), true);
    init.budget = Budget { max_cost_picodollars: parse_picodollars("0.0015"), max_llm_calls: None };
    let mut h = harness("s", init);
    h.accept();
    h.exec(message("w", "go"));
    h.accept();
    h.run_llm(costing(tool_calls(&[("c1", "t", "{}")]), "0.001"));
    // The worker runs the tool and calls the model again at once (in parallel).
    let request = h.deliver();
    let mut response = request.proposed.clone();
    response.actions.get_or_insert_with(Vec::new).push(Action::LlmCall(LlmCallAction::default()));
    h.exec(Command::Answer {
        decision_id: request.decision_id,
        attempt: request.attempts,
        response: Box::new(response),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    assert_eq!(h.last_turn().status, TurnStatus::Active, "0.001 is within the budget");
    // The second call takes the turn to 0.002: past 0.0015.
    let events = h.run_llm(costing(reply("more"), "0.001"));
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Failed);
    assert_eq!(turn.code, Some(ErrorCode::BudgetExceeded));
    let error = turn.error.clone().unwrap();
    assert!(error.starts_with("budget_exceeded: "), "{error}");
    assert!(error.contains("0.002") && error.contains("0.0015"), "{error}");
    assert_eq!(turn.usage.cost(), "0.002");
    assert!(names(&events).contains(&"turn.ended"));
    // Its open work is voided as for any failed turn: the tool call gets a synthetic result,
    // and the reply that passed the budget is not recorded.
    assert!(h.session.calls().is_empty() && h.session.decision().is_none());
    let path = h.path_texts();
    assert_eq!(path.len(), 3, "{path:?}");
    assert!(
        path[2].starts_with("Tool:error: the turn failed before this tool call finished: budget_exceeded")
    );
}

#[test]
fn a_turn_may_make_max_llm_calls_and_fails_when_it_asks_for_one_more() {
    // An engine-hosted agent whose model calls a client tool, then wants to answer.
    let run = |max_llm_calls: u64| {
        let mut init = init("demo", Some(agent("m")), false);
        init.budget = Budget { max_cost_picodollars: None, max_llm_calls: Some(max_llm_calls) };
        let mut h = harness("s", init);
        h.exec(client_messages_with_tools("demo", "pick a color", vec![tool("pick")]));
        h.run_llm(tool_calls(&[("c1", "pick", "{}")]));
        let settle = ClientInput::ToolResult(ToolResultInput {
            id: "c1".into(),
            attempt: None,
            result: Some(json!("blue")),
        });
        h.exec(submit(settle, false));
        h
    };
    let mut h = run(2);
    h.run_llm(reply("Blue it is"));
    assert_eq!(h.last_turn().status, TurnStatus::Completed);
    assert_eq!(h.last_turn().usage.llm_calls, 2);
    // With one call allowed, the second is never started.
    let h = run(1);
    assert_eq!(h.due_llm(), None);
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Failed);
    assert_eq!(turn.code, Some(ErrorCode::BudgetExceeded));
    let error = turn.error.clone().unwrap();
    assert!(error.starts_with("budget_exceeded: "), "{error}");
    assert!(error.contains("max_llm_calls 1"), "{error}");
    assert_eq!(h.path_texts(), ["User:pick a color", "Assistant:", "Tool:blue"]);
    assert!(h.session.calls().is_empty());
}

#[test]
fn a_budget_survives_the_log_and_an_unlimited_one_is_not_written() {
    let mut limited = init("demo", Some(agent("m")), false);
    limited.budget = Budget { max_cost_picodollars: Some(1_500_000_000), max_llm_calls: Some(3) };
    let json = serde_json::to_value(&limited).unwrap();
    assert_eq!(json["budget"], json!({ "max_cost_picodollars": "1500000000", "max_llm_calls": 3 }));
    assert_eq!(serde_json::from_value::<SessionInit>(json).unwrap(), limited);
    let event =
        Event::SessionCreated { session_id: "s".into(), init: limited.clone(), at: Default::default() };
    let back: Event = serde_json::from_value(serde_json::to_value(&event).unwrap()).unwrap();
    assert_eq!(back, event);
    let plain = serde_json::to_value(init("demo", None, false)).unwrap();
    assert!(plain.get("budget").is_none(), "{plain}");
}

// ----- idempotency without a horizon ----------------------------------------------------

/// Handles `command` with the store's answer about ids the head forgot.
fn handle_knowing(h: &Driver, command: Command, used: Vec<UsedId>) -> Transition {
    let ctx = Ctx { now: h.now, seed: 99, used: used.into_iter().collect(), ..Ctx::default() };
    handle(&h.session, command, &ctx).unwrap()
}

#[test]
fn a_turn_id_only_the_store_remembers_names_its_turn_and_writes_nothing() {
    let mut h = harness("s", init("w", Some(agent("m")), false));
    // The head knows nothing of `t-old` (it left the head hundreds of turns ago): on its own
    // the engine would start a new turn under it.
    let fresh = handle_knowing(&h, msg_with_turn("w", "again", "t-old"), Vec::new());
    assert!(names(&fresh.events).contains(&"turn.started"), "{:?}", names(&fresh.events));
    let known = handle_knowing(&h, msg_with_turn("w", "again", "t-old"), vec![UsedId::Turn("t-old".into())]);
    assert!(known.events.is_empty(), "{:?}", names(&known.events));
    // Other turn ids are not affected.
    let other = handle_knowing(&h, msg_with_turn("w", "new", "t-new"), vec![UsedId::Turn("t-old".into())]);
    assert!(names(&other.events).contains(&"turn.started"), "{:?}", names(&other.events));
    h.exec(msg_with_turn("w", "new", "t-new"));
}

#[test]
fn a_call_id_only_the_store_remembers_is_not_made_again_nor_settled_again() {
    let mut h = harness("s", init("w", Some(with_tools(vec![tool("a")])), true));
    h.accept();
    h.exec(message("w", "go"));
    let req = h.deliver();
    let call = Action::ToolCall(ToolCallAction {
        id: Some("c-old".into()),
        name: "a".into(),
        arguments: json!({"x": 1}),
        handler: None,
        retry: None,
    });
    let answer = Command::Answer {
        decision_id: req.decision_id.clone(),
        attempt: req.attempts,
        response: Box::new(respond(vec![call])),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    };
    let fresh = handle_knowing(&h, answer.clone(), Vec::new());
    assert!(names(&fresh.events).contains(&"call.created"));
    let known = handle_knowing(&h, answer, vec![UsedId::Call("c-old".into())]);
    assert!(!names(&known.events).contains(&"call.created"), "{:?}", names(&known.events));
    assert!(names(&known.events).contains(&"action.ignored"));
    // A settle for it is refused as settled, not as unknown.
    let settle = Command::Settle {
        action: Action::ToolResult(ToolResultAction {
            id: Some("c-old".into()),
            attempt: None,
            result: json!(1),
        }),
    };
    let ctx = Ctx {
        now: h.now,
        seed: 7,
        used: [UsedId::Call("c-old".into())].into_iter().collect(),
        ..Ctx::default()
    };
    assert!(matches!(handle(&h.session, settle.clone(), &ctx), Err(Rejection::CallAlreadySettled(_))));
    assert!(matches!(handle(&h.session, settle, &Ctx::new(h.now, 7)), Err(Rejection::UnknownCall(_))));
}

#[test]
fn the_ids_a_commit_uses_first_are_its_new_turns_aliases_and_calls() {
    let mut h = harness("s", init("w", Some(with_tools(vec![tool("a")])), true));
    h.accept();
    let events = h.exec(msg_with_turn("w", "go", "t1"));
    assert_eq!(UsedId::first_used_by(&events), [UsedId::Turn("t1".into())]);
    let (_, events) = h.answer(respond(vec![Action::ToolCall(ToolCallAction {
        id: Some("c1".into()),
        name: "a".into(),
        arguments: json!({}),
        handler: None,
        retry: None,
    })]));
    assert_eq!(UsedId::first_used_by(&events), [UsedId::Call("c1".into())]);
}

// ----- tool approval -----------------------------------------------------------------------

/// An engine-hosted session whose client tool `pick` needs approval, with a turn whose model
/// asked for call `c1` of it.
fn at_a_call_needing_approval() -> Harness {
    let pick =
        AgentTool { handler: Some(ToolHandler::Client), approval: Some(Approval::Always), ..tool("pick") };
    let mut h = harness("s", init("demo", Some(with_tools(vec![pick])), false));
    h.exec(message("demo", "go"));
    h.run_llm(tool_calls(&[("c1", "pick", "{}")]));
    h
}

#[test]
fn a_call_of_a_tool_needing_approval_waits_until_approved() {
    let mut h = at_a_call_needing_approval();
    let call = h.session.call(&"c1".into()).unwrap();
    assert!(call.awaiting_approval);
    assert_eq!((call.status, call.attempt), (CallStatus::Queued, 0), "not started");
    assert_eq!(names(&h.exec(approval("c1", true, None))), ["call.approved", "call.dispatched"]);
    let call = h.session.call(&"c1".into()).unwrap();
    assert!(!call.awaiting_approval && call.is_pending());
    let err = h.try_exec(approval("c1", true, None)).unwrap_err();
    assert_eq!(err, Rejection::NotAwaitingApproval("c1".into()));
    assert_eq!(err.code(), "not_awaiting_approval");
}

#[test]
fn a_denied_call_answers_the_model_with_the_denial_and_the_turn_goes_on() {
    let mut h = at_a_call_needing_approval();
    let events = h.exec(approval("c1", false, Some("too risky")));
    assert_eq!(names(&events[..1]), ["call.settled"]);
    assert_eq!(
        h.path_texts().last().map(String::as_str),
        Some("Tool:the user denied this call of pick: too risky")
    );
    assert!(h.due_llm().is_some(), "the model is asked again");
    h.run_llm(reply("understood"));
    assert_eq!(h.last_turn().status, TurnStatus::Completed);
}

#[test]
fn an_approval_names_a_known_call() {
    let mut h = at_a_call_needing_approval();
    assert_eq!(h.try_exec(approval("c9", true, None)).unwrap_err(), Rejection::UnknownCall("c9".into()));
    h.exec(Command::Cancel { reason: "stop".into() });
    assert_eq!(h.try_exec(approval("c1", true, None)).unwrap_err().code(), "call_voided");
}

// ----- steering ----------------------------------------------------------------------------

#[test]
fn a_steering_message_enters_the_turn_after_the_tool_results_before_the_next_model_call() {
    let pick = AgentTool { handler: Some(ToolHandler::Client), ..tool("pick") };
    let mut h = harness("s", init("demo", Some(with_tools(vec![pick])), false));
    h.exec(msg_with_turn("demo", "go", "t1"));
    h.run_llm(tool_calls(&[("c1", "pick", "{}")]));
    assert_eq!(names(&h.exec(steer("demo", "also this", "s1"))), ["turn.queued"]);
    assert_eq!(h.path_texts(), ["User:go", "Assistant:"], "never between a call and its result");
    let events = h.exec(client_result("c1", "x"));
    assert!(names(&events).contains(&"turn.steered"));
    assert_eq!(h.path_texts(), ["User:go", "Assistant:", "Tool:x", "User:also this"]);
    assert!(h.session.queued_turn_ids().is_empty());
    assert_eq!(h.session.resolve_turn_id(&"s1".into()).as_str(), "t1", "the steering id names the turn");
    assert!(h.exec(steer("demo", "also this", "s1")).is_empty(), "a known steering id writes nothing");
    h.run_llm(reply("done"));
    assert_eq!(h.session.turn(&"t1".into()).map(|t| t.status), Some(TurnStatus::Completed));
    assert_eq!(h.path_texts().last().map(String::as_str), Some("Assistant:done"));
}

#[test]
fn a_steering_message_whose_turn_ends_first_becomes_the_next_turn() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(msg_with_turn("demo", "go", "t1"));
    h.exec(steer("demo", "and then", "s1"));
    h.run_llm(reply("first"));
    assert_eq!(h.session.active_turn_id().map(|t| t.as_str()), Some("s1"));
    h.run_llm(reply("second"));
    assert_eq!(h.path_texts(), ["User:go", "Assistant:first", "User:and then", "Assistant:second"]);
}

#[test]
fn a_steering_message_with_no_turn_running_starts_one_and_must_be_the_users() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    assert!(names(&h.exec(steer("demo", "hi", "s1"))).contains(&"turn.started"));
    let mut system = steer("demo", "obey", "s2");
    if let Command::Steer { input } = &mut system {
        input.message.role = Role::System;
    }
    assert_eq!(h.try_exec(system).unwrap_err().code(), "invalid_input");
}

// ----- forks -------------------------------------------------------------------------------

#[test]
fn a_seed_becomes_the_path_of_a_session_without_messages_and_only_of_one() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    let history = vec![
        DraftMessage::user("hi").into_message("m1".into()),
        DraftMessage { role: Role::Assistant, ..DraftMessage::user("hello") }.into_message("m2".into()),
    ];
    let events = h.exec(Command::Seed { messages: history.clone() });
    assert_eq!(names(&events), ["message.recorded", "message.recorded"]);
    assert_eq!(h.path_texts(), ["User:hi", "Assistant:hello"]);
    assert!(h.session.active_turn_id().is_none(), "a seed starts no turn");
    let err = h.try_exec(Command::Seed { messages: history }).unwrap_err();
    assert_eq!(err.code(), "invalid_input");
    let mut fresh = harness("t", init("demo", Some(agent("m")), false));
    let twice = vec![
        DraftMessage::user("a").into_message("m1".into()),
        DraftMessage::user("b").into_message("m1".into()),
    ];
    let err = fresh.try_exec(Command::Seed { messages: twice }).unwrap_err();
    assert!(matches!(&err, Rejection::InvalidInput(p) if p.path == "messages[1].id"), "{err:?}");
    h.turn("and now?", "now this");
    assert_eq!(h.path_texts(), ["User:hi", "Assistant:hello", "User:and now?", "Assistant:now this"]);
}

// ----- limits ------------------------------------------------------------------------------

fn small_limits() -> Limits {
    Limits {
        messages_per_input: 2,
        message_bytes: 64,
        state_bytes: 32,
        queued_turns: 1,
        sub_agent_depth: 1,
        sub_agent_fanout: 1,
    }
}

fn invalid_at(err: Rejection) -> (String, String) {
    match err {
        Rejection::InvalidInput(p) => (p.path, p.message),
        other => panic!("not an invalid input: {other:?}"),
    }
}

#[test]
fn client_inputs_past_a_size_or_count_limit_are_refused_naming_the_field_and_the_limit() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.limits = small_limits();
    let written = h.log.len();
    let long = "x".repeat(100);
    let (path, said) = invalid_at(h.try_exec(message("demo", &long)).unwrap_err());
    assert_eq!(path, "message.content");
    assert!(said.contains("over the limit of 64 (limits.message_bytes)"), "{said}");
    let view = |n: usize| {
        submit(
            ClientInput::Messages(ClientMessagesInput {
                agent_id: "demo".into(),
                turn_id: None,
                messages: (0..n).map(|i| DraftMessage::user(format!("m{i}"))).collect(),
                stream: None,
                client: None,
            }),
            false,
        )
    };
    let (path, said) = invalid_at(h.try_exec(view(3)).unwrap_err());
    assert_eq!(path, "messages");
    assert!(said.contains("3 messages, over the limit of 2 (limits.messages_per_input)"), "{said}");
    let result = ClientInput::ToolResult(ToolResultInput {
        id: "c1".into(),
        attempt: None,
        result: Some(json!(long)),
    });
    assert_eq!(invalid_at(h.try_exec(submit(result, false)).unwrap_err()).0, "result");
    assert_eq!(h.log.len(), written, "nothing was written");
    h.exec(message("demo", "short"));
}

#[test]
fn a_full_queue_refuses_one_more_turn() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.limits = small_limits();
    h.exec(msg_with_turn("demo", "one", "t1"));
    let queued = |id: &str| {
        let mut c = msg_with_turn("demo", "later", id);
        if let Command::Submit { queue, .. } = &mut c {
            *queue = true;
        }
        c
    };
    h.exec(queued("t2"));
    let err = h.try_exec(queued("t3")).unwrap_err();
    assert_eq!(err, Rejection::QueueFull { queued: 1 });
    assert_eq!(err.code(), "queue_full");
    assert_eq!(h.try_exec(steer("demo", "and", "s1")).unwrap_err().code(), "queue_full");
}

#[test]
fn a_worker_answer_past_a_limit_fails_its_decision_naming_the_field() {
    let mut h = harness("s", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "go"));
    h.limits = small_limits();
    let response = DecisionResponse { state: Some(json!({"notes": "x".repeat(40)})), ..Default::default() };
    let (_, events) = h.answer(response);
    let failed = events.iter().find_map(|e| match e {
        Event::DecisionFailed { error, .. } => Some(error.clone()),
        _ => None,
    });
    let error = failed.unwrap_or_else(|| panic!("no decision.failed: {:?}", names(&events)));
    assert!(error.contains("state") && error.contains("limits.state_bytes"), "{error}");
}

#[test]
fn delegations_past_the_fanout_or_the_depth_are_refused_naming_the_limit() {
    let mut boss = agent("m");
    boss.sub_agents = Some(vec![SubAgent { id: "helper".into(), description: None }]);
    let ask = r#"{"message": "look"}"#;
    let mut h = harness("s", init("boss", Some(boss.clone()), false));
    h.limits = small_limits();
    h.exec(message("boss", "two helpers, please"));
    h.run_llm(tool_calls(&[("c1", "helper", ask), ("c2", "helper", ask)]));
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Failed);
    assert!(turn.error.as_deref().is_some_and(|e| e.contains("limits.sub_agent_fanout")), "{turn:?}");

    let mut nested = init("boss", Some(boss), false);
    nested.ancestry = vec!["root".into()];
    let mut h = harness("child", nested);
    h.limits = small_limits();
    h.exec(message("boss", "one more level"));
    h.run_llm(tool_calls(&[("c1", "helper", ask)]));
    let turn = h.last_turn();
    assert!(turn.error.as_deref().is_some_and(|e| e.contains("limits.sub_agent_depth")), "{turn:?}");
}

// ----- the queue ---------------------------------------------------------------------------

fn queued(id: &str) -> Command {
    let mut c = msg_with_turn("demo", id, id);
    if let Command::Submit { queue, .. } = &mut c {
        *queue = true;
    }
    c
}

#[test]
fn a_waiting_turn_can_be_withdrawn_and_the_queue_reordered() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(msg_with_turn("demo", "active", "t0"));
    for id in ["q1", "q2", "q3"] {
        h.exec(queued(id));
    }
    h.exec(steer("demo", "and this", "st"));
    assert_eq!(
        names(&h.exec(Command::Reorder { order: vec!["q3".into(), "q1".into()] })),
        ["turn.queue_reordered"]
    );
    assert_eq!(h.session.queued_turn_ids(), ["q3", "q1", "q2", "st"], "listed first, the rest after");
    assert!(
        h.exec(Command::Reorder { order: vec!["q3".into()] }).is_empty(),
        "the same order writes nothing"
    );
    let err = h.try_exec(Command::Reorder { order: vec!["t0".into()] }).unwrap_err();
    assert_eq!(invalid_at(err).0, "order[0]");
    assert_eq!(names(&h.exec(Command::Withdraw { turn_id: "q1".into() })), ["turn.ended"]);
    assert_eq!(h.session.turn(&"q1".into()).map(|t| t.status), Some(TurnStatus::Cancelled));
    assert_eq!(h.try_exec(Command::Withdraw { turn_id: "t0".into() }).unwrap_err().code(), "turn_not_queued");
    h.exec(Command::Withdraw { turn_id: "st".into() });
    h.run_llm(reply("done"));
    assert_eq!(h.session.active_turn_id().map(|t| t.as_str()), Some("q3"), "the new order holds");
    h.run_llm(reply("three"));
    h.run_llm(reply("two"));
    assert_eq!(h.path_texts().iter().filter(|t| t.starts_with("User:")).count(), 3, "q1 and st never ran");
}

// ----- titles ----------------------------------------------------------------------------

#[test]
fn a_session_is_titled_by_its_first_turn_and_renamed_by_a_person() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    assert_eq!(h.session.title(), None);
    h.exec(msg_with_turn("demo", "\n   Why is   the build red?\nIt broke at noon.", "t1"));
    assert_eq!(h.session.title(), Some("Why is the build red?"));
    h.run_llm(reply("Flaky test."));
    let later = h.exec(msg_with_turn("demo", "And now?", "t2"));
    assert!(!later.iter().any(|e| matches!(e, Event::SessionTitled { .. })), "only the first turn names it");
    h.exec(Command::Rename { title: "  Red build  ".into() });
    assert_eq!(h.session.title(), Some("Red build"));
    for bad in ["   ", &"x".repeat(201)] {
        let refused = h.try_exec(Command::Rename { title: bad.to_owned() }).unwrap_err();
        assert!(refused.to_string().contains("a title is 1 to 200 characters"), "{refused}");
    }
    assert_eq!(h.session.title(), Some("Red build"), "a refused rename changes nothing");
}

// ----- rewind (a client's truncation) ---------------------------------------------------

#[test]
fn a_rewind_moves_the_head_back_and_the_next_message_continues_from_there() {
    let mut h = harness("s", init("demo", Some(agent("m")), false));
    h.exec(msg_with_turn("demo", "one", "t1"));
    h.run_llm(reply("first answer"));
    let end_of_t1 = h.session.tree().head().cloned();
    h.exec(msg_with_turn("demo", "two", "t2"));
    let running = h.try_exec(Command::Rewind { head: end_of_t1.clone() }).unwrap_err();
    assert_eq!(running.code(), "turn_already_active", "{running}");
    h.run_llm(reply("second answer"));
    let unknown = h.try_exec(Command::Rewind { head: Some("m-nope".into()) }).unwrap_err();
    assert!(unknown.to_string().contains("no message m-nope"), "{unknown}");

    assert_eq!(names(&h.exec(Command::Rewind { head: end_of_t1.clone() })), ["head.moved"]);
    assert_eq!(h.session.tree().head(), end_of_t1.as_ref());
    assert_eq!(
        names(&h.exec(Command::Rewind { head: end_of_t1.clone() })),
        ["head.moved"],
        "a rewind to where the head is is still the client's truncation"
    );
    h.exec(msg_with_turn("demo", "two, edited", "t3"));
    h.run_llm(reply("edited answer"));
    assert_eq!(
        h.path_texts(),
        ["User:one", "Assistant:first answer", "User:two, edited", "Assistant:edited answer"]
    );
    h.exec(Command::Rewind { head: None });
    assert!(h.path_texts().is_empty(), "rewound to the root, the conversation is empty");
}

#[test]
fn a_long_first_message_is_cut_into_a_title() {
    let title = title_from(&"word ".repeat(40)).unwrap();
    assert_eq!(title.chars().count(), 80);
    assert!(title.ends_with("word…"), "{title}");
    assert_eq!(title_from(" \n \t"), None);
}
