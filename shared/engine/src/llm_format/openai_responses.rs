//! OpenAI Responses API (`POST /v1/responses`): request bodies, `response` objects, and the
//! response stream's SSE events.
//!
//! Shapes from OpenAI's API reference ("Create a model response",
//! <https://platform.openai.com/docs/api-reference/responses/create>; "The response object",
//! <https://platform.openai.com/docs/api-reference/responses/object>; "Streaming events",
//! <https://platform.openai.com/docs/api-reference/responses-streaming>) and guides ("Reasoning
//! models": keeping reasoning items in context, encrypted reasoning items,
//! <https://platform.openai.com/docs/guides/reasoning>; "Function calling",
//! <https://platform.openai.com/docs/guides/function-calling>; "Conversation state",
//! <https://platform.openai.com/docs/guides/conversation-state>).
//!
//! Decisions:
//!
//! - Stateless: every request carries the whole conversation, `store: false` (nothing is kept
//!   at OpenAI, so no `previous_response_id` or item references) and `include:
//!   ["reasoning.encrypted_content"]` (always: reasoning models reason without being asked,
//!   and a reasoning item is only worth keeping with its encrypted content).
//! - System prompt: the leading text-only `system` messages, joined by a blank line, are
//!   `instructions`; any other system message is a `developer` message where it stands.
//! - Messages: user content as `input_text`, `input_image` (URL or data URL) and `input_file`
//!   parts (raw base64 becomes a data URL typed by the file name); `input_audio` and
//!   `video_url` are errors (the Responses API takes neither). Assistant text as
//!   `output_text` parts (images a model produced are left out, other parts are errors); its
//!   tool calls as `function_call` items `{call_id, name, arguments}`, without item ids
//!   (nothing is stored to refer to); tool messages as `function_call_output` items
//!   `{call_id, output}`, the output a string or a list of input parts.
//! - Tools are flat `{type: "function", name, description, parameters, strict: false}` (not
//!   nested under `function` as in Chat Completions), the schema defaulting to an empty object
//!   schema; an empty list is left out. `max_completion_tokens` is `max_output_tokens`; the
//!   cache key is `prompt_cache_key`.
//! - Reasoning: `effort` as `reasoning.effort`; whenever reasoning is asked for (an effort
//!   other than `none`, `enabled: true` or a token budget) `reasoning.summary: "auto"`, since
//!   the summary is all of the reasoning OpenAI shows, unless `exclude` is set. The budget
//!   has no Responses equivalent and is not sent.
//! - Reasoning items survive the transcript: a reply's output items are kept in order in its
//!   [`ProviderBlocks`] (provider [`PROVIDER`]): reasoning items, and any item kind this
//!   format does not read, whole and as sent; its messages and function calls as position
//!   markers (`{"type": "message"}`, `{"type": "function_call", "call_id"}`), whose content
//!   lives in the neutral message. Sent back, the kept items stand where they stood relative
//!   to the message's text and calls (a reasoning item must precede the item it led to);
//!   another format's blocks are left out. No markers are kept for a reply without such items.
//! - Responses: `output_text` parts are the content (separate messages joined by a blank
//!   line), `refusal` parts too, turning the finish reason into `content_filter`;
//!   `function_call` items are tool calls (the id is `call_id`); reasoning summaries (joined
//!   by a blank line) are the reasoning. `status` and `incomplete_details.reason` give the
//!   finish reason ([`finish_reason`]). Usage passes through in OpenAI's shape.
//! - Streams: deltas are forwarded as they come (`output_text`, `refusal`,
//!   `function_call_arguments`, `reasoning_summary_text`); the answer is the response of
//!   `response.completed` (or `response.incomplete`), its output filled from the items the
//!   stream delivered when a server leaves it empty. `response.failed` and `error` events are
//!   errors at path `error`.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::FormatError;
use super::json::{
    get, index, join, kind, number, object, opt_array, opt_object, opt_str, provider_error, req_array,
    req_object, req_str, req_u64,
};
use crate::protocol::{
    Content, ContentPart, DraftMessage, Effort, FileData, LlmRequest, LlmResponse, LlmTool, ProviderBlocks,
    ReasoningConfig, Role, StreamDelta, ToolCall, ToolCallDelta,
};

