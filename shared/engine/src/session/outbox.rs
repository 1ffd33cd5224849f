//! The outbox: work a session leaves for other sessions (its children or its parent), and
//! [`route`], the one place that says what each item becomes in the receiving session. The
//! runtime's dispatcher and the engine's simulation both deliver through it.

use serde::{Deserialize, Serialize};

use super::Session;
use super::command::Command;
use super::records::{ParentLink, SessionInit, TurnOrigin};
use crate::ids::{CallId, SessionId, TurnId};
use crate::protocol::{ClientInput, ClientMessageInput, DraftMessage, WorkerIdentity};

/// Work for another session, delivered by the runtime at least once and acknowledged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutboxItem {
    /// Create the child session of a delegation.
    SpawnChild {
        /// The child.
        session_id: SessionId,
        /// The child's agent.
        agent_id: String,
        /// The parent's tool call it answers.
        tool_call_id: CallId,
        /// The child's ancestry (parents, nearest last; the sender is last).
        ancestry: Vec<SessionId>,
        /// The owner, inherited.
        identity: WorkerIdentity,
    },
    /// Write a message into another session, starting a turn there.
    SendMessage {
        /// The receiving session.
        session_id: SessionId,
        message: DraftMessage,
        /// The turn's idempotency id, `<decision id>.<action index>`, so redelivery is a no-op.
        turn_id: TurnId,
    },
    /// Cancel a child whose delegation was voided (it cancels its own children in turn).
    CancelChild {
        /// The child.
        session_id: SessionId,
        reason: String,
    },
    /// Tell the parent that this child's turn ended.
    NotifyParent {
        /// The parent.
        session_id: SessionId,
        /// The parent's tool call.
        tool_call_id: CallId,
        /// The sender.
        child_session_id: SessionId,
        /// The sender's agent.
        agent_id: String,
        ok: bool,
        /// The final output (`done`'s data as text, else the last assistant message), when ok.
        result: Option<String>,
        /// When not ok.
        error: Option<String>,
        /// When not ok: whether the failure was transient, so a delegation with retries left
        /// may send the task again (see [`Command::SubAgentFinished`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        retryable: bool,
        /// The sender's turn that ended (the parent fences its delegation's attempts by it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_id: Option<TurnId>,
    },
}

impl OutboxItem {
    /// The session the item is for.
    pub fn target(&self) -> &SessionId {
        match self {
            OutboxItem::SpawnChild { session_id, .. }
            | OutboxItem::SendMessage { session_id, .. }
            | OutboxItem::CancelChild { session_id, .. }
            | OutboxItem::NotifyParent { session_id, .. } => session_id,
        }
    }
}

/// What an outbox item becomes in the session it is for. Two kinds need a fact about the
/// target that only the deliverer has (the config of the child's agent, the receiving
/// session's agent): they come back as [`Spawn`] and [`Send`], which finish the command.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// Create the child session: [`Spawn::command`] with the init its agent's config gives.
    Spawn(Spawn),
    /// Start a turn in a child: [`Send::command`] with the child's agent id.
    Send(Send),
    /// Handle `command` in session `target` (a cancel, or a parent told its child finished).
    Deliver { target: SessionId, command: Command },
}

/// A child session to create for a delegation.
#[derive(Debug, Clone, PartialEq)]
pub struct Spawn {
    /// The child.
    pub session_id: SessionId,
    /// The child's agent.
    pub agent_id: String,
    /// The sender and the tool call the delegation answers.
    pub parent: ParentLink,
    /// The child's ancestry (nearest last: the sender).
    pub ancestry: Vec<SessionId>,
    /// The owner, inherited from the sender.
    pub identity: WorkerIdentity,
}

impl Spawn {
    /// `Create` for the child, from `base`, the init any new session of the child's agent
    /// gets: its parent, ancestry and identity are the delegation's.
    pub fn command(&self, mut base: SessionInit) -> Command {
        base.parent = Some(self.parent.clone());
        base.ancestry = self.ancestry.clone();
        base.identity = self.identity.clone();
        Command::Create { init: Box::new(base) }
    }

    /// Whether `existing`, a session that already has the child's id, is this delegation's
    /// child (a redelivered spawn: nothing to do). `Err` is what the parent is told: only that
    /// the id is not available, never whose it is; report it with [`Spawn::failed`] and do not
    /// touch `existing`.
    pub fn check_existing(&self, existing: &Session) -> Result<(), String> {
        let ours = existing.parent() == Some(&self.parent) && existing.agent_id() == self.agent_id;
        if ours {
            return Ok(());
        }
        // Nothing of the other session (whose it is, its agent, its parent): it may be
        // another tenant's.
        Err(format!(
            "cannot spawn sub-agent session {:?}: the session id is not available; use another",
            self.session_id
        ))
    }

