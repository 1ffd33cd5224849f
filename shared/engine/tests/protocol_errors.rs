//! Parse errors of the decision protocol (seed 000): each names the offending field's path
//! and says what is wrong there.
//!
//! Covered: an unknown, a missing and a non-string tag for every tagged union (`Trigger`,
//! `Action`, `ClientInput`, `ContentPart`, `ToolInput`), directly and nested; missing required
//! fields (including the required-but-nullable `T | null` ones); unknown fields on the strict
//! types (several are spellings from later Substructure docs that seed 000 does not have);
//! wrong types deep inside a document; `Content`'s own errors; and `state: null` / omitted.

#![cfg(test)]

use std::fmt::Debug;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use turnstone_engine::protocol::*;

/// The error of parsing `text` as `T`; fails the test if it parses.
fn error<T: DeserializeOwned + Debug>(text: &str) -> ProtocolError {
    match parse_str::<T>(text) {
        Ok(value) => panic!("expected an error, parsed {value:?}\nfrom {text}"),
        Err(err) => err,
    }
}

/// Asserts that `doc` fails to parse as `T` with exactly this path and message.
#[track_caller]
fn assert_error<T: DeserializeOwned + Debug>(doc: &Value, path: &str, message: &str) {
    let err = error::<T>(&doc.to_string());
    assert_eq!((err.path.as_str(), err.message.as_str()), (path, message), "for {doc}");
}

/// `doc` with the value at JSON pointer `pointer` replaced (or added, for a missing key).
fn with(mut doc: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    match doc.pointer_mut(parent).expect("the parent exists") {
        Value::Object(map) => {
            map.insert(key.to_string(), value);
        }
        Value::Array(items) => items[key.parse::<usize>().expect("an index")] = value,
        other => panic!("cannot set {key} in {other}"),
    }
    doc
}

/// `doc` without the object key at `pointer`.
fn without(mut doc: Value, pointer: &str) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    let removed = doc.pointer_mut(parent).and_then(Value::as_object_mut).and_then(|map| map.remove(key));
    assert!(removed.is_some(), "{pointer} is not in the document");
    doc
}

/// A valid decision request with something at every level the tests reach into.
fn request() -> Value {
    json!({
        "session_id": "s1",
        "decision_id": "d1",
        "agent_id": "assistant",
        "identity": { "id": "user_42", "metadata": { "team": "core" } },
        "trigger": {
            "type": "client.messages",
            "messages": [
                { "role": "user", "content": [{ "type": "text", "text": "hi" }, { "type": "text", "text": "there" }] }
            ],
            "new_from": 0,
            "client": {}
        },
        "proposed": {
            "actions": [
                { "type": "llm.call", "retry": { "timeout_secs": 30, "max_retries": 1, "backoff_base_secs": 1, "backoff_max_secs": 2 } }
            ]
        },
        "state": { "turns": 1 },
        "agent": {
            "model": "x",
            "retry": { "timeout_secs": null, "max_retries": 0, "backoff_base_secs": 0, "backoff_max_secs": 0 },
            "tools": [{ "name": "get_weather", "handler": "worker" }]
        },
        "calls": [{ "id": "c1", "kind": "tool_call", "status": "pending", "attempt": 1 }],
        "pending_calls": 1,
        "messages": [
            { "id": "m1", "role": "user", "content": [{ "type": "text", "text": "hi" }, { "type": "text", "text": "there" }] },
            { "id": "m2", "role": "assistant", "tool_calls": [{ "id": "c1", "type": "function", "function": { "name": "get_weather", "arguments": "{}" } }] }
        ],
        "message_tree": {
            "nodes": [
                { "message": { "id": "m1", "role": "user", "content": "hi" } },
                { "message": { "id": "m2", "role": "assistant" }, "parent_id": "m1" }
            ],
            "head_id": "m2"
        },
        "ancestry": [],
        "attempts": 1,
        "deadline": null,
        "turn_id": "t1"
    })
}

