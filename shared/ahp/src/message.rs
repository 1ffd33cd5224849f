//! The message that starts a turn, from whatever input started it in the engine.

use ahp_types::common::JsonObject;
use ahp_types::state::{Message, MessageKind, MessageOrigin};
use serde_json::{Value, json};
use turnstone_engine::protocol::{DraftMessage, Role};
use turnstone_engine::session::{TriggerSource, TurnInput, TurnOrigin};

/// Who speaks in a turn's message: the client's person, or (for a sub-agent's session) the
/// parent's delegation, a tool call in AHP's words.
pub(crate) fn kind(origin: TurnOrigin) -> MessageKind {
    match origin {
        TurnOrigin::Client => MessageKind::User,
        TurnOrigin::Parent => MessageKind::Tool,
    }
}

/// A message of `text`.
pub(crate) fn text(text: String, origin: TurnOrigin) -> Message {
    Message {
        text,
        origin: MessageOrigin { kind: kind(origin) },
        attachments: None,
        model: None,
        agent: None,
        meta: None,
    }
}

/// The message of a turn started by `input` (a queued turn keeps its input).
pub(crate) fn from_input(input: Option<&TurnInput>, origin: TurnOrigin) -> Message {
    match input {
        Some(TurnInput::Message { message, .. }) => text(message.content_text(), origin),
        Some(TurnInput::Messages { messages, .. }) => from_view(messages, origin),
        Some(TurnInput::Action { name, args }) => action(name, args.as_ref(), origin),
        None => text(String::new(), origin),
    }
}

/// The message of a turn whose input is `source`; `None` for a trigger that starts no turn.
pub(crate) fn from_source(source: &TriggerSource, origin: TurnOrigin) -> Option<Message> {
    match source {
        TriggerSource::ClientMessage { message, .. } => Some(text(message.content_text(), origin)),
        TriggerSource::ClientMessages { messages, .. } => Some(from_view(messages, origin)),
        TriggerSource::ClientAction { name, args } => Some(action(name, args.as_ref(), origin)),
        TriggerSource::SessionStart
        | TriggerSource::ToolExecute { .. }
        | TriggerSource::LlmExecute { .. }
        | TriggerSource::CallFinished { .. }
        | TriggerSource::InterruptResumed { .. } => None,
    }
}

/// A client's whole view starts a turn with its last user message (a view without one, e.g.
/// a regeneration, with an empty message).
fn from_view(messages: &[DraftMessage], origin: TurnOrigin) -> Message {
    let last = messages.iter().rev().find(|m| m.role == Role::User);
    text(last.map(DraftMessage::content_text).unwrap_or_default(), origin)
}

/// A `client.action` turn: AHP messages are text, so the action's name is the text and the
/// action itself travels in `_meta.turnstoneAction`.
fn action(name: &str, args: Option<&Value>, origin: TurnOrigin) -> Message {
    let mut meta = JsonObject::new();
    meta.insert("turnstoneAction".into(), json!({ "name": name, "args": args }));
    Message { meta: Some(meta), ..text(name.to_owned(), origin) }
}
