//! [`ChatProjection`]: one session's events as the actions of its AHP chat.

use std::collections::BTreeSet;

use ahp::reducers::{ReduceOutcome, apply_action_to_chat};
use ahp_types::StateAction;
use ahp_types::actions::{
    ChatErrorAction, ChatPendingMessageRemovedAction, ChatPendingMessageSetAction,
    ChatQueuedMessagesReorderedAction, ChatResponsePartAction, ChatTruncatedAction, ChatTurnCancelledAction,
    ChatTurnCompleteAction, ChatTurnResumeAction, ChatTurnStartedAction, ChatUsageAction,
};
use ahp_types::state::{
    ChatInteractivity, ChatOrigin, ChatState, ErrorInfo, ErrorResponsePart, MarkdownResponsePart,
    Message as AhpMessage, PendingMessageKind, ResponsePart, SessionStatus, ToolCallCancellationReason,
    ToolCallClientContributor, ToolCallConfirmationReason, ToolCallContributor, ToolCallState,
};
use turnstone_engine::ids::{CallId, InterruptId, MessageId, SessionId, TurnId};
use turnstone_engine::protocol::{ErrorCode, Message, Role, ToolHandler};
use turnstone_engine::session::{
    CallOutcome, CallRecord, CallSpec, CallValue, Event, Interrupt, PendingTrigger, Session, SessionInit,
    TurnRecord, TurnStatus,
};
use turnstone_engine::time::Timestamp;

use crate::error::ProjectionError;
use crate::turn::{OpenTurn, Resumable, Resumption, ToolPart, TurnEnd};
use crate::uri::chat_uri;
use crate::{input, message, parts, tool_call, usage};

/// Why a call still open when its turn ends is cancelled.
const TURN_ENDED: &str = "the turn ended before the call finished";

/// The AHP chat of one Turnstone session, kept up to date event by event.
///
/// Every action it returns has already been reduced into [`ChatProjection::chat`] by the
/// protocol's reducer, which applied it (anything else is a [`ProjectionError`]).
#[derive(Debug, Clone)]
pub struct ChatProjection {
    /// The session as the events so far make it (the engine's own fold): what a call, a turn or
    /// a tool is, asked the engine's way.
    pub(crate) session: Session,
    pub(crate) chat: ChatState,
    pub(crate) turn: Option<OpenTurn>,
    /// The chat's completed turns, in order, each with where it left the conversation.
    ends: Vec<(String, TurnEnd)>,
    /// Queued turns shown as pending messages.
    queued: Vec<TurnId>,
    /// Steering turns waiting for the active turn's safe point, oldest first; AHP shows one
    /// steering message, the latest.
    steering: Vec<TurnId>,
    /// The session's forks, in the order they were made: each a session continuing this one's
    /// conversation through a turn, a chat of this AHP session.
    forks: Vec<(SessionId, TurnId)>,
    /// The sub-agents its tool calls delegated to, in the order they were called: each a
    /// session of its own, a read-only chat of this AHP session.
    children: Vec<SessionId>,
    /// The actions of the event (or delta) being projected.
    emitted: Vec<StateAction>,
    /// What is being projected, for errors.
    pub(crate) projecting: &'static str,
    /// When the latest event that says happened: when a steering message took the chat on.
    last_at: Timestamp,
    /// The chat's latest turn, when it failed resumably.
    resumable: Option<Resumable>,
}

/// The chat that session `session_id`'s `events` (its log, in order) make.
pub fn chat_from_log<'a>(
    session_id: impl Into<SessionId>,
    events: impl IntoIterator<Item = &'a Event>,
) -> Result<ChatState, ProjectionError> {
    let mut projection = ChatProjection::new(session_id);
    for event in events {
        projection.apply(event)?;
    }
    Ok(projection.chat)
}

impl ChatProjection {
    /// The chat of session `session_id` before its first event: empty, idle.
    pub fn new(session_id: impl Into<SessionId>) -> Self {
        let session_id = session_id.into();
        let chat = ChatState {
            resource: chat_uri(&session_id),
            title: session_id.to_string(),
            status: SessionStatus::Idle.bits(),
            activity: None,
            modified_at: Timestamp(0).to_rfc3339(),
            changes: None,
            origin: None,
            movable: None,
            interactivity: None,
            working_directories: None,
            changesets: None,
            background_work: None,
            canvases: None,
            turns: Vec::new(),
            turns_next_cursor: None,
            active_turn: None,
            steering_message: None,
            queued_messages: None,
            draft: None,
            meta: None,
        };
        ChatProjection {
            session: Session::new(session_id),
            chat,
            turn: None,
            ends: Vec::new(),
            queued: Vec::new(),
            steering: Vec::new(),
            forks: Vec::new(),
            children: Vec::new(),
            emitted: Vec::new(),
            projecting: "",
            last_at: Timestamp(0),
            resumable: None,
        }
    }

    /// The session's id.
    pub fn session_id(&self) -> &SessionId {
        self.session.id()
    }

    /// A fork's chat: it starts with `history`, its source's turns through the one it forks
    /// at (AHP copies a fork's history into the new chat), before the fork's own events.
    pub fn forked(session_id: impl Into<SessionId>, history: Vec<ahp_types::state::Turn>) -> Self {
        let mut projection = ChatProjection::new(session_id);
        projection.ends = history.iter().map(|t| (t.id.clone(), TurnEnd::Copied)).collect();
        projection.chat.turns = history;
        projection
    }

    /// The session's forks so far, oldest first: each a session that continues this one's
    /// conversation through a turn.
    pub fn forks(&self) -> &[(SessionId, TurnId)] {
        &self.forks
    }

