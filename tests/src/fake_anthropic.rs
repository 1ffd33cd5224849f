//! A fake Anthropic Messages server: `POST /v1/messages`.
//!
//! Answers `message` objects, or with `"stream": true` a `text/event-stream` of named events
//! the way Anthropic sends them: `message_start` (usage with the input tokens), per content
//! block a `content_block_start`, its `content_block_delta`s (`text_delta` per word;
//! `input_json_delta` with an empty first fragment, then the argument string in fragments) and
//! `content_block_stop`, a `ping` after the first block starts, `message_delta` with the stop
//! reason and output tokens, and `message_stop`. Error statuses (and the `error` event of
//! [`Reply::error_after`]) carry `{"type": "error", "error": {type, message}}`.
//!
//! With thinking on (`thinking.type` `enabled` or `adaptive`) a reply starts with a `thinking`
//! block signed by the fake (streamed as `thinking_delta`s, then one `signature_delta`), and
//! the fake refuses, as Anthropic does, a request that does not send those blocks back: see
//! [`refuse`] for each rule and where Anthropic states it.
//!
//! With a context window set ([`FakeServer::set_context_window`]) a request too long for it is
//! refused with Anthropic's 400 (see [`context_error`]).

use std::ops::Deref;

use serde_json::{Value, json};

use crate::fake::{FakeServer, Overflow, Rendered, Reply, ReplyKind, Wire, fragments, sse, words};
use crate::fake_prompt_cache::{CacheUse, Prompt, PromptBlock, canonical, tokens_of};

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
            refuse,
            prompt,
            caches: true,
            requested_output,
            context_error,
        };
        FakeAnthropic { server: FakeServer::start(wire).await }
    }

    /// The fake with a context window of `window` tokens (see [`FakeServer::set_context_window`]).
    pub fn with_context_window(self, window: u64) -> Self {
        self.server.set_context_window(Some(window));
        self
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
    let model = reply.model_for(request, "claude-fake");
    let id = format!("msg_fake{serial}");
    let (text, calls) = reply.answer();
    let stop =
        reply.finish.clone().unwrap_or_else(|| if calls.is_empty() { "end_turn" } else { "tool_use" }.into());
    let (prompt, completion) = reply.tokens();
    // The input as the prompt cache served it, unless the test set the usage itself.
    let cache = reply.cache.filter(|_| reply.usage.is_none()).unwrap_or(CacheUse {
        uncached: prompt,
        read: 0,
        write: 0,
    });
    let thinking = thinking_on(request).then(|| thought(request));

    if request.get("stream") != Some(&Value::Bool(true)) {
        let mut content = Vec::new();
        if let Some(thinking) = &thinking {
            content.push(json!({"type": "thinking", "thinking": thinking, "signature": sign(thinking)}));
        }
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
                "input_tokens": cache.uncached,
                "cache_creation_input_tokens": cache.write,
                "cache_read_input_tokens": cache.read,
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
            "usage": {"input_tokens": cache.uncached, "cache_creation_input_tokens": cache.write,
                      "cache_read_input_tokens": cache.read, "output_tokens": 1, "service_tier": "standard"}
        }}),
    )];
    let ping = || event("ping", json!({"type": "ping"}));
    let mut index = 0_u64;
    if let Some(thinking) = &thinking {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ));
        events.push(ping());
        for word in words(thinking) {
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "thinking_delta", "thinking": word}}),
            ));
        }
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                   "delta": {"type": "signature_delta", "signature": sign(thinking)}}),
        ));
        events.push(event("content_block_stop", json!({"type": "content_block_stop", "index": index})));
        index += 1;
    }
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

/// The output a request asks room for: its `max_tokens` (required by the Messages API; 0 when
/// missing).
fn requested_output(request: &Value) -> u64 {
    request.get("max_tokens").and_then(Value::as_u64).unwrap_or(0)
}

