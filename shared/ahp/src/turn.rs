//! The AHP turn the projection has open, and what it has shown in it so far.

use std::collections::{BTreeMap, BTreeSet};

use ahp_types::state::Message as AhpMessage;
use turnstone_engine::ids::{CallId, InterruptId, MessageId, TurnId};
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
    /// The engine's turn.
    pub id: TurnId,
    /// The chat's turn it shows as: the engine turn's id, or the steering message's that
    /// took the chat on from the turn's safe point (`steered`).
    pub shown: String,
    pub started_at: Timestamp,
    pub origin: TurnOrigin,
    /// Whether `chat/turnStarted` went out. An engine turn's message is not in `turn.started`
    /// but in the events after it (its trigger or the recorded user message), so the
    /// announcement waits for the first of them.
    pub announced: bool,
    /// The pending message it was started from.
    pub queued_message_id: Option<String>,
    /// The message `chat/turnStarted` showed, to show it again when a truncation drops the
    /// turn from a chat while it runs.
    pub message: Option<AhpMessage>,
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
    /// Client tool calls no AHP client runs, shown as open input requests to a person.
    pub asked: BTreeSet<CallId>,
    /// Its user message is in the conversation (a resume need not send it again).
    pub recorded: bool,
    /// How many times the chat's turn it shows was resumed before.
    pub resumes: u32,
    /// Tool call parts a model call's stream started, with that call and attempt: withdrawn
    /// if the attempt fails.
    pub streamed_tools: BTreeMap<CallId, (CallId, u32)>,
}

impl OpenTurn {
    pub fn new(id: TurnId, started_at: Timestamp, origin: TurnOrigin) -> Self {
        OpenTurn {
            shown: id.to_string(),
            id,
            started_at,
            origin,
            announced: false,
            queued_message_id: None,
            message: None,
            usage: Usage::default(),
            model: None,
            tools: BTreeMap::new(),
            tool_names: BTreeMap::new(),
            texts: BTreeMap::new(),
            reasonings: BTreeMap::new(),
            reply: None,
            inputs: BTreeSet::new(),
            asked: BTreeSet::new(),
            streamed_tools: BTreeMap::new(),
            recorded: false,
            resumes: 0,
        }
    }

    /// The turn without the parts it showed, which a truncation dropped (its usage, model and
    /// pending reply stay the engine's).
    pub fn forget_parts(&mut self) {
        self.tools.clear();
        self.tool_names.clear();
        self.texts.clear();
        self.reasonings.clear();
        self.inputs.clear();
        self.streamed_tools.clear();
    }
}

/// Where a completed turn of the chat left the conversation: what a truncation keeps it by.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TurnEnd {
    /// A turn of engine turn `turn` (its own, or a steering message's that took the chat on)
    /// ended at `head` (`None`: the conversation was empty).
    At { turn: TurnId, head: Option<MessageId> },
    /// A turn a fork copied from its source's chat: it ended in the source.
    Copied,
}

/// The chat's latest turn, failed where a new engine turn can take it up again
/// (`chat/turnResume`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resumable {
    /// The chat's turn.
    pub shown: String,
    /// Its message, and whether the conversation holds it.
    pub message: AhpMessage,
    pub recorded: bool,
    /// How many times it was resumed: the next resume's engine turn is `<shown>.resume<n+1>`.
    pub resumes: u32,
}

/// How a client's `chat/turnResume` is carried out: a new engine turn `turn_id`, shown as the
/// resumed chat turn, that continues the conversation (`message` is `None`) or sends the
/// turn's message again (it never reached the conversation).
#[derive(Debug, Clone, PartialEq)]
pub struct Resumption {
    pub turn_id: String,
    pub message: Option<String>,
}
