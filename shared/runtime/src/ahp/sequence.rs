//! One `serverSeq` per host: what a local host's clients see, and what `reconnect` reads back.
//!
//! Clients take `serverSeq` for one counter of the host: VS Code (and the reference client)
//! reconnect with `lastSeenServerSeq` = the highest number they saw on any channel. So every
//! envelope a connection is sent is numbered from the host's [`Sequence`] as it is written to
//! the socket, in the order it goes out, whatever its channel. The number starts from the wall
//! clock in microseconds when the host starts (and never goes back below a number a client
//! brings), so it keeps growing across restarts, and stays below 2^53, an integer JavaScript
//! holds exactly.
//!
//! What a number means for a channel is kept per connection, in its [`Ledger`]: for each chat,
//! the numbers sent on it with the position each had in the chat's own log-derived numbering
//! ([`super::position`]). On `reconnect` with the same client id, the ledger of the client's
//! last connection turns `lastSeenServerSeq` into a position in each chat it subscribes to:
//! that of the last action numbered at or below it (or the snapshot's), and the actions after it
//! are replayed from the log. A client this host does not remember (restarted, or forgotten:
//! ledgers are bounded) gets snapshots.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ahp::reducers::apply_action_to_session;
use ahp_types::actions::StateAction;
use ahp_types::state::SessionState;
use turnstone_engine::ids::SessionId;
use turnstone_engine::time::Timestamp;

use super::registry::ClientLedger;
use super::sessions::{Spelling, UriStyle};
use crate::auth::Caller;
use crate::memo::Memo;

/// Numbers sent per chat whose positions a ledger keeps (older ones: a reconnect from before
/// them gets snapshots).
const MARKS_PER_CHANNEL: usize = 4096;

/// The host's `serverSeq`.
#[derive(Debug)]
pub(crate) struct Sequence {
    last: AtomicU64,
}

impl Sequence {
    /// A sequence that starts at `now` (the host's clock) in microseconds: above what a host
    /// that ran before sent, unless it sent more than a million numbers a second.
    pub fn starting_at(now: Timestamp) -> Self {
        let micros = u64::try_from(now.0).unwrap_or(0).saturating_mul(1000);
        Sequence { last: AtomicU64::new(micros) }
    }
}

impl Sequence {
    /// The next number.
    pub fn next(&self) -> u64 {
        self.last.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The last number given (an `initialize`'s `serverSeq`).
    pub fn current(&self) -> u64 {
        self.last.load(Ordering::SeqCst)
    }

    /// Makes every later number larger than `seen`, a number a client says it saw.
    pub fn pass(&self, seen: u64) {
        self.last.fetch_max(seen, Ordering::SeqCst);
    }
}

/// What one connection was sent, per chat: `(serverSeq, position)` pairs, oldest first; and
/// how its client spells session URIs, which a `reconnect` (unlike an `initialize`) does not
/// say, with the sessions it named.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    channels: Mutex<HashMap<String, VecDeque<(u64, u64)>>>,
    spelling: Mutex<Spelling>,
    /// Each session channel as the client holds it: its snapshot, then every session action
    /// it was sent ([`super::session_replay`]).
    sessions: Mutex<HashMap<String, SessionState>>,
}

impl Ledger {
    /// Session channel `channel` is held as `state` (a snapshot the client was given).
    pub fn hold_session(&self, channel: &str, state: SessionState) {
        self.held().insert(channel.to_owned(), state);
    }

    /// `action` went out on `channel`: a session channel's held state takes it.
    pub fn sent(&self, channel: &str, action: &StateAction) {
        if let Some(state) = self.held().get_mut(channel) {
            apply_action_to_session(state, action);
        }
    }

    /// Session channel `channel` as the client holds it, if this ledger knows.
    pub fn held_session(&self, channel: &str) -> Option<SessionState> {
        self.held().get(channel).cloned()
    }

