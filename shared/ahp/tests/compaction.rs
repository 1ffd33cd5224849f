//! A compaction of the model's view (`context.compacted` and its marker message) shows in the
//! turn it happened in: the summary, or a short note for a clearing, as a system notification;
//! live and replayed chats are equal, and every position in the log replays to the same chat.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use ahp::reducers::{ReduceOutcome, apply_action_to_chat};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{ResponsePart, SystemNotificationResponsePart, TurnState};
use common::*;
use turnstone_engine::ids::{CallId, MessageId};
use turnstone_engine::protocol::*;
use turnstone_engine::session::*;

const SUMMARY: &str = "The user asked two questions; both were answered.";

/// The summarizing call's response: 900 prompt and 100 completion tokens, one cent.
fn summary(text: &str) -> LlmResponse {
    let mut r = reply(text);
    r.model = "test-model".into();
    r.usage = Some(serde_json::json!({"prompt_tokens": 900, "completion_tokens": 100}));
    r.cost = Some("0.01".into());
    r
}

/// Two completed turns, then a third whose model call is claimed (its attempt running).
fn long_session(id: &str) -> (Driver, (CallId, u32)) {
    let mut h = harness(id, init("demo", Some(AgentConfig::new("m")), false));
    h.turn("first question", "first answer");
    h.turn("second question", "second answer");
    h.submit("third question");
    let call = h.claim_llm();
    (h, call)
}

/// The message before the head: the last one a compaction for the head's call may cover.
fn before_head(h: &Driver) -> MessageId {
    let path = h.session.tree().active_path();
    path[path.len() - 2].id.clone()
}

/// Compacts the view of claimed model call `call` through message `through`: a summary when
/// `response` is given, else a clearing of tool results.
fn compact(
    h: &mut Driver,
    (call_id, attempt): &(CallId, u32),
    through: MessageId,
    response: Option<LlmResponse>,
) {
    let kind = if response.is_some() { CompactionKind::Summary } else { CompactionKind::ClearedToolResults };
    h.exec(Command::Compact {
        call_id: call_id.clone(),
        attempt: *attempt,
        compaction: Compaction { kind, through },
        response,
        tokens_before: 12_345,
        tokens_after: 2_345,
        reason: "threshold".into(),
    });
}

/// The system notifications of `parts`.
fn notifications(parts: &[ResponsePart]) -> Vec<&SystemNotificationResponsePart> {
    parts
        .iter()
        .filter_map(|p| match p {
            ResponsePart::SystemNotification(n) => Some(n),
            _ => None,
        })
        .collect()
}

fn markdown(n: &SystemNotificationResponsePart) -> &str {
    match &n.content {
        StringOrMarkdown::Markdown { markdown } => markdown,
        StringOrMarkdown::Plain(text) => panic!("plain text, not markdown: {text}"),
    }
}