/// A valid decision response with an action of each shape the tests reach into.
fn response() -> Value {
    json!({
        "actions": [
            {
                "type": "llm.call",
                "messages": [{ "role": "system", "content": "be brief" }, { "role": "user", "content": "hi" }],
                "tools": [{ "name": "search", "description": "Search." }],
                "reasoning": { "effort": "low" }
            },
            { "type": "tool.call", "name": "lookup", "arguments": {} },
            { "type": "done" }
        ]
    })
}

#[test]
fn the_fixtures_of_this_file_are_valid() {
    parse::<DecisionRequest>(request()).expect("request() parses");
    parse::<DecisionResponse>(response()).expect("response() parses");
}

// ---- tags of the tagged unions ----

const TRIGGERS: &str = "session.start, client.messages, client.action, tool.execute, tool.finished, llm.execute, \
                        llm.finished, sub_agent.finished, interrupt.resumed";
const ACTIONS: &str = "llm.call, tool.call, tool.result, tool.error, llm.result, llm.error, sub_agent.spawn, \
                       message.send, interrupt, done";
const INPUTS: &str = "client.message, client.messages, client.action, interrupt.resume, tool.result, tool.error, tool.approval";
const PARTS: &str = "text, image_url, file, input_audio, video_url";

#[test]
fn trigger_tags() {
    assert_error::<Trigger>(
        &json!({ "type": "tool.executed", "id": "c1" }),
        "type",
        &format!("unknown trigger \"tool.executed\" (expected one of: {TRIGGERS})"),
    );
    assert_error::<Trigger>(&json!({ "id": "c1" }), "type", "missing trigger type");
    assert_error::<Trigger>(&json!({ "type": 7 }), "type", "the trigger type must be a string, not a number");
    // Nested in a request. `turn.finished` is a trigger of later Substructure docs, not of seed 000.
    assert_error::<DecisionRequest>(
        &with(
            request(),
            "/trigger",
            json!({ "type": "turn.finished", "turn_id": "t1", "cost": "0", "usage": {} }),
        ),
        "trigger.type",
        &format!("unknown trigger \"turn.finished\" (expected one of: {TRIGGERS})"),
    );
    assert_error::<DecisionRequest>(
        &without(request(), "/trigger/type"),
        "trigger.type",
        "missing trigger type",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/trigger/type", Value::Null),
        "trigger.type",
        "the trigger type must be a string, not null",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/trigger", json!("session.start")),
        "trigger",
        "invalid type: string \"session.start\", expected an object with a \"type\" field",
    );
}

#[test]
fn action_tags() {
    assert_error::<DecisionResponse>(
        &with(response(), "/actions/2", json!({ "type": "tool.cal", "name": "lookup" })),
        "actions[2].type",
        &format!("unknown action \"tool.cal\" (expected one of: {ACTIONS})"),
    );
    // Names from other versions of the Substructure docs: the seed's names win.
    for old in [
        "spawn.sub_agent",
        "send.message",
        "call.llm",
        "effect.result",
        "interrupt.resolve",
        "connector.sync",
    ] {
        assert_error::<DecisionResponse>(
            &with(response(), "/actions/0", json!({ "type": old })),
            "actions[0].type",
            &format!("unknown action {old:?} (expected one of: {ACTIONS})"),
        );
    }
    assert_error::<DecisionResponse>(
        &without(response(), "/actions/1/type"),
        "actions[1].type",
        "missing action type",
    );
    assert_error::<DecisionResponse>(
        &with(response(), "/actions/1/type", json!(["tool.call"])),
        "actions[1].type",
        "the action type must be a string, not an array",
    );
    assert_error::<DecisionResponse>(
        &with(response(), "/actions/2", json!("done")),
        "actions[2]",
        "invalid type: string \"done\", expected an object with a \"type\" field",
    );
    assert_error::<Action>(
        &json!([]),
        "",
        "invalid type: sequence, expected an object with a \"type\" field",
    );
    assert_error::<Action>(&json!({ "type": 1.5 }), "type", "the action type must be a string, not a number");
}

