//! OpenAI Chat Completions: request bodies, `chat.completion` responses, `chat.completion.chunk` streams.
//!
//! The protocol's messages, content parts and tool calls are already OpenAI-shaped, so the
//! request passes them through field for field (every content part kind included: OpenAI-
//! compatible servers that take `video_url` get it, OpenAI itself rejects it with its own error).
//! Decisions:
//!
//! - Empty `tools` and `tool_calls` lists are omitted (OpenAI rejects `[]`); a tool without an
//!   input schema gets `{"type":"object","properties":{}}`; the output schema is not sent.
//! - Reasoning: only `effort` has a Chat Completions equivalent (`reasoning_effort`);
//!   `max_tokens`, `enabled` and `exclude` are not sent.
//! - Prompt caching: OpenAI caches prompt prefixes of 1,024 tokens and more by itself; a
//!   request with [`LlmRequest::cache`] names its conversation as `prompt_cache_key` so that
//!   its steps reach the same cache. The Chat Completions provider leaves it out for servers
//!   other than OpenAI's own, which may refuse a field they do not know.
//! - Responses: a `refusal` becomes the content (when there is no other text) and turns the
//!   finish reason into `content_filter`, so [`LlmResponse::is_refused`] sees it. Empty text is
//!   no content. Reasoning text (`reasoning_content` / `reasoning`) is streamed as
//!   [`StreamDelta::reasoning`] but not kept in the response. Only choice 0 is read.
//!   OpenRouter-style `message.images` become [`LlmResponse::images`].
//! - Streams: tool call fragments are keyed by `index` (the array position when a server omits
//!   it); a fragment carrying a new id at a known index starts a new call; a call whose id
//!   never arrives gets `call_<index>`. [`StreamAccumulator::finish`] fails when no
//!   `finish_reason` arrived: the stream was cut short.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::FormatError;
use super::json::{
    get, index, join, kind, number, object, opt_array, opt_object, opt_str, opt_u64, provider_error,
    req_array, req_object, req_str,
};
use crate::protocol::{
    Content, ContentPart, DraftMessage, Effort, LlmRequest, LlmResponse, LlmTool, Role, StreamDelta,
    ToolCall, ToolCallDelta, UrlRef,
};

/// The Chat Completions request body for `req`; `stream` adds `stream` and `stream_options.include_usage`.
pub fn request(req: &LlmRequest, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("messages".into(), Value::Array(messages(&req.messages)));
    if let Some(tools) = req.tools.as_ref().filter(|t| !t.is_empty()) {
        body.insert("tools".into(), tools.iter().map(tool).collect());
    }
    if let Some(temperature) = req.temperature {
        body.insert("temperature".into(), number(temperature));
    }
    if let Some(max) = req.max_completion_tokens {
        body.insert("max_completion_tokens".into(), json!(max));
    }
    if let Some(effort) = req.reasoning.as_ref().and_then(|r| r.effort) {
        body.insert("reasoning_effort".into(), json!(effort_name(effort)));
    }
    if let Some(cache) = &req.cache {
        // OpenAI caches prefixes by itself; the key keeps a conversation's requests on the
        // same cache.
        body.insert("prompt_cache_key".into(), json!(cache.openai_key()));
    }
    if stream {
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    Value::Object(body)
}

fn effort_name(effort: Effort) -> &'static str {
    match effort {
        Effort::Xhigh => "xhigh",
        Effort::High => "high",
        Effort::Medium => "medium",
        Effort::Low => "low",
        Effort::Minimal => "minimal",
        Effort::None => "none",
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

/// The messages as Chat Completions takes them. A tool message carries text only ("for tool
/// messages, only type `text` is supported", the API reference's tool message content parts):
/// a result's other parts (an MCP tool's image) go in a user message after the run of tool
/// messages, since one may not stand between a call and its results; it names the call each
/// part came from, and the tool message says where its parts went.
fn messages(messages: &[Arc<DraftMessage>]) -> Vec<Value> {
    let mut out = Vec::with_capacity(messages.len());
    let mut carried: Vec<Value> = Vec::new();
    for m in messages {
        if m.role != Role::Tool && !carried.is_empty() {
            out.push(json!({ "role": "user", "content": std::mem::take(&mut carried) }));
        }
        let parts = match &m.content {
            Some(Content::Parts(parts)) if m.role == Role::Tool => parts,
            _ => {
                out.push(message(m));
                continue;
            }
        };
        let (text, other): (Vec<&ContentPart>, Vec<&ContentPart>) =
            parts.iter().partition(|p| matches!(p, ContentPart::Text { .. }));
        if other.is_empty() {
            out.push(message(m));
            continue;
        }
        let id = m.tool_call_id.as_ref().map_or("", |id| id.as_str());
        carried.push(json!({ "type": "text", "text": format!("The result of tool call {id} includes:") }));
        carried.extend(other.iter().map(|p| part(p)));
        let mut lines: Vec<&str> = text
            .iter()
            .filter_map(|p| if let ContentPart::Text { text } = p { Some(text.as_str()) } else { None })
            .collect();
        lines.push("(more of this result follows in the next user message)");
        let mut tool = message(m);
        tool["content"] = json!(lines.join("\n"));
        out.push(tool);
    }
    if !carried.is_empty() {
        out.push(json!({ "role": "user", "content": carried }));
    }
    out
}

fn message(m: &DraftMessage) -> Value {
    let mut out = Map::new();
    out.insert("role".into(), json!(role_name(m.role)));
    match &m.content {
        // Images a model produced are its output; an assistant message takes text back only.
        Some(Content::Parts(parts)) if m.role == Role::Assistant => {
            let kept: Vec<Value> =
                parts.iter().filter(|p| !matches!(p, ContentPart::ImageUrl { .. })).map(part).collect();
            out.insert("content".into(), Value::Array(kept));
        }
        Some(content) => {
            out.insert("content".into(), content_value(content));
        }
        None => {}
    }
    if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
        out.insert("tool_calls".into(), calls.iter().map(tool_call).collect());
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), json!(id));
    }
    if let Some(name) = &m.name {
        out.insert("name".into(), json!(name));
    }
    Value::Object(out)
}

