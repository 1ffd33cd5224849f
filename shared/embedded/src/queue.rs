//! The in-process delay queue: the `Queue` port for the embedded deployment.
//!
//! Wake-ups are coalesced per session: a session has at most one pending wake-up (sending
//! again keeps the earliest due time) and at most one delivery in flight, so the queue holds at
//! most two entries per session and never grows past the number of sessions. A session's
//! pending wake-up is held back while a delivery for it is in flight: two dispatchers never
//! work on one session because of this queue, and a wake-up sent while the session is being
//! handled is delivered after that delivery is acknowledged (so news that arrived meanwhile is
//! never lost). Deliveries are at least once: an unacknowledged delivery becomes visible again
//! after the visibility timeout. Nothing survives the process; after a restart the sweep finds
//! due sessions from the store.
//!
//! Time is tokio's, so tests can pause and advance it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use turnstone_runtime::queue::{Consumer, Delivery, Queue, QueueError, WakeUp};

/// The default visibility timeout: how long a received delivery stays invisible.
pub const DEFAULT_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(30);

/// Delays and waits are capped at this (the dispatcher re-checks due times on arrival).
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The `Queue` port in memory: coalescing per session, delays, visibility timeouts.
#[derive(Debug)]
pub struct MemoryQueue {
    state: Mutex<State>,
    /// Wakes receivers when a wake-up is sent, acknowledged, or the queue closes.
    changed: Notify,
    visibility_timeout: Duration,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// `(when the entry next becomes deliverable, session)` for every entry.
    timeline: BTreeSet<(Instant, String)>,
    next_receipt: u64,
    closed: bool,
}

#[derive(Debug, Default)]
struct Entry {
    /// Not yet delivered: the wake-up and when it is due.
    pending: Option<(WakeUp, Instant)>,
    /// Delivered, not yet acknowledged.
    in_flight: Option<InFlight>,
    /// This entry's key in the timeline.
    key: Option<Instant>,
}

#[derive(Debug)]
struct InFlight {
    wake_up: WakeUp,
    receipt: String,
    /// When it becomes visible again unless acknowledged.
    visible_at: Instant,
}

impl Entry {
    /// When this entry can next be delivered: its in-flight delivery's timeout, or else its
    /// pending wake-up's due time.
    fn deliverable_at(&self) -> Option<Instant> {
        match &self.in_flight {
            Some(f) => Some(f.visible_at),
            None => self.pending.as_ref().map(|(_, due)| *due),
        }
    }
}

fn lock(mutex: &Mutex<State>) -> MutexGuard<'_, State> {
    // The state is consistent between statements that can panic (none do), so poisoning is
    // ignored rather than turned into a panic of every later caller.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `now + d`, with `d` capped at [`MAX_DELAY`].
fn after(now: Instant, d: Duration) -> Instant {
    let d = d.min(MAX_DELAY);
    now.checked_add(d).unwrap_or(now)
}

impl State {
    /// Moves `session_id`'s timeline key to where its entry now belongs; drops an empty entry.
    fn reindex(&mut self, session_id: &str) {
        let Some(entry) = self.entries.get_mut(session_id) else { return };
        let next = entry.deliverable_at();
        if entry.key == next {
            return;
        }
        if let Some(old) = entry.key.take() {
            self.timeline.remove(&(old, session_id.to_owned()));
        }
        match next {
            Some(at) => {
                entry.key = Some(at);
                self.timeline.insert((at, session_id.to_owned()));
            }
            None => {
                self.entries.remove(session_id);
            }
        }
    }