    /// Where the conversation is rewound to when a client truncates the chat through its
    /// completed turn `turn_id` (`None`: through no turn): the head that turn ended at.
    /// `Err` says why the chat cannot be truncated there.
    pub fn truncation_head(&self, turn_id: Option<&str>) -> Result<Option<MessageId>, String> {
        let Some(turn_id) = turn_id else { return Ok(None) };
        match self.ends.iter().find(|(id, _)| id == turn_id).map(|(_, end)| end) {
            Some(TurnEnd::At { head, .. }) => Ok(head.clone()),
            Some(TurnEnd::Copied) => Err(format!(
                "turn {turn_id} was copied from the chat this one forked: truncate that chat, or \
                 fork it at an earlier turn"
            )),
            None => Err(format!("turn {turn_id} is not a completed turn of this chat")),
        }
    }

    /// How many of the chat's turns a fork at engine turn `turn_id` copies: those through the
    /// last one that turn shows as (a steering message's turns included).
    pub fn turns_through(&self, turn_id: &TurnId) -> usize {
        self.ends
            .iter()
            .rposition(|(shown, end)| match end {
                TurnEnd::At { turn, .. } => turn == turn_id,
                TurnEnd::Copied => shown == turn_id.as_str(),
            })
            .map_or(0, |i| i + 1)
    }

    /// The sub-agent sessions its calls delegated to so far, in order.
    pub fn children(&self) -> &[SessionId] {
        &self.children
    }

    /// The chat as the actions so far reduce it.
    pub fn chat(&self) -> &ChatState {
        &self.chat
    }

    /// Projects the session's next event: the chat actions it means, already reduced into the
    /// chat. Events must come in log order, each once.
    pub fn apply(&mut self, event: &Event) -> Result<Vec<StateAction>, ProjectionError> {
        self.projecting = event.name();
        // The mapping reads the session as it was before the event (a call's record before it
        // settles, a queued turn's input before it starts).
        self.last_at = event.at().unwrap_or(self.last_at);
        let projected = self.project(event);
        self.session.apply(event);
        self.finish(projected)
    }

    /// Hands out the emitted actions, or the error.
    pub(crate) fn finish(
        &mut self,
        projected: Result<(), ProjectionError>,
    ) -> Result<Vec<StateAction>, ProjectionError> {
        let emitted = std::mem::take(&mut self.emitted);
        projected.map(|()| emitted)
    }

    /// Reduces `action` into the chat and keeps it; an action the reducer does not apply is a
    /// bug in the mapping.
    pub(crate) fn emit(&mut self, action: StateAction) -> Result<(), ProjectionError> {
        match apply_action_to_chat(&mut self.chat, &action) {
            ReduceOutcome::Applied => {
                self.emitted.push(action);
                Ok(())
            }
            outcome => Err(ProjectionError::NotApplied {
                action: action_type(&action),
                outcome: format!("{outcome:?}"),
                source_name: self.projecting,
            }),
        }
    }

    fn project(&mut self, event: &Event) -> Result<(), ProjectionError> {
        match event {
            Event::SessionCreated { init, at, .. } => {
                self.created(init, *at);
                Ok(())
            }
            Event::TurnStarted { turn } => self.started(turn),
            Event::TurnQueued { turn } => self.queue(turn),
            Event::TurnActivated { turn_id, at } => self.activate(turn_id, *at),
            Event::TurnSteered { turn_id, into } => {
                self.steered(turn_id)?;
                self.promote(turn_id, into)
            }
            Event::QueueReordered { order } => self.reorder(order),
            Event::Forked { session_id, turn_id } => {
                self.forks.push((session_id.clone(), turn_id.clone()));
                Ok(())
            }
            Event::TurnEnded { turn_id, status, error, code, at, .. } => {
                self.end(turn_id, *status, error.as_deref(), code.as_ref(), *at)
            }
            Event::TriggerQueued { trigger } => self.trigger(trigger),
            Event::MessageRecorded { message, parent_id } => {
                // News written off the head (an edit or a regeneration) branches first.
                if parent_id.as_ref() != self.session.tree().head() {
                    self.branched(parent_id.as_ref())?;
                }
                self.message(message)
            }
            Event::HeadMoved { head_id } => self.branched(head_id.as_ref()),
            Event::CallCreated { call } => self.call_created(call),
            Event::CallDispatched { .. } => Ok(()),
            Event::CallApproved { call_id } => self.call_approved(call_id),
            Event::CallSettled { call_id, attempt, outcome, .. } => {
                self.call_settled(call_id, *attempt, outcome)
            }
            Event::CallVoided { call_id, reason } => self.cancel_call(call_id, reason),
            Event::CallRetryScheduled { call_id, attempt, .. } => self.withdraw(call_id, *attempt),
            Event::InterruptOpened { interrupt } => self.interrupt_opened(interrupt),
            Event::InterruptResumed { interrupt_id, payload } => {
                self.interrupt_resumed(interrupt_id, payload.as_ref())
            }
            // Its marker message, recorded just before, shows nothing itself: the compaction shows
            // here, with its figures.
            Event::ContextCompacted { .. } => self.compacted(event),
            // The engine's bookkeeping: decisions, retries, reporting, the outbox and agent
            // state show nothing in a chat. A closed interrupt stays unanswered in its turn,
            // as AHP keeps an input request its turn ended without. A title is the session's
            // (its channel and summary show it), and no chat action changes a chat's title.
            Event::SessionTitled { .. }
            | Event::TurnAliased { .. }
            | Event::TurnDone { .. }
            | Event::TriggerDropped { .. }
            | Event::DecisionOpened { .. }
            | Event::DecisionDispatched { .. }
            | Event::DecisionRetryScheduled { .. }
            | Event::DecisionResolved { .. }
            | Event::DecisionAccepted { .. }
            | Event::DecisionFailed { .. }
            | Event::DecisionVoided { .. }
            | Event::ActionIgnored { .. }
            | Event::StateWritten { .. }
            | Event::AgentWritten { .. }
            | Event::StateRestored { .. }
            | Event::AgentRestored { .. }
            | Event::CallRequeued { .. }
            | Event::CallReported { .. }
            | Event::InterruptClosed { .. }
            | Event::OutboxQueued { .. }
            | Event::OutboxDelivered { .. }
            | Event::OutboxWithdrawn { .. } => Ok(()),
        }
    }

