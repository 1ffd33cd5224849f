//! The conformance suite every [`Store`] and queue implementation must pass (DESIGN.md
//! section 5): call [`store_suite`] and [`queue_suite`] from an adapter's tests, or the single
//! cases to get one test per case.
//!
//! Sessions are built by the real engine through the engine's test [`Driver`] (create, submit,
//! claim and finish LLM calls, as the dispatcher would), never from hand-made JSON, so the suite
//! stores exactly the shapes the runtime writes; [`Commits`] stores what it made.
//!
//! Store cases expect a store that holds no other session with a wake time before 2001 (an
//! empty one is simplest); each case uses its own session ids and agent ids, so the cases may
//! share one store and run in any order, but a case must not run twice on one store.
//! Queue cases use their own session ids and acknowledge what they receive; they sleep in
//! tokio time, so an in-process queue can be tested under `tokio::test(start_paused = true)`.

// Test support: a failed check must fail the calling test loudly, with the values in view.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;
use turnstone_engine::session::Event;
use turnstone_engine::time::Timestamp;

pub use turnstone_engine::testing::Driver;

use crate::queue::{Delivery, PolledQueue, WakeUp};
use crate::store::{Commit, LoggedEvent, SessionFilter, SessionListing, Store, StoreError};

/// When the suite's sessions live (2026-11-30).
pub const T0: Timestamp = Timestamp(1_796_000_000_000);

/// The `now` of the due-time case: far before [`T0`], so other cases' wake times never count.
const T_DUE: Timestamp = Timestamp(1_000_000_000_000);

/// Committing a [`Driver`]'s uncommitted events to a store, as the runtime does.
#[async_trait::async_trait]
pub trait Commits {
    /// Commits the uncommitted events with the plan's wake time; returns the new version.
    async fn commit(&mut self, store: &dyn Store) -> Result<u64, StoreError>;

    /// Commits the uncommitted events with an explicit wake time; returns the new version.
    async fn commit_waking(
        &mut self,
        store: &dyn Store,
        wake_at: Option<Timestamp>,
    ) -> Result<u64, StoreError>;

    /// Commits and checks the version moved on by one; panics on failure.
    async fn commit_ok(&mut self, store: &dyn Store) -> u64;

    /// Commits the uncommitted events with the plan's wake time, a creating commit counting
    /// toward the owner's `sessions_per_owner` limit.
    async fn commit_within(&mut self, store: &dyn Store, sessions_per_owner: u64) -> Result<u64, StoreError>;
}

#[async_trait::async_trait]
impl Commits for Driver {
    async fn commit(&mut self, store: &dyn Store) -> Result<u64, StoreError> {
        let wake_at = self.wake_at();
        self.commit_waking(store, wake_at).await
    }

    async fn commit_waking(
        &mut self,
        store: &dyn Store,
        wake_at: Option<Timestamp>,
    ) -> Result<u64, StoreError> {
        let commit = Commit {
            session: &self.session,
            events: self.uncommitted(),
            wake_at,
            wake_queued: false,
            sessions_per_owner: None,
        };
        let version = store.commit(self.session.id(), self.version, commit).await?;
        self.committed(version);
        Ok(version)
    }

    async fn commit_within(&mut self, store: &dyn Store, sessions_per_owner: u64) -> Result<u64, StoreError> {
        let commit = Commit {
            session: &self.session,
            events: self.uncommitted(),
            wake_at: self.wake_at(),
            wake_queued: false,
            sessions_per_owner: Some(sessions_per_owner),
        };
        let version = store.commit(self.session.id(), self.version, commit).await?;
        self.committed(version);
        Ok(version)
    }

    async fn commit_ok(&mut self, store: &dyn Store) -> u64 {
        let before = self.version;
        let id = self.session.id().clone();
        let version = self.commit(store).await.unwrap_or_else(|e| panic!("commit of {id} failed: {e}"));
        assert_eq!(version, before + 1, "a commit moves the version on by one ({id})");
        version
    }
}

/// Checks that `store` holds exactly `driver`'s committed session and version.
pub async fn assert_stored(store: &dyn Store, driver: &Driver) {
    let id = &driver.session.id();
    assert!(driver.uncommitted().is_empty(), "assert_stored needs a fully committed driver ({id})");
    let loaded = store.load(id).await.unwrap().unwrap_or_else(|| panic!("session {id} is missing"));
    assert_eq!(loaded.version, driver.version, "version of {id}");
    assert_eq!(loaded.session.tree().len(), driver.session.tree().len(), "message count of {id}");
    assert_eq!(loaded.session, driver.session, "loaded session {id} differs from the committed one");
    // A warm host's load: the head plus the nodes after a prefix it holds.
    let all: Vec<_> = driver.session.tree().shared_nodes().cloned().collect();
    for from in [0, all.len() / 2, all.len()] {
        let (head, rest) = store.load_since(id, from as u64).await.unwrap().expect("the session exists");
        assert_eq!(head.version, driver.version, "load_since version of {id}");
        assert_eq!(head.session.tree().len(), 0, "load_since leaves the nodes out of the session");
        let expected: Vec<_> = all[from..].iter().map(|n| (**n).clone()).collect();
        assert_eq!(rest, expected, "load_since({id}, {from}) nodes");
        let mut session = head.session;
        let mut nodes = all[..from].to_vec();
        nodes.extend(rest.into_iter().map(std::sync::Arc::new));
        session.restore_shared_messages(nodes);
        assert_eq!(session, driver.session, "head + prefix + load_since({from}) rebuild {id}");
    }
}

