//! Round trips of every type and every variant of the decision protocol (seed 000).
//!
//! A round trip parses a JSON text with `parse_str`, serializes the value with serde_json, and
//! compares the two as `serde_json::Value`: optional fields must be omitted when absent, and
//! names and casing must be exact. The documents live in `fixtures/protocol/*.json`, each file
//! an object `{ "<Type>": { "<case>": <document>, ... }, ... }`; keys starting with `_` are notes.
//! `docs_examples.json` holds examples adapted from Substructure's public docs, with a
//! `_sources` entry per case saying where it comes from and what seed 000 changed.
//!
//! [`every_fixture_round_trips`] checks every case of every file; the other tests pick cases
//! and assert the parsed Rust values exactly, so a field parsed into the wrong place fails
//! even when it would serialize back the same.

#![cfg(test)]

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use turnstone_engine::protocol::*;

include!("fixtures/protocol/list.rs");

/// Every type of seed 000 that has fixtures (the string enums are checked in `enums_*`).
const TYPES: &[&str] = &[
    "DecisionRequest",
    "WorkerIdentity",
    "Call",
    "DecisionResponse",
    "Trigger",
    "ToolInput",
    "ClientContext",
    "Action",
    "AgentConfig",
    "AgentTool",
    "SubAgent",
    "RetryPolicy",
    "Content",
    "ContentPart",
    "ToolCall",
    "Message",
    "DraftMessage",
    "MessageTree",
    "LlmRequest",
    "LlmTool",
    "ReasoningConfig",
    "LlmResponse",
    "ClientInput",
    "StreamDelta",
];

/// Parses `doc`'s JSON text as `T`, serializes it back, and requires the same JSON.
fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?;
    let parsed: T = parse_str(&text).map_err(|e| format!("does not parse: {e}"))?;
    let back = serde_json::to_value(&parsed).map_err(|e| format!("does not serialize: {e}"))?;
    if back != *doc {
        return Err(format!("serializes differently\n   in: {doc}\n  out: {back}"));
    }
    Ok(parsed)
}

/// [`round_trip`] with the type named by a fixture section.
fn round_trip_as(type_name: &str, doc: &Value) -> Result<(), String> {
    fn check<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<(), String> {
        round_trip::<T>(doc).map(drop)
    }
    match type_name {
        "DecisionRequest" => check::<DecisionRequest>(doc),
        "WorkerIdentity" => check::<WorkerIdentity>(doc),
        "Call" => check::<Call>(doc),
        "DecisionResponse" => check::<DecisionResponse>(doc),
        "Trigger" => check::<Trigger>(doc),
        "ToolInput" => check::<ToolInput>(doc),
        "ClientContext" => check::<ClientContext>(doc),
        "Action" => check::<Action>(doc),
        "AgentConfig" => check::<AgentConfig>(doc),
        "AgentTool" => check::<AgentTool>(doc),
        "SubAgent" => check::<SubAgent>(doc),
        "RetryPolicy" => check::<RetryPolicy>(doc),
        "Content" => check::<Content>(doc),
        "ContentPart" => check::<ContentPart>(doc),
        "ToolCall" => check::<ToolCall>(doc),
        "Message" => check::<Message>(doc),
        "DraftMessage" => check::<DraftMessage>(doc),
        "MessageTree" => check::<MessageTree>(doc),
        "LlmRequest" => check::<LlmRequest>(doc),
        "LlmTool" => check::<LlmTool>(doc),
        "ReasoningConfig" => check::<ReasoningConfig>(doc),
        "LlmResponse" => check::<LlmResponse>(doc),
        "ClientInput" => check::<ClientInput>(doc),
        "StreamDelta" => check::<StreamDelta>(doc),
        other => Err(format!("no type {other:?} in the round-trip table")),
    }
}

fn fixture(file: &str) -> Map<String, Value> {
    let (_, text) = FIXTURES.iter().find(|(name, _)| *name == file).expect("no such fixture file");
    match serde_json::from_str(text).expect("fixture is not JSON") {
        Value::Object(map) => map,
        _ => panic!("{file} is not an object"),
    }
}

/// The sections of a fixture file, without the `_` notes.
fn sections(file: &str) -> Vec<(String, Map<String, Value>)> {
    fixture(file)
        .into_iter()
        .filter(|(key, _)| !key.starts_with('_'))
        .map(|(key, cases)| match cases {
            Value::Object(cases) => (key, cases),
            _ => panic!("{file}: section {key} is not an object of cases"),
        })
        .collect()
}

fn case(file: &str, type_name: &str, name: &str) -> Value {
    fixture(file)
        .get(type_name)
        .and_then(|cases| cases.get(name))
        .cloned()
        .unwrap_or_else(|| panic!("{file}: no case {type_name}/{name}"))
}

/// The round-tripped value of one fixture case.
fn load<T: DeserializeOwned + Serialize>(file: &str, type_name: &str, name: &str) -> T {
    round_trip(&case(file, type_name, name)).unwrap_or_else(|e| panic!("{file} {type_name}/{name}: {e}"))
}