    /// The chat's own fields come from the session's creation; AHP has no chat action for
    /// them (they belong to the snapshot and to the session's catalog).
    fn created(&mut self, init: &SessionInit, at: Timestamp) {
        self.chat.title = init.agent_id.clone();
        self.chat.modified_at = at.to_rfc3339();
        // A sub-agent's chat was spawned by its parent's tool call; a fork's, by a fork of its
        // source chat at a turn.
        let spawned = init.parent.as_ref().map(|parent| ChatOrigin::Tool {
            chat: chat_uri(&parent.session_id),
            tool_call_id: parent.tool_call_id.to_string(),
        });
        let forked = init.fork.as_ref().map(|fork| ChatOrigin::Fork {
            chat: chat_uri(&fork.session_id),
            turn_id: fork.turn_id.to_string(),
        });
        // A sub-agent's chat is its parent agent's to drive: people watch it.
        if spawned.is_some() {
            self.chat.interactivity = Some(ChatInteractivity::ReadOnly);
        }
        self.chat.origin = spawned.or(forked);
    }

    /// A turn starts; its message shows with its trigger or its recorded message. A turn
    /// that resumes the chat's failed latest turn (`<turn>.resume<n>`) takes it up again
    /// (`chat/turnResume`): that turn is active again, its parts kept, and shows what follows.
    fn started(&mut self, turn: &TurnRecord) -> Result<(), ProjectionError> {
        let started_at = turn.started_at.unwrap_or(turn.submitted_at);
        let mut open = OpenTurn::new(turn.id.clone(), started_at, turn.origin);
        let resumed =
            self.resumable.take().filter(|r| resume_turn_id(&r.shown, r.resumes) == turn.id.as_str());
        if let Some(resumed) = resumed {
            self.emit(StateAction::ChatTurnResume(ChatTurnResumeAction { turn_id: resumed.shown.clone() }))?;
            self.ends.pop();
            let reopened = self.chat.active_turn.as_ref();
            open.started_at =
                reopened.and_then(|t| Timestamp::parse_rfc3339(&t.started_at)).unwrap_or(started_at);
            open.shown = resumed.shown;
            open.message = Some(resumed.message);
            open.recorded = resumed.recorded;
            open.announced = true;
            open.resumes = resumed.resumes + 1;
        }
        self.turn = Some(open);
        Ok(())
    }

    /// How the chat's turn `turn_id` is resumed, if it can be: it must be the latest, failed
    /// where a new turn can take it up again.
    pub fn resumption(&self, turn_id: &str) -> Result<Resumption, String> {
        match &self.resumable {
            Some(r) if r.shown == turn_id => Ok(Resumption {
                turn_id: resume_turn_id(&r.shown, r.resumes),
                message: (!r.recorded).then(|| r.message.text.clone()),
            }),
            _ => Err(format!("turn {turn_id} is not the chat's latest turn failed resumably")),
        }
    }