/// Every logged event of a session, read in pages of `page`.
pub async fn all_events(store: &dyn Store, session_id: &str, page: usize) -> Vec<LoggedEvent> {
    let mut out: Vec<LoggedEvent> = Vec::new();
    loop {
        let after = out.last().map_or(0, |e| e.seq);
        let batch = store.events_after(session_id, after, page).await.unwrap();
        assert!(batch.len() <= page, "events_after returned {} events for a limit of {page}", batch.len());
        if batch.is_empty() {
            return out;
        }
        out.extend(batch);
    }
}

/// Checks that the stored log of `driver`'s session is exactly its events, numbered 1, 2, ...
pub async fn assert_log(store: &dyn Store, driver: &Driver, page: usize) {
    let logged = all_events(store, driver.session.id(), page).await;
    let seqs: Vec<u64> = logged.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=driver.log.len() as u64).collect();
    assert_eq!(seqs, expected, "sequence numbers of {} must be gapless from 1", driver.session.id());
    let events: Vec<&Event> = logged.iter().map(|e| &e.event).collect();
    let expected: Vec<&Event> = driver.log.iter().collect();
    assert!(
        events == expected,
        "the stored log of {} differs from the events committed",
        driver.session.id()
    );
}

/// Runs every store case.
pub async fn store_suite(store: &dyn Store) {
    store_round_trip(store).await;
    store_create_conflicts(store).await;
    store_stale_commit_writes_nothing(store).await;
    store_events_after_pages(store).await;
    store_list_sessions(store).await;
    store_due(store).await;
    store_large_session(store).await;
    store_long_lived_state(store).await;
    store_owner_quota(store).await;
    store_used_ids_are_kept_for_good(store).await;
    store_dispose(store).await;
}

/// A disposed session is gone for good: not loaded, listed, due or logged, no id of it used,
/// and no commit reaches it again, neither one of a writer that loaded it before nor one that
/// would create it anew. Other sessions are untouched; disposing twice answers false.
pub async fn store_dispose(store: &dyn Store) {
    use turnstone_engine::session::UsedId;
    let mut gone = Driver::create("conf-disp", "conf-disp-agent", Some("conf-disp-owner"), false, T0);
    gone.turn("one", "reply one");
    gone.commit_ok(store).await;
    gone.submit("two");
    let call = gone.claim_llm();
    gone.commit_waking(store, Some(T_DUE)).await.unwrap();
    let stale = gone.clone();
    let mut kept = Driver::create("conf-disp-kept", "conf-disp-agent", Some("conf-disp-owner"), false, T0);
    kept.turn("stay", "staying");
    kept.commit_ok(store).await;
    let turn = gone.session.turns().next().map(|t| t.id.clone());

    assert!(store.dispose("conf-disp").await.unwrap(), "an existing session is disposed");
    assert!(store.load("conf-disp").await.unwrap().is_none(), "a disposed session loads as None");
    assert!(store.events_after("conf-disp", 0, 100).await.unwrap().is_empty(), "and has no log");
    let mut probe = vec![UsedId::Call(call.0.clone())];
    probe.extend(turn.map(UsedId::Turn));
    assert!(store.used_ids("conf-disp", &probe).await.unwrap().is_empty(), "and no used ids");
    let owner = SessionFilter { owner: Some("conf-disp-owner".into()), ..SessionFilter::default() };
    let listed: Vec<String> = list_all(store, &owner, 10).await.into_iter().map(|l| l.session_id).collect();
    assert_eq!(listed, ["conf-disp-kept"], "a disposed session is in no listing");
    assert!(!store.due(T_DUE, 100).await.unwrap().contains(&"conf-disp".to_owned()), "nor due");
    assert_stored(store, &kept).await;

    // A writer that loaded the session before it was disposed commits its call's outcome.
    let mut late = stale.clone();
    late.finish_llm(call, "a reply nobody may store");
    match late.commit(store).await {
        Err(StoreError::Conflict { .. }) => {}
        other => panic!("a commit to a disposed session must conflict, got {other:?}"),
    }
    // One that would create the session again.
    let mut again = Driver::create("conf-disp", "conf-disp-agent", None, false, T0.plus_ms(9));
    match again.commit(store).await {
        Err(StoreError::Conflict { expected: 0, .. }) => {}
        other => panic!("creating a disposed session again must conflict, got {other:?}"),
    }
    assert!(store.load("conf-disp").await.unwrap().is_none(), "refused commits write nothing");
    assert!(store.events_after("conf-disp", 0, 100).await.unwrap().is_empty());

    assert!(!store.dispose("conf-disp").await.unwrap(), "disposing again finds nothing");
    assert!(!store.dispose("conf-disp-never").await.unwrap(), "nor does disposing a missing session");
    assert!(store.load("conf-disp-never").await.unwrap().is_none());
}

