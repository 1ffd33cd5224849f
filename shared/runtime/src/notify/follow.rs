//! A notifier that follows the store: for hosts whose API and dispatcher run in different
//! processes (Lambda), where nobody publishes a commit to the process that waits for it.
//!
//! One poller per followed session and process reads the log's new events, with a backoff
//! that restarts whenever something arrived, and publishes them to an in-process [`Hub`] that
//! fans out to every local listener. The poller ends when its session's last listener leaves.
//! This process's own commits are published at once, as the hub does.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{broadcast, watch};
use turnstone_engine::ids::{CallId, TurnId};
use turnstone_engine::protocol::StreamDelta;
use turnstone_engine::session::Event;

use super::{Delta, Hub, Notifier, Progress};
use crate::error::Result;
use crate::store::Store;

/// The first and the longest pause between two reads of a followed session's log.
const FIRST_POLL: Duration = Duration::from_millis(50);
const LONGEST_POLL: Duration = Duration::from_secs(1);
/// Events read per poll.
const PAGE: usize = 256;

/// Follows sessions by polling the store's log.
#[derive(Clone)]
pub struct FollowStore {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    hub: Hub,
    /// Sessions with a poller running. A poller leaves only under this lock and after checking
    /// that nobody follows, and a listener joins under it: no listener is left without one.
    polled: Mutex<HashSet<String>>,
}

impl FollowStore {
    /// Follows sessions in `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        FollowStore { inner: Arc::new(Inner { store, hub: Hub::default(), polled: Mutex::default() }) }
    }
}

impl Inner {
    fn polled(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // A poisoned set is still a valid set: it only names running pollers.
        self.polled.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the log after `after` until nobody follows the session any more.
    async fn poll(self: Arc<Self>, session_id: String, mut after: u64) {
        let mut pause = FIRST_POLL;
        loop {
            tokio::time::sleep(pause).await;
            {
                let mut polled = self.polled();
                if !self.hub.is_followed(&session_id) {
                    polled.remove(&session_id);
                    return;
                }
            }
            match self.store.events_after(&session_id, after, PAGE).await {
                Ok(events) if !events.is_empty() => {
                    let ended: Vec<TurnId> = events
                        .iter()
                        .filter_map(|e| match &e.event {
                            Event::TurnEnded { turn_id, .. } => Some(turn_id.clone()),
                            _ => None,
                        })
                        .collect();
                    after = events.last().map_or(after, |e| e.seq);
                    self.hub.publish(&session_id, after, &ended);
                    pause = FIRST_POLL;
                    continue;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(session_id, error = %e, "following the session's log failed"),
            }
            pause = (pause * 2).min(LONGEST_POLL);
        }
    }
}

#[async_trait]
impl Notifier for FollowStore {
    fn committed(&self, session_id: &str, last_seq: u64, ended_turns: &[TurnId], _shows_in_chat: bool) {
        self.inner.hub.publish(session_id, last_seq, ended_turns);
    }

    fn delta(&self, session_id: &str, call_id: &CallId, delta: StreamDelta) {
        self.inner.hub.publish_delta(session_id, call_id, delta);
    }

    async fn progress(&self, session_id: &str) -> Result<watch::Receiver<Progress>> {
        {
            let polled = self.inner.polled();
            if polled.contains(session_id) {
                return Ok(self.inner.hub.subscribe(session_id));
            }
        }
        // Where the log ends now, read before the caller reads it: a commit after this point
        // reaches the poller, one before it is in what the caller reads.
        let end = match self.inner.store.load_since(session_id, u64::MAX).await? {
            Some((loaded, _)) => loaded.session.events_applied(),
            None => 0,
        };
        let mut polled = self.inner.polled();
        let receiver = self.inner.hub.subscribe(session_id);
        if polled.insert(session_id.to_owned()) {
            tokio::spawn(Arc::clone(&self.inner).poll(session_id.to_owned(), end));
        }
        Ok(receiver)
    }

    fn deltas(&self, session_id: &str) -> broadcast::Receiver<Delta> {
        self.inner.hub.subscribe_deltas(session_id)
    }
}
