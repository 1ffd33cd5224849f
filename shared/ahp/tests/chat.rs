//! Durable mapping: a session's log, projected, is the AHP chat the issue describes.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use ahp_types::state::{
    ChatInputQuestion, ChatInputResponseKind, ChatOrigin, MessageKind, ResponsePart, SessionStatus,
    ToolCallCancellationReason, ToolCallContributor, ToolCallState, ToolInput, ToolResultContent, TurnState,
};
use common::*;
use serde_json::json;
use turnstone_engine::protocol::*;
use turnstone_engine::session::*;
use turnstone_engine::time::Timestamp;

#[test]
fn an_engine_hosted_turn_is_a_completed_turn_with_its_message_reply_and_usage() {
    let mut h = harness("s1", init("demo", Some(AgentConfig::new("m")), false));
    h.submit("hello");
    h.advance(1_500);
    let call = h.claim_llm();
    h.finish_llm(call, "hi there");
    let p = project(&h);
    assert_eq!(
        types(&p.actions),
        ["chat/turnStarted", "chat/usage", "chat/responsePart", "chat/turnComplete"]
    );
    let chat = p.chat();
    assert_eq!((chat.resource.as_str(), chat.title.as_str()), ("ahp-chat:/s1", "demo"));
    assert_eq!(turnstone_ahp::session_uri(&"s1".into()), "ahp-session:/s1");
    assert!(chat.active_turn.is_none());
    assert_eq!(chat.turns.len(), 1);
    let turn = last_turn(chat);
    assert_eq!(turn.state, TurnState::Complete);
    assert_eq!(turn.message.text, "hello");
    assert_eq!(turn.message.origin.kind, MessageKind::User);
    assert_eq!(turn.started_at.as_deref(), Some(Timestamp(T0).to_rfc3339().as_str()));
    assert_eq!(turn.duration, Some(1_500));
    assert_eq!(part_kinds(&turn.response_parts), ["markdown:hi there"]);
    let usage = turn.usage.as_ref().expect("usage");
    assert_eq!((usage.input_tokens, usage.output_tokens), (Some(12), Some(7)));
    assert_eq!(usage.model.as_deref(), Some("test-model"));
    assert_eq!(usage.meta.as_ref().unwrap()["cost"], "0.0012");
    assert_eq!(chat.status & SessionStatus::Idle.bits(), SessionStatus::Idle.bits());
}

