//! What a plain engine-hosted turn writes, counted as a store persists it (issue 12, item 3):
//! at most 8 events and 4 KB, at the first turn and the fortieth alike.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::*;
use turnstone_engine::protocol::{AgentConfig, TreeNode};
use turnstone_engine::session::*;

/// Bytes one commit writes, as `Commit::new_messages` and the SQLite store persist it: each
/// event's JSON, each new message node's JSON (`TreeNode`), and the head (the session as serde
/// writes it).
#[derive(Debug, Clone, Copy, Default)]
struct Written {
    events: usize,
    nodes: usize,
    head: usize,
}

impl Written {
    fn of(session: &Session, events: &[Event]) -> Self {
        let nodes = events
            .iter()
            .filter_map(|e| match e {
                Event::MessageRecorded { message, parent_id } => {
                    Some(TreeNode { message: message.clone(), parent_id: parent_id.clone() })
                }
                _ => None,
            })
            .map(|n| serde_json::to_vec(&n).unwrap().len())
            .sum();
        Written {
            events: events.iter().map(|e| serde_json::to_vec(e).unwrap().len()).sum(),
            nodes,
            head: serde_json::to_vec(session).unwrap().len(),
        }
    }

    fn total(&self) -> usize {
        self.events + self.nodes + self.head
    }
}

/// One plain turn ("hello" / "hi there") committed as the local host commits it: the submit
/// with the claim of its model call, then the model's answer. Returns the events and what each
/// commit wrote.
fn plain_turn(h: &mut Harness) -> (Vec<Event>, [Written; 2]) {
    let start = h.log.len();
    h.submit("hello");
    h.claim_llm();
    let first = Written::of(&h.session, &h.log[start..]);
    let middle = h.log.len();
    let call = h.session.calls()[0].id.clone();
    h.finish_llm((call, 1), "hi there");
    let second = Written::of(&h.session, &h.log[middle..]);
    (h.log[start..].to_vec(), [first, second])
}

/// An agent like the local host's demo one: a system prompt, a client tool with a schema, a
/// sub-agent.
fn demo_agent() -> AgentConfig {
    serde_json::from_value(serde_json::json!({
        "model": "scripted",
        "system": "You are a helpful demo agent. Ask before doing anything irreversible.",
        "stream": true,
        "tools": [{
            "name": "confirm",
            "description": "Ask the user a yes/no question and wait for the answer.",
            "input": {"type": "object", "properties": {"question": {"type": "string", "description": "The question to ask."}}, "required": ["question"]},
            "handler": "client"
        }],
        "sub_agents": [{"id": "researcher", "description": "Looks things up and reports back in a short summary."}]
    }))
    .unwrap()
}

#[test]
fn a_plain_engine_hosted_turn_writes_at_most_8_events_and_4_kb() {
    for config in [agent("test-model"), demo_agent()] {
        plain_turns_stay_lean(config);
    }
}

fn plain_turns_stay_lean(config: AgentConfig) {
    let mut h = harness("s", init("demo", Some(config), false));
    for turn in 1..=40 {
        let (events, commits) = plain_turn(&mut h);
        let total: usize = commits.iter().map(Written::total).sum();
        if turn == 1 || turn == 40 {
            println!(
                "turn {turn}: {} events {:?}; {total} bytes (commit 1 {:?}, commit 2 {:?})",
                events.len(),
                names(&events),
                commits[0],
                commits[1]
            );
        }
        // The first turn also names the session.
        let most = if turn == 1 { 9 } else { 8 };
        assert!(events.len() <= most, "turn {turn} wrote {} events: {:?}", events.len(), names(&events));
        assert!(total <= 4096, "turn {turn} wrote {total} bytes: {commits:?}");
    }
    assert_eq!(h.last_turn().status, TurnStatus::Completed);
    assert_eq!(h.session.tree().len(), 80);
    // Nothing a reader needs is lost: usage, the turn's record (rebuilt from the log too), the
    // transcript, and replay.
    assert_eq!(h.session.usage().llm_calls, 40);
    let last = h.last_turn().clone();
    assert_eq!(last.data, Some(serde_json::json!("hi there")));
    assert_eq!(turn_from_log(&last.id, &h.log), Some(last));
    assert_eq!(Session::replay("s", &h.log), h.session);
}

