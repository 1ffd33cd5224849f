//! The in-memory store: the `Store` port in a map, gone when dropped. It keeps what the SQLite
//! store keeps (a head per session, its log, the ids it ever used, its wake time) with the same
//! checks, so tests and simulations run the runtime over it at memory speed; it passes the
//! conformance suite (`tests/conformance.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use turnstone_engine::session::{Event, Session, UsedId};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_runtime::store::{
    Commit, ListingCursor, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError,
};

/// The `Store` port in memory. Cheap to clone: clones share the sessions.
#[derive(Clone)]
pub struct MemoryStore {
    sessions: Arc<Mutex<BTreeMap<String, Stored>>>,
    /// Ids of disposed sessions: never created again.
    disposed: Arc<Mutex<BTreeSet<String>>>,
    clock: Arc<dyn Clock>,
}

/// One session as kept: the head after the last commit and everything ever written.
struct Stored {
    /// The session after the last commit, messages included (a clone shares its nodes).
    session: Session,
    version: u64,
    log: Vec<Event>,
    used: BTreeSet<UsedId>,
    wake_at: Option<Timestamp>,
    updated_at: Timestamp,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").field("sessions", &self.lock().len()).finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// An empty store; the system clock stamps `updated_at`.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store; `clock` stamps `updated_at`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            sessions: Arc::new(Mutex::new(BTreeMap::new())),
            disposed: Arc::new(Mutex::new(BTreeSet::new())),
            clock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Stored>> {
        // Every write below checks first and then changes the map in steps that cannot panic,
        // so a poisoned lock still guards a consistent map.
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError> {
        Ok(self.lock().get(session_id).map(|s| Loaded { session: s.session.clone(), version: s.version }))
    }

    async fn used_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError> {
        let sessions = self.lock();
        let Some(stored) = sessions.get(session_id) else { return Ok(Vec::new()) };
        Ok(ids.iter().filter(|id| stored.used.contains(*id)).cloned().collect())
    }

    async fn commit(
        &self,
        session_id: &str,
        expected_version: u64,
        commit: Commit<'_>,
    ) -> Result<u64, StoreError> {
        commit.check(session_id).map_err(|message| StoreError::Corrupt {
            session_id: session_id.to_owned(),
            message: format!("refused commit: {message}"),
        })?;
        let conflict =
            || StoreError::Conflict { session_id: session_id.to_owned(), expected: expected_version };
        let now = self.clock.now();
        let mut sessions = self.lock();
        let current = sessions.get(session_id);
        if current.map_or(0, |s| s.version) != expected_version {
            return Err(conflict());
        }
        // Lock order: sessions, then disposed (as `dispose`).
        if current.is_none()
            && self.disposed.lock().unwrap_or_else(PoisonError::into_inner).contains(session_id)
        {
            return Err(conflict());
        }
        let first_used = commit.first_used();
        if let Some(stored) = current {
            let again: Vec<UsedId> =
                first_used.iter().filter(|id| stored.used.contains(*id)).cloned().collect();
            if !again.is_empty() {
                return Err(StoreError::IdsUsed { session_id: session_id.to_owned(), ids: again });
            }
        }
        // A log that does not continue where the stored one ends would be corrupt.
        let stored_len = current.map_or(0, |s| s.log.len() as u64);
        if commit.first_seq() != stored_len + 1 {
            return Err(StoreError::Corrupt {
                session_id: session_id.to_owned(),
                message: format!(
                    "the commit's events start at {}, the log ends at {stored_len}",
                    commit.first_seq()
                ),
            });
        }
        if let (Some(owner), Some(limit)) =
            (commit.counted_owner(expected_version), commit.sessions_per_owner)
        {
            // Counted under the lock, so exact: the owner's sessions that exist.
            let held = sessions
                .values()
                .filter(|s| s.session.init().and_then(|i| i.identity.id.as_deref()) == Some(owner))
                .count() as u64;
            if held >= limit {
                return Err(StoreError::OwnerFull { owner: owner.to_owned(), limit });
            }
        }
        let stored = sessions.entry(session_id.to_owned()).or_insert_with(|| Stored {
            session: commit.session.clone(),
            version: 0,
            log: Vec::new(),
            used: BTreeSet::new(),
            wake_at: None,
            updated_at: now,
        });
        stored.session = commit.session.clone();
        stored.version += 1;
        stored.log.extend(commit.events.iter().cloned());
        stored.used.extend(first_used);
        stored.wake_at = commit.wake_at;
        stored.updated_at = now;
        Ok(stored.version)
    }

    async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>, StoreError> {
        let sessions = self.lock();
        let Some(stored) = sessions.get(session_id) else { return Ok(Vec::new()) };
        let skip = usize::try_from(after_seq).unwrap_or(usize::MAX);
        Ok(stored
            .log
            .iter()
            .enumerate()
            .skip(skip)
            .take(limit)
            .map(|(i, event)| LoggedEvent { seq: i as u64 + 1, event: event.clone() })
            .collect())
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError> {
        let after = ListingCursor::decode(cursor)?;
        // A page of nothing could not say where the next one starts: at least one item.
        let limit = limit.max(1);
        let sessions = self.lock();
        let mut items: Vec<SessionListing> = sessions
            .iter()
            .map(|(id, s)| SessionListing {
                session_id: id.clone(),
                agent_id: s.session.agent_id().to_owned(),
                owner: s.session.init().and_then(|i| i.identity.id.clone()),
                version: s.version,
                created_at: s.session.created_at(),
                updated_at: s.updated_at,
            })
            .filter(|l| filter.agent_id.as_ref().is_none_or(|a| *a == l.agent_id))
            .filter(|l| filter.owner.is_none() || filter.owner == l.owner)
            .filter(|l| {
                after.as_ref().is_none_or(|c| (l.created_at, &l.session_id) < (c.created_at, &c.session_id))
            })
            .collect();
        // Newest first: (created_at DESC, session_id DESC), as every store lists.
        items.sort_by(|a, b| (b.created_at, &b.session_id).cmp(&(a.created_at, &a.session_id)));
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|last| ListingCursor::after(last).encode())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<String>, StoreError> {
        let sessions = self.lock();
        let mut due: Vec<(Timestamp, &String)> = sessions
            .iter()
            .filter_map(|(id, s)| s.wake_at.filter(|&at| at <= now).map(|at| (at, id)))
            .collect();
        due.sort();
        Ok(due.into_iter().take(limit).map(|(_, id)| id.clone()).collect())
    }

    async fn dispose(&self, session_id: &str) -> Result<bool, StoreError> {
        let mut sessions = self.lock();
        let existed = sessions.remove(session_id).is_some();
        if existed {
            self.disposed.lock().unwrap_or_else(PoisonError::into_inner).insert(session_id.to_owned());
        }
        Ok(existed)
    }
}
