//! One `serverSeq` per client behind API Gateway, and what a `reconnect` reads back from it.
//!
//! Clients take `serverSeq` for one counter: VS Code (and the reference client) reconnect with
//! `lastSeenServerSeq` = the highest number they saw on any channel. Behind API Gateway every
//! function posts, so the counter is an item of the client's in the table (`K#<client id>`,
//! [`Registry::number`]), started at the clock's microseconds (above what any connection of
//! the client was given before, as the local host's [`super::sequence`]): each post batch
//! takes its numbers with one write, which also records, per connection and chat, where the
//! batch's actions fell (a [`ChatMark`]: first and last number, the chat's positions before
//! and after them, and the last number of the chat's mark before). Envelopes are built with
//! the chat's log-derived positions ([`super::position`]) and numbered here just before they
//! are posted or answered.
//!
//! What a client's session channels were sent is recorded under the client too (the session
//! snapshot it subscribed from, then each action; [`Told`]), since no log holds it.
//!
//! On `reconnect` the client's ledger turns `lastSeenServerSeq` into a position in each chat
//! (that after the latest mark it saw whole, or before the one it saw nothing of), and rebuilds
//! each session channel as the client held it; otherwise the answer is snapshots. Posts of two
//! functions to one connection may cross on the way: a client that drops between them may
//! report a number past one it never got. That window is one post's time; the chat's mark says
//! so only when the later post is the chat's own.

use std::collections::HashMap;

use ahp::reducers::apply_action_to_session;
use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::state::{SessionState, Snapshot, SnapshotState};
use turnstone_engine::ids::SessionId;

use super::AhpHost;
use super::push::Pushes;
use super::registry::{ChatMark, ClientLedger, RegistryError, Told};
use super::sessions::{self, session_id};

/// The key a connection's numbers are counted under: its client's id, or before it
/// introduced itself the connection's own.
pub(crate) fn numbering_key(client_id: &str, connection: &str) -> String {
    if client_id.is_empty() { format!("~{connection}") } else { client_id.to_owned() }
}

/// Where a counter starts: the clock in microseconds, below 2^53 (JavaScript's exact integers).
fn floor(host: &AhpHost) -> u64 {
    u64::try_from(host.app.now().0).unwrap_or(0).saturating_mul(1000)
}

impl Pushes {
    /// Numbers `envelopes` for client `key`, in order: a chat envelope's `server_seq` holds its
    /// position, which its chat's mark records (`befores`: each chat's position before them,
    /// where known, past which the chat's last mark must not end); a session channel envelope is
    /// recorded as told. `false` when a chat's last mark ends elsewhere: another function's
    /// push to the client crossed this one, and nothing is numbered.
    pub(crate) async fn number_envelopes(
        &self,
        (key, connection): (&str, &str),
        envelopes: &mut [ActionEnvelope],
        befores: &HashMap<SessionId, u64>,
    ) -> Result<bool, RegistryError> {
        let Some(host) = self.host() else { return Ok(true) };
        if envelopes.is_empty() {
            return Ok(true);
        }
        let mut marks: Vec<ChatMark> = Vec::new();
        for (i, envelope) in envelopes.iter().enumerate() {
            let Some(chat) = session_id(&envelope.channel, "ahp-chat") else { continue };
            let i = i as u64;
            match marks.iter_mut().find(|m| m.chat == chat) {
                Some(mark) => {
                    mark.last = i;
                    mark.after = envelope.server_seq;
                }
                None => marks.push(ChatMark {
                    before: befores.get(&chat).copied(),
                    chat,
                    first: i,
                    last: i,
                    after: envelope.server_seq,
                }),
            }
        }
        let count = envelopes.len() as u64;
        let Some(first) = self.registry.number(key, connection, count, floor(host), &marks).await? else {
            return Ok(false);
        };
        for (i, envelope) in envelopes.iter_mut().enumerate() {
            envelope.server_seq = first + i as u64;
            if let Some((session, _)) = sessions::session_of(host, &envelope.channel) {
                self.keep_told((key, connection), envelope.server_seq, session, false, &envelope.action)
                    .await?;
            }
        }
        Ok(true)
    }

