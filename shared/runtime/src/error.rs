//! The runtime's errors: what went wrong carrying out a request or an effect.

use turnstone_engine::ids::{SessionId, TurnId};
use turnstone_engine::protocol::ProtocolError;
use turnstone_engine::session::Rejection;

use crate::queue::QueueError;
use crate::store::StoreError;

/// A failure of a runtime operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The engine refused the command (it wrote nothing).
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// No such session.
    #[error("session {0:?} does not exist")]
    SessionNotFound(String),
    /// The session was disposed: its id is not used again.
    #[error("session {0:?} was disposed; its id cannot be used again")]
    SessionDisposed(String),
    /// No such turn in the session.
    #[error("session {session_id:?} has no turn {turn_id:?}")]
    TurnNotFound { session_id: SessionId, turn_id: TurnId },
    /// The input names an agent the configuration does not define.
    #[error("unknown agent {0:?}")]
    UnknownAgent(String),
    /// A request that is not a valid message of its type.
    #[error(transparent)]
    Invalid(#[from] ProtocolError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The queue failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The caller owns as many sessions as `[limits] sessions_per_owner` allows.
    #[error("this owner has {limit} sessions, the most allowed (limits.sessions_per_owner)")]
    TooManySessions { limit: usize },
    /// The caller may reach the session but not settle this call: a client's calls are the
    /// client's to answer, a worker's calls its machine keys'.
    #[error("call {call_id:?} is {whose}; this caller may not settle it")]
    SettleForbidden { call_id: String, whose: &'static str },
    /// Concurrent writers kept winning; the operation gave up.
    #[error("session {0:?} is too busy: gave up after repeated concurrent updates")]
    Contended(String),
}

impl Error {
    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Store(e) => e.is_retryable(),
            Error::Queue(_) | Error::Contended(_) => true,
            _ => false,
        }
    }
}

/// The runtime's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
