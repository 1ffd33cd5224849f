//! The budget of a plain engine-hosted turn: what it writes, as a store persists it.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::*;
use turnstone_engine::protocol::TreeNode;
use turnstone_engine::session::*;

/// What one commit writes, as the stores persist it: each event's JSON, each new message
/// node's JSON, and the head (the session serialized).
fn commit_bytes(session: &Session, events: &[Event]) -> (usize, usize, usize) {
    let event_bytes: usize = events.iter().map(|e| serde_json::to_vec(e).unwrap().len()).sum();
    let node_bytes: usize = events
        .iter()
        .filter_map(|e| match e {
            Event::MessageRecorded { message, parent_id } => {
                Some(TreeNode { message: message.clone(), parent_id: parent_id.clone() })
            }
            _ => None,
        })
        .map(|n| serde_json::to_vec(&n).unwrap().len())
        .sum();
    let head_bytes = serde_json::to_vec(session).unwrap().len();
    (event_bytes, node_bytes, head_bytes)
}

#[test]
fn measure() {
    let mut h = harness("s", init("demo", Some(agent("test-model")), false));
    for i in 1..=40 {
        let before = h.log.len();
        h.submit("hello");
        h.claim_llm();
        let c1 = commit_bytes(&h.session, &h.log[before..]);
        let mid = h.log.len();
        let call = h.session.calls()[0].id.clone();
        h.finish_llm((call, 1), "hi there");
        let c2 = commit_bytes(&h.session, &h.log[mid..]);
        if i == 1 || i == 40 {
            println!("turn {i}: {} events {:?}", h.log.len() - before, names(&h.log[before..]));
            println!("  commit1 {c1:?} commit2 {c2:?} total {}", c1.0 + c1.1 + c1.2 + c2.0 + c2.1 + c2.2);
            for e in &h.log[before..] {
                println!("    {}", serde_json::to_string(e).unwrap());
            }
            println!("  head {}", serde_json::to_string(&h.session).unwrap());
        }
    }
}
