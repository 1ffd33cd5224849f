//! Property tests of the JSON entry points: a client's input (`ClientInput`), a worker's answer
//! (`DecisionResponse`) and the model providers' streams (OpenAI chunks, Anthropic events), fed
//! random documents and valid documents with random parts replaced, dropped or cut. Whatever
//! comes in, parsing never panics; a refusal names what was wrong (a message, and a path when a
//! field is at fault); what is accepted survives a round trip through its wire form.
//!
//! `PROPTEST_CASES` sets how many documents each property tries (CI: the default below).

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Map, Value, json};
use turnstone_engine::llm_format::{anthropic, openai};
use turnstone_engine::protocol::{ClientInput, DecisionResponse, parse, parse_response, parse_slice};

/// Documents each property tries unless `PROPTEST_CASES` says otherwise.
const CASES: u32 = 2_000;

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(CASES);
    // No failure files in the source tree: a failing case is printed, minimal, in the output.
    Config { cases, failure_persistence: None, ..Config::default() }
}

/// Words the protocol uses, so random documents often hit real fields and tags.
const WORDS: &[&str] = &[
    "type",
    "agent_id",
    "turn_id",
    "message",
    "messages",
    "role",
    "content",
    "user",
    "assistant",
    "tool",
    "system",
    "text",
    "image_url",
    "url",
    "id",
    "attempt",
    "result",
    "error",
    "retryable",
    "payload",
    "interrupt_id",
    "name",
    "args",
    "actions",
    "agent",
    "state",
    "model",
    "tools",
    "tool_calls",
    "function",
    "arguments",
    "client.message",
    "client.messages",
    "client.action",
    "interrupt.resume",
    "tool.result",
    "tool.error",
    "tool.approval",
    "approved",
    "reason",
    "llm.call",
    "tool.call",
    "done",
    "interrupt",
    "sub_agent.spawn",
    "message.send",
    "session_id",
    "data",
    "retry",
    "timeout_secs",
    "max_retries",
    "stream",
    "client",
    "handler",
    "worker",
    "response",
    "choices",
    "delta",
    "index",
    "finish_reason",
    "usage",
    "content_block",
    "partial_json",
    "thinking",
    "input_json_delta",
    "text_delta",
];

fn word() -> impl Strategy<Value = String> {
    prop_oneof![3 => proptest::sample::select(WORDS).prop_map(str::to_owned), 1 => ".{0,6}"]
}

/// Any JSON value, up to a few levels deep, its keys and strings mostly protocol words.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        word().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map(word(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Valid documents to mutate.
fn client_inputs() -> Vec<Value> {
    vec![
        json!({"type": "client.message", "agent_id": "a", "turn_id": "t1", "message": {"role": "user", "content": "hi"}, "stream": true}),
        json!({"type": "client.messages", "agent_id": "a", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "client": {"tools": [{"name": "pick"}]}}),
        json!({"type": "client.action", "agent_id": "a", "name": "go", "args": {"x": 1}}),
        json!({"type": "interrupt.resume", "interrupt_id": "i1", "payload": {"answers": {}}}),
        json!({"type": "tool.result", "id": "c1", "attempt": 1, "result": "ok"}),
        json!({"type": "tool.error", "id": "c1", "error": "no", "retryable": false}),
        json!({"type": "tool.approval", "id": "c1", "approved": false, "reason": "no"}),
    ]
}

