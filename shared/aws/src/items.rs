//! The single-table layout (DESIGN.md section 5): item keys, attribute names, and reading
//! attributes back. Every item of a session shares its partition `PK = S#<session>`; the sort
//! key says what the item is:
//!
//! | `SK`                 | item                                                              |
//! |----------------------|-------------------------------------------------------------------|
//! | `E#<first seq>`      | one commit: its events, packed (a JSON array), from `first` on     |
//! | `H`                  | the head: the snapshot as of the last checkpoint, listing fields  |
//! | `I`                  | the declared agent config the session was created with            |
//! | `L#<last seq>`       | where the state and agent config versions one checkpoint stored apply from (immutable) |
//! | `M#<last pos>`       | the message nodes one checkpoint stored, `first..=last` (immutable) |
//! | `T#<turn id>`        | a turn id the session used (kept for good)                        |
//! | `C#<call id>`        | a call id the session used (kept for good)                        |
//! | `B#<item SK>#<n>`    | chunk `n` of a payload too large for its item (see `chunks`)      |
//!
//! Each owner's session count is an item of its own, `PK = O#<owner>`, `SK = O`, attribute
//! `sessions` (N): raised by the creating checkpoint, lowered by `dispose`'s fence.
//!
//! A disposed session keeps only husks of its packs (their keys and `disposed`), one more husk
//! after its last pack, and nothing else.
//!
//! The log is the packs; the head is a checkpoint of it (see `commit`). A session is its head
//! and the packs after it, its messages the `M#` items and the packs after the head.
//!
//! Numbers in sort keys are zero-padded to 20 digits, so string order is numeric order. Heads
//! carry the listing indexes' attributes; packs whose wake time no queued wake-up covers carry
//! the due index's (see `table`).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use turnstone_engine::session::UsedId;
use turnstone_engine::time::Timestamp;

/// An item as the SDK holds it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// The partition key attribute.
pub(crate) const PK: &str = "PK";
/// The sort key attribute.
pub(crate) const SK: &str = "SK";
/// The head's sort key.
pub(crate) const HEAD: &str = "H";
/// The sort key of the agent config the session was created with (`init.declared` of the
/// snapshot): it never changes, so the creating commit writes it once and the head leaves it
/// out. Sorts right after the head, so one query reads both.
pub(crate) const DECLARED: &str = "I";

/// The session's version (N): one more with every commit. On a pack, the version it made;
/// on a head, the version its snapshot stands for; on a head's chunk, the head's.
pub(crate) const VERSION: &str = "version";
/// How many message nodes the `M#` items hold (N), on a head and on a checkpoint's pack.
pub(crate) const MESSAGES: &str = "messages";
/// A token unique to the request that wrote a pack (S): a retried request that finds the
/// pack in place knows whether it was its own.
pub(crate) const WRITER: &str = "writer";
/// The session's agent (S).
pub(crate) const AGENT: &str = "agent";
/// The identity that created the session (S), absent when none did.
pub(crate) const OWNER: &str = "owner";
/// Creation and (on a head and a pack) last write, ms since the epoch (N).
pub(crate) const CREATED_AT: &str = "created_at";
pub(crate) const UPDATED_AT: &str = "updated_at";
/// When the session next has timed work, ms since the epoch (N); absent when nothing is timed.
pub(crate) const WAKE_AT: &str = "wake_at";

/// On the packs of a disposed session, when it was disposed (N, ms since the epoch): a husk
/// that holds only its key, so that a writer that loaded the session before still finds its
/// pack's place taken (see `DynamoStore::dispose`).
pub(crate) const DISPOSED: &str = "disposed";

/// An item's payload (S: JSON) when it fits in the item...
pub(crate) const BODY: &str = "body";
/// ...or the number of chunk items that hold it (N).
pub(crate) const CHUNKS: &str = "chunks";
/// An event pack's first sequence number and event count (N); a message item's first
/// position and node count.
pub(crate) const FIRST: &str = "first";
pub(crate) const COUNT: &str = "count";