    fn queue(&mut self, turn: &TurnRecord) -> Result<(), ProjectionError> {
        let message = message::from_input(turn.input.as_ref(), turn.origin);
        let kind = if turn.steering { PendingMessageKind::Steering } else { PendingMessageKind::Queued };
        self.emit(StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
            kind,
            id: turn.id.to_string(),
            message,
        }))?;
        if turn.steering {
            self.steering.push(turn.id.clone());
        } else {
            self.queued.push(turn.id.clone());
        }
        Ok(())
    }

    /// The queued messages take the engine's new order (the whole of it, so the reducer's
    /// order is the engine's).
    fn reorder(&mut self, order: &[TurnId]) -> Result<(), ProjectionError> {
        if self.queued.as_slice() == order {
            return Ok(());
        }
        self.queued = order.to_vec();
        let order = order.iter().map(TurnId::to_string).collect();
        self.emit(StateAction::ChatQueuedMessagesReordered(ChatQueuedMessagesReorderedAction { order }))
    }

    /// A steering message entered the active turn: it is no longer pending. AHP shows the
    /// latest steering message only, so the one shown leaves the chat when the latest does.
    fn steered(&mut self, turn_id: &TurnId) -> Result<(), ProjectionError> {
        let Some(i) = self.steering.iter().position(|t| t == turn_id) else { return Ok(()) };
        let shown = i + 1 == self.steering.len();
        self.steering.remove(i);
        if !shown {
            return Ok(());
        }
        self.emit(StateAction::ChatPendingMessageRemoved(ChatPendingMessageRemovedAction {
            kind: PendingMessageKind::Steering,
            id: turn_id.to_string(),
        }))
    }

    /// A steering message that entered the running turn stays in the transcript as a turn of
    /// its own: the chat's turn completes where the message came in, and the message starts
    /// the next one, in which the engine's turn goes on (so its id names a chat turn, and
    /// `chat/turnCancelled` of it cancels the engine's).
    fn promote(&mut self, steering: &TurnId, into: &TurnId) -> Result<(), ProjectionError> {
        let Some(turn) = self.turn.as_ref().filter(|t| t.announced && t.id == *into) else { return Ok(()) };
        let record = self.session.turn(steering);
        let origin = record.map_or(turn.origin, |t| t.origin);
        let message = message::from_input(record.and_then(|t| t.input.as_ref()), origin);
        let (shown, started_at) = (turn.shown.clone(), turn.started_at);
        // At a safe point every tool call has its result, so no part is open; the turn ends
        // before the steering message, recorded just now.
        let tree = self.session.tree();
        let end = tree.head().and_then(|h| tree.get(h)).and_then(|node| node.parent_id.clone());
        let duration = self.last_at.0.saturating_sub(started_at.0).max(0);
        self.emit(StateAction::ChatTurnComplete(ChatTurnCompleteAction {
            turn_id: shown.clone(),
            duration,
            meta: None,
        }))?;
        self.ends.push((shown, TurnEnd::At { turn: into.clone(), head: end }));
        let mut next = OpenTurn::new(into.clone(), self.last_at, origin);
        next.shown = steering.to_string();
        if let Some(turn) = self.turn.as_ref() {
            next.model = turn.model.clone();
            next.reply = turn.reply.clone();
        }
        self.turn = Some(next);
        self.announce(Some(message))
    }

    /// A queued turn starts from its pending message, which the start consumes: the message
    /// leaves the pending list by `chat/pendingMessageRemoved`, then `chat/turnStarted` names it
    /// (`queuedMessageId`; a client whose reducer reads only one of them still drops it).
    fn activate(&mut self, turn_id: &TurnId, at: Timestamp) -> Result<(), ProjectionError> {
        self.resumable = None;
        let record = self.session.turn(turn_id);
        let origin = record.map(|t| t.origin).unwrap_or_default();
        let message = message::from_input(record.and_then(|t| t.input.as_ref()), origin);
        let mut turn = OpenTurn::new(turn_id.clone(), at, origin);
        let mut consumed = None;
        if let Some(i) = self.queued.iter().position(|q| q == turn_id) {
            self.queued.remove(i);
            consumed = Some(PendingMessageKind::Queued);
        }
        // A steering message whose turn ended before a safe point starts a turn of its own;
        // the turn's start takes it out of the chat when it is the one shown.
        if let Some(i) = self.steering.iter().position(|q| q == turn_id) {
            if i + 1 == self.steering.len() {
                consumed = Some(PendingMessageKind::Steering);
            }
            self.steering.remove(i);
        }
        if let Some(kind) = consumed {
            turn.queued_message_id = Some(turn_id.to_string());
            self.emit(StateAction::ChatPendingMessageRemoved(ChatPendingMessageRemovedAction {
                kind,
                id: turn_id.to_string(),
            }))?;
        }
        self.turn = Some(turn);
        self.announce(Some(message))
    }

    /// The conversation now reads through `at`: an edit or a regeneration wrote news off the
    /// head, or a client truncated the chat. The chat keeps the turns that ended on the new
    /// path (`chat/truncated`, through the last of them). A running turn that the truncation
    /// drops is shown again, from its start, as it goes on; a move within the running turn
    /// changes no turn (parts only grow).
    fn branched(&mut self, at: Option<&MessageId>) -> Result<(), ProjectionError> {
        let tree = self.session.tree();
        let kept = self.ends.iter().rposition(|(_, end)| match end {
            TurnEnd::At { head, .. } => tree.is_ancestor_or_self(head.as_ref(), at),
            // A fork's history ended in its source: its own path starts after it.
            TurnEnd::Copied => true,
        });
        let keeps_all = kept.map_or(0, |i| i + 1) == self.ends.len();
        if keeps_all && self.turn.is_some() {
            return Ok(());
        }
        let turn_id = kept.map(|i| self.ends[i].0.clone());
        if !keeps_all {
            self.resumable = None;
        }
        self.ends.truncate(kept.map_or(0, |i| i + 1));
        self.emit(StateAction::ChatTruncated(ChatTruncatedAction { turn_id }))?;
        match self.turn.as_mut().filter(|t| t.announced) {
            Some(turn) => {
                turn.forget_parts();
                self.announce_again()
            }
            None => Ok(()),
        }
    }

    /// Shows the open turn again (`chat/turnStarted`) after a truncation dropped it from the
    /// chat; its pending message left the chat when it first started.
    fn announce_again(&mut self) -> Result<(), ProjectionError> {
        let Some(turn) = self.turn.as_mut() else { return Ok(()) };
        turn.announced = false;
        turn.queued_message_id = None;
        let message = turn.message.take();
        self.announce(message)
    }

    /// A model call's attempt failed after it streamed: what it showed live is in no log, so
    /// a replayed chat never had it. The open turn is shown again without it (`chat/truncated`
    /// back to the completed turns, `chat/turnStarted`), then with its other parts and usage
    /// as they stand.
    fn withdraw(&mut self, call_id: &CallId, attempt: u32) -> Result<(), ProjectionError> {
        let (text, reasoning) = (parts::text_id(call_id, attempt), parts::reasoning_id(call_id, attempt));
        let Some(turn) = self.turn.as_ref().filter(|t| t.announced) else { return Ok(()) };
        let from = (call_id.clone(), attempt);
        let tools: BTreeSet<String> = turn
            .streamed_tools
            .iter()
            .filter(|(id, by)| {
                **by == from && matches!(turn.tools.get(*id), Some(ToolPart::Streaming { .. }))
            })
            .map(|(id, _)| id.to_string())
            .collect();
        if !turn.texts.contains_key(&text) && !turn.reasonings.contains_key(&reasoning) && tools.is_empty() {
            return Ok(());
        }
        let Some(active) = self.chat.active_turn.clone() else { return Ok(()) };
        let withdrawn = |part: &ResponsePart| match part {
            ResponsePart::Markdown(m) => m.id == text,
            ResponsePart::Reasoning(r) => r.id == reasoning,
            ResponsePart::ToolCall(call) => {
                matches!(&call.tool_call, ToolCallState::Streaming(s) if tools.contains(&s.tool_call_id))
            }
            _ => false,
        };
        let kept: Vec<ResponsePart> =
            active.response_parts.iter().filter(|p| !withdrawn(p)).cloned().collect();
        // What the open turn tracks of its parts stays, but for the withdrawn ones.
        let Some(turn) = self.turn.as_mut() else { return Ok(()) };
        turn.texts.remove(&text);
        turn.reasonings.remove(&reasoning);
        turn.tools.retain(|id, _| !tools.contains(id.as_str()));
        turn.streamed_tools.retain(|id, _| !tools.contains(id.as_str()));
        let shown = turn.shown.clone();
        let completed = self.chat.turns.last().map(|t| t.id.clone());
        self.emit(StateAction::ChatTruncated(ChatTruncatedAction { turn_id: completed }))?;
        self.announce_again()?;
        for part in kept {
            self.emit(StateAction::ChatResponsePart(ChatResponsePartAction {
                turn_id: shown.clone(),
                part,
                meta: None,
            }))?;
        }
        if let Some(usage) = active.usage {
            self.emit(StateAction::ChatUsage(ChatUsageAction { turn_id: shown, usage, meta: None }))?;
        }
        Ok(())
    }

    /// Sends `chat/turnStarted` for the open turn unless it went out; `message` is what started
    /// it, when the event knows.
    fn announce(&mut self, message: Option<AhpMessage>) -> Result<(), ProjectionError> {
        let Some(turn) = self.turn.as_mut() else { return Ok(()) };
        if turn.announced {
            return Ok(());
        }
        turn.announced = true;
        let message = message.unwrap_or_else(|| message::text(String::new(), turn.origin));
        turn.message = Some(message.clone());
        let action = StateAction::ChatTurnStarted(ChatTurnStartedAction {
            turn_id: turn.shown.clone(),
            started_at: turn.started_at.to_rfc3339(),
            message,
            queued_message_id: turn.queued_message_id.clone(),
            meta: None,
        });
        self.emit(action)
    }

    /// The open turn's id when `turn_id` names it (`None`: the open turn, whichever it is),
    /// announced: whatever happens in a turn shows only once it started.
    pub(crate) fn open(&mut self, turn_id: Option<&TurnId>) -> Result<Option<String>, ProjectionError> {
        let Some(turn) = &self.turn else { return Ok(None) };
        if turn_id.is_some_and(|t| *t != turn.id) {
            return Ok(None);
        }
        let id = turn.shown.clone();
        self.announce(None)?;
        Ok(Some(id))
    }

    pub(crate) fn open_turn(&mut self) -> Option<&mut OpenTurn> {
        self.turn.as_mut()
    }

    /// A turn's input, queued as its first trigger, is its message.
    fn trigger(&mut self, trigger: &PendingTrigger) -> Result<(), ProjectionError> {
        let Some(turn) = &self.turn else { return Ok(()) };
        if turn.announced || trigger.turn_id.as_ref() != Some(&turn.id) {
            return Ok(());
        }
        match message::from_source(&trigger.source, turn.origin) {
            Some(message) => self.announce(Some(message)),
            None => Ok(()),
        }
    }

    fn message(&mut self, message: &Message) -> Result<(), ProjectionError> {
        match message.role {
            // The user's message starts the turn (an engine-hosted step records it without
            // queueing its trigger). Later user messages of the same turn are not shown.
            Role::User => {
                let Some(turn) = self.turn.as_mut() else { return Ok(()) };
                turn.recorded = true;
                let text = message::text(message.content_text(), turn.origin);
                self.announce(Some(text))
            }
            Role::Assistant => self.assistant(message),
            Role::Tool => self.tool_message(message),
            // A system message shows nothing; a compaction marker shows with the
            // `context.compacted` that follows it.
            Role::System => Ok(()),
        }
    }

    /// The model's reply: its text ends the reply's markdown part (created now, or grown from
    /// what streamed), its tool calls become (or finish streaming as) tool call parts.
    fn assistant(&mut self, message: &Message) -> Result<(), ProjectionError> {
        let Some(turn_id) = self.open(None)? else { return Ok(()) };
        let reply = self.open_turn().and_then(|t| t.reply.take());
        let text = message.content_text();
        if !text.is_empty() {
            let id = match &reply {
                Some((call_id, attempt)) => parts::text_id(call_id, *attempt),
                None => message.id.to_string(),
            };
            self.finish_text(&turn_id, id, message.id.to_string(), text)?;
        }
        for call in message.tool_calls() {
            self.tool_requested(&turn_id, &call.id, &call.function.name, &call.function.arguments)?;
        }
        Ok(())
    }

    /// Ends markdown part `id` with exactly `text`: appends what the stream did not show, or
    /// creates the part. A recorded text that does not extend what streamed (a worker rewrote
    /// the reply) cannot replace it, as parts only grow: it gets a part of its own,
    /// `fallback_id`.
    fn finish_text(
        &mut self,
        turn_id: &str,
        id: String,
        fallback_id: String,
        text: String,
    ) -> Result<(), ProjectionError> {
        let shown = self.open_turn().and_then(|t| t.texts.get(&id).cloned());
        match shown {
            Some(shown) if text.starts_with(&shown) => {
                let rest = &text[shown.len()..];
                if rest.is_empty() {
                    return Ok(());
                }
                self.emit(crate::stream::text_delta(turn_id, &id, rest))?;
                if let Some(turn) = self.open_turn() {
                    turn.texts.insert(id, text);
                }
                Ok(())
            }
            Some(_) => self.text_part(turn_id, fallback_id, text),
            None => self.text_part(turn_id, id, text),
        }
    }

    /// `chat/responsePart` creating markdown part `id` with `text`.
    pub(crate) fn text_part(
        &mut self,
        turn_id: &str,
        id: String,
        text: String,
    ) -> Result<(), ProjectionError> {
        self.emit(StateAction::ChatResponsePart(ChatResponsePartAction {
            turn_id: turn_id.to_owned(),
            part: ResponsePart::Markdown(MarkdownResponsePart { id: id.clone(), content: text.clone() }),
            meta: None,
        }))?;
        if let Some(turn) = self.open_turn() {
            turn.texts.insert(id, text);
        }
        Ok(())
    }

    /// A tool call the model asked for, with its final `arguments`: its part starts (or shows
    /// the rest of what streamed) and waits, streaming, for the engine to make the call.
    fn tool_requested(
        &mut self,
        turn_id: &str,
        call_id: &CallId,
        name: &str,
        arguments: &str,
    ) -> Result<(), ProjectionError> {
        let part = self.open_turn().and_then(|t| t.tools.get(call_id).cloned());
        let shown = match part {
            None => {
                self.start_tool(turn_id, call_id, name)?;
                String::new()
            }
            Some(ToolPart::Streaming { partial }) => partial,
            Some(ToolPart::PendingConfirmation | ToolPart::Running | ToolPart::Closed) => return Ok(()),
        };
        // Arguments that do not extend what streamed cannot replace it; the final input is
        // the call's, set when it runs.
        if let Some(rest) = arguments.strip_prefix(shown.as_str()).filter(|r| !r.is_empty()) {
            self.stream_arguments(turn_id, call_id, rest)?;
        }
        Ok(())
    }

    /// `chat/toolCallStart` for `call_id`.
    pub(crate) fn start_tool(
        &mut self,
        turn_id: &str,
        call_id: &CallId,
        name: &str,
    ) -> Result<(), ProjectionError> {
        let contributor = self.contributor(name);
        self.emit(tool_call::start(turn_id, call_id, name, contributor))?;
        if let Some(turn) = self.open_turn() {
            turn.tools.insert(call_id.clone(), ToolPart::Streaming { partial: String::new() });
            turn.tool_names.insert(call_id.clone(), name.to_owned());
        }
        Ok(())
    }

    /// `chat/toolCallDelta` with `more` arguments of a streaming call.
    pub(crate) fn stream_arguments(
        &mut self,
        turn_id: &str,
        call_id: &CallId,
        more: &str,
    ) -> Result<(), ProjectionError> {
        self.emit(tool_call::arguments(turn_id, call_id, more))?;
        if let Some(ToolPart::Streaming { partial }) = self.open_turn().and_then(|t| t.tools.get_mut(call_id))
        {
            partial.push_str(more);
        }
        Ok(())
    }

    /// A client tool is run by the client that drove the turn when it offers a tool of that
    /// name (its own, or one the agent declares that it implements): AHP clients run only the
    /// calls they contributed. An agent's client tool no client offers has no contributor: a
    /// person is asked for its result instead ([`Projection::ask_person`]).
    fn contributor(&self, name: &str) -> Option<ToolCallContributor> {
        let turn_id = self.turn.as_ref().map(|t| &t.id);
        let declared = self.session.tool_declaration(name, turn_id)?;
        if declared.handler != Some(ToolHandler::Client) {
            return None;
        }
        let client_id = self.session.tool_client(name, turn_id)?.to_owned();
        Some(ToolCallContributor::Client(ToolCallClientContributor { client_id }))
    }

    /// A client tool's call that runs with no client to run it is asked of a person: an input
    /// request whose answer is its result (AHP's own way to put a question to whoever watches
    /// the chat; any HTTP client may still settle the call).
    fn ask_person(&mut self, call: &CallRecord) -> Result<(), ProjectionError> {
        let CallSpec::ToolCall { name, arguments, handler: ToolHandler::Client, .. } = &call.spec else {
            return Ok(());
        };
        if self.contributor(name).is_some() {
            return Ok(());
        }
        let turn = self.turn.as_ref().map(|t| &t.id);
        let description = self.session.tool_declaration(name, turn).and_then(|t| t.description);
        self.emit(input::tool_requested(&call.id, name, description.as_deref(), arguments))?;
        if let Some(turn) = self.open_turn() {
            turn.asked.insert(call.id.clone());
        }
        Ok(())
    }

    /// The input request `ask_person` showed for `call_id`, completed as the call settled
    /// (`None`: cancelled).
    fn answered_for(
        &mut self,
        call_id: &CallId,
        outcome: Option<&CallOutcome>,
    ) -> Result<(), ProjectionError> {
        let asked = self.open_turn().is_some_and(|t| t.asked.remove(call_id));
        if asked { self.emit(input::tool_completed(call_id, outcome)) } else { Ok(()) }
    }

    /// A tool message answers a tool call. A call the engine made shows its settle instead;
    /// one it never made (a worker answered the model's request itself) completes here.
    fn tool_message(&mut self, message: &Message) -> Result<(), ProjectionError> {
        let Some(call_id) = &message.tool_call_id else { return Ok(()) };
        let part = self.turn.as_ref().and_then(|t| t.tools.get(call_id));
        if !matches!(part, Some(ToolPart::Streaming { .. })) || self.session.call_id_used(call_id) {
            return Ok(());
        }
        let Some(turn_id) = self.open(None)? else { return Ok(()) };
        let name = message.name.clone().unwrap_or_default();
        self.emit(tool_call::ready(
            &turn_id,
            call_id,
            &name,
            None,
            Some(ToolCallConfirmationReason::NotNeeded),
        ))?;
        self.emit(tool_call::answered(&turn_id, call_id, &name, message.content_text()))?;
        self.close_tool(call_id);
        Ok(())
    }

    fn close_tool(&mut self, call_id: &CallId) {
        if let Some(turn) = self.open_turn() {
            turn.tools.insert(call_id.clone(), ToolPart::Closed);
        }
    }

    /// A tool or sub-agent call of the open turn runs.
    fn call_created(&mut self, call: &CallRecord) -> Result<(), ProjectionError> {
        if let CallSpec::SubAgent { session_id, .. } = &call.spec
            && !self.children.contains(session_id)
        {
            self.children.push(session_id.clone());
        }
        let Some(name) = tool_call::name(&call.spec).map(str::to_owned) else { return Ok(()) };
        let Some(turn_id) = self.open(call.turn_id.as_ref())? else { return Ok(()) };
        let arguments = match &call.spec {
            CallSpec::ToolCall { arguments, .. } => Some(arguments.as_str()),
            CallSpec::SubAgent { .. } | CallSpec::LlmCall { .. } => None,
        };
        self.tool_requested(&turn_id, &call.id, &name, arguments.unwrap_or_default())?;
        let confirmation = tool_call::confirmation(call);
        let runs = confirmation.is_some();
        let part = if runs { ToolPart::Running } else { ToolPart::PendingConfirmation };
        self.emit(tool_call::ready(&turn_id, &call.id, &name, arguments, confirmation))?;
        if let Some(action) = tool_call::show_child(&turn_id, &call.id, &call.spec) {
            self.emit(action)?;
        }
        if let Some(turn) = self.open_turn() {
            turn.tools.insert(call.id.clone(), part);
        }
        if runs {
            self.ask_person(call)?;
        }
        Ok(())
    }

    /// A person approved a call waiting for approval: it runs.
    fn call_approved(&mut self, call_id: &CallId) -> Result<(), ProjectionError> {
        if self.part(call_id) != Some(&ToolPart::PendingConfirmation) {
            return Ok(());
        }
        let Some(turn_id) = self.open(None)? else { return Ok(()) };
        self.emit(tool_call::confirmed(&turn_id, call_id, Ok(ToolCallConfirmationReason::UserAction)))?;
        if let Some(turn) = self.open_turn() {
            turn.tools.insert(call_id.clone(), ToolPart::Running);
        }
        match self.session.call(call_id).cloned() {
            Some(call) => self.ask_person(&call),
            None => Ok(()),
        }
    }

    /// Where `call_id`'s part is, in the open turn.
    fn part(&self, call_id: &CallId) -> Option<&ToolPart> {
        self.turn.as_ref().and_then(|t| t.tools.get(call_id))
    }

    fn call_settled(
        &mut self,
        call_id: &CallId,
        attempt: u32,
        outcome: &CallOutcome,
    ) -> Result<(), ProjectionError> {
        let Some(call) = self.session.call(call_id).cloned() else { return Ok(()) };
        if matches!(call.spec, CallSpec::LlmCall { .. }) {
            return self.model_settled(&call, attempt, outcome);
        }
        let waiting = match self.part(call_id) {
            Some(ToolPart::Running) => false,
            Some(ToolPart::PendingConfirmation) => true,
            _ => return Ok(()),
        };
        let Some(turn_id) = self.open(None)? else { return Ok(()) };
        if waiting {
            // Settled without running: denied (the call never ran, whoever declined it), or
            // answered by a worker or client that decided for itself.
            let verdict = match outcome {
                Ok(_) => Ok(ToolCallConfirmationReason::NotNeeded),
                Err(error) => Err((ToolCallCancellationReason::Denied, error.error.clone())),
            };
            let denied = verdict.is_err();
            self.emit(tool_call::confirmed(&turn_id, call_id, verdict))?;
            if denied {
                self.close_tool(call_id);
                return Ok(());
            }
        }
        self.answered_for(call_id, Some(outcome))?;
        self.emit(tool_call::complete(&turn_id, call_id, &call.spec, outcome))?;
        self.close_tool(call_id);
        Ok(())
    }

    /// A model call of the open turn answered: its usage joins the turn's, and its reply is the
    /// next assistant message.
    fn model_settled(
        &mut self,
        call: &CallRecord,
        attempt: u32,
        outcome: &CallOutcome,
    ) -> Result<(), ProjectionError> {
        let response = match outcome {
            Ok(CallValue::Llm(response)) => response,
            Err(_) => return self.withdraw(&call.id, attempt),
            Ok(_) => return Ok(()),
        };
        let Some(turn_id) = self.open(call.turn_id.as_ref())? else { return Ok(()) };
        let Some(turn) = self.open_turn() else { return Ok(()) };
        turn.usage.add(response.usage.as_ref(), response.cost.as_deref());
        turn.model = Some(response.model.clone());
        turn.reply = Some((call.id.clone(), attempt));
        let usage = usage::usage_info(&turn.usage, turn.model.as_deref());
        // The recorded reasoning ends the reasoning part exactly as the text's does its part:
        // what streamed, completed (or all of it, when nothing streamed).
        let shown = turn.reasonings.get(&parts::reasoning_id(&call.id, attempt)).cloned().unwrap_or_default();
        self.emit(StateAction::ChatUsage(ChatUsageAction { turn_id: turn_id.clone(), usage, meta: None }))?;
        let rest = response.reasoning.as_deref().and_then(|r| r.strip_prefix(shown.as_str()));
        match rest.filter(|rest| !rest.is_empty()) {
            Some(rest) => self.reason(&turn_id, parts::reasoning_id(&call.id, attempt), rest),
            None => Ok(()),
        }
    }

    /// A voided call (or one still open when its turn ends) is cancelled with `reason`.
    fn cancel_call(&mut self, call_id: &CallId, reason: &str) -> Result<(), ProjectionError> {
        let waiting = match self.part(call_id) {
            Some(ToolPart::Streaming { .. } | ToolPart::Running) => false,
            Some(ToolPart::PendingConfirmation) => true,
            _ => return Ok(()),
        };
        let Some(turn_id) = self.open(None)? else { return Ok(()) };
        let name = self.tool_name(call_id);
        self.answered_for(call_id, None)?;
        for action in tool_call::cancel(&turn_id, call_id, &name, reason, waiting) {
            self.emit(action)?;
        }
        self.close_tool(call_id);
        Ok(())
    }

    /// The tool name of `call_id`'s part.
    fn tool_name(&self, call_id: &CallId) -> String {
        self.turn.as_ref().and_then(|t| t.tool_names.get(call_id)).cloned().unwrap_or_default()
    }

    fn interrupt_opened(&mut self, interrupt: &Interrupt) -> Result<(), ProjectionError> {
        if self.open(interrupt.turn_id.as_ref())?.is_none() {
            return Ok(());
        }
        self.emit(input::requested(interrupt))?;
        if let Some(turn) = self.open_turn() {
            turn.inputs.insert(interrupt.id.clone());
        }
        Ok(())
    }

    fn interrupt_resumed(
        &mut self,
        interrupt_id: &InterruptId,
        payload: Option<&serde_json::Value>,
    ) -> Result<(), ProjectionError> {
        let shown = self.open_turn().is_some_and(|t| t.inputs.remove(interrupt_id));
        if !shown {
            return Ok(());
        }
        self.emit(input::completed(interrupt_id, payload))
    }

    /// A turn ends: its open tool calls are cancelled first (AHP ignores actions for a turn
    /// that is no longer active), then `chat/turnComplete`, `chat/turnCancelled` or
    /// `chat/error`. A queued turn that ends before it starts leaves the queue.
    fn end(
        &mut self,
        turn_id: &TurnId,
        status: TurnStatus,
        error: Option<&str>,
        code: Option<&ErrorCode>,
        at: Timestamp,
    ) -> Result<(), ProjectionError> {
        if let Some(i) = self.queued.iter().position(|q| q == turn_id) {
            self.queued.remove(i);
            return self.emit(StateAction::ChatPendingMessageRemoved(ChatPendingMessageRemovedAction {
                kind: PendingMessageKind::Queued,
                id: turn_id.to_string(),
            }));
        }
        if self.steering.contains(turn_id) {
            return self.steered(turn_id);
        }
        let Some(id) = self.open(Some(turn_id))? else { return Ok(()) };
        let open: Vec<CallId> = self
            .turn
            .as_ref()
            .map(|t| {
                t.tools
                    .iter()
                    .filter(|(_, part)| **part != ToolPart::Closed)
                    .map(|(call_id, _)| call_id.clone())
                    .collect()
            })
            .unwrap_or_default();
        for call_id in open {
            self.cancel_call(&call_id, TURN_ENDED)?;
        }
        let Some(turn) = self.turn.take() else { return Ok(()) };
        let head = self.session.tree().head().cloned();
        self.ends.push((id.clone(), TurnEnd::At { turn: turn.id.clone(), head }));
        let duration = at.0.saturating_sub(turn.started_at.0).max(0);
        let action = match status {
            TurnStatus::Completed => {
                StateAction::ChatTurnComplete(ChatTurnCompleteAction { turn_id: id, duration, meta: None })
            }
            TurnStatus::Cancelled => {
                StateAction::ChatTurnCancelled(ChatTurnCancelledAction { turn_id: id, duration, meta: None })
            }
            // `turn.ended` only ever ends a turn; a queued or active status here would be a
            // broken log, shown as the failure it is.
            TurnStatus::Failed | TurnStatus::Queued | TurnStatus::Active => {
                // What failed may go better another time (a provider's error, a worker that was
                // down); a spent budget or the model's refusal would only fail again.
                let resumable = status == TurnStatus::Failed
                    && !matches!(code, Some(ErrorCode::BudgetExceeded | ErrorCode::Refused));
                if resumable {
                    self.resumable = Some(Resumable {
                        shown: id.clone(),
                        message: turn
                            .message
                            .clone()
                            .unwrap_or_else(|| message::text(String::new(), turn.origin)),
                        recorded: turn.recorded,
                        resumes: turn.resumes,
                    });
                }
                StateAction::ChatError(ChatErrorAction {
                    turn_id: id,
                    duration,
                    part: ErrorResponsePart {
                        error: error_info(error, code),
                        resumable: resumable.then_some(true),
                    },
                    meta: None,
                })
            }
        };
        self.emit(action)
    }
}