#[test]
fn a_summary_shows_in_its_turn_with_the_summary_text_and_counts_in_the_turns_usage() {
    let (mut h, call) = long_session("c1");
    let through = before_head(&h);
    compact(&mut h, &call, through, Some(summary(SUMMARY)));
    h.finish_llm(call, "third answer");
    let p = project(&h);
    let turn = last_turn(p.chat());
    assert_eq!(turn.state, TurnState::Complete);
    assert_eq!(turn.message.text, "third question");
    let kinds = part_kinds(&turn.response_parts);
    assert!(kinds[0].starts_with("SystemNotification("), "the compaction comes first: {kinds:?}");
    assert_eq!(kinds[1..], ["markdown:third answer"]);
    let [notice] = notifications(&turn.response_parts)[..] else { panic!("{kinds:?}") };
    let text = markdown(notice);
    assert!(text.starts_with("**Context compacted** (about 12,345 → 2,345 tokens)"), "{text}");
    assert!(text.ends_with(&format!("\n\n{SUMMARY}")), "the summary, whole: {text}");
    let meta = &notice.meta.as_ref().unwrap()["turnstoneCompaction"];
    let marker = h.session.tree().active_path().iter().find(|m| m.compaction.is_some()).unwrap().id.clone();
    assert_eq!(meta["kind"], "summary");
    assert_eq!(meta["markerId"], marker.as_str());
    assert_eq!((meta["tokensBefore"].as_u64(), meta["tokensAfter"].as_u64()), (Some(12_345), Some(2_345)));
    assert_eq!(meta["reason"], "threshold");
    // The turn's usage is the engine's: the summarizing call's and the reply's.
    let usage = turn.usage.as_ref().unwrap();
    let engine = h.last_turn().usage.counts();
    assert_eq!(usage.meta.as_ref().unwrap()["llmCalls"], 2);
    assert_eq!(usage.meta.as_ref().unwrap()["cost"], "0.0112");
    assert_eq!((usage.input_tokens, usage.output_tokens), (Some(912), Some(107)));
    assert_eq!(usage.input_tokens, Some(engine.input as i64));
    // The earlier turns are untouched: the log keeps everything, and so does the chat.
    assert_eq!(p.chat().turns.len(), 3);
    assert!(p.chat().turns[..2].iter().all(|t| notifications(&t.response_parts).is_empty()));
}

#[test]
fn a_clearing_shows_a_short_note_and_no_usage() {
    let (mut h, call) = long_session("c2");
    let through = before_head(&h);
    compact(&mut h, &call, through, None);
    let p = project(&h);
    let active = p.chat().active_turn.as_ref().expect("the turn runs on");
    let [notice] = notifications(&active.response_parts)[..] else { panic!("{:?}", active.response_parts) };
    let text = markdown(notice);
    assert!(
        text.starts_with("**Tool results cleared** from the model's view (about 12,345 → 2,345"),
        "{text}"
    );
    assert!(
        !text.contains("are sent to the model as stubs]"),
        "the marker's own sentence is not shown: {text}"
    );
    assert_eq!(notice.meta.as_ref().unwrap()["turnstoneCompaction"]["kind"], "cleared_tool_results");
    assert!(active.usage.is_none(), "a clearing calls no model");
}

#[test]
fn live_and_replayed_chats_are_equal_through_a_compaction_and_a_failed_attempt() {
    let (mut h, call) = long_session("c3");
    let mut live = Projected::new("c3");
    live.catch_up(&h.log);
    let through = before_head(&h);
    compact(&mut h, &call, through, Some(summary(SUMMARY)));
    let shown = live.catch_up(&h.log);
    assert_eq!(types(&shown), ["chat/responsePart", "chat/usage"]);
    // The attempt streams, then fails: what it streamed is withdrawn, the compaction stays (its
    // marker is in the log, and the next attempt reads from it).
    let text = StreamDelta { text: Some("third ans".into()), ..Default::default() };
    live.delta(call.0.as_str(), &text);
    h.exec(Command::LlmCallFinished {
        call_id: call.0.clone(),
        attempt: call.1,
        outcome: Err(CallError::deadline_exceeded(call.1)),
    });
    live.catch_up(&h.log);
    live.check_actions();
    assert_eq!(live.chat(), project(&h).chat(), "live equals replayed after the failure");
    let active = live.chat().active_turn.as_ref().unwrap();
    assert_eq!(notifications(&active.response_parts).len(), 1, "{:?}", active.response_parts);
    // The next attempt answers.
    h.advance(60_000);
    h.exec(Command::Tick);
    let next = h.claim_llm();
    live.catch_up(&h.log);
    live.delta(next.0.as_str(), &StreamDelta { text: Some("third".into()), ..Default::default() });
    h.finish_llm(next, "third answer");
    live.catch_up(&h.log);
    live.check_actions();
    let replayed = project(&h);
    assert_eq!(live.chat(), replayed.chat(), "live and replayed chats are equal");
    let kinds = part_kinds(&last_turn(replayed.chat()).response_parts);
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    assert_eq!(kinds[1], "markdown:third answer");
}