#[test]
fn client_input_tags() {
    // `client.append` exists in later Substructure docs, not in seed 000.
    assert_error::<ClientInput>(
        &json!({ "type": "client.append", "agent_id": "a", "messages": [] }),
        "type",
        &format!("unknown client input \"client.append\" (expected one of: {INPUTS})"),
    );
    assert_error::<ClientInput>(&json!({ "agent_id": "a" }), "type", "missing client input type");
    assert_error::<ClientInput>(
        &json!({ "type": true, "agent_id": "a" }),
        "type",
        "the client input type must be a string, not a boolean",
    );
}

#[test]
fn content_part_tags() {
    assert_error::<DecisionRequest>(
        &with(request(), "/trigger/messages/0/content/1/type", json!("image")),
        "trigger.messages[0].content[1].type",
        &format!("unknown content part \"image\" (expected one of: {PARTS})"),
    );
    assert_error::<DecisionRequest>(
        &without(request(), "/messages/0/content/0/type"),
        "messages[0].content[0].type",
        "missing content part type",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/messages/0/content/1/type", json!({ "kind": "text" })),
        "messages[0].content[1].type",
        "the content part type must be a string, not an object",
    );
    assert_error::<ContentPart>(
        &json!({ "type": "audio" }),
        "type",
        &format!("unknown content part \"audio\" (expected one of: {PARTS})"),
    );
}

#[test]
fn tool_input_tags() {
    let execute = |input: Value| {
        with(
            request(),
            "/trigger",
            json!({ "type": "tool.execute", "id": "c1", "name": "f", "arguments": "{}", "input": input, "attempt": 1 }),
        )
    };
    assert_error::<DecisionRequest>(
        &execute(json!({ "status": "ok", "value": {} })),
        "trigger.input.status",
        "unknown tool input \"ok\" (expected one of: valid, invalid, malformed)",
    );
    assert_error::<DecisionRequest>(
        &execute(json!({ "value": {} })),
        "trigger.input.status",
        "missing tool input status",
    );
    assert_error::<DecisionRequest>(
        &execute(json!({ "status": 1, "value": {} })),
        "trigger.input.status",
        "the tool input status must be a string, not a number",
    );
    assert_error::<DecisionRequest>(
        &execute(json!({ "status": "invalid", "value": {} })),
        "trigger.input.error",
        "missing field `error`",
    );
    assert_error::<DecisionRequest>(
        &execute(json!({ "status": "valid", "value": {}, "error": "x" })),
        "trigger.input.error",
        "unknown field `error`, expected `value`",
    );
}

// ---- missing required fields ----

#[test]
fn missing_required_fields() {
    assert_error::<DecisionRequest>(
        &without(request(), "/session_id"),
        "session_id",
        "missing field `session_id`",
    );
    assert_error::<DecisionRequest>(&without(request(), "/state"), "state", "missing field `state`");
    // `T | null` fields are required: null is allowed, omission is not.
    for field in ["agent", "deadline", "turn_id"] {
        assert_error::<DecisionRequest>(
            &without(request(), &format!("/{field}")),
            field,
            &format!("missing field `{field}`"),
        );
    }
    assert_error::<DecisionRequest>(
        &without(request(), "/agent/retry/timeout_secs"),
        "agent.retry.timeout_secs",
        "missing field `timeout_secs`",
    );
    assert_error::<DecisionRequest>(
        &without(request(), "/agent/model"),
        "agent.model",
        "missing field `model`",
    );
    assert_error::<DecisionRequest>(
        &without(request(), "/trigger/client"),
        "trigger.client",
        "missing field `client`",
    );
    assert_error::<DecisionRequest>(
        &without(request(), "/messages/1/id"),
        "messages[1].id",
        "missing field `id`",
    );
    assert_error::<DecisionRequest>(
        &without(request(), "/calls/0/attempt"),
        "calls[0].attempt",
        "missing field `attempt`",
    );
    assert_error::<DecisionRequest>(
        &without(request(), "/message_tree/nodes/1/message"),
        "message_tree.nodes[1].message",
        "missing field `message`",
    );
    assert_error::<DecisionResponse>(
        &without(response(), "/actions/1/name"),
        "actions[1].name",
        "missing field `name`",
    );
    assert_error::<DecisionResponse>(
        &without(response(), "/actions/1/arguments"),
        "actions[1].arguments",
        "missing field `arguments`",
    );
    assert_error::<DecisionResponse>(
        &without(response(), "/actions/0/tools/0/description"),
        "actions[0].tools[0].description",
        "missing field `description`",
    );
    assert_error::<DecisionResponse>(
        &without(response(), "/actions/0/messages/1/role"),
        "actions[0].messages[1].role",
        "missing field `role`",
    );
    assert_error::<ClientInput>(
        &json!({ "type": "tool.error", "id": "c1", "error": "no" }),
        "retryable",
        "missing field `retryable`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/messages/0/content/0", json!({ "type": "image_url", "image_url": {} })),
        "messages[0].content[0].image_url.url",
        "missing field `url`",
    );
    assert_error::<Action>(&json!({ "type": "tool.result" }), "result", "missing field `result`");
    assert_error::<Action>(
        &json!({ "type": "llm.result", "id": "l1" }),
        "response",
        "missing field `response`",
    );
}