/// Every turn id and call id a session used is kept, long after its head forgot it; a commit
/// that would use one again is refused with [`StoreError::IdsUsed`] and writes nothing.
pub async fn store_used_ids_are_kept_for_good(store: &dyn Store) {
    store_used_ids_are_kept_for_good_in_batches(store, 64).await;
}

/// [`store_used_ids_are_kept_for_good`], committing the turns that make the head forget
/// `turns_per_commit` at a time (a store whose commits hold a bounded number of items, such
/// as one DynamoDB transaction, cannot take 64 turns at once).
pub async fn store_used_ids_are_kept_for_good_in_batches(store: &dyn Store, turns_per_commit: usize) {
    assert!(turns_per_commit > 0, "at least one turn per commit");
    use turnstone_engine::protocol::{ClientInput, ClientMessageInput, DraftMessage};
    use turnstone_engine::session::{Command, PAST_TURN_IDS, RECENT_TURNS, TurnOrigin, UsedId};
    let submit_first = || Command::Submit {
        input: ClientInput::Message(ClientMessageInput {
            agent_id: "conf-used-agent".into(),
            turn_id: Some("t-first".into()),
            message: DraftMessage::user("the first question"),
            stream: None,
            client: None,
        }),
        queue: false,
        origin: TurnOrigin::Client,
    };
    let mut d = Driver::create("conf-used", "conf-used-agent", None, false, T0);
    d.exec(submit_first());
    let call = d.claim_llm();
    d.finish_llm(call.clone(), "the first answer");
    d.commit_ok(store).await;
    let probe =
        [UsedId::Turn("t-first".into()), UsedId::Turn("t-never".into()), UsedId::Call(call.0.clone())];
    let found = store.used_ids("conf-used", &probe).await.unwrap();
    assert_eq!(found, [probe[0].clone(), probe[2].clone()], "the ids the first commit used");
    assert!(store.used_ids("conf-used-missing", &probe).await.unwrap().is_empty());

    // Enough turns that the head forgets `t-first` (committed in batches, as one host might).
    for i in 0..RECENT_TURNS + PAST_TURN_IDS + 1 {
        d.turn(&format!("question {i}"), &format!("answer {i}"));
        if i % turns_per_commit == turns_per_commit - 1 {
            d.commit_ok(store).await;
        }
    }
    d.commit_ok(store).await;
    d.forget_committed();
    assert!(!d.session.knows_turn(&"t-first".into()), "the head must have forgotten t-first by now");
    let committed = d.clone();

    // The engine alone, not knowing better, starts a new turn under the old id: refused.
    d.exec(submit_first());
    match d.commit(store).await {
        Err(StoreError::IdsUsed { ids, .. }) => assert_eq!(ids, [UsedId::Turn("t-first".into())]),
        other => panic!("a commit using t-first again must be refused with IdsUsed, got {other:?}"),
    }
    let loaded = store.load("conf-used").await.unwrap().unwrap();
    assert_eq!(loaded.version, committed.version, "a refused commit writes nothing");
    assert_eq!(loaded.session, committed.session, "a refused commit writes nothing");
    let log = all_events(store, "conf-used", 1000).await;
    assert_eq!(log.last().map(|e| e.seq), Some(committed.session.events_applied()));
}

/// Create, then load after every commit: the session comes back exactly, messages included.
pub async fn store_round_trip(store: &dyn Store) {
    assert!(store.load("conf-rt-missing").await.unwrap().is_none(), "an unknown session loads as None");

    let mut d = Driver::create("conf-rt-hosted", "conf-rt-agent", Some("conf-rt-owner"), false, T0);
    assert_eq!(d.commit_ok(store).await, 1);
    assert_stored(store, &d).await;
    d.submit("hello");
    d.commit_ok(store).await;
    assert_stored(store, &d).await;
    let call = d.claim_llm();
    assert!(d.wake_at().is_some(), "a claimed call has a deadline");
    d.commit_ok(store).await;
    assert_stored(store, &d).await;
    d.finish_llm(call, "hi there");
    d.commit_ok(store).await;
    assert_stored(store, &d).await;
    assert_eq!(d.session.tree().len(), 2);
    // A whole turn in one commit (several commands' events at once).
    d.turn("and now? ünïcödé ✓ \u{1f980} \"quoted\" \\ \n newline", "done");
    d.commit_ok(store).await;
    assert_stored(store, &d).await;
    assert_eq!(d.session.tree().len(), 4);
    assert_log(store, &d, 1000).await;

    // A session answered by a worker, with its decision in flight.
    let mut w = Driver::create("conf-rt-worker", "conf-rt-agent", None, true, T0);
    w.commit_ok(store).await;
    assert_stored(store, &w).await;
    w.claim_decision();
    w.commit_ok(store).await;
    assert_stored(store, &w).await;
    assert_log(store, &w, 1000).await;
}

