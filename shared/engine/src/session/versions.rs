//! Branch-scoped versions of the agent state and config (PROTOCOL-NOTES 46): every write is a
//! version anchored at the head it was written at, and a decision sees the newest version whose
//! anchor is on its active path.
//!
//! A head of constant size: the snapshot holds only the values the next step needs (the
//! version current on the active path, and the agent configs open calls refer to). Where each
//! version applies from and which event wrote it ([`VersionEntry`], a few dozen bytes) a store
//! keeps apart, written once like message nodes, and puts back on load
//! ([`super::Session::restore_versions`]). The value of every version is in the log already, in
//! the event that wrote it: when a head move (an edit, a regeneration) makes a version current
//! that the head let go, the command is refused with [`super::Rejection::Recall`] naming the
//! events to read, and handled again with them in [`super::Ctx::recalled`]; it then writes
//! `state.restored` / `agent.restored`, so replaying the log rebuilds the same head.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::event::Event;
use super::records::Versioned;
use super::tree::Tree;
use crate::ids::MessageId;
use crate::protocol::AgentConfig;

/// Which versioned value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionKind {
    State,
    Agent,
}

impl VersionKind {
    /// `state` or `agent`, as stores key it.
    pub fn as_str(self) -> &'static str {
        match self {
            VersionKind::State => "state",
            VersionKind::Agent => "agent",
        }
    }

    /// The kind a store wrote with [`VersionKind::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "state" => Some(VersionKind::State),
            "agent" => Some(VersionKind::Agent),
            _ => None,
        }
    }
}

/// Where one version applies from and the event that wrote it: what a store keeps per version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionEntry {
    pub kind: VersionKind,
    /// The log position of its `state.written` / `agent.written` event.
    pub seq: u64,
    /// The head it was written at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<MessageId>,
}

/// Values the store read back from the log for a command ([`super::Rejection::Recall`]), by
/// log position.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recalled {
    states: BTreeMap<u64, Value>,
    agents: BTreeMap<u64, AgentConfig>,
}

impl Recalled {
    /// Keeps the value `event` (logged at `seq`) wrote; any other event is ignored, and so is
    /// `false` returned.
    pub fn insert(&mut self, seq: u64, event: &Event) -> bool {
        match event {
            Event::StateWritten { value, .. } => self.states.insert(seq, value.clone()).is_none(),
            Event::AgentWritten { config, .. } => self.agents.insert(seq, config.clone()).is_none(),
            _ => false,
        }
    }

    /// Whether the value written at `seq` is here.
    pub fn has(&self, seq: u64) -> bool {
        self.states.contains_key(&seq) || self.agents.contains_key(&seq)
    }

    pub(crate) fn state(&self, seq: u64) -> Option<&Value> {
        self.states.get(&seq)
    }

    pub(crate) fn agent(&self, seq: u64) -> Option<&AgentConfig> {
        self.agents.get(&seq)
    }
}

/// Where a version applies from and which event wrote it (`seq` 0: written before versions were
/// kept apart; its value stays in the head for good).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Written {
    anchor: Option<MessageId>,
    seq: u64,
}

/// The versions of one kind: every one's entry, and the values the head holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Versions<T> {
    /// Every version, oldest first (the position is its number). Not in the snapshot: complete
    /// once the store put its entries back (`restore`), or when built by replaying the log.
    written: imbl::Vector<Written>,
    /// How many versions were written.
    count: u32,
    /// The values the head holds, by version number.
    held: BTreeMap<u32, T>,
}

impl<T> Default for Versions<T> {
    fn default() -> Self {
        Versions { written: imbl::Vector::new(), count: 0, held: BTreeMap::new() }
    }
}

impl<T: Clone> Versions<T> {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Records a version written at `anchor` by the event at `seq`; it is current.
    pub fn push(&mut self, anchor: Option<MessageId>, seq: u64, value: T) {
        self.written.push_back(Written { anchor, seq });
        self.held.insert(self.count, value);
        self.count += 1;
    }

    /// Holds version `index`'s value again (a `*.restored` event).
    pub fn hold(&mut self, index: u32, value: T) {
        if index < self.count {
            self.held.insert(index, value);
        }
    }

    /// The number of the version current on the active path: the newest whose anchor is on it.
    pub fn current(&self, tree: &Tree) -> Option<u32> {
        // Newest first; each check walks up from the head by jump pointers, and the newest
        // usually applies.
        let at = self.written.iter().rev().position(|w| tree.is_on_active_path(w.anchor.as_ref()))?;
        u32::try_from(self.written.len() - 1 - at).ok()
    }

