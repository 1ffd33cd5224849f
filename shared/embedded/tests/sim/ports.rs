//! The simulation's side of the runtime's ports: a store and a queue that hand every operation
//! to the scheduler first (a yield, so other futures may run in between) and crash the process
//! before or after a write when the dice say so.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use async_trait::async_trait;
use turnstone_engine::protocol::TreeNode;
use turnstone_engine::session::UsedId;
use turnstone_engine::time::Timestamp;
use turnstone_runtime::queue::{Queue, QueueError, WakeUp};
use turnstone_runtime::store::{
    Commit, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError,
};

use super::endpoints::SimSleep;
use super::{Fate, Host, Life, Queued, World};

/// Runs `f` to completion on this thread. A store's operation is one step of the simulation:
/// the SQLite store answers from its own threads, and waiting for them here (rather than
/// returning to the scheduler) keeps their timing out of the trace.
pub fn block<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    // Outside tokio's cooperative budget: a future out of budget defers its wake-up to the
    // runtime, which this thread is holding up.
    let mut f = pin!(tokio::task::unconstrained(f));
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}

/// Pending once: hands the turn back to the scheduler.
pub struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Life {
    /// A point where the scheduler may run something else; a dead process never gets past it.
    pub async fn gate(&self) {
        if self.is_dead() {
            std::future::pending::<()>().await;
        }
        YieldOnce(false).await;
        if self.is_dead() {
            std::future::pending::<()>().await;
        }
    }

    /// The process dies here: the scheduler drops it, this future never resumes.
    pub async fn die<T>(&self) -> T {
        self.kill();
        std::future::pending::<T>().await
    }
}

/// The store of one process: the world's store behind gates and crashes.
pub struct SimStore {
    pub world: Arc<World>,
    pub life: Arc<Life>,
}

#[async_trait]
impl Store for SimStore {
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError> {
        self.life.gate().await;
        block(self.world.store().load(session_id))
    }

    async fn load_since(
        &self,
        session_id: &str,
        from: u64,
    ) -> Result<Option<(Loaded, Vec<TreeNode>)>, StoreError> {
        self.life.gate().await;
        block(self.world.store().load_since(session_id, from))
    }

    async fn used_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError> {
        self.life.gate().await;
        block(self.world.store().used_ids(session_id, ids))
    }

    async fn commit(
        &self,
        session_id: &str,
        expected_version: u64,
        commit: Commit<'_>,
    ) -> Result<u64, StoreError> {
        self.life.gate().await;
        // Now and then the process stalls before it writes (a pause, a starved CPU): a commit
        // of what it learnt may come long after, when the session has moved on.
        if self.world.chaos() && self.world.chance(3) {
            let ms = 1_000 + self.world.roll(150_000) as i64;
            self.world.trace(format!("stall {ms}"));
            SimSleep::new(&self.world, ms).await;
        }
        let fate = self.world.fate("commit", false);
        if fate == Fate::CrashBefore {
            return self.life.die().await;
        }
        let events: Vec<String> =
            commit.events.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect();
        let result = block(self.world.store().commit(session_id, expected_version, commit));
        if let Ok(version) = &result {
            self.world.trace(format!("commit {session_id} v{version} {}", events.join(" ")));
        }
        if fate == Fate::CrashAfter {
            return self.life.die().await;
        }
        result
    }

    async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>, StoreError> {
        self.life.gate().await;
        block(self.world.store().events_after(session_id, after_seq, limit))
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError> {
        self.life.gate().await;
        block(self.world.store().list_sessions(filter, cursor, limit))
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<String>, StoreError> {
        self.life.gate().await;
        block(self.world.store().due(now, limit))
    }

    async fn dispose(&self, session_id: &str) -> Result<bool, StoreError> {
        self.life.gate().await;
        block(self.world.store().dispose(session_id))
    }

    /// A local host's process is the only one at a time (a restart drops the dead one's
    /// futures); split processes share the store.
    fn exclusive(&self) -> bool {
        self.world.host == Host::Local
    }
}

/// The queue of one process: sends land in the world's mailbox, which the scheduler delivers
/// from (late, twice, in any order).
pub struct SimQueue {
    pub world: Arc<World>,
    pub life: Arc<Life>,
}

#[async_trait]
impl Queue for SimQueue {
    async fn send(&self, wake_up: WakeUp, delay: Duration) -> Result<(), QueueError> {
        self.life.gate().await;
        let fate = self.world.fate("send", true);
        match fate {
            Fate::CrashBefore => return self.life.die().await,
            Fate::Fail => {
                self.world.trace(format!("send failed {}", wake_up.session_id));
                return Err(QueueError::Backend("the simulated queue refused the send".into()));
            }
            Fate::Go | Fate::CrashAfter => {}
        }
        let visible_at = self.world.now() + delay.as_millis() as i64;
        self.world.trace(format!(
            "send {} {} {:?} +{}",
            wake_up.session_id,
            wake_up.reason,
            wake_up.seq,
            delay.as_millis()
        ));
        {
            let mut mailbox = self.world.mailbox.lock().unwrap();
            mailbox.next_id += 1;
            let id = mailbox.next_id;
            mailbox.queued.push(Queued { id, wake_up, visible_at });
        }
        if fate == Fate::CrashAfter {
            return self.life.die().await;
        }
        Ok(())
    }
}
