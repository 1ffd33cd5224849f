//! Anthropic Messages: request bodies, `message` responses, and the message stream's SSE events.
//!
//! Decisions:
//!
//! - System prompt: the leading `system` messages, joined by a blank line, become the top-level
//!   `system` string; a `system` message after the first non-system one is an error (Anthropic
//!   has no system turn), and so is a non-text part in a system message.
//! - Tool results: each `tool` message becomes a `tool_result` block (`tool_use_id` from
//!   `tool_call_id`, required) in a `user` message; consecutive tool messages share one.
//! - Assistant tool calls become `tool_use` blocks after the text (empty text is left out). The
//!   argument string is parsed into `input`; a string that is not a JSON object (empty,
//!   malformed, or another JSON type) becomes `{}`, because Anthropic insists on an object and
//!   a conversation holding one malformed call must still be sendable (the engine has already
//!   answered that call with an error).
//! - Content parts: text as is; `image_url` data URLs (base64 only) become a `base64` image
//!   source and `http(s)` URLs a `url` source; `file` parts that are PDFs become `document`
//!   blocks titled with the file name, image files become image blocks, other files are an
//!   error; `input_audio` and `video_url` are errors. Assistant messages carry text only.
//! - Tools become `{name, description, input_schema}`, the schema defaulting to an empty
//!   object schema; an empty tool list is left out; the output schema is not sent.
//! - `max_tokens` (required by Anthropic) is `max_completion_tokens`, else
//!   [`DEFAULT_MAX_TOKENS`] plus the thinking budget, so the default still leaves room to answer.
//! - Reasoning turns thinking on when `max_tokens`, `enabled: true` or an effort other than
//!   `none` is set, unless `enabled` is `false` or effort is `none`, in the form the model
//!   takes ([`LlmRequest::thinking_form`] when the configuration names it, else
//!   [`thinking_form`] of the model's id): from Claude 4.6 on, adaptive thinking (`thinking: {type:
//!   "adaptive"}`, the effort as `output_config.effort`: `xhigh` is `max`, `minimal` is `low`;
//!   Opus 4.7 and later refuse the budgeted form, and 4.6 deprecates it), and before it,
//!   budgeted thinking (`thinking: {type: "enabled", budget_tokens}`), the budget
//!   `reasoning.max_tokens`, else [`effort_budget`] of the effort, else
//!   [`DEFAULT_THINKING_BUDGET`]. Conflicts with other settings (a temperature other than 1, a
//!   budget not below `max_tokens`) are left for Anthropic to reject. `exclude` has no
//!   Anthropic equivalent: callers drop streamed reasoning themselves.
//! - Thinking blocks survive the transcript: a reply's `thinking` blocks (with their
//!   `signature`) and `redacted_thinking` blocks are kept, as sent, in its
//!   [`ProviderBlocks`] (provider [`PROVIDER`]), and lead the assistant message's content when
//!   it is sent back, unchanged (Anthropic requires the signed thinking block of the turn that
//!   called a tool, while thinking is on). Another format's blocks are left out.
//! - Prompt caching, when the request asks for it ([`LlmRequest::cache`], which the engine sets
//!   on the calls it runs): `cache_control` breakpoints on the last tool, the system prompt and
//!   the last two messages (see [`mark_cache_breakpoints`]).
//! - Responses: `text` blocks are concatenated, `tool_use` blocks become tool calls with
//!   `input` serialized as the argument string, `thinking` text is the reasoning, and other
//!   block kinds are skipped. `stop_reason` maps to the neutral finish reason (see
//!   [`finish_reason`]); usage passes through, in streams `message_start`'s usage updated by
//!   `message_delta`'s.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::FormatError;
use super::json::{
    get, index, join, number, object, opt_object, opt_str, provider_error, req_array, req_object, req_str,
    req_u64,
};
pub use crate::protocol::ThinkingForm;
use crate::protocol::{
    CacheTtl, Content, ContentPart, DraftMessage, Effort, FileData, LlmRequest, LlmResponse, LlmTool,
    ProviderBlocks, ReasoningConfig, Role, StreamDelta, ToolCall, ToolCallDelta,
};

/// The [`ProviderBlocks::provider`] of blocks this format wrote.
pub const PROVIDER: &str = "anthropic";

/// `max_tokens` when the request sets no `max_completion_tokens` (the thinking budget is added on top).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The thinking budget when reasoning is enabled with neither a token budget nor an effort.
pub const DEFAULT_THINKING_BUDGET: u64 = 4096;