fn content_value(content: &Content) -> Value {
    match content {
        Content::Text(text) => json!(text),
        Content::Parts(parts) => parts.iter().map(part).collect(),
    }
}

fn part(part: &ContentPart) -> Value {
    match part {
        ContentPart::Text { text } => json!({ "type": "text", "text": text }),
        ContentPart::ImageUrl { image_url } => {
            json!({ "type": "image_url", "image_url": { "url": image_url.url } })
        }
        ContentPart::File { file } => json!({
            "type": "file",
            "file": { "filename": file.filename, "file_data": file.file_data },
        }),
        ContentPart::InputAudio { input_audio } => json!({
            "type": "input_audio",
            "input_audio": { "data": input_audio.data, "format": input_audio.format },
        }),
        ContentPart::VideoUrl { video_url } => {
            json!({ "type": "video_url", "video_url": { "url": video_url.url } })
        }
    }
}

fn tool_call(call: &ToolCall) -> Value {
    json!({
        "id": call.id,
        "type": call.kind,
        "function": { "name": call.function.name, "arguments": call.function.arguments },
    })
}

fn tool(tool: &LlmTool) -> Value {
    let parameters = tool.input.clone().unwrap_or_else(|| json!({ "type": "object", "properties": {} }));
    json!({
        "type": "function",
        "function": { "name": tool.name, "description": tool.description, "parameters": parameters },
    })
}

/// Parses a `chat.completion` body; an `{"error": ...}` body is an error at path `error`.
pub fn response(body: &Value) -> Result<LlmResponse, FormatError> {
    let obj = object(body, "")?;
    if let Some(err) = provider_error(obj) {
        return Err(err);
    }
    let model = req_str(obj, "model", "")?.to_owned();
    let choices = req_array(obj, "choices", "")?;
    let first =
        choices.first().ok_or_else(|| FormatError::new("choices", "empty: the response has no choice"))?;
    let choice = object(first, "choices[0]")?;
    let message = req_object(choice, "message", "choices[0]")?;
    let base = "choices[0].message";

    let mut content = message_text(message, base)?;
    let refusal = opt_str(message, "refusal", base)?.filter(|r| !r.is_empty());
    let mut finish_reason = opt_str(choice, "finish_reason", "choices[0]")?.map(str::to_owned);
    if let Some(refusal) = refusal {
        content = content.or_else(|| Some(refusal.to_owned()));
        finish_reason = Some("content_filter".to_owned());
    }

    let tool_calls = match opt_array(message, "tool_calls", base)? {
        Some(calls) => {
            let calls_path = join(base, "tool_calls");
            let parsed = calls
                .iter()
                .enumerate()
                .map(|(i, call)| parse_tool_call(call, &index(&calls_path, i)))
                .collect::<Result<Vec<_>, _>>()?;
            Some(parsed).filter(|c| !c.is_empty())
        }
        None => None,
    };

    let images = match opt_array(message, "images", base)? {
        Some(images) => {
            let images_path = join(base, "images");
            let parsed = images
                .iter()
                .enumerate()
                .map(|(i, image)| {
                    let path = index(&images_path, i);
                    let image = object(image, &path)?;
                    let url = req_object(image, "image_url", &path)?;
                    Ok(UrlRef { url: req_str(url, "url", &join(&path, "image_url"))?.to_owned() })
                })
                .collect::<Result<Vec<_>, FormatError>>()?;
            Some(parsed).filter(|i| !i.is_empty())
        }
        None => None,
    };

    Ok(LlmResponse {
        model,
        content,
        tool_calls,
        finish_reason,
        usage: get(obj, "usage").cloned(),
        cost: None,
        images,
        reasoning: reasoning(message, base)?.map(str::to_owned),
        provider_blocks: None,
    })
}