/// A second create (expected version 0) of an existing session conflicts and changes nothing;
/// so does a commit naming a version of a session that does not exist.
pub async fn store_create_conflicts(store: &dyn Store) {
    let mut first = Driver::create("conf-cc", "conf-cc-agent", Some("conf-cc-owner"), false, T0);
    first.submit("first");
    first.commit_ok(store).await;

    let mut second =
        Driver::create("conf-cc", "conf-cc-other-agent", Some("someone-else"), false, T0.plus_ms(5));
    match second.commit(store).await {
        Err(StoreError::Conflict { session_id, expected }) => {
            assert_eq!(session_id, "conf-cc");
            assert_eq!(expected, 0);
        }
        other => panic!("a second create must conflict, got {other:?}"),
    }
    assert_stored(store, &first).await;
    assert_log(store, &first, 1000).await;

    let mut ghost = Driver::create("conf-cc-ghost", "conf-cc-agent", None, false, T0);
    ghost.version = 3;
    let err = ghost.commit(store).await.expect_err("a commit to a missing session must conflict");
    assert!(matches!(err, StoreError::Conflict { .. }), "got {err:?}");
    assert!(err.is_retryable());
    assert!(store.load("conf-cc-ghost").await.unwrap().is_none(), "a refused create writes nothing");
    assert!(store.events_after("conf-cc-ghost", 0, 10).await.unwrap().is_empty());
}

/// Two hosts step the same version: the second commit conflicts and writes nothing (no head,
/// no event, no message), whatever version it names.
pub async fn store_stale_commit_writes_nothing(store: &dyn Store) {
    let mut winner = Driver::create("conf-stale", "conf-stale-agent", Some("conf-stale-owner"), false, T0);
    winner.turn("one", "reply one");
    winner.commit_ok(store).await;
    let mut loser = winner.clone();

    winner.submit("the winner's message");
    winner.commit_ok(store).await;
    // The loser records other messages and more events from the same base.
    let call = {
        loser.submit("the loser's message, which must never be stored");
        loser.claim_llm()
    };
    loser.finish_llm(call, "the loser's reply");
    assert!(loser.session.tree().len() > winner.session.tree().len());
    for version in [loser.version, 0, winner.version + 1, winner.version + 7] {
        loser.version = version;
        match loser.commit(store).await {
            Err(StoreError::Conflict { expected, .. }) => assert_eq!(expected, version),
            other => panic!("a commit naming version {version} must conflict, got {other:?}"),
        }
        assert_stored(store, &winner).await;
        assert_log(store, &winner, 1000).await;
    }
    // The winner goes on from its version as if nothing happened.
    let call = winner.claim_llm();
    winner.finish_llm(call, "the winner's reply");
    winner.commit_ok(store).await;
    assert_stored(store, &winner).await;
    assert_log(store, &winner, 1000).await;
}

/// `events_after` pages through the log in order with gapless sequence numbers.
pub async fn store_events_after_pages(store: &dyn Store) {
    let mut d = Driver::create("conf-ev", "conf-ev-agent", None, false, T0);
    d.commit_ok(store).await;
    for i in 0..4 {
        d.submit(&format!("question {i}"));
        d.commit_ok(store).await;
        let call = d.claim_llm();
        d.commit_ok(store).await;
        d.finish_llm(call, &format!("answer {i}"));
        d.commit_ok(store).await;
    }
    let total = d.log.len() as u64;
    assert!(total > 20, "the log should be long enough to page ({total} events)");
    for page in [1, 3, 7, 1000] {
        assert_log(store, &d, page).await;
    }
    let tail = store.events_after("conf-ev", total - 2, 10).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), [total - 1, total]);
    assert_eq!(tail[1].event, d.log[d.log.len() - 1]);
    let middle = store.events_after("conf-ev", 5, 4).await.unwrap();
    assert_eq!(middle.iter().map(|e| e.seq).collect::<Vec<_>>(), [6, 7, 8, 9]);
    assert!(store.events_after("conf-ev", total, 10).await.unwrap().is_empty(), "nothing after the end");
    assert!(store.events_after("conf-ev", total + 50, 10).await.unwrap().is_empty());
    assert!(store.events_after("conf-ev", 0, 0).await.unwrap().is_empty(), "limit 0 returns nothing");
    assert!(store.events_after("conf-ev-missing", 0, 10).await.unwrap().is_empty());
}

/// Pages through a listing with `limit`, checking order and that no session repeats.
pub async fn list_all(store: &dyn Store, filter: &SessionFilter, limit: usize) -> Vec<SessionListing> {
    let mut out: Vec<SessionListing> = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10_000 {
        let page = store.list_sessions(filter, cursor.as_deref(), limit).await.unwrap();
        assert!(page.items.len() <= limit, "a page holds at most the limit");
        out.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => {
                let ids: BTreeSet<&str> = out.iter().map(|s| s.session_id.as_str()).collect();
                assert_eq!(ids.len(), out.len(), "a listing repeats no session: {out:?}");
                assert!(
                    out.windows(2).all(|w| w[0].created_at >= w[1].created_at),
                    "a listing is newest first: {out:?}"
                );
                return out;
            }
        }
    }
    panic!("the listing never ended");
}