#[test]
fn nullable_fields_take_null() {
    let mut doc = request();
    for field in ["agent", "deadline", "turn_id", "state"] {
        doc = with(doc, &format!("/{field}"), Value::Null);
    }
    let req: DecisionRequest = parse(doc).expect("nulls parse");
    assert_eq!((req.agent, req.deadline, req.turn_id, req.state), (None, None, None, Value::Null));
    let policy: RetryPolicy = parse(
        json!({ "timeout_secs": null, "max_retries": 0, "backoff_base_secs": 0, "backoff_max_secs": 0 }),
    )
    .expect("null timeout");
    assert_eq!(policy, RetryPolicy::NONE);
}

// ---- unknown fields on strict types ----

#[test]
fn unknown_fields_are_refused() {
    // `channels` is a DecisionResponse field of later Substructure docs.
    assert_error::<DecisionResponse>(
        &json!({ "channels": { "slack": {} } }),
        "channels",
        "unknown field `channels`, expected one of `messages`, `actions`, `state`, `agent`",
    );
    // `tenant_id` and `transcript` are from the first Substructure protocol docs.
    assert_error::<DecisionRequest>(
        &with(request(), "/transcript", json!([])),
        "transcript",
        "unknown field `transcript`, expected one of `session_id`, `decision_id`, `agent_id`, `identity`, `trigger`, \
         `proposed`, `state`, `agent`, `calls`, `pending_calls`, `messages`, `message_tree`, `ancestry`, `attempts`, \
         `deadline`, `turn_id`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/identity/tenant_id", json!("t")),
        "identity.tenant_id",
        "unknown field `tenant_id`, expected `id` or `metadata`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/agent/mcp", json!([])),
        "agent.mcp",
        "unknown field `mcp`, expected one of `model`, `system`, `stream`, `handler`, `format`, `retry`, `tools`, `sub_agents`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/agent/retry/max_attempts", json!(3)),
        "agent.retry.max_attempts",
        "unknown field `max_attempts`, expected one of `timeout_secs`, `max_retries`, `backoff_base_secs`, `backoff_max_secs`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/agent/tools/0/defer", json!(true)),
        "agent.tools[0].defer",
        "unknown field `defer`, expected one of `name`, `description`, `input`, `output`, `handler`, `approval`, `mcp`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/calls/0/tool_call_id", json!("c0")),
        "calls[0].tool_call_id",
        "unknown field `tool_call_id`, expected one of `id`, `kind`, `status`, `attempt`, `deadline`, `anchor`, `name`, \
         `arguments`, `handler`, `stream`, `agent_id`, `session_id`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/trigger", json!({ "type": "session.start", "agent_id": "a" })),
        "trigger.agent_id",
        "unknown field `agent_id`, there are no fields",
    );
    assert_error::<DecisionResponse>(
        &with(response(), "/actions/0/llm", json!("cheap")),
        "actions[0].llm",
        "unknown field `llm`, expected one of `id`, `model`, `messages`, `tools`, `temperature`, `max_completion_tokens`, \
         `reasoning`, `stream`, `retry`, `handler`",
    );
    assert_error::<DecisionResponse>(
        &with(
            response(),
            "/actions/2",
            json!({ "type": "sub_agent.spawn", "session_id": "s", "agent_id": "poet", "tool_call_id": "c", "message": { "role": "user" } }),
        ),
        "actions[2].message",
        "unknown field `message`, expected one of `session_id`, `agent_id`, `tool_call_id`, `retry`",
    );
    assert_error::<ClientInput>(
        &json!({ "type": "client.message", "agent_id": "a", "message": { "role": "user" }, "queue": true }),
        "queue",
        "unknown field `queue`, expected one of `agent_id`, `turn_id`, `message`, `stream`, `client`",
    );
}

