//! What a process remembers per session between requests: hints, never the truth (the store
//! is). Bounded: a memo that reaches its limit with a new key starts over, which costs only
//! the reads the hints saved. A poisoned lock is still a valid memo, for the same reason.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};

/// How many keys a memo holds before it starts over.
const LIMIT: usize = 4096;

/// A bounded map of hints, shared by the tasks of one process.
#[derive(Debug)]
pub(crate) struct Memo<K, V> {
    map: Mutex<HashMap<K, V>>,
}

impl<K: Eq + Hash, V> Memo<K, V> {
    pub(crate) fn new() -> Self {
        Memo { map: Mutex::new(HashMap::new()) }
    }

    pub(crate) fn get<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        V: Clone,
    {
        self.lock().get(key).cloned()
    }

    pub(crate) fn remove<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.lock().remove(key)
    }

    pub(crate) fn insert(&self, key: K, value: V) {
        self.update(key, |_| value);
    }

    /// Sets `key` to what `f` makes of its current value.
    pub(crate) fn update(&self, key: K, f: impl FnOnce(Option<&V>) -> V) {
        let mut map = self.lock();
        if map.len() >= LIMIT && !map.contains_key(&key) {
            map.clear();
        }
        let value = f(map.get(&key));
        map.insert(key, value);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, V>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_memo_starts_over_for_a_new_key_only() {
        let memo = Memo::new();
        for i in 0..LIMIT {
            memo.insert(i, i);
        }
        memo.update(0, |old| old.copied().unwrap_or(0) + 1);
        assert_eq!(
            (memo.get(&0), memo.get(&(LIMIT - 1))),
            (Some(1), Some(LIMIT - 1)),
            "an old key keeps the rest"
        );
        memo.insert(LIMIT, LIMIT);
        assert_eq!((memo.get(&LIMIT), memo.get(&0)), (Some(LIMIT), None), "a new key starts over");
    }
}