/// `list_sessions` filters by agent and owner, newest first, and pages with cursors.
pub async fn store_list_sessions(store: &dyn Store) {
    // (id, agent, owner, created at): two pairs share a creation time, to page across ties.
    let specs: [(&str, &str, Option<&str>, i64); 7] = [
        ("conf-ls-1", "conf-ls-agent-a", Some("conf-ls-owner-1"), 1_000),
        ("conf-ls-2", "conf-ls-agent-a", Some("conf-ls-owner-2"), 2_000),
        ("conf-ls-3", "conf-ls-agent-b", Some("conf-ls-owner-1"), 3_000),
        ("conf-ls-4", "conf-ls-agent-a", None, 4_000),
        ("conf-ls-5", "conf-ls-agent-a", Some("conf-ls-owner-1"), 5_000),
        ("conf-ls-6", "conf-ls-agent-a", Some("conf-ls-owner-1"), 5_000),
        ("conf-ls-7", "conf-ls-agent-b", Some("conf-ls-owner-2"), 5_000),
    ];
    let mut versions = BTreeMap::new();
    for (id, agent, owner, at) in specs {
        let mut d = Driver::create(id, agent, owner, false, T0.plus_ms(at as u64));
        d.commit_ok(store).await;
        if id == "conf-ls-2" {
            d.turn("bump the version", "ok");
            d.commit_ok(store).await;
        }
        versions.insert(id, d.version);
    }
    let expect = |agent: Option<&str>, owner: Option<&str>| -> BTreeSet<&str> {
        specs
            .iter()
            .filter(|(_, a, o, _)| agent.is_none_or(|x| x == *a) && owner.is_none_or(|x| Some(x) == *o))
            .map(|(id, ..)| *id)
            .collect()
    };
    let cases = [
        (Some("conf-ls-agent-a"), None),
        (Some("conf-ls-agent-b"), None),
        (None, Some("conf-ls-owner-1")),
        (None, Some("conf-ls-owner-2")),
        (Some("conf-ls-agent-a"), Some("conf-ls-owner-1")),
        (Some("conf-ls-agent-b"), Some("conf-ls-owner-1")),
        (Some("conf-ls-agent-none"), None),
    ];
    for (agent, owner) in cases {
        let filter = SessionFilter { agent_id: agent.map(str::to_owned), owner: owner.map(str::to_owned) };
        for limit in [1, 2, 3, 100] {
            let listed = list_all(store, &filter, limit).await;
            let ids: BTreeSet<&str> = listed.iter().map(|s| s.session_id.as_str()).collect();
            assert_eq!(ids, expect(agent, owner), "listing {filter:?} with limit {limit}");
            for s in &listed {
                let (_, agent_id, owner, at) = specs.iter().find(|(id, ..)| *id == s.session_id).unwrap();
                assert_eq!(s.agent_id, *agent_id);
                assert_eq!(s.owner.as_deref(), *owner);
                assert_eq!(s.created_at, T0.plus_ms(*at as u64), "created_at is the session's own");
                assert_eq!(s.version, versions[s.session_id.as_str()]);
            }
        }
    }
    // Unfiltered: every one of ours, exactly once, in order (other sessions may be listed too).
    let all = list_all(store, &SessionFilter::default(), 2).await;
    let ours: Vec<&str> =
        all.iter().map(|s| s.session_id.as_str()).filter(|id| id.starts_with("conf-ls-")).collect();
    assert_eq!(ours.iter().copied().collect::<BTreeSet<_>>(), expect(None, None));
    let first = store.list_sessions(&SessionFilter::default(), None, 1).await.unwrap();
    assert_eq!(first.items.len(), 1);
    assert!(first.next_cursor.is_some(), "more than one session means a next page");
    // A cursor this store never handed out is refused.
    for garbage in ["%%% not a cursor %%%", "", "\u{0}"] {
        match store.list_sessions(&SessionFilter::default(), Some(garbage), 10).await {
            Err(StoreError::InvalidCursor) => {}
            other => panic!("cursor {garbage:?} must be refused, got {other:?}"),
        }
    }
}

