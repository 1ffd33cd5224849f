//! The scripted model: a deterministic built-in model for demos and tests (config `type =
//! "scripted"`). It makes no network call, never sleeps, and the same request always gets the
//! same answer (tool call ids included).
//!
//! It reads the **last message** of the request (system messages are never echoed):
//!
//! 1. **Tool results.** When the conversation ends with one or more `tool` messages, it
//!    answers text summarizing each of them, one line per message, in order:
//!    `<tool name> returned: <content>` (the name is the message's `name`, else that of the
//!    tool call it answers, else `tool`).
//! 2. **Commands**, when the last message is a `user` message whose text starts with `/`:
//!    - `/tool <name> <json args>`: calls tool `<name>` with the rest of the line as its
//!      argument string, verbatim (`{}` when empty; malformed JSON is passed on as is, so the
//!      engine's argument checks can be exercised).
//!    - `/agent <name> <task>`: calls the sub-agent tool `<name>` with `{"message": "<task>"}`.
//!
//!    Several `/tool` and `/agent` lines make parallel calls, in order (one command per line;
//!    other lines are ignored). Every named tool must be among the request's `tools`;
//!    otherwise the answer is the text `Unknown tool "<name>". Available tools: <names>.` (or
//!    `none`) and no tool is called. A call's id is `call_` followed by 12 hex digits of a
//!    64-bit FNV-1a hash of the whole conversation and the line's position, so the same
//!    command later in a conversation (or on a different branch) gets a different id.
//!    - `/fail` fails the call with a retryable `provider_error`; `/fail!` with a terminal one.
//!    - `/long` answers a long text (276 words), for streaming demos.
//! 3. **Anything else**: `You said: <text>`, the text of the last user message (its text
//!    parts joined by newlines), or `Hello from the scripted model.` when there is no user
//!    message at all.
//!
//! A text answer finishes with `stop`, a tool call answer with `tool_calls`. Streaming sends a
//! text answer word by word (each delta is a word with the whitespace before it, so the deltas
//! concatenate to the content), each tool call as one delta, then a last delta with the finish
//! reason. Usage counts whitespace-separated words, in OpenAI's shape: `prompt_tokens` over
//! the text and tool call arguments of every request message, `completion_tokens` over the
//! answer's text, tool names and arguments. The cost is `"0"` and the model is the request's.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use turnstone_engine::protocol::{
    Content, ContentPart, DraftMessage, LlmRequest, LlmResponse, Role, StreamDelta, ToolCall, ToolCallDelta,
};

use super::{ModelProvider, ProviderError};

/// The deterministic built-in model (see the module documentation for its rules).
#[derive(Debug, Clone, Copy, Default)]
pub struct ScriptedProvider;

impl ScriptedProvider {
    /// The scripted model.
    pub fn new() -> Self {
        ScriptedProvider
    }

    /// The answer to `request`, without streaming.
    pub fn answer(&self, request: &LlmRequest) -> Result<LlmResponse, ProviderError> {
        let reply = reply(request)?;
        let completion_tokens = words(reply.text.as_deref().unwrap_or_default())
            + reply.calls.iter().map(|c| words(&c.function.name) + words(&c.function.arguments)).sum::<u64>();
        let prompt_tokens = request
            .messages
            .iter()
            .map(|m| {
                content_words(m.content.as_ref())
                    + m.tool_calls.iter().flatten().map(|c| words(&c.function.arguments)).sum::<u64>()
            })
            .sum::<u64>();
        let finish_reason = if reply.calls.is_empty() { "stop" } else { "tool_calls" };
        Ok(LlmResponse {
            model: request.model.clone(),
            content: reply.text,
            tool_calls: Some(reply.calls).filter(|c| !c.is_empty()),
            finish_reason: Some(finish_reason.to_owned()),
            usage: Some(json!({
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            })),
            cost: Some("0".to_owned()),
            images: None,
            reasoning: None,
            provider_blocks: None,
        })
    }
}

