//! The message tree: every recorded message, the active branch, and reconcile.
//!
//! Reconcile reads a list of messages as "how the conversation now reads, root to head":
//! messages with known ids continue the branch; the first message with no id or an unknown id
//! starts the news, and from there every message is written as a new node (an edit is a new
//! message, so a fork rewrites its whole tail). A resent copy of a recorded tool result (same
//! `tool_call_id`, no id) folds onto the recorded node instead of forking.

use std::collections::HashSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ids::{CallId, IdMinter, MessageId};
use crate::protocol::{DraftMessage, Message, MessageTree, Role, TreeNode};

/// Every recorded message of a session, with the branch structure and the head.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(from = "TreeData", into = "TreeData")]
pub struct Tree {
    /// Persistent (structurally shared) collections: every command works on a draft, a clone
    /// of the session, and cloning these costs O(1) whatever the transcript's length (plain
    /// vectors and maps made each step O(n)).
    nodes: imbl::Vector<Arc<TreeNode>>,
    head: Option<MessageId>,
    /// Node id -> index in `nodes`; derived, rebuilt on load.
    index: imbl::HashMap<Arc<str>, usize>,
    /// Depth of each node (a root is 0); derived, so ancestry checks stop at the right level.
    depths: imbl::Vector<u32>,
}

/// A tree serializes as its head only: messages are immutable and a store keeps them apart
/// from the session's snapshot (written once, from `message.recorded` events), so a commit
/// never re-serializes the transcript. [`Tree::restore`] puts them back after a load.
#[derive(Serialize, Deserialize)]
struct TreeData {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    head: Option<MessageId>,
}

impl From<TreeData> for Tree {
    fn from(data: TreeData) -> Self {
        Tree {
            nodes: imbl::Vector::new(),
            head: data.head,
            index: imbl::HashMap::new(),
            depths: imbl::Vector::new(),
        }
    }
}

impl From<Tree> for TreeData {
    fn from(tree: Tree) -> Self {
        TreeData { head: tree.head }
    }
}

impl PartialEq for Tree {
    fn eq(&self, other: &Self) -> bool {
        self.nodes == other.nodes && self.head == other.head
    }
}

/// What reconciling a list of messages against the tree would write.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconciled {
    /// New nodes, parents first: `(message, parent_id)`.
    pub new_nodes: Vec<(Message, Option<MessageId>)>,
    /// Where the head ends up.
    pub head: Option<MessageId>,
    /// Index in the input of the first message that is news (= input length when none is).
    pub new_from: usize,
}

impl Reconciled {
    /// Whether applying this changes nothing.
    pub fn is_noop(&self, tree: &Tree) -> bool {
        self.new_nodes.is_empty() && (self.head == tree.head || tree.is_on_active_path(self.head.as_ref()))
    }
}

impl Tree {
    /// Puts back the recorded nodes (parents first) after the session's snapshot was loaded.
    pub fn restore(&mut self, nodes: Vec<TreeNode>) {
        self.restore_shared(nodes.into_iter().map(Arc::new).collect());
    }

    /// [`Tree::restore`] from shared nodes (e.g. a host's cache of a session's messages).
    pub fn restore_shared(&mut self, nodes: Vec<Arc<TreeNode>>) {
        self.nodes = imbl::Vector::new();
        self.index = imbl::HashMap::new();
        self.depths = imbl::Vector::new();
        for node in nodes {
            self.push(node);
        }
    }

    /// Appends a node (its parent is already in the tree, or it is a root).
    fn push(&mut self, node: Arc<TreeNode>) {
        let depth = node.parent_id.as_ref().and_then(|p| self.depth_of(p)).map_or(0, |d| d + 1);
        self.index.insert(Arc::from(node.message.id.as_str()), self.nodes.len());
        self.depths.push_back(depth);
        self.nodes.push_back(node);
    }

    fn depth_of(&self, id: &MessageId) -> Option<u32> {
        self.index.get(id.as_str()).map(|&i| self.depths[i])
    }

    /// How many messages the path from the root to `node` holds.
    pub fn path_len(&self, node: Option<&MessageId>) -> usize {
        node.and_then(|n| self.depth_of(n)).map_or(0, |d| d as usize + 1)
    }