/// Anthropic's refusal of a request that does not fit the model's context window: HTTP 400,
/// `invalid_request_error` (the error shape and the request id header of "HTTP errors",
/// https://docs.claude.com/en/api/errors), with the API's own messages:
/// - the input alone too long: `prompt is too long: 208310 tokens > 200000 maximum`
///   (reported verbatim in https://github.com/anthropics/claude-code/issues/12186 and
///   https://github.com/boldsoftware/exe.dev/issues/62);
/// - the input fits but not with `max_tokens`, which the window must also hold (the context
///   window is "all the text a language model can reference when generating a response,
///   including the response itself", "Context windows",
///   https://platform.claude.com/docs/en/build-with-claude/context-windows): ``input length and
///   `max_tokens` exceed context limit: 178959 + 64000 > 200000, decrease input length or
///   `max_tokens` and try again`` (verbatim in https://github.com/docker/docker-agent/issues/569
///   and https://github.com/anthropics/claude-code/issues/408).
///
/// Not to be confused with 413 `request_too_large`, a limit on the request's bytes (32 MB for
/// the Messages API) that Cloudflare answers before the API counts any token.
fn context_error(overflow: &Overflow) -> Value {
    let message = match *overflow {
        Overflow::Input { input, window } => format!("prompt is too long: {input} tokens > {window} maximum"),
        Overflow::Output { input, output, window } => format!(
            "input length and `max_tokens` exceed context limit: {input} + {output} > {window}, decrease input \
             length or `max_tokens` and try again"
        ),
    };
    error_body(400, None, &message)
}

fn stream_error(kind: &str, message: &str) -> String {
    sse(Some("error"), &json!({"type": "error", "error": {"type": kind, "message": message}}).to_string())
}

/// Models that take only adaptive thinking.
const ADAPTIVE_ONLY: &[&str] = &[
    "claude-opus-4-7",
    "claude-mythos",
    "claude-opus-5",
    "claude-sonnet-5",
    "claude-haiku-5",
    "claude-fable-5",
];
/// Models that take adaptive thinking beside the (deprecated) budgeted form.
const ADAPTIVE_TOO: &[&str] = &["claude-opus-4-6", "claude-sonnet-4-6"];

/// Whether the request turns thinking on (`thinking: {type: "enabled" | "adaptive"}`).
fn thinking_on(request: &Value) -> bool {
    matches!(request.pointer("/thinking/type").and_then(Value::as_str), Some("enabled" | "adaptive"))
}

/// The fake's thinking about a request: a line naming how many messages it read.
fn thought(request: &Value) -> String {
    let read = request.get("messages").and_then(Value::as_array).map_or(0, Vec::len);
    format!("Reading the {read} messages so far before answering.")
}

/// The fake's signature of a thinking text (Anthropic's is opaque and verified server-side;
/// this one only has to change with the text).
fn sign(thinking: &str) -> String {
    let hash = thinking
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("fake-sig-{hash:016x}")
}

