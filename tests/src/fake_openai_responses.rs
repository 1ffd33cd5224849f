//! A strict fake of OpenAI's Responses API: `POST /v1/responses`.
//!
//! Answers `response` objects, or with `"stream": true` a `text/event-stream` of named events
//! the way OpenAI sends them (https://platform.openai.com/docs/api-reference/responses-streaming):
//! `response.created`, `response.in_progress`, then per output item `response.output_item.added`,
//! its deltas (`response.reasoning_summary_text.delta` / `response.output_text.delta` per word,
//! `response.function_call_arguments.delta` in fragments) between their part and `.done`
//! events, `response.output_item.done`, and at last `response.completed` (or
//! `response.incomplete`) with the whole response; no `[DONE]`. Error statuses carry
//! `{"error": {message, type, param, code}}`; a stream's error is an `error` event.
//!
//! With reasoning asked for (`reasoning` set: a reasoning model) a reply starts with a
//! reasoning item (`rs_fake<n>`): its summary is the fake's thought when `reasoning.summary`
//! is set, and with `include: ["reasoning.encrypted_content"]` it carries an encrypted content
//! sealed by the fake (the thought and the item id under a secret), which it verifies when the
//! item comes back. Usage reports `input_tokens_details.cached_tokens` (what [`prompt`] read
//! from the fake's prompt cache) and
//! `output_tokens_details.reasoning_tokens`. The fake refuses what OpenAI refuses: see
//! [`refuse`] for each rule and where OpenAI states it. With a context window set
//! ([`FakeServer::set_context_window`]) a request too long for it is refused with OpenAI's 400
//! (see [`context_error`]).

use std::collections::HashSet;
use std::ops::Deref;

use serde_json::{Value, json};

use crate::fake::{FakeServer, Overflow, Rendered, Reply, ReplyKind, Wire, fragments, sse, words};
use crate::fake_prompt_cache::{Prompt, PromptBlock, canonical, tokens_of};

/// The `created_at` timestamp of every response.
const CREATED: u64 = 1_700_000_000;

/// The key the fake seals reasoning with (OpenAI's is its own; clients only pass it back).
const SECRET: &str = "fake-openai-reasoning-key";

/// A running fake Responses server; derefs to [`FakeServer`] for scripting and inspection.
pub struct FakeOpenAiResponses {
    server: FakeServer,
}

impl FakeOpenAiResponses {
    /// Starts a fake on `127.0.0.1:0`.
    pub async fn start() -> Self {
        let wire = Wire {
            name: "openai-responses",
            path: "/v1/responses",
            request_id_header: "x-request-id",
            render,
            stream_error,
            error_body: crate::fake_openai::error_body,
            refuse,
            prompt,
            caches: true,
            requested_output,
            context_error,
        };
        FakeOpenAiResponses { server: FakeServer::start(wire).await }
    }

    /// The fake with a context window of `window` tokens (see [`FakeServer::set_context_window`]).
    pub fn with_context_window(self, window: u64) -> Self {
        self.server.set_context_window(Some(window));
        self
    }

    /// The base URL a client is configured with: `http://127.0.0.1:<port>/v1`.
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.server.root_url())
    }
}

impl Deref for FakeOpenAiResponses {
    type Target = FakeServer;

    fn deref(&self) -> &FakeServer {
        &self.server
    }
}

/// The fake's thought about a request: a line naming how many input items it read.
pub fn thought(request: &Value) -> String {
    let read = request.get("input").and_then(Value::as_array).map_or(0, Vec::len);
    format!("Reading the {read} input items so far before answering.")
}

/// The encrypted content of reasoning item `id` with `text`: the text and a keyed hash of it
/// and the id, so a changed text, id or hash fails to verify.
pub fn seal(id: &str, text: &str) -> String {
    let hex: String = text.bytes().map(|b| format!("{b:02x}")).collect();
    format!("gAAAAfake{hex}.{:016x}", keyed_hash(id, text))
}