    /// [`Tree::restore`] from a tree this host already holds (`base`, a prefix of the
    /// session's nodes) plus the nodes recorded after it: costs the new nodes, not the transcript.
    pub fn restore_onto(&mut self, base: &Tree, new: Vec<TreeNode>) {
        self.nodes = base.nodes.clone();
        self.index = base.index.clone();
        self.depths = base.depths.clone();
        for node in new {
            self.push(Arc::new(node));
        }
    }

    /// The recorded nodes, shared, in tree order.
    pub fn shared_nodes(&self) -> impl ExactSizeIterator<Item = &Arc<TreeNode>> {
        self.nodes.iter()
    }

    /// Whether the head is a recorded node (or the tree is empty): a restored tree is whole.
    pub fn is_whole(&self) -> bool {
        self.head.as_ref().is_none_or(|h| self.contains(h))
    }

    /// The head of the active branch; `None` while the tree is empty (or moved to the root).
    pub fn head(&self) -> Option<&MessageId> {
        self.head.as_ref()
    }

    pub fn get(&self, id: &MessageId) -> Option<&TreeNode> {
        self.index.get(id.as_str()).map(|&i| &*self.nodes[i])
    }

    pub fn contains(&self, id: &MessageId) -> bool {
        self.index.contains_key(id.as_str())
    }

    /// How many nodes are recorded.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every node, parents before children.
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = &TreeNode> {
        self.nodes.iter().map(|n| &**n)
    }

    /// The ids from the root to `node`, inclusive.
    pub fn path_ids_to(&self, node: Option<&MessageId>) -> Vec<MessageId> {
        let mut ids = Vec::new();
        let mut cursor = node.cloned();
        while let Some(id) = cursor {
            cursor = self.get(&id).and_then(|n| n.parent_id.clone());
            ids.push(id);
        }
        ids.reverse();
        ids
    }

    /// The messages from the root to `node`, inclusive.
    pub fn path_to(&self, node: Option<&MessageId>) -> Vec<&Message> {
        self.path_ids_to(node).iter().filter_map(|id| self.get(id)).map(|n| &n.message).collect()
    }

    /// The active path, root to head.
    pub fn active_path(&self) -> Vec<&Message> {
        self.path_to(self.head())
    }

    /// Whether `anchor` lies on the active path (`None`, the empty root, always does).
    pub fn is_on_active_path(&self, anchor: Option<&MessageId>) -> bool {
        self.is_ancestor_or_self(anchor, self.head())
    }

    /// Whether `ancestor` is `node` or one of its ancestors (`None` is everyone's).
    pub fn is_ancestor_or_self(&self, ancestor: Option<&MessageId>, node: Option<&MessageId>) -> bool {
        let Some(ancestor) = ancestor else { return true };
        let Some(level) = self.depth_of(ancestor) else { return false };
        // Walk up only to the ancestor's depth: the check costs the distance, not the path.
        let mut cursor = node;
        while let Some(id) = cursor {
            let Some(&i) = self.index.get(id.as_str()) else { return false };
            if self.depths[i] <= level {
                return self.depths[i] == level && id == ancestor;
            }
            cursor = self.nodes[i].parent_id.as_ref();
        }
        false
    }

    /// Reads `drafts` as the conversation root to head and says what recording it writes.
    /// System messages are skipped (the system prompt belongs to the agent config).
    pub fn reconcile(&self, drafts: &[DraftMessage], ids: &mut IdMinter) -> Reconciled {
        self.reconcile_from(None, drafts, ids)
    }

    /// [`Tree::reconcile`] of the path to `start` followed by `drafts`, without walking that
    /// (known, unchanging) path again. `new_from` counts within `drafts`.
    pub fn reconcile_from(
        &self,
        start: Option<&MessageId>,
        drafts: &[DraftMessage],
        ids: &mut IdMinter,
    ) -> Reconciled {
        let mut cursor: Option<MessageId> = start.cloned();
        let mut new_nodes: Vec<(Message, Option<MessageId>)> = Vec::new();
        let mut minted: HashSet<MessageId> = HashSet::new();
        let mut new_from = drafts.len();
        for (i, draft) in drafts.iter().enumerate() {
            if draft.role == Role::System {
                continue;
            }
            if new_nodes.is_empty() {
                if let Some(id) = self.continues(cursor.as_ref(), draft) {
                    cursor = Some(id);
                    continue;
                }
                new_from = i;
            }
            let id = match &draft.id {
                Some(id) if !self.contains(id) && !minted.contains(id) => id.clone(),
                _ => ids.message_id(),
            };
            minted.insert(id.clone());
            new_nodes.push((draft.clone().into_message(id.clone()), cursor.clone()));
            cursor = Some(id);
        }
        let head = if drafts.iter().all(|d| d.role == Role::System) && start.is_none() {
            self.head.clone()
        } else {
            cursor
        };
        Reconciled { new_nodes, head, new_from }
    }