    /// The value of the current version, if the head holds it (it always does between
    /// commands).
    pub fn current_value(&self, tree: &Tree) -> Option<&T> {
        self.current(tree).and_then(|i| self.held.get(&i))
    }

    /// Version `index`'s value, if the head holds it.
    pub fn value(&self, index: u32) -> Option<&T> {
        self.held.get(&index)
    }

    /// The current version, when the head does not hold its value: its number and the log
    /// position of the event that wrote it.
    pub fn missing(&self, tree: &Tree) -> Option<(u32, u64)> {
        let index = self.current(tree)?;
        if self.held.contains_key(&index) {
            return None;
        }
        let seq = self.written.get(usize::try_from(index).ok()?)?.seq;
        Some((index, seq))
    }

    /// Lets go of every value but the current version's, the legacy ones and those `keep`
    /// names.
    pub fn settle(&mut self, tree: &Tree, keep: impl Fn(u32) -> bool) {
        if self.held.is_empty() {
            return;
        }
        let current = self.current(tree);
        let written = &self.written;
        self.held.retain(|&i, _| {
            Some(i) == current || keep(i) || written.get(i as usize).is_none_or(|w| w.seq == 0)
        });
    }

    /// How many entries a store keeps ([`Versions::entries`]): every version but the legacy
    /// ones, which come first (counting them, not the kept ones, costs no walk of a long
    /// session's versions on each commit).
    pub fn kept_apart(&self) -> usize {
        self.written.len() - self.written.iter().take_while(|w| w.seq == 0).count()
    }

    /// [`Versions::entries`], newest first.
    pub fn entries_newest_first(&self, kind: VersionKind) -> impl Iterator<Item = VersionEntry> + '_ {
        self.written.iter().rev().take_while(|w| w.seq > 0).map(move |w| VersionEntry {
            kind,
            seq: w.seq,
            anchor: w.anchor.clone(),
        })
    }

    /// The entries a store keeps (legacy ones, whose values the head holds, are not its).
    pub fn entries(&self, kind: VersionKind) -> impl Iterator<Item = VersionEntry> + '_ {
        self.written.iter().filter(|w| w.seq > 0).map(move |w| VersionEntry {
            kind,
            seq: w.seq,
            anchor: w.anchor.clone(),
        })
    }

    /// Puts back the entries a store kept (`entries` in log order, this kind's only) after the
    /// snapshot was loaded: with the legacy versions the snapshot holds, they must make up
    /// every version it counts.
    pub fn restore(&mut self, kind: VersionKind, entries: Vec<VersionEntry>) -> Result<(), String> {
        let legacy = self.written.iter().take_while(|w| w.seq == 0).count();
        let mut written: imbl::Vector<Written> = self.written.iter().take(legacy).cloned().collect();
        written.extend(entries.into_iter().map(|e| Written { anchor: e.anchor, seq: e.seq }));
        if written.len() != self.count as usize {
            return Err(format!(
                "the head counts {} {} versions; the store keeps {} and the head {legacy}",
                self.count,
                kind.as_str(),
                written.len() - legacy
            ));
        }
        self.written = written;
        Ok(())
    }
}

/// The snapshot's form: the count and the held values. A snapshot written before versions were
/// kept apart is a list of every version, value and anchor: those stay held, as legacy.
#[derive(Serialize, Deserialize)]
#[serde(untagged, bound(deserialize = "T: Deserialize<'de>"))]
enum VersionsData<T> {
    Kept {
        count: u32,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        held: Vec<Held<T>>,
    },
    Whole(Vec<Versioned<T>>),
}

#[derive(Serialize, Deserialize)]
struct Held<T> {
    index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    anchor: Option<MessageId>,
    /// 0: legacy, held for good.
    seq: u64,
    value: T,
}

impl<T: Clone + Serialize> Serialize for Versions<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let held = self
            .held
            .iter()
            .map(|(&index, value)| {
                let written = self.written.get(index as usize);
                Held {
                    index,
                    anchor: written.and_then(|w| w.anchor.clone()),
                    seq: written.map_or(0, |w| w.seq),
                    value: value.clone(),
                }
            })
            .collect();
        VersionsData::Kept { count: self.count, held }.serialize(s)
    }
}