/// The text sealed in `content` for item `id`, if it verifies.
fn unseal(id: &str, content: &str) -> Option<String> {
    let (hex, hash) = content.strip_prefix("gAAAAfake")?.split_once('.')?;
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| hex.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect::<Option<Vec<u8>>>()?;
    let text = String::from_utf8(bytes).ok()?;
    (format!("{:016x}", keyed_hash(id, &text)) == hash).then_some(text)
}

fn keyed_hash(id: &str, text: &str) -> u64 {
    [SECRET, "\0", id, "\0", text]
        .iter()
        .flat_map(|s| s.bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn render(reply: &Reply, request: &Value, serial: u64) -> Rendered {
    if let ReplyKind::Raw { status, content_type, body } = &reply.kind {
        return Rendered::Raw { status: *status, content_type: content_type.clone(), body: body.clone() };
    }
    let model = reply.model_for(request, "gpt-fake");
    let (text, calls) = reply.answer();
    let (prompt, completion) = reply.tokens();
    // The input as the prompt cache served it, unless the test set the usage itself.
    let (prompt, cached) = match reply.cache.filter(|_| reply.usage.is_none()) {
        Some(used) => (used.input(), used.read),
        None => (prompt, 0),
    };

    // The output items, whole.
    let reasoning = request.get("reasoning").is_some_and(Value::is_object).then(|| thought(request));
    let summarized = request.pointer("/reasoning/summary").is_some_and(|s| !s.is_null());
    let encrypted = request
        .get("include")
        .and_then(Value::as_array)
        .is_some_and(|i| i.iter().any(|v| v == "reasoning.encrypted_content"));
    let reasoning_id = format!("rs_fake{serial}");
    let mut output = Vec::new();
    if let Some(thought) = &reasoning {
        let mut item = json!({ "id": reasoning_id, "type": "reasoning", "summary": [] });
        if summarized {
            item["summary"] = json!([{ "type": "summary_text", "text": thought }]);
        }
        if encrypted {
            item["encrypted_content"] = json!(seal(&reasoning_id, thought));
        }
        output.push(item);
    }
    let message_id = format!("msg_fake{serial}");
    if let Some(text) = text {
        output.push(json!({
            "id": message_id, "type": "message", "status": "completed", "role": "assistant",
            "content": [{ "type": "output_text", "text": text, "annotations": [], "logprobs": [] }],
        }));
    }
    for (i, call) in calls.iter().enumerate() {
        output.push(json!({
            "id": format!("fc_fake{serial}_{i}"), "type": "function_call", "status": "completed",
            "call_id": call.id, "name": call.name, "arguments": call.arguments,
        }));
    }
    let reasoning_tokens = reasoning.as_deref().map_or(0, |t| t.split_whitespace().count() as u64);
    let usage = json!({
        "input_tokens": prompt,
        "input_tokens_details": { "cached_tokens": cached },
        "output_tokens": completion + reasoning_tokens,
        "output_tokens_details": { "reasoning_tokens": reasoning_tokens },
        "total_tokens": prompt + completion + reasoning_tokens,
    });
    let (status, incomplete) = match reply.finish.as_deref() {
        Some(reason @ ("max_output_tokens" | "content_filter")) => {
            ("incomplete", json!({ "reason": reason }))
        }
        _ => ("completed", Value::Null),
    };
    let response = |status: &str, output: Value, usage: Value, incomplete: Value| {
        json!({
            "id": format!("resp_fake{serial}"),
            "object": "response",
            "created_at": CREATED,
            "status": status,
            "background": false,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": request.get("instructions").cloned().unwrap_or(Value::Null),
            "max_output_tokens": request.get("max_output_tokens").cloned().unwrap_or(Value::Null),
            "model": model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": null,
            "prompt_cache_key": request.get("prompt_cache_key").cloned().unwrap_or(Value::Null),
            "reasoning": {
                "effort": request.pointer("/reasoning/effort").cloned().unwrap_or(Value::Null),
                "summary": request.pointer("/reasoning/summary").cloned().unwrap_or(Value::Null),
            },
            "store": request.get("store").cloned().unwrap_or(json!(true)),
            "temperature": request.get("temperature").cloned().unwrap_or(json!(1.0)),
            "text": { "format": { "type": "text" } },
            "tool_choice": "auto",
            "tools": request.get("tools").cloned().unwrap_or(json!([])),
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": null,
            "metadata": {},
        })
    };
    let whole = response(status, Value::Array(output.clone()), usage, incomplete);
    if request.get("stream") != Some(&Value::Bool(true)) {
        return Rendered::Json { status: 200, body: whole };
    }

    let mut events = Events::default();
    let started = response("in_progress", json!([]), Value::Null, Value::Null);
    events.push("response.created", json!({ "response": started.clone() }));
    events.push("response.in_progress", json!({ "response": started }));
    for (index, item) in output.iter().enumerate() {
        let at = |mut fields: Value| {
            fields["output_index"] = json!(index);
            fields
        };
        let id = item["id"].clone();
        match item["type"].as_str() {
            Some("reasoning") => {
                // The added item's encrypted content may be incomplete (OpenAI's note): none here.
                events.push(
                    "response.output_item.added",
                    at(json!({ "item": {
                    "id": id, "type": "reasoning", "summary": [] } })),
                );
                if let Some(summary) = item["summary"][0]["text"].as_str() {
                    let part = json!({ "item_id": id, "summary_index": 0 });
                    events.push(
                        "response.reasoning_summary_part.added",
                        at(with(&part, "part", json!({ "type": "summary_text", "text": "" }))),
                    );
                    for word in words(summary) {
                        events.push(
                            "response.reasoning_summary_text.delta",
                            at(with(&part, "delta", json!(word))),
                        );
                    }
                    events.push(
                        "response.reasoning_summary_text.done",
                        at(with(&part, "text", json!(summary))),
                    );
                    events.push(
                        "response.reasoning_summary_part.done",
                        at(with(&part, "part", json!({ "type": "summary_text", "text": summary }))),
                    );
                }
            }
            Some("message") => {
                let text = item["content"][0]["text"].as_str().unwrap_or_default();
                events.push("response.output_item.added", at(json!({ "item": {
                    "id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": [] } })));
                let part = json!({ "item_id": id, "content_index": 0 });
                events.push(
                    "response.content_part.added",
                    at(with(&part, "part", json!({ "type": "output_text", "text": "", "annotations": [] }))),
                );
                for word in words(text) {
                    let mut delta = with(&part, "delta", json!(word));
                    delta["logprobs"] = json!([]);
                    events.push("response.output_text.delta", at(delta));
                }
                events.push("response.output_text.done", at(with(&part, "text", json!(text))));
                events
                    .push("response.content_part.done", at(with(&part, "part", item["content"][0].clone())));
            }
            _ => {
                let mut added = item.clone();
                added["arguments"] = json!("");
                added["status"] = json!("in_progress");
                events.push("response.output_item.added", at(json!({ "item": added })));
                let arguments = item["arguments"].as_str().unwrap_or_default();
                for fragment in fragments(arguments, reply.fragment_chars) {
                    events.push(
                        "response.function_call_arguments.delta",
                        at(json!({ "item_id": id, "delta": fragment })),
                    );
                }
                events.push(
                    "response.function_call_arguments.done",
                    at(json!({ "item_id": id, "arguments": arguments })),
                );
            }
        }
        events.push("response.output_item.done", at(json!({ "item": item })));
    }
    let end = if status == "completed" { "response.completed" } else { "response.incomplete" };
    events.push(end, json!({ "response": whole }));
    Rendered::Events(events.sse)
}

/// `base` with one more field.
fn with(base: &Value, key: &str, value: Value) -> Value {
    let mut out = base.clone();
    out[key] = value;
    out
}

/// Stream events, numbered as OpenAI numbers them (`sequence_number`).
#[derive(Default)]
struct Events {
    sse: Vec<String>,
}

impl Events {
    fn push(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sse.len());
        self.sse.push(sse(Some(kind), &data.to_string()));
    }
}

/// A stream's `error` event (https://platform.openai.com/docs/api-reference/responses-streaming/error).
fn stream_error(code: &str, message: &str) -> String {
    let data =
        json!({"type": "error", "code": code, "message": message, "param": null, "sequence_number": 0});
    sse(Some("error"), &data.to_string())
}

/// The output a request asks room for: its `max_output_tokens` ("Create a model response"), or 0.
fn requested_output(request: &Value) -> u64 {
    request.get("max_output_tokens").and_then(Value::as_u64).unwrap_or(0)
}

/// OpenAI's refusal of a request that does not fit the model's context window: HTTP 400 with
/// `{"error": {message, type: "invalid_request_error", param: "input", code:
/// "context_length_exceeded"}}`; the message, the same whatever the counts, states neither the
/// tokens nor the window. The whole body as the Responses API sends it is quoted in
/// https://github.com/openai/codex/issues/20866 and https://github.com/openai/codex/issues/19269
/// (the Codex CLI is a Responses client), the message also in
/// https://github.com/openai/codex/issues/3177. That `max_output_tokens` counts against the
/// window too is the fake's choice, as Chat Completions counts the completion asked for: OpenAI
/// does not document whether the Responses API holds room for it.
fn context_error(_: &Overflow) -> Value {
    json!({"error": {
        "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded"
    }})
}

/// The request body's top-level fields the API knows ("Create a model response",
/// https://platform.openai.com/docs/api-reference/responses/create).
const FIELDS: &[&str] = &[
    "background",
    "context_management",
    "conversation",
    "include",
    "input",
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "model",
    "parallel_tool_calls",
    "previous_response_id",
    "prompt",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "truncation",
    "user",
];

/// What the Responses API refuses of a request (answered 400; the messages are OpenAI's):
///
/// - a top-level field it does not know (`Unknown parameter`; the fields of "Create a model
///   response", https://platform.openai.com/docs/api-reference/responses/create), a
///   `reasoning.effort` or `reasoning.summary` it does not take (same page);
/// - a function tool in the Chat Completions shape, `{type, function: {name, ...}}`: the
///   Responses API takes `{type, name, description, parameters, strict}` flat ("Function
///   calling", https://platform.openai.com/docs/guides/function-calling; the API reports the
///   missing `tools[i].name`);
/// - input items: a message role other than `user`, `assistant`, `system`, `developer`;
///   content other than `output_text`/`refusal` in an assistant message or other than
///   `input_text`/`input_image`/`input_file` in the others and in a `function_call_output`'s
///   `output` list (the input item list of "Create a model response");
/// - with `store: false`, anything referring to a stored item by id only, an `item_reference`
///   or `previous_response_id`: nothing was stored ("Conversation state",
///   https://platform.openai.com/docs/guides/conversation-state; `store` on "Create a model
///   response"), and this fake stores nothing either;
/// - a reasoning item sent back without its `encrypted_content` (with `store: false` the API
///   looks the item up by id and finds nothing) or with one changed (`invalid_encrypted_content`);
///   the encrypted content is what carries reasoning across stateless requests ("Reasoning
///   models", encrypted reasoning items, https://platform.openai.com/docs/guides/reasoning;
///   `include` on "Create a model response");
/// - a reasoning item with nothing after it, or directly before the next input message: it
///   must be followed by the item it led to (the API's "provided without its required
///   following item");
/// - a `function_call_output` whose `call_id` matches no `function_call` before it, and a
///   `function_call` without its output ("Function calling": each output answers its call by
///   `call_id`);
/// - with reasoning on, a run of function calls since the last user message that does not
///   start with the reasoning item that led to it. The reasoning guide ("Keeping reasoning
///   items in context") asks for every reasoning item since the last user message to be sent
///   back with the calls; the API enforces it for calls sent with their item ids ("Item
///   'fc_…' of type 'function_call' was provided without its required 'reasoning' item") and
///   otherwise answers, worse. The fake refuses both, so a client that drops them is seen.
pub fn refuse(request: &Value) -> Option<String> {
    let body = request.as_object()?;
    if let Some(key) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Some(format!("Unknown parameter: '{key}'."));
    }
    if let Some(reasoning) = body.get("reasoning").filter(|r| !r.is_null()) {
        let allowed = [
            ("effort", &["none", "minimal", "low", "medium", "high", "xhigh", "max"][..]),
            ("summary", &["auto", "concise", "detailed"][..]),
        ];
        for (field, values) in allowed {
            if let Some(value) = reasoning.get(field).filter(|v| !v.is_null())
                && !value.as_str().is_some_and(|v| values.contains(&v))
            {
                return Some(format!(
                    "Invalid value: {value}. Supported values are: {values:?}. (reasoning.{field})"
                ));
            }
        }
    }
    for (i, tool) in body.get("tools").and_then(Value::as_array).into_iter().flatten().enumerate() {
        if tool.get("type") == Some(&json!("function")) && tool.get("name").is_none() {
            return Some(format!("Missing required parameter: 'tools[{i}].name'."));
        }
        if let Some(key) = tool.as_object().and_then(|t| t.keys().find(|k| k.as_str() == "function")) {
            return Some(format!("Unknown parameter: 'tools[{i}].{key}'."));
        }
    }
    let stateless = body.get("store") == Some(&json!(false));
    if stateless && let Some(id) = body.get("previous_response_id").and_then(Value::as_str) {
        return Some(format!("Previous response with id '{id}' not found."));
    }
    let input = match body.get("input") {
        Some(Value::Array(items)) => items.as_slice(),
        _ => &[],
    };
    check_items(input, stateless).or_else(|| check_calls(input)).or_else(|| {
        let reasoning_on = body.get("reasoning").is_some_and(Value::is_object);
        if reasoning_on { check_reasoning_kept(input) } else { None }
    })
}

