//! A fake Anthropic Messages server: `POST /v1/messages`.
//!
//! Answers `message` objects, or with `"stream": true` a `text/event-stream` of named events
//! the way Anthropic sends them: `message_start` (usage with the input tokens), per content
//! block a `content_block_start`, its `content_block_delta`s (`text_delta` per word;
//! `input_json_delta` with an empty first fragment, then the argument string in fragments) and
//! `content_block_stop`, a `ping` after the first block starts, `message_delta` with the stop
//! reason and output tokens, and `message_stop`. Error statuses (and the `error` event of
//! [`Reply::error_after`]) carry `{"type": "error", "error": {type, message}}`.

use std::ops::Deref;

use serde_json::{Value, json};

use crate::fake::{FakeServer, Rendered, Reply, ReplyKind, Wire, fragments, sse, words};

/// A running fake Anthropic server; derefs to [`FakeServer`] for scripting and inspection.
pub struct FakeAnthropic {
    server: FakeServer,
}

impl FakeAnthropic {
    /// Starts a fake on `127.0.0.1:0`.
    pub async fn start() -> Self {
        let wire = Wire {
            name: "anthropic",
            path: "/v1/messages",
            request_id_header: "request-id",
            render,
            stream_error,
            error_body,
        };
        FakeAnthropic { server: FakeServer::start(wire).await }
    }

    /// The base URL a client is configured with: `http://127.0.0.1:<port>` (no `/v1`).
    pub fn base_url(&self) -> String {
        self.server.root_url()
    }
}

impl Deref for FakeAnthropic {
    type Target = FakeServer;

    fn deref(&self) -> &FakeServer {
        &self.server
    }
}

fn render(reply: &Reply, request: &Value, serial: u64) -> Rendered {
    if let ReplyKind::Raw { status, content_type, body } = &reply.kind {
        return Rendered::Raw { status: *status, content_type: content_type.clone(), body: body.clone() };
    }
    let model = reply
        .model
        .clone()
        .or_else(|| request.get("model").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "claude-fake".to_owned());
    let id = format!("msg_fake{serial}");
    let (text, calls) = reply.answer();
    let stop =
        reply.finish.clone().unwrap_or_else(|| if calls.is_empty() { "end_turn" } else { "tool_use" }.into());
    let (prompt, completion) = reply.tokens();

    if request.get("stream") != Some(&Value::Bool(true)) {
        let mut content = Vec::new();
        if let Some(text) = text {
            content.push(json!({"type": "text", "text": text}));
        }
        for call in calls {
            content.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input(&call.arguments)}));
        }
        let body = json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": null,
            "usage": {
                "input_tokens": prompt,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": completion,
                "service_tier": "standard"
            }
        });
        return Rendered::Json { status: 200, body };
    }

    let event = |name: &str, data: Value| sse(Some(name), &data.to_string());
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": 1, "service_tier": "standard"}
        }}),
    )];
    let ping = || event("ping", json!({"type": "ping"}));
    let mut index = 0_u64;
    if let Some(text) = text {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        ));
        events.push(ping());
        for word in words(text) {
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": word}}),
            ));
        }
        events.push(event("content_block_stop", json!({"type": "content_block_stop", "index": index})));
        index += 1;
    }
    for call in calls {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}}),
        ));
        if index == 0 {
            events.push(ping());
        }
        let mut pieces = vec![String::new()];
        pieces.extend(fragments(&call.arguments, reply.fragment_chars));
        for piece in pieces {
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": piece}}),
            ));
        }
        events.push(event("content_block_stop", json!({"type": "content_block_stop", "index": index})));
        index += 1;
    }
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": completion}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    Rendered::Events(events)
}

/// A tool call's argument string as Anthropic's `input` object.
fn input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => json!({}),
    }
}

/// Anthropic's error type for a status.
fn error_kind(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

fn error_body(status: u16, kind: Option<&str>, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind.unwrap_or(error_kind(status)), "message": message}})
}

fn stream_error(kind: &str, message: &str) -> String {
    sse(Some("error"), &json!({"type": "error", "error": {"type": kind, "message": message}}).to_string())
}