#[test]
fn a_head_and_a_log_written_before_lean_turns_still_load() {
    // A plain turn's head as it was written before (every field spelled out, the engine
    // defaults, the declared config as an agent version, the model call among the closed ones).
    let old_head = r#"{"id":"s","init":{"agent_id":"demo","identity":{"id":"owner-1"},"declared":{"model":"test-model"},"has_worker":false,"parent":null,"ancestry":[],"defaults":{"llm":{"timeout_secs":120,"max_retries":2,"backoff_base_secs":1,"backoff_max_secs":30},"tool":{"timeout_secs":300,"max_retries":0,"backoff_base_secs":1,"backoff_max_secs":30},"client_tool":{"timeout_secs":null,"max_retries":0,"backoff_base_secs":0,"backoff_max_secs":0},"sub_agent":{"timeout_secs":null,"max_retries":0,"backoff_base_secs":0,"backoff_max_secs":0},"decision":{"timeout_secs":30,"max_retries":3,"backoff_base_secs":1,"backoff_max_secs":30}}},"created_at":1796000000000,"tree":{"head":"llm_12a764fb66abc9cf"},"states":[],"agents":[{"anchor":null,"value":{"model":"test-model"}}],"calls":[],"closed_calls":[["llm_12a764fb66abc9cf","reported"]],"decision":null,"triggers":[],"turns":{"turn_1d0b14e4db018fed":{"id":"turn_1d0b14e4db018fed","status":"completed","origin":"client","submitted_at":1796000000000,"started_at":1796000000000,"ended_at":1796000000000,"data":"hi there","error":null,"usage":{"llm_calls":1,"tokens":{"completion_tokens":7,"prompt_tokens":12},"cost_picodollars":"1200000000"}}},"ended_order":["turn_1d0b14e4db018fed"],"past_turns":[],"turn_aliases":{},"active_turn":null,"queued_turns":[],"interrupts":[],"outbox":{},"next_outbox_seq":0,"usage":{"llm_calls":1,"tokens":{"completion_tokens":7,"prompt_tokens":12},"cost_picodollars":"1200000000"},"events_applied":19}"#;
    let session: Session = serde_json::from_str(old_head).unwrap();
    assert_eq!(session.defaults(), Defaults::default());
    assert_eq!(session.current_agent().map(|a| a.model.as_str()), Some("test-model"));
    assert_eq!(session.closed_call(&"llm_12a764fb66abc9cf".into()), Some(CallClosure::Reported));
    assert_eq!(session.usage().llm_calls, 1);
    // The events the engine no longer writes for engine-hosted steps still apply: the old
    // plain turn's log replays to the same turn (worker sessions still write all of them).
    let mut h = harness("w", init("w", Some(agent("m")), true));
    h.accept();
    h.exec(message("w", "hello"));
    h.accept();
    h.run_llm(reply("hi there"));
    h.accept();
    let log = names(&h.log);
    for old in ["trigger.queued", "decision.opened", "decision.resolved", "call.reported", "agent.written"] {
        assert!(log.contains(&old), "{old} in {log:?}");
    }
    assert_eq!(Session::replay("w", &h.log), h.session);
    assert_eq!(h.last_turn().data, Some(serde_json::json!("hi there")));
}

/// A worker agent's model calls refer to the agent config version in force instead of copying
/// its system prompt and tools: what the step writes does not grow with the agent's size, and
/// the request the call makes is the same as with a copy.
#[test]
fn a_worker_sessions_model_call_refers_to_its_agent_config_version() {
    let system = "Answer briefly and check your work. ".repeat(20);
    let mut written = Vec::new();
    for tools in [1usize, 20] {
        let mut config = agent("m");
        config.system = Some(system.clone());
        let declared: Vec<_> = (0..tools)
            .map(|i| {
                serde_json::from_value(serde_json::json!({
                    "name": format!("tool_{i}"),
                    "description": "Looks something up in the records. ".repeat(5),
                    "input": {"type": "object", "properties": {"query": {"type": "string"}}}
                }))
                .unwrap()
            })
            .collect();
        config.tools = Some(declared);
        let mut h = harness("w", init("w", Some(config), true));
        h.accept();
        h.exec(message("w", "hello"));
        let start = h.log.len();
        h.accept();
        let created: Vec<String> = h.log[start..]
            .iter()
            .filter(|e| matches!(e, Event::CallCreated { .. }))
            .map(|e| serde_json::to_string(e).unwrap())
            .collect();
        assert_eq!(created.len(), 1, "{:?}", names(&h.log[start..]));
        assert!(!created[0].contains("Answer briefly") && !created[0].contains("tool_0"), "{}", created[0]);
        let call = h.session.calls().iter().find(|c| c.is_server_llm()).expect("the model call");
        let request = h.session.llm_request(call).expect("its request");
        assert_eq!(request.messages[0].content_text(), system, "the system prompt of its version");
        assert_eq!(request.tools.map(|t| t.len()), Some(tools), "the tools of its version");
        written.push(created[0].len());
    }
    assert_eq!(written[0], written[1], "call.created is the same size for 1 tool and 20");
}