/// `due` finds exactly the sessions whose wake time passed, oldest first; a commit without a
/// wake time takes a session out, one with an earlier time moves it.
pub async fn store_due(store: &dyn Store) {
    let t = T_DUE;
    let back = |ms: u64| Timestamp(t.0 - ms as i64);
    let wakes: [(&str, Option<Timestamp>); 5] = [
        ("conf-due-1", Some(back(10))),
        ("conf-due-2", Some(t.plus_ms(10))),
        ("conf-due-3", Some(back(5))),
        ("conf-due-4", None),
        ("conf-due-5", Some(t)),
    ];
    let mut drivers = BTreeMap::new();
    for (id, wake) in wakes {
        let mut d = Driver::create(id, "conf-due-agent", None, false, back(100_000));
        d.commit_waking(store, wake).await.unwrap();
        drivers.insert(id, d);
    }
    assert_eq!(store.due(t, 10).await.unwrap(), ["conf-due-1", "conf-due-3", "conf-due-5"]);
    assert_eq!(store.due(t, 2).await.unwrap(), ["conf-due-1", "conf-due-3"]);
    assert_eq!(store.due(t, 0).await.unwrap(), Vec::<String>::new());
    assert_eq!(store.due(back(11), 10).await.unwrap(), Vec::<String>::new());
    assert_eq!(store.due(back(10), 10).await.unwrap(), ["conf-due-1"], "due at exactly the wake time");

    let d1 = drivers.get_mut("conf-due-1").unwrap();
    d1.submit("handled");
    d1.commit_waking(store, None).await.unwrap();
    assert_eq!(store.due(t, 10).await.unwrap(), ["conf-due-3", "conf-due-5"]);

    let d2 = drivers.get_mut("conf-due-2").unwrap();
    d2.submit("now sooner");
    d2.commit_waking(store, Some(back(7))).await.unwrap();
    assert_eq!(store.due(t, 10).await.unwrap(), ["conf-due-2", "conf-due-3", "conf-due-5"]);

    let d3 = drivers.get_mut("conf-due-3").unwrap();
    d3.submit("later");
    d3.commit_waking(store, Some(t.plus_ms(1_000))).await.unwrap();
    assert_eq!(store.due(t, 10).await.unwrap(), ["conf-due-2", "conf-due-5"]);
    assert_eq!(store.due(t.plus_ms(1_000), 10).await.unwrap(), ["conf-due-2", "conf-due-5", "conf-due-3"]);
    for d in drivers.values() {
        assert_stored(store, d).await;
    }
}

/// Hundreds of messages and a 300 KB message round-trip, through load and the log.
pub async fn store_large_session(store: &dyn Store) {
    let mut d = Driver::create("conf-large", "conf-large-agent", Some("conf-large-owner"), false, T0);
    // A host may allow messages this large (`[limits] message_bytes`); stores must keep them.
    d.limits.message_bytes = 1024 * 1024;
    d.commit_ok(store).await;
    let big: String = (0..300 * 1024).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    for i in 0..150 {
        if i == 75 {
            d.turn(&big, "that was long");
        } else {
            d.turn(&format!("message {i}"), &format!("reply {i}"));
        }
        d.commit_ok(store).await;
    }
    assert_eq!(d.session.tree().len(), 300);
    assert_stored(store, &d).await;
    assert_log(store, &d, 500).await;
    let loaded = store.load("conf-large").await.unwrap().unwrap();
    assert!(
        loaded.session.tree().nodes().any(|n| n.message.content_text() == big),
        "the 300 KB message comes back whole"
    );
}

/// A worker that keeps 12 KB of changing state writes it 1,000 times: the head holds only the
/// current version, so every commit, and the head, stay the size they were at the start (and
/// a DynamoDB checkpoint fits its transaction); the store keeps where each version applies
/// from, the log keeps every value (what a head move reads back), and replay rebuilds it all.
pub async fn store_long_lived_state(store: &dyn Store) {
    use turnstone_engine::protocol::{Action, DecisionResponse, DoneAction};
    use turnstone_engine::session::VersionKind;
    const WRITES: usize = 1000;
    let mut d = Driver::create("conf-state", "conf-state-agent", Some("conf-state-owner"), true, T0);
    d.accept();
    d.commit_ok(store).await;
    let state = |i: usize| serde_json::json!({"turn": i, "memory": format!("{i:06}").repeat(2048)});
    let mut sizes = Vec::new();
    for i in 0..WRITES {
        d.submit(&format!("message {i}"));
        let done = Action::Done(DoneAction::default());
        d.answer(DecisionResponse { state: Some(state(i)), actions: Some(vec![done]), ..Default::default() });
        let events = serde_json::to_string(d.uncommitted()).unwrap().len();
        let head = serde_json::to_string(&d.session).unwrap().len();
        sizes.push((events, head));
        if i % 250 == 0 || i + 1 == WRITES {
            eprintln!("state write {i}: {events} bytes of events, a {head}-byte head");
        }
        d.commit_ok(store).await;
    }
    let (first, last) = (sizes[0], sizes[WRITES - 1]);
    let flat = |a: usize, b: usize| (b as f64) <= 1.3 * a as f64;
    assert!(flat(first.0, last.0), "a commit's events grew from {} to {} bytes", first.0, last.0);
    assert!(flat(first.1, last.1), "the head grew from {} to {} bytes", first.1, last.1);
    assert!(last.1 < 2 * 12 * 1024 + 8 * 1024, "the head holds one state, not {} bytes", last.1);
    // `state.written` holds the state; the answer in `decision.resolved` leaves it out.
    assert!(last.0 < 12 * 1024 + 4 * 1024, "a commit logs the state once, not in {} bytes", last.0);
    assert_stored(store, &d).await;
    assert_eq!(d.session.current_state(), state(WRITES - 1));
    // Every version's entry points at the event that wrote it, with its anchor.
    let loaded = store.load("conf-state").await.unwrap().unwrap().session;
    // The worker's first answer wrote the agent config (its session.start proposal) too.
    let entries: Vec<_> =
        loaded.version_entries().into_iter().filter(|e| e.kind == VersionKind::State).collect();
    assert_eq!(entries.len(), WRITES);
    for (i, entry) in entries.iter().enumerate().step_by(97) {
        let logged = store.events_after("conf-state", entry.seq - 1, 1).await.unwrap();
        match logged.first().map(|l| (l.seq, &l.event)) {
            Some((seq, Event::StateWritten { anchor, value })) if seq == entry.seq => {
                assert_eq!((anchor, value), (&entry.anchor, &state(i)), "version {i}");
            }
            other => panic!("version {i} points at {other:?}"),
        }
    }
    turnstone_engine::testing::check_invariants(&d.session, &d.log);
}

