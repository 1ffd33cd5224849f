//! The in-process notifier: "session S committed up to seq N (and ended these turns)" and model
//! token deltas, published and followed within one process (the local host; also the fan-out
//! inside [`super::FollowStore`]).
//!
//! Waiting clients must be cheap, a thousand of them included: commits go through a `watch`
//! channel per session (one small value, whatever the number of listeners: a long-poll or a
//! stream only needs the latest progress), and deltas through a small broadcast channel that
//! exists only while someone streams the session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::{broadcast, watch};
use turnstone_engine::ids::{CallId, TurnId};
use turnstone_engine::protocol::StreamDelta;

use super::{Delta, Notifier, Progress};
use crate::error::Result;

/// Deltas buffered per streamed session; a stream that lags skips them (they are a preview).
const DELTA_CAPACITY: usize = 32;

/// The hub sweeps out channels nobody listens to once it holds this many, or twice as many as
/// after its last sweep.
const SWEEP_FLOOR: usize = 64;

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
    /// Follows a session's commits published in this process (see [`Notifier::progress`]).
    pub fn subscribe(&self, session_id: &str) -> watch::Receiver<Progress> {
        self.with_session(session_id, |channels| channels.progress.subscribe())
    }

    /// Follows a session's live deltas (see [`Notifier::deltas`]).
    pub fn subscribe_deltas(&self, session_id: &str) -> broadcast::Receiver<Delta> {
        self.with_session(session_id, |channels| {
            channels.deltas.get_or_insert_with(|| broadcast::channel(DELTA_CAPACITY).0).subscribe()
        })
    }

    /// Tells a session's listeners, if any, that events up to `last_seq` are committed and
    /// `ended_turns` ended.
    pub fn publish(&self, session_id: &str, last_seq: u64, ended_turns: &[TurnId]) {
        let mut channels = self.lock();
        let Some(session) = channels.by_session.get(session_id) else { return };
        if !session.listened() {
            channels.by_session.remove(session_id);
            return;
        }
        session.progress.send_modify(|p| p.advance(last_seq, ended_turns));
    }

    /// Whether anyone in this process follows the session.
    pub fn is_followed(&self, session_id: &str) -> bool {
        self.lock().by_session.get(session_id).is_some_and(SessionChannels::listened)
    }

    /// Passes a model's delta to a session's streams, if any.
    pub fn publish_delta(&self, session_id: &str, call_id: &CallId, delta: StreamDelta) {
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

#[async_trait]
impl Notifier for Hub {
    fn committed(&self, session_id: &str, last_seq: u64, ended_turns: &[TurnId], _shows_in_chat: bool) {
        self.publish(session_id, last_seq, ended_turns);
    }

    fn delta(&self, session_id: &str, call_id: &CallId, delta: StreamDelta) {
        self.publish_delta(session_id, call_id, delta);
    }

    async fn progress(&self, session_id: &str) -> Result<watch::Receiver<Progress>> {
        Ok(self.subscribe(session_id))
    }

    fn deltas(&self, session_id: &str) -> broadcast::Receiver<Delta> {
        self.subscribe_deltas(session_id)
    }
}

#[cfg(test)]
mod tests {
    use super::super::RECENT_ENDED;
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
            drop(hub.subscribe_deltas(&format!("t{i}")));
        }
        assert!(hub.lock().by_session.len() <= 2 * 100 + SWEEP_FLOOR);
        hub.publish("live7", 3, &[]);
        assert!(live[7].has_changed().unwrap());
        assert_eq!(live[7].borrow_and_update().last_seq, 3);
        assert!(!live[8].has_changed().unwrap());
    }

    #[test]
    fn a_long_poll_learns_whether_its_turn_ended() {
        let hub = Hub::default();
        let mut rx = hub.subscribe("s");
        let mark = rx.borrow().mark();
        hub.publish("s", 4, &["t1".into()]);
        hub.publish("s", 6, &[]);
        let p = rx.borrow_and_update().clone();
        assert_eq!(p.last_seq, 6);
        assert!(p.ended_since(mark, &"t1".into()));
        assert!(!p.ended_since(mark, &"t2".into()));
        assert!(!p.ended_since(p.mark(), &"t1".into()), "nothing ended since the latest mark");
        // More ends than the progress remembers: every waiter must look.
        let mark = p.mark();
        for i in 0..RECENT_ENDED + 1 {
            hub.publish("s", 7, &[TurnId::from(format!("x{i}"))]);
        }
        assert!(rx.borrow().ended_since(mark, &"t9".into()));
    }

    #[test]
    fn deltas_reach_only_streams_and_cost_nothing_without_them() {
        let hub = Hub::default();
        let _poll = hub.subscribe("s");
        hub.publish_delta("s", &"c".into(), StreamDelta::default());
        assert!(hub.lock().by_session["s"].deltas.is_none(), "no stream, no delta buffer");
        let mut stream = hub.subscribe_deltas("s");
        let delta = StreamDelta { text: Some("hi".into()), ..StreamDelta::default() };
        hub.publish_delta("s", &"c".into(), delta.clone());
        assert_eq!(stream.try_recv().unwrap(), Delta { call_id: "c".into(), delta });
    }
}
