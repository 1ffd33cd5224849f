//! The persistence port: where sessions, their event logs and their messages live.
//!
//! A session is kept as a head (the snapshot of open work, without messages and without the
//! declared agent config), an append-only event log, and its immutable message nodes. One
//! commit is atomic and conditioned on the version it continues, so concurrent hosts never
//! both win a step. (SQLite rewrites the head with every commit; DynamoDB appends the events
//! and rewrites the head at checkpoints: either way a load gives the state after the last
//! commit.)

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use turnstone_engine::protocol::TreeNode;
use turnstone_engine::session::{Event, Session, UsedId, VersionEntry, VersionKind};
use turnstone_engine::time::Timestamp;

/// A session as loaded: its state (messages restored) and the version to commit against.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub session: Session,
    /// The head's version; the next commit must name it.
    pub version: u64,
}

/// One atomic write: new events, the head after them, and when work is next due.
#[derive(Debug, Clone)]
pub struct Commit<'a> {
    /// The session after the events (its snapshot becomes the new head).
    pub session: &'a Session,
    /// The new events, in order; their sequence numbers continue the log
    /// (the first is `session.events_applied() - events.len() + 1`).
    pub events: &'a [Event],
    /// When the session next has timed work (None: nothing timed).
    pub wake_at: Option<Timestamp>,
    /// Whether a wake-up for `wake_at` (or sooner) is already on the queue or held by the run
    /// making this commit. [`Store::due`] must find every session whose latest commit has a
    /// wake time that no wake-up covers; a store may leave covered ones out of its index.
    pub wake_queued: bool,
    /// For a commit that creates a session with an owner: the most sessions that owner may
    /// have (`None`: no limit). Every store counts each owner's sessions (created, less
    /// disposed) in the creating commit itself, so the count is exact however many hosts
    /// create at once, and refuses the one past the limit with [`StoreError::OwnerFull`].
    pub sessions_per_owner: Option<u64>,
}

impl Commit<'_> {
    /// The owner whose session count this commit raises: the session's, when it creates it.
    pub fn counted_owner(&self, expected_version: u64) -> Option<&str> {
        let owner = self.session.init()?.identity.id.as_deref()?;
        (expected_version == 0 && !owner.is_empty()).then_some(owner)
    }

    /// The turn and call ids these events use first: the store keeps them, and refuses the
    /// commit if any was used before.
    pub fn first_used(&self) -> Vec<UsedId> {
        UsedId::first_used_by(self.events)
    }

    /// The sequence number of the first new event.
    pub fn first_seq(&self) -> u64 {
        self.session.events_applied() + 1 - self.events.len() as u64
    }

    /// The message nodes these events record, with their positions in the tree.
    pub fn new_messages(&self) -> Vec<(u64, TreeNode)> {
        let total = self.session.tree().len() as u64;
        let recorded: Vec<TreeNode> = self
            .events
            .iter()
            .filter_map(|e| match e {
                Event::MessageRecorded { message, parent_id } => {
                    Some(TreeNode { message: message.clone(), parent_id: parent_id.clone() })
                }
                _ => None,
            })
            .collect();
        let first = total - recorded.len() as u64;
        recorded.into_iter().enumerate().map(|(i, n)| (first + i as u64, n)).collect()
    }
}

impl Commit<'_> {
    /// Where the versions of the state and agent config these events write apply from: the
    /// store keeps them apart from the snapshot, which holds only the values the head needs,
    /// and puts them back on load ([`Session::restore_versions`]).
    pub fn new_versions(&self) -> Vec<VersionEntry> {
        let first = self.first_seq();
        let entry = |kind, seq, anchor: &Option<_>| VersionEntry { kind, seq, anchor: anchor.clone() };
        (first..)
            .zip(self.events)
            .filter_map(|(seq, event)| match event {
                Event::StateWritten { anchor, .. } => Some(entry(VersionKind::State, seq, anchor)),
                Event::AgentWritten { anchor, .. } => Some(entry(VersionKind::Agent, seq, anchor)),
                _ => None,
            })
            .collect()
    }
}

