//! In-process per-session locks, so one host runs a session on one task at a time. Across
//! hosts, the store's version check is what keeps steps single-winner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

/// Per-session async mutexes, dropped when nobody holds or waits for them.
#[derive(Debug, Default)]
pub struct SessionLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Holds a session's lock.
pub struct SessionGuard {
    _guard: OwnedMutexGuard<()>,
}

impl SessionLocks {
    /// Waits for and takes the lock of `session_id`.
    pub async fn lock(&self, session_id: &str) -> SessionGuard {
        let lock = {
            // A poisoned map is still a valid map of locks.
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.retain(|_, l| Arc::strong_count(l) > 1 || l.try_lock().is_err());
            Arc::clone(locks.entry(session_id.to_owned()).or_default())
        };
        SessionGuard { _guard: lock.lock_owned().await }
    }
}