/// Whether `event` may show in a chat: `false` for the engine's bookkeeping, which the
/// projection maps to no action whatever the chat holds (so a commit of nothing else has
/// nothing to push to a chat's subscribers).
pub fn shows_in_chat(event: &Event) -> bool {
    !matches!(
        event,
        Event::CallDispatched { .. }
            | Event::SessionTitled { .. }
            | Event::Forked { .. }
            | Event::TurnAliased { .. }
            | Event::TurnDone { .. }
            | Event::TriggerDropped { .. }
            | Event::DecisionOpened { .. }
            | Event::DecisionDispatched { .. }
            | Event::DecisionRetryScheduled { .. }
            | Event::DecisionResolved { .. }
            | Event::DecisionAccepted { .. }
            | Event::DecisionFailed { .. }
            | Event::DecisionVoided { .. }
            | Event::ActionIgnored { .. }
            | Event::StateWritten { .. }
            | Event::AgentWritten { .. }
            | Event::StateRestored { .. }
            | Event::AgentRestored { .. }
            | Event::CallRequeued { .. }
            | Event::CallReported { .. }
            | Event::InterruptClosed { .. }
            | Event::OutboxQueued { .. }
            | Event::OutboxDelivered { .. }
            | Event::OutboxWithdrawn { .. }
    )
}