#[async_trait]
impl ModelProvider for ScriptedProvider {
    async fn complete(
        &self,
        request: &LlmRequest,
        stream: bool,
        _timeout: Option<Duration>,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<LlmResponse, ProviderError> {
        let answer = self.answer(request)?;
        if stream {
            for delta in deltas(&answer) {
                on_delta(delta);
            }
        }
        Ok(answer)
    }

    fn name(&self) -> &'static str {
        "scripted"
    }
}

/// What the model says: text, or tool calls.
struct Reply {
    text: Option<String>,
    calls: Vec<ToolCall>,
}

impl Reply {
    fn text(text: impl Into<String>) -> Self {
        Reply { text: Some(text.into()), calls: Vec::new() }
    }
}

fn reply(request: &LlmRequest) -> Result<Reply, ProviderError> {
    let messages = &request.messages;
    let trailing_tools = messages.iter().rev().take_while(|m| m.role == Role::Tool).count();
    if trailing_tools > 0 {
        let results = messages.get(messages.len() - trailing_tools..).unwrap_or_default();
        let lines: Vec<String> = results
            .iter()
            .map(|m| format!("{} returned: {}", tool_name(messages, m), m.content_text()))
            .collect();
        return Ok(Reply::text(lines.join("\n")));
    }
    let Some(last_user) = messages.iter().rev().find(|m| m.role == Role::User) else {
        return Ok(Reply::text("Hello from the scripted model."));
    };
    let text = last_user.content_text();
    let is_last = messages.last().is_some_and(|m| std::ptr::eq(m, last_user));
    if is_last
        && text.trim_start().starts_with('/')
        && let Some(reply) = command(request, text.trim_start())?
    {
        return Ok(reply);
    }
    Ok(Reply::text(format!("You said: {text}")))
}

/// The name of the tool a tool message answers.
fn tool_name(messages: &[Arc<DraftMessage>], result: &DraftMessage) -> String {
    if let Some(name) = result.name.as_deref().filter(|n| !n.is_empty()) {
        return name.to_owned();
    }
    result
        .tool_call_id
        .as_deref()
        .and_then(|id| messages.iter().flat_map(|m| m.tool_calls.iter().flatten()).find(|call| call.id == id))
        .map_or_else(|| "tool".to_owned(), |call| call.function.name.clone())
}

/// The reply to a command, or `None` when the text is no command (it is then echoed).
fn command(request: &LlmRequest, text: &str) -> Result<Option<Reply>, ProviderError> {
    let first = text.lines().next().unwrap_or_default().trim();
    let (word, _) = split_word(first);
    match word {
        "/fail!" => Err(ProviderError::terminal("scripted failure (/fail!)")),
        "/fail" => Err(ProviderError::retryable("scripted failure (/fail)")),
        "/long" => Ok(Some(Reply::text(long_text()))),
        "/tool" | "/agent" => Ok(Some(tool_calls(request, text))),
        _ => Ok(None),
    }
}

fn tool_calls(request: &LlmRequest, text: &str) -> Reply {
    let available: Vec<&str> = request.tools.iter().flatten().map(|t| t.name.as_str()).collect();
    let conversation = serde_json::to_vec(&request.messages).unwrap_or_default();
    let mut calls = Vec::new();
    for (position, line) in text.lines().enumerate() {
        let (word, rest) = split_word(line.trim());
        let (name, rest) = split_word(rest);
        let arguments = match word {
            "/tool" => {
                let args = rest.trim();
                if args.is_empty() { "{}".to_owned() } else { args.to_owned() }
            }
            "/agent" => json!({ "message": rest.trim() }).to_string(),
            _ => continue,
        };
        if name.is_empty() {
            return Reply::text(format!(
                "Usage: {word} <name> {}",
                if word == "/tool" { "<json args>" } else { "<task>" }
            ));
        }
        if !available.contains(&name) {
            let list = if available.is_empty() { "none".to_owned() } else { available.join(", ") };
            return Reply::text(format!("Unknown tool \"{name}\". Available tools: {list}."));
        }
        let id = format!("call_{:012x}", call_hash(&conversation, position) & 0xffff_ffff_ffff);
        calls.push(ToolCall::function(id, name, arguments));
    }
    Reply { text: None, calls }
}