/// Every position a client can stand at in `h`'s chat (after event `e`'s first `c` actions,
/// `e * 2^20 + c` on the wire) is brought to the chat the log makes by what a reconnect sends:
/// the actions of event `e` past the `c`-th and those of every later event, from a projection
/// made again from the log (another host's, or a restarted one's). Returns each event's actions.
fn every_position_replays(h: &Driver) -> Vec<Vec<StateAction>> {
    let id = h.session.id().to_string();
    let project_log = || {
        let mut projection = ChatProjection::new(id.as_str());
        let slots: Vec<Vec<StateAction>> = h.log.iter().map(|e| projection.apply(e).unwrap()).collect();
        (projection, slots)
    };
    let (sent, seen) = project_log();
    let (_, replayed) = project_log();
    assert_eq!(seen, replayed, "a projection made again gives each event the same actions");
    // A client's first snapshot is taken after `session.created`, which sets the chat's own
    // fields with no action.
    let mut client = chat_from_log(id.as_str(), &h.log[..1]).unwrap();
    for (e, actions) in seen.iter().enumerate().skip(1) {
        for c in 0..=actions.len() {
            let mut chat = client.clone();
            for action in replayed[e][c..].iter().chain(replayed[e + 1..].iter().flatten()) {
                assert_eq!(apply_action_to_chat(&mut chat, action), ReduceOutcome::Applied, "{action:?}");
            }
            assert_eq!(&chat, sent.chat(), "from event {e} ({}), action {c}", h.log[e].name());
            if let Some(action) = actions.get(c) {
                assert_eq!(apply_action_to_chat(&mut client, action), ReduceOutcome::Applied);
            }
        }
    }
    seen
}

#[test]
fn a_compactions_actions_have_fixed_positions_in_the_log() {
    let (mut h, call) = long_session("c4");
    let through = before_head(&h);
    compact(&mut h, &call, through, Some(summary(SUMMARY)));
    h.finish_llm(call, "third answer");
    let slots = every_position_replays(&h);
    let at = |name: &str| h.log.iter().position(|e| e.name() == name).unwrap();
    let marker = h
        .log
        .iter()
        .rposition(|e| matches!(e, Event::MessageRecorded { message, .. } if message.compaction.is_some()));
    assert!(slots[marker.unwrap()].is_empty(), "the marker message shows nothing itself");
    assert_eq!(types(&slots[at("context.compacted")]), ["chat/responsePart", "chat/usage"]);
}

#[test]
fn a_sub_agents_compaction_shows_in_its_own_chat() {
    let mut agent = agent_with_tools();
    agent.sub_agents = Some(vec![SubAgent { id: "researcher".into(), description: None }]);
    let mut p = harness("p", init("boss", Some(agent), false));
    p.submit("find out X");
    p.run_llm(tool_calls(&[("t1", "researcher", r#"{"message":"look up X"}"#)]));
    let mut child = delegated(&mut p, agent_with_tools());
    // Two rounds of a client tool; the summary covers the first (a cut after a result).
    for id in ["c1", "c2"] {
        child.run_llm(tool_calls(&[(id, "pick", "{}")]));
        child.exec(client_result(id, "blue"));
    }
    let through =
        child.session.tree().active_path().iter().find(|m| m.role == Role::Tool).unwrap().id.clone();
    let call = child.claim_llm();
    compact(&mut child, &call, through, Some(summary(SUMMARY)));
    child.finish_llm(call, "X is 42");
    let projected = project(&child);
    every_position_replays(&child);
    let turn = last_turn(projected.chat());
    let [notice] = notifications(&turn.response_parts)[..] else { panic!("{:?}", turn.response_parts) };
    assert!(markdown(notice).ends_with(SUMMARY));
    // The parent's chat shows its own turn only.
    let parent = project(&p);
    let active = parent.chat().active_turn.as_ref().unwrap();
    assert!(notifications(&active.response_parts).is_empty());
}