fn decision_responses() -> Vec<Value> {
    vec![json!({
        "messages": [{"role": "assistant", "content": "ok", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
        "actions": [
            {"type": "llm.call", "retry": {"timeout_secs": 30, "max_retries": 1, "backoff_base_secs": 1, "backoff_max_secs": 2}},
            {"type": "tool.call", "id": "c2", "name": "f", "arguments": {"a": 1}},
            {"type": "tool.result", "id": "c1", "result": "x"},
            {"type": "interrupt", "reason": "why", "payload": {"q": 1}},
            {"type": "sub_agent.spawn", "session_id": "s2", "agent_id": "helper", "tool_call_id": "c3"},
            {"type": "done", "data": {"ok": true}},
        ],
        "agent": {"model": "m", "tools": [{"name": "f", "input": {"type": "object"}}]},
        "state": {"n": 1},
    })]
}

/// `doc` with the node that `pick` lands on replaced by `with`, or dropped from its object or
/// array (`drop`); the whole document is only ever replaced.
fn mutate(doc: &Value, pick: u64, with: Value, drop: bool) -> Value {
    let mut nodes = Vec::new();
    collect(doc, String::new(), &mut nodes);
    let target = &nodes[(pick % nodes.len() as u64) as usize];
    let Some((parent, last)) = target.rsplit_once('/') else { return with };
    let key = last.replace("~1", "/").replace("~0", "~");
    let mut doc = doc.clone();
    match doc.pointer_mut(parent) {
        Some(Value::Object(map)) if drop => {
            map.remove(&key);
        }
        Some(Value::Array(items)) if drop => {
            items.remove(key.parse::<usize>().unwrap());
        }
        Some(Value::Object(map)) => {
            map.insert(key, with);
        }
        Some(Value::Array(items)) => items[key.parse::<usize>().unwrap()] = with,
        _ => unreachable!("a pointer's parent is an object or an array"),
    }
    doc
}

/// JSON pointers of every node of `value`.
fn collect(value: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match value {
        Value::Object(map) => map
            .iter()
            .for_each(|(k, v)| collect(v, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out)),
        Value::Array(items) => {
            items.iter().enumerate().for_each(|(i, v)| collect(v, format!("{at}/{i}"), out))
        }
        _ => {}
    }
}

/// A client input: accepted and round-tripping, or refused with a message.
fn check_client_input(doc: &Value) -> Result<(), TestCaseError> {
    match parse::<ClientInput>(doc.clone()) {
        Ok(input) => {
            let wire = serde_json::to_value(&input).unwrap();
            prop_assert_eq!(parse::<ClientInput>(wire).ok(), Some(input), "round trip of {}", doc);
        }
        Err(e) => prop_assert!(!e.message.is_empty(), "a refusal of {} says nothing", doc),
    }
    Ok(())
}

fn check_decision_response(bytes: &[u8]) -> Result<(), TestCaseError> {
    match parse_response(bytes) {
        Ok((response, _)) => {
            let wire = serde_json::to_vec(&response).unwrap();
            let again = parse_slice::<DecisionResponse>(&wire);
            prop_assert_eq!(again.ok(), Some(response), "round trip of {}", String::from_utf8_lossy(bytes));
        }
        Err(e) => prop_assert!(!e.message.is_empty()),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_document_as_a_client_input(doc in json()) {
        check_client_input(&doc)?;
    }

    #[test]
    fn a_client_input_with_a_part_replaced_or_dropped(
        which in 0usize..7, pick in any::<u64>(), with in json(), drop in any::<bool>(),
    ) {
        let doc = mutate(&client_inputs()[which], pick, with, drop);
        check_client_input(&doc)?;
    }

    #[test]
    fn a_client_input_cut_short_or_with_bytes_flipped(which in 0usize..7, cut in any::<u64>(), flip in any::<(u64, u8)>()) {
        let mut bytes = client_inputs()[which].to_string().into_bytes();
        let at = (flip.0 % bytes.len() as u64) as usize;
        bytes[at] ^= flip.1;
        bytes.truncate((cut % (bytes.len() as u64 + 1)) as usize);
        if let Err(e) = parse_slice::<ClientInput>(&bytes) {
            prop_assert!(!e.message.is_empty());
        }
    }

    #[test]
    fn a_decision_response_with_a_part_replaced_or_dropped(
        pick in any::<u64>(), with in json(), drop in any::<bool>(), cut in any::<u64>(),
    ) {
        let doc = mutate(&decision_responses()[0], pick, with, drop);
        check_decision_response(&serde_json::to_vec(&doc).unwrap())?;
        let mut bytes = doc.to_string().into_bytes();
        bytes.truncate((cut % (bytes.len() as u64 + 1)) as usize);
        check_decision_response(&bytes)?;
    }

    #[test]
    fn any_openai_stream(chunks in proptest::collection::vec(json(), 0..12)) {
        let mut stream = openai::StreamAccumulator::new();
        for chunk in &chunks {
            if let Err(e) = stream.push(chunk) {
                prop_assert!(!e.message.is_empty());
                return Ok(());
            }
        }
        if let Err(e) = stream.finish() {
            prop_assert!(!e.message.is_empty());
        }
    }

    #[test]
    fn any_anthropic_stream(events in proptest::collection::vec((word(), json()), 0..12)) {
        let mut stream = anthropic::StreamAccumulator::new();
        for (name, data) in &events {
            if let Err(e) = stream.push(name, data) {
                prop_assert!(!e.message.is_empty());
                return Ok(());
            }
        }
        if let Err(e) = stream.finish() {
            prop_assert!(!e.message.is_empty());
        }
    }
}

/// The documents the properties mutate are valid to begin with, so mutations start from
/// accepted input and the round trips are exercised.
#[test]
fn the_seed_documents_are_accepted() {
    for doc in client_inputs() {
        parse::<ClientInput>(doc.clone()).unwrap_or_else(|e| panic!("{doc}: {e}"));
    }
    for doc in decision_responses() {
        parse_response(doc.to_string().as_bytes()).unwrap_or_else(|e| panic!("{doc}: {e}"));
    }
}
