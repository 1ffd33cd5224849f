//! Caps on what one caller holds open at once (event streams, AHP sockets): a count per
//! authenticated identity, taken with [`PerCaller::acquire`] and given back when the
//! [`Slot`] drops, however the stream or socket ends. The open host's caller (no `[auth]`,
//! this machine only) has no cap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::auth::Caller;

/// Counts per caller, up to `limit` each.
#[derive(Debug)]
pub struct PerCaller {
    limit: usize,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// One held unit of a caller's count; dropping it gives it back.
#[derive(Debug)]
pub struct Slot {
    key: Option<String>,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

impl PerCaller {
    /// At most `limit` held per caller.
    pub fn new(limit: usize) -> Self {
        PerCaller { limit, held: Arc::default() }
    }

    /// The cap.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// One more for `caller`, or `None` when it holds `limit` already.
    pub fn acquire(&self, caller: &Caller) -> Option<Slot> {
        let Some(key) = caller.key() else {
            return Some(Slot { key: None, held: Arc::clone(&self.held) });
        };
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(key.clone()).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Slot { key: Some(key), held: Arc::clone(&self.held) })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(key) = &self.key else { return };
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Kind;

    #[test]
    fn each_caller_holds_at_most_the_limit_and_gets_it_back_on_drop() {
        let caps = PerCaller::new(2);
        let (alice, bob) = (Caller::client(Kind::Client, "alice"), Caller::client(Kind::Client, "bob"));
        let a1 = caps.acquire(&alice).unwrap();
        let _a2 = caps.acquire(&alice).unwrap();
        assert!(caps.acquire(&alice).is_none());
        assert!(caps.acquire(&bob).is_some(), "another caller's count is its own");
        // An admin and a client of one name are two callers.
        let root_admin = Caller::Admin { name: "alice".into() };
        assert!(caps.acquire(&root_admin).is_some());
        drop(a1);
        assert!(caps.acquire(&alice).is_some());
        let anyone: Vec<Slot> = (0..10).filter_map(|_| caps.acquire(&Caller::Anyone)).collect();
        assert_eq!(anyone.len(), 10, "the open host's caller has no cap");
    }
}