/// `sessions_per_owner` is the store's to enforce, in the creating commit itself: the creation
/// past the limit is refused with `OwnerFull` and writes nothing; other owners, and commits
/// that do not create, are not held back; a disposed session frees its place.
pub async fn store_owner_quota(store: &dyn Store) {
    const OWNER: &str = "conf-quota-owner";
    let create = |i: usize, owner: &str| {
        Driver::create(&format!("conf-quota-{owner}-{i}"), "conf-quota-agent", Some(owner), false, T0)
    };
    let mut made = Vec::new();
    for i in 0..3 {
        let mut d = create(i, OWNER);
        d.commit_within(store, 3).await.unwrap_or_else(|e| panic!("session {i} of 3: {e}"));
        made.push(d);
    }
    let mut fourth = create(3, OWNER);
    match fourth.commit_within(store, 3).await {
        Err(StoreError::OwnerFull { owner, limit }) => assert_eq!((owner.as_str(), limit), (OWNER, 3)),
        other => panic!("the fourth session of an owner limited to 3: {other:?}"),
    }
    assert!(store.load(fourth.session.id()).await.unwrap().is_none(), "a refused creation writes nothing");
    let mut other = create(0, "conf-quota-other");
    other.commit_within(store, 3).await.expect("another owner has room");
    // A commit that does not create is not counted, whatever the limit.
    made[0].turn("hello", "hi");
    made[0].commit_within(store, 1).await.expect("a later commit of an existing session");
    assert!(store.dispose(made[1].session.id()).await.unwrap());
    fourth.commit_within(store, 3).await.expect("a disposed session frees its place");
    // Disposing again frees nothing more.
    assert!(!store.dispose(made[1].session.id()).await.unwrap());
    let mut fifth = create(4, OWNER);
    assert!(matches!(fifth.commit_within(store, 3).await, Err(StoreError::OwnerFull { .. })));
}

/// Creations of one owner at once, past its limit: exactly the limit's worth land (the count
/// is the store's, in each creating commit, not a listing read before it).
pub async fn store_owner_quota_under_concurrency(store: &dyn Store) {
    const OWNER: &str = "conf-quota-race";
    let mut drivers: Vec<Driver> = (0..8)
        .map(|i| Driver::create(&format!("conf-quota-race-{i}"), "conf-quota-agent", Some(OWNER), false, T0))
        .collect();
    let results = futures_util::future::join_all(drivers.iter_mut().map(|d| d.commit_within(store, 5))).await;
    let landed = results.iter().filter(|r| r.is_ok()).count();
    let full = results.iter().filter(|r| matches!(r, Err(StoreError::OwnerFull { .. }))).count();
    assert_eq!((landed, full), (5, 3), "{results:?}");
}

/// How a queue is expected to behave, for [`queue_suite`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSuite {
    /// The queue's visibility timeout: an unacknowledged delivery reappears after it.
    pub visibility_timeout: Duration,
    /// A delay to test with (at least the backend's delay granularity).
    pub delay: Duration,
    /// Whether wake-ups for one session coalesce into one delivery (in-process: yes; SQS: no).
    pub coalesces: bool,
}

/// Runs every queue case.
pub async fn queue_suite(queue: &dyn PolledQueue, suite: QueueSuite) {
    queue_delay_respected(queue, suite).await;
    queue_duplicate_sends(queue, suite).await;
    queue_redelivers_without_ack(queue, suite).await;
    queue_no_redelivery_after_ack(queue, suite).await;
}

fn wake(session_id: &str, reason: &str) -> WakeUp {
    WakeUp::new(session_id, reason)
}

/// The first delivery for `session_id` within `within` (others are left unacknowledged).
pub async fn first_delivery(queue: &dyn PolledQueue, session_id: &str, within: Duration) -> Option<Delivery> {
    let deadline = Instant::now() + within;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        let batch = queue.receive(10, deadline - now).await.unwrap();
        if let Some(d) = batch.into_iter().find(|d| d.wake_up.session_id == session_id) {
            return Some(d);
        }
    }
}

/// Every delivery for `session_id` within `within`.
pub async fn deliveries(queue: &dyn PolledQueue, session_id: &str, within: Duration) -> Vec<Delivery> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return out;
        }
        let batch = queue.receive(10, deadline - now).await.unwrap();
        out.extend(batch.into_iter().filter(|d| d.wake_up.session_id == session_id));
    }
}