    /// The recorded child of `parent` that `draft` is, if any: the node it names, or the
    /// recorded tool result it resends.
    fn continues(&self, parent: Option<&MessageId>, draft: &DraftMessage) -> Option<MessageId> {
        if let Some(id) = &draft.id {
            let node = self.get(id)?;
            return (node.parent_id.as_ref() == parent).then(|| id.clone());
        }
        let call_id = draft.tool_call_id.as_ref().filter(|_| draft.role == Role::Tool)?;
        self.nodes
            .iter()
            .find(|n| {
                n.parent_id.as_ref() == parent
                    && n.message.role == Role::Tool
                    && n.message.tool_call_id.as_ref() == Some(call_id)
            })
            .map(|n| n.message.id.clone())
    }

    /// The index of the first message of `drafts` that is news.
    pub fn new_from(&self, drafts: &[DraftMessage]) -> usize {
        self.reconcile(drafts, &mut IdMinter::new(0)).new_from
    }

    /// Records `message` under `parent` and makes it the head.
    pub(crate) fn record(&mut self, message: Message, parent: Option<MessageId>) {
        let id = message.id.clone();
        self.push(Arc::new(TreeNode { message, parent_id: parent }));
        self.head = Some(id);
    }

    /// Moves the head to a recorded node (or the empty root).
    pub(crate) fn move_head(&mut self, head: Option<MessageId>) {
        self.head = head;
    }

    /// The tree in its wire shape.
    pub fn to_wire(&self) -> MessageTree {
        MessageTree { nodes: self.nodes().cloned().collect(), head_id: self.head.clone() }
    }

    /// Tool calls of assistant messages on the active path that no tool message on the path
    /// answers: `(tool_call_id, tool name)`.
    pub fn unanswered_tool_calls(&self) -> Vec<(CallId, String)> {
        self.unanswered_tool_calls_at(self.head())
    }