    /// What the parent handles when the child cannot be created: see [`child_failed`].
    pub fn failed(&self, error: String) -> (SessionId, Command) {
        (self.parent.session_id.clone(), child_failed(&self.parent, &self.session_id, error))
    }
}

/// A message for a child session, starting a turn there.
#[derive(Debug, Clone, PartialEq)]
pub struct Send {
    /// The receiving session.
    pub session_id: SessionId,
    /// The sender (the child's parent).
    pub from: SessionId,
    pub message: DraftMessage,
    /// `<decision id>.<action index>`, so a redelivery is a no-op.
    pub turn_id: TurnId,
}

impl Send {
    /// Whether `target` is a child of the sender, so the message may start a turn there.
    /// `Err` says why not: drop the message (the sender's delegation settles through the
    /// spawn's failure) and never submit it to a session that is not the sender's child.
    pub fn check_target(&self, target: &Session) -> Result<(), String> {
        match target.parent() {
            Some(link) if link.session_id == self.from => Ok(()),
            _ => Err(format!(
                "session {:?} is not a child of session {:?}: the message is not delivered",
                self.session_id, self.from
            )),
        }
    }

    /// The `Submit` the child handles, `agent_id` being the child's agent: queued behind its
    /// active turn, with origin [`TurnOrigin::Parent`] (so the child reports back when the
    /// turn ends).
    pub fn command(self, agent_id: impl Into<String>) -> Command {
        Command::Submit {
            input: ClientInput::Message(ClientMessageInput {
                agent_id: agent_id.into(),
                turn_id: Some(self.turn_id),
                message: self.message,
                stream: None,
                client: None,
            }),
            queue: true,
            origin: TurnOrigin::Parent,
        }
    }
}

/// Where the outbox item `item` of session `from` goes, and what it becomes there.
pub fn route(from: &SessionId, item: OutboxItem) -> Route {
    match item {
        OutboxItem::SpawnChild { session_id, agent_id, tool_call_id, ancestry, identity } => {
            let parent = ParentLink { session_id: from.clone(), tool_call_id };
            Route::Spawn(Spawn { session_id, agent_id, parent, ancestry, identity })
        }
        OutboxItem::SendMessage { session_id, message, turn_id } => {
            Route::Send(Send { session_id, from: from.clone(), message, turn_id })
        }
        OutboxItem::CancelChild { session_id, reason } => {
            Route::Deliver { target: session_id, command: Command::Cancel { reason } }
        }
        OutboxItem::NotifyParent {
            session_id,
            tool_call_id,
            child_session_id,
            ok,
            result,
            error,
            retryable,
            turn_id,
            ..
        } => {
            let command = Command::SubAgentFinished {
                tool_call_id,
                session_id: child_session_id,
                ok,
                result,
                error,
                retryable,
                turn_id,
            };
            Route::Deliver { target: session_id, command }
        }
    }
}

/// The command that tells the parent in `link` that its delegation to `child` failed before
/// the child could report (it could not be created, or a message could not be delivered):
/// the delegation settles with `error`. Handle it in `link.session_id`.
pub fn child_failed(link: &ParentLink, child: &SessionId, error: String) -> Command {
    Command::SubAgentFinished {
        tool_call_id: link.tool_call_id.clone(),
        session_id: child.clone(),
        ok: false,
        result: None,
        error: Some(error),
        retryable: false,
        turn_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawn_links_the_child_to_its_parent() {
        let item = OutboxItem::SpawnChild {
            session_id: "child".into(),
            agent_id: "helper".into(),
            tool_call_id: "tc1".into(),
            ancestry: vec!["root".into(), "parent".into()],
            identity: WorkerIdentity { id: Some("owner".into()), metadata: None },
        };
        let Route::Spawn(spawn) = route(&"parent".into(), item) else { unreachable!("a spawn") };
        assert_eq!(spawn.session_id, "child");
        let base = SessionInit {
            agent_id: "helper".into(),
            identity: WorkerIdentity::default(),
            declared: None,
            has_worker: false,
            parent: None,
            ancestry: Vec::new(),
            defaults: Default::default(),
            budget: Default::default(),
            fork: None,
        };
        let Command::Create { init } = spawn.command(base) else { unreachable!("a create") };
        let link = init.parent.clone();
        assert_eq!(link, Some(ParentLink { session_id: "parent".into(), tool_call_id: "tc1".into() }));
        assert_eq!(init.ancestry, ["root", "parent"]);
        assert_eq!(init.identity.id.as_deref(), Some("owner"));
        let (target, failed) = spawn.failed("no such agent".into());
        assert_eq!(target, "parent");
        assert!(
            matches!(failed, Command::SubAgentFinished { ok: false, session_id, .. } if session_id == "child")
        );
    }
}