/// The first whitespace-separated word of `text` and the rest after it.
fn split_word(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    match text.find(char::is_whitespace) {
        Some(end) => (text.get(..end).unwrap_or(text), text.get(end..).unwrap_or_default()),
        None => (text, ""),
    }
}

/// 64-bit FNV-1a of the serialized conversation and a line position: stable across builds.
fn call_hash(conversation: &[u8], position: usize) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    conversation
        .iter()
        .chain(b"\n")
        .chain(position.to_string().as_bytes())
        .fold(OFFSET, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME))
}

fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// The words of a message's text, counted in place (its text parts are joined by newlines, so
/// each part's words are its own): the prompt is counted on every call, the whole conversation
/// each time, and copying its text first was a measurable part of a long session's CPU per turn.
fn content_words(content: Option<&Content>) -> u64 {
    match content {
        Some(Content::Text(text)) => words(text),
        Some(Content::Parts(parts)) => parts
            .iter()
            .map(|part| match part {
                ContentPart::Text { text } => words(text),
                _ => 0,
            })
            .sum(),
        None => 0,
    }
}

/// The `/long` answer.
fn long_text() -> String {
    let mut text = String::new();
    for n in 1..=12 {
        if n > 1 {
            text.push(' ');
        }
        let _ = write!(
            text,
            "Sentence {n} of a long answer from the scripted model, sent word by word so that a \
             streaming client can watch the text arrive."
        );
    }
    text
}

/// The stream of a complete answer: words of the text, then one delta per tool call, then the
/// finish reason.
fn deltas(answer: &LlmResponse) -> Vec<StreamDelta> {
    let mut out = Vec::new();
    if let Some(text) = &answer.content {
        out.extend(
            word_pieces(text)
                .into_iter()
                .map(|piece| StreamDelta { text: Some(piece.to_owned()), ..StreamDelta::default() }),
        );
    }
    for call in answer.tool_calls.iter().flatten() {
        out.push(StreamDelta {
            tool_calls: Some(vec![ToolCallDelta {
                id: call.id.clone(),
                name: Some(call.function.name.clone()),
                arguments: Some(call.function.arguments.clone()),
            }]),
            ..StreamDelta::default()
        });
    }
    out.push(StreamDelta { finish_reason: answer.finish_reason.clone(), ..StreamDelta::default() });
    out
}

/// `text` cut at the whitespace before each word (trailing whitespace stays with the last
/// word): the pieces concatenate to `text`.
fn word_pieces(text: &str) -> Vec<&str> {
    let mut cuts = vec![0];
    let mut prev_space = true;
    for (i, c) in text.char_indices() {
        let space = c.is_whitespace();
        if space && !prev_space {
            cuts.push(i);
        }
        prev_space = space;
    }
    // A last cut followed by whitespace only joins the piece before it.
    if let Some(&last) = cuts.last()
        && last > 0
        && text.get(last..).is_some_and(|rest| rest.trim().is_empty())
    {
        cuts.pop();
    }
    cuts.push(text.len());
    cuts.windows(2)
        .filter_map(|w| if let [a, b] = *w { text.get(a..b) } else { None })
        .filter(|p| !p.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_pieces_concatenate() {
        for text in ["You said: hello  world", " lead", "a\nb c", "", "one", "trail "] {
            let pieces = word_pieces(text);
            assert_eq!(pieces.concat(), text);
            assert!(pieces.iter().all(|p| !p.is_empty()));
        }
        assert_eq!(word_pieces("a b  c"), vec!["a", " b", "  c"]);
        assert_eq!(word_pieces(" lead x"), vec![" lead", " x"]);
    }

    #[test]
    fn split_word_forms() {
        assert_eq!(split_word("/tool a {}"), ("/tool", " a {}"));
        assert_eq!(split_word("  x"), ("x", ""));
        assert_eq!(split_word(""), ("", ""));
    }

    #[test]
    fn fnv_is_stable() {
        // FNV-1a 64 of "" followed by "\n0".
        assert_eq!(call_hash(b"", 0), call_hash(b"", 0));
        assert_ne!(call_hash(b"", 0), call_hash(b"", 1));
        assert_ne!(call_hash(b"a", 0), call_hash(b"b", 0));
    }
}
