//! Live deltas: a running model call's text, reasoning and tool arguments show as they come,
//! and the durable reply that follows ends each part exactly as a replay without deltas does.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use ahp_types::state::{ToolCallState, TurnState};
use common::*;
use turnstone_engine::ids::CallId;
use turnstone_engine::protocol::*;
use turnstone_engine::session::*;

fn text(more: &str) -> StreamDelta {
    StreamDelta { text: Some(more.into()), ..Default::default() }
}

fn arguments(id: &str, name: Option<&str>, more: &str) -> StreamDelta {
    StreamDelta {
        tool_calls: Some(vec![ToolCallDelta {
            id: id.into(),
            name: name.map(str::to_owned),
            arguments: Some(more.into()),
        }]),
        ..Default::default()
    }
}

/// The model's reply: `content` and a client tool call `c1` to `pick` with `args`.
fn final_reply(content: &str, args: &str) -> LlmResponse {
    let mut response = tool_calls(&[("c1", "pick", args)]);
    response.content = Some(content.into());
    response
}

/// A session whose model call is claimed (running), projected so far.
fn streaming(id: &str) -> (Driver, Projected, CallId, u32) {
    let mut h = harness(id, init("demo", Some(agent_with_tools()), false));
    h.submit("pick one");
    let (call_id, attempt) = h.claim_llm();
    let mut p = Projected::new(id);
    p.catch_up(&h.log);
    (h, p, call_id, attempt)
}

