//! A store whose calls an observer sees before they reach the store it wraps: what a test or a
//! benchmark counts, delays or times, without writing out the [`Store`] trait's delegation
//! again for each.

use async_trait::async_trait;
use turnstone_engine::protocol::TreeNode;
use turnstone_engine::session::UsedId;
use turnstone_engine::time::Timestamp;

use crate::store::{Commit, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError};

/// A call on its way to the wrapped store.
#[derive(Debug, Clone, Copy)]
pub enum StoreCall<'a> {
    /// `load` or `load_since` of a session.
    Load(&'a str),
    UsedIds(&'a str),
    Commit(&'a str, &'a Commit<'a>),
    /// Any other: reads of the log, listings, the due index, disposals.
    Other,
}

/// Sees each call before the wrapped store answers it (and may hold it back a while).
#[async_trait]
pub trait StoreObserver: Send + Sync + 'static {
    async fn before(&self, call: StoreCall<'_>);
}

/// `inner`, each call shown to `observer` first.
pub struct ObservedStore<S, O> {
    pub inner: S,
    pub observer: O,
}

#[async_trait]
impl<S: Store, O: StoreObserver> Store for ObservedStore<S, O> {
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError> {
        self.observer.before(StoreCall::Load(session_id)).await;
        self.inner.load(session_id).await
    }

    async fn load_since(
        &self,
        session_id: &str,
        from: u64,
    ) -> Result<Option<(Loaded, Vec<TreeNode>)>, StoreError> {
        self.observer.before(StoreCall::Load(session_id)).await;
        self.inner.load_since(session_id, from).await
    }

    async fn used_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError> {
        self.observer.before(StoreCall::UsedIds(session_id)).await;
        self.inner.used_ids(session_id, ids).await
    }

    async fn commit(&self, session_id: &str, expected: u64, commit: Commit<'_>) -> Result<u64, StoreError> {
        self.observer.before(StoreCall::Commit(session_id, &commit)).await;
        self.inner.commit(session_id, expected, commit).await
    }

    async fn events_after(&self, id: &str, after: u64, limit: usize) -> Result<Vec<LoggedEvent>, StoreError> {
        self.observer.before(StoreCall::Other).await;
        self.inner.events_after(id, after, limit).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError> {
        self.observer.before(StoreCall::Other).await;
        self.inner.list_sessions(filter, cursor, limit).await
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<String>, StoreError> {
        self.observer.before(StoreCall::Other).await;
        self.inner.due(now, limit).await
    }

    async fn dispose(&self, session_id: &str) -> Result<bool, StoreError> {
        self.observer.before(StoreCall::Other).await;
        self.inner.dispose(session_id).await
    }

    fn exclusive(&self) -> bool {
        self.inner.exclusive()
    }
}