    fn held(&self) -> MutexGuard<'_, HashMap<String, SessionState>> {
        // What a client holds is a hint for a replay; a poisoned map still holds usable ones.
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How the client is told of sessions, a copy (for work that awaits).
    pub fn spelling(&self) -> Spelling {
        self.spelled().clone()
    }

    /// `f` of how the client is told of sessions, read in place (a root channel's task reads it
    /// for each notification).
    pub fn with_spelling<R>(&self, f: impl FnOnce(&Spelling) -> R) -> R {
        f(&self.spelled())
    }

    /// Takes the client's style, and the names of sessions `previous` (its connection before
    /// this one) learnt; `style` None: the style `previous` had.
    pub fn set_spelling(&self, style: Option<UriStyle>, previous: Option<&Ledger>) {
        let before = previous.map(Ledger::spelling).unwrap_or_default();
        let mut spelling = self.spelled();
        spelling.style = style.unwrap_or(before.style);
        spelling.learn(&before);
    }

    /// The client named session `id` `uri`.
    pub fn name_session(&self, id: &SessionId, uri: &str) {
        self.spelled().name(id, uri);
    }

    fn spelled(&self) -> MutexGuard<'_, Spelling> {
        // Names are a courtesy to the client; a poisoned lock still holds usable ones.
        self.spelling.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `server_seq` went out on `channel` for the action (or snapshot) at
    /// `position`.
    pub fn mark(&self, channel: &str, server_seq: u64, position: u64) {
        let mut channels = self.lock();
        let marks = channels.entry(channel.to_owned()).or_default();
        marks.push_back((server_seq, position));
        if marks.len() > MARKS_PER_CHANNEL {
            marks.pop_front();
        }
    }

    /// The position in `channel` of a client that saw everything up to `last_seen`: that of
    /// the last action (or snapshot) numbered at or below it; `None` when nothing this ledger
    /// still holds was numbered so (the client's knowledge of the chat predates it).
    pub fn position_at(&self, channel: &str, last_seen: u64) -> Option<u64> {
        let channels = self.lock();
        let marks = channels.get(channel)?;
        let at = marks.partition_point(|(seq, _)| *seq <= last_seen);
        at.checked_sub(1).and_then(|i| marks.get(i)).map(|(_, position)| *position)
    }