/// The thinking budget for an effort level; `None` for [`Effort::None`].
pub fn effort_budget(effort: Effort) -> Option<u64> {
    match effort {
        Effort::Xhigh => Some(32_768),
        Effort::High => Some(16_384),
        Effort::Medium => Some(8_192),
        Effort::Low => Some(2_048),
        Effort::Minimal => Some(1_024),
        Effort::None => None,
    }
}

/// The thinking form of `model`, by its version: the first number in its id is the major
/// version and the next, when there is one, the minor (ids put them after the family,
/// `claude-opus-4-7`, `claude-sonnet-4-5-20250929`, or before it, `claude-3-7-sonnet-...`; an
/// eight-digit date is not a version). Adaptive from 4.6 on; an id without a version keeps the
/// budgeted form.
pub fn thinking_form(model: &str) -> ThinkingForm {
    match version(model).as_slice() {
        [major, ..] if *major >= 5 => ThinkingForm::Adaptive,
        [4, minor, ..] if *minor >= 6 => ThinkingForm::Adaptive,
        _ => ThinkingForm::Budget,
    }
}

/// The major and minor version in a Claude model id, as far as it names them.
fn version(model: &str) -> Vec<u64> {
    model
        .split(['-', '.', '@', ':', '/'])
        .filter(|token| !token.is_empty() && token.len() < 8 && token.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|token| token.parse().ok())
        .take(2)
        .collect()
}

/// Interleaved thinking's beta (thinking between tool calls, not only before the first).
pub const INTERLEAVED_THINKING_BETA: &str = "interleaved-thinking-2025-05-14";

/// The `anthropic-beta` header a request body needs: a Claude 4 model before 4.6 thinks
/// between tool calls only with [`INTERLEAVED_THINKING_BETA`], so a budgeted thinking request
/// that offers tools asks for it. Adaptive thinking interleaves by itself, and Claude 3.7 has
/// no interleaved thinking ("Interleaved thinking", in "Extended thinking",
/// https://docs.claude.com/en/docs/build-with-claude/extended-thinking).
pub fn beta_header(body: &Value) -> Option<&'static str> {
    let model = body.get("model")?.as_str()?;
    let budgeted = body.pointer("/thinking/type").and_then(Value::as_str) == Some("enabled");
    let tools = body.get("tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty());
    (budgeted && tools && version(model).first() == Some(&4)).then_some(INTERLEAVED_THINKING_BETA)
}

/// Adaptive thinking's `output_config.effort` for a neutral effort (`None` for no effort).
fn adaptive_effort(effort: Effort) -> Option<&'static str> {
    match effort {
        Effort::Xhigh => Some("max"),
        Effort::High => Some("high"),
        Effort::Medium => Some("medium"),
        Effort::Low | Effort::Minimal => Some("low"),
        Effort::None => None,
    }
}

/// The thinking budget `reasoning` asks for, or `None` when thinking stays off.
pub fn thinking_budget(reasoning: &ReasoningConfig) -> Option<u64> {
    if reasoning.enabled == Some(false) || reasoning.effort == Some(Effort::None) {
        return None;
    }
    if let Some(budget) = reasoning.max_tokens {
        return Some(budget);
    }
    if let Some(effort) = reasoning.effort {
        return effort_budget(effort);
    }
    (reasoning.enabled == Some(true)).then_some(DEFAULT_THINKING_BUDGET)
}