    /// Takes up to `max` deliverable wake-ups at `now`, earliest first.
    fn take_due(&mut self, now: Instant, max: usize, visibility: Duration) -> Vec<Delivery> {
        let due: Vec<String> = self
            .timeline
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(max)
            .map(|(_, id)| id.clone())
            .collect();
        let mut out = Vec::with_capacity(due.len());
        for session_id in due {
            self.next_receipt += 1;
            let receipt = format!("{}:{}", self.next_receipt, session_id);
            let Some(entry) = self.entries.get_mut(&session_id) else { continue };
            let wake_up = match entry.in_flight.take() {
                // Redelivery after the visibility timeout; a pending wake-up already due is
                // coalesced into it.
                Some(expired) => {
                    let mut wake_up = expired.wake_up;
                    if let Some((pending, _)) = entry.pending.take_if(|(_, due)| *due <= now) {
                        wake_up.merge(&pending);
                    }
                    wake_up
                }
                None => match entry.pending.take() {
                    Some((wake_up, _)) => wake_up,
                    None => continue,
                },
            };
            entry.in_flight = Some(InFlight {
                wake_up: wake_up.clone(),
                receipt: receipt.clone(),
                visible_at: after(now, visibility),
            });
            self.reindex(&session_id);
            out.push(Delivery { wake_up, receipt });
        }
        out
    }
}

impl Default for MemoryQueue {
    fn default() -> Self {
        MemoryQueue::new(DEFAULT_VISIBILITY_TIMEOUT)
    }
}

impl MemoryQueue {
    /// An empty queue whose unacknowledged deliveries reappear after `visibility_timeout`.
    pub fn new(visibility_timeout: Duration) -> Self {
        MemoryQueue { state: Mutex::new(State::default()), changed: Notify::new(), visibility_timeout }
    }

    /// The visibility timeout of this queue.
    pub fn visibility_timeout(&self) -> Duration {
        self.visibility_timeout
    }

    /// How many sessions have a wake-up pending or in flight.
    pub fn sessions(&self) -> usize {
        lock(&self.state).entries.len()
    }

    /// Closes the queue: waiting and later receivers get `QueueError::Closed`, and so do senders
    /// (the same as the port's `Queue::close`, without the `.await`).
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.changed.notify_waiters();
    }

    /// Whether [`MemoryQueue::close`] was called.
    pub fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }
}

#[async_trait]
impl Queue for MemoryQueue {
    async fn send(&self, wake_up: WakeUp, delay: Duration) -> Result<(), QueueError> {
        {
            let mut state = lock(&self.state);
            if state.closed {
                return Err(QueueError::Closed);
            }
            let due = after(Instant::now(), delay);
            let session_id = wake_up.session_id.clone();
            let entry = state.entries.entry(session_id.clone()).or_default();
            // One pending wake-up per session: the earliest, waiting for the latest commit
            // either announces.
            match &mut entry.pending {
                Some((kept, earlier)) if *earlier <= due => {
                    kept.merge(&wake_up);
                    return Ok(());
                }
                Some((kept, _)) => {
                    let mut wake_up = wake_up;
                    wake_up.merge(kept);
                    entry.pending = Some((wake_up, due));
                }
                None => entry.pending = Some((wake_up, due)),
            }
            state.reindex(&session_id);
        }
        self.changed.notify_waiters();
        Ok(())
    }
}

#[async_trait]
impl Consumer for MemoryQueue {
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, QueueError> {
        if max == 0 {
            return if self.is_closed() { Err(QueueError::Closed) } else { Ok(Vec::new()) };
        }
        let deadline = after(Instant::now(), wait);
        loop {
            // Register for a change before looking, so a send between the look and the wait
            // is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let next = {
                let mut state = lock(&self.state);
                if state.closed {
                    return Err(QueueError::Closed);
                }
                let now = Instant::now();
                let out = state.take_due(now, max, self.visibility_timeout);
                if !out.is_empty() {
                    return Ok(out);
                }
                if now >= deadline {
                    return Ok(Vec::new());
                }
                state.timeline.first().map(|(at, _)| *at)
            };
            let until = next.map_or(deadline, |at| at.min(deadline));
            tokio::select! {
                () = &mut changed => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn ack(&self, delivery: &Delivery) -> Result<(), QueueError> {
        let session_id = &delivery.wake_up.session_id;
        {
            let mut state = lock(&self.state);
            let Some(entry) = state.entries.get_mut(session_id) else { return Ok(()) };
            if entry.in_flight.as_ref().is_none_or(|f| f.receipt != delivery.receipt) {
                return Ok(()); // stale: redelivered since, or acknowledged already
            }
            entry.in_flight = None;
            state.reindex(session_id);
        }
        self.changed.notify_waiters();
        Ok(())
    }

    async fn close(&self) {
        MemoryQueue::close(self);
    }
}
