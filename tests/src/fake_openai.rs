//! A fake OpenAI Chat Completions server: `POST /v1/chat/completions`.
//!
//! Answers `chat.completion` objects, or with `"stream": true` a `text/event-stream` of
//! `chat.completion.chunk`s the way OpenAI sends them: a first chunk with the role, one chunk
//! per word of text, per tool call a chunk with its index, id, type and name (empty
//! arguments) followed by chunks carrying argument fragments, a chunk with an empty delta and
//! the finish reason, a usage chunk with no choices when the request asked for
//! `stream_options.include_usage` (every chunk then carries `"usage": null` before it), and
//! `data: [DONE]`. Error statuses carry `{"error": {message, type, param, code}}`.
//!
//! Usage reports the request's input tokens as the fake counts them ([`prompt`]; no prompt
//! cache: `cached_tokens` is 0). With a context window set ([`FakeServer::set_context_window`])
//! a request too long for it is refused with OpenAI's 400 (see [`context_error`]).

use std::ops::Deref;

use serde_json::{Value, json};

use crate::fake::{FakeServer, Overflow, Rendered, Reply, Wire, fragments, sse, words};
use crate::fake_prompt_cache::{Prompt, PromptBlock, canonical, tokens_of};

/// The `created` timestamp of every answer.
const CREATED: u64 = 1_700_000_000;

/// A running fake OpenAI server; derefs to [`FakeServer`] for scripting and inspection.
pub struct FakeOpenAi {
    server: FakeServer,
}

