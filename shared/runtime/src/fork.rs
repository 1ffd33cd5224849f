//! Forks: a new session continuing another's conversation through one of its completed turns
//! (AHP's `createChat` with a fork source, and `POST /v1/sessions/{id}/forks`).
//!
//! The fork is a session of its own, of the same agent, owned by the caller: its history is a
//! copy of the source's active path as it was when the turn ended (`Command::Seed`), and its
//! init names the origin. The source's log records the fork (`session.forked`) for its catalog
//! of chats. Two commits on two sessions, in that order, each idempotent: a fork made again
//! with the same id and origin writes nothing, so a retry after a crash between them completes
//! it.

use serde::{Deserialize, Serialize};
use turnstone_engine::ids::{SessionId, TurnId};
use turnstone_engine::protocol::Message;
use turnstone_engine::session::{Command, Event, ForkOrigin, Rejection, Session, TurnStatus};

use crate::app::App;
use crate::auth::{Access, Caller};
use crate::error::{Error, Result};

/// Events read from the store at a time while the source is replayed.
const EVENTS_PER_READ: usize = 1000;

/// A fork that was made (or found made).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct Forked {
    /// The new session.
    pub session_id: SessionId,
    /// The session and turn its history runs through.
    pub forked_from: ForkOrigin,
}

/// The source's side of a fork: its path when the turn ended, and whether its log already
/// records this fork.
struct Source {
    agent_id: String,
    history: Vec<Message>,
    recorded: bool,
}

impl App {
    /// Forks `source` at its completed turn `turn_id` into a new session `fork_id` owned by
    /// `caller`, who must be able to drive the source; `true` when this call created it (`false`:
    /// that very fork existed already).
    pub async fn fork(
        &self,
        source_id: &str,
        turn_id: &TurnId,
        fork_id: &str,
        caller: &Caller,
    ) -> Result<(Forked, bool)> {
        let not_found = || Error::SessionNotFound(source_id.to_owned());
        let (current, _) = self.load(source_id).await?;
        if !current.is_created() || !caller.may(Access::Drive, &current) {
            return Err(not_found());
        }
        let turn_id = current.resolve_turn_id(turn_id).clone();
        let source = self.replay_through(source_id, &turn_id, fork_id).await?;
        let origin = ForkOrigin { session_id: source_id.into(), turn_id: turn_id.clone() };
        let owner = caller.owner().ok_or_else(not_found)?;
        self.list_mcp_tools(&source.agent_id).await;
        let mut init = self.session_init(&source.agent_id, owner)?;
        init.fork = Some(origin.clone());
        let history = source.history;
        let made = self
            .execute(fork_id, |fork: &Session| {
                if fork.is_created() {
                    // Made before (a retry): the same fork writes nothing; anything else is taken.
                    return match fork.init().and_then(|i| i.fork.as_ref()) {
                        Some(made) if *made == origin => Ok(Vec::new()),
                        _ => Err(Rejection::AlreadyExists(fork_id.into()).into()),
                    };
                }
                Ok(vec![
                    Command::Create { init: Box::new(init.clone()) },
                    Command::Seed { messages: history.clone() },
                ])
            })
            .await?;
        if !source.recorded {
            let forked = Command::Forked { into: fork_id.into(), turn_id: turn_id.clone() };
            self.command_as(source_id, caller, Access::Drive, forked).await?;
        }
        let created = !made.events.is_empty();
        Ok((Forked { session_id: fork_id.into(), forked_from: origin }, created))
    }

    /// Replays `source_id`'s log through the end of turn `turn_id`, which must have completed
    /// (AHP forks completed turns), and reads on to see whether fork `fork_id` is recorded.
    async fn replay_through(&self, source_id: &str, turn_id: &TurnId, fork_id: &str) -> Result<Source> {
        let mut session = Session::new(source_id);
        let mut history = None;
        let mut recorded = false;
        let mut after = 0;
        loop {
            let page = self.store().events_after(source_id, after, EVENTS_PER_READ).await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            for logged in &page {
                match &logged.event {
                    Event::Forked { session_id, .. } if session_id.as_str() == fork_id => recorded = true,
                    _ => {}
                }
                if history.is_some() {
                    continue;
                }
                session.apply(&logged.event);
                if let Event::TurnEnded { turn_id: ended, status, .. } = &logged.event
                    && ended == turn_id
                {
                    if *status != TurnStatus::Completed {
                        return Err(Rejection::invalid(
                            "turn_id",
                            format!("turn {turn_id:?} ended {status:?}: a fork starts from a completed turn"),
                        )
                        .into());
                    }
                    history = Some(session.tree().active_path().into_iter().cloned().collect());
                }
            }
        }
        let history = history
            .ok_or_else(|| Error::TurnNotFound { session_id: source_id.into(), turn_id: turn_id.clone() })?;
        Ok(Source { agent_id: session.agent_id().to_owned(), history, recorded })
    }
}
