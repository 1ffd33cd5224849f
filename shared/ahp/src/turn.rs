//! The AHP turn the projection has open, and what it has shown in it so far.

use std::collections::{BTreeMap, BTreeSet};

use turnstone_engine::ids::{CallId, InterruptId, TurnId};
use turnstone_engine::session::{TurnOrigin, Usage};
use turnstone_engine::time::Timestamp;

/// Where a tool call's part is in its lifecycle, as far as the projection drove it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolPart {
    /// The model is (or was) writing its arguments; `partial` is what was shown.
    Streaming { partial: String },
    /// The engine made the call, which waits for a person's approval.
    PendingConfirmation,
    /// The engine made the call (`call.created`), or it was approved: it runs.
    Running,
    /// Completed or cancelled: nothing changes it any more.
    Closed,
}

/// The engine's active turn as an AHP active turn.
#[derive(Debug, Clone)]
pub(crate) struct OpenTurn {
    pub id: TurnId,
    pub started_at: Timestamp,
    pub origin: TurnOrigin,
    /// Whether `chat/turnStarted` went out. An engine turn's message is not in `turn.started`
    /// but in the events after it (its trigger or the recorded user message), so the
    /// announcement waits for the first of them.
    pub announced: bool,
    /// The pending message it was started from.
    pub queued_message_id: Option<String>,
    /// The engine's usage of the turn, summed the engine's way.
    pub usage: Usage,
    /// The model of the last model call.
    pub model: Option<String>,
    pub tools: BTreeMap<CallId, ToolPart>,
    /// The tool (or sub-agent) name each tool call part shows.
    pub tool_names: BTreeMap<CallId, String>,
    /// Markdown parts by id, with the text shown.
    pub texts: BTreeMap<String, String>,
    /// Reasoning parts by id, with the reasoning shown.
    pub reasonings: BTreeMap<String, String>,
    /// The settled model call (and attempt) whose reply the next assistant message records.
    pub reply: Option<(CallId, u32)>,
    /// Interrupts shown as open input requests.
    pub inputs: BTreeSet<InterruptId>,
}

impl OpenTurn {
    pub fn new(id: TurnId, started_at: Timestamp, origin: TurnOrigin) -> Self {
        OpenTurn {
            id,
            started_at,
            origin,
            announced: false,
            queued_message_id: None,
            usage: Usage::default(),
            model: None,
            tools: BTreeMap::new(),
            tool_names: BTreeMap::new(),
            texts: BTreeMap::new(),
            reasonings: BTreeMap::new(),
            reply: None,
            inputs: BTreeSet::new(),
        }
    }
}
