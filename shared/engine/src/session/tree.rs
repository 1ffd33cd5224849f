//! The message tree: every recorded message, the active branch, and reconcile.
//!
//! Reconcile reads a list of messages as "how the conversation now reads, root to head":
//! messages with known ids continue the branch; the first message with no id or an unknown id
//! starts the news, and from there every message is written as a new node (an edit is a new
//! message, so a fork rewrites its whole tail). A resent copy of a recorded tool result (same
//! `tool_call_id`, no id) folds onto the recorded node instead of forking.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use crate::ids::{CallId, IdMinter, MessageId};
use crate::protocol::{CompactionKind, DraftMessage, Message, MessageTree, Role, TreeNode};

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
    /// What each node's path holds, by index in `nodes`; derived when the node is pushed (so
    /// rebuilt on load), so that no step walks the transcript.
    meta: imbl::Vector<Meta>,
    /// Tool call id -> the tool messages answering it (indices in `nodes`, in push order);
    /// derived, rebuilt on load.
    answers: imbl::HashMap<CallId, Arc<[usize]>>,
    /// The nodes' size as JSON, summed as they are pushed: what a cache holding the tree is
    /// charged for them (see [`Tree::bytes`]).
    bytes: usize,
}

/// What the tree derives for a node when it is pushed.
#[derive(Debug, Clone)]
struct Meta {
    /// A root is 0.
    depth: u32,
    /// The parent's index (`None` for a root, or a parent that is not recorded).
    parent: Option<usize>,
    /// A skew-binary jump pointer to an ancestor (itself for a root): walking up to a given
    /// depth follows it whenever it does not overshoot, so ancestry checks cost O(log depth).
    jump: usize,
    /// The tool calls of assistant messages on the path root..node that no tool message on it
    /// answers, in path order: `(tool_call_id, tool name)`. Shared with the parent's unless
    /// the node opens or answers one.
    open: Arc<[(CallId, String)]>,
    /// The node's message as a draft, made the first time a model request takes it and
    /// shared by every request after (a cell shared by copies of the tree, filled once with
    /// the same value whichever fills it).
    draft: OnceLock<Arc<DraftMessage>>,
    /// The compaction markers in force on the path root..node (indices in `nodes`): the
    /// newest summary and the newest clearing of tool results. Shared with the parent's unless
    /// the node is one.
    marks: Marks,
}