/// The range key of the listing indexes (S): `<created_at>#<session>`, newest last.
pub(crate) const CREATED_KEY: &str = "created_key";
/// The hash key of the index of all sessions (S): the session's [`list_shard`].
pub(crate) const LIST_SHARD: &str = "list_shard";
/// The one shard of heads written before the index was sharded: listed with the others.
pub(crate) const LISTED: &str = "all";
/// How many partitions the index of all sessions is spread over: every creation writes one
/// entry, so one partition would take every creation in the deployment; a listing queries
/// each (and [`LISTED`]) and merges them newest first. Changing it re-keys every head.
pub(crate) const LIST_SHARDS: u64 = 8;
/// The due index's keys (S), present only while the session has a wake time: the shard
/// (`0`..[`DUE_SHARDS`]) and `<wake_at>#<session>`.
pub(crate) const DUE_SHARD: &str = "due_shard";
pub(crate) const WAKE_KEY: &str = "wake_key";

/// How many partitions of the due index the wake times are spread over. Wake times change on
/// most commits, so one partition would take every session's index writes; the sweep queries
/// each shard (a handful of small queries per minute). Changing it re-keys every head.
pub(crate) const DUE_SHARDS: u64 = 8;

/// `S#<session>`.
pub(crate) fn partition(session_id: &str) -> String {
    format!("S#{session_id}")
}

/// The session a partition key names.
pub(crate) fn session_of(pk: &str) -> Option<&str> {
    pk.strip_prefix("S#")
}

/// `n` zero-padded to 20 digits (every `u64` fits), so keys sort numerically.
pub(crate) fn padded(n: u64) -> String {
    format!("{n:020}")
}

/// The sort key of the event pack starting at `first`.
pub(crate) fn event_key(first: u64) -> String {
    format!("E#{}", padded(first))
}

/// The sort key of the message item whose last node is at `last`.
pub(crate) fn messages_key(last: u64) -> String {
    format!("M#{}", padded(last))
}

/// The sort key of the version entries item whose last version was written by event `last`.
/// `L` sorts between the head's `H`/`I` and the message items' `M#`, so the query that reads
/// a checkpoint reads these too.
pub(crate) fn versions_key(last: u64) -> String {
    format!("L#{}", padded(last))
}

/// The sort key of an owner's session count (its partition is [`owner_partition`]).
pub(crate) const OWNER_COUNT: &str = "O";
/// The owner count's attribute: how many sessions the owner has (N).
pub(crate) const SESSIONS: &str = "sessions";

/// The partition key of `owner`'s session count.
pub(crate) fn owner_partition(owner: &str) -> String {
    format!("O#{owner}")
}

/// The key of `owner`'s session count item.
pub(crate) fn owner_count_key(owner: &str) -> Item {
    HashMap::from([(PK.to_owned(), s(owner_partition(owner))), (SK.to_owned(), s(OWNER_COUNT))])
}

/// The sort key of a used turn or call id.
pub(crate) fn used_key(id: &UsedId) -> String {
    match id {
        UsedId::Turn(turn) => format!("T#{turn}"),
        UsedId::Call(call) => format!("C#{call}"),
    }
}

/// The id a used-id sort key names.
pub(crate) fn used_id_of(sk: &str) -> Option<UsedId> {
    if let Some(turn) = sk.strip_prefix("T#") {
        UsedId::from_parts("turn", turn)
    } else {
        sk.strip_prefix("C#").and_then(|call| UsedId::from_parts("call", call))
    }
}

/// The sort key of chunk `n` of the payload of the item at `owner` (a sort key).
pub(crate) fn chunk_key(owner: &str, n: usize) -> String {
    format!("B#{owner}#{n:04}")
}

/// A timestamp as 20 digits that sort like the timestamps (shifted by 2^63, so negative
/// times sort before positive ones).
pub(crate) fn time_key(t: Timestamp) -> String {
    padded(t.0.cast_unsigned() ^ (1 << 63))
}