/// The reasoning of a message or delta: `reasoning_content` (DeepSeek, vLLM), else `reasoning`
/// (OpenRouter, Ollama); OpenAI's own API shows none.
fn reasoning<'a>(message: &'a Map<String, Value>, path: &str) -> Result<Option<&'a str>, FormatError> {
    Ok(match opt_str(message, "reasoning_content", path)?.filter(|r| !r.is_empty()) {
        Some(r) => Some(r),
        None => opt_str(message, "reasoning", path)?.filter(|r| !r.is_empty()),
    })
}

/// `message.content`: a string, or (some compatible servers) a list of parts whose text is joined.
fn message_text(message: &Map<String, Value>, base: &str) -> Result<Option<String>, FormatError> {
    let text = match get(message, "content") {
        None => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let path = join(base, "content");
            let mut text = String::new();
            for (i, p) in parts.iter().enumerate() {
                let p_path = index(&path, i);
                let p = object(p, &p_path)?;
                if opt_str(p, "type", &p_path)? == Some("text") {
                    text.push_str(req_str(p, "text", &p_path)?);
                }
            }
            text
        }
        Some(other) => {
            return Err(FormatError::new(
                join(base, "content"),
                format!("expected a string or an array, found {}", kind(other)),
            ));
        }
    };
    Ok(Some(text).filter(|t| !t.is_empty()))
}

fn parse_tool_call(call: &Value, path: &str) -> Result<ToolCall, FormatError> {
    let call = object(call, path)?;
    let id = req_str(call, "id", path)?;
    check_function_type(call, path)?;
    let function = req_object(call, "function", path)?;
    let function_path = join(path, "function");
    let name = req_str(function, "name", &function_path)?;
    let arguments = arguments_text(function, &function_path)?;
    Ok(ToolCall::function(id, name, arguments))
}

fn check_function_type(call: &Map<String, Value>, path: &str) -> Result<(), FormatError> {
    match opt_str(call, "type", path)? {
        None | Some("function") => Ok(()),
        Some(other) => {
            Err(FormatError::new(join(path, "type"), format!("unsupported tool call type {other:?}")))
        }
    }
}

/// `function.arguments`: the raw string; an object (some compatible servers) is serialized.
fn arguments_text(function: &Map<String, Value>, path: &str) -> Result<String, FormatError> {
    match get(function, "arguments") {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v @ (Value::Object(_) | Value::Array(_))) => Ok(v.to_string()),
        Some(other) => Err(FormatError::new(
            join(path, "arguments"),
            format!("expected a string, found {}", kind(other)),
        )),
    }
}

/// Assembles a streamed answer from `chat.completion.chunk`s.
#[derive(Debug, Clone, Default)]
pub struct StreamAccumulator {
    model: Option<String>,
    text: String,
    reasoning: String,
    refused: bool,
    calls: Vec<PartialCall>,
    by_index: HashMap<u64, usize>,
    finish_reason: Option<String>,
    usage: Option<Value>,
}

#[derive(Debug, Clone)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