/// The [`ProviderBlocks::provider`] of items this format wrote.
pub const PROVIDER: &str = "openai-responses";

/// What `include` asks for: reasoning items with their encrypted content.
pub const INCLUDE_ENCRYPTED_REASONING: &str = "reasoning.encrypted_content";

/// The separator of texts from separate output items or summary parts.
const PARAGRAPH: &str = "\n\n";

/// The Responses request body for `req`; fails on content the Responses API cannot carry.
pub fn request(req: &LlmRequest, stream: bool) -> Result<Value, FormatError> {
    let leading =
        req.messages.iter().take_while(|m| m.role == Role::System && text_only(m.content.as_ref())).count();
    let mut instructions = Vec::new();
    for m in req.messages.iter().take(leading) {
        match &m.content {
            Some(Content::Text(text)) => instructions.push(text.clone()),
            Some(Content::Parts(parts)) => instructions.push(
                parts
                    .iter()
                    .filter_map(|p| match p {
                        ContentPart::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            None => {}
        }
    }

    let mut input = Vec::new();
    for (i, m) in req.messages.iter().enumerate().skip(leading) {
        let path = index("messages", i);
        match m.role {
            Role::System => input.push(input_message("developer", m, &path)?),
            Role::User => input.push(input_message("user", m, &path)?),
            Role::Assistant => assistant(m, &path, &mut input)?,
            Role::Tool => input.push(tool_output(m, &path)?),
        }
    }

    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    let instructions = instructions.into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>();
    if !instructions.is_empty() {
        body.insert("instructions".into(), json!(instructions.join(PARAGRAPH)));
    }
    body.insert("input".into(), Value::Array(input));
    if let Some(tools) = req.tools.as_ref().filter(|t| !t.is_empty()) {
        body.insert("tools".into(), tools.iter().map(tool).collect());
    }
    if let Some(temperature) = req.temperature {
        body.insert("temperature".into(), number(temperature));
    }
    if let Some(max) = req.max_completion_tokens {
        body.insert("max_output_tokens".into(), json!(max));
    }
    if let Some(reasoning) = req.reasoning.as_ref().and_then(reasoning) {
        body.insert("reasoning".into(), reasoning);
    }
    if let Some(cache) = &req.cache {
        body.insert("prompt_cache_key".into(), json!(cache.openai_key()));
    }
    body.insert("store".into(), json!(false));
    body.insert("include".into(), json!([INCLUDE_ENCRYPTED_REASONING]));
    if stream {
        body.insert("stream".into(), json!(true));
    }
    Ok(Value::Object(body))
}

fn text_only(content: Option<&Content>) -> bool {
    match content {
        Some(Content::Parts(parts)) => parts.iter().all(|p| matches!(p, ContentPart::Text { .. })),
        _ => true,
    }
}

/// `reasoning`: the effort, and a summary whenever reasoning is asked for and not excluded.
fn reasoning(config: &ReasoningConfig) -> Option<Value> {
    let mut out = Map::new();
    if let Some(effort) = config.effort {
        out.insert("effort".into(), json!(effort_name(effort)));
    }
    let asked = match config.effort {
        Some(Effort::None) => false,
        Some(_) => config.enabled != Some(false),
        None => {
            config.enabled == Some(true) || (config.max_tokens.is_some() && config.enabled != Some(false))
        }
    };
    if asked && config.exclude != Some(true) {
        out.insert("summary".into(), json!("auto"));
    }
    (!out.is_empty()).then_some(Value::Object(out))
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

/// A `message` input item of `role` (`user`, `developer`) with `m`'s content as input parts.
fn input_message(role: &str, m: &DraftMessage, path: &str) -> Result<Value, FormatError> {
    let content = input_parts(m.content.as_ref(), &join(path, "content"))?;
    Ok(json!({ "type": "message", "role": role, "content": content }))
}

fn input_parts(content: Option<&Content>, path: &str) -> Result<Vec<Value>, FormatError> {
    match content {
        None => Ok(vec![input_text("")]),
        Some(Content::Text(text)) => Ok(vec![input_text(text)]),
        Some(Content::Parts(parts)) => {
            parts.iter().enumerate().map(|(j, p)| input_part(p, &index(path, j))).collect()
        }
    }
}

fn input_text(text: &str) -> Value {
    json!({ "type": "input_text", "text": text })
}

fn input_part(part: &ContentPart, path: &str) -> Result<Value, FormatError> {
    match part {
        ContentPart::Text { text } => Ok(input_text(text)),
        ContentPart::ImageUrl { image_url } => {
            Ok(json!({ "type": "input_image", "image_url": image_url.url, "detail": "auto" }))
        }
        ContentPart::File { file } => input_file(file, path),
        ContentPart::InputAudio { .. } => {
            Err(FormatError::new(path, "the Responses API cannot carry input_audio parts"))
        }
        ContentPart::VideoUrl { .. } => {
            Err(FormatError::new(path, "the Responses API cannot carry video_url parts"))
        }
    }
}

/// An `input_file` part: the file as a data URL (raw base64 typed by its file name).
fn input_file(file: &FileData, path: &str) -> Result<Value, FormatError> {
    let data = if file.file_data.starts_with("data:") {
        file.file_data.clone()
    } else {
        let media_type = media_type_of(&file.filename).ok_or_else(|| {
            FormatError::new(
                join(path, "file.filename"),
                format!("cannot tell the media type of {:?}; send the file as a data URL", file.filename),
            )
        })?;
        format!("data:{media_type};base64,{}", file.file_data)
    };
    let mut part = Map::new();
    part.insert("type".into(), json!("input_file"));
    if !file.filename.is_empty() {
        part.insert("filename".into(), json!(file.filename));
    }
    part.insert("file_data".into(), json!(data));
    Ok(Value::Object(part))
}

fn media_type_of(filename: &str) -> Option<&'static str> {
    let ext = filename.rsplit_once('.')?.1.to_ascii_lowercase();
    match ext.as_str() {
        "pdf" => Some("application/pdf"),
        "png" => Some("image/png"),
        "jpg" | "jpeg" => Some("image/jpeg"),
        "gif" => Some("image/gif"),
        "webp" => Some("image/webp"),
        "txt" => Some("text/plain"),
        "md" => Some("text/markdown"),
        "csv" => Some("text/csv"),
        "json" => Some("application/json"),
        _ => None,
    }
}

fn tool_output(m: &DraftMessage, path: &str) -> Result<Value, FormatError> {
    let id = m.tool_call_id.as_ref().ok_or_else(|| {
        FormatError::new(join(path, "tool_call_id"), "a tool message must name the call it answers")
    })?;
    let output = match &m.content {
        None => json!(""),
        Some(Content::Text(text)) => json!(text),
        Some(content @ Content::Parts(_)) => {
            Value::Array(input_parts(Some(content), &join(path, "content"))?)
        }
    };
    Ok(json!({ "type": "function_call_output", "call_id": id, "output": output }))
}

/// The items of an assistant message: its kept items where they stood, its text and calls.
fn assistant(m: &DraftMessage, path: &str, input: &mut Vec<Value>) -> Result<(), FormatError> {
    let mut text = Some(output_texts(m, path)?).filter(|parts| !parts.is_empty());
    let mut calls: Vec<Option<&ToolCall>> = m.tool_calls.iter().flatten().map(Some).collect();
    let kept: &[Value] = match &m.provider_blocks {
        Some(kept) if kept.provider == PROVIDER => &kept.blocks,
        _ => &[],
    };
    for block in kept {
        match marker(block) {
            Some(Marker::Message) => {
                if let Some(parts) = text.take() {
                    input.push(output_message(parts));
                }
            }
            // A call the message no longer has (a worker rewrote it) is left out with its marker.
            Some(Marker::Call(call_id)) => {
                if let Some(slot) = calls.iter_mut().find(|c| c.is_some_and(|c| c.id.as_str() == call_id))
                    && let Some(call) = slot.take()
                {
                    input.push(function_call(call));
                }
            }
            None => input.push(block.clone()),
        }
    }
    if let Some(parts) = text {
        input.push(output_message(parts));
    }
    input.extend(calls.into_iter().flatten().map(function_call));
    Ok(())
}

/// The assistant's text as `output_text` parts (empty text left out).
fn output_texts(m: &DraftMessage, path: &str) -> Result<Vec<Value>, FormatError> {
    let output_text = |text: &str| json!({ "type": "output_text", "text": text });
    match &m.content {
        None => Ok(Vec::new()),
        Some(Content::Text(text)) => {
            Ok([text].into_iter().filter(|t| !t.is_empty()).map(|t| output_text(t)).collect())
        }
        Some(Content::Parts(parts)) => {
            let mut out = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                match p {
                    ContentPart::Text { text } if text.is_empty() => {}
                    ContentPart::Text { text } => out.push(output_text(text)),
                    // Images a model produced are its output, not something it takes back.
                    ContentPart::ImageUrl { .. } => {}
                    _ => {
                        return Err(FormatError::new(
                            index(&join(path, "content"), j),
                            "Responses assistant messages carry only text",
                        ));
                    }
                }
            }
            Ok(out)
        }
    }
}

fn output_message(parts: Vec<Value>) -> Value {
    json!({ "type": "message", "role": "assistant", "content": parts })
}

fn function_call(call: &ToolCall) -> Value {
    json!({
        "type": "function_call",
        "call_id": call.id,
        "name": call.function.name,
        "arguments": call.function.arguments,
    })
}

/// A kept block that only marks where a message or a function call stood.
enum Marker<'a> {
    Message,
    Call(&'a str),
}

fn marker(block: &Value) -> Option<Marker<'_>> {
    match block.get("type").and_then(Value::as_str)? {
        "message" => Some(Marker::Message),
        "function_call" => block.get("call_id").and_then(Value::as_str).map(Marker::Call),
        _ => None,
    }
}

fn tool(tool: &LlmTool) -> Value {
    let parameters = tool.input.clone().unwrap_or_else(|| json!({ "type": "object", "properties": {} }));
    json!({
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": parameters,
        "strict": false,
    })
}

/// The neutral finish reason of a response's `status` and `incomplete_details.reason`.
///
/// `completed` (or no status, as some compatible servers send) is `content_filter` after a
/// refusal, `tool_calls` when a function was called, else `stop`; `incomplete` is `length`
/// for `max_output_tokens`, `content_filter` for `content_filter`, other reasons as they are
/// (`incomplete` without one); `failed` is an error at `status`; `queued` and `in_progress`
/// (background responses) are errors too; other statuses (`cancelled`) pass through.
pub fn finish_reason(
    status: Option<&str>,
    incomplete_reason: Option<&str>,
    called: bool,
    refused: bool,
) -> Result<String, FormatError> {
    let reason = match status {
        None | Some("completed") if refused => "content_filter",
        None | Some("completed") if called => "tool_calls",
        None | Some("completed") => "stop",
        Some("incomplete") => match incomplete_reason {
            Some("max_output_tokens") => "length",
            Some(reason) => reason,
            None => "incomplete",
        },
        Some("failed") => return Err(FormatError::new("status", "the response failed without an error")),
        Some(status @ ("queued" | "in_progress")) => {
            return Err(FormatError::new(
                "status",
                format!("the response is not finished ({status}): background responses are not supported"),
            ));
        }
        Some(other) => other,
    };
    Ok(reason.to_owned())
}

/// Parses a `response` object; an `{"error": ...}` body (a failed response included) is an
/// error at path `error`.
pub fn response(body: &Value) -> Result<LlmResponse, FormatError> {
    let obj = object(body, "")?;
    if let Some(err) = provider_error(obj) {
        return Err(err);
    }
    parse_response(obj, "")
}

fn parse_response(obj: &Map<String, Value>, base: &str) -> Result<LlmResponse, FormatError> {
    let model = req_str(obj, "model", base)?.to_owned();
    let mut out = Output::default();
    let output_path = join(base, "output");
    for (i, item) in req_array(obj, "output", base)?.iter().enumerate() {
        out.read_item(item, &index(&output_path, i))?;
    }
    let incomplete = match opt_object(obj, "incomplete_details", base)? {
        Some(details) => opt_str(details, "reason", &join(base, "incomplete_details"))?,
        None => None,
    };
    let status = opt_str(obj, "status", base)?;
    let finish = finish_reason(status, incomplete, !out.calls.is_empty(), out.refused)
        .map_err(|e| FormatError::new(join(base, &e.path), e.message))?;
    Ok(LlmResponse {
        model,
        content: Some(out.text).filter(|t| !t.is_empty()),
        tool_calls: Some(out.calls).filter(|c| !c.is_empty()),
        finish_reason: Some(finish),
        usage: get(obj, "usage").cloned(),
        cost: None,
        images: None,
        reasoning: Some(out.reasoning).filter(|r| !r.is_empty()),
        provider_blocks: out
            .kept
            .then(|| Box::new(ProviderBlocks { provider: PROVIDER.to_owned(), blocks: out.blocks })),
    })
}

/// What a response's output items come to.
#[derive(Default)]
struct Output {
    text: String,
    reasoning: String,
    refused: bool,
    calls: Vec<ToolCall>,
    /// Every item in order, messages and calls as markers.
    blocks: Vec<Value>,
    /// Whether any item is kept whole (else the markers alone are not worth keeping).
    kept: bool,
}

impl Output {
    fn read_item(&mut self, item: &Value, path: &str) -> Result<(), FormatError> {
        let obj = object(item, path)?;
        match req_str(obj, "type", path)? {
            "message" => {
                let content_path = join(path, "content");
                let mut text = String::new();
                for (j, part) in req_array(obj, "content", path)?.iter().enumerate() {
                    let part_path = index(&content_path, j);
                    let part = object(part, &part_path)?;
                    match req_str(part, "type", &part_path)? {
                        "output_text" => text.push_str(req_str(part, "text", &part_path)?),
                        "refusal" => {
                            self.refused = true;
                            text.push_str(req_str(part, "refusal", &part_path)?);
                        }
                        other => {
                            return Err(FormatError::new(
                                join(&part_path, "type"),
                                format!("unsupported message content {other:?}"),
                            ));
                        }
                    }
                }
                paragraph(&mut self.text, &text);
                self.blocks.push(json!({ "type": "message" }));
            }
            "function_call" => {
                let call_id = req_str(obj, "call_id", path)?;
                let name = req_str(obj, "name", path)?;
                let arguments = arguments_text(obj, path)?;
                self.calls.push(ToolCall::function(call_id, name, arguments));
                self.blocks.push(json!({ "type": "function_call", "call_id": call_id }));
            }
            "reasoning" => {
                let summary_path = join(path, "summary");
                for (j, part) in opt_array(obj, "summary", path)?.into_iter().flatten().enumerate() {
                    let part_path = index(&summary_path, j);
                    paragraph(&mut self.reasoning, req_str(object(part, &part_path)?, "text", &part_path)?);
                }
                self.blocks.push(item.clone());
                self.kept = true;
            }
            // Kinds this format does not read (hosted tools' calls...) go back as they came.
            _ => {
                self.blocks.push(item.clone());
                self.kept = true;
            }
        }
        Ok(())
    }
}

/// Appends `more` to `text`, a blank line between them when both have text.
fn paragraph(text: &mut String, more: &str) {
    if !more.is_empty() {
        if !text.is_empty() {
            text.push_str(PARAGRAPH);
        }
        text.push_str(more);
    }
}

/// A function call's `arguments`: the raw string (an object, from some servers, serialized).
fn arguments_text(call: &Map<String, Value>, path: &str) -> Result<String, FormatError> {
    match get(call, "arguments") {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v @ (Value::Object(_) | Value::Array(_))) => Ok(v.to_string()),
        Some(other) => Err(FormatError::new(
            join(path, "arguments"),
            format!("expected a string, found {}", kind(other)),
        )),
    }
}