/// What Anthropic refuses of a request: always, misplaced `cache_control` marks
/// ([`refuse_cache_control`]) and tool results carrying blocks it does not take
/// ([`refuse_tool_result_content`]); while thinking is on (the rules of "Thinking with tool
/// use" and "Preserving thinking blocks",
/// https://platform.claude.com/docs/build-with-claude/thinking-tool-workflows and
/// https://docs.claude.com/en/docs/build-with-claude/extended-thinking):
/// - the final assistant message, the one whose `tool_use` blocks the trailing `tool_result`s
///   answer, must start with a `thinking` or `redacted_thinking` block ("a final `assistant`
///   message must start with a thinking block"; the message of the 400 below is Anthropic's);
/// - a thinking block sent back must be the one the API sent, unmodified: its `signature`
///   must verify ("pass thinking blocks back complete and unmodified").
/// - the thinking form must be one the model takes: Opus 4.7, the Mythos models and the Claude
///   5 family take only adaptive thinking (`thinking.type: "enabled"` is a 400, the message
///   below is Anthropic's); Opus 4.6 and Sonnet 4.6 take both; older models know only the
///   budgeted form (Anthropic's "Adaptive thinking" page, and Amazon Bedrock's
///   https://docs.aws.amazon.com/bedrock/latest/userguide/claude-messages-adaptive-thinking.html);
///   `output_config.effort` is one of `low`, `medium`, `high`, `max`.
fn refuse(request: &Value) -> Option<String> {
    if let Some(reason) = refuse_cache_control(request).or_else(|| refuse_tool_result_content(request)) {
        return Some(reason);
    }
    let model = request.get("model").and_then(Value::as_str).unwrap_or_default();
    let listed = |models: &[&str]| models.iter().any(|m| model.starts_with(m));
    match request.pointer("/thinking/type").and_then(Value::as_str) {
        Some("enabled") if listed(ADAPTIVE_ONLY) => {
            return Some(
                "\"thinking.type.enabled\" is not supported for this model. Use \"thinking.type.adaptive\" and \
                 \"output_config.effort\" to control thinking behavior."
                    .to_owned(),
            );
        }
        Some("adaptive") if !listed(ADAPTIVE_ONLY) && !listed(ADAPTIVE_TOO) => {
            return Some(format!("thinking.type: adaptive thinking is not supported on {model}"));
        }
        _ => {}
    }
    if let Some(effort) = request.pointer("/output_config/effort")
        && !matches!(effort.as_str(), Some("low" | "medium" | "high" | "max"))
    {
        return Some(format!(
            "output_config.effort: Input should be 'low', 'medium', 'high' or 'max', not {effort}"
        ));
    }
    if !thinking_on(request) {
        return None;
    }
    let messages = request.get("messages")?.as_array()?;
    for (i, message) in messages.iter().enumerate() {
        for (j, block) in message.get("content").and_then(Value::as_array).into_iter().flatten().enumerate() {
            if block.get("type") == Some(&json!("thinking")) {
                let text = block.get("thinking").and_then(Value::as_str).unwrap_or_default();
                if block.get("signature").and_then(Value::as_str) != Some(sign(text).as_str()) {
                    return Some(format!(
                        "messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                    ));
                }
            }
        }
    }
    // The tool-use cycle in progress: the last assistant message, answered by tool results.
    let last = messages.iter().rposition(|m| m.get("role") == Some(&json!("assistant")))?;
    let content = messages[last].get("content")?.as_array()?;
    let calls_tools = content.iter().any(|b| b.get("type") == Some(&json!("tool_use")));
    let answered = messages.get(last + 1).is_some_and(|next| {
        next.get("content")
            .and_then(Value::as_array)
            .is_some_and(|blocks| blocks.iter().any(|b| b.get("type") == Some(&json!("tool_result"))))
    });
    let first = content.first().and_then(|b| b.get("type")).and_then(Value::as_str).unwrap_or("text");
    if calls_tools && answered && !matches!(first, "thinking" | "redacted_thinking") {
        return Some(format!(
            "messages.{last}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. \
             When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding \
             the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks \
             from previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation \
             at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
        ));
    }
    None
}

/// A `tool_result` whose content has a block other than `text`, `image`, `document` or
/// `search_result` (the Messages API reference, `tool_result.content`,
/// https://docs.claude.com/en/api/messages; the message is the API's validation error).
fn refuse_tool_result_content(request: &Value) -> Option<String> {
    const ALLOWED: [&str; 4] = ["text", "image", "document", "search_result"];
    let messages = request.get("messages")?.as_array()?;
    for (i, message) in messages.iter().enumerate() {
        for (j, block) in message.get("content").and_then(Value::as_array).into_iter().flatten().enumerate() {
            if block.get("type") != Some(&json!("tool_result")) {
                continue;
            }
            for (k, inner) in block.get("content").and_then(Value::as_array).into_iter().flatten().enumerate()
            {
                let kind = inner.get("type").and_then(Value::as_str).unwrap_or_default();
                if !ALLOWED.contains(&kind) {
                    return Some(format!(
                        "messages.{i}.content.{j}.tool_result.content.{k}.type: Input tag '{kind}' found using \
                         'type' does not match any of the expected tags: {}",
                        ALLOWED.map(|t| format!("'{t}'")).join(", ")
                    ));
                }
            }
        }
    }
    None
}

/// Every block of a request in the order Anthropic's prompt cache reads it (tools, system,
/// messages), with where it is: `tools.0`, `system.0`, `messages.3.content.1`.
fn cache_order(request: &Value) -> Vec<(String, Value)> {
    let mut blocks = Vec::new();
    for (i, tool) in request.get("tools").and_then(Value::as_array).into_iter().flatten().enumerate() {
        blocks.push((format!("tools.{i}"), tool.clone()));
    }
    match request.get("system") {
        Some(Value::String(text)) => {
            blocks.push(("system".to_owned(), json!({"type": "text", "text": text})))
        }
        Some(Value::Array(parts)) => {
            blocks.extend(parts.iter().enumerate().map(|(j, b)| (format!("system.{j}"), b.clone())));
        }
        _ => {}
    }
    for (i, message) in request.get("messages").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let role = message.get("role").cloned().unwrap_or(Value::Null);
        match message.get("content") {
            Some(Value::String(text)) => {
                blocks.push((
                    format!("messages.{i}.content"),
                    json!({"role": role, "type": "text", "text": text}),
                ));
            }
            Some(Value::Array(parts)) => {
                for (j, block) in parts.iter().enumerate() {
                    let mut block = block.clone();
                    if let Some(object) = block.as_object_mut() {
                        object.insert("role".into(), role.clone());
                    }
                    blocks.push((format!("messages.{i}.content.{j}"), block));
                }
            }
            _ => {}
        }
    }
    blocks
}

/// The request as Anthropic's prompt cache sees it.
fn prompt(request: &Value) -> Prompt {
    let model = request.get("model").and_then(Value::as_str).unwrap_or_default();
    let blocks = cache_order(request)
        .into_iter()
        .map(|(_, mut block)| {
            let breakpoint = block.as_object_mut().and_then(|b| b.remove("cache_control")).is_some();
            let key = canonical(&block);
            PromptBlock { tokens: tokens_of(&key), key, breakpoint }
        })
        .collect();
    Prompt { scope: model.to_owned(), blocks, min_tokens: min_cacheable_tokens(model) }
}

/// "Minimum cacheable prompt length" (Anthropic's "Prompt caching" page): 4,096 tokens for
/// Claude Opus 4.5 and later Opus models and for Haiku 4.5, 2,048 for the Haiku 3 models,
/// 1,024 for the others.
fn min_cacheable_tokens(model: &str) -> u64 {
    const LONGEST: &[&str] = &["claude-opus-4-5", "claude-opus-4-6", "claude-opus-4-7", "claude-haiku-4-5"];
    const LONGER: &[&str] = &["claude-3-haiku", "claude-3-5-haiku"];
    if LONGEST.iter().any(|m| model.starts_with(m)) {
        4096
    } else if LONGER.iter().any(|m| model.starts_with(m)) {
        2048
    } else {
        1024
    }
}

/// What Anthropic refuses of a request's `cache_control` marks ("Prompt caching",
/// https://docs.claude.com/en/docs/build-with-claude/prompt-caching):
/// - at most 4 blocks carry `cache_control` ("You can define up to 4 cache breakpoints"; the
///   message below is Anthropic's);
/// - its `type` is `ephemeral`, its `ttl`, when given, `5m` or `1h`;
/// - a `1h` breakpoint may not follow a `5m` one in cache order ("cache entries with longer
///   TTL must appear before shorter TTLs");
/// - thinking blocks cannot be marked ("Thinking blocks cannot be explicitly marked with
///   `cache_control`", "Extended thinking" page), nor can empty text blocks.
fn refuse_cache_control(request: &Value) -> Option<String> {
    let marked: Vec<(String, Value, Value)> = cache_order(request)
        .into_iter()
        .filter_map(|(at, block)| block.get("cache_control").cloned().map(|c| (at, block, c)))
        .collect();
    if marked.len() > 4 {
        return Some(format!(
            "A maximum of 4 blocks with cache_control may be provided. Found {}.",
            marked.len()
        ));
    }
    let mut seen_short = false;
    for (at, block, control) in &marked {
        if control.get("type") != Some(&json!("ephemeral")) {
            return Some(format!("{at}.cache_control.type: Input should be 'ephemeral'"));
        }
        let ttl = control.get("ttl").and_then(Value::as_str).unwrap_or("5m");
        match ttl {
            "5m" => seen_short = true,
            "1h" if seen_short => {
                return Some(format!(
                    "{at}.cache_control.ttl: a ttl='1h' cache_control block must not come after a ttl='5m' one"
                ));
            }
            "1h" => {}
            other => {
                return Some(format!("{at}.cache_control.ttl: Input should be '5m' or '1h', not {other:?}"));
            }
        }
        let kind = block.get("type").and_then(Value::as_str).unwrap_or_default();
        if matches!(kind, "thinking" | "redacted_thinking") {
            return Some(format!("{at}.{kind}.cache_control: Extra inputs are not permitted"));
        }
        if kind == "text" && block.get("text").and_then(Value::as_str) == Some("") {
            return Some(format!("{at}: cache_control cannot be set for empty text blocks"));
        }
    }
    None
}