// ---- wrong types deep in a document ----

#[test]
fn wrong_types_deep_in_a_request() {
    assert_error::<DecisionRequest>(
        &with(request(), "/calls/0/status", json!("done")),
        "calls[0].status",
        "unknown variant `done`, expected one of `pending`, `completed`, `failed`, `retry_scheduled`, `queued`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/calls/0/kind", json!("connector_sync")),
        "calls[0].kind",
        "unknown variant `connector_sync`, expected one of `tool_call`, `llm_call`, `sub_agent`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/messages/0/content/1/text", json!(5)),
        "messages[0].content[1].text",
        "invalid type: integer `5`, expected a string",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/trigger/messages/0/content/1/text", json!(false)),
        "trigger.messages[0].content[1].text",
        "invalid type: boolean `false`, expected a string",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/message_tree/nodes/1/message/role", json!("bot")),
        "message_tree.nodes[1].message.role",
        "unknown variant `bot`, expected one of `system`, `user`, `assistant`, `tool`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/agent/tools/0/handler", json!("engine")),
        "agent.tools[0].handler",
        "unknown variant `engine`, expected one of `worker`, `client`, `server`",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/proposed/actions/0/retry/timeout_secs", json!("30s")),
        "proposed.actions[0].retry.timeout_secs",
        "invalid type: string \"30s\", expected f64",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/identity/metadata/team", json!(7)),
        "identity.metadata.team",
        "invalid type: integer `7`, expected a string",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/pending_calls", json!(-1)),
        "pending_calls",
        "invalid value: integer `-1`, expected usize",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/trigger/new_from", json!("0")),
        "trigger.new_from",
        "invalid type: string \"0\", expected usize",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/messages/1/tool_calls/0/function/arguments", json!({})),
        "messages[1].tool_calls[0].function.arguments",
        "invalid type: map, expected a string",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/ancestry", json!("s0")),
        "ancestry",
        "invalid type: string \"s0\", expected a sequence",
    );
}

