//! Golden traces of the canonical flows: the ordered event names.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::*;
use turnstone_engine::protocol::*;
use turnstone_engine::session::*;

#[test]
fn plain_reply_engine_hosted() {
    let mut h = harness("s1", init("demo", Some(agent("m")), false));
    // The session.start step accepts the declared config, which the engine-hosted session
    // derives from its init: nothing to write.
    assert_eq!(names(&h.log), ["session.created"]);
    assert_eq!(h.session.current_agent().map(|a| a.model.as_str()), Some("m"));
    // The engine's step for the turn's message is recorded by what it does.
    let events = h.exec(message("demo", "hello"));
    assert_eq!(names(&events), ["session.titled", "turn.started", "message.recorded", "call.created"]);
    // The llm.finished step consumes the call's result: one decision.accepted reports it.
    let events = h.run_llm(reply("hi there"));
    assert_eq!(
        names(&events),
        ["call.dispatched", "call.settled", "decision.accepted", "message.recorded", "turn.ended"]
    );
    assert_eq!(h.path_texts(), ["User:hello", "Assistant:hi there"]);
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Completed);
    assert_eq!(turn.data, Some(serde_json::json!("hi there")));
    assert_eq!(turn.usage.tokens.get("prompt_tokens"), Some(&10));
    assert_eq!(h.session.usage().cost(), "0.001");
    assert!(h.session.plan(h.now).effects.is_empty());
}

fn worker_agent_with_tools() -> AgentConfig {
    let mut a = agent("m");
    a.tools = Some(vec![
        AgentTool {
            name: "weather".into(),
            description: Some("weather for a city".into()),
            input: Some(
                serde_json::json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}),
            ),
            output: None,
            handler: None,
            approval: None,
            mcp: None,
        },
        AgentTool {
            name: "time".into(),
            description: None,
            input: None,
            output: None,
            handler: None,
            approval: None,
            mcp: None,
        },
    ]);
    a
}