/// A logged event with its sequence number (1-based, gapless per session). Generic so a
/// client may read the event leniently (as JSON); stores hold engine [`Event`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", schemars(rename = "LoggedEvent"))]
pub struct LoggedEvent<E = Event> {
    /// Position in the session's log.
    pub seq: u64,
    pub event: E,
}

/// A session in a listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct SessionListing {
    pub session_id: String,
    pub agent_id: String,
    /// The identity that created it, if any.
    pub owner: Option<String>,
    /// The head's version (one per commit).
    pub version: u64,
    pub created_at: Timestamp,
    /// When its head was last written.
    pub updated_at: Timestamp,
}

/// Which sessions to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFilter {
    /// Only this agent's.
    pub agent_id: Option<String>,
    /// Only this owner's.
    pub owner: Option<String>,
}

/// Where a listing page ended: the last session on it, in the newest-first order
/// `(created_at DESC, session_id DESC)` every store lists in. Handed to callers opaque, as
/// `v1.<created_at>.<session id as hex>`; the next page starts strictly after it. Anything
/// else is refused as [`StoreError::InvalidCursor`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListingCursor {
    /// The last item's creation time.
    pub created_at: Timestamp,
    /// The last item's session id.
    pub session_id: String,
}

const CURSOR_PREFIX: &str = "v1.";

impl ListingCursor {
    /// The cursor after `listing`.
    pub fn after(listing: &SessionListing) -> Self {
        ListingCursor { created_at: listing.created_at, session_id: listing.session_id.clone() }
    }

    /// The cursor as handed to callers.
    pub fn encode(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(CURSOR_PREFIX.len() + 21 + self.session_id.len() * 2);
        out.push_str(CURSOR_PREFIX);
        let _ = write!(out, "{}.", self.created_at.0);
        for byte in self.session_id.bytes() {
            let _ = write!(out, "{byte:02x}");
        }
        out
    }

    /// A caller's cursor read back, if any: one this code did not write is refused.
    pub fn decode(text: Option<&str>) -> Result<Option<ListingCursor>, StoreError> {
        text.map(|text| Self::parse(text).ok_or(StoreError::InvalidCursor)).transpose()
    }

    fn parse(text: &str) -> Option<ListingCursor> {
        let rest = text.strip_prefix(CURSOR_PREFIX)?;
        let (created_at, hex) = rest.split_once('.')?;
        if created_at.is_empty() || hex.is_empty() || hex.len() % 2 != 0 {
            return None;
        }
        let created_at: i64 = created_at.parse().ok()?;
        let bytes = hex
            .as_bytes()
            .chunks(2)
            .map(|pair| std::str::from_utf8(pair).ok().and_then(|p| u8::from_str_radix(p, 16).ok()))
            .collect::<Option<Vec<u8>>>()?;
        let session_id = String::from_utf8(bytes).ok()?;
        Some(ListingCursor { created_at: Timestamp(created_at), session_id })
    }
}

/// A page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass back to get the next page; None at the end.
    pub next_cursor: Option<String>,
}

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The head moved on since it was loaded: reload, re-handle, re-commit.
    #[error("session {session_id} changed concurrently (expected version {expected})")]
    Conflict {
        session_id: String,
        /// The version the commit named.
        expected: u64,
    },
    /// The commit uses turn or call ids the session used before (its head may have forgotten
    /// them; the store never does): nothing was written. Handle the command again knowing them
    /// (`Ctx::used`).
    #[error("session {session_id} used {} before", display_ids(.ids))]
    IdsUsed { session_id: String, ids: Vec<UsedId> },
    /// The creating commit's owner has [`Commit::sessions_per_owner`] sessions already:
    /// nothing was written.
    #[error("owner {owner} has {limit} sessions, the most it may have")]
    OwnerFull { owner: String, limit: u64 },
    /// A cursor that this store did not hand out.
    #[error("invalid cursor")]
    InvalidCursor,
    /// Stored data could not be read back.
    #[error("stored data for session {session_id} is corrupt: {message}")]
    Corrupt {
        session_id: String,
        /// What is wrong.
        message: String,
    },
    /// The backend failed.
    #[error("store backend failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl StoreError {
    /// Whether retrying the same operation may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Conflict { .. } | StoreError::IdsUsed { .. } | StoreError::Backend(_))
    }
}