#[test]
fn a_worker_tool_call_streams_runs_and_completes_before_the_turn_ends() {
    let mut h = harness("s2", init("w", Some(agent_with_tools()), true));
    h.accept();
    h.submit("weather in Oslo?");
    h.accept();
    h.run_llm(tool_calls(&[("c1", "weather", r#"{"city":"Oslo"}"#)]));
    h.accept();
    // The call runs: its part is running, with the final input.
    let mut p = Projected::new("s2");
    p.catch_up(&h.log);
    let active = p.chat().active_turn.as_ref().expect("an active turn");
    let ToolCallState::Running(running) = tool_call(&active.response_parts, "c1") else {
        panic!("{:?}", active.response_parts)
    };
    assert_eq!(running.tool_input, Some(ToolInput::Inline(r#"{"city":"Oslo"}"#.into())));
    assert!(running.contributor.is_none(), "a worker tool has no client contributor");
    // tool.execute answered with the result; the model replies; the turn ends.
    let req = h.deliver();
    let result = Action::ToolResult(ToolResultAction { id: None, attempt: None, result: json!("sunny") });
    h.exec(Command::Answer {
        decision_id: req.decision_id,
        attempt: 1,
        response: Box::new(DecisionResponse { actions: Some(vec![result]), ..Default::default() }),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    h.accept();
    h.run_llm(reply("Sunny in Oslo"));
    h.accept();
    let p = project(&h);
    let turn = last_turn(p.chat());
    assert_eq!(turn.state, TurnState::Complete);
    assert_eq!(part_kinds(&turn.response_parts), ["toolCall:c1:completed", "markdown:Sunny in Oslo"]);
    let done = completed(&turn.response_parts, "c1");
    assert!(done.success);
    assert_eq!(done.tool_name, "weather");
    assert_eq!(
        done.content.as_deref(),
        Some(
            &[ToolResultContent::Text(ahp_types::state::ToolResultTextContent { text: "sunny".into() })][..]
        )
    );
    // Two model calls: usage sums both (the tool call request reported no tokens).
    let usage = turn.usage.as_ref().unwrap();
    assert_eq!(usage.input_tokens, Some(10));
    assert_eq!(usage.meta.as_ref().unwrap()["llmCalls"], 2);
}

fn client_turn(h: &mut Driver) {
    h.submit("pick a color");
    h.run_llm(tool_calls(&[("c1", "pick", "{}")]));
}

/// An agent's client tool that no client offers (the turn brought no tool `pick`) runs with
/// no AHP contributor, since none would ever run it: a person is asked for its result (an
/// input request with the call's id and one text question), and the request completes with
/// the result as its answer, whoever settled the call (here an HTTP client's messages).
#[test]
fn an_agents_client_tool_no_client_offers_is_asked_of_a_person_and_completes_with_its_result() {
    let mut h = harness("s3", init("demo", Some(agent_with_tools()), false));
    client_turn(&mut h);
    let asked = project(&h);
    let active = asked.chat().active_turn.as_ref().expect("an active turn");
    let ToolCallState::Running(running) = tool_call(&active.response_parts, "c1") else {
        panic!("{:?}", active.response_parts)
    };
    assert!(running.contributor.is_none(), "{running:?}");
    let request = active
        .response_parts
        .iter()
        .find_map(|p| match p {
            ResponsePart::InputRequest(i) if i.request.id == "c1" => Some(&i.request),
            _ => None,
        })
        .expect("an input request for the call");
    let [ChatInputQuestion::Text(question)] = request.questions.as_deref().unwrap() else {
        panic!("{request:?}")
    };
    assert_eq!(question.id, turnstone_ahp::TOOL_RESULT_QUESTION);
    assert!(question.message.contains("{}"), "{question:?}");
    assert!(request.message.as_deref().unwrap().contains("pick"), "{request:?}");
    let mut view: Vec<DraftMessage> = h.session.tree().active_path().iter().map(|m| m.to_draft()).collect();
    view.push(DraftMessage::tool_result("c1", "pick", "blue"));
    h.exec(Command::Submit {
        input: ClientInput::Messages(ClientMessagesInput {
            agent_id: "demo".into(),
            turn_id: None,
            messages: view,
            stream: None,
            client: None,
        }),
        queue: false,
        origin: TurnOrigin::Client,
    });
    h.run_llm(reply("Blue it is"));
    let p = project(&h);
    let turn = last_turn(p.chat());
    let done = completed(&turn.response_parts, "c1");
    assert!(done.contributor.is_none(), "{:?}", done.contributor);
    assert_eq!(
        done.content.as_deref(),
        Some(&[ToolResultContent::Text(ahp_types::state::ToolResultTextContent { text: "blue".into() })][..])
    );
    let answered = turn
        .response_parts
        .iter()
        .find_map(|p| match p {
            ResponsePart::InputRequest(i) if i.request.id == "c1" => Some(i),
            _ => None,
        })
        .unwrap();
    assert_eq!(answered.response, Some(ChatInputResponseKind::Accept));
    let answer = serde_json::to_value(&answered.request.answers).unwrap();
    assert_eq!(answer["result"]["value"]["value"], "blue", "{answer}");
    assert_eq!(
        part_kinds(&turn.response_parts),
        ["toolCall:c1:completed", "inputRequest:c1", "markdown:Blue it is"]
    );
}

/// An agent's client tool that the turn's client offers too is that client's call: AHP's
/// contributor names it, and nobody else is asked.
#[test]
fn an_agents_client_tool_the_driving_client_offers_is_that_clients_call() {
    let mut h = harness("s3b", init("demo", Some(agent_with_tools()), false));
    // The window offers its own `pick` (a client's tools carry no handler).
    let pick = agent_with_tools()
        .tools()
        .iter()
        .find(|t| t.name == "pick")
        .map(|t| AgentTool { handler: None, ..t.clone() });
    let client = ClientContext {
        tools: pick.map(|p| vec![p]),
        client_id: Some("window-1".into()),
        ..Default::default()
    };
    h.exec(Command::Submit {
        input: ClientInput::Message(ClientMessageInput {
            agent_id: "demo".into(),
            turn_id: None,
            message: DraftMessage::user("pick a color"),
            stream: None,
            client: Some(client),
        }),
        queue: false,
        origin: TurnOrigin::Client,
    });
    h.run_llm(tool_calls(&[("c1", "pick", "{}")]));
    let p = project(&h);
    let active = p.chat().active_turn.as_ref().expect("an active turn");
    let ToolCallState::Running(running) = tool_call(&active.response_parts, "c1") else {
        panic!("{:?}", active.response_parts)
    };
    let Some(ToolCallContributor::Client(by)) = &running.contributor else { panic!("{running:?}") };
    assert_eq!(by.client_id, "window-1");
    assert_eq!(part_kinds(&active.response_parts), ["toolCall:c1:running"]);
}

#[test]
fn a_failed_tool_call_completes_with_its_error() {
    let mut h = harness("s4", init("demo", Some(agent_with_tools()), false));
    client_turn(&mut h);
    h.exec(Command::Submit {
        input: ClientInput::ToolError(ToolErrorInput {
            id: "c1".into(),
            error: "no colors left".into(),
            retryable: false,
            attempt: None,
        }),
        queue: false,
        origin: TurnOrigin::Client,
    });
    h.run_llm(reply("Sorry"));
    let p = project(&h);
    let done = completed(&last_turn(p.chat()).response_parts, "c1");
    assert!(!done.success);
    assert_eq!(done.error.as_ref().unwrap()["message"], "no colors left");
}

#[test]
fn a_failed_turn_ends_through_chat_error_with_its_error_info() {
    let mut h = harness("s5", init("demo", Some(AgentConfig::new("m")), false));
    h.submit("hi");
    h.fail_llm(CallError {
        error: "upstream exploded".into(),
        code: Some(ErrorCode::ProviderError),
        detail: None,
        retryable: false,
    });
    assert_eq!(h.last_turn().status, TurnStatus::Failed);
    let p = project(&h);
    assert_eq!(types(&p.actions).last().map(String::as_str), Some("chat/error"));
    let turn = last_turn(p.chat());
    assert_eq!(turn.state, TurnState::Error);
    let Some(ResponsePart::Error(error)) = turn.response_parts.last() else {
        panic!("{:?}", turn.response_parts)
    };
    assert!(error.error.message.contains("upstream exploded"), "{:?}", error.error);
    assert!(!error.error.error_type.is_empty());
    assert_eq!(p.chat().status & SessionStatus::Error.bits(), SessionStatus::Error.bits());
}

fn with_sub_agent() -> AgentConfig {
    let mut a = agent_with_tools();
    a.sub_agents = Some(vec![SubAgent { id: "researcher".into(), description: None }]);
    a
}

/// Parent `p` delegates `t1` to `researcher`; returns the child's id once it answered.
fn delegation() -> (Driver, Driver, String) {
    let mut p = harness("p", init("boss", Some(with_sub_agent()), false));
    p.submit("find out X");
    p.run_llm(tool_calls(&[("t1", "researcher", r#"{"message":"look up X"}"#)]));
    let mut child = delegated(&mut p, AgentConfig::new("m"));
    child.run_llm(reply("X is 42"));
    let child_id = child.session.id().to_string();
    for e in child.session.plan(child.now).effects {
        if let Effect::Route { seq, item } = e {
            if let Route::Deliver { command, .. } = route(&child_id.as_str().into(), item) {
                p.exec(command);
            }
            child.exec(Command::OutboxDelivered { seq });
        }
    }
    p.run_llm(reply("It is 42."));
    (p, child, child_id)
}

#[test]
fn a_sub_agent_call_names_the_child_chat_and_the_child_names_its_parent() {
    let (p, child, child_id) = delegation();
    let parent = project(&p);
    let turn = last_turn(parent.chat());
    assert_eq!(part_kinds(&turn.response_parts), ["toolCall:t1:completed", "markdown:It is 42."]);
    let done = completed(&turn.response_parts, "t1");
    let child_chat = format!("ahp-chat:/{child_id}");
    let Some([ToolResultContent::Subagent(sub), ToolResultContent::Text(text)]) = done.content.as_deref()
    else {
        panic!("{:?}", done.content)
    };
    assert_eq!((sub.resource.as_str(), sub.title.as_str()), (child_chat.as_str(), "researcher"));
    assert_eq!(text.text, "X is 42");
    let child = project(&child);
    assert_eq!(
        child.chat().origin,
        Some(ChatOrigin::Tool { chat: "ahp-chat:/p".into(), tool_call_id: "t1".into() })
    );
    let child_turn = last_turn(child.chat());
    assert_eq!(child_turn.message.origin.kind, MessageKind::Tool);
    assert_eq!(child_turn.message.text, "look up X");
}

#[test]
fn a_running_sub_agent_call_already_shows_the_child_chat() {
    let mut p = harness("p", init("boss", Some(with_sub_agent()), false));
    p.submit("find out X");
    p.run_llm(tool_calls(&[("t1", "researcher", r#"{"message":"look up X"}"#)]));
    let projected = project(&p);
    let active = projected.chat().active_turn.as_ref().unwrap();
    let ToolCallState::Running(running) = tool_call(&active.response_parts, "t1") else { panic!() };
    let Some([ToolResultContent::Subagent(sub)]) = running.content.as_deref() else { panic!("{running:?}") };
    assert!(sub.resource.starts_with("ahp-chat:/"));
}

#[test]
fn cancel_cancels_each_open_call_with_its_reason_before_the_turn_ends() {
    let mut h = harness("s6", init("w", Some(agent_with_tools()), true));
    h.accept();
    h.submit("weather twice");
    h.accept();
    h.run_llm(tool_calls(&[("c1", "weather", "{}"), ("c2", "weather", "{}")]));
    h.accept();
    let events = h.exec(Command::Cancel { reason: "user pressed stop".into() });
    let reasons: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::CallVoided { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(reasons.len(), 2);
    let p = project(&h);
    let turn = last_turn(p.chat());
    assert_eq!(turn.state, TurnState::Cancelled);
    for id in ["c1", "c2"] {
        let ToolCallState::Cancelled(c) = tool_call(&turn.response_parts, id) else {
            panic!("{id}: {:?}", turn.response_parts)
        };
        assert_eq!(c.reason, ToolCallCancellationReason::Skipped);
        assert_eq!(c.reason_message.as_ref().map(|m| m.as_text()), Some(reasons[0].as_str()));
    }
}

fn resume(id: &str, payload: serde_json::Value) -> Command {
    Command::Submit {
        input: ClientInput::InterruptResume(InterruptResumeInput {
            interrupt_id: id.into(),
            payload: Some(payload),
        }),
        queue: false,
        origin: TurnOrigin::Client,
    }
}

#[test]
fn an_interrupt_is_an_input_request_with_its_questions_and_resuming_completes_it() {
    let mut h = harness("s7", init("w", Some(AgentConfig::new("m")), true));
    h.accept();
    h.submit("delete everything");
    h.accept();
    h.run_llm(reply("Are you sure?"));
    let questions = json!([{"kind": "boolean", "id": "sure", "message": "Really delete?"}]);
    let interrupt = Action::Interrupt(InterruptAction {
        interrupt_id: Some("i1".into()),
        reason: "confirm".into(),
        payload: Some(json!({ "questions": questions })),
    });
    // The worker records the model's reply and pauses.
    let req = h.deliver();
    let mut response = req.proposed.clone();
    response.actions = Some(vec![interrupt]);
    h.exec(Command::Answer {
        decision_id: req.decision_id,
        attempt: req.attempts,
        response: Box::new(response),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    let p = project(&h);
    let chat = p.chat();
    assert_eq!(chat.status & SessionStatus::InputNeeded.bits(), SessionStatus::InputNeeded.bits());
    let active = chat.active_turn.as_ref().unwrap();
    assert_eq!(part_kinds(&active.response_parts), ["markdown:Are you sure?", "inputRequest:i1"]);
    let Some(ResponsePart::InputRequest(request)) = active.response_parts.last() else { panic!() };
    assert_eq!(request.request.message.as_deref(), Some("confirm"));
    let Some([ChatInputQuestion::Boolean(q)]) = request.request.questions.as_deref() else {
        panic!("{:?}", request.request.questions)
    };
    assert_eq!(q.id, "sure");
    assert!(request.response.is_none());
    let answer = json!({"sure": {"state": "submitted", "value": {"kind": "boolean", "value": true}}});
    h.exec(resume("i1", json!({ "answers": answer })));
    h.accept();
    h.run_llm(reply("Done."));
    h.accept();
    let p = project(&h);
    let turn = last_turn(p.chat());
    assert_eq!(turn.state, TurnState::Complete);
    let Some(ResponsePart::InputRequest(request)) = turn.response_parts.get(1) else { panic!() };
    assert_eq!(request.response, Some(ChatInputResponseKind::Accept));
    assert!(request.request.answers.as_ref().is_some_and(|a| a.contains_key("sure")));
}

#[test]
fn an_interrupt_without_questions_is_a_bare_request_a_decline_completes() {
    let mut h = harness("s8", init("w", Some(AgentConfig::new("m")), true));
    h.accept();
    h.submit("go");
    h.accept();
    h.run_llm(reply("Proceed?"));
    let interrupt = Action::Interrupt(InterruptAction {
        interrupt_id: Some("i1".into()),
        reason: "ok?".into(),
        payload: None,
    });
    h.answer(DecisionResponse { actions: Some(vec![interrupt]), ..Default::default() });
    h.exec(resume("i1", json!({"response": "decline"})));
    let p = project(&h);
    let active = p.chat().active_turn.as_ref().unwrap();
    let Some(ResponsePart::InputRequest(request)) = active.response_parts.last() else { panic!() };
    assert!(request.request.questions.is_none());
    assert_eq!(request.response, Some(ChatInputResponseKind::Decline));
    assert_eq!(p.chat().status & SessionStatus::InputNeeded.bits(), SessionStatus::InProgress.bits());
}

#[test]
fn a_queued_turn_is_a_pending_message_until_it_starts() {
    let mut h = harness("s9", init("demo", Some(AgentConfig::new("m")), false));
    h.submit("first");
    let Command::Submit { input, origin, .. } = message("demo", "second") else { panic!() };
    h.exec(Command::Submit { input, queue: true, origin });
    let mut p = Projected::new("s9");
    p.catch_up(&h.log);
    let queued = p.chat().queued_messages.as_ref().expect("a queued message");
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].message.text, "second");
    let queued_id = queued[0].id.clone();
    // The first turn ends; the queued one starts from its pending message.
    h.run_llm(reply("one"));
    let actions = p.catch_up(&h.log);
    // The message leaves the pending list before its turn starts, for a client whose reducer
    // does not read `queuedMessageId`.
    let kinds = types(&actions);
    let removed = kinds.iter().position(|k| k == "chat/pendingMessageRemoved").expect("the message removed");
    let started = kinds.iter().position(|k| k == "chat/turnStarted").expect("the turn started");
    assert!(removed < started, "{kinds:?}");
    assert!(p.chat().queued_messages.is_none());
    let active = p.chat().active_turn.as_ref().expect("the queued turn runs");
    assert_eq!((active.id.as_str(), active.message.text.as_str()), (queued_id.as_str(), "second"));
    h.run_llm(reply("two"));
    let p = project(&h);
    let texts: Vec<_> = p.chat().turns.iter().map(|t| t.message.text.clone()).collect();
    assert_eq!(texts, ["first", "second"]);
    assert!(p.chat().turns.iter().all(|t| t.state == TurnState::Complete));
}

#[test]
fn a_call_still_running_when_its_turn_ends_is_cancelled_first() {
    let mut h = harness("s10", init("w", Some(agent_with_tools()), true));
    h.accept();
    h.submit("weather, later");
    h.accept();
    h.run_llm(tool_calls(&[("c1", "weather", "{}")]));
    // The worker starts the tool and ends the turn at once: the call outlives its turn.
    let req = h.deliver();
    let mut response = req.proposed.clone();
    let tool = Action::ToolCall(ToolCallAction {
        id: Some("c1".into()),
        name: "weather".into(),
        arguments: json!({}),
        handler: None,
        retry: None,
    });
    response.actions = Some(vec![tool, Action::Done(DoneAction { data: None })]);
    h.exec(Command::Answer {
        decision_id: req.decision_id,
        attempt: req.attempts,
        response: Box::new(response),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    });
    assert_eq!(h.last_turn().status, TurnStatus::Completed);
    let p = project(&h);
    let turn = last_turn(p.chat());
    assert_eq!(turn.state, TurnState::Complete);
    let ToolCallState::Cancelled(c) = tool_call(&turn.response_parts, "c1") else {
        panic!("{:?}", turn.response_parts)
    };
    assert_eq!(c.reason, ToolCallCancellationReason::Skipped);
    assert!(c.reason_message.as_ref().is_some_and(|m| m.as_text().contains("turn ended")));
}

/// An engine-hosted session whose client tool `pick` needs approval, its model asking for
/// call `c1` of it.
fn approval_turn(id: &str) -> Driver {
    let mut config = agent_with_tools();
    for tool in config.tools.iter_mut().flatten() {
        if tool.name == "pick" {
            tool.approval = Some(Approval::Always);
        }
    }
    let mut h = harness(id, init("demo", Some(config), false));
    h.submit("pick one");
    h.run_llm(tool_calls(&[("c1", "pick", "{}")]));
    h
}

#[test]
fn a_call_needing_approval_waits_pending_confirmation_and_runs_once_approved() {
    let mut h = approval_turn("s11");
    let mut p = Projected::new("s11");
    p.catch_up(&h.log);
    let active = p.chat().active_turn.as_ref().expect("an active turn");
    assert!(matches!(tool_call(&active.response_parts, "c1"), ToolCallState::PendingConfirmation(_)));
    h.exec(approval("c1", true, None));
    let actions = p.catch_up(&h.log);
    // It runs: no client offers `pick`, so a person is asked for its result.
    assert_eq!(types(&actions), ["chat/toolCallConfirmed", "chat/inputRequested"]);
    let active = p.chat().active_turn.as_ref().unwrap();
    let ToolCallState::Running(running) = tool_call(&active.response_parts, "c1") else {
        panic!("{:?}", active.response_parts)
    };
    assert_eq!(running.confirmed, ahp_types::state::ToolCallConfirmationReason::UserAction);
    h.exec(client_result("c1", "red"));
    h.run_llm(reply("red it is"));
    let p = project(&h);
    assert_eq!(
        part_kinds(&last_turn(p.chat()).response_parts),
        ["toolCall:c1:completed", "inputRequest:c1", "markdown:red it is"]
    );
}

#[test]
fn a_denied_call_is_cancelled_as_denied_with_the_reason() {
    let mut h = approval_turn("s12");
    h.exec(approval("c1", false, Some("not now")));
    h.run_llm(reply("ok, I will not"));
    let p = project(&h);
    let turn = last_turn(p.chat());
    assert_eq!(turn.state, TurnState::Complete);
    let ToolCallState::Cancelled(c) = tool_call(&turn.response_parts, "c1") else {
        panic!("{:?}", turn.response_parts)
    };
    assert_eq!(c.reason, ToolCallCancellationReason::Denied);
    assert!(c.reason_message.as_ref().is_some_and(|m| m.as_text().contains("not now")));
}

#[test]
fn a_call_waiting_for_approval_when_its_turn_is_cancelled_is_cancelled_as_skipped() {
    let mut h = approval_turn("s13");
    h.exec(Command::Cancel { reason: "stop".into() });
    let p = project(&h);
    let turn = last_turn(p.chat());
    assert_eq!(turn.state, TurnState::Cancelled);
    let ToolCallState::Cancelled(c) = tool_call(&turn.response_parts, "c1") else {
        panic!("{:?}", turn.response_parts)
    };
    assert_eq!(c.reason, ToolCallCancellationReason::Skipped);
}

#[test]
fn a_steering_message_is_pending_until_the_turn_takes_it() {
    let mut h = harness("s14", init("demo", Some(agent_with_tools()), false));
    client_turn(&mut h);
    h.exec(steer("demo", "make it blue", "st1"));
    let mut p = Projected::new("s14");
    p.catch_up(&h.log);
    let steering = p.chat().steering_message.as_ref().expect("a steering message");
    assert_eq!((steering.id.as_str(), steering.message.text.as_str()), ("st1", "make it blue"));
    h.exec(client_result("c1", "red"));
    let actions = p.catch_up(&h.log);
    assert!(types(&actions).contains(&"chat/pendingMessageRemoved".to_owned()), "{:?}", types(&actions));
    assert!(p.chat().steering_message.is_none());
    h.run_llm(reply("blue then"));
    let p = project(&h);
    // The steering message stays in the transcript: the turn it joined goes on as the chat's
    // next turn, which it starts.
    let turns: Vec<(&str, &str)> =
        p.chat().turns.iter().map(|t| (t.id.as_str(), t.message.text.as_str())).collect();
    let first = p.chat().turns[0].id.clone();
    assert_eq!(turns, [(first.as_str(), "pick a color"), ("st1", "make it blue")]);
    assert_eq!(p.chat().turns[0].state, TurnState::Complete);
    assert_eq!(part_kinds(&p.chat().turns[1].response_parts), ["markdown:blue then"]);
    assert_eq!(h.session.turn(&"st1".into()).map(|t| t.id.as_str()), Some(first.as_str()), "one engine turn");
}

#[test]
fn a_steering_message_left_when_its_turn_ends_starts_the_next_turn() {
    let mut h = harness("s15", init("demo", Some(AgentConfig::new("m")), false));
    h.submit("first");
    h.exec(steer("demo", "and more", "st2"));
    h.run_llm(reply("one"));
    h.run_llm(reply("two"));
    let p = project(&h);
    let texts: Vec<_> = p.chat().turns.iter().map(|t| (t.id.clone(), t.message.text.clone())).collect();
    assert_eq!(texts[1], ("st2".to_owned(), "and more".to_owned()));
    assert!(p.chat().steering_message.is_none());
}

#[test]
fn a_forks_chat_starts_with_its_sources_turns_and_names_its_origin() {
    let mut source = harness("src", init("demo", Some(AgentConfig::new("m")), false));
    source.turn("first", "one");
    source.turn("second", "two");
    let source_chat = project(&source).chat().clone();
    let first_turn = source_chat.turns[0].clone();
    let mut fork_init = init("demo", Some(AgentConfig::new("m")), false);
    fork_init.fork = Some(ForkOrigin { session_id: "src".into(), turn_id: first_turn.id.as_str().into() });
    let mut fork = harness("fk", fork_init);
    let history: Vec<Message> =
        source.session.tree().active_path()[..2].iter().map(|m| (*m).clone()).collect();
    fork.exec(Command::Seed { messages: history });
    fork.turn("instead", "three");
    let mut p = Projected::of(ChatProjection::forked("fk", vec![first_turn.clone()]));
    p.catch_up(&fork.log);
    p.check_actions();
    let chat = p.chat();
    assert_eq!(
        serde_json::to_value(&chat.origin).unwrap(),
        json!({"kind": "fork", "chat": "ahp-chat:/src", "turnId": first_turn.id})
    );
    let texts: Vec<_> = chat.turns.iter().map(|t| t.message.text.as_str()).collect();
    assert_eq!(texts, ["first", "instead"], "the copied turn, then the fork's own; the seed shows no turn");
}

#[test]
fn withdrawn_and_reordered_queued_messages_follow_the_engine() {
    let mut h = harness("s16", init("demo", Some(AgentConfig::new("m")), false));
    h.submit("first");
    for id in ["q1", "q2", "q3"] {
        let Command::Submit { input: ClientInput::Message(mut m), origin, .. } = message("demo", id) else {
            panic!()
        };
        m.turn_id = Some(id.into());
        h.exec(Command::Submit { input: ClientInput::Message(m), queue: true, origin });
    }
    h.exec(Command::Reorder { order: vec!["q3".into()] });
    h.exec(Command::Withdraw { turn_id: "q1".into() });
    let p = project(&h);
    let ids: Vec<&str> = p.chat().queued_messages.iter().flatten().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["q3", "q2"]);
    h.run_llm(reply("one"));
    let p = project(&h);
    assert_eq!(p.chat().active_turn.as_ref().map(|t| t.id.as_str()), Some("q3"));
}

/// `client.message` of agent `demo`: `text` as turn `turn_id`.
fn demo_turn(turn_id: &str, text: &str) -> Command {
    turnstone_engine::testing::turn_message("demo", Some(turn_id), text)
}

/// `client.messages` of agent `demo`: the client's `view` as turn `turn_id`.
fn demo_view(turn_id: &str, view: Vec<DraftMessage>) -> Command {
    Command::Submit {
        input: ClientInput::Messages(ClientMessagesInput {
            agent_id: "demo".into(),
            turn_id: Some(turn_id.into()),
            messages: view,
            stream: None,
            client: None,
        }),
        queue: false,
        origin: TurnOrigin::Client,
    }
}

/// A client's view of `h`'s conversation: its first `kept` recorded messages, then a new user
/// message `text`.
fn view_after(h: &Driver, kept: usize, text: &str) -> Vec<DraftMessage> {
    let tree = h.session.tree();
    let mut view: Vec<DraftMessage> =
        tree.path_to(tree.head())[..kept].iter().map(|m| m.to_draft()).collect();
    view.push(DraftMessage::user(text));
    view
}

/// A session with turns `t1` ("one" / "first") and `t2` ("two" / "second").
fn two_turns(id: &str) -> Driver {
    let mut h = harness(id, init("demo", Some(AgentConfig::new("m")), false));
    for (turn, user, reply_text) in [("t1", "one", "first"), ("t2", "two", "second")] {
        h.exec(demo_turn(turn, user));
        h.run_llm(reply(reply_text));
    }
    h
}

fn turn_texts(chat: &ahp_types::state::ChatState) -> Vec<(String, String)> {
    chat.turns.iter().map(|t| (t.id.clone(), t.message.text.clone())).collect()
}

#[test]
fn a_rewind_truncates_the_chat_through_the_turn_it_keeps_and_the_edit_continues_there() {
    let mut h = two_turns("s-rewind");
    let mut p = Projected::new("s-rewind");
    p.catch_up(&h.log);
    let end_of_t1 = h.session.tree().path_ids_to(h.session.tree().head())[1].clone();
    h.exec(Command::Rewind { head: Some(end_of_t1) });
    let truncated = p.catch_up(&h.log);
    assert_eq!(
        serde_json::to_value(&truncated).unwrap(),
        json!([{"type": "chat/truncated", "turnId": "t1"}])
    );
    assert_eq!(turn_texts(p.chat()), [("t1".to_owned(), "one".to_owned())]);
    h.exec(demo_turn("t3", "two, edited"));
    h.run_llm(reply("edited"));
    p.catch_up(&h.log);
    p.check_actions();
    let expected = [("t1".to_owned(), "one".to_owned()), ("t3".to_owned(), "two, edited".to_owned())];
    assert_eq!(turn_texts(p.chat()), expected);
    assert_eq!(turn_texts(project(&h).chat()), expected, "a replay reads the same chat");
    h.exec(Command::Rewind { head: None });
    p.catch_up(&h.log);
    assert!(p.chat().turns.is_empty(), "rewound to the root, no turn stays");
}

#[test]
fn an_edit_over_http_truncates_the_chat_to_the_turns_before_the_edited_one() {
    let mut h = two_turns("s-edit");
    // The client's view: the first turn as recorded, then its second message edited.
    h.exec(demo_view("t3", view_after(&h, 2, "two, edited")));
    h.run_llm(reply("edited"));
    let p = project(&h);
    assert_eq!(
        turn_texts(p.chat()),
        [("t1".to_owned(), "one".to_owned()), ("t3".to_owned(), "two, edited".to_owned())]
    );
    assert_eq!(part_kinds(&last_turn(p.chat()).response_parts), ["markdown:edited"]);
    let kinds = types(&p.actions);
    let truncated = kinds.iter().position(|k| k == "chat/truncated").expect("a truncation");
    assert_eq!(
        kinds[truncated - 1..=truncated + 1],
        ["chat/turnComplete", "chat/truncated", "chat/turnStarted"],
        "the edit's turn shows once it recorded its message, after the truncation: {kinds:?}"
    );

    // A regeneration: the view ends with a new copy of t3's message (an edit is a new
    // message; a view that only ends early writes nothing), which the new turn answers again.
    h.exec(demo_view("t4", view_after(&h, 2, "two, edited")));
    h.run_llm(reply("regenerated"));
    let p = project(&h);
    assert_eq!(
        turn_texts(p.chat()),
        [("t1".to_owned(), "one".to_owned()), ("t4".to_owned(), "two, edited".to_owned())]
    );
    assert_eq!(part_kinds(&last_turn(p.chat()).response_parts), ["markdown:regenerated"]);
}

#[test]
fn a_running_turn_a_worker_branches_off_an_earlier_turn_starts_again_after_the_truncation() {
    let mut h = harness("s-rewrite", init("w", Some(AgentConfig::new("m")), true));
    h.accept();
    for (user, answer) in [("one", "first"), ("two", "second"), ("three", "third")] {
        h.submit(user);
        h.accept();
        h.run_llm(reply(answer));
        if user != "three" {
            h.accept();
        }
    }
    // The worker answers the third turn's model reply by rewriting the conversation: the first
    // turn, then a message of its own in place of everything after it.
    let view = view_after(&h, 2, "two and three, summarized");
    h.answer(DecisionResponse {
        messages: Some(view),
        actions: Some(vec![Action::Done(DoneAction::default())]),
        ..Default::default()
    });
    let p = project(&h);
    let texts: Vec<String> = p.chat().turns.iter().map(|t| t.message.text.clone()).collect();
    assert_eq!(texts, ["one", "three"], "the second turn is off the path; the third goes on");
    let kinds = types(&p.actions);
    let truncated = kinds.iter().position(|k| k == "chat/truncated").expect("a truncation");
    assert_eq!(kinds[truncated + 1], "chat/turnStarted", "the running turn starts again: {kinds:?}");
    assert_eq!(last_turn(p.chat()).state, TurnState::Complete);
}

#[test]
fn a_failed_turn_is_resumable_and_a_resume_turn_takes_it_up_again() {
    let mut h = harness("s-resume", init("demo", Some(AgentConfig::new("m")), false));
    h.exec(demo_turn("r1", "hi"));
    let provider_down = CallError {
        error: "upstream exploded".into(),
        code: Some(ErrorCode::ProviderError),
        detail: None,
        retryable: false,
    };
    h.fail_llm(provider_down.clone());
    let p = project(&h);
    let Some(ResponsePart::Error(error)) = last_turn(p.chat()).response_parts.last() else { panic!() };
    assert_eq!(error.resumable, Some(true), "a provider's failure may go better another time");
    assert!(p.projection.resumption("nope").is_err());
    let resumption = p.projection.resumption("r1").unwrap();
    assert_eq!(resumption.turn_id, "r1.resume1");
    assert_eq!(resumption.message, None, "the message is in the conversation: nothing is sent again");

    // The resume: a turn that continues the conversation, shown as r1 taken up again.
    let resume = |turn_id: &str| demo_view(turn_id, Vec::new());
    h.exec(resume("r1.resume1"));
    h.fail_llm(provider_down);
    let p = project(&h);
    assert_eq!(p.chat().turns.len(), 1, "still one turn, failed again");
    assert_eq!(p.projection.resumption("r1").unwrap().turn_id, "r1.resume2");
    h.exec(resume("r1.resume2"));
    h.run_llm(reply("hello after all"));
    let p = project(&h);
    let kinds = types(&p.actions);
    assert_eq!(kinds.iter().filter(|k| *k == "chat/turnResume").count(), 2, "{kinds:?}");
    let turn = last_turn(p.chat());
    assert_eq!((p.chat().turns.len(), turn.id.as_str(), turn.state), (1, "r1", TurnState::Complete));
    assert_eq!(part_kinds(&turn.response_parts).last().map(String::as_str), Some("markdown:hello after all"));
    assert_eq!(h.path_texts(), ["User:hi", "Assistant:hello after all"], "the message was sent once");

    // A spent budget would only fail again.
    let mut budgeted = init("demo", Some(AgentConfig::new("m")), false);
    budgeted.budget = Budget { max_cost_picodollars: parse_picodollars("0.001"), max_llm_calls: None };
    let mut h = harness("s-budget", budgeted);
    h.submit("hi");
    let mut costly = reply("expensive");
    costly.cost = Some("0.002".into());
    h.run_llm(costly);
    assert_eq!(h.last_turn().code, Some(ErrorCode::BudgetExceeded));
    let p = project(&h);
    let Some(ResponsePart::Error(error)) = last_turn(p.chat()).response_parts.last() else { panic!() };
    assert_eq!(error.resumable, None);
}