#[test]
fn tool_loop_with_two_parallel_worker_tools() {
    let mut h = harness("s2", init("w", Some(worker_agent_with_tools()), true));
    let (start, _) = h.accept();
    assert_eq!(start.trigger, Trigger::SessionStart);
    assert!(start.proposed.agent.is_some());
    h.exec(message("w", "weather and time?"));
    let (req, events) = h.accept();
    assert!(matches!(req.trigger, Trigger::ClientMessages(ref t) if t.new_from == 0));
    assert_eq!(names(&events), ["decision.resolved", "message.recorded", "call.created"]);
    let events = h.run_llm(tool_calls(&[("c1", "weather", r#"{"city":"Oslo"}"#), ("c2", "time", "{}")]));
    assert_eq!(
        names(&events),
        ["call.dispatched", "call.settled", "trigger.queued", "call.reported", "decision.opened"]
    );
    let (req, events) = h.accept();
    let Trigger::LlmFinished(f) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert!(f.ok);
    assert_eq!(
        names(&events),
        [
            "decision.resolved",
            "message.recorded",
            "call.created",
            "trigger.queued",
            "call.created",
            "trigger.queued",
            "decision.opened",
            "call.dispatched"
        ]
    );
    // tool.execute for c1, answered inline.
    let req = h.deliver();
    let Trigger::ToolExecute(t) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert_eq!((t.id.as_str(), t.attempt), ("c1", 1));
    assert!(matches!(t.input, ToolInput::Valid { .. }));
    assert_eq!(req.pending_calls, 2);
    let result =
        Action::ToolResult(ToolResultAction { id: None, attempt: None, result: serde_json::json!("sunny") });
    h.exec(Command::Answer {
        decision_id: req.decision_id.clone(),
        attempt: 1,
        response: Box::new(DecisionResponse { actions: Some(vec![result]), ..Default::default() }),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    // tool.execute for c2 is live now; the tool.finished for c1 waits behind it.
    let req = h.deliver();
    let Trigger::ToolExecute(t) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert_eq!(t.id, "c2");
    let result =
        Action::ToolResult(ToolResultAction { id: None, attempt: None, result: serde_json::json!("12:00") });
    h.exec(Command::Answer {
        decision_id: req.decision_id.clone(),
        attempt: 1,
        response: Box::new(DecisionResponse { actions: Some(vec![result]), ..Default::default() }),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    // tool.finished c1: c2 not yet reported, so pending_calls = 1 and no llm.call proposed.
    let (req, _) = h.accept();
    let Trigger::ToolFinished(f) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert_eq!((f.id.as_str(), f.result.as_deref()), ("c1", Some("sunny")));
    assert_eq!(req.pending_calls, 1);
    assert!(req.proposed.actions.is_none());
    // tool.finished c2: nothing pending, llm.call proposed.
    let (req, _) = h.accept();
    let Trigger::ToolFinished(f) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert_eq!(f.id, "c2");
    assert_eq!(req.pending_calls, 0);
    assert_eq!(req.proposed.actions(), [Action::LlmCall(LlmCallAction::default())]);
    h.run_llm(reply("Sunny, 12:00"));
    h.accept();
    assert_eq!(
        h.path_texts(),
        ["User:weather and time?", "Assistant:", "Tool:sunny", "Tool:12:00", "Assistant:Sunny, 12:00"]
    );
    assert_eq!(h.last_turn().status, TurnStatus::Completed);
    assert!(h.session.decision().is_none() && h.session.calls().is_empty());
}

fn client_view(agent_id: &str, messages: Vec<DraftMessage>, tools: Option<Vec<AgentTool>>) -> Command {
    Command::Submit {
        input: ClientInput::Messages(ClientMessagesInput {
            agent_id: agent_id.into(),
            turn_id: None,
            messages,
            stream: None,
            client: tools.map(|t| ClientContext { tools: Some(t), ..Default::default() }),
        }),
        queue: false,
        origin: TurnOrigin::Client,
    }
}

fn drafts(h: &Harness) -> Vec<DraftMessage> {
    h.session.tree().active_path().iter().map(|m| m.to_draft()).collect()
}

#[test]
fn client_tool_fast_path() {
    let mut h = harness("s3", init("demo", Some(agent("m")), false));
    h.exec(client_view("demo", vec![DraftMessage::user("pick a color")], Some(vec![client_tool("pick")])));
    let events = h.run_llm(tool_calls(&[("c1", "pick", "{}")]));
    assert!(names(&events).ends_with(&["message.recorded", "call.created", "call.dispatched"]));
    let call = h.session.call(&"c1".into()).expect("open client call");
    assert_eq!((call.status, call.attempt), (CallStatus::Pending, 1));
    // The client answers with its whole view; the only news is the one answer: fast path.
    let mut view = drafts(&h);
    view.push(DraftMessage::tool_result("c1", "pick", "blue"));
    let events = h.exec(client_view("demo", view, None));
    assert_eq!(names(&events), ["call.settled", "decision.accepted", "message.recorded", "call.created"]);
    h.run_llm(reply("Blue it is"));
    assert_eq!(h.path_texts(), ["User:pick a color", "Assistant:", "Tool:blue", "Assistant:Blue it is"]);
    assert_eq!(h.last_turn().status, TurnStatus::Completed);
}

#[test]
fn client_tool_answers_in_a_view_settle_silently_and_deliver_the_view() {
    let mut h = harness("s4", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(client_view("w", vec![DraftMessage::user("two picks")], Some(vec![client_tool("pick")])));
    h.accept();
    h.run_llm(tool_calls(&[("c1", "pick", "{}"), ("c2", "pick", "{}")]));
    h.accept();
    assert_eq!(h.session.pending_calls(), 2);
    let mut view = drafts(&h);
    view.push(DraftMessage::tool_result("c1", "pick", "red"));
    view.push(DraftMessage::tool_result("c2", "pick", "green"));
    let events = h.exec(client_view("w", view, None));
    assert_eq!(
        names(&events),
        [
            "call.settled",
            "call.reported",
            "call.settled",
            "call.reported",
            "trigger.queued",
            "decision.opened"
        ]
    );
    let (req, events) = h.accept();
    let Trigger::ClientMessages(t) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert_eq!(t.new_from, 2);
    assert_eq!(req.pending_calls, 0);
    assert_eq!(names(&events), ["decision.resolved", "message.recorded", "message.recorded", "call.created"]);
    // The client input form settles too, and a second settle is refused clearly.
    h.run_llm(tool_calls(&[("c3", "pick", "{}")]));
    h.accept();
    let settle = |result: &str| Command::Submit {
        input: ClientInput::ToolResult(ToolResultInput {
            id: "c3".into(),
            attempt: None,
            result: Some(serde_json::json!(result)),
        }),
        queue: false,
        origin: TurnOrigin::Client,
    };
    h.exec(settle("blue"));
    assert_eq!(h.try_exec(settle("blue")).unwrap_err().code(), "call_already_settled");
}

#[test]
fn interrupt_and_resume() {
    let mut h = harness("s5", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "delete everything"));
    h.accept();
    h.run_llm(reply("Are you sure?"));
    let interrupt = Action::Interrupt(InterruptAction {
        interrupt_id: Some("i1".into()),
        reason: "confirm".into(),
        payload: Some(serde_json::json!({"question": "sure?"})),
    });
    let (req, events) = h.answer(DecisionResponse { actions: Some(vec![interrupt]), ..Default::default() });
    assert!(matches!(req.trigger, Trigger::LlmFinished(_)));
    assert_eq!(names(&events), ["decision.resolved", "interrupt.opened"]);
    assert!(h.session.is_paused());
    assert!(h.session.active_turn().is_some(), "the turn stays open while interrupted");
    // A new message is refused while the turn runs; an unknown interrupt id is refused clearly.
    assert_eq!(h.try_exec(message("w", "hello?")).unwrap_err().code(), "turn_already_active");
    let resume = |id: &str| Command::Submit {
        input: ClientInput::InterruptResume(InterruptResumeInput {
            interrupt_id: id.into(),
            payload: Some(serde_json::json!({"ok": true})),
        }),
        queue: false,
        origin: TurnOrigin::Client,
    };
    let err = h.try_exec(resume("nope")).unwrap_err();
    assert_eq!(err.code(), "unknown_interrupt");
    assert!(err.to_string().contains("i1"), "{err}");
    let events = h.exec(resume("i1"));
    assert_eq!(names(&events), ["interrupt.resumed", "trigger.queued", "decision.opened"]);
    let (req, _) = h.accept();
    let Trigger::InterruptResumed(r) = &req.trigger else { panic!("{:?}", req.trigger) };
    assert_eq!(r.payload, Some(serde_json::json!({"ok": true})));
    assert_eq!(req.proposed.actions(), [Action::LlmCall(LlmCallAction::default())]);
    h.run_llm(reply("Done."));
    h.accept();
    assert_eq!(h.last_turn().status, TurnStatus::Completed);
}

#[test]
fn results_queue_while_interrupted() {
    let mut h = harness("s6", init("w", Some(worker_agent_with_tools()), true));
    h.accept();
    h.exec(message("w", "time"));
    h.accept();
    h.run_llm(tool_calls(&[("c1", "time", "{}")]));
    let interrupt = Action::Interrupt(InterruptAction {
        interrupt_id: Some("i1".into()),
        reason: "wait".into(),
        payload: None,
    });
    let tool = Action::ToolCall(ToolCallAction {
        id: Some("c1".into()),
        name: "time".into(),
        arguments: serde_json::json!({}),
        handler: None,
        retry: None,
    });
    h.answer(DecisionResponse { actions: Some(vec![tool, interrupt]), ..Default::default() });
    // The branch is paused: the tool.execute waits; nothing is delivered.
    assert!(h.session.decision().is_none());
    assert!(h.session.plan(h.now).effects.is_empty());
    h.exec(Command::Submit {
        input: ClientInput::InterruptResume(InterruptResumeInput {
            interrupt_id: "i1".into(),
            payload: None,
        }),
        queue: false,
        origin: TurnOrigin::Client,
    });
    // Arrival order: the tool.execute queued before the resume goes first.
    let req = h.deliver();
    assert!(matches!(req.trigger, Trigger::ToolExecute(_)), "{:?}", req.trigger);
    let result =
        Action::ToolResult(ToolResultAction { id: None, attempt: None, result: serde_json::json!("noon") });
    h.exec(Command::Answer {
        decision_id: req.decision_id,
        attempt: 1,
        response: Box::new(DecisionResponse { actions: Some(vec![result]), ..Default::default() }),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    // The resume does not call the model while the step's result is still to be reported...
    let (req, _) = h.accept();
    assert!(matches!(req.trigger, Trigger::InterruptResumed(_)), "{:?}", req.trigger);
    assert_eq!(req.pending_calls, 1);
    assert!(req.proposed.actions.is_none());
    // ...the result does.
    let (req, _) = h.accept();
    assert!(matches!(req.trigger, Trigger::ToolFinished(_)), "{:?}", req.trigger);
    assert_eq!(req.proposed.actions(), [Action::LlmCall(LlmCallAction::default())]);
}

fn with_sub_agent() -> AgentConfig {
    let mut a = agent("m");
    a.sub_agents =
        Some(vec![SubAgent { id: "researcher".into(), description: Some("looks things up".into()) }]);
    a
}

#[test]
fn sub_agent_delegation() {
    let mut world = World::default();
    world.sessions.insert("p".into(), harness("p", init("boss", Some(with_sub_agent()), false)));
    let p = world.sessions.get_mut("p").unwrap();
    p.exec(message("boss", "find out X"));
    let events = p.run_llm(tool_calls(&[("t1", "researcher", r#"{"message":"look up X"}"#)]));
    assert!(names(&events).ends_with(&[
        "message.recorded",
        "call.created",
        "call.dispatched",
        "outbox.queued",
        "outbox.queued"
    ]));
    let decision_id = p
        .log
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::DecisionAccepted { decision_id, trigger, .. } if trigger == "llm.finished" => {
                Some(decision_id.clone())
            }
            _ => None,
        })
        .unwrap();
    let child_id = format!("{decision_id}-t1");
    assert_eq!(world.route(), ["p:spawn_child", "p:send_message"]);
    let child = world.sessions.get_mut(child_id.as_str()).expect("child session");
    assert_eq!(child.session.ancestry(), ["p"]);
    assert_eq!(child.path_texts(), ["User:look up X"]);
    child.run_llm(reply("X is 42"));
    assert_eq!(child.last_turn().status, TurnStatus::Completed);
    assert_eq!(world.route(), [format!("{child_id}:notify_parent")]);
    let p = world.sessions.get_mut("p").unwrap();
    assert_eq!(p.path_texts(), ["User:find out X", "Assistant:", "Tool:X is 42"]);
    // The engine-hosted parent's sub_agent.finished step: its trigger is derived from the
    // delegation (call.created) and its result (call.settled), which the log keeps.
    let step = p.log.iter().rev().find_map(|e| match e {
        Event::DecisionAccepted { trigger, call_id, .. } => Some((trigger.clone(), call_id.clone())),
        _ => None,
    });
    assert_eq!(step, Some(("sub_agent.finished".to_owned(), Some("t1".into()))));
    let spec = p.log.iter().find_map(|e| match e {
        Event::CallCreated { call } if call.id == "t1" => Some(call.spec.clone()),
        _ => None,
    });
    let Some(CallSpec::SubAgent { agent_id, session_id }) = spec else { panic!("{spec:?}") };
    let outcome = p.log.iter().find_map(|e| match e {
        Event::CallSettled { call_id, outcome, .. } if call_id == "t1" => Some(outcome.clone()),
        _ => None,
    });
    let Some(Ok(CallValue::Text(result))) = outcome else { panic!("{outcome:?}") };
    assert_eq!(
        (true, session_id.as_str(), agent_id.as_str(), Some(result.as_str())),
        (true, child_id.as_str(), "researcher", Some("X is 42"))
    );
    p.run_llm(reply("It is 42."));
    assert_eq!(p.last_turn().status, TurnStatus::Completed);
}

#[test]
fn cancel_voids_open_work_and_answers_dangling_tool_calls() {
    let mut world = World::default();
    let mut a = with_sub_agent();
    a.tools = worker_agent_with_tools().tools;
    world.sessions.insert("p".into(), harness("p", init("boss", Some(a), true)));
    let p = world.sessions.get_mut("p").unwrap();
    p.accept();
    p.exec(message("boss", "do two things"));
    p.accept();
    p.run_llm(tool_calls(&[("t1", "researcher", r#"{"message":"dig"}"#), ("t2", "time", "{}")]));
    p.accept();
    world.route();
    let child_id = world.sessions.keys().find(|k| k.as_str() != "p").cloned().unwrap();
    assert!(world.sessions[&child_id].session.active_turn().is_some());
    let p = world.sessions.get_mut("p").unwrap();
    let events = p.exec(Command::Cancel { reason: "user pressed stop".into() });
    let n = names(&events);
    assert_eq!(n.first(), Some(&"decision.voided"));
    assert_eq!(n.iter().filter(|e| **e == "call.voided").count(), 2);
    assert_eq!(n.iter().filter(|e| **e == "message.recorded").count(), 2, "{n:?}");
    assert!(n.contains(&"turn.ended"));
    assert_eq!(p.last_turn().status, TurnStatus::Cancelled);
    assert!(p.session.tree().unanswered_tool_calls().is_empty());
    let texts = p.path_texts();
    assert!(texts[2].contains("cancelled") && texts[2].contains("user pressed stop"), "{texts:?}");
    // A late result for a voided call is refused clearly.
    let late = Action::ToolResult(ToolResultAction {
        id: Some("t2".into()),
        attempt: None,
        result: serde_json::json!("x"),
    });
    assert_eq!(p.try_exec(Command::Settle { action: late }).unwrap_err().code(), "call_voided");
    // The child is cancelled in turn.
    let routed = world.route();
    assert!(routed.contains(&"p:cancel_child".to_owned()), "{routed:?}");
    assert_eq!(world.sessions[&child_id].last_turn().status, TurnStatus::Cancelled);
    // Cancel with nothing running is refused.
    let p = world.sessions.get_mut("p").unwrap();
    assert_eq!(p.try_exec(Command::Cancel { reason: "again".into() }).unwrap_err().code(), "no_active_turn");
}

#[test]
fn fork_mid_flight_voids_work_below_the_fork_point() {
    let mut h = harness("s7", init("w", Some(worker_agent_with_tools()), true));
    h.accept();
    h.exec(client_view("w", vec![DraftMessage::user("what time is it").with_id("u1")], None));
    h.accept();
    h.run_llm(tool_calls(&[("c1", "time", "{}")]));
    // The worker starts the tool and ends the turn at once (rule 28); the tool is deferred.
    let tool = Action::ToolCall(ToolCallAction {
        id: Some("c1".into()),
        name: "time".into(),
        arguments: serde_json::json!({}),
        handler: None,
        retry: None,
    });
    let done = Action::Done(DoneAction { data: None });
    let (req, _) =
        h.answer(DecisionResponse { messages: None, actions: Some(vec![tool, done]), ..Default::default() });
    let Trigger::LlmFinished(f) = req.trigger else { panic!() };
    // Note: the worker did not echo the proposal's messages, so the assistant message is vetoed.
    assert_eq!(h.path_texts(), ["User:what time is it"]);
    let _ = f;
    let (req, _) = h.answer(DecisionResponse::default()); // tool.execute answered later via settle
    assert!(matches!(req.trigger, Trigger::ToolExecute(_)));
    assert_eq!(h.session.call(&"c1".into()).map(|c| c.status), Some(CallStatus::Pending));
    assert_eq!(h.session.call(&"c1".into()).and_then(|c| c.anchor.clone()), Some("u1".into()));
    // The client edits its first message: a fork at the root, below which c1 was anchored.
    let events = h.exec(client_view("w", vec![DraftMessage::user("what day is it")], None));
    assert!(names(&events).contains(&"turn.started"));
    let (req, events) = h.accept();
    let Trigger::ClientMessages(t) = &req.trigger else { panic!() };
    assert_eq!(t.new_from, 0);
    assert_eq!(names(&events), ["decision.resolved", "message.recorded", "call.voided", "call.created"]);
    assert_eq!(h.session.tree().len(), 2, "the edit is a new node; the original stays in the tree");
    let late = Action::ToolResult(ToolResultAction {
        id: Some("c1".into()),
        attempt: Some(1),
        result: serde_json::json!("noon"),
    });
    let err = h.try_exec(Command::Settle { action: late }).unwrap_err();
    assert_eq!(err.code(), "call_voided");
}

#[test]
fn server_llm_retries_to_exhaustion_then_the_turn_fails() {
    let mut h = harness("s8", init("demo", Some(agent("m")), false));
    h.exec(message("demo", "hi"));
    let transient = CallError {
        error: "upstream 503".into(),
        code: Some(ErrorCode::ProviderError),
        detail: None,
        retryable: true,
    };
    let mut trace = Vec::new();
    for attempt in 1..=3u32 {
        let (_, due_attempt) = h.due_llm().expect("attempt due");
        assert_eq!(due_attempt, attempt);
        trace.extend(names(&h.fail_llm(transient.clone())));
        if attempt < 3 {
            // Backoff: not due before the wait (1 s, then 2 s, plus up to 10% jitter).
            assert!(h.due_llm().is_none());
            let plan = h.session.plan(h.now);
            let wake = plan.wake_at.expect("a wake time");
            let wait = (wake.0 - h.now.0) as u64;
            let base = 1000 * (1 << (attempt - 1));
            assert!(wait >= base && wait <= base + base / 10, "wait {wait} for attempt {attempt}");
            h.advance(wait);
            assert_eq!(h.session.plan(h.now).effects, [Effect::Tick]);
            trace.extend(names(&h.exec(Command::Tick)));
        }
    }
    assert_eq!(
        trace,
        [
            "call.dispatched",
            "call.retry_scheduled",
            "call.requeued",
            "call.dispatched",
            "call.retry_scheduled",
            "call.requeued",
            "call.dispatched",
            "call.settled",
            "decision.accepted",
            "turn.ended"
        ]
    );
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Failed);
    let error = turn.error.clone().unwrap();
    assert!(error.contains("upstream 503") && error.contains("provider_error"), "{error}");
    assert_eq!(h.path_texts(), ["User:hi"], "a failed model call records nothing");
}

#[test]
fn worker_delivery_retries_to_exhaustion_then_the_turn_fails() {
    let mut h = harness("s9", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "hi"));
    for attempt in 1..=4u32 {
        let req = h.deliver();
        assert_eq!(req.attempts, attempt);
        h.exec(Command::DeliveryFailed {
            decision_id: req.decision_id.clone(),
            attempt,
            error: "worker answered 502".into(),
            retryable: true,
        });
        if attempt < 4 {
            assert!(h.session.plan(h.now).effects.is_empty(), "backoff before redelivery");
            h.advance(60_000);
        }
    }
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Failed);
    assert!(turn.error.as_deref().unwrap().contains("after 4 attempts"), "{:?}", turn.error);
    assert!(h.session.decision().is_none());
}

#[test]
fn a_timed_out_delivery_is_retried_with_the_same_decision() {
    let mut h = harness("s10", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "hi"));
    let first = h.deliver();
    h.advance(31_000);
    assert_eq!(h.session.plan(h.now).effects, [Effect::Tick]);
    let events = h.exec(Command::Tick);
    assert_eq!(names(&events), ["decision.retry_scheduled"]);
    h.advance(5_000);
    let second = h.deliver();
    assert_eq!((second.decision_id.as_str(), second.attempts), (first.decision_id.as_str(), 2));
    assert_eq!(second.trigger, first.trigger);
    assert_eq!(second.proposed, first.proposed);
    // A late answer to attempt 1 still resolves the live decision; a duplicate is a no-op.
    let answer = Command::Answer {
        decision_id: first.decision_id.clone(),
        attempt: 1,
        response: Box::new(first.proposed.clone()),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    };
    assert!(!h.exec(answer.clone()).is_empty());
    assert!(h.exec(answer).is_empty());
}

/// Rule 28 leaves a window: a tool's result that arrives after its turn ended opens a decision
/// outside the turn. The engine records the result itself as the decision opens, so the path
/// never shows a tool call without its result, whatever the worker then answers.
#[test]
fn a_late_tool_result_after_done_is_recorded_by_the_engine() {
    let mut h = harness("late1", init("w", Some(worker_agent_with_tools()), true));
    h.accept();
    h.exec(client_view("w", vec![DraftMessage::user("what time is it").with_id("u1")], None));
    h.accept();
    h.run_llm(tool_calls(&[("c1", "time", "{}")]));
    // The worker records the model's message, starts the tool and ends the turn at once.
    let (req, _) = h.answer_with_proposal_messages(vec![
        Action::ToolCall(ToolCallAction {
            id: Some("c1".into()),
            name: "time".into(),
            arguments: serde_json::json!({}),
            handler: None,
            retry: None,
        }),
        Action::Done(DoneAction { data: None }),
    ]);
    assert!(matches!(req.trigger, Trigger::LlmFinished(_)));
    assert!(h.session.active_turn_id().is_none(), "the turn ended with the tool in flight");
    let (req, _) = h.answer(DecisionResponse::default()); // tool.execute, answered by settle
    assert!(matches!(req.trigger, Trigger::ToolExecute(_)));
    let result = Action::ToolResult(ToolResultAction {
        id: Some("c1".into()),
        attempt: Some(1),
        result: serde_json::json!("noon"),
    });
    h.exec(Command::Settle { action: result });
    // The late result's decision is open, and its result is on the path already.
    let decision = h.session.decision().expect("the late result's decision").clone();
    assert!(matches!(decision.trigger, Trigger::ToolFinished(_)));
    assert_eq!(decision.proposed.messages, None, "nothing left for the worker to record");
    assert_eq!(h.path_texts().last().map(String::as_str), Some("Tool:noon"));
    assert!(h.session.tree().unanswered_tool_calls().is_empty());
    // The worker answers without echoing it: still answered, once.
    h.answer(DecisionResponse::default());
    assert_eq!(h.path_texts().iter().filter(|t| t.as_str() == "Tool:noon").count(), 1);
}

/// A model reply that arrives after its turn ended may ask for tools: nothing will run them, so
/// once it is recorded they are answered, keeping the path valid for strict model APIs.
#[test]
fn tool_calls_of_a_late_model_reply_are_answered_as_not_run() {
    let mut h = harness("late2", init("w", Some(worker_agent_with_tools()), true));
    h.accept();
    h.exec(client_view("w", vec![DraftMessage::user("hi").with_id("u1")], None));
    // The worker starts two model calls; the first reply ends the turn.
    let call = Action::LlmCall(LlmCallAction::default());
    h.answer(DecisionResponse {
        messages: Some(vec![DraftMessage::user("hi").with_id("u1")]),
        actions: Some(vec![call.clone(), call]),
        ..Default::default()
    });
    h.run_llm(reply("first"));
    h.answer_with_proposal_messages(vec![Action::Done(DoneAction { data: None })]);
    assert!(h.session.active_turn_id().is_none());
    // The second reply asks for a tool; the worker records it (the proposal starts nothing).
    h.run_llm(tool_calls(&[("c9", "time", "{}")]));
    let (request, _) = h.accept();
    assert!(matches!(request.trigger, Trigger::LlmFinished(_)));
    assert!(h.session.tree().unanswered_tool_calls().is_empty(), "{:?}", h.path_texts());
    assert_eq!(h.path_texts().last().map(String::as_str), Some("Tool:error: not run: its turn had ended"));
}