/// Where sessions are kept.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Loads a session with its messages, or None if it does not exist.
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError>;

    /// Loads a session's head with only its message nodes from position `from` on (returned
    /// apart, the session's tree left without nodes): a host that holds the first `from` nodes
    /// re-reads only what is new. The default loads everything and slices.
    async fn load_since(
        &self,
        session_id: &str,
        from: u64,
    ) -> Result<Option<(Loaded, Vec<TreeNode>)>, StoreError> {
        let Some(mut loaded) = self.load(session_id).await? else { return Ok(None) };
        let skip = usize::try_from(from).unwrap_or(usize::MAX);
        let nodes: Vec<TreeNode> = loaded.session.tree().nodes().skip(skip).cloned().collect();
        loaded.session.restore_messages(Vec::new());
        Ok(Some((loaded, nodes)))
    }

    /// Which of `ids` session `session_id` has used (every turn and call id a commit ever
    /// used first is kept, for good).
    async fn used_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError>;

    /// Writes a commit atomically if the head is still at `expected_version` (0: the session
    /// must not exist yet) and none of the ids it uses first ([`Commit::first_used`]) was used
    /// before ([`StoreError::IdsUsed`]). Returns the new version.
    async fn commit(
        &self,
        session_id: &str,
        expected_version: u64,
        commit: Commit<'_>,
    ) -> Result<u64, StoreError>;

    /// Up to `limit` logged events after `after_seq`, in order.
    async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>, StoreError>;

    /// Sessions matching `filter`, newest first, paged.
    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError>;

    /// Up to `limit` sessions whose wake time is at or before `now`: at least every one
    /// whose latest commit's wake time no queued wake-up covers ([`Commit::wake_queued`]).
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<String>, StoreError>;

    /// Disposes session `session_id` for good: its head, log, messages and used ids are
    /// deleted. Afterwards it loads as None, is in no listing and not due, has no events and
    /// no used ids, and every commit to it is refused with [`StoreError::Conflict`], a
    /// commit that would create it again included: a disposed id is never used again (a
    /// writer that loaded the session before could otherwise write into a new session of
    /// the same name). Returns whether there was a session to dispose; disposing again does
    /// nothing more.
    async fn dispose(&self, session_id: &str) -> Result<bool, StoreError>;

    /// Whether no other process writes to this store while this handle is open (the
    /// embedded store holds a lock on its file). A host whose one app is then the only
    /// writer serves loads from what it committed itself.
    fn exclusive(&self) -> bool {
        false
    }
}

impl Commit<'_> {
    /// Whether the commit is about `session_id` and agrees with itself; what is wrong if not
    /// (every store checks this before writing).
    pub fn check(&self, session_id: &str) -> Result<(), String> {
        let session = self.session;
        if *session.id() != *session_id {
            return Err(format!("the commit carries session {:?}", session.id()));
        }
        let event_count = self.events.len() as u64;
        if event_count > session.events_applied() {
            return Err(format!(
                "{event_count} new events but the session has applied only {}",
                session.events_applied()
            ));
        }
        let recorded = self.events.iter().filter(|e| matches!(e, Event::MessageRecorded { .. })).count();
        if recorded > session.tree().len() {
            return Err(format!(
                "{recorded} recorded messages but the session's tree holds {}",
                session.tree().len()
            ));
        }
        Ok(())
    }
}

/// `turn t1, call c2`.
fn display_ids(ids: &[UsedId]) -> String {
    ids.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips() {
        let c = ListingCursor { created_at: Timestamp(-5), session_id: "s-1/ü#x".into() };
        assert_eq!(ListingCursor::decode(Some(&c.encode())).unwrap(), Some(c));
        assert_eq!(ListingCursor::decode(None).unwrap(), None);
    }

    #[test]
    fn a_cursor_this_code_did_not_write_is_refused() {
        for text in ["", "v1.", "v1.12", "v1.12.", "v1.x.6162", "v1.1.616", "v1.1.zz", "v2.1.61", "v1.1.ff"] {
            assert!(matches!(ListingCursor::decode(Some(text)), Err(StoreError::InvalidCursor)), "{text:?}");
        }
    }
}