    /// Numbers the chat snapshots of an answer for client `key` (`fromSeq` becomes its
    /// number, the chat's mark the snapshot's position) and records its session snapshots.
    pub(crate) async fn number_snapshots(
        &self,
        (key, connection): (&str, &str),
        snapshots: &mut [Snapshot],
    ) -> Result<(), RegistryError> {
        let Some(host) = self.host() else { return Ok(()) };
        let numbered: Vec<usize> = (0..snapshots.len())
            .filter(|&i| matches!(snapshots[i].state, SnapshotState::Chat(_) | SnapshotState::Session(_)))
            .collect();
        if numbered.is_empty() {
            return Ok(());
        }
        let marks: Vec<ChatMark> = numbered
            .iter()
            .enumerate()
            .filter_map(|(n, &i)| {
                let chat = session_id(&snapshots[i].resource, "ahp-chat")?;
                let at = u64::try_from(snapshots[i].from_seq).unwrap_or(0);
                Some(ChatMark { chat, first: n as u64, last: n as u64, before: None, after: at })
            })
            .collect();
        // Marks without a `before` always take.
        let Some(first) =
            self.registry.number(key, connection, numbered.len() as u64, floor(host), &marks).await?
        else {
            return Ok(());
        };
        for (n, &i) in numbered.iter().enumerate() {
            let seq = first + n as u64;
            let snapshot = &mut snapshots[i];
            match &snapshot.state {
                SnapshotState::Chat(_) => snapshot.from_seq = i64::try_from(seq).unwrap_or(i64::MAX),
                SnapshotState::Session(state) => {
                    let Some((session, _)) = sessions::session_of(host, &snapshot.resource) else { continue };
                    self.keep_told((key, connection), seq, session, true, &held_copy(state)).await?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Pushes {
    /// Records what client `key` was told on `connection`, numbered `seq`, on session
    /// `session`'s channel: its snapshot, or an action.
    async fn keep_told(
        &self,
        (key, connection): (&str, &str),
        seq: u64,
        session: SessionId,
        snapshot: bool,
        body: &impl serde::Serialize,
    ) -> Result<(), RegistryError> {
        let body = serde_json::to_string(body)
            .map_err(|e| RegistryError(format!("what a session channel was told cannot be recorded: {e}")))?;
        let told = Told { seq, connection: connection.to_owned(), session, snapshot, body };
        self.registry.record_told(key, &told).await
    }
}

/// A session as a client's ledger keeps it: without its active clients' tools (they can be
/// large; a reconnect then sets each active client again, which a client takes as the same).
fn held_copy(state: &SessionState) -> SessionState {
    let mut held = state.clone();
    for client in held.active_clients.iter_mut() {
        client.tools.clear();
    }
    held
}

/// The connection a client that saw numbers up to `seen` was on: of those it was sent numbers
/// on, the one whose latest number is the highest at or below `seen`.
pub(crate) fn previous_connection(ledger: &ClientLedger, seen: u64) -> Option<&str> {
    let marks = ledger.marks.iter().map(|(connection, mark, _)| (connection.as_str(), mark.last));
    let told = ledger.told.iter().map(|t| (t.connection.as_str(), t.seq));
    marks.chain(told).filter(|(_, last)| *last <= seen).max_by_key(|(_, last)| *last).map(|(c, _)| c)
}

/// Where in chat `chat` a client that saw numbers up to `seen` on `connection` stands: after
/// the chat's latest mark if it saw that whole, before it if it saw none of it but the mark
/// before; `None` otherwise (a snapshot then).
pub(crate) fn position(ledger: &ClientLedger, connection: &str, chat: &SessionId, seen: u64) -> Option<u64> {
    let (_, mark, previous) = ledger.marks.iter().find(|(c, m, _)| c == connection && &m.chat == chat)?;
    if seen >= mark.last {
        Some(mark.after)
    } else if seen < mark.first && seen >= *previous {
        mark.before
    } else {
        None
    }
}

/// Session `session`'s channel as a client that saw numbers up to `seen` on `connection` holds
/// it: the latest snapshot it was sent there, and the actions after it through `seen`; `None`
/// when none is recorded.
pub(crate) fn held_session(
    ledger: &ClientLedger,
    connection: &str,
    session: &SessionId,
    seen: u64,
) -> Option<SessionState> {
    let told: Vec<&Told> =
        ledger.told.iter().filter(|t| &t.session == session && t.connection == connection).collect();
    let start = told.iter().rposition(|t| t.snapshot)?;
    let mut held: SessionState = serde_json::from_str(&told[start].body).ok()?;
    for later in told[start + 1..].iter().filter(|t| t.seq <= seen) {
        let action: StateAction = serde_json::from_str(&later.body).ok()?;
        // The reducer's verdict on an action the host told is the client's too.
        let _ = apply_action_to_session(&mut held, &action);
    }
    Some(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(chat: &str, first: u64, last: u64, before: Option<u64>, after: u64) -> ChatMark {
        ChatMark { chat: SessionId::from(chat), first, last, before, after }
    }

    #[test]
    fn a_number_maps_to_the_position_the_client_saw() {
        let ledger = ClientLedger {
            last: 20,
            marks: vec![
                ("w1".to_owned(), mark("a", 10, 12, Some(100), 130), 7),
                ("w1".to_owned(), mark("b", 14, 14, None, 500), 0),
                ("w0".to_owned(), mark("a", 3, 4, Some(90), 95), 0),
            ],
            told: Vec::new(),
        };
        assert_eq!(previous_connection(&ledger, 20), Some("w1"));
        assert_eq!(previous_connection(&ledger, 5), Some("w0"), "the one whose numbers it saw");
        let a = SessionId::from("a");
        assert_eq!(position(&ledger, "w1", &a, 12), Some(130), "the whole mark seen");
        assert_eq!(position(&ledger, "w1", &a, 20), Some(130));
        assert_eq!(position(&ledger, "w1", &a, 8), Some(100), "none of it, all of the one before");
        assert_eq!(position(&ledger, "w1", &a, 11), None, "part of it");
        assert_eq!(position(&ledger, "w1", &a, 6), None, "not even the one before");
        assert_eq!(position(&ledger, "w0", &a, 5), Some(95), "each connection its own marks");
        let b = SessionId::from("b");
        assert_eq!(position(&ledger, "w1", &b, 13), None, "before a snapshot: unknown");
        assert_eq!(position(&ledger, "w1", &SessionId::from("c"), 20), None);
    }
}