impl FakeOpenAi {
    /// Starts a fake on `127.0.0.1:0`.
    pub async fn start() -> Self {
        let wire = Wire {
            name: "openai",
            path: "/v1/chat/completions",
            request_id_header: "x-request-id",
            render,
            stream_error,
            error_body,
            refuse,
            prompt,
            caches: false,
            requested_output,
            context_error,
        };
        FakeOpenAi { server: FakeServer::start(wire).await }
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

impl Deref for FakeOpenAi {
    type Target = FakeServer;

    fn deref(&self) -> &FakeServer {
        &self.server
    }
}

/// What Chat Completions refuses of a request (answered 400, the message OpenAI's): a tool
/// message whose content has a part other than text ("Create chat completion", the tool
/// message's `content`: "An array of content parts with a defined type. For tool messages,
/// only type `text` is supported", https://platform.openai.com/docs/api-reference/chat/create).
fn refuse(request: &Value) -> Option<String> {
    let messages = request.get("messages")?.as_array()?;
    messages.iter().enumerate().find_map(|(i, message)| {
        if message.get("role") != Some(&json!("tool")) {
            return None;
        }
        let parts = message.get("content").and_then(Value::as_array)?;
        parts.iter().enumerate().find_map(|(j, part)| {
            let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
            (kind != "text").then(|| {
                format!(
                    "Invalid value: '{kind}'. Supported values are: 'text'. (messages[{i}].content[{j}].type)"
                )
            })
        })
    })
}

/// The request as the fake counts its input tokens: each tool, then each message.
fn prompt(request: &Value) -> Prompt {
    let model = request.get("model").and_then(Value::as_str).unwrap_or_default();
    let tools = request.get("tools").and_then(Value::as_array).into_iter().flatten();
    let messages = request.get("messages").and_then(Value::as_array).into_iter().flatten();
    let blocks = tools
        .chain(messages)
        .map(|block| {
            let key = canonical(block);
            PromptBlock { tokens: tokens_of(&key), key, breakpoint: false }
        })
        .collect();
    Prompt { scope: model.to_owned(), blocks, min_tokens: 1024 }
}

/// The output a request asks room for: `max_completion_tokens`, else `max_tokens` (which it
/// deprecates, "Create chat completion",
/// https://platform.openai.com/docs/api-reference/chat/create), else 0.
fn requested_output(request: &Value) -> u64 {
    ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|field| request.get(*field).and_then(Value::as_u64))
        .unwrap_or(0)
}

/// OpenAI's refusal of a request that does not fit the model's context window: HTTP 400,
/// `invalid_request_error`, `param` `messages`, `code` `context_length_exceeded`, the messages
/// OpenAI's own, as reported verbatim:
/// - the messages alone too long: `This model's maximum context length is 4097 tokens.
///   However, your messages resulted in 4619 tokens. Please reduce the length of the
///   messages.` (whole body in https://github.com/ChatGPTNextWeb/NextChat/issues/625 and
///   https://github.com/chathub-dev/chathub/issues/126);
/// - the messages fit but not with the completion asked for: `This model's maximum context
///   length is 4097 tokens. However, you requested 4268 tokens (4012 in the messages, 256 in
///   the completion). Please reduce the length of the messages or completion.`
///   (https://github.com/conghaonet/hao_chatgpt/issues/4,
///   https://github.com/n3d1117/chatgpt-telegram-bot/issues/174).
fn context_error(overflow: &Overflow) -> Value {
    let message = match *overflow {
        Overflow::Input { input, window } => format!(
            "This model's maximum context length is {window} tokens. However, your messages resulted in {input} \
             tokens. Please reduce the length of the messages."
        ),
        Overflow::Output { input, output, window } => format!(
            "This model's maximum context length is {window} tokens. However, you requested {} tokens ({input} in \
             the messages, {output} in the completion). Please reduce the length of the messages or completion.",
            input + output
        ),
    };
    json!({"error": {
        "message": message,
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded"
    }})
}

fn render(reply: &Reply, request: &Value, serial: u64) -> Rendered {
    if let crate::fake::ReplyKind::Raw { status, content_type, body } = &reply.kind {
        return Rendered::Raw { status: *status, content_type: content_type.clone(), body: body.clone() };
    }
    let model = reply.model_for(request, "gpt-fake");
    let id = format!("chatcmpl-fake{serial}");
    let (text, calls) = reply.answer();
    let finish =
        reply.finish.clone().unwrap_or_else(|| if calls.is_empty() { "stop" } else { "tool_calls" }.into());
    let (prompt, completion) = reply.tokens();
    let usage = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0
        }
    });

    if request.get("stream") != Some(&Value::Bool(true)) {
        let mut message = json!({"role": "assistant", "content": text, "refusal": null, "annotations": []});
        if !calls.is_empty() {
            message["tool_calls"] = calls
                .iter()
                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                .collect();
        }
        let body = json!({
            "id": id,
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
            "usage": usage,
            "service_tier": "default",
            "system_fingerprint": "fp_fake"
        });
        return Rendered::Json { status: 200, body };
    }

    let include_usage = request.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
    let chunk = |choices: Value, usage: Option<&Value>| {
        let mut chunk = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
            "choices": choices,
        });
        if include_usage {
            chunk["usage"] = usage.cloned().unwrap_or(Value::Null);
        }
        sse(None, &chunk.to_string())
    };
    let choice = |delta: Value, finish: Option<&str>| json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);

    let mut events = Vec::new();
    let first_content = if text.is_some() { json!("") } else { Value::Null };
    events.push(chunk(
        choice(json!({"role": "assistant", "content": first_content, "refusal": null}), None),
        None,
    ));
    for word in words(text.unwrap_or_default()) {
        events.push(chunk(choice(json!({"content": word}), None), None));
    }
    for (index, call) in calls.iter().enumerate() {
        let start = json!({"tool_calls": [{
            "index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": ""}
        }]});
        events.push(chunk(choice(start, None), None));
        for fragment in fragments(&call.arguments, reply.fragment_chars) {
            let more = json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]});
            events.push(chunk(choice(more, None), None));
        }
    }
    events.push(chunk(choice(json!({}), Some(&finish)), None));
    if include_usage {
        events.push(chunk(json!([]), Some(&usage)));
    }
    events.push(sse(None, "[DONE]"));
    Rendered::Events(events)
}

/// OpenAI's error type and code for a status.
fn error_kind(status: u16) -> (&'static str, Value) {
    match status {
        401 => ("invalid_request_error", json!("invalid_api_key")),
        403 => ("invalid_request_error", json!("unsupported_country_region_territory")),
        404 => ("invalid_request_error", json!("model_not_found")),
        429 => ("requests", json!("rate_limit_exceeded")),
        500..=599 => ("server_error", Value::Null),
        _ => ("invalid_request_error", Value::Null),
    }
}

/// OpenAI's error body for a status (Chat Completions and Responses alike).
pub(crate) fn error_body(status: u16, kind: Option<&str>, message: &str) -> Value {
    let (default_kind, code) = error_kind(status);
    json!({"error": {"message": message, "type": kind.unwrap_or(default_kind), "param": null, "code": code}})
}

fn stream_error(kind: &str, message: &str) -> String {
    sse(None, &json!({"error": {"message": message, "type": kind, "param": null, "code": null}}).to_string())
}