impl StreamAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one parsed chunk (an SSE `data:` payload other than `[DONE]`); returns what to forward, if anything.
    pub fn push(&mut self, chunk: &Value) -> Result<Option<StreamDelta>, FormatError> {
        let obj = object(chunk, "")?;
        if let Some(err) = provider_error(obj) {
            return Err(err);
        }
        if self.model.is_none() {
            self.model = opt_str(obj, "model", "")?.filter(|m| !m.is_empty()).map(str::to_owned);
        }
        if let Some(usage) = get(obj, "usage") {
            self.usage = Some(usage.clone());
        }
        let mut delta = StreamDelta::default();
        for (i, choice) in opt_array(obj, "choices", "")?.into_iter().flatten().enumerate() {
            let path = index("choices", i);
            let choice = object(choice, &path)?;
            if opt_u64(choice, "index", &path)?.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(d) = opt_object(choice, "delta", &path)? {
                self.push_delta(d, &join(&path, "delta"), &mut delta)?;
            }
            if let Some(reason) = opt_str(choice, "finish_reason", &path)? {
                self.finish_reason = Some(reason.to_owned());
                delta.finish_reason = Some(reason.to_owned());
            }
        }
        Ok(Some(delta).filter(|d| *d != StreamDelta::default()))
    }

    fn push_delta(
        &mut self,
        d: &Map<String, Value>,
        path: &str,
        out: &mut StreamDelta,
    ) -> Result<(), FormatError> {
        let mut text = String::new();
        if let Some(content) = opt_str(d, "content", path)? {
            text.push_str(content);
        }
        if let Some(refusal) = opt_str(d, "refusal", path)?.filter(|r| !r.is_empty()) {
            self.refused = true;
            text.push_str(refusal);
        }
        if !text.is_empty() {
            self.text.push_str(&text);
            out.text = Some(text);
        }
        if let Some(reasoning) = reasoning(d, path)? {
            self.reasoning.push_str(reasoning);
            out.reasoning = Some(reasoning.to_owned());
        }
        if let Some(calls) = opt_array(d, "tool_calls", path)? {
            let calls_path = join(path, "tool_calls");
            let mut fragments = Vec::new();
            for (i, call) in calls.iter().enumerate() {
                if let Some(fragment) = self.push_call(call, &index(&calls_path, i), i)? {
                    fragments.push(fragment);
                }
            }
            if !fragments.is_empty() {
                out.tool_calls = Some(fragments);
            }
        }
        Ok(())
    }

    fn push_call(
        &mut self,
        call: &Value,
        path: &str,
        position: usize,
    ) -> Result<Option<ToolCallDelta>, FormatError> {
        let call = object(call, path)?;
        let idx = opt_u64(call, "index", path)?.unwrap_or(position as u64);
        let id = opt_str(call, "id", path)?.filter(|id| !id.is_empty());
        check_function_type(call, path)?;
        let function = opt_object(call, "function", path)?;
        let function_path = join(path, "function");
        let (name, arguments) = match function {
            Some(f) => (opt_str(f, "name", &function_path)?, Some(arguments_text(f, &function_path)?)),
            None => (None, None),
        };

        let existing = self.by_index.get(&idx).copied().filter(|&slot| match (id, self.calls.get(slot)) {
            (Some(id), Some(call)) => call.id == id,
            _ => true,
        });
        let (slot, created) = match existing {
            Some(slot) => (slot, false),
            None => {
                let id = id.map_or_else(|| format!("call_{idx}"), str::to_owned);
                self.calls.push(PartialCall { id, name: String::new(), arguments: String::new() });
                let slot = self.calls.len() - 1;
                self.by_index.insert(idx, slot);
                (slot, true)
            }
        };
        let Some(entry) = self.calls.get_mut(slot) else {
            return Err(FormatError::new(path, "tool call slot out of range"));
        };
        let mut fragment = ToolCallDelta { id: entry.id.as_str().into(), name: None, arguments: None };
        if let Some(name) = name.filter(|n| !n.is_empty() && entry.name.is_empty()) {
            entry.name = name.to_owned();
            fragment.name = Some(name.to_owned());
        }
        if let Some(arguments) = arguments.filter(|a| !a.is_empty()) {
            entry.arguments.push_str(&arguments);
            fragment.arguments = Some(arguments);
        }
        let forward = created || fragment.name.is_some() || fragment.arguments.is_some();
        Ok(forward.then_some(fragment))
    }

    /// The complete response; fails when the stream ended before a `finish_reason` or never named the model.
    pub fn finish(self) -> Result<LlmResponse, FormatError> {
        let Some(mut finish_reason) = self.finish_reason else {
            return Err(FormatError::new(
                "choices[0].finish_reason",
                "the stream ended before a finish_reason (cut short?)",
            ));
        };
        let model = self.model.ok_or_else(|| FormatError::new("model", "no chunk named the model"))?;
        if self.refused {
            finish_reason = "content_filter".to_owned();
        }
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (i, call) in self.calls.into_iter().enumerate() {
            if call.name.is_empty() {
                return Err(FormatError::new(
                    format!("tool_calls[{i}].function.name"),
                    format!("tool call {:?} was never named", call.id),
                ));
            }
            tool_calls.push(ToolCall::function(call.id, call.name, call.arguments));
        }
        Ok(LlmResponse {
            model,
            content: Some(self.text).filter(|t| !t.is_empty()),
            tool_calls: Some(tool_calls).filter(|c| !c.is_empty()),
            finish_reason: Some(finish_reason),
            usage: self.usage,
            cost: None,
            images: None,
            reasoning: Some(self.reasoning).filter(|r| !r.is_empty()),
            provider_blocks: None,
        })
    }
}