impl<'de, T: Clone + Deserialize<'de>> Deserialize<'de> for Versions<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match VersionsData::deserialize(d)? {
            VersionsData::Whole(all) => {
                let count = u32::try_from(all.len()).map_err(serde::de::Error::custom)?;
                let mut versions = Versions { count, ..Versions::default() };
                for (i, v) in (0..count).zip(all) {
                    versions.written.push_back(Written { anchor: v.anchor, seq: 0 });
                    versions.held.insert(i, v.value);
                }
                versions
            }
            VersionsData::Kept { count, held } => {
                let mut versions = Versions { count, ..Versions::default() };
                for h in held {
                    if h.index >= count {
                        return Err(serde::de::Error::custom(format!("held version {} of {count}", h.index)));
                    }
                    // The entries a store restores follow the legacy ones, which are first.
                    if h.seq == 0 {
                        if h.index as usize != versions.written.len() {
                            return Err(serde::de::Error::custom("legacy versions out of order"));
                        }
                        versions.written.push_back(Written { anchor: h.anchor, seq: 0 });
                    }
                    versions.held.insert(h.index, h.value);
                }
                versions
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ids::IdMinter;
    use crate::protocol::DraftMessage;

    /// A linear tree `a`, `b`, `c` with the head at `c`.
    fn linear() -> Tree {
        let mut tree = Tree::default();
        let drafts: Vec<DraftMessage> = ["a", "b", "c"].map(|id| DraftMessage::user(id).with_id(id)).into();
        let reconciled = tree.reconcile(&drafts, &mut IdMinter::new(1));
        for (message, parent) in reconciled.new_nodes {
            tree.record(message, parent);
        }
        tree
    }

    fn anchor(id: &str) -> Option<MessageId> {
        Some(id.into())
    }

    #[test]
    fn only_the_current_version_and_what_is_kept_stay_held() {
        let mut tree = linear();
        let mut versions = Versions::default();
        for (i, at) in ["a", "b", "c"].into_iter().enumerate() {
            versions.push(anchor(at), i as u64 + 1, json!(i));
            versions.settle(&tree, |index| index == 0);
        }
        assert_eq!(versions.held.keys().copied().collect::<Vec<_>>(), [0, 2]);
        assert_eq!(versions.current_value(&tree), Some(&json!(2)));
        // The head moves back to `b`: version 1 is current, and the head let it go.
        tree.move_head(anchor("b"));
        assert_eq!(versions.missing(&tree), Some((1, 2)));
        versions.hold(1, json!(1));
        versions.settle(&tree, |_| false);
        assert_eq!(versions.held.keys().copied().collect::<Vec<_>>(), [1]);
        assert_eq!(versions.current_value(&tree), Some(&json!(1)));
    }

    #[test]
    fn the_snapshot_holds_the_values_and_the_store_the_entries() {
        let tree = linear();
        let mut versions = Versions::default();
        versions.push(anchor("a"), 4, json!("old"));
        versions.push(anchor("c"), 9, json!("new"));
        versions.settle(&tree, |_| false);
        let text = serde_json::to_string(&versions).unwrap();
        assert!(!text.contains("old"), "{text}");
        let mut back: Versions<Value> = serde_json::from_str(&text).unwrap();
        let entries: Vec<VersionEntry> = versions.entries(VersionKind::State).collect();
        assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 9]);
        // One entry short: what does not add up is said, and nothing is restored.
        let error = back.restore(VersionKind::State, entries[1..].to_vec()).unwrap_err();
        assert!(error.contains("the head counts 2 state versions; the store keeps 1"), "{error}");
        back.restore(VersionKind::State, entries).unwrap();
        assert_eq!(back, versions);
    }

    #[test]
    fn a_head_written_before_keeps_every_version_it_holds() {
        let tree = linear();
        let old = json!([{"anchor": "a", "value": 1}, {"anchor": "b", "value": 2}]);
        let mut versions: Versions<Value> = serde_json::from_value(old).unwrap();
        // Its versions need no entries from the store; later ones do.
        versions.restore(VersionKind::State, Vec::new()).unwrap();
        versions.push(anchor("c"), 30, json!(3));
        versions.settle(&tree, |_| false);
        assert_eq!(versions.held.len(), 3, "legacy versions stay held");
        let text = serde_json::to_string(&versions).unwrap();
        let mut back: Versions<Value> = serde_json::from_str(&text).unwrap();
        back.restore(VersionKind::State, versions.entries(VersionKind::State).collect()).unwrap();
        assert_eq!(back, versions);
        assert_eq!(back.current_value(&tree), Some(&json!(3)));
    }
}