/// `<time>#<session>`: the range key of the listing and due indexes. The session makes it
/// unique, so a cursor resumes exactly after an item, ties included.
pub(crate) fn timed_key(t: Timestamp, session_id: &str) -> String {
    format!("{}#{session_id}", time_key(t))
}

/// The due-index shard of a session: FNV-1a of its id, stable across builds and hosts.
pub(crate) fn due_shard(session_id: &str) -> String {
    (stable_hash(session_id) % DUE_SHARDS).to_string()
}

/// The `by-created` index's shard of a session: a stable hash of its id, so sessions created
/// at once spread over [`LIST_SHARDS`] partitions instead of one.
pub(crate) fn list_shard(session_id: &str) -> String {
    (stable_hash(session_id) % LIST_SHARDS).to_string()
}

/// FNV-1a: stable across builds and platforms (the shards are stored).
fn stable_hash(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A string attribute value.
pub(crate) fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// A number attribute value.
pub(crate) fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// The key of item `sk` of a session.
pub(crate) fn key(session_id: &str, sk: impl Into<String>) -> Item {
    HashMap::from([(PK.to_owned(), s(partition(session_id))), (SK.to_owned(), s(sk))])
}

/// A string attribute.
pub(crate) fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    match item.get(name) {
        Some(AttributeValue::S(value)) => Some(value),
        _ => None,
    }
}

/// A number attribute that must be an unsigned integer.
pub(crate) fn get_u64(item: &Item, name: &str) -> Option<u64> {
    match item.get(name) {
        Some(AttributeValue::N(value)) => value.parse().ok(),
        _ => None,
    }
}

/// A number attribute that must be a signed integer.
pub(crate) fn get_i64(item: &Item, name: &str) -> Option<i64> {
    match item.get(name) {
        Some(AttributeValue::N(value)) => value.parse().ok(),
        _ => None,
    }
}

/// About how many bytes DynamoDB counts for an item (attribute names plus values; a number
/// counted by its digits, an over-estimate), to keep within the item and transaction limits.
pub(crate) fn item_size(item: &Item) -> usize {
    item.iter().map(|(name, value)| name.len() + value_size(value)).sum()
}

fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) | AttributeValue::N(s) => s.len(),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Ss(v) | AttributeValue::Ns(v) => v.iter().map(String::len).sum(),
        AttributeValue::L(v) => 3 + v.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::M(m) => 3 + m.iter().map(|(k, v)| 1 + k.len() + value_size(v)).sum::<usize>(),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_keys_sort_like_times() {
        let times = [i64::MIN, -5, -1, 0, 1, 1_796_000_000_000, i64::MAX];
        let keys: Vec<String> = times.iter().map(|t| time_key(Timestamp(*t))).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
        assert!(keys.iter().all(|k| k.len() == 20));
    }

    #[test]
    fn keys_round_trip() {
        assert_eq!(session_of(&partition("a#b")), Some("a#b"));
        for id in [UsedId::Turn("t#1".into()), UsedId::Call("call_1".into())] {
            assert_eq!(used_id_of(&used_key(&id)), Some(id));
        }
        assert!(event_key(9) < event_key(10));
        assert!(messages_key(99) < messages_key(100));
        assert!(DECLARED < versions_key(0).as_str() && versions_key(u64::MAX) < messages_key(0));
        assert_eq!(chunk_key("M#1", 3), "B#M#1#0003");
    }

    #[test]
    fn due_shards_are_stable_and_in_range() {
        assert_eq!(due_shard("conf-due-1"), due_shard("conf-due-1"));
        let shards: std::collections::BTreeSet<String> =
            (0..200).map(|i| due_shard(&format!("session-{i}"))).collect();
        assert_eq!(shards.len() as u64, DUE_SHARDS, "200 sessions spread over every shard");
    }
}
