//! Live notifications within one process: "session S committed up to seq N" and model token
//! deltas, for the SSE streams. The durable log is the truth; the hub only says when to look,
//! and carries deltas that are never persisted (a reconnecting client gets the final message
//! from the log instead).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::broadcast;
use turnstone_engine::protocol::StreamDelta;

/// Capacity of each session's channel; a subscriber that lags re-reads the log.
const CAPACITY: usize = 1024;

/// Something that happened in a session, live.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Notice {
    /// Events up to `last_seq` are committed.
    Committed {
        /// The newest sequence number.
        last_seq: u64,
    },
    /// A model produced more output for a call.
    Delta {
        /// The LLM call.
        call_id: String,
        /// The output.
        delta: StreamDelta,
    },
}

/// Per-session broadcast channels, created when someone listens.
#[derive(Debug, Clone, Default)]
pub struct Hub {
    channels: Arc<Mutex<HashMap<String, broadcast::Sender<Notice>>>>,
}

impl Hub {
    /// Listens to a session.
    pub fn subscribe(&self, session_id: &str) -> broadcast::Receiver<Notice> {
        let mut channels = self.lock();
        channels.entry(session_id.to_owned()).or_insert_with(|| broadcast::channel(CAPACITY).0).subscribe()
    }

    /// Tells a session's listeners, if any; forgets channels nobody listens to any more.
    pub fn publish(&self, session_id: &str, notice: Notice) {
        let mut channels = self.lock();
        if let Some(sender) = channels.get(session_id) {
            if sender.receiver_count() == 0 {
                channels.remove(session_id);
            } else {
                let _ = sender.send(notice);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<Notice>>> {
        // A poisoned map is still a valid map: the hub holds no invariant a panic could break.
        self.channels.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