#[test]
fn wrong_types_deep_in_a_response() {
    assert_error::<DecisionResponse>(
        &with(response(), "/actions/0/messages/1/role", json!("robot")),
        "actions[0].messages[1].role",
        "unknown variant `robot`, expected one of `system`, `user`, `assistant`, `tool`",
    );
    assert_error::<DecisionResponse>(
        &with(response(), "/actions/0/handler", json!("client")),
        "actions[0].handler",
        "unknown variant `client`, expected `server` or `worker`",
    );
    assert_error::<DecisionResponse>(
        &with(response(), "/actions/0/reasoning/effort", json!("max")),
        "actions[0].reasoning.effort",
        "unknown variant `max`, expected one of `xhigh`, `high`, `medium`, `low`, `minimal`, `none`",
    );
    assert_error::<DecisionResponse>(
        &with(response(), "/actions/0/max_completion_tokens", json!(1.5)),
        "actions[0].max_completion_tokens",
        "invalid type: floating point `1.5`, expected u64",
    );
    assert_error::<DecisionResponse>(
        &with(response(), "/actions/2", json!({ "type": "tool.error", "error": "no", "code": "timeout" })),
        "actions[2].code",
        "unknown variant `timeout`, expected one of `provider_error`, `rate_limited`, `refused`, `budget_exceeded`, `deadline_exceeded`",
    );
    assert_error::<DecisionResponse>(
        &with(
            response(),
            "/actions/2",
            json!({ "type": "tool.error", "error": { "message": "no", "code": "refused" } }),
        ),
        "actions[2].error",
        "invalid type: map, expected a string",
    );
    assert_error::<DecisionResponse>(
        &with(
            response(),
            "/actions/2",
            json!({ "type": "message.send", "session_id": "s", "message": { "role": "user", "content": [{ "type": "file", "file": { "filename": "a" } }] } }),
        ),
        "actions[2].message.content[0].file.file_data",
        "missing field `file_data`",
    );
    // Later docs make tool.finished's result a StoredResult object; seed 000 has a string.
    assert_error::<Trigger>(
        &json!({ "type": "tool.finished", "id": "c", "ok": true, "name": "f", "result": { "content": [] } }),
        "result",
        "invalid type: map, expected a string",
    );
    assert_error::<Trigger>(
        &json!({ "type": "llm.finished", "id": "l", "ok": false, "truncated": false, "code": "timeout" }),
        "code",
        "unknown variant `timeout`, expected one of `provider_error`, `rate_limited`, `refused`, `budget_exceeded`, `deadline_exceeded`",
    );
    assert_error::<ClientInput>(
        &json!({ "type": "client.messages", "agent_id": "a", "messages": [], "client": { "tools": [{ "description": "x" }] } }),
        "client.tools[0].name",
        "missing field `name`",
    );
}

// ---- Content ----

#[test]
fn content_is_a_string_or_an_array_of_parts() {
    let message = |content: Value| json!({ "id": "m1", "role": "user", "content": content });
    let parsed: Message = parse(message(json!("hi"))).expect("string content");
    assert_eq!(parsed.content, Some(Content::Text("hi".into())));
    let parsed: Message = parse(message(json!([{ "type": "text", "text": "a" }]))).expect("parts");
    assert_eq!(parsed.content, Some(Content::Parts(vec![ContentPart::Text { text: "a".into() }])));
    let parsed: Message = parse(message(Value::Null)).expect("null content");
    assert_eq!(parsed.content, None);

    let expected = "expected a string or an array of content parts";
    assert_error::<Message>(&message(json!(5)), "content", &format!("invalid type: integer `5`, {expected}"));
    assert_error::<Message>(
        &message(json!({ "type": "text", "text": "a" })),
        "content",
        &format!("invalid type: map, {expected}"),
    );
    assert_error::<Message>(
        &message(json!(true)),
        "content",
        &format!("invalid type: boolean `true`, {expected}"),
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/messages/0/content", json!(5)),
        "messages[0].content",
        &format!("invalid type: integer `5`, {expected}"),
    );
    assert_error::<Content>(
        &json!(["hi"]),
        "[0]",
        "invalid type: string \"hi\", expected an object with a \"type\" field",
    );
    assert_error::<Content>(&json!([{ "type": "text" }]), "[0].text", "missing field `text`");
}

// ---- state: null and omitted ----

