//! Golden traces of the canonical flows: the ordered event names.

mod common;
use common::*;
use turnstone_engine::protocol::*;
use turnstone_engine::session::*;

#[test]
fn plain_reply_engine_hosted() {
    let mut h = Harness::new("s1", init("demo", Some(agent("m")), false));
    assert_eq!(
        names(&h.log),
        ["session.created", "trigger.queued", "decision.opened", "decision.resolved", "agent.written"]
    );
    let events = h.ok(message("demo", "hello"));
    assert_eq!(
        names(&events),
        [
            "turn.started",
            "trigger.queued",
            "decision.opened",
            "decision.resolved",
            "message.recorded",
            "call.created"
        ]
    );
    let events = h.run_llm(reply("hi there"));
    assert_eq!(
        names(&events),
        [
            "call.dispatched",
            "call.settled",
            "trigger.queued",
            "call.reported",
            "decision.opened",
            "decision.resolved",
            "message.recorded",
            "turn.ended"
        ]
    );
    assert_eq!(h.path_texts(), ["User:hello", "Assistant:hi there"]);
    let turn = h.last_turn();
    assert_eq!(turn.status, TurnStatus::Completed);
    assert_eq!(turn.data, Some(serde_json::json!("hi there")));
    assert_eq!(turn.usage.tokens.get("prompt_tokens"), Some(&10));
    assert_eq!(h.session.usage.cost(), "0.001");
    assert!(h.session.plan(h.now).effects.is_empty());
}