/// The error a stream's `error` event reports (`{"type": "error", code, message}`).
fn stream_error(obj: &Map<String, Value>) -> FormatError {
    if let Some(err) = provider_error(obj) {
        return err;
    }
    let message = obj.get("message").and_then(Value::as_str).filter(|m| !m.is_empty());
    let code = obj.get("code").and_then(Value::as_str).filter(|c| !c.is_empty());
    let message = message.unwrap_or("the stream reported an error");
    FormatError::new("error", code.map_or_else(|| message.to_owned(), |code| format!("{code}: {message}")))
}

/// Assembles a streamed answer from the response stream's SSE events.
#[derive(Debug, Clone, Default)]
pub struct StreamAccumulator {
    model: Option<String>,
    /// The output items so far, by `output_index`.
    items: BTreeMap<u64, Partial>,
    /// The output item whose text is streaming, and whether any text was forwarded.
    text_item: Option<u64>,
    texted: bool,
    /// The summary part streaming (`output_index`, `summary_index`), and whether any was forwarded.
    summary_part: Option<(u64, u64)>,
    reasoned: bool,
    answer: Option<LlmResponse>,
}

/// An output item as far as the stream has told it.
#[derive(Debug, Clone)]
enum Partial {
    Message {
        id: Option<String>,
        text: String,
    },
    Call {
        id: Option<String>,
        call_id: String,
        name: String,
        arguments: String,
    },
    /// An item whole: a finished one (`response.output_item.done`), or one of a kind whose
    /// deltas this format does not read.
    Whole(Value),
}