    /// Tool calls on the path from the root to `node` that no tool message on it answers.
    pub fn unanswered_tool_calls_at(&self, node: Option<&MessageId>) -> Vec<(CallId, String)> {
        let path = self.path_to(node);
        let answered: HashSet<&CallId> =
            path.iter().filter(|m| m.role == Role::Tool).filter_map(|m| m.tool_call_id.as_ref()).collect();
        path.iter()
            .filter(|m| m.role == Role::Assistant)
            .flat_map(|m| m.tool_calls())
            .filter(|tc| !answered.contains(&tc.id))
            .map(|tc| (tc.id.clone(), tc.function.name.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(tree: &mut Tree, r: &Reconciled) {
        for (m, p) in &r.new_nodes {
            tree.record(m.clone(), p.clone());
        }
        tree.move_head(r.head.clone());
    }

    fn ids(tree: &Tree) -> Vec<MessageId> {
        tree.active_path().iter().map(|m| m.id.clone()).collect()
    }

    #[test]
    fn known_ids_continue_and_news_is_appended() {
        let mut tree = Tree::default();
        let mut minter = IdMinter::new(1);
        let r = tree.reconcile(&[DraftMessage::user("hi").with_id("u1")], &mut minter);
        assert_eq!(r.new_from, 0);
        apply(&mut tree, &r);
        let r = tree
            .reconcile(&[DraftMessage::user("hi").with_id("u1"), DraftMessage::user("more")], &mut minter);
        assert_eq!(r.new_from, 1);
        assert_eq!(r.new_nodes.len(), 1);
        assert_eq!(r.new_nodes[0].1.as_ref(), Some(&"u1".into()));
        apply(&mut tree, &r);
        assert_eq!(tree.len(), 2);
    }

    #[test]
    fn echo_of_known_ids_writes_nothing() {
        let mut tree = Tree::default();
        let mut minter = IdMinter::new(1);
        let view = [DraftMessage::user("a").with_id("a"), DraftMessage::user("b").with_id("b")];
        let r = tree.reconcile(&view, &mut minter);
        apply(&mut tree, &r);
        let r = tree.reconcile(&view[..1], &mut minter);
        assert!(r.is_noop(&tree));
        let r = tree.reconcile(&view, &mut minter);
        assert!(r.is_noop(&tree));
    }

    #[test]
    fn an_edit_forks_and_rewrites_the_tail() {
        let mut tree = Tree::default();
        let mut minter = IdMinter::new(1);
        let view = [
            DraftMessage::user("a").with_id("a"),
            DraftMessage::user("b").with_id("b"),
            DraftMessage::user("c").with_id("c"),
        ];
        let r = tree.reconcile(&view, &mut minter);
        apply(&mut tree, &r);
        // b edited (no id): b' and a fresh copy of c are new nodes under a.
        let edit = [view[0].clone(), DraftMessage::user("b2"), view[2].clone()];
        let r = tree.reconcile(&edit, &mut minter);
        assert_eq!(r.new_from, 1);
        assert_eq!(r.new_nodes.len(), 2);
        assert_eq!(r.new_nodes[0].1.as_ref(), Some(&"a".into()));
        assert_ne!(r.new_nodes[1].0.id, "c", "a known id after the news is recorded afresh");
        apply(&mut tree, &r);
        assert_eq!(tree.len(), 5);
        assert_eq!(ids(&tree)[0], "a");
        assert!(!tree.is_on_active_path(Some(&"b".into())));
    }

    #[test]
    fn resent_tool_result_folds_onto_the_recorded_node() {
        let mut tree = Tree::default();
        let mut minter = IdMinter::new(1);
        let view = [DraftMessage::user("a").with_id("a"), DraftMessage::tool_result("t1", "clock", "12:00")];
        let r = tree.reconcile(&view, &mut minter);
        apply(&mut tree, &r);
        let recorded = tree.head().cloned();
        let r = tree.reconcile(
            &[view[0].clone(), DraftMessage::tool_result("t1", "clock", "12:00"), DraftMessage::user("next")],
            &mut minter,
        );
        assert_eq!(r.new_from, 2);
        assert_eq!(r.new_nodes.len(), 1);
        assert_eq!(r.new_nodes[0].1, recorded);
    }

    #[test]
    fn unknown_ids_are_kept_and_system_messages_skipped() {
        let tree = Tree::default();
        let mut minter = IdMinter::new(1);
        let r = tree.reconcile(
            &[DraftMessage::text(Role::System, "sys"), DraftMessage::user("x").with_id("client-1")],
            &mut minter,
        );
        assert_eq!(r.new_nodes.len(), 1);
        assert_eq!(r.new_nodes[0].0.id, "client-1");
        assert_eq!(r.new_from, 1);
    }

    #[test]
    fn ancestry_and_path_length_across_branches() {
        let mut tree = Tree::default();
        let mut minter = IdMinter::new(1);
        let view = [DraftMessage::user("a").with_id("a"), DraftMessage::user("b").with_id("b")];
        let r = tree.reconcile(&view, &mut minter);
        apply(&mut tree, &r);
        let fork =
            [view[0].clone(), DraftMessage::user("b2").with_id("b2"), DraftMessage::user("c2").with_id("c2")];
        let r = tree.reconcile(&fork, &mut minter);
        apply(&mut tree, &r);
        assert_eq!(tree.path_len(tree.head()), 3);
        assert_eq!(tree.path_len(None), 0);
        assert!(tree.is_ancestor_or_self(Some(&"a".into()), Some(&"c2".into())));
        assert!(tree.is_ancestor_or_self(Some(&"b2".into()), Some(&"c2".into())));
        assert!(
            !tree.is_ancestor_or_self(Some(&"b".into()), Some(&"c2".into())),
            "a sibling branch is not an ancestor"
        );
        assert!(
            !tree.is_ancestor_or_self(Some(&"c2".into()), Some(&"a".into())),
            "a descendant is not an ancestor"
        );
        assert!(!tree.is_ancestor_or_self(Some(&"missing".into()), Some(&"c2".into())));
        assert!(tree.is_on_active_path(Some(&"b2".into())) && !tree.is_on_active_path(Some(&"b".into())));
        // A restored tree computes the same depths.
        let mut restored = Tree::default();
        restored.restore(tree.nodes().cloned().collect());
        restored.move_head(tree.head().cloned());
        assert_eq!(restored.path_len(restored.head()), 3);
        assert!(!restored.is_on_active_path(Some(&"b".into())));
    }
}