#[test]
fn response_state_null_and_omitted_both_keep_the_state() {
    let omitted: DecisionResponse = parse_str(r#"{"actions":[{"type":"done"}]}"#).expect("omitted");
    let null: DecisionResponse = parse_str(r#"{"actions":[{"type":"done"}],"state":null}"#).expect("null");
    assert_eq!(omitted.state, None);
    assert_eq!(null.state, None);
    assert_eq!(omitted, null);
    assert!(parse_str::<DecisionResponse>(r#"{"state":null}"#).expect("only null state").is_empty());
    // Anything else replaces it, including an empty object.
    let cleared: DecisionResponse = parse_str(r#"{"state":{}}"#).expect("empty object");
    assert_eq!(cleared.state, Some(json!({})));
    let zero: DecisionResponse = parse_str(r#"{"state":0}"#).expect("zero");
    assert_eq!(zero.state, Some(json!(0)));
    // The same inside a request's proposal.
    let req: DecisionRequest =
        parse(with(request(), "/proposed/state", Value::Null)).expect("proposed null state");
    assert_eq!(req.proposed.state, None);
}

// ---- text-level errors ----

#[test]
fn syntax_errors_keep_their_position() {
    let err = error::<DecisionResponse>(r#"{"actions":[{"type":"done"},]}"#);
    assert_eq!((err.path.as_str(), err.message.as_str()), ("actions", "trailing comma at line 1 column 29"));
    let err = error::<DecisionResponse>(r#"{"state":"#);
    assert_eq!(
        (err.path.as_str(), err.message.as_str()),
        ("state", "EOF while parsing a value at line 1 column 9")
    );
    let err = error::<DecisionResponse>("{} {}");
    assert_eq!((err.path.as_str(), err.message.as_str()), ("", "trailing characters at line 1 column 4"));
    let err = parse_slice::<DecisionResponse>(b"{\"state\":\"\xff\"}").expect_err("not UTF-8");
    assert_eq!(err.path, "");
    assert!(err.message.starts_with("not UTF-8: "), "{}", err.message);
}

#[test]
fn errors_display_as_path_colon_message() {
    let err =
        error::<DecisionResponse>(&with(response(), "/actions/2", json!({ "type": "tool.cal" })).to_string());
    assert_eq!(
        err.to_string(),
        format!("actions[2].type: unknown action \"tool.cal\" (expected one of: {ACTIONS})")
    );
    let err = error::<DecisionRequest>(&with(request(), "/calls/0/status", json!("done")).to_string());
    assert_eq!(
        err.to_string(),
        "calls[0].status: unknown variant `done`, expected one of `pending`, `completed`, `failed`, \
         `retry_scheduled`, `queued`"
    );
}

// ---- objects only ----

#[test]
fn structs_are_objects_never_arrays() {
    // serde's derive also reads a struct from an array of its fields in order; the protocol's
    // structs are JSON objects, so `[]` is not an empty decision that leaves a call open.
    assert_error::<DecisionResponse>(
        &json!([]),
        "",
        "invalid type: sequence, expected struct DecisionResponse",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/agent", json!(["gpt-4.1"])),
        "agent",
        "invalid type: sequence, expected struct AgentConfig",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/agent/retry", json!([null, 0, 0, 0])),
        "agent.retry",
        "invalid type: sequence, expected struct RetryPolicy",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/messages/0", json!(["m1", "user"])),
        "messages[0]",
        "invalid type: sequence, expected struct Message",
    );
    assert_error::<DecisionRequest>(
        &with(request(), "/messages/1/tool_calls/0/function", json!(["f", "{}"])),
        "messages[1].tool_calls[0].function",
        "invalid type: sequence, expected struct FunctionCall",
    );
    assert_error::<ClientInput>(
        &json!({ "type": "client.message", "agent_id": "a", "message": ["user"] }),
        "message",
        "invalid type: sequence, expected struct DraftMessage",
    );
    assert_error::<StreamDelta>(&json!(["hel"]), "", "invalid type: sequence, expected struct StreamDelta");
    assert_error::<ReasoningConfig>(
        &json!("high"),
        "",
        "invalid type: string \"high\", expected struct ReasoningConfig",
    );
}

// ---- worker answers are read leniently ----

/// The lenient parse of a worker's answer: the response and the ignored fields' paths.
fn lenient(doc: &Value) -> (DecisionResponse, Vec<String>) {
    parse_response(doc.to_string().as_bytes()).unwrap_or_else(|e| panic!("{e}\nfor {doc}"))
}

#[test]
fn unknown_fields_in_a_worker_answer_are_ignored_and_named() {
    // Unknown fields everywhere a response reaches: the response, an action, its messages,
    // tools, reasoning and retry, an agent config with its tools and retry, a message, its
    // content parts and tool calls.
    let doc = with(response(), "/session_id", json!("s1"));
    let doc = with(doc, "/actions/0/trace", json!({ "span": 1 }));
    let doc = with(doc, "/actions/0/messages/1/x_name", json!("bob"));
    let doc = with(doc, "/actions/0/tools/0/strict", json!(true));
    let doc = with(doc, "/actions/0/reasoning/summary", json!("auto"));
    let doc = with(
        doc,
        "/actions/1/retry",
        json!({ "timeout_secs": null, "max_retries": 0, "backoff_base_secs": 0, "backoff_max_secs": 0, "jitter": true }),
    );
    let doc = with(
        doc,
        "/agent",
        json!({ "model": "m", "mcp": [], "tools": [{ "name": "t", "defer": true }], "sub_agents": [{ "id": "poet", "x": 1 }] }),
    );
    let doc = with(
        doc,
        "/messages",
        json!([
            { "role": "user", "content": [{ "type": "text", "text": "hi", "cache_control": {} }], "refusal": null },
            { "role": "assistant", "tool_calls": [{ "id": "c1", "type": "function", "index": 0, "function": { "name": "f", "arguments": "{}", "parsed": {} } }] }
        ]),
    );
    let (parsed, mut ignored) = lenient(&doc);
    ignored.sort();
    let mut expected = vec![
        "session_id",
        "actions[0].trace",
        "actions[0].messages[1].x_name",
        "actions[0].tools[0].strict",
        "actions[0].reasoning.summary",
        "actions[1].retry.jitter",
        "agent.mcp",
        "agent.tools[0].defer",
        "agent.sub_agents[0].x",
        "messages[0].content[0].cache_control",
        "messages[0].refusal",
        "messages[1].tool_calls[0].index",
        "messages[1].tool_calls[0].function.parsed",
    ];
    expected.sort();
    assert_eq!(ignored, expected);
    // What is known is read as usual.
    assert_eq!(parsed.actions().len(), 3);
    assert_eq!(parsed.agent.as_ref().map(|a| a.tools()[0].name.as_str()), Some("t"));
    assert_eq!(parsed.messages.as_ref().map(Vec::len), Some(2));
    // A clean answer ignores nothing.
    assert_eq!(lenient(&response()).1, Vec::<String>::new());
}

#[test]
fn unknown_variants_in_a_worker_answer_still_fail_with_their_path() {
    let cases = [
        with(response(), "/actions/0/type", json!("tool.cal")),
        with(response(), "/actions/1/handler", json!("engine")),
        with(response(), "/actions/0/reasoning/effort", json!("extreme")),
        with(response(), "/messages", json!([{ "role": "robot" }])),
        with(response(), "/messages", json!([{ "role": "user", "content": [{ "type": "audio" }] }])),
        with(response(), "/agent", json!({ "model": "m", "format": "gemini" })),
        with(response(), "/actions/0/model", json!(7)),
    ];
    for doc in cases {
        let strict = error::<DecisionResponse>(&doc.to_string());
        let lenient = parse_response(doc.to_string().as_bytes()).expect_err("refused");
        assert_eq!(lenient, strict, "for {doc}");
    }
    let doc = with(response(), "/actions/0/type", json!("tool.cal"));
    let err = parse_response(doc.to_string().as_bytes()).unwrap_err();
    assert_eq!(err.path, "actions[0].type");
    assert!(err.message.starts_with("unknown action \"tool.cal\""), "{err}");
}

#[test]
fn client_inputs_stay_strict_after_a_lenient_parse() {
    lenient(&with(response(), "/session_id", json!("s1")));
    let input =
        json!({ "type": "client.message", "agent_id": "a", "message": { "role": "user" }, "queue": true });
    let err = parse_slice::<ClientInput>(input.to_string().as_bytes()).unwrap_err();
    assert_eq!(err.path, "queue");
    assert!(err.message.starts_with("unknown field `queue`"), "{err}");
    // And the strict parse of a response (what the engine's own documents use) is unchanged.
    let err = error::<DecisionResponse>(&with(response(), "/session_id", json!("s1")).to_string());
    assert_eq!(err.path, "session_id");
}
