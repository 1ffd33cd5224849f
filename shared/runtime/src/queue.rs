//! The queue ports: wake-ups for sessions, delivered at least once, possibly late.
//!
//! Two sides: [`Queue`] sends (every host: commits and runs schedule wake-ups), [`Consumer`]
//! receives and acknowledges (only a host that polls its queue: the local host; on Lambda an
//! SQS event source receives for the `dispatch` function, which never calls `receive`).

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// "Look at this session": a queue message carries no state, only the session and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeUp {
    pub session_id: String,
    /// Why (for logs): `input`, `timer`, `child`, `sweep`, ...
    pub reason: String,
    /// The log length of the commit this wake-up announces, when it was sent before that
    /// commit was written (so that no commit is ever left without its wake-up): a consumer
    /// that finds the session shorter waits for the commit to land.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Not a run of the session: an AHP client whose last connection ended may leave the
    /// session's active clients, unless it has connected since ([`Departed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub departed: Option<Departed>,
}

/// An AHP client that had no connection left at `at` (epoch milliseconds): behind API Gateway,
/// where no process outlives a connection to wait out `[limits] active_client_grace_secs`, the
/// queue carries that wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Departed {
    pub client_id: String,
    pub at: u64,
}

impl WakeUp {
    /// "Look at `session_id`", for `reason`.
    pub fn new(session_id: impl Into<String>, reason: impl Into<String>) -> Self {
        WakeUp { session_id: session_id.into(), reason: reason.into(), seq: None, departed: None }
    }

    /// One wake-up standing for `self` and `other` (a queue that keeps one per session): it
    /// waits for the later of their commits.
    pub fn merge(&mut self, other: &WakeUp) {
        self.seq = self.seq.max(other.seq);
    }

    /// The wake-up as a queue message's body: its JSON.
    pub fn to_body(&self) -> String {
        // Two strings: serializing cannot fail (the fallback is never taken).
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A queue message's body as a wake-up, or why it is not one.
    pub fn from_body(body: &str) -> Result<WakeUp, String> {
        let wake_up: WakeUp = serde_json::from_str(body).map_err(|e| format!("not a wake-up: {e}"))?;
        if wake_up.session_id.is_empty() {
            return Err("not a wake-up: session_id is empty".to_owned());
        }
        Ok(wake_up)
    }
}

/// A received wake-up, to acknowledge once handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The wake-up.
    pub wake_up: WakeUp,
    /// The backend's handle for acknowledging it.
    pub receipt: String,
}

/// Queue failures.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue is closed (the host is shutting down).
    #[error("queue closed")]
    Closed,
    /// The backend failed.
    #[error("queue backend failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The sending side: delivers wake-ups, each at least once, not before its delay.
#[async_trait]
pub trait Queue: Send + Sync + 'static {
    /// Enqueues a wake-up to be delivered after `delay` (backends may cap long delays; the
    /// dispatcher re-checks due times on arrival).
    async fn send(&self, wake_up: WakeUp, delay: Duration) -> Result<(), QueueError>;
}

/// The consuming side of a queue that a host polls.
#[async_trait]
pub trait Consumer: Send + Sync + 'static {
    /// Waits up to `wait` for wake-ups; returns at most `max`.
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, QueueError>;

    /// Acknowledges a handled delivery so it is not delivered again.
    async fn ack(&self, delivery: &Delivery) -> Result<(), QueueError>;

    /// Stops deliveries to this process: waiting and later `receive` calls return
    /// [`QueueError::Closed`]. Queued wake-ups are kept where the backend keeps them.
    async fn close(&self) {}

    /// How long a delivery stays this receiver's unless renewed ([`Consumer::renew`]), for a
    /// backend whose own redelivery is slow (SQS: the queue's visibility timeout); `None`: the
    /// backend redelivers a lost delivery by its own rules, and nothing is renewed.
    fn lease(&self) -> Option<Duration> {
        None
    }

    /// Takes `delivery` for another [`Consumer::lease`] from now, while its run goes on.
    async fn renew(&self, _delivery: &Delivery) -> Result<(), QueueError> {
        Ok(())
    }
}

/// A queue a host both sends to and polls (the local host's, and the conformance suite's).
pub trait PolledQueue: Queue + Consumer {}

impl<T: Queue + Consumer> PolledQueue for T {}