#[test]
fn deltas_then_the_final_reply_equal_the_final_reply_without_deltas() {
    let (mut h, mut live, call_id, attempt) = streaming("d1");
    let c = call_id.as_str();
    assert_eq!(types(&live.delta(c, &text("It is "))), ["chat/responsePart"]);
    assert_eq!(types(&live.delta(c, &text("blue"))), ["chat/delta"]);
    assert_eq!(
        types(&live.delta(c, &arguments("c1", Some("pick"), r#"{"co"#))),
        ["chat/toolCallStart", "chat/toolCallDelta"]
    );
    // Mid-stream: the text so far, and the tool call streaming its arguments.
    let active = live.chat().active_turn.as_ref().unwrap();
    assert_eq!(part_kinds(&active.response_parts), ["markdown:It is blue", "toolCall:c1:streaming"]);
    let ToolCallState::Streaming(s) = tool_call(&active.response_parts, "c1") else { panic!() };
    assert_eq!(s.partial_input.as_deref(), Some(r#"{"co"#));
    // The stream is cut short: the durable reply says more than the deltas did.
    h.exec(Command::LlmCallFinished {
        call_id: call_id.clone(),
        attempt,
        outcome: Ok(final_reply("It is blue, I think", r#"{"color":"blue"}"#)),
    });
    live.catch_up(&h.log);
    live.check_actions();
    let replayed = project(&h);
    assert_eq!(live.chat(), replayed.chat(), "live and replayed chats are equal");
    let active = live.chat().active_turn.as_ref().unwrap();
    // `pick`, a client tool no client offers, runs asking a person for its result.
    assert_eq!(
        part_kinds(&active.response_parts),
        ["markdown:It is blue, I think", "toolCall:c1:running", "inputRequest:c1"]
    );
}

#[test]
fn a_reply_streamed_in_full_is_not_shown_twice() {
    let (mut h, mut live, call_id, attempt) = streaming("d2");
    live.delta(call_id.as_str(), &text("It is blue"));
    live.delta(call_id.as_str(), &arguments("c1", Some("pick"), "{}"));
    h.exec(Command::LlmCallFinished { call_id, attempt, outcome: Ok(final_reply("It is blue", "{}")) });
    let after = live.catch_up(&h.log);
    assert!(!types(&after).contains(&"chat/delta".to_owned()), "{:?}", types(&after));
    assert!(!types(&after).contains(&"chat/toolCallDelta".to_owned()), "{:?}", types(&after));
    assert_eq!(live.chat(), project(&h).chat());
}

#[test]
fn a_streamed_tool_call_runs_and_completes_in_place() {
    let (mut h, mut live, call_id, attempt) = streaming("d3");
    live.delta(call_id.as_str(), &arguments("c1", Some("pick"), "{}"));
    h.exec(Command::LlmCallFinished { call_id, attempt, outcome: Ok(final_reply("", "{}")) });
    h.exec(Command::Submit {
        input: ClientInput::ToolResult(ToolResultInput {
            id: "c1".into(),
            attempt: None,
            result: Some("red".into()),
        }),
        queue: false,
        origin: TurnOrigin::Client,
    });
    h.run_llm(reply("Red."));
    live.catch_up(&h.log);
    live.check_actions();
    let turn = last_turn(live.chat());
    assert_eq!(turn.state, TurnState::Complete);
    assert_eq!(
        part_kinds(&turn.response_parts),
        ["toolCall:c1:completed", "inputRequest:c1", "markdown:Red."]
    );
    assert_eq!(live.chat(), project(&h).chat());
}

#[test]
fn reasoning_streams_into_a_reasoning_part() {
    let (_, mut live, call_id, _) = streaming("d4");
    let thinking = |more: &str| StreamDelta { reasoning: Some(more.into()), ..Default::default() };
    assert_eq!(types(&live.delta(call_id.as_str(), &thinking("Blue is "))), ["chat/responsePart"]);
    assert_eq!(types(&live.delta(call_id.as_str(), &thinking("calm."))), ["chat/reasoning"]);
    let active = live.chat().active_turn.as_ref().unwrap();
    assert_eq!(part_kinds(&active.response_parts), ["reasoning:Blue is calm."]);
    live.check_actions();
}

#[test]
fn recorded_reasoning_ends_the_part_so_live_and_replayed_chats_are_equal() {
    let (mut h, mut live, call_id, attempt) = streaming("d6");
    let thinking = |more: &str| StreamDelta { reasoning: Some(more.into()), ..Default::default() };
    live.delta(call_id.as_str(), &thinking("Blue is "));
    live.delta(call_id.as_str(), &text("It is blue"));
    let mut response = final_reply("It is blue", "{}");
    response.reasoning = Some("Blue is calm, and they like calm.".into());
    h.exec(Command::LlmCallFinished { call_id, attempt, outcome: Ok(response) });
    live.catch_up(&h.log);
    live.check_actions();
    let replayed = project(&h);
    assert_eq!(live.chat(), replayed.chat(), "live and replayed chats are equal");
    let active = replayed.chat().active_turn.as_ref().unwrap();
    assert_eq!(
        part_kinds(&active.response_parts)[..2],
        ["reasoning:Blue is calm, and they like calm.", "markdown:It is blue"]
    );
}

#[test]
fn a_delta_of_a_call_that_is_not_running_shows_nothing() {
    let (mut h, mut live, call_id, attempt) = streaming("d5");
    assert!(live.delta("llm_unknown", &text("ghost")).is_empty());
    h.exec(Command::LlmCallFinished {
        call_id: call_id.clone(),
        attempt,
        outcome: Ok(final_reply("Done", "{}")),
    });
    live.catch_up(&h.log);
    // A late delta, after the durable reply: the part keeps exactly the recorded text.
    assert!(live.delta(call_id.as_str(), &text(" and more")).is_empty());
    let active = live.chat().active_turn.as_ref().unwrap();
    assert_eq!(part_kinds(&active.response_parts)[0], "markdown:Done");
}

#[test]
fn a_failed_attempts_streamed_parts_are_withdrawn_live_as_a_replay_never_had_them() {
    let (mut h, mut live, call_id, attempt) = streaming("d7");
    live.delta(call_id.as_str(), &text("It is gre"));
    live.delta(call_id.as_str(), &arguments("c1", Some("pick"), r#"{"co"#));
    // The attempt fails and another follows: its parts leave the live chat.
    let timeout = CallError::deadline_exceeded(attempt);
    h.exec(Command::LlmCallFinished { call_id: call_id.clone(), attempt, outcome: Err(timeout) });
    let withdrawn = live.catch_up(&h.log);
    assert_eq!(
        types(&withdrawn)[..2],
        ["chat/truncated", "chat/turnStarted"],
        "the open turn is shown again without them: {:?}",
        types(&withdrawn)
    );
    live.check_actions();
    assert_eq!(live.chat(), project(&h).chat(), "live equals replayed after the failure");
    assert!(live.chat().active_turn.as_ref().unwrap().response_parts.is_empty());

    // The next attempt streams and finishes: the chat is what a replay makes.
    h.advance(60_000);
    h.exec(Command::Tick);
    let (call_id, attempt) = h.claim_llm();
    live.catch_up(&h.log);
    live.delta(call_id.as_str(), &text("It is blue"));
    h.exec(Command::LlmCallFinished { call_id, attempt, outcome: Ok(final_reply("It is blue", "{}")) });
    live.catch_up(&h.log);
    live.check_actions();
    assert_eq!(live.chat(), project(&h).chat());

    // A terminal failure after streaming: withdrawn, then the turn's error.
    let (mut h, mut live, call_id, attempt) = streaming("d8");
    live.delta(call_id.as_str(), &text("Half an ans"));
    let failed = CallError::terminal("the provider refused the request");
    h.exec(Command::LlmCallFinished { call_id, attempt, outcome: Err(failed) });
    live.catch_up(&h.log);
    live.check_actions();
    assert_eq!(live.chat(), project(&h).chat());
    assert_eq!(last_turn(live.chat()).state, TurnState::Error);
}