impl Partial {
    /// The item as a response's `output` holds it.
    fn to_item(&self) -> Value {
        match self {
            Partial::Message { id, text } => json!({
                "type": "message", "id": id, "role": "assistant", "status": "completed",
                "content": [{ "type": "output_text", "text": text, "annotations": [] }],
            }),
            Partial::Call { id, call_id, name, arguments } => json!({
                "type": "function_call", "id": id, "call_id": call_id, "name": name,
                "arguments": arguments, "status": "completed",
            }),
            Partial::Whole(item) => item.clone(),
        }
    }
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
            "response.created" | "response.in_progress" => {
                let response = req_object(obj, "response", name)?;
                if let Some(model) = opt_str(response, "model", &join(name, "response"))? {
                    self.model = Some(model.to_owned());
                }
            }
            "response.output_item.added" => self.item_added(obj, name, &mut delta)?,
            "response.output_text.delta" | "response.refusal.delta" => {
                let idx = req_u64(obj, "output_index", name)?;
                let more = req_str(obj, "delta", name)?;
                match self.items.get_mut(&idx) {
                    Some(Partial::Message { text, .. }) => text.push_str(more),
                    _ => return Err(not_added(name, idx, "message")),
                }
                if !more.is_empty() {
                    let joined = self.text_item.is_some_and(|item| item != idx) && self.texted;
                    self.text_item = Some(idx);
                    self.texted = true;
                    delta.text = Some(if joined { format!("{PARAGRAPH}{more}") } else { more.to_owned() });
                }
            }
            "response.function_call_arguments.delta" => {
                let idx = req_u64(obj, "output_index", name)?;
                let more = req_str(obj, "delta", name)?;
                let Some(Partial::Call { call_id, arguments, .. }) = self.items.get_mut(&idx) else {
                    return Err(not_added(name, idx, "function_call"));
                };
                arguments.push_str(more);
                if !more.is_empty() {
                    delta.tool_calls = Some(vec![ToolCallDelta {
                        id: call_id.as_str().into(),
                        name: None,
                        arguments: Some(more.to_owned()),
                    }]);
                }
            }
            "response.reasoning_summary_text.delta" => {
                let part = (req_u64(obj, "output_index", name)?, req_u64(obj, "summary_index", name)?);
                let more = req_str(obj, "delta", name)?;
                if !more.is_empty() {
                    let joined = self.summary_part.is_some_and(|p| p != part) && self.reasoned;
                    self.summary_part = Some(part);
                    self.reasoned = true;
                    delta.reasoning =
                        Some(if joined { format!("{PARAGRAPH}{more}") } else { more.to_owned() });
                }
            }
            "response.output_item.done" => {
                let idx = req_u64(obj, "output_index", name)?;
                let item = req_object(obj, "item", name)?;
                self.items.insert(idx, Partial::Whole(Value::Object(item.clone())));
            }
            "response.completed" | "response.incomplete" => {
                let mut response = req_object(obj, "response", name)?.clone();
                let empty = response.get("output").and_then(Value::as_array).is_none_or(Vec::is_empty);
                if empty && !self.items.is_empty() {
                    let items = self.items.values().map(Partial::to_item).collect();
                    response.insert("output".into(), Value::Array(items));
                }
                if !response.contains_key("model")
                    && let Some(model) = &self.model
                {
                    response.insert("model".into(), json!(model));
                }
                let answer = parse_response(&response, &join(name, "response"))?;
                delta.finish_reason = answer.finish_reason.clone();
                self.answer = Some(answer);
            }
            "response.failed" => {
                let response = req_object(obj, "response", name)?;
                return Err(provider_error(response)
                    .unwrap_or_else(|| FormatError::new("error", "the response failed")));
            }
            "error" => return Err(stream_error(obj)),
            // content_part, *.done, reasoning_summary_part and later kinds carry nothing more.
            _ => {}
        }
        Ok(Some(delta).filter(|d| *d != StreamDelta::default()))
    }

    fn item_added(
        &mut self,
        obj: &Map<String, Value>,
        name: &str,
        out: &mut StreamDelta,
    ) -> Result<(), FormatError> {
        let idx = req_u64(obj, "output_index", name)?;
        let item = req_object(obj, "item", name)?;
        let path = join(name, "item");
        let id = opt_str(item, "id", &path)?.map(str::to_owned);
        let partial = match req_str(item, "type", &path)? {
            "message" => Partial::Message { id, text: String::new() },
            "function_call" => {
                let call_id = req_str(item, "call_id", &path)?.to_owned();
                let tool = req_str(item, "name", &path)?.to_owned();
                let arguments = arguments_text(item, &path)?;
                out.tool_calls = Some(vec![ToolCallDelta {
                    id: call_id.as_str().into(),
                    name: Some(tool.clone()),
                    arguments: Some(arguments.clone()).filter(|a| !a.is_empty()),
                }]);
                Partial::Call { id, call_id, name: tool, arguments }
            }
            _ => Partial::Whole(Value::Object(item.clone())),
        };
        if self.items.insert(idx, partial).is_some() {
            return Err(FormatError::new(
                join(name, "output_index"),
                format!("output item {idx} was added twice"),
            ));
        }
        Ok(())
    }

    /// The complete response; fails when the stream ended before `response.completed`.
    pub fn finish(self) -> Result<LlmResponse, FormatError> {
        self.answer.ok_or_else(|| {
            FormatError::new("response.completed", "the stream ended before response.completed (cut short?)")
        })
    }
}

fn not_added(name: &str, idx: u64, what: &str) -> FormatError {
    FormatError::new(join(name, "output_index"), format!("output item {idx} is no {what} the stream added"))
}