/// The engine turn that resumes chat turn `shown` after `resumes` earlier resumes of it.
fn resume_turn_id(shown: &str, resumes: u32) -> String {
    format!("{shown}.resume{}", resumes + 1)
}

/// A failed turn's error: its code (`budget_exceeded`, ...) is the type.
fn error_info(error: Option<&str>, code: Option<&ErrorCode>) -> ErrorInfo {
    let error_type = code
        .and_then(|c| serde_json::to_value(c).ok())
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "turn_failed".to_owned());
    ErrorInfo { error_type, message: error.unwrap_or("the turn failed").to_owned(), stack: None, meta: None }
}

/// An action's wire type, e.g. `chat/delta`.
fn action_type(action: &StateAction) -> String {
    serde_json::to_value(action)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned))
        .unwrap_or_else(|| format!("{action:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_the_reducer_does_not_apply_is_an_error_naming_it() {
        let mut projection = ChatProjection::new("s");
        projection.projecting = "message.recorded";
        let error = projection.emit(crate::stream::text_delta("turn_x", "part", "text")).unwrap_err();
        assert_eq!(
            error,
            ProjectionError::NotApplied {
                action: "chat/delta".into(),
                outcome: "NoOp".into(),
                source_name: "message.recorded",
            }
        );
        assert!(projection.finish(Ok(())).unwrap().is_empty(), "nothing unapplied is handed out");
    }
}