    /// Takes over what `from` (the client's connection before this one) was sent on
    /// `channel`: numbers the client may have seen, whose positions a later reconnect needs.
    pub fn adopt(&self, from: &Ledger, channel: &str) {
        if std::ptr::eq(self, from) {
            return;
        }
        let marks = from.lock().get(channel).cloned().unwrap_or_default();
        let mut channels = self.lock();
        let mine = channels.entry(channel.to_owned()).or_default();
        let mut all: VecDeque<(u64, u64)> = marks;
        all.extend(mine.drain(..));
        while all.len() > MARKS_PER_CHANNEL {
            all.pop_front();
        }
        *mine = all;
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, VecDeque<(u64, u64)>>> {
        // Marks are hints for a replay; a poisoned map still holds usable ones.
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How a connection numbers what it sends ([`super`]'s transports differ): from the host's
/// sequence, marking its ledger (the local host), or by each chat's log-derived position alone
/// (API Gateway's, whose connection outlives any one process: envelopes carry positions until
/// the client's recorded counter numbers them as they go out, [`super::ledger`]; `reconnect`
/// reads a number back through the client's recorded `ledger`).
pub(crate) enum Numbering<'a> {
    Host { sequence: &'a Sequence, ledger: Arc<Ledger>, previous: Option<Arc<Ledger>> },
    Recorded { ledger: Option<ClientLedger> },
}

impl Numbering<'_> {
    /// Numbers chat snapshots (and marks them); other channels carry no actions (`fromSeq` 0).
    pub fn snapshots(&self, snapshots: &mut [ahp_types::state::Snapshot]) {
        let Numbering::Host { sequence, ledger, .. } = self else { return };
        for snapshot in snapshots {
            match &snapshot.state {
                ahp_types::state::SnapshotState::Chat(_) => {
                    let seq = sequence.next();
                    ledger.mark(&snapshot.resource, seq, u64::try_from(snapshot.from_seq).unwrap_or(0));
                    snapshot.from_seq = i64::try_from(seq).unwrap_or(i64::MAX);
                }
                ahp_types::state::SnapshotState::Session(state) => {
                    ledger.hold_session(&snapshot.resource, (**state).clone());
                }
                _ => {}
            }
        }
    }

    /// Numbers replayed actions (and marks them), in order.
    pub fn envelopes(&self, envelopes: &mut [ahp_types::actions::ActionEnvelope]) {
        let Numbering::Host { sequence, ledger, .. } = self else { return };
        for envelope in envelopes {
            let seq = sequence.next();
            ledger.mark(&envelope.channel, seq, envelope.server_seq);
            envelope.server_seq = seq;
        }
    }

    /// An `initialize`'s `serverSeq`.
    pub fn current(&self) -> u64 {
        match self {
            Numbering::Host { sequence, .. } => sequence.current(),
            Numbering::Recorded { .. } => 0,
        }
    }
}

/// The ledger of each client's last connection, by the caller and its client id (a client
/// id is the client's to choose: another caller's is another client); bounded ([`Memo`]).
#[derive(Debug, Default)]
pub(crate) struct Ledgers {
    ledgers: Memo<(Option<String>, String), Arc<Ledger>>,
}

impl Ledgers {
    /// Makes `ledger` client `client_id`'s of `caller`, and gives back the one it had.
    pub fn register(&self, caller: &Caller, client_id: &str, ledger: Arc<Ledger>) -> Option<Arc<Ledger>> {
        let mut previous = None;
        self.ledgers.update((caller.key(), client_id.to_owned()), |known| {
            previous = known.cloned();
            ledger
        });
        previous
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_grow_from_the_clock_and_past_what_a_client_saw() {
        let sequence = Sequence::starting_at(Timestamp(1_796_400_000_000));
        let first = sequence.next();
        assert_eq!(first, 1_796_400_000_000_001, "microseconds since 1970, and one");
        assert!(first < 1 << 53, "a number JavaScript holds exactly");
        assert_eq!(sequence.next(), first + 1);
        sequence.pass(first + 1000);
        assert_eq!(sequence.next(), first + 1001);
        sequence.pass(5);
        assert_eq!(sequence.current(), first + 1001, "never back");
    }

    #[test]
    fn a_ledger_turns_the_highest_number_seen_into_a_position_per_chat() {
        let ledger = Ledger::default();
        ledger.mark("ahp-chat:/a", 100, 7 << 20);
        ledger.mark("ahp-chat:/b", 101, 3 << 20);
        ledger.mark("ahp-chat:/a", 102, (8 << 20) + 1);
        ledger.mark("ahp-chat:/b", 103, (4 << 20) + 1);
        assert_eq!(ledger.position_at("ahp-chat:/a", 102), Some((8 << 20) + 1));
        // Saw 102 (a's), not 103 (b's): b stands at its snapshot.
        assert_eq!(ledger.position_at("ahp-chat:/b", 102), Some(3 << 20));
        assert_eq!(ledger.position_at("ahp-chat:/a", 101), Some(7 << 20));
        assert_eq!(ledger.position_at("ahp-chat:/a", 99), None, "before the snapshot");
        assert_eq!(ledger.position_at("ahp-chat:/c", 200), None, "never sent");
    }

    #[test]
    fn a_clients_ledger_is_its_callers_own() {
        let ledgers = Ledgers::default();
        let ana = Caller::Admin { name: "ana".to_owned() };
        let first = Arc::new(Ledger::default());
        assert!(ledgers.register(&ana, "w1", Arc::clone(&first)).is_none());
        let back = ledgers.register(&ana, "w1", Arc::new(Ledger::default())).unwrap();
        assert!(Arc::ptr_eq(&back, &first));
        assert!(ledgers.register(&Caller::Anyone, "w1", Arc::new(Ledger::default())).is_none());
    }
}
