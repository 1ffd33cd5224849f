//! What a process remembers per session between requests: hints, never the truth (the store
//! is). Bounded by a number of keys and, for memos of sessions, by bytes: a full memo lets go
//! of what was used least recently, which costs only the reads the hints saved. A poisoned lock
//! is still a valid memo, for the same reason.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};

/// How many keys a memo holds at most.
const LIMIT: usize = 4096;

/// What a memo of sessions may hold, in bytes as [`turnstone_engine::session::Session::approx_bytes`]
/// counts them, unless configured (`[limits] session_cache_mb`): on Lambda an eighth of the
/// function's memory (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`; a function has three such memos, the
/// store's and the app's committed states and message trees, which share most of what they
/// hold, and a session's memory is within a small factor of its JSON: `examples/dispatch_memory`
/// measured a dispatch container's peak RSS at 37 MiB plus a third of the memory size),
/// elsewhere 256 MiB.
pub fn session_budget(configured_mb: Option<usize>) -> usize {
    const MIB: usize = 1 << 20;
    if let Some(mb) = configured_mb {
        return mb.saturating_mul(MIB);
    }
    match std::env::var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE").ok().and_then(|mb| mb.parse::<usize>().ok()) {
        Some(mb) => mb.saturating_mul(MIB) / 8,
        None => 256 * MIB,
    }
}

/// A bounded map of hints, shared by the tasks of one process.
pub struct Memo<K, V> {
    inner: Mutex<Inner<K, V>>,
    max_bytes: usize,
    weigh: fn(&V) -> usize,
}

struct Inner<K, V> {
    /// Key -> (value, its weight, when it was last used).
    map: HashMap<K, (V, usize, u64)>,
    /// When each key was last used -> the key: the least recently used first.
    used: BTreeMap<u64, K>,
    bytes: usize,
    tick: u64,
}

impl<K, V> std::fmt::Debug for Memo<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("Memo").field("keys", &inner.map.len()).field("bytes", &inner.bytes).finish()
    }
}

impl<K: Eq + Hash + Clone, V> Memo<K, V> {
    /// A memo of at most 4,096 keys.
    pub fn new() -> Self {
        Memo::weighed(usize::MAX, |_| 0)
    }

    /// A memo of at most 4,096 keys and `max_bytes` of values as `weigh` counts them. The value
    /// last set is kept even if it alone weighs more.
    pub fn weighed(max_bytes: usize, weigh: fn(&V) -> usize) -> Self {
        let inner = Inner { map: HashMap::new(), used: BTreeMap::new(), bytes: 0, tick: 0 };
        Memo { inner: Mutex::new(inner), max_bytes, weigh }
    }

    pub fn get<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        V: Clone,
    {
        let mut inner = self.lock();
        let tick = inner.next_tick();
        let (value, _, used) = inner.map.get_mut(key)?;
        let (value, before) = (value.clone(), std::mem::replace(used, tick));
        if let Some(k) = inner.used.remove(&before) {
            inner.used.insert(tick, k);
        }
        Some(value)
    }

    pub fn remove<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let mut inner = self.lock();
        let (value, weight, used) = inner.map.remove(key)?;
        inner.used.remove(&used);
        inner.bytes -= weight;
        Some(value)
    }

    pub fn insert(&self, key: K, value: V) {
        self.update(key, |_| value);
    }

    /// Sets `key` to what `f` makes of its current value, then lets go of the least recently
    /// used keys while the memo holds too many, or too many bytes.
    pub fn update(&self, key: K, f: impl FnOnce(Option<&V>) -> V) {
        let mut inner = self.lock();
        let value = f(inner.map.get(&key).map(|(v, ..)| v));
        let weight = (self.weigh)(&value);
        let tick = inner.next_tick();
        if let Some((_, old_weight, old_used)) = inner.map.insert(key.clone(), (value, weight, tick)) {
            inner.used.remove(&old_used);
            inner.bytes -= old_weight;
        }
        inner.used.insert(tick, key);
        inner.bytes += weight;
        while inner.map.len() > LIMIT || (inner.bytes > self.max_bytes && inner.map.len() > 1) {
            let Some((_, oldest)) = inner.used.pop_first() else { break };
            if let Some((_, weight, _)) = inner.map.remove(&oldest) {
                inner.bytes -= weight;
            }
        }
    }

    /// How many bytes the memo holds, as its weigher counts them.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K, V>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<K: Eq + Hash + Clone, V> Default for Memo<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V> Inner<K, V> {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_memo_lets_go_of_the_least_recently_used_key() {
        let memo = Memo::new();
        for i in 0..LIMIT {
            memo.insert(i, i);
        }
        // Key 0 is used again, so key 1 is now the least recently used.
        memo.update(0, |old| old.copied().unwrap_or(0) + 1);
        memo.insert(LIMIT, LIMIT);
        assert_eq!((memo.get(&0), memo.get(&1), memo.get(&LIMIT)), (Some(1), None, Some(LIMIT)));
        assert_eq!(memo.get(&2), Some(2), "one key went, the rest stayed");
    }

    #[test]
    fn a_weighed_memo_holds_at_most_its_bytes_but_always_the_last_value() {
        let memo: Memo<&str, String> = Memo::weighed(10, String::len);
        memo.insert("a", "1234".into());
        memo.insert("b", "1234".into());
        assert_eq!(memo.get("a").as_deref(), Some("1234"));
        // 12 bytes: "b" (used least recently) goes.
        memo.insert("c", "1234".into());
        assert_eq!(
            (memo.get("a").is_some(), memo.get("b").is_some(), memo.get("c").is_some()),
            (true, false, true)
        );
        assert_eq!(memo.bytes(), 8);
        // Growing a value re-weighs it.
        memo.insert("a", "123456789".into());
        assert_eq!((memo.get("a").is_some(), memo.get("c").is_some(), memo.bytes()), (true, false, 9));
        // A value heavier than the budget is still kept, alone.
        memo.insert("d", "x".repeat(50));
        assert_eq!((memo.get("d").map(|v| v.len()), memo.get("a"), memo.bytes()), (Some(50), None, 50));
        assert_eq!(memo.remove("d").map(|v| v.len()), Some(50));
        assert_eq!(memo.bytes(), 0);
    }

    #[test]
    fn the_budget_follows_the_setting_or_the_function_memory() {
        assert_eq!(session_budget(Some(3)), 3 << 20);
    }
}
