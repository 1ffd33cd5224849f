//! [`Limits`]: how much one session may be sent or hold, set by the host for every command
//! ([`super::Ctx::limits`]). Each is refused where it is crossed, naming the limit: a client's
//! input with an invalid-input rejection at the field at fault, a worker's answer with a failed
//! decision naming the field, a queued turn too many with [`super::Rejection::QueueFull`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::DraftMessage;

/// The limits of a session; every field has a default ([`Limits::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Messages in one client input (`client.messages`): 1,000.
    pub messages_per_input: usize,
    /// Bytes of one message's content, or of one tool result, from a client or a worker: 256 KiB.
    pub message_bytes: usize,
    /// Bytes of the agent state a worker writes (`state`, as JSON): 256 KiB.
    pub state_bytes: usize,
    /// Turns waiting behind the active one (queued and steering): 32.
    pub queued_turns: usize,
    /// How deep sub-agents nest: a root session's children are at depth 1; 8.
    pub sub_agent_depth: usize,
    /// Delegations of one session open at once: 32.
    pub sub_agent_fanout: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            messages_per_input: 1_000,
            message_bytes: 256 * 1024,
            state_bytes: 256 * 1024,
            queued_turns: 32,
            sub_agent_depth: 8,
            sub_agent_fanout: 32,
        }
    }
}

impl Limits {
    /// The messages of one input or answer, each within `message_bytes`: the path (under
    /// `at`, e.g. `messages`) and the problem of the first that is not.
    pub(crate) fn check_messages(&self, at: &str, messages: &[DraftMessage]) -> Result<(), (String, String)> {
        for (i, message) in messages.iter().enumerate() {
            self.check_message(message).map_err(|problem| (format!("{at}[{i}].content"), problem))?;
        }
        Ok(())
    }

    /// One message's content within `message_bytes` (its size as JSON: text and parts alike).
    pub(crate) fn check_message(&self, message: &DraftMessage) -> Result<(), String> {
        let size = message.content.as_ref().map_or(0, json_size);
        check_size("the message's content", size, self.message_bytes, "message_bytes")
    }

    /// A tool result, an error text, a payload or action arguments within `message_bytes`.
    pub(crate) fn check_value(&self, what: &str, value: &(impl Serialize + ?Sized)) -> Result<(), String> {
        check_size(what, json_size(value), self.message_bytes, "message_bytes")
    }

    /// A worker's agent state within `state_bytes`.
    pub(crate) fn check_state(&self, state: &Value) -> Result<(), String> {
        check_size("the state", json_size(state), self.state_bytes, "state_bytes")
    }
}

/// `what`, `size` bytes, within `limit` (`limits.<name>`), or the problem saying so.
fn check_size(what: &str, size: usize, limit: usize, name: &str) -> Result<(), String> {
    if size <= limit {
        return Ok(());
    }
    Err(format!("{what} is {size} bytes, over the limit of {limit} (limits.{name})"))
}

/// The size of `value` as JSON, in bytes (a string: its text and quotes).
fn json_size(value: &(impl Serialize + ?Sized)) -> usize {
    serde_json::to_vec(value).map_or(usize::MAX, |bytes| bytes.len())
}