/// The newest compaction markers on a path, by index in the tree's nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    pub summary: Option<usize>,
    pub cleared: Option<usize>,
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
            meta: imbl::Vector::new(),
            answers: imbl::HashMap::new(),
            bytes: 0,
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
        self.meta = imbl::Vector::new();
        self.answers = imbl::HashMap::new();
        self.bytes = 0;
        for node in nodes {
            self.push(node);
        }
    }

    /// The recorded nodes' size as JSON: a cache's measure of what the tree holds (its memory is
    /// within a small factor of it; nodes shared between copies are counted by each).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Appends a node (its parent is already in the tree, or it is a root).
    fn push(&mut self, node: Arc<TreeNode>) {
        // Twice the node: once for the message, once for its draft (see `Meta::draft`).
        self.bytes += 2 * crate::json_len(&*node);
        let at = self.nodes.len();
        let parent = node.parent_id.as_ref().and_then(|p| self.index.get(p.as_str()).copied());
        let mut marks = parent.map(|p| self.meta[p].marks).unwrap_or_default();
        match node.message.compaction.as_deref().map(|c| c.kind) {
            Some(CompactionKind::Summary) => marks.summary = Some(at),
            Some(CompactionKind::ClearedToolResults) => marks.cleared = Some(at),
            None => {}
        }
        let (depth, jump, mut open) = match parent.map(|p| (p, &self.meta[p])) {
            None => (0, at, Arc::from([])),
            Some((p, up)) => {
                // Myers' skew-binary jump pointers: two equal jumps above the parent merge.
                let j1 = up.jump;
                let j2 = self.meta[j1].jump;
                let d1 = self.meta[j1].depth;
                let jump = if up.depth - d1 == d1 - self.meta[j2].depth { j2 } else { p };
                (up.depth + 1, jump, Arc::clone(&up.open))
            }
        };
        let message = &node.message;
        match message.role {
            Role::Tool => {
                if let Some(call) = &message.tool_call_id {
                    if open.iter().any(|(c, _)| c == call) {
                        open = open.iter().filter(|(c, _)| c != call).cloned().collect();
                    }
                    let answers = match self.answers.get(call) {
                        Some(known) => known.iter().copied().chain([at]).collect(),
                        None => Arc::from([at]),
                    };
                    self.answers.insert(call.clone(), answers);
                }
            }
            Role::Assistant if !message.tool_calls().is_empty() => {
                let fresh: Vec<(CallId, String)> = message
                    .tool_calls()
                    .iter()
                    .filter(|tc| !self.answered_on_path(&tc.id, parent))
                    .map(|tc| (tc.id.clone(), tc.function.name.clone()))
                    .collect();
                if !fresh.is_empty() {
                    open = open.iter().cloned().chain(fresh).collect();
                }
            }
            _ => {}
        }
        self.index.insert(Arc::from(message.id.as_str()), at);
        self.meta.push_back(Meta { depth, parent, jump, open, draft: OnceLock::new(), marks });
        self.nodes.push_back(node);
    }

    /// Whether a tool message on the path root..`node` answers `call`.
    fn answered_on_path(&self, call: &CallId, node: Option<usize>) -> bool {
        let Some(node) = node else { return false };
        self.answers.get(call).is_some_and(|tools| tools.iter().any(|&t| self.is_ancestor_at(t, node)))
    }

    /// Whether node `ancestor` is node `node` or one of its ancestors (indices in `nodes`).
    fn is_ancestor_at(&self, ancestor: usize, node: usize) -> bool {
        let level = self.meta[ancestor].depth;
        let mut at = node;
        loop {
            let m = &self.meta[at];
            if m.depth <= level {
                return at == ancestor;
            }
            at = if self.meta[m.jump].depth >= level {
                m.jump
            } else {
                match m.parent {
                    Some(p) => p,
                    None => return false,
                }
            };
        }
    }

    fn depth_of(&self, id: &MessageId) -> Option<u32> {
        self.index.get(id.as_str()).map(|&i| self.meta[i].depth)
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
        self.meta = base.meta.clone();
        self.answers = base.answers.clone();
        self.bytes = base.bytes;
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

    /// The recorded nodes from index `start` on, in tree order: what a store has not written
    /// yet, found without a walk over the ones before (`Iterator::skip` would step through them).
    pub fn nodes_from(&self, start: usize) -> Vec<Arc<TreeNode>> {
        self.nodes.skip(start.min(self.nodes.len())).into_iter().collect()
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

    /// The messages from the root to `node`, inclusive (by parent indices: no id is hashed or
    /// cloned on the way).
    pub fn path_to(&self, node: Option<&MessageId>) -> Vec<&Message> {
        let mut at = node.and_then(|n| self.index.get(n.as_str()).copied());
        let mut path = Vec::with_capacity(at.map_or(0, |i| self.meta[i].depth as usize + 1));
        while let Some(i) = at {
            path.push(&self.nodes[i].message);
            at = self.meta[i].parent;
        }
        path.reverse();
        path
    }

    /// The path from the root to `node` as drafts, shared with every request made before.
    pub fn path_drafts(&self, node: Option<&MessageId>) -> Vec<Arc<DraftMessage>> {
        let mut at = node.and_then(|n| self.index.get(n.as_str()).copied());
        let mut path = Vec::with_capacity(at.map_or(0, |i| self.meta[i].depth as usize + 1));
        while let Some(i) = at {
            let meta = &self.meta[i];
            path.push(Arc::clone(meta.draft.get_or_init(|| Arc::new(self.nodes[i].message.to_draft()))));
            at = meta.parent;
        }
        path.reverse();
        path
    }

    /// The compaction markers in force at `node` (none for the empty root).
    pub fn marks_at(&self, node: Option<&MessageId>) -> Marks {
        node.and_then(|n| self.index.get(n.as_str())).map(|&i| self.meta[i].marks).unwrap_or_default()
    }

    /// The node at `index` (as [`Marks`] name them).
    pub fn node_at(&self, index: usize) -> Option<&TreeNode> {
        self.nodes.get(index).map(|n| &**n)
    }

    /// The nodes of the path root..`node` after `after` (an ancestor of `node`; `None`: the
    /// root's, so the whole path), root side first, each with its index and its shared draft:
    /// a walk of the part taken, not of the path.
    pub fn path_after(
        &self,
        node: Option<&MessageId>,
        after: Option<&MessageId>,
    ) -> Vec<(usize, &TreeNode, Arc<DraftMessage>)> {
        let stop = after.and_then(|a| self.index.get(a.as_str()).copied());
        let mut at = node.and_then(|n| self.index.get(n.as_str()).copied());
        let mut part = Vec::new();
        while let Some(i) = at.filter(|&i| Some(i) != stop) {
            let meta = &self.meta[i];
            let draft = Arc::clone(meta.draft.get_or_init(|| Arc::new(self.nodes[i].message.to_draft())));
            part.push((i, &*self.nodes[i], draft));
            at = meta.parent;
        }
        part.reverse();
        part
    }

    /// The depth of the node at `index` (a root is 0).
    pub fn depth_at(&self, index: usize) -> Option<u32> {
        self.meta.get(index).map(|m| m.depth)
    }

    /// The index of a recorded node.
    pub fn index_of(&self, id: &MessageId) -> Option<usize> {
        self.index.get(id.as_str()).copied()
    }

    /// The last `n` nodes of the path from the root to `node`, root side first, and how many
    /// nodes of the path come before them: a walk of `n` nodes, not of the path.
    pub fn path_end(&self, node: Option<&MessageId>, n: usize) -> (Vec<&TreeNode>, usize) {
        let mut at = node.and_then(|n| self.index.get(n.as_str()).copied());
        let len = at.map_or(0, |i| self.meta[i].depth as usize + 1);
        let mut end = Vec::with_capacity(n.min(len));
        while let Some(i) = at.filter(|_| end.len() < n) {
            end.push(&*self.nodes[i]);
            at = self.meta[i].parent;
        }
        end.reverse();
        let before = len - end.len();
        (end, before)
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
        let (Some(&a), Some(&n)) =
            (self.index.get(ancestor.as_str()), node.and_then(|n| self.index.get(n.as_str())))
        else {
            return false;
        };
        // Up to the ancestor's depth by jump pointers: O(log depth), whatever the distance.
        self.is_ancestor_at(a, n)
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
                // A compaction marker echoed back (the only system message a tree holds): the
                // branch goes on through it. Any other system message is the agent's.
                if new_nodes.is_empty()
                    && draft
                        .id
                        .as_ref()
                        .and_then(|id| self.get(id))
                        .is_some_and(|n| n.message.compaction.is_some())
                    && let Some(id) = self.continues(cursor.as_ref(), draft)
                {
                    cursor = Some(id);
                }
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
        // The first recorded tool message for `call_id` under `parent` (all of them are in
        // `answers`, in tree order).
        self.answers
            .get(call_id)?
            .iter()
            .map(|&i| &self.nodes[i])
            .find(|n| n.parent_id.as_ref() == parent)
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
    /// Kept per node as nodes are recorded: costs the answer, not the path.
    pub fn unanswered_tool_calls_at(&self, node: Option<&MessageId>) -> Vec<(CallId, String)> {
        node.and_then(|n| self.index.get(n.as_str())).map(|&i| self.meta[i].open.to_vec()).unwrap_or_default()
    }

    /// The messages from `node` up to the root, `node` first: a walk that stops when its
    /// reader does (e.g. at the last assistant message).
    pub fn path_back(&self, node: Option<&MessageId>) -> impl Iterator<Item = &Message> {
        let mut cursor = node.and_then(|n| self.get(n));
        std::iter::from_fn(move || {
            let here = cursor?;
            cursor = here.parent_id.as_ref().and_then(|p| self.get(p));
            Some(&here.message)
        })
    }

    /// [`Tree::unanswered_tool_calls_at`] computed from the whole path (the reference the
    /// derived lists are checked against).
    #[cfg(test)]
    fn unanswered_by_walking(&self, node: Option<&MessageId>) -> Vec<(CallId, String)> {
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
    fn nodes_from_an_index_are_the_tail_in_tree_order() {
        let mut tree = Tree::default();
        let drafts: Vec<DraftMessage> =
            ["a", "b", "c"].iter().map(|id| DraftMessage::user("x").with_id(*id)).collect();
        let r = tree.reconcile(&drafts, &mut IdMinter::new(1));
        apply(&mut tree, &r);
        let from = |i: usize| -> Vec<String> {
            tree.nodes_from(i).iter().map(|n| n.message.id.as_str().to_owned()).collect()
        };
        assert_eq!(from(0), ["a", "b", "c"]);
        assert_eq!(from(1), ["b", "c"]);
        assert_eq!(from(3), Vec::<String>::new());
        assert_eq!(from(9), Vec::<String>::new());
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

    /// A tiny deterministic generator for the randomized checks below.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 33) as usize) % n.max(1)
        }
    }

    /// A random tree (random parents, so many branches; few call ids, so answers before
    /// calls, duplicate calls and duplicate answers all occur), built by `record` and by
    /// `restore`.
    fn random_tree(seed: u64, size: usize) -> (Tree, Vec<MessageId>) {
        let mut rng = Rng(seed);
        let mut tree = Tree::default();
        let mut ids: Vec<MessageId> = Vec::new();
        for n in 0..size {
            let id: MessageId = format!("m{n}").into();
            // Odd seeds mostly extend the last node: long paths, so jump pointers are used.
            let parent = match rng.below(if seed.is_multiple_of(2) { 8 } else { 64 }) {
                0 => None,
                1..=4 | 8.. => ids.last().cloned(),
                _ if ids.is_empty() => None,
                _ => Some(ids[rng.below(ids.len())].clone()),
            };
            let call = |rng: &mut Rng| format!("c{}", rng.below(6));
            let draft = match rng.below(4) {
                0 => DraftMessage::user(format!("u{n}")),
                1 => DraftMessage::tool_result(call(&mut rng), format!("t{n}"), "r"),
                _ => {
                    let calls = (0..rng.below(4))
                        .map(|k| {
                            crate::protocol::ToolCall::function(call(&mut rng), format!("f{n}.{k}"), "{}")
                        })
                        .collect::<Vec<_>>();
                    DraftMessage { tool_calls: Some(calls), ..DraftMessage::text(Role::Assistant, "a") }
                }
            };
            tree.record(draft.into_message(id.clone()), parent);
            ids.push(id);
        }
        let mut restored = Tree::default();
        restored.restore(tree.nodes().cloned().collect());
        restored.move_head(tree.head().cloned());
        assert!(restored == tree);
        (restored, ids)
    }

    #[test]
    fn derived_open_calls_ancestry_and_resent_results_match_walking_the_path() {
        for seed in 0..40 {
            let (tree, ids) = random_tree(seed, 300);
            let mut rng = Rng(seed ^ 0xabcd);
            for id in ids.iter().map(Some).chain([None]) {
                assert_eq!(
                    tree.unanswered_tool_calls_at(id),
                    tree.unanswered_by_walking(id),
                    "seed {seed}, node {id:?}"
                );
                let by_ids: Vec<&Message> =
                    tree.path_ids_to(id).iter().filter_map(|i| tree.get(i)).map(|n| &n.message).collect();
                assert_eq!(tree.path_to(id), by_ids);
                let back: Vec<&Message> = tree.path_back(id).collect();
                let mut forward = tree.path_to(id);
                forward.reverse();
                assert_eq!(back, forward);
                let path = tree.path_ids_to(id);
                for _ in 0..20 {
                    let other = &ids[rng.below(ids.len())];
                    assert_eq!(
                        tree.is_ancestor_or_self(Some(other), id),
                        path.contains(other),
                        "seed {seed}"
                    );
                    let call: CallId = format!("c{}", rng.below(7)).into();
                    let draft = DraftMessage::tool_result(call.clone(), "t", "r");
                    let linear = tree
                        .nodes()
                        .find(|n| {
                            n.parent_id.as_ref() == id
                                && n.message.role == Role::Tool
                                && n.message.tool_call_id.as_ref() == Some(&call)
                        })
                        .map(|n| n.message.id.clone());
                    assert_eq!(tree.continues(id, &draft), linear, "seed {seed}");
                }
            }
        }
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
