//! Live notifications within one process: "session S committed up to seq N" and model token
//! deltas, for the SSE streams. The durable log is the truth; the hub only says when to look,
//! and carries deltas that are never persisted (a reconnecting client gets the final message
//! from the log instead).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::broadcast;
use turnstone_engine::ids::{CallId, TurnId};
use turnstone_engine::protocol::StreamDelta;

/// Capacity of each session's channel; a subscriber that lags re-reads the log.
const CAPACITY: usize = 1024;

/// The hub sweeps out channels nobody listens to once it holds this many, or twice as many as
/// after its last sweep.
const SWEEP_FLOOR: usize = 64;

/// Something that happened in a session, live.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Notice {
    /// Events up to `last_seq` are committed.
    Committed {
        last_seq: u64,
        /// The turns this commit ended (long-polls of other turns need not look).
        ended_turns: Vec<TurnId>,
    },
    /// A model produced more output for a call.
    Delta { call_id: CallId, delta: StreamDelta },
}

/// Per-session broadcast channels, created when someone listens.
#[derive(Debug, Clone, Default)]
pub struct Hub {
    channels: Arc<Mutex<Channels>>,
}

#[derive(Debug, Default)]
struct Channels {
    by_session: HashMap<String, broadcast::Sender<Notice>>,
    /// How many channels were left after the last sweep.
    after_sweep: usize,
}

impl Hub {
    /// Listens to a session.
    pub fn subscribe(&self, session_id: &str) -> broadcast::Receiver<Notice> {
        let mut channels = self.lock();
        // A channel whose listeners all left is dropped when its session next publishes; one
        // that never publishes again would keep its buffer (~150 KB) for good. So drop them all
        // whenever the map has doubled since the last sweep: amortized O(1) per subscribe, and
        // at most about twice as many channels as there are sessions with listeners.
        if channels.by_session.len() >= SWEEP_FLOOR.max(2 * channels.after_sweep) {
            channels.by_session.retain(|_, sender| sender.receiver_count() > 0);
            channels.after_sweep = channels.by_session.len();
        }
        channels
            .by_session
            .entry(session_id.to_owned())
            .or_insert_with(|| broadcast::channel(CAPACITY).0)
            .subscribe()
    }

    /// Tells a session's listeners, if any; forgets channels nobody listens to any more.
    pub fn publish(&self, session_id: &str, notice: Notice) {
        let mut channels = self.lock();
        if let Some(sender) = channels.by_session.get(session_id) {
            if sender.receiver_count() == 0 {
                channels.by_session.remove(session_id);
            } else {
                let _ = sender.send(notice);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Channels> {
        // A poisoned map is still a valid map: the hub holds no invariant a panic could break.
        self.channels.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_nobody_listens_to_are_swept() {
        let hub = Hub::default();
        // Listeners come and go on many sessions that never publish again.
        for i in 0..1000 {
            drop(hub.subscribe(&format!("s{i}")));
        }
        assert!(hub.lock().by_session.len() <= SWEEP_FLOOR);
        // Live listeners keep their channels, and they still get notices.
        let mut live: Vec<_> = (0..100).map(|i| hub.subscribe(&format!("live{i}"))).collect();
        for i in 0..1000 {
            drop(hub.subscribe(&format!("t{i}")));
        }
        assert!(hub.lock().by_session.len() <= 2 * 100 + SWEEP_FLOOR);
        hub.publish("live7", Notice::Committed { last_seq: 3, ended_turns: Vec::new() });
        assert_eq!(live[7].try_recv().ok(), Some(Notice::Committed { last_seq: 3, ended_turns: Vec::new() }));
    }
}