/// The parts of a content list (a string has none) whose types are all `allowed`, or the
/// refusal naming the first that is not, at `path`.
fn check_parts(content: Option<&Value>, allowed: &[&str], path: &str) -> Option<String> {
    let parts = content.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    parts.iter().enumerate().find_map(|(j, part)| {
        let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
        (!allowed.contains(&kind)).then(|| {
            format!("Invalid value: '{kind}'. Supported values are: {allowed:?}. ({path}[{j}].type)")
        })
    })
}

/// The type of an input item (`message` when it only has a role).
fn item_type(item: &Value) -> &str {
    match item.get("type").and_then(Value::as_str) {
        Some(kind) => kind,
        None if item.get("role").is_some() => "message",
        None => "",
    }
}

fn not_persisted(id: &str) -> String {
    format!(
        "Item with id '{id}' not found. Items are not persisted when `store` is set to false. Try again \
         with `store` set to true, or remove this item from your input."
    )
}

/// Message roles and content, item references, reasoning items.
fn check_items(input: &[Value], stateless: bool) -> Option<String> {
    for (i, item) in input.iter().enumerate() {
        match item_type(item) {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or_default();
                let allowed: &[&str] = match role {
                    "assistant" => &["output_text", "refusal"],
                    "user" | "system" | "developer" => &["input_text", "input_image", "input_file"],
                    other => {
                        return Some(format!(
                            "Invalid value: '{other}'. Supported values are: 'assistant', 'system', 'developer', and 'user'. (input[{i}].role)"
                        ));
                    }
                };
                if let Some(refused) =
                    check_parts(item.get("content"), allowed, &format!("input[{i}].content"))
                {
                    return Some(refused);
                }
            }
            "function_call_output" => {
                let allowed = &["input_text", "input_image", "input_file"];
                if let Some(refused) = check_parts(item.get("output"), allowed, &format!("input[{i}].output"))
                {
                    return Some(refused);
                }
            }
            "item_reference" if stateless => {
                return Some(not_persisted(item.get("id").and_then(Value::as_str).unwrap_or_default()));
            }
            "reasoning" => {
                let id = item.get("id").and_then(Value::as_str).unwrap_or_default();
                if item.get("summary").is_none() {
                    return Some(format!("Missing required parameter: 'input[{i}].summary'."));
                }
                match item.get("encrypted_content").and_then(Value::as_str) {
                    None if stateless => return Some(not_persisted(id)),
                    None => return Some(format!("Item with id '{id}' not found.")),
                    Some(content) if unseal(id, content).is_none() => {
                        return Some(format!(
                            "The encrypted content for item {id} could not be verified. Reason: Encrypted content \
                             could not be decrypted or parsed."
                        ));
                    }
                    Some(_) => {}
                }
                let follows = input.get(i + 1).is_some_and(|next| match item_type(next) {
                    "message" => next.get("role") == Some(&json!("assistant")),
                    "function_call_output" | "reasoning" | "item_reference" => false,
                    _ => true,
                });
                if !follows {
                    return Some(format!(
                        "Item '{id}' of type 'reasoning' was provided without its required following item."
                    ));
                }
            }
            _ => {}
        }
    }
    None
}