/// Every value of `field` across every case of `type_name` in every file.
fn values_seen(type_name: &str, field: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (file, _) in FIXTURES {
        for (section, cases) in sections(file) {
            if section != type_name {
                continue;
            }
            for doc in cases.values() {
                if let Some(Value::String(v)) = doc.get(field) {
                    seen.insert(v.clone());
                }
            }
        }
    }
    seen
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

// ---- every fixture, every type, every variant ----

#[test]
fn every_fixture_round_trips() {
    let mut failures = Vec::new();
    let mut per_type: BTreeMap<String, usize> = BTreeMap::new();
    for (file, _) in FIXTURES {
        for (type_name, cases) in sections(file) {
            for (name, doc) in &cases {
                if let Err(e) = round_trip_as(&type_name, doc) {
                    failures.push(format!("{file} {type_name}/{name}: {e}"));
                }
                *per_type.entry(type_name.clone()).or_default() += 1;
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    let missing: Vec<_> = TYPES.iter().filter(|t| !per_type.contains_key(**t)).collect();
    assert!(missing.is_empty(), "types without fixtures: {missing:?}");
    // A floor, so a fixture file that stops being read (or loses its cases) is noticed.
    assert!(per_type.values().sum::<usize>() >= 188, "fixtures went missing: {per_type:?}");
}

#[test]
fn every_variant_of_every_union_has_a_fixture() {
    let triggers = [
        "session.start",
        "client.messages",
        "client.action",
        "tool.execute",
        "tool.finished",
        "llm.execute",
        "llm.finished",
        "sub_agent.finished",
        "interrupt.resumed",
    ];
    assert_eq!(values_seen("Trigger", "type"), set(&triggers));
    let actions = [
        "llm.call",
        "tool.call",
        "tool.result",
        "tool.error",
        "llm.result",
        "llm.error",
        "sub_agent.spawn",
        "message.send",
        "interrupt",
        "done",
    ];
    assert_eq!(values_seen("Action", "type"), set(&actions));
    let inputs = [
        "client.message",
        "client.messages",
        "client.action",
        "interrupt.resume",
        "tool.result",
        "tool.error",
    ];
    assert_eq!(values_seen("ClientInput", "type"), set(&inputs));
    let parts = ["text", "image_url", "file", "input_audio", "video_url"];
    assert_eq!(values_seen("ContentPart", "type"), set(&parts));
    assert_eq!(values_seen("ToolInput", "status"), set(&["valid", "invalid", "malformed"]));
    assert_eq!(values_seen("Call", "kind"), set(&["tool_call", "llm_call", "sub_agent"]));
    assert_eq!(
        values_seen("Call", "status"),
        set(&["pending", "completed", "failed", "retry_scheduled", "queued"])
    );
    assert_eq!(values_seen("Call", "handler"), set(&["server", "worker", "client"]));
    assert_eq!(
        values_seen("ReasoningConfig", "effort"),
        set(&["xhigh", "high", "medium", "low", "minimal", "none"])
    );
    assert_eq!(values_seen("AgentTool", "handler"), set(&["worker", "client"]));
    assert_eq!(values_seen("AgentConfig", "handler"), set(&["server", "worker"]));
    assert_eq!(values_seen("AgentConfig", "format"), set(&["openai", "anthropic"]));
}

#[test]
fn every_docs_example_names_its_source() {
    let doc = fixture("docs_examples.json");
    let sources = doc.get("_sources").and_then(Value::as_object).expect("docs_examples.json has _sources");
    let cases: BTreeSet<String> = sections("docs_examples.json")
        .into_iter()
        .flat_map(|(t, cases)| cases.keys().map(|c| format!("{t}/{c}")).collect::<Vec<_>>())
        .collect();
    let named: BTreeSet<String> = sources.keys().cloned().collect();
    assert_eq!(cases, named);
    assert!(cases.len() >= 30);
}

// ---- string enums ----

fn enum_round_trip<T>(pairs: &[(&str, T)])
where
    T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug,
{
    for (text, variant) in pairs {
        let parsed: T = parse_str(&format!("{text:?}")).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(&parsed, variant, "{text}");
        assert_eq!(serde_json::to_value(variant).unwrap(), json!(text), "{variant:?}");
    }
}

#[test]
fn enums_role_and_handlers() {
    enum_round_trip(&[
        ("system", Role::System),
        ("user", Role::User),
        ("assistant", Role::Assistant),
        ("tool", Role::Tool),
    ]);
    enum_round_trip(&[("server", Handler::Server), ("worker", Handler::Worker), ("client", Handler::Client)]);
    enum_round_trip(&[("server", LlmHandler::Server), ("worker", LlmHandler::Worker)]);
    enum_round_trip(&[("worker", ToolHandler::Worker), ("client", ToolHandler::Client)]);
    enum_round_trip(&[("openai", LlmFormat::Openai), ("anthropic", LlmFormat::Anthropic)]);
}

#[test]
fn enums_calls_errors_and_effort() {
    enum_round_trip(&[
        ("tool_call", CallKind::ToolCall),
        ("llm_call", CallKind::LlmCall),
        ("sub_agent", CallKind::SubAgent),
    ]);
    enum_round_trip(&[
        ("pending", CallStatus::Pending),
        ("completed", CallStatus::Completed),
        ("failed", CallStatus::Failed),
        ("retry_scheduled", CallStatus::RetryScheduled),
        ("queued", CallStatus::Queued),
    ]);
    enum_round_trip(&[
        ("provider_error", ErrorCode::ProviderError),
        ("rate_limited", ErrorCode::RateLimited),
        ("refused", ErrorCode::Refused),
        ("budget_exceeded", ErrorCode::BudgetExceeded),
        ("deadline_exceeded", ErrorCode::DeadlineExceeded),
    ]);
    enum_round_trip(&[
        ("xhigh", Effort::Xhigh),
        ("high", Effort::High),
        ("medium", Effort::Medium),
        ("low", Effort::Low),
        ("minimal", Effort::Minimal),
        ("none", Effort::None),
    ]);
}

// ---- DecisionRequest, WorkerIdentity, Call, DecisionResponse ----

#[test]
fn decision_request_full() {
    let req: DecisionRequest = load("decision.json", "DecisionRequest", "full");
    assert_eq!(req.session_id, "0193a1b2-c3d4-7e5f-8a9b-000000000001");
    assert_eq!(req.decision_id, "0193a1b2-c3d4-7e5f-8a9b-000000000002");
    assert_eq!(req.agent_id, "assistant");
    assert_eq!(req.identity.id.as_deref(), Some("user_42"));
    let metadata = req.identity.metadata.as_ref().expect("metadata");
    assert_eq!(metadata.get("region").map(String::as_str), Some("eu-west-1"));
    assert_eq!(
        req.trigger,
        Trigger::ToolFinished(ToolFinishedTrigger {
            id: "call_weather".into(),
            ok: true,
            name: "get_weather".into(),
            result: Some("{\"temp_c\":18}".into()),
            error: None,
        })
    );
    assert_eq!(req.proposed.actions(), [Action::LlmCall(LlmCallAction::default())]);
    assert_eq!(req.proposed.state, Some(json!({ "turns": 2 })));
    assert_eq!(req.proposed.agent, Some(AgentConfig::new("anthropic/claude-sonnet-4-5")));
    let proposed_messages = req.proposed.messages.as_ref().expect("proposed messages");
    assert_eq!(
        proposed_messages[0],
        DraftMessage::tool_result("call_weather", "get_weather", "{\"temp_c\":18}")
    );
    assert_eq!(req.state, json!({ "turns": 1, "units": "metric", "seen": ["Lisbon"] }));
    let agent = req.agent.as_ref().expect("agent");
    assert_eq!(agent.stream, Some(true));
    assert_eq!(agent.handler, Some(LlmHandler::Server));
    assert_eq!(
        agent.retry,
        Some(RetryPolicy {
            timeout_secs: Some(60.0),
            max_retries: 2,
            backoff_base_secs: 1.0,
            backoff_max_secs: 8.0
        })
    );
    assert_eq!(agent.tools().len(), 1);
    assert_eq!(agent.sub_agents()[0].id, "poet");
    let summary: Vec<_> = req.calls.iter().map(|c| (c.id.as_str(), c.kind, c.status, c.attempt)).collect();
    assert_eq!(
        summary,
        [
            ("call_weather", CallKind::ToolCall, CallStatus::Completed, 1),
            ("call_poet", CallKind::SubAgent, CallStatus::Pending, 1),
            ("llm_title", CallKind::LlmCall, CallStatus::Queued, 0),
        ]
    );
    assert_eq!(req.calls[0].arguments.as_deref(), Some("{\"city\":\"Lisbon\"}"));
    assert_eq!(
        req.calls[1].session_id.as_ref().map(|i| i.as_str()),
        Some("0193a1b2-c3d4-7e5f-8a9b-000000000009")
    );
    assert_eq!(req.calls[2].stream, Some(false));
    assert_eq!(req.pending_calls, 1);
    assert_eq!(req.messages.len(), 2);
    assert_eq!(
        req.messages[1].tool_calls()[1],
        ToolCall::function("call_poet", "poet", "{\"message\":\"Lisbon weather\"}")
    );
    assert_eq!(req.message_tree.nodes.len(), 3);
    assert_eq!(req.message_tree.nodes[0].parent_id, None);
    assert_eq!(req.message_tree.nodes[2].parent_id.as_ref().map(|i| i.as_str()), Some("m1"));
    assert_eq!(req.message_tree.head_id.as_ref().map(|i| i.as_str()), Some("m2"));
    assert_eq!(req.ancestry, ["0193a1b2-c3d4-7e5f-8a9b-0000000000a0"]);
    assert_eq!(req.attempts, 2);
    assert_eq!(req.deadline.as_deref(), Some("2026-08-05T18:04:00Z"));
    assert_eq!(req.turn_id.as_ref().map(|i| i.as_str()), Some("turn-7"));
}

#[test]
fn decision_request_minimal() {
    let req: DecisionRequest = load("decision.json", "DecisionRequest", "minimal");
    assert_eq!(req.identity, WorkerIdentity::default());
    assert_eq!(req.trigger, Trigger::SessionStart);
    assert_eq!(req.proposed, DecisionResponse::default());
    assert!(req.proposed.is_empty());
    assert_eq!(req.state, Value::Null);
    assert_eq!(req.agent, None);
    assert!(req.calls.is_empty() && req.messages.is_empty() && req.ancestry.is_empty());
    assert_eq!(req.pending_calls, 0);
    assert_eq!(req.message_tree, MessageTree { nodes: vec![], head_id: None });
    assert_eq!(req.attempts, 1);
    assert_eq!(req.deadline, None);
    assert_eq!(req.turn_id, None);
    // `T | null` fields serialize as null, never omitted.
    let out = serde_json::to_value(&req).unwrap();
    for field in ["state", "agent", "deadline", "turn_id"] {
        assert_eq!(out.get(field), Some(&Value::Null), "{field}");
    }
}

#[test]
fn worker_identity_cases() {
    assert_eq!(load::<WorkerIdentity>("decision.json", "WorkerIdentity", "empty"), WorkerIdentity::default());
    let full: WorkerIdentity = load("decision.json", "WorkerIdentity", "full");
    assert_eq!(full.id.as_deref(), Some("user_42"));
    let metadata: Vec<_> = full.metadata.expect("metadata").into_iter().collect();
    assert_eq!(
        metadata,
        [("plan".to_string(), "pro".to_string()), ("region".to_string(), "eu-west-1".to_string())]
    );
    let only: WorkerIdentity = load("decision.json", "WorkerIdentity", "metadata_only");
    assert_eq!(only.id, None);
    assert_eq!(only.metadata.map(|m| m.len()), Some(1));
}

#[test]
fn call_minimal_and_every_field() {
    let minimal: Call = load("decision.json", "Call", "minimal");
    assert_eq!(
        minimal,
        Call {
            id: "c1".into(),
            kind: CallKind::ToolCall,
            status: CallStatus::Pending,
            attempt: 1,
            deadline: None,
            anchor: None,
            name: None,
            arguments: None,
            handler: None,
            stream: None,
            agent_id: None,
            session_id: None,
        }
    );
    let every: Call = load("decision.json", "Call", "every_field");
    assert_eq!(
        every,
        Call {
            id: "c1".into(),
            kind: CallKind::ToolCall,
            status: CallStatus::RetryScheduled,
            attempt: 2,
            deadline: Some("2026-08-05T18:04:00Z".into()),
            anchor: Some("m7".into()),
            name: Some("get_weather".into()),
            arguments: Some("{\"city\":\"Tokyo\"}".into()),
            handler: Some(Handler::Worker),
            stream: Some(false),
            agent_id: Some("weather".into()),
            session_id: Some("child-1".into()),
        }
    );
    let client: Call = load("decision.json", "Call", "tool_call_client_queued");
    assert_eq!(
        (client.status, client.handler, client.attempt),
        (CallStatus::Queued, Some(Handler::Client), 0)
    );
    let sub: Call = load("decision.json", "Call", "sub_agent");
    assert_eq!((sub.kind, sub.agent_id.as_deref()), (CallKind::SubAgent, Some("poet")));
}

#[test]
fn decision_response_empty_and_full() {
    let empty: DecisionResponse = load("decision.json", "DecisionResponse", "empty");
    assert_eq!(empty, DecisionResponse::default());
    assert!(empty.is_empty());
    assert_eq!(serde_json::to_string(&empty).unwrap(), "{}");

    let full: DecisionResponse = load("decision.json", "DecisionResponse", "full");
    assert!(!full.is_empty());
    assert_eq!(
        full.messages,
        Some(vec![
            DraftMessage::user("hi").with_id("m1"),
            DraftMessage::text(Role::Assistant, "Hello! How can I help?"),
        ])
    );
    assert_eq!(
        full.actions(),
        [
            Action::ToolCall(ToolCallAction {
                id: None,
                name: "lookup".into(),
                arguments: json!({ "q": "hours" }),
                handler: None,
                retry: None,
            }),
            Action::Done(DoneAction { data: Some(json!({ "answer": "Hello! How can I help?" })) }),
        ]
    );
    assert_eq!(full.state, Some(json!({ "turns": 3, "mode": "chat" })));
    let agent = full.agent.expect("agent");
    assert_eq!((agent.model.as_str(), agent.system.as_deref()), ("openai/gpt-4.1-mini", Some("Be brief.")));

    let cleared: DecisionResponse =
        load("decision.json", "DecisionResponse", "state_cleared_with_empty_object");
    assert_eq!(cleared.state, Some(json!({})));
    assert!(!cleared.is_empty());
    let lists: DecisionResponse = load("decision.json", "DecisionResponse", "empty_lists");
    assert_eq!((lists.messages, lists.actions.clone()), (Some(vec![]), Some(vec![])));
}

// ---- Trigger, ToolInput, ClientContext ----

#[test]
fn triggers_minimal_variants() {
    let t = |name: &str| load::<Trigger>("trigger.json", "Trigger", name);
    assert_eq!(t("session_start"), Trigger::SessionStart);
    assert_eq!(
        t("client_messages_minimal"),
        Trigger::ClientMessages(ClientMessagesTrigger {
            messages: vec![],
            new_from: 0,
            client: ClientContext::default()
        })
    );
    assert_eq!(
        t("client_action_minimal"),
        Trigger::ClientAction(ClientActionTrigger { name: "refresh".into(), args: None })
    );
    assert_eq!(
        t("tool_execute_minimal"),
        Trigger::ToolExecute(ToolExecuteTrigger {
            id: "call_abc".into(),
            name: "get_weather".into(),
            arguments: "Tokyo".into(),
            input: ToolInput::Malformed { error: "arguments are not a JSON object".into() },
            attempt: 1,
            deadline: None,
        })
    );
    assert_eq!(
        t("tool_finished_minimal"),
        Trigger::ToolFinished(ToolFinishedTrigger {
            id: "call_abc".into(),
            ok: true,
            name: "noop".into(),
            result: None,
            error: None
        })
    );
    assert_eq!(
        t("llm_execute_minimal"),
        Trigger::LlmExecute(LlmExecuteTrigger {
            id: "llm_1".into(),
            request: json!({ "model": "x", "messages": [{ "role": "user", "content": "hi" }] }),
            format: None,
            stream: false,
            attempt: 1,
            deadline: None,
        })
    );
    assert_eq!(
        t("llm_finished_minimal"),
        Trigger::LlmFinished(LlmFinishedTrigger {
            id: "llm_1".into(),
            ok: true,
            message: None,
            truncated: true,
            usage: None,
            cost: None,
            error: None,
            code: None,
            detail: None,
        })
    );
    assert_eq!(
        t("sub_agent_finished_minimal"),
        Trigger::SubAgentFinished(SubAgentFinishedTrigger {
            id: "call_poet".into(),
            ok: true,
            session_id: "child-1".into(),
            agent_id: "poet".into(),
            result: None,
            error: None,
        })
    );
    assert_eq!(
        t("interrupt_resumed_minimal"),
        Trigger::InterruptResumed(InterruptResumedTrigger { interrupt_id: "int-1".into(), payload: None })
    );
}

#[test]
fn triggers_full_variants() {
    let t = |name: &str| load::<Trigger>("trigger.json", "Trigger", name);
    let Trigger::ClientMessages(cm) = t("client_messages_full") else { panic!("client.messages") };
    assert_eq!(cm.new_from, 2);
    assert_eq!(cm.messages[0].id.as_ref().map(|i| i.as_str()), Some("u1"));
    assert_eq!(cm.messages[2].id, None);
    assert_eq!(
        cm.messages[2].content,
        Some(Content::Parts(vec![
            ContentPart::Text { text: "And this one?".into() },
            ContentPart::ImageUrl { image_url: UrlRef { url: "https://example.com/cape.png".into() } },
        ]))
    );
    let tools = cm.client.tools.expect("client tools");
    assert_eq!((tools[0].name.as_str(), tools[0].handler), ("get_location", Some(ToolHandler::Client)));
    assert_eq!(
        cm.client.context,
        Some(vec![json!({ "description": "page", "value": "/gallery" }), json!("dark-mode")])
    );
    assert_eq!(cm.client.state, Some(json!({ "draft": "" })));
    assert_eq!(cm.client.forwarded_props, Some(json!({ "locale": "pt-PT" })));

    assert_eq!(
        t("client_action_with_args"),
        Trigger::ClientAction(ClientActionTrigger {
            name: "set_mode".into(),
            args: Some(json!({ "mode": "expert" }))
        })
    );
    assert_eq!(
        t("tool_execute_full"),
        Trigger::ToolExecute(ToolExecuteTrigger {
            id: "call_abc".into(),
            name: "get_weather".into(),
            arguments: "{\"city\":\"Tokyo\"}".into(),
            input: ToolInput::Valid { value: json!({ "city": "Tokyo" }) },
            attempt: 2,
            deadline: Some("2026-08-05T18:04:00Z".into()),
        })
    );
    let Trigger::ToolFinished(failed) = t("tool_finished_failed") else { panic!("tool.finished") };
    assert_eq!(
        (failed.ok, failed.result, failed.error.as_deref()),
        (false, None, Some("deadline exceeded while running"))
    );
    let Trigger::LlmExecute(exec) = t("llm_execute_full") else { panic!("llm.execute") };
    assert_eq!(
        (exec.format, exec.stream, exec.deadline.as_deref()),
        (Some(LlmFormat::Openai), true, Some("2026-08-05T18:04:00Z"))
    );
    assert_eq!(exec.request["stream"], json!(true));
    let Trigger::LlmExecute(anthropic) = t("llm_execute_anthropic") else { panic!("llm.execute") };
    assert_eq!((anthropic.format, anthropic.attempt), (Some(LlmFormat::Anthropic), 3));
    assert_eq!(
        t("llm_finished_ok"),
        Trigger::LlmFinished(LlmFinishedTrigger {
            id: "llm_1".into(),
            ok: true,
            message: Some(DraftMessage::text(Role::Assistant, "Hello!").with_id("llm_1")),
            truncated: false,
            usage: Some(json!({ "input": 12, "output": 3 })),
            cost: Some("0.000041".into()),
            error: None,
            code: None,
            detail: None,
        })
    );
    let Trigger::LlmFinished(failed) = t("llm_finished_failed") else { panic!("llm.finished") };
    assert_eq!(
        (failed.code, failed.detail),
        (Some(ErrorCode::RateLimited), Some(json!({ "status": 429, "retry_after": 2 })))
    );
    let Trigger::LlmFinished(every) = t("llm_finished_every_field") else { panic!("llm.finished") };
    assert_eq!(every.code, Some(ErrorCode::BudgetExceeded));
    assert_eq!(every.message.expect("message").tool_calls.map(|c| c.len()), Some(1));
    let Trigger::SubAgentFinished(sub) = t("sub_agent_finished_failed") else { panic!("sub_agent.finished") };
    assert_eq!((sub.ok, sub.error.as_deref()), (false, Some("the child's turn failed")));
    assert_eq!(
        t("interrupt_resumed_with_payload"),
        Trigger::InterruptResumed(InterruptResumedTrigger {
            interrupt_id: "int-1".into(),
            payload: Some(json!({ "approved": true, "note": "go ahead" })),
        })
    );
}

#[test]
fn trigger_names_match_their_tags() {
    for (name, doc) in sections("trigger.json").into_iter().find(|(t, _)| t == "Trigger").expect("Trigger").1
    {
        let trigger: Trigger = round_trip(&doc).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(Some(trigger.name()), doc["type"].as_str(), "{name}");
    }
}

#[test]
fn tool_input_statuses() {
    let i = |name: &str| load::<ToolInput>("trigger.json", "ToolInput", name);
    assert_eq!(i("valid"), ToolInput::Valid { value: json!({ "city": "Tokyo" }) });
    assert_eq!(i("valid_empty_object"), ToolInput::Valid { value: json!({}) });
    assert_eq!(
        i("invalid"),
        ToolInput::Invalid { value: json!({ "city": 7 }), error: "city: 7 is not of type \"string\"".into() }
    );
    assert_eq!(
        i("malformed"),
        ToolInput::Malformed { error: "expected a JSON object, found a string".into() }
    );
}

#[test]
fn client_context_empty_and_full() {
    assert_eq!(load::<ClientContext>("trigger.json", "ClientContext", "empty"), ClientContext::default());
    let full: ClientContext = load("trigger.json", "ClientContext", "full");
    let tool = &full.tools.as_ref().expect("tools")[0];
    assert_eq!(tool.input, Some(json!({ "type": "object", "properties": {} })));
    assert_eq!(
        full.context,
        Some(vec![json!({ "description": "route", "value": "/settings" }), json!(3), Value::Null])
    );
    assert_eq!(full.state, Some(json!({ "theme": "dark" })));
    assert_eq!(full.forwarded_props, Some(json!({ "thread": "t-9" })));
}

// ---- Action ----

#[test]
fn actions_minimal_variants() {
    let a = |name: &str| load::<Action>("action.json", "Action", name);
    assert_eq!(a("llm_call_minimal"), Action::LlmCall(LlmCallAction::default()));
    assert_eq!(
        a("tool_call_minimal"),
        Action::ToolCall(ToolCallAction {
            id: None,
            name: "get_time".into(),
            arguments: json!("{}"),
            handler: None,
            retry: None
        })
    );
    assert_eq!(
        a("tool_result_minimal"),
        Action::ToolResult(ToolResultAction { id: None, attempt: None, result: json!("42") })
    );
    let bare_error = |error: &str| CallErrorAction {
        id: None,
        attempt: None,
        error: error.into(),
        retryable: None,
        code: None,
        detail: None,
    };
    assert_eq!(a("tool_error_minimal"), Action::ToolError(bare_error("Not allowed here.")));
    assert_eq!(
        a("llm_result_minimal"),
        Action::LlmResult(LlmResultAction {
            id: None,
            attempt: None,
            response: json!({ "model": "x", "content": "hi" })
        })
    );
    assert_eq!(a("llm_error_minimal"), Action::LlmError(bare_error("provider unavailable")));
    assert_eq!(
        a("sub_agent_spawn_minimal"),
        Action::SubAgentSpawn(SubAgentSpawnAction {
            session_id: "child-1".into(),
            agent_id: "poet".into(),
            tool_call_id: "call_poet".into(),
            retry: None,
        })
    );
    assert_eq!(
        a("message_send_minimal"),
        Action::MessageSend(MessageSendAction {
            session_id: "child-1".into(),
            message: DraftMessage {
                id: None,
                role: Role::User,
                content: None,
                tool_calls: None,
                tool_call_id: None,
                name: None,
                provider_blocks: None,
            },
        })
    );
    assert_eq!(
        a("interrupt_minimal"),
        Action::Interrupt(InterruptAction { interrupt_id: None, reason: "confirm".into(), payload: None })
    );
    assert_eq!(a("done_minimal"), Action::Done(DoneAction::default()));
}

#[test]
fn actions_full_variants() {
    let a = |name: &str| load::<Action>("action.json", "Action", name);
    assert_eq!(
        a("llm_call_full"),
        Action::LlmCall(LlmCallAction {
            id: Some("llm_7".into()),
            model: Some("anthropic/claude-sonnet-4-5".into()),
            messages: Some(vec![
                DraftMessage::text(Role::System, "You summarize."),
                DraftMessage::user("Summarize the thread.").with_id("m1"),
            ]),
            tools: Some(vec![LlmTool {
                name: "search".into(),
                description: "Search the thread.".into(),
                input: Some(json!({ "type": "object", "properties": { "q": { "type": "string" } } })),
                output: Some(json!({ "type": "array" })),
            }]),
            temperature: Some(0.2),
            max_completion_tokens: Some(1024),
            reasoning: Some(ReasoningConfig {
                effort: Some(Effort::Low),
                max_tokens: None,
                exclude: Some(true),
                enabled: None
            }),
            stream: Some(true),
            retry: Some(RetryPolicy {
                timeout_secs: Some(120.0),
                max_retries: 4,
                backoff_base_secs: 0.5,
                backoff_max_secs: 30.0
            }),
            handler: Some(LlmHandler::Worker),
        })
    );
    let Action::LlmCall(whole) = a("llm_call_whole_temperature") else { panic!("llm.call") };
    assert_eq!((whole.temperature, whole.handler), (Some(1.0), Some(LlmHandler::Server)));
    assert_eq!(
        a("tool_call_full"),
        Action::ToolCall(ToolCallAction {
            id: Some("call_render".into()),
            name: "render_report".into(),
            arguments: json!({ "topic": "q3" }),
            handler: Some(ToolHandler::Client),
            retry: Some(RetryPolicy::NONE),
        })
    );
    let Action::ToolCall(null_args) = a("tool_call_worker_null_arguments") else { panic!("tool.call") };
    assert_eq!((null_args.arguments, null_args.handler), (Value::Null, Some(ToolHandler::Worker)));
    assert_eq!(
        a("tool_result_full"),
        Action::ToolResult(ToolResultAction {
            id: Some("call_abc".into()),
            attempt: Some(2),
            result: json!({ "content": [{ "type": "text", "text": "It is clear in Tokyo." }] }),
        })
    );
    assert_eq!(
        a("tool_error_full"),
        Action::ToolError(CallErrorAction {
            id: Some("call_abc".into()),
            attempt: Some(1),
            error: "upstream 503".into(),
            retryable: Some(true),
            code: Some(ErrorCode::ProviderError),
            detail: Some(json!({ "status": 503 })),
        })
    );
    let Action::LlmResult(result) = a("llm_result_full") else { panic!("llm.result") };
    assert_eq!((result.id.as_ref().map(|i| i.as_str()), result.attempt), (Some("llm_1"), Some(1)));
    let response: LlmResponse = parse(result.response).expect("an LlmResponse");
    assert_eq!(response.tool_calls, Some(vec![ToolCall::function("call_1", "lookup", "{\"q\":\"hours\"}")]));
    assert_eq!(
        a("llm_error_full"),
        Action::LlmError(CallErrorAction {
            id: Some("llm_1".into()),
            attempt: Some(3),
            error: "rate limited".into(),
            retryable: Some(false),
            code: Some(ErrorCode::RateLimited),
            detail: Some(json!({ "retry_after_secs": 20 })),
        })
    );
    let Action::SubAgentSpawn(spawn) = a("sub_agent_spawn_full") else { panic!("sub_agent.spawn") };
    assert_eq!(
        spawn.retry,
        Some(RetryPolicy {
            timeout_secs: Some(10.0),
            max_retries: 2,
            backoff_base_secs: 1.0,
            backoff_max_secs: 4.0
        })
    );
    let Action::MessageSend(send) = a("message_send_full") else { panic!("message.send") };
    assert_eq!(send.message.id.as_ref().map(|i| i.as_str()), Some("seed-1"));
    assert_eq!(send.message.name.as_deref(), Some("parent"));
    assert_eq!(send.message.content_text(), "Write a haiku about fog.");
    assert_eq!(
        a("interrupt_full"),
        Action::Interrupt(InterruptAction {
            interrupt_id: Some("int-1".into()),
            reason: "confirm".into(),
            payload: Some(json!({ "message": "Send the email?", "options": ["yes", "no"] })),
        })
    );
    assert_eq!(
        a("done_full"),
        Action::Done(DoneAction { data: Some(json!({ "summary": "Sent.", "ids": [1, 2] })) })
    );
    assert_eq!(a("done_string_data"), Action::Done(DoneAction { data: Some(json!("finished")) }));
}

#[test]
fn action_names_match_their_tags() {
    for (name, doc) in sections("action.json").into_iter().find(|(t, _)| t == "Action").expect("Action").1 {
        let action: Action = round_trip(&doc).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(Some(action.name()), doc["type"].as_str(), "{name}");
    }
}

// ---- AgentConfig, AgentTool, SubAgent, RetryPolicy ----

#[test]
fn agent_config_minimal_and_full() {
    let minimal: AgentConfig = load("agent.json", "AgentConfig", "minimal");
    assert_eq!(minimal, AgentConfig::new("x"));
    assert_eq!(serde_json::to_string(&AgentConfig::new("x")).unwrap(), r#"{"model":"x"}"#);

    let full: AgentConfig = load("agent.json", "AgentConfig", "full");
    assert_eq!(full.model, "claude-haiku-4-5");
    assert_eq!(full.system.as_deref(), Some("You are the on-call assistant."));
    assert_eq!(
        (full.stream, full.handler, full.format),
        (Some(true), Some(LlmHandler::Worker), Some(LlmFormat::Anthropic))
    );
    assert_eq!(
        full.retry,
        Some(RetryPolicy {
            timeout_secs: Some(90.5),
            max_retries: 3,
            backoff_base_secs: 2.0,
            backoff_max_secs: 60.0
        })
    );
    let tools: Vec<_> = full.tools().iter().map(|t| (t.name.as_str(), t.handler)).collect();
    assert_eq!(
        tools,
        [
            ("get_weather", Some(ToolHandler::Worker)),
            ("get_location", Some(ToolHandler::Client)),
            ("get_time", None)
        ]
    );
    assert_eq!(full.tools()[0].output, Some(json!({ "type": "string" })));
    assert_eq!(
        full.sub_agents(),
        [
            SubAgent { id: "poet".into(), description: Some("Writes a haiku.".into()) },
            SubAgent { id: "researcher".into(), description: None },
        ]
    );
    assert_eq!(full.validate(), Ok(()));
}

#[test]
fn agent_tool_and_sub_agent() {
    assert_eq!(
        load::<AgentTool>("agent.json", "AgentTool", "minimal"),
        AgentTool {
            name: "get_time".into(),
            description: None,
            input: None,
            output: None,
            handler: None,
            approval: None,
            mcp: None
        }
    );
    let full: AgentTool = load("agent.json", "AgentTool", "full");
    assert_eq!(full.description.as_deref(), Some("Render a report. This takes a while."));
    assert_eq!(full.input.as_ref().and_then(|s| s.get("required")), Some(&json!(["topic"])));
    assert_eq!(full.handler, Some(ToolHandler::Worker));
    assert_eq!(load::<AgentTool>("agent.json", "AgentTool", "boolean_schema").input, Some(json!(true)));
    assert_eq!(
        load::<SubAgent>("agent.json", "SubAgent", "minimal"),
        SubAgent { id: "poet".into(), description: None }
    );
    assert_eq!(
        load::<SubAgent>("agent.json", "SubAgent", "full").description.as_deref(),
        Some("Writes a haiku on any topic.")
    );
}

#[test]
fn retry_policy_timeout_null_and_number() {
    assert_eq!(load::<RetryPolicy>("agent.json", "RetryPolicy", "timeout_null"), RetryPolicy::NONE);
    assert_eq!(
        load::<RetryPolicy>("agent.json", "RetryPolicy", "timeout_whole_number"),
        RetryPolicy {
            timeout_secs: Some(30.0),
            max_retries: 3,
            backoff_base_secs: 1.0,
            backoff_max_secs: 10.0
        }
    );
    assert_eq!(
        load::<RetryPolicy>("agent.json", "RetryPolicy", "timeout_fraction"),
        RetryPolicy {
            timeout_secs: Some(2.5),
            max_retries: 5,
            backoff_base_secs: 0.25,
            backoff_max_secs: 7.5
        }
    );
}

#[test]
fn whole_numbers_serialize_as_integers() {
    // A worker writes `30`; the engine must not echo `30.0`.
    assert_eq!(
        serde_json::to_string(&RetryPolicy::NONE).unwrap(),
        r#"{"timeout_secs":null,"max_retries":0,"backoff_base_secs":0,"backoff_max_secs":0}"#
    );
    let policy = RetryPolicy {
        timeout_secs: Some(30.0),
        max_retries: 1,
        backoff_base_secs: 0.5,
        backoff_max_secs: 8.0,
    };
    assert_eq!(
        serde_json::to_string(&policy).unwrap(),
        r#"{"timeout_secs":30,"max_retries":1,"backoff_base_secs":0.5,"backoff_max_secs":8}"#
    );
    let call = LlmCallAction { temperature: Some(1.0), ..LlmCallAction::default() };
    assert_eq!(
        serde_json::to_string(&Action::LlmCall(call)).unwrap(),
        r#"{"type":"llm.call","temperature":1}"#
    );
    let call = LlmCallAction { temperature: Some(0.7), ..LlmCallAction::default() };
    assert_eq!(
        serde_json::to_string(&Action::LlmCall(call)).unwrap(),
        r#"{"type":"llm.call","temperature":0.7}"#
    );
}

// ---- Role, Content, ContentPart, ToolCall, Message, DraftMessage, MessageTree ----

#[test]
fn content_string_and_parts() {
    assert_eq!(load::<Content>("message.json", "Content", "text"), Content::Text("Hello there".into()));
    assert_eq!(load::<Content>("message.json", "Content", "empty_text"), Content::Text(String::new()));
    assert_eq!(load::<Content>("message.json", "Content", "empty_parts"), Content::Parts(vec![]));
    let parts = load::<Content>("message.json", "Content", "parts_every_kind");
    assert_eq!(
        parts,
        Content::Parts(vec![
            ContentPart::Text { text: "Compare these.".into() },
            ContentPart::ImageUrl { image_url: UrlRef { url: "data:image/png;base64,iVBORw0KGgo=".into() } },
            ContentPart::File {
                file: FileData {
                    filename: "notes.pdf".into(),
                    file_data: "data:application/pdf;base64,JVBERi0=".into()
                }
            },
            ContentPart::InputAudio {
                input_audio: AudioData { data: "UklGRg==".into(), format: "wav".into() }
            },
            ContentPart::VideoUrl { video_url: UrlRef { url: "https://example.com/clip.mp4".into() } },
        ])
    );
    assert_eq!(parts.text(), "Compare these.");
}

#[test]
fn every_content_part() {
    let p = |name: &str| load::<ContentPart>("message.json", "ContentPart", name);
    assert_eq!(p("text"), ContentPart::Text { text: "hi".into() });
    assert_eq!(
        p("image_url"),
        ContentPart::ImageUrl { image_url: UrlRef { url: "https://example.com/a.png".into() } }
    );
    assert_eq!(
        p("file"),
        ContentPart::File { file: FileData { filename: "a.txt".into(), file_data: "aGVsbG8=".into() } }
    );
    assert_eq!(
        p("input_audio"),
        ContentPart::InputAudio { input_audio: AudioData { data: "SUQz".into(), format: "mp3".into() } }
    );
    assert_eq!(
        p("video_url"),
        ContentPart::VideoUrl { video_url: UrlRef { url: "https://example.com/v.webm".into() } }
    );
}

#[test]
fn tool_calls() {
    assert_eq!(
        load::<ToolCall>("message.json", "ToolCall", "function"),
        ToolCall::function("call_abc", "get_weather", "{\"city\":\"Tokyo\"}")
    );
    assert_eq!(
        serde_json::to_value(ToolCall::function("c", "f", "{}")).unwrap(),
        json!({ "id": "c", "type": "function", "function": { "name": "f", "arguments": "{}" } })
    );
    assert_eq!(load::<ToolCall>("message.json", "ToolCall", "empty_arguments").function.arguments, "");
}

#[test]
fn messages() {
    let m = |name: &str| load::<Message>("message.json", "Message", name);
    assert_eq!(m("user_text"), DraftMessage::user("weather in Tokyo?").into_message("m1".into()));
    assert_eq!(m("system").role, Role::System);
    assert_eq!(m("user_parts").content_text(), "What's this?");
    let assistant = m("assistant_tool_calls");
    assert_eq!((assistant.role, assistant.content.as_ref()), (Role::Assistant, None));
    assert_eq!(
        assistant.tool_calls(),
        [ToolCall::function("call_abc", "get_weather", "{\"city\":\"Tokyo\"}")]
    );
    assert_eq!(
        m("tool_result"),
        DraftMessage::tool_result("call_abc", "get_weather", "It is clear in Tokyo.")
            .into_message("m4".into())
    );
    let every = m("every_field");
    assert_eq!(
        (every.tool_call_id.as_ref().map(|i| i.as_str()), every.name.as_deref()),
        (Some("unused"), Some("helper"))
    );
    assert_eq!(
        m("minimal"),
        Message {
            id: "m6".into(),
            role: Role::Assistant,
            content: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
            provider_blocks: None,
            compaction: None,
        }
    );
}

#[test]
fn draft_messages_with_and_without_id() {
    let d = |name: &str| load::<DraftMessage>("message.json", "DraftMessage", name);
    assert_eq!(d("with_id"), DraftMessage::user("weather in NYC?").with_id("u1"));
    assert_eq!(d("without_id"), DraftMessage::user("weather in LA instead"));
    assert_eq!(
        serde_json::to_value(DraftMessage::user("hi")).unwrap(),
        json!({ "role": "user", "content": "hi" })
    );
    let every = d("every_field");
    assert_eq!(every.tool_calls, Some(vec![]));
    assert_eq!(every.content, Some(Content::Parts(vec![ContentPart::Text { text: "42".into() }])));
    assert_eq!(d("minimal").content_text(), "");
}

#[test]
fn message_trees() {
    assert_eq!(
        load::<MessageTree>("message.json", "MessageTree", "empty"),
        MessageTree { nodes: vec![], head_id: None }
    );
    let tree: MessageTree = load("message.json", "MessageTree", "branched");
    let shape: Vec<_> = tree
        .nodes
        .iter()
        .map(|n| (n.message.id.as_str(), n.parent_id.as_ref().map(|i| i.as_str())))
        .collect();
    assert_eq!(shape, [("u1", None), ("a1", Some("u1")), ("u2", Some("a1")), ("e1", Some("u1"))]);
    assert_eq!(tree.head_id.as_ref().map(|i| i.as_str()), Some("e1"));
    assert_eq!(
        load::<MessageTree>("message.json", "MessageTree", "head_only").head_id.as_ref().map(|i| i.as_str()),
        Some("m2")
    );
}

// ---- LlmRequest, LlmTool, ReasoningConfig, LlmResponse, StreamDelta ----

#[test]
fn llm_request_minimal_and_full() {
    assert_eq!(
        load::<LlmRequest>("llm.json", "LlmRequest", "minimal"),
        LlmRequest {
            model: "x".into(),
            messages: vec![],
            tools: None,
            temperature: None,
            max_completion_tokens: None,
            reasoning: None,
            cache: None,
            thinking_form: None
        }
    );
    let full: LlmRequest = load("llm.json", "LlmRequest", "full");
    let roles: Vec<_> = full.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::Tool]);
    assert_eq!(full.messages[0].id, None);
    assert_eq!(full.tools.as_ref().map(|t| t[0].name.as_str()), Some("get_weather"));
    assert_eq!((full.temperature, full.max_completion_tokens), (Some(0.7), Some(2048)));
    assert_eq!(
        full.reasoning,
        Some(ReasoningConfig {
            effort: Some(Effort::Medium),
            max_tokens: Some(1024),
            exclude: Some(false),
            enabled: Some(true)
        })
    );
    assert_eq!(load::<LlmRequest>("llm.json", "LlmRequest", "whole_temperature").temperature, Some(0.0));
}

#[test]
fn llm_tools() {
    assert_eq!(
        load::<LlmTool>("llm.json", "LlmTool", "minimal"),
        LlmTool {
            name: "get_time".into(),
            description: "Get the current UTC time.".into(),
            input: None,
            output: None
        }
    );
    let full: LlmTool = load("llm.json", "LlmTool", "full");
    assert_eq!(full.output, Some(json!({ "type": "string" })));
}

#[test]
fn reasoning_config_every_effort() {
    for (name, effort) in [
        ("effort_xhigh", Effort::Xhigh),
        ("effort_high", Effort::High),
        ("effort_medium", Effort::Medium),
        ("effort_low", Effort::Low),
        ("effort_minimal", Effort::Minimal),
        ("effort_none", Effort::None),
    ] {
        assert_eq!(
            load::<ReasoningConfig>("llm.json", "ReasoningConfig", name),
            ReasoningConfig { effort: Some(effort), max_tokens: None, exclude: None, enabled: None },
            "{name}"
        );
    }
    assert_eq!(
        load::<ReasoningConfig>("llm.json", "ReasoningConfig", "full"),
        ReasoningConfig {
            effort: Some(Effort::High),
            max_tokens: Some(4096),
            exclude: Some(true),
            enabled: Some(true)
        }
    );
    assert_eq!(
        load::<ReasoningConfig>("llm.json", "ReasoningConfig", "empty"),
        ReasoningConfig { effort: None, max_tokens: None, exclude: None, enabled: None }
    );
}

#[test]
fn llm_responses() {
    let minimal: LlmResponse = load("llm.json", "LlmResponse", "minimal");
    assert_eq!(
        minimal,
        LlmResponse {
            model: "x".into(),
            content: None,
            tool_calls: None,
            finish_reason: None,
            usage: None,
            cost: None,
            images: None,
            reasoning: None,
            provider_blocks: None,
        }
    );
    let full: LlmResponse = load("llm.json", "LlmResponse", "full");
    assert_eq!(full.content.as_deref(), Some("Let me check the weather."));
    assert_eq!(
        full.tool_calls,
        Some(vec![ToolCall::function("call_abc", "get_weather", "{\"city\":\"Tokyo\"}")])
    );
    assert_eq!(full.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(full.cost.as_deref(), Some("0.00081"));
    assert_eq!(
        full.images,
        Some(vec![
            UrlRef { url: "data:image/png;base64,iVBORw0KGgo=".into() },
            UrlRef { url: "https://example.com/gen.png".into() },
        ])
    );
    assert!(load::<LlmResponse>("llm.json", "LlmResponse", "truncated").is_truncated());
    assert!(!full.is_truncated());
}

#[test]
fn stream_deltas() {
    assert_eq!(load::<StreamDelta>("llm.json", "StreamDelta", "empty"), StreamDelta::default());
    assert_eq!(
        load::<StreamDelta>("llm.json", "StreamDelta", "text"),
        StreamDelta { text: Some("hel".into()), ..StreamDelta::default() }
    );
    assert_eq!(
        load::<StreamDelta>("llm.json", "StreamDelta", "tool_call_fragment"),
        StreamDelta {
            tool_calls: Some(vec![ToolCallDelta {
                id: "call_abc".into(),
                name: None,
                arguments: Some("{\"city\":".into())
            }]),
            ..StreamDelta::default()
        }
    );
    let full: StreamDelta = load("llm.json", "StreamDelta", "full");
    assert_eq!((full.text.as_deref(), full.reasoning.as_deref()), (Some("lo"), Some("done thinking")));
    assert_eq!(full.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(full.tool_calls.map(|c| c.len()), Some(2));
}

// ---- ClientInput ----

#[test]
fn client_inputs_minimal_variants() {
    let c = |name: &str| load::<ClientInput>("client_input.json", "ClientInput", name);
    assert_eq!(
        c("client_message_minimal"),
        ClientInput::Message(ClientMessageInput {
            agent_id: "assistant".into(),
            turn_id: None,
            message: DraftMessage::user("hi"),
            stream: None,
            client: None,
        })
    );
    assert_eq!(
        c("client_messages_minimal"),
        ClientInput::Messages(ClientMessagesInput {
            agent_id: "bot".into(),
            turn_id: None,
            messages: vec![],
            stream: None,
            client: None,
        })
    );
    assert_eq!(
        c("client_action_minimal"),
        ClientInput::Action(ClientActionInput {
            agent_id: "assistant".into(),
            turn_id: None,
            name: "reset".into(),
            args: None
        })
    );
    assert_eq!(
        c("interrupt_resume_minimal"),
        ClientInput::InterruptResume(InterruptResumeInput { interrupt_id: "int-1".into(), payload: None })
    );
    assert_eq!(
        c("tool_result_minimal"),
        ClientInput::ToolResult(ToolResultInput { id: "call_loc".into(), attempt: None, result: None })
    );
    assert_eq!(
        c("tool_error_minimal"),
        ClientInput::ToolError(ToolErrorInput {
            id: "call_loc".into(),
            error: "Permission denied.".into(),
            retryable: false,
            attempt: None
        })
    );
}

#[test]
fn client_inputs_full_variants() {
    let c = |name: &str| load::<ClientInput>("client_input.json", "ClientInput", name);
    let full = c("client_message_full");
    assert_eq!(
        (full.name(), full.agent_id(), full.turn_id().map(|t| t.as_str())),
        ("client.message", Some("assistant"), Some("turn-0193"))
    );
    let ClientInput::Message(message) = full else { panic!("client.message") };
    assert_eq!(message.stream, Some(true));
    assert_eq!(message.message.id.as_ref().map(|i| i.as_str()), Some("u9"));
    let ClientInput::Messages(view) = c("client_messages_full") else { panic!("client.messages") };
    assert_eq!(
        (view.turn_id.as_ref().map(|i| i.as_str()), view.stream, view.messages.len()),
        (Some("turn-2"), Some(false), 2)
    );
    let client = view.client.expect("client context");
    assert_eq!(client.context, Some(vec![]));
    assert_eq!(client.state, Some(json!({ "draft": "hi" })));
    assert_eq!(
        c("client_action_full"),
        ClientInput::Action(ClientActionInput {
            agent_id: "assistant".into(),
            turn_id: Some("turn-3".into()),
            name: "set_mode".into(),
            args: Some(json!({ "mode": "expert" })),
        })
    );
    assert_eq!(
        c("interrupt_resume_full"),
        ClientInput::InterruptResume(InterruptResumeInput {
            interrupt_id: "int-1".into(),
            payload: Some(json!({ "approved": true }))
        })
    );
    let resume = c("interrupt_resume_full");
    assert_eq!((resume.agent_id(), resume.turn_id()), (None, None));
    assert_eq!(
        c("tool_result_full"),
        ClientInput::ToolResult(ToolResultInput {
            id: "call_loc".into(),
            attempt: Some(1),
            result: Some(json!({ "content": [{ "type": "text", "text": "Lisbon" }] })),
        })
    );
    assert_eq!(
        c("tool_error_full"),
        ClientInput::ToolError(ToolErrorInput {
            id: "call_loc".into(),
            error: "GPS timed out.".into(),
            retryable: true,
            attempt: Some(2)
        })
    );
}

// ---- built in Rust, serialized to the exact wire shape ----

#[test]
fn rust_values_serialize_to_the_wire_shape() {
    let cases: Vec<(Value, Value)> = vec![
        (serde_json::to_value(Trigger::SessionStart).unwrap(), json!({ "type": "session.start" })),
        (
            serde_json::to_value(Action::LlmCall(LlmCallAction::default())).unwrap(),
            json!({ "type": "llm.call" }),
        ),
        (serde_json::to_value(Action::Done(DoneAction::default())).unwrap(), json!({ "type": "done" })),
        (serde_json::to_value(DecisionResponse::default()).unwrap(), json!({})),
        (
            serde_json::to_value(ToolInput::Malformed { error: "e".into() }).unwrap(),
            json!({ "status": "malformed", "error": "e" }),
        ),
        (
            serde_json::to_value(ContentPart::InputAudio {
                input_audio: AudioData { data: "d".into(), format: "wav".into() },
            })
            .unwrap(),
            json!({ "type": "input_audio", "input_audio": { "data": "d", "format": "wav" } }),
        ),
        (
            serde_json::to_value(ClientInput::ToolResult(ToolResultInput {
                id: "c".into(),
                attempt: None,
                result: None,
            }))
            .unwrap(),
            json!({ "type": "tool.result", "id": "c" }),
        ),
        (
            serde_json::to_value(Action::LlmError(CallErrorAction {
                id: None,
                attempt: None,
                error: "x".into(),
                retryable: Some(false),
                code: Some(ErrorCode::Refused),
                detail: None,
            }))
            .unwrap(),
            json!({ "type": "llm.error", "error": "x", "retryable": false, "code": "refused" }),
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
}

// ---- the public docs' examples ----

#[test]
fn docs_decision_request_tool_execute() {
    let req: DecisionRequest = load("docs_examples.json", "DecisionRequest", "weather_tool_execute");
    assert_eq!(req.agent_id, "oncall");
    let Trigger::ToolExecute(exec) = &req.trigger else { panic!("tool.execute") };
    assert_eq!(exec.input, ToolInput::Valid { value: json!({ "city": "Tokyo" }) });
    assert_eq!(exec.attempt, 1);
    assert!(req.proposed.is_empty());
    assert_eq!(req.state, json!({ "turns": 2 }));
    assert_eq!(req.agent.as_ref().map(|a| a.tools()[0].name.as_str()), Some("get_weather"));
    assert_eq!(req.calls[0].handler, None);
    assert_eq!(req.message_tree.nodes.len(), 0);
    assert_eq!(req.turn_id.as_ref().map(|i| i.as_str()), Some("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a60"));

    let start: DecisionRequest =
        load("docs_examples.json", "DecisionRequest", "session_start_with_file_config");
    assert_eq!((start.agent.as_ref(), start.turn_id.as_ref()), (None, None));
    assert_eq!(start.proposed.agent.map(|a| a.model), Some("claude-haiku-4-5".to_string()));
}

#[test]
fn docs_decision_responses() {
    let r = |name: &str| load::<DecisionResponse>("docs_examples.json", "DecisionResponse", name);
    let answer = r("tool_result_mcp_content");
    assert_eq!(answer.state, Some(json!({ "turns": 3 })));
    assert_eq!(
        answer.actions(),
        [Action::ToolResult(ToolResultAction {
            id: None,
            attempt: None,
            result: json!({ "content": [{ "type": "text", "text": "It is clear in Tokyo." }] }),
        })]
    );
    assert!(r("leave_tool_call_open").is_empty());
    assert_eq!(r("end_turn_early").actions(), [Action::Done(DoneAction::default())]);
    let Some(Action::Interrupt(ask)) = r("ask_a_person").actions().first().cloned() else {
        panic!("interrupt")
    };
    assert_eq!((ask.interrupt_id, ask.reason.as_str()), (None, "confirm"));
    let Some(Action::ToolError(retry)) = r("retryable_tool_error").actions().first().cloned() else {
        panic!("tool.error")
    };
    assert_eq!((retry.retryable, retry.code), (Some(true), Some(ErrorCode::ProviderError)));
    let client = r("declare_client_tool").agent.expect("agent");
    assert_eq!(client.tools()[0].handler, Some(ToolHandler::Client));
    let delegate = r("delegate_to_sub_agent");
    let names: Vec<_> = delegate.actions().iter().map(Action::name).collect();
    assert_eq!(names, ["sub_agent.spawn", "message.send"]);
    let Some(Action::LlmResult(streamed)) = r("stream_final_frame").actions().first().cloned() else {
        panic!("llm.result")
    };
    let response: LlmResponse = parse(streamed.response).expect("an LlmResponse");
    assert_eq!(
        (response.content.as_deref(), response.finish_reason.as_deref()),
        (Some("hello"), Some("stop"))
    );
}

#[test]
fn docs_actions_triggers_and_inputs() {
    let Action::ToolCall(call) = load("docs_examples.json", "Action", "tool_call_with_retry") else {
        panic!("tool.call")
    };
    assert_eq!(
        call.retry,
        Some(RetryPolicy {
            timeout_secs: Some(30.0),
            max_retries: 2,
            backoff_base_secs: 2.0,
            backoff_max_secs: 30.0
        })
    );
    let Trigger::ClientMessages(edit) = load("docs_examples.json", "Trigger", "client_messages_edit") else {
        panic!("client.messages")
    };
    assert_eq!(edit.new_from, 1);
    let Trigger::LlmExecute(exec) = load("docs_examples.json", "Trigger", "llm_execute_anthropic_stream")
    else {
        panic!("llm.execute")
    };
    assert_eq!((exec.format, exec.stream), (Some(LlmFormat::Anthropic), true));
    assert_eq!(
        load::<ClientInput>("docs_examples.json", "ClientInput", "interrupt_resume_approved"),
        ClientInput::InterruptResume(InterruptResumeInput {
            interrupt_id: "int-1".into(),
            payload: Some(json!({ "approved": true }))
        })
    );
    let frames: Vec<_> = ["first_frame", "second_frame"]
        .iter()
        .map(|f| load::<StreamDelta>("docs_examples.json", "StreamDelta", f).text.unwrap_or_default())
        .collect();
    assert_eq!(frames.concat(), "hello");
}