/// The Messages request body for `req`; fails on content Anthropic cannot carry.
pub fn request(req: &LlmRequest, stream: bool) -> Result<Value, FormatError> {
    let leading = req.messages.iter().take_while(|m| m.role == Role::System).count();
    let mut system = Vec::new();
    for (i, m) in req.messages.iter().enumerate().take(leading) {
        if let Some(content) = &m.content {
            system.push(system_text(content, &format!("messages[{i}].content"))?);
        }
    }

    let mut messages = Vec::new();
    let mut results = Vec::new();
    for (i, m) in req.messages.iter().enumerate().skip(leading) {
        let path = index("messages", i);
        if m.role == Role::Tool {
            results.push(tool_result(m, &path)?);
            continue;
        }
        flush_results(&mut messages, &mut results);
        match m.role {
            Role::User => messages.push(json!({ "role": "user", "content": user_content(m, &path)? })),
            Role::Assistant => messages.push(assistant(m, &path)?),
            Role::System | Role::Tool => {
                return Err(FormatError::new(
                    join(&path, "role"),
                    "Anthropic takes system messages only at the start of the conversation",
                ));
            }
        }
    }
    flush_results(&mut messages, &mut results);

    let budget = req.reasoning.as_ref().and_then(thinking_budget);
    let max_tokens =
        req.max_completion_tokens.unwrap_or_else(|| DEFAULT_MAX_TOKENS.saturating_add(budget.unwrap_or(0)));

    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("max_tokens".into(), json!(max_tokens));
    body.insert("messages".into(), Value::Array(messages));
    let system = system.into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>();
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    if let Some(tools) = req.tools.as_ref().filter(|t| !t.is_empty()) {
        body.insert("tools".into(), tools.iter().map(tool).collect());
    }
    if let Some(temperature) = req.temperature {
        body.insert("temperature".into(), number(temperature));
    }
    match (budget, req.thinking_form.unwrap_or_else(|| thinking_form(&req.model))) {
        (None, _) => {}
        (Some(budget), ThinkingForm::Budget) => {
            body.insert("thinking".into(), json!({ "type": "enabled", "budget_tokens": budget }));
        }
        (Some(_), ThinkingForm::Adaptive) => {
            body.insert("thinking".into(), json!({ "type": "adaptive" }));
            let effort = req.reasoning.as_ref().and_then(|r| r.effort).and_then(adaptive_effort);
            if let Some(effort) = effort {
                body.insert("output_config".into(), json!({ "effort": effort }));
            }
        }
    }
    if stream {
        body.insert("stream".into(), json!(true));
    }
    if let Some(cache) = &req.cache {
        mark_cache_breakpoints(&mut body, cache.ttl);
    }
    Ok(Value::Object(body))
}

/// Anthropic's limit of `cache_control` breakpoints per request ("up to 4 cache breakpoints",
/// docs.claude.com/en/docs/build-with-claude/prompt-caching).
pub const MAX_CACHE_BREAKPOINTS: usize = 4;

/// Marks the request's cache breakpoints, at most [`MAX_CACHE_BREAKPOINTS`]: the last tool and
/// the system prompt (stable for the whole session), and the last cacheable block of each of
/// the last two messages. A prefix is cached up to its breakpoint, and a later request finds
/// it by looking back from its own breakpoints (Anthropic looks at most 20 blocks back), so the
/// breakpoint on the newest message lets the next step read the whole conversation before it
/// from the cache, and the one before it is a fallback when that entry was not written (a
/// failed attempt, an eviction). All share one `ttl`: Anthropic requires a longer-lived
/// breakpoint not to follow a shorter-lived one. It is always given explicitly, as the default
/// has changed before.
fn mark_cache_breakpoints(body: &mut Map<String, Value>, ttl: CacheTtl) {
    let control = json!({ "type": "ephemeral", "ttl": ttl.name() });
    if let Some(Value::Object(last)) =
        body.get_mut("tools").and_then(Value::as_array_mut).and_then(|t| t.last_mut())
    {
        last.insert("cache_control".into(), control.clone());
    }
    if let Some(Value::String(system)) = body.get("system") {
        let block = json!([{ "type": "text", "text": system, "cache_control": control }]);
        body.insert("system".into(), block);
    }
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else { return };
    for message in messages.iter_mut().rev().take(2) {
        let Some(content) = message.get_mut("content") else { continue };
        if let Value::String(text) = content {
            if text.is_empty() {
                continue;
            }
            *content = json!([{ "type": "text", "text": text }]);
        }
        // Thinking blocks cannot carry `cache_control`, and an empty text block is refused.
        let cacheable = content.as_array_mut().and_then(|blocks| {
            blocks.iter_mut().rev().find(|b| {
                let empty_text = b.get("type") == Some(&json!("text")) && b.get("text") == Some(&json!(""));
                let thinking =
                    matches!(b.get("type").and_then(Value::as_str), Some("thinking" | "redacted_thinking"));
                !(thinking || empty_text)
            })
        });
        if let Some(Value::Object(block)) = cacheable {
            block.insert("cache_control".into(), control.clone());
        }
    }
}

fn flush_results(messages: &mut Vec<Value>, results: &mut Vec<Value>) {
    if !results.is_empty() {
        messages.push(json!({ "role": "user", "content": std::mem::take(results) }));
    }
}

