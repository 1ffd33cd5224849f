//! The notifier port: live notices that say when to look at the durable log ("session S
//! committed up to seq N, ending these turns"), and model token deltas that are never
//! persisted (a reconnecting client gets the final message from the log instead). Long-polls
//! (`?wait=`) and event streams wait on it; the log stays the truth.
//!
//! Two implementations: [`Hub`], within one process (the local host, where the API and the
//! dispatcher share it), and [`FollowStore`], which follows the store (where the API and the
//! dispatcher are different processes, as Lambda functions are). Deltas only reach listeners
//! in the process that runs the model call.

mod follow;
mod hub;

use std::collections::VecDeque;

use async_trait::async_trait;
use tokio::sync::{broadcast, watch};
use turnstone_engine::ids::{CallId, SessionId, TurnId};
use turnstone_engine::protocol::StreamDelta;

use crate::error::Result;

pub use follow::FollowStore;
pub use hub::Hub;

/// How many recently ended turns a session's progress names; a long-poll that missed more
/// than that reloads its turn.
const RECENT_ENDED: usize = 32;

/// Publishes and follows a session's commits and deltas.
#[async_trait]
pub trait Notifier: Send + Sync + 'static {
    /// Tells the session's listeners that events up to `last_seq` are committed and
    /// `ended_turns` ended (called after every commit of this process); `shows_in_chat`: some
    /// event of the commit may show in the session's AHP chat (else a chat has nothing new).
    fn committed(&self, session_id: &str, last_seq: u64, ended_turns: &[TurnId], shows_in_chat: bool);

    /// Passes a model's live output on to the session's streams, if any.
    fn delta(&self, session_id: &str, call_id: &CallId, delta: StreamDelta);

    /// Follows a session's commits from now on. The value starts at "nothing seen": read the
    /// log after this returns, then wait for `changed()`, so nothing committed in between is
    /// missed.
    async fn progress(&self, session_id: &str) -> Result<watch::Receiver<Progress>>;

    /// Follows a session's live deltas (for an event stream), besides its commits.
    fn deltas(&self, session_id: &str) -> broadcast::Receiver<Delta>;

    /// Waits until what this process's commits set in motion is done (pushes to AHP
    /// subscribers on AWS): a Lambda function calls it before its invocation ends, since the
    /// process may be frozen after it. Nothing to wait for by default.
    async fn flush(&self) {}

    /// Announces a change of the catalog of sessions (AHP's root channel) to whoever listens
    /// outside this process (recorded AHP connections on AWS). Nothing by default.
    fn root(&self, _notice: RootNotice) {}

    /// Whether [`Notifier::root`] does anything: when not, and nobody in this process follows
    /// the catalog, a commit builds no notice at all.
    fn hears_root(&self) -> bool {
        false
    }
}

/// A change of the catalog of sessions, as AHP's root channel notifies it.
#[derive(Debug, Clone, PartialEq)]
pub enum RootNotice {
    /// `root/sessionAdded`: the session's creation is committed.
    SessionAdded(SessionId),
    /// `root/sessionSummaryChanged`: a commit changed what the session's summary shows (its
    /// status, its title, its `modifiedAt`), or created a sub-agent's session (news in its
    /// parent's catalog of chats).
    SummaryChanged(Box<crate::app::SessionChanged>),
    /// `root/sessionRemoved`: the session is disposed (it cannot be read any more: the notice
    /// names its owner, for the subscribers that may know).
    SessionRemoved(crate::app::Removed),
}

/// How far a session's log has been committed, and which turns ended lately.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Events up to here are committed.
    pub last_seq: u64,
    /// How many turn ends were published in all (the position after `recent_ended`).
    ended_total: u64,
    /// The latest turn ends, oldest first.
    recent_ended: VecDeque<TurnId>,
}

impl Progress {
    /// A mark to pass to [`Progress::ended_since`] later.
    pub fn mark(&self) -> u64 {
        self.ended_total
    }

    /// Whether `turn` may have ended since `mark`: it did, or too many turns ended to tell.
    pub fn ended_since(&self, mark: u64, turn: &TurnId) -> bool {
        let new = self.ended_total.saturating_sub(mark);
        new > self.recent_ended.len() as u64
            || self.recent_ended.iter().rev().take(new as usize).any(|t| t == turn)
    }

    /// Records a commit up to `last_seq` that ended `ended_turns`.
    fn advance(&mut self, last_seq: u64, ended_turns: &[TurnId]) {
        self.last_seq = self.last_seq.max(last_seq);
        for turn in ended_turns {
            if self.recent_ended.len() == RECENT_ENDED {
                self.recent_ended.pop_front();
            }
            self.recent_ended.push_back(turn.clone());
            self.ended_total += 1;
        }
    }
}

/// A model's output for a running call, live.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    pub call_id: CallId,
    pub delta: StreamDelta,
}