/// Every output answers an earlier call, every call has its output.
fn check_calls(input: &[Value]) -> Option<String> {
    let call_id = |item: &Value| item.get("call_id").and_then(Value::as_str).unwrap_or_default().to_owned();
    let mut called = HashSet::new();
    let mut answered = HashSet::new();
    for item in input {
        match item_type(item) {
            "function_call" => {
                called.insert(call_id(item));
            }
            "function_call_output" => {
                let id = call_id(item);
                if !called.contains(&id) {
                    return Some(format!("No tool call found for function call output with call_id {id}."));
                }
                answered.insert(id);
            }
            _ => {}
        }
    }
    let missing = input
        .iter()
        .filter(|i| item_type(i) == "function_call")
        .map(call_id)
        .find(|id| !answered.contains(id));
    missing.map(|id| format!("No tool output found for function call {id}."))
}

/// With reasoning on: every run of the model's items since the last user message that calls
/// a function starts with a reasoning item.
fn check_reasoning_kept(input: &[Value]) -> Option<String> {
    let is_user = |item: &Value| item_type(item) == "message" && item.get("role") == Some(&json!("user"));
    let start = input.iter().rposition(is_user).map_or(0, |i| i + 1);
    let mut run: Vec<&Value> = Vec::new();
    for item in input[start..].iter().chain([&Value::Null]) {
        if matches!(item_type(item), "reasoning" | "function_call")
            || (item_type(item) == "message" && item.get("role") == Some(&json!("assistant")))
        {
            run.push(item);
            continue;
        }
        if let Some(call) = run.iter().find(|i| item_type(i) == "function_call")
            && run.first().map(|i| item_type(i)) != Some("reasoning")
        {
            let id = call.get("call_id").and_then(Value::as_str).unwrap_or_default();
            return Some(format!(
                "Item with call_id '{id}' of type 'function_call' was provided without its required 'reasoning' item."
            ));
        }
        run.clear();
    }
    None
}

/// The request as OpenAI's prompt cache sees it ("Prompt caching",
/// https://platform.openai.com/docs/guides/prompt-caching): caching is automatic, for prompts
/// of 1,024 tokens and more, on the exact prefix (instructions, tools, then the input items
/// in order), so every item ends a prefix that may be cached and read back.
fn prompt(request: &Value) -> Prompt {
    let model = request.get("model").and_then(Value::as_str).unwrap_or_default();
    let mut blocks = Vec::new();
    let mut push = |value: &Value| {
        let key = canonical(value);
        blocks.push(PromptBlock { tokens: tokens_of(&key), key, breakpoint: true });
    };
    if let Some(instructions) = request.get("instructions") {
        push(&json!({ "instructions": instructions }));
    }
    for tool in request.get("tools").and_then(Value::as_array).into_iter().flatten() {
        push(tool);
    }
    for item in request.get("input").and_then(Value::as_array).into_iter().flatten() {
        push(item);
    }
    Prompt { scope: model.to_owned(), blocks, min_tokens: 1024 }
}