fn system_text(content: &Content, path: &str) -> Result<String, FormatError> {
    match content {
        Content::Text(text) => Ok(text.clone()),
        Content::Parts(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                match p {
                    ContentPart::Text { text } => texts.push(text.as_str()),
                    other => {
                        return Err(FormatError::new(
                            index(path, j),
                            format!(
                                "an Anthropic system prompt carries only text, not {} parts",
                                other.kind()
                            ),
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
    }
}

fn user_content(m: &DraftMessage, path: &str) -> Result<Value, FormatError> {
    match &m.content {
        None => Ok(json!("")),
        Some(Content::Text(text)) => Ok(json!(text)),
        Some(Content::Parts(parts)) => blocks(parts, &join(path, "content")),
    }
}

fn blocks(parts: &[ContentPart], path: &str) -> Result<Value, FormatError> {
    parts.iter().enumerate().map(|(j, p)| part_block(p, &index(path, j))).collect()
}

fn tool_result(m: &DraftMessage, path: &str) -> Result<Value, FormatError> {
    let id = m.tool_call_id.as_ref().ok_or_else(|| {
        FormatError::new(join(path, "tool_call_id"), "a tool message must name the call it answers")
    })?;
    let mut block = Map::new();
    block.insert("type".into(), json!("tool_result"));
    block.insert("tool_use_id".into(), json!(id));
    match &m.content {
        None => {}
        Some(Content::Text(text)) => {
            block.insert("content".into(), json!(text));
        }
        Some(Content::Parts(parts)) => {
            block.insert("content".into(), blocks(parts, &join(path, "content"))?);
        }
    }
    Ok(Value::Object(block))
}

fn assistant(m: &DraftMessage, path: &str) -> Result<Value, FormatError> {
    let calls = m.tool_calls.as_deref().unwrap_or_default();
    let kept: &[Value] = match &m.provider_blocks {
        Some(kept) if kept.provider == PROVIDER => &kept.blocks,
        _ => &[],
    };
    if calls.is_empty() && kept.is_empty() {
        match &m.content {
            None => return Ok(json!({ "role": "assistant", "content": "" })),
            Some(Content::Text(text)) => return Ok(json!({ "role": "assistant", "content": text })),
            Some(Content::Parts(_)) => {}
        }
    }
    let mut texts: Vec<&str> = Vec::new();
    match &m.content {
        None => {}
        Some(Content::Text(text)) => texts.push(text),
        Some(Content::Parts(parts)) => {
            for (j, p) in parts.iter().enumerate() {
                match p {
                    ContentPart::Text { text } => texts.push(text),
                    // Images a model produced are its output, not something a model takes
                    // back: they stay in the transcript and are left out of the request.
                    ContentPart::ImageUrl { .. } => {}
                    other => {
                        return Err(FormatError::new(
                            index(&join(path, "content"), j),
                            format!(
                                "Anthropic assistant messages carry only text, not {} parts",
                                other.kind()
                            ),
                        ));
                    }
                }
            }
        }
    }
    let mut out: Vec<Value> = kept.to_vec();
    out.extend(
        texts.into_iter().filter(|t| !t.is_empty()).map(|text| json!({ "type": "text", "text": text })),
    );
    for call in calls {
        out.push(json!({
            "type": "tool_use",
            "id": call.id,
            "name": call.function.name,
            "input": tool_input(&call.function.arguments),
        }));
    }
    Ok(json!({ "role": "assistant", "content": out }))
}

/// The argument string as a `tool_use` input: the JSON object it holds, else `{}`.
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => json!({}),
    }
}

fn part_block(part: &ContentPart, path: &str) -> Result<Value, FormatError> {
    match part {
        ContentPart::Text { text } => Ok(json!({ "type": "text", "text": text })),
        ContentPart::ImageUrl { image_url } => {
            let url = &image_url.url;
            let url_path = join(path, "image_url.url");
            let source = if url.starts_with("data:") {
                let (media_type, data) = data_url(url, &url_path)?;
                json!({ "type": "base64", "media_type": media_type, "data": data })
            } else if is_http(url) {
                json!({ "type": "url", "url": url })
            } else {
                return Err(FormatError::new(url_path, "Anthropic takes images as data: or http(s) URLs"));
            };
            Ok(json!({ "type": "image", "source": source }))
        }
        ContentPart::File { file } => file_block(file, path),
        ContentPart::InputAudio { .. } => {
            Err(FormatError::new(path, "Anthropic cannot carry input_audio parts"))
        }
        ContentPart::VideoUrl { .. } => Err(FormatError::new(path, "Anthropic cannot carry video_url parts")),
    }
}

fn is_http(url: &str) -> bool {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// Splits `data:<media type>[;params];base64,<data>` into media type and data.
fn data_url<'a>(url: &'a str, path: &str) -> Result<(&'a str, &'a str), FormatError> {
    let rest = url.strip_prefix("data:").unwrap_or(url);
    let (meta, data) =
        rest.split_once(',').ok_or_else(|| FormatError::new(path, "malformed data URL: no comma"))?;
    let meta = meta
        .strip_suffix(";base64")
        .ok_or_else(|| FormatError::new(path, "Anthropic takes base64 data URLs only"))?;
    let media_type = meta.split(';').next().unwrap_or_default().trim();
    if media_type.is_empty() {
        return Err(FormatError::new(path, "the data URL names no media type"));
    }
    Ok((media_type, data))
}

fn media_type_of(filename: &str) -> Option<&'static str> {
    let ext = filename.rsplit_once('.')?.1.to_ascii_lowercase();
    match ext.as_str() {
        "pdf" => Some("application/pdf"),
        "png" => Some("image/png"),
        "jpg" | "jpeg" => Some("image/jpeg"),
        "gif" => Some("image/gif"),
        "webp" => Some("image/webp"),
        _ => None,
    }
}

fn file_block(file: &FileData, path: &str) -> Result<Value, FormatError> {
    let data_path = join(path, "file.file_data");
    let (media_type, data) = if file.file_data.starts_with("data:") {
        data_url(&file.file_data, &data_path)?
    } else {
        let media_type = media_type_of(&file.filename).ok_or_else(|| {
            FormatError::new(
                join(path, "file.filename"),
                format!("cannot tell the media type of {:?}; send the file as a data URL", file.filename),
            )
        })?;
        (media_type, file.file_data.as_str())
    };
    let source = json!({ "type": "base64", "media_type": media_type, "data": data });
    if media_type == "application/pdf" {
        let mut block = Map::new();
        block.insert("type".into(), json!("document"));
        block.insert("source".into(), source);
        if !file.filename.is_empty() {
            block.insert("title".into(), json!(file.filename));
        }
        Ok(Value::Object(block))
    } else if media_type.starts_with("image/") {
        Ok(json!({ "type": "image", "source": source }))
    } else {
        Err(FormatError::new(
            data_path,
            format!("Anthropic takes PDF and image files only, not {media_type}"),
        ))
    }
}

fn tool(tool: &LlmTool) -> Value {
    let schema = tool.input.clone().unwrap_or_else(|| json!({ "type": "object", "properties": {} }));
    json!({ "name": tool.name, "description": tool.description, "input_schema": schema })
}

/// The neutral finish reason for an Anthropic `stop_reason`.
///
/// `end_turn` and `stop_sequence` -> `stop`, `tool_use` -> `tool_calls`, `max_tokens` and
/// `model_context_window_exceeded` -> `length`, `refusal` -> `content_filter`; others
/// (`pause_turn`, future values) pass through unchanged.
pub fn finish_reason(stop_reason: &str) -> String {
    match stop_reason {
        "end_turn" | "stop_sequence" => "stop",
        "tool_use" => "tool_calls",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "refusal" => "content_filter",
        other => other,
    }
    .to_owned()
}

/// Parses a `message` body; an `{"type": "error", "error": ...}` body is an error at path `error`.
pub fn response(body: &Value) -> Result<LlmResponse, FormatError> {
    let obj = object(body, "")?;
    if let Some(err) = provider_error(obj) {
        return Err(err);
    }
    let model = req_str(obj, "model", "")?.to_owned();
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut tool_calls = Vec::new();
    let mut kept = Vec::new();
    for (i, block) in req_array(obj, "content", "")?.iter().enumerate() {
        let path = index("content", i);
        let raw = block;
        let block = object(block, &path)?;
        match req_str(block, "type", &path)? {
            "text" => text.push_str(req_str(block, "text", &path)?),
            "thinking" => {
                reasoning.push_str(opt_str(block, "thinking", &path)?.unwrap_or_default());
                kept.push(raw.clone());
            }
            "redacted_thinking" => kept.push(raw.clone()),
            "tool_use" => {
                let id = req_str(block, "id", &path)?;
                let name = req_str(block, "name", &path)?;
                let input = get(block, "input").map_or_else(|| "{}".to_owned(), Value::to_string);
                tool_calls.push(ToolCall::function(id, name, input));
            }
            _ => {}
        }
    }
    Ok(LlmResponse {
        model,
        content: Some(text).filter(|t| !t.is_empty()),
        tool_calls: Some(tool_calls).filter(|c| !c.is_empty()),
        finish_reason: opt_str(obj, "stop_reason", "")?.map(finish_reason),
        usage: get(obj, "usage").cloned(),
        cost: None,
        images: None,
        reasoning: Some(reasoning).filter(|r| !r.is_empty()),
        provider_blocks: kept_blocks(kept),
    })
}

/// The blocks a reply must send back, as this format's [`ProviderBlocks`] (none: `None`).
fn kept_blocks(blocks: Vec<Value>) -> Option<Box<ProviderBlocks>> {
    (!blocks.is_empty()).then(|| Box::new(ProviderBlocks { provider: PROVIDER.to_owned(), blocks }))
}

/// Assembles a streamed answer from the message stream's SSE events.
#[derive(Debug, Clone, Default)]
pub struct StreamAccumulator {
    model: Option<String>,
    usage: Option<Map<String, Value>>,
    blocks: BTreeMap<u64, Block>,
    stop_reason: Option<String>,
    stopped: bool,
}

#[derive(Debug, Clone)]
enum Block {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
        initial: Value,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    /// A block kept whole as it started (`redacted_thinking`).
    Kept(Value),
    Other,
}

impl StreamAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one SSE event: its `event:` name (empty: read `data.type`) and parsed `data:`; returns what to forward.
    pub fn push(&mut self, event: &str, data: &Value) -> Result<Option<StreamDelta>, FormatError> {
        let obj = object(data, event)?;
        let name = if event.is_empty() { req_str(obj, "type", "")? } else { event };
        let mut delta = StreamDelta::default();
        match name {
            "message_start" => {
                let message = req_object(obj, "message", name)?;
                let base = join(name, "message");
                self.model = Some(req_str(message, "model", &base)?.to_owned());
                self.usage = opt_object(message, "usage", &base)?.cloned();
            }
            "content_block_start" => self.block_start(obj, name, &mut delta)?,
            "content_block_delta" => self.block_delta(obj, name, &mut delta)?,
            "message_delta" => {
                if let Some(d) = opt_object(obj, "delta", name)?
                    && let Some(reason) = opt_str(d, "stop_reason", &join(name, "delta"))?
                {
                    let reason = finish_reason(reason);
                    self.stop_reason = Some(reason.clone());
                    delta.finish_reason = Some(reason);
                }
                if let Some(usage) = opt_object(obj, "usage", name)? {
                    let merged = self.usage.get_or_insert_with(Map::new);
                    for (key, value) in usage.iter().filter(|(_, v)| !v.is_null()) {
                        merged.insert(key.clone(), value.clone());
                    }
                }
            }
            "message_stop" => self.stopped = true,
            "error" => {
                return Err(provider_error(obj)
                    .unwrap_or_else(|| FormatError::new("error", "the stream reported an error")));
            }
            // `ping`, `content_block_stop`, and event kinds added later carry nothing to keep.
            _ => {}
        }
        Ok(Some(delta).filter(|d| *d != StreamDelta::default()))
    }

    fn block_start(
        &mut self,
        obj: &Map<String, Value>,
        name: &str,
        out: &mut StreamDelta,
    ) -> Result<(), FormatError> {
        let idx = req_u64(obj, "index", name)?;
        let block = req_object(obj, "content_block", name)?;
        let path = join(name, "content_block");
        let block = match req_str(block, "type", &path)? {
            "text" => {
                let text = opt_str(block, "text", &path)?.unwrap_or_default();
                if !text.is_empty() {
                    out.text = Some(text.to_owned());
                }
                Block::Text(text.to_owned())
            }
            "tool_use" => {
                let id = req_str(block, "id", &path)?.to_owned();
                let tool = req_str(block, "name", &path)?.to_owned();
                out.tool_calls = Some(vec![ToolCallDelta {
                    id: id.as_str().into(),
                    name: Some(tool.clone()),
                    arguments: None,
                }]);
                let initial = get(block, "input").cloned().unwrap_or(Value::Null);
                Block::ToolUse { id, name: tool, json: String::new(), initial }
            }
            "thinking" => {
                let thinking = opt_str(block, "thinking", &path)?.unwrap_or_default();
                if !thinking.is_empty() {
                    out.reasoning = Some(thinking.to_owned());
                }
                let signature = opt_str(block, "signature", &path)?.unwrap_or_default().to_owned();
                Block::Thinking { thinking: thinking.to_owned(), signature }
            }
            "redacted_thinking" => Block::Kept(Value::Object(block.clone())),
            _ => Block::Other,
        };
        if self.blocks.insert(idx, block).is_some() {
            return Err(FormatError::new(join(name, "index"), format!("content block {idx} started twice")));
        }
        Ok(())
    }

    fn block_delta(
        &mut self,
        obj: &Map<String, Value>,
        name: &str,
        out: &mut StreamDelta,
    ) -> Result<(), FormatError> {
        let idx = req_u64(obj, "index", name)?;
        let d = req_object(obj, "delta", name)?;
        let path = join(name, "delta");
        let kind = req_str(d, "type", &path)?;
        let block = self.blocks.get_mut(&idx).ok_or_else(|| {
            FormatError::new(join(name, "index"), format!("content block {idx} was never started"))
        })?;
        match (kind, block) {
            ("text_delta", Block::Text(text)) => {
                let more = req_str(d, "text", &path)?;
                text.push_str(more);
                if !more.is_empty() {
                    out.text = Some(more.to_owned());
                }
            }
            ("input_json_delta", Block::ToolUse { id, json, .. }) => {
                let more = req_str(d, "partial_json", &path)?;
                json.push_str(more);
                if !more.is_empty() {
                    out.tool_calls = Some(vec![ToolCallDelta {
                        id: id.as_str().into(),
                        name: None,
                        arguments: Some(more.to_owned()),
                    }]);
                }
            }
            ("thinking_delta", Block::Thinking { thinking, .. }) => {
                let more = req_str(d, "thinking", &path)?;
                thinking.push_str(more);
                if !more.is_empty() {
                    out.reasoning = Some(more.to_owned());
                }
            }
            ("signature_delta", Block::Thinking { signature, .. }) => {
                signature.push_str(req_str(d, "signature", &path)?);
            }
            ("text_delta" | "input_json_delta" | "thinking_delta" | "signature_delta", _) => {
                return Err(FormatError::new(
                    join(&path, "type"),
                    format!("{kind} does not fit content block {idx}"),
                ));
            }
            // citations_delta and later kinds carry nothing to keep.
            _ => {}
        }
        Ok(())
    }

    /// The complete response; fails when the stream never started or ended before `message_stop`.
    pub fn finish(self) -> Result<LlmResponse, FormatError> {
        let model =
            self.model.ok_or_else(|| FormatError::new("message_start", "the stream never started"))?;
        if !self.stopped {
            return Err(FormatError::new(
                "message_stop",
                "the stream ended before message_stop (cut short?)",
            ));
        }
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut tool_calls = Vec::new();
        let mut kept = Vec::new();
        for block in self.blocks.into_values() {
            match block {
                Block::Text(more) => text.push_str(&more),
                Block::Thinking { thinking, signature } => {
                    reasoning.push_str(&thinking);
                    kept.push(json!({ "type": "thinking", "thinking": thinking, "signature": signature }));
                }
                Block::Kept(block) => kept.push(block),
                Block::ToolUse { id, name, json, initial } => {
                    let arguments = if !json.is_empty() {
                        json
                    } else if initial.as_object().is_some_and(|o| !o.is_empty()) {
                        initial.to_string()
                    } else {
                        "{}".to_owned()
                    };
                    tool_calls.push(ToolCall::function(id, name, arguments));
                }
                Block::Other => {}
            }
        }
        Ok(LlmResponse {
            model,
            content: Some(text).filter(|t| !t.is_empty()),
            tool_calls: Some(tool_calls).filter(|c| !c.is_empty()),
            finish_reason: self.stop_reason,
            usage: self.usage.map(Value::Object),
            cost: None,
            images: None,
            reasoning: Some(reasoning).filter(|r| !r.is_empty()),
            provider_blocks: kept_blocks(kept),
        })
    }
}
