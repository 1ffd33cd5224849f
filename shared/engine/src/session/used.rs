//! Idempotency without a horizon. The head remembers only recent turn and call ids (it holds
//! open work, not history), so the store keeps every turn id and call id a session ever used,
//! written in the commit that first uses it and conditioned on its absence. A commit that
//! would use an id again is refused; the runtime then handles the command again with the
//! store's answer in [`crate::session::Ctx::used`], and the engine treats those ids as known:
//! an old turn id names its turn (nothing is written), a reused call id is a no-op.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::event::Event;
use crate::ids::{CallId, TurnId};

/// A turn id or call id a session has used.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum UsedId {
    Turn(TurnId),
    Call(CallId),
}

impl UsedId {
    /// `turn` or `call`: the kind, as stores key it.
    pub fn kind(&self) -> &'static str {
        match self {
            UsedId::Turn(_) => "turn",
            UsedId::Call(_) => "call",
        }
    }

    /// The id itself.
    pub fn id(&self) -> &str {
        match self {
            UsedId::Turn(id) => id,
            UsedId::Call(id) => id,
        }
    }

    /// The id of `kind` (`turn` or `call`); `None` for another kind.
    pub fn from_parts(kind: &str, id: &str) -> Option<UsedId> {
        match kind {
            "turn" => Some(UsedId::Turn(id.into())),
            "call" => Some(UsedId::Call(id.into())),
            _ => None,
        }
    }

    /// The ids `events` use for the first time: each new turn (and turn alias) and each new
    /// call. A store writes them with the events, conditioned on their absence.
    pub fn first_used_by(events: &[Event]) -> Vec<UsedId> {
        events
            .iter()
            .filter_map(|event| match event {
                Event::TurnStarted { turn } | Event::TurnQueued { turn } => {
                    Some(UsedId::Turn(turn.id.clone()))
                }
                Event::TurnAliased { alias, .. } => Some(UsedId::Turn(alias.clone())),
                Event::CallCreated { call } => Some(UsedId::Call(call.id.clone())),
                _ => None,
            })
            .collect()
    }
}

impl std::fmt::Display for UsedId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind(), self.id())
    }
}

/// Ids the store says a session used before, beyond what its head remembers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsedIds(BTreeSet<UsedId>);

impl UsedIds {
    /// Whether turn id `id` was used.
    pub fn has_turn(&self, id: &TurnId) -> bool {
        self.0.contains(&UsedId::Turn(id.clone()))
    }

    /// Whether call id `id` was used.
    pub fn has_call(&self, id: &CallId) -> bool {
        self.0.contains(&UsedId::Call(id.clone()))
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<UsedId> for UsedIds {
    fn from_iter<I: IntoIterator<Item = UsedId>>(ids: I) -> Self {
        UsedIds(ids.into_iter().collect())
    }
}

impl Extend<UsedId> for UsedIds {
    fn extend<I: IntoIterator<Item = UsedId>>(&mut self, ids: I) {
        self.0.extend(ids);
    }
}