/// A delayed wake-up is not delivered before its delay, and is delivered after it; an
/// undelayed one at once.
pub async fn queue_delay_respected(queue: &dyn PolledQueue, suite: QueueSuite) {
    let sent = Instant::now();
    queue.send(wake("conf-q-delay", "timer"), suite.delay).await.unwrap();
    // Received at or before `sent.elapsed()` right after: early only if that is still short of
    // the delay (a loaded backend's send may itself take most of it).
    let delivery = match first_delivery(queue, "conf-q-delay", suite.delay / 2).await {
        Some(delivery) => delivery,
        None => first_delivery(queue, "conf-q-delay", suite.delay * 4)
            .await
            .expect("a delayed wake-up must arrive after its delay"),
    };
    assert!(sent.elapsed() >= suite.delay, "delivered after {:?}, before {:?}", sent.elapsed(), suite.delay);
    assert_eq!(delivery.wake_up, wake("conf-q-delay", "timer"));
    queue.ack(&delivery).await.unwrap();

    queue.send(wake("conf-q-now", "input"), Duration::ZERO).await.unwrap();
    let delivery = first_delivery(queue, "conf-q-now", suite.delay).await.expect("an undelayed wake-up");
    queue.ack(&delivery).await.unwrap();
}

/// Sending twice delivers at least once; a coalescing queue delivers once, at the earliest due
/// time, and keeps nothing back for later.
pub async fn queue_duplicate_sends(queue: &dyn PolledQueue, suite: QueueSuite) {
    let window = suite.visibility_timeout / 2;
    queue.send(wake("conf-q-dup", "input"), Duration::ZERO).await.unwrap();
    queue.send(wake("conf-q-dup", "timer"), Duration::ZERO).await.unwrap();
    let got = deliveries(queue, "conf-q-dup", window).await;
    assert!(!got.is_empty(), "a sent wake-up must be delivered");
    if suite.coalesces {
        assert_eq!(got.len(), 1, "two sends for one session coalesce: {got:?}");
    }
    for d in &got {
        queue.ack(d).await.unwrap();
    }
    assert!(
        first_delivery(queue, "conf-q-dup", suite.visibility_timeout * 2).await.is_none(),
        "nothing comes back after every delivery was acknowledged"
    );
    if !suite.coalesces {
        return;
    }
    // Later, then sooner: delivered at the sooner time, once.
    queue.send(wake("conf-q-early", "timer"), suite.delay * 4).await.unwrap();
    queue.send(wake("conf-q-early", "input"), Duration::ZERO).await.unwrap();
    let d = first_delivery(queue, "conf-q-early", suite.delay).await.expect("the earliest due time wins");
    assert_eq!(d.wake_up.reason, "input");
    queue.ack(&d).await.unwrap();
    assert!(first_delivery(queue, "conf-q-early", suite.delay * 6).await.is_none(), "coalesced away");
    // Sooner, then later: the later send changes nothing.
    queue.send(wake("conf-q-late", "input"), Duration::ZERO).await.unwrap();
    queue.send(wake("conf-q-late", "timer"), suite.delay * 4).await.unwrap();
    let d = first_delivery(queue, "conf-q-late", suite.delay).await.expect("the earlier send stands");
    assert_eq!(d.wake_up.reason, "input");
    queue.ack(&d).await.unwrap();
    assert!(first_delivery(queue, "conf-q-late", suite.delay * 6).await.is_none(), "coalesced away");
}

/// A received delivery that is not acknowledged is invisible for the visibility timeout, then
/// delivered again; acknowledging the redelivery ends it.
pub async fn queue_redelivers_without_ack(queue: &dyn PolledQueue, suite: QueueSuite) {
    let vt = suite.visibility_timeout;
    queue.send(wake("conf-q-redeliver", "input"), Duration::ZERO).await.unwrap();
    let first = first_delivery(queue, "conf-q-redeliver", suite.delay).await.expect("delivered");
    let received = Instant::now();
    assert!(first_delivery(queue, "conf-q-redeliver", vt / 2).await.is_none(), "invisible while in flight");
    let again =
        first_delivery(queue, "conf-q-redeliver", vt * 2).await.expect("redelivered after the timeout");
    assert!(received.elapsed() >= vt, "redelivered after {:?}, before {vt:?}", received.elapsed());
    assert_eq!(again.wake_up, first.wake_up);
    queue.ack(&again).await.unwrap();
    assert!(first_delivery(queue, "conf-q-redeliver", vt * 2).await.is_none(), "acknowledged: gone");
}

/// An acknowledged delivery never comes back.
pub async fn queue_no_redelivery_after_ack(queue: &dyn PolledQueue, suite: QueueSuite) {
    queue.send(wake("conf-q-ack", "input"), Duration::ZERO).await.unwrap();
    let d = first_delivery(queue, "conf-q-ack", suite.delay).await.expect("delivered");
    queue.ack(&d).await.unwrap();
    assert!(
        first_delivery(queue, "conf-q-ack", suite.visibility_timeout * 2).await.is_none(),
        "an acknowledged delivery must not come back"
    );
}
