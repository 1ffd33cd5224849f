//! Payloads too large for their item. A DynamoDB item holds at most 400 KB; a head, an event
//! pack or a message item whose JSON is longer than [`CHUNK_BYTES`] is cut into chunk items
//! (`B#<item SK>#<n>`, binary, at most [`CHUNK_BYTES`] each) written in the same transaction
//! (a checkpoint), and its item says how many (`chunks`) instead of holding `body`. A read
//! fetches the chunks and joins them.
//!
//! Message items and event packs are written once, so their chunks never change. The head is
//! rewritten by every checkpoint and its chunks in place (`B#H#<n>`), so each head chunk carries
//! the version it belongs to: a reader that finds another version than the head it read
//! raced a checkpoint and reads again. When a head shrinks, chunks past its new count stay behind
//! unread (at most the count of the largest head the session ever had).

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use crate::items::{self, BODY, CHUNKS, Item, VERSION};

/// The most payload bytes an item holds inline, and the size of a chunk: under 400 KB with
/// room for the keys and the item's other attributes.
pub(crate) const CHUNK_BYTES: usize = 350_000;

/// Where an item's payload is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Body<'a> {
    /// In the item's `body`.
    Inline(&'a str),
    /// In this many chunk items.
    Chunked(usize),
}

/// Puts `payload` on `item` (whose sort key is `owner`): inline if it fits, else as chunk
/// items, returned, tagged with `version` when given (the head's).
pub(crate) fn lay_out(
    session_id: &str,
    owner: &str,
    payload: String,
    version: Option<u64>,
    item: &mut Item,
) -> Vec<Item> {
    if payload.len() <= CHUNK_BYTES {
        item.insert(BODY.to_owned(), AttributeValue::S(payload));
        return Vec::new();
    }
    // Chunks are bytes, not strings: a cut may fall inside a UTF-8 character.
    let chunks: Vec<Item> = payload
        .as_bytes()
        .chunks(CHUNK_BYTES)
        .enumerate()
        .map(|(n, bytes)| {
            let mut chunk = items::key(session_id, items::chunk_key(owner, n));
            chunk.insert(BODY.to_owned(), AttributeValue::B(Blob::new(bytes)));
            if let Some(version) = version {
                chunk.insert(VERSION.to_owned(), items::n(version));
            }
            chunk
        })
        .collect();
    item.insert(CHUNKS.to_owned(), items::n(chunks.len()));
    chunks
}

/// Where the payload of `item` is; `None` if it has neither `body` nor `chunks`.
pub(crate) fn body(item: &Item) -> Option<Body<'_>> {
    if let Some(body) = items::get_s(item, BODY) {
        return Some(Body::Inline(body));
    }
    items::get_u64(item, CHUNKS).and_then(|n| usize::try_from(n).ok()).map(Body::Chunked)
}

/// The sort keys of the `count` chunks of the item at `owner`.
pub(crate) fn keys(owner: &str, count: usize) -> impl Iterator<Item = String> + '_ {
    (0..count).map(move |n| items::chunk_key(owner, n))
}

/// Why chunks could not be joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JoinError {
    /// A chunk is not there.
    Missing(String),
    /// A chunk is not binary.
    NotBinary(String),
    /// A head chunk belongs to another version than the head read.
    OtherVersion { chunk: String, found: Option<u64> },
}

impl std::fmt::Display for JoinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinError::Missing(key) => write!(f, "chunk {key} is missing"),
            JoinError::NotBinary(key) => write!(f, "chunk {key} is not binary"),
            JoinError::OtherVersion { chunk, found } => {
                write!(f, "chunk {chunk} belongs to version {found:?}")
            }
        }
    }
}

/// Joins the `count` chunks of the item at `owner`, found by sort key in `fetched`; with
/// `version`, every chunk must carry it.
pub(crate) fn join(
    owner: &str,
    count: usize,
    version: Option<u64>,
    fetched: &std::collections::HashMap<String, Item>,
) -> Result<Vec<u8>, JoinError> {
    let mut out = Vec::with_capacity(count * CHUNK_BYTES);
    for key in keys(owner, count) {
        let Some(chunk) = fetched.get(&key) else { return Err(JoinError::Missing(key)) };
        if let Some(version) = version {
            let found = items::get_u64(chunk, VERSION);
            if found != Some(version) {
                return Err(JoinError::OtherVersion { chunk: key, found });
            }
        }
        match chunk.get(BODY) {
            Some(AttributeValue::B(bytes)) => out.extend_from_slice(bytes.as_ref()),
            _ => return Err(JoinError::NotBinary(key)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::items::{SK, get_s};

    fn by_key(chunks: Vec<Item>) -> HashMap<String, Item> {
        chunks.into_iter().map(|c| (get_s(&c, SK).unwrap().to_owned(), c)).collect()
    }

    #[test]
    fn small_payloads_stay_inline() {
        let mut item = Item::new();
        let chunks = lay_out("s", "M#1", "{}".to_owned(), None, &mut item);
        assert!(chunks.is_empty());
        assert_eq!(body(&item), Some(Body::Inline("{}")));
    }

    #[test]
    fn large_payloads_split_and_join_across_characters() {
        // Three-byte characters, so cuts fall inside them.
        let payload: String = "\u{2713}".repeat(CHUNK_BYTES);
        let mut item = Item::new();
        let chunks = lay_out("s", "H", payload.clone(), Some(4), &mut item);
        assert_eq!(chunks.len(), 3);
        assert_eq!(body(&item), Some(Body::Chunked(3)));
        assert!(chunks.iter().all(|c| items::item_size(c) < 400 * 1024));
        let fetched = by_key(chunks);
        assert_eq!(join("H", 3, Some(4), &fetched).unwrap(), payload.as_bytes());
        assert!(matches!(join("H", 3, Some(5), &fetched), Err(JoinError::OtherVersion { .. })));
        assert!(matches!(join("H", 4, Some(4), &fetched), Err(JoinError::Missing(_))));
    }
}
