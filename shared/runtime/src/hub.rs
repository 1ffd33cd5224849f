//! Live notifications within one process: "session S committed up to seq N (and ended these
//! turns)" and model token deltas, for long-polls and the SSE streams. The durable log is the
//! truth; the hub only says when to look, and carries deltas that are never persisted (a
//! reconnecting client gets the final message from the log instead).
//!
//! Waiting clients must be cheap, a thousand of them included: commits go through a `watch`
//! channel per session (one small value, whatever the number of listeners: a long-poll or a
//! stream only needs the latest progress), and deltas through a small broadcast channel that
//! exists only while someone streams the session.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, watch};
use turnstone_engine::ids::{CallId, TurnId};
use turnstone_engine::protocol::StreamDelta;

/// Deltas buffered per streamed session; a stream that lags skips them (they are a preview).
const DELTA_CAPACITY: usize = 32;

/// How many recently ended turns a session's progress names; a long-poll that missed more
/// than that reloads its turn.
const RECENT_ENDED: usize = 32;

/// The hub sweeps out channels nobody listens to once it holds this many, or twice as many as
/// after its last sweep.
const SWEEP_FLOOR: usize = 64;

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
}

/// A model's output for a running call, live.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    pub call_id: CallId,
    pub delta: StreamDelta,
}

/// Per-session channels, created when someone listens.
#[derive(Debug, Clone, Default)]
pub struct Hub {
    channels: Arc<Mutex<Channels>>,
}

#[derive(Debug, Default)]
struct Channels {
    by_session: HashMap<String, SessionChannels>,
    /// How many sessions had channels after the last sweep.
    after_sweep: usize,
}

#[derive(Debug)]
struct SessionChannels {
    progress: watch::Sender<Progress>,
    /// Only while someone streams the session.
    deltas: Option<broadcast::Sender<Delta>>,
}

impl SessionChannels {
    fn new() -> Self {
        SessionChannels { progress: watch::channel(Progress::default()).0, deltas: None }
    }

    fn listened(&self) -> bool {
        self.progress.receiver_count() > 0 || self.deltas.as_ref().is_some_and(|d| d.receiver_count() > 0)
    }
}

impl Hub {
    /// Follows a session's commits. The value starts at "nothing seen": read the log first,
    /// then wait for `changed()`.
    pub fn progress(&self, session_id: &str) -> watch::Receiver<Progress> {
        self.with_session(session_id, |channels| channels.progress.subscribe())
    }

    /// Follows a session's live deltas (for an event stream), besides its commits.
    pub fn deltas(&self, session_id: &str) -> broadcast::Receiver<Delta> {
        self.with_session(session_id, |channels| {
            channels.deltas.get_or_insert_with(|| broadcast::channel(DELTA_CAPACITY).0).subscribe()
        })
    }

    /// Tells a session's listeners, if any, that events up to `last_seq` are committed and
    /// `ended_turns` ended.
    pub fn committed(&self, session_id: &str, last_seq: u64, ended_turns: &[TurnId]) {
        let mut channels = self.lock();
        let Some(session) = channels.by_session.get(session_id) else { return };
        if !session.listened() {
            channels.by_session.remove(session_id);
            return;
        }
        session.progress.send_modify(|p| {
            p.last_seq = p.last_seq.max(last_seq);
            for turn in ended_turns {
                if p.recent_ended.len() == RECENT_ENDED {
                    p.recent_ended.pop_front();
                }
                p.recent_ended.push_back(turn.clone());
                p.ended_total += 1;
            }
        });
    }

    /// Passes a model's delta to a session's streams, if any.
    pub fn delta(&self, session_id: &str, call_id: &CallId, delta: StreamDelta) {
        let channels = self.lock();
        if let Some(sender) = channels.by_session.get(session_id).and_then(|s| s.deltas.as_ref())
            && sender.receiver_count() > 0
        {
            let _ = sender.send(Delta { call_id: call_id.clone(), delta });
        }
    }

    fn with_session<T>(&self, session_id: &str, f: impl FnOnce(&mut SessionChannels) -> T) -> T {
        let mut channels = self.lock();
        // Channels whose listeners all left are dropped when their session next publishes; one
        // that never publishes again would stay for good. So drop them all whenever the map has
        // doubled since the last sweep: amortized O(1) per subscribe, and at most about twice
        // as many entries as there are sessions with listeners.
        if channels.by_session.len() >= SWEEP_FLOOR.max(2 * channels.after_sweep) {
            channels.by_session.retain(|_, session| session.listened());
            channels.after_sweep = channels.by_session.len();
        }
        f(channels.by_session.entry(session_id.to_owned()).or_insert_with(SessionChannels::new))
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
            drop(hub.progress(&format!("s{i}")));
        }
        assert!(hub.lock().by_session.len() <= SWEEP_FLOOR);
        // Live listeners keep their channels, and they still get notices.
        let mut live: Vec<_> = (0..100).map(|i| hub.progress(&format!("live{i}"))).collect();
        for i in 0..1000 {
            drop(hub.deltas(&format!("t{i}")));
        }
        assert!(hub.lock().by_session.len() <= 2 * 100 + SWEEP_FLOOR);
        hub.committed("live7", 3, &[]);
        assert!(live[7].has_changed().unwrap());
        assert_eq!(live[7].borrow_and_update().last_seq, 3);
        assert!(!live[8].has_changed().unwrap());
    }

    #[test]
    fn a_long_poll_learns_whether_its_turn_ended() {
        let hub = Hub::default();
        let mut rx = hub.progress("s");
        let mark = rx.borrow().mark();
        hub.committed("s", 4, &["t1".into()]);
        hub.committed("s", 6, &[]);
        let p = rx.borrow_and_update().clone();
        assert_eq!(p.last_seq, 6);
        assert!(p.ended_since(mark, &"t1".into()));
        assert!(!p.ended_since(mark, &"t2".into()));
        assert!(!p.ended_since(p.mark(), &"t1".into()), "nothing ended since the latest mark");
        // More ends than the progress remembers: every waiter must look.
        let mark = p.mark();
        for i in 0..RECENT_ENDED + 1 {
            hub.committed("s", 7, &[TurnId::from(format!("x{i}"))]);
        }
        assert!(rx.borrow().ended_since(mark, &"t9".into()));
    }

    #[test]
    fn deltas_reach_only_streams_and_cost_nothing_without_them() {
        let hub = Hub::default();
        let _poll = hub.progress("s");
        hub.delta("s", &"c".into(), StreamDelta::default());
        assert!(hub.lock().by_session["s"].deltas.is_none(), "no stream, no delta buffer");
        let mut stream = hub.deltas("s");
        let delta = StreamDelta { text: Some("hi".into()), ..StreamDelta::default() };
        hub.delta("s", &"c".into(), delta.clone());
        assert_eq!(stream.try_recv().unwrap(), Delta { call_id: "c".into(), delta });
    }
}
