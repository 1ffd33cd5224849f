//! One agent session as an event-sourced aggregate.
//!
//! [`handle`] turns a [`Command`] into [`Event`]s (or a [`Rejection`] that writes nothing);
//! [`Session::apply`] folds an event in; [`Session::plan`] derives the [`Effect`]s due now.
//! Nothing here does I/O: the runtime performs effects and reports their outcomes as commands.

mod apply;
mod calls;
mod command;
mod context;
mod decide;
mod event;
mod handle;
mod limits;
mod outbox;
mod plan;
mod propose;
mod records;
mod request;
mod respond;
mod tool_input;
mod tree;
mod used;
mod versions;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use command::{Command, Rejection};
pub use context::{
    CompactionPlan, ContextLimits, DEFAULT_SUMMARY_PROMPT, PromptMeasure, SUMMARY_PREFACE, TooLarge,
    ViewOptions, message_tokens, tokens_for_bytes, truncate_middle,
};
pub use event::Event;
pub use handle::{MAX_TITLE_CHARS, title_from};
pub use limits::Limits;
pub use outbox::{OutboxItem, Route, Send, Spawn, child_failed, route};
pub use plan::{Effect, Plan};
pub use records::{
    Budget, CallError, CallOutcome, CallRecord, CallSpec, CallValue, ChildTask, Decision, Defaults,
    ForkOrigin, Interrupt, ParentLink, PathRef, PendingTrigger, Resolver, SessionInit, TriggerSource,
    TurnInput, TurnOrigin, TurnRecord, TurnStatus, Usage, Versioned, format_picodollars, parse_picodollars,
};
pub use request::Transcript;
pub use tool_input::{check_output, validate_arguments};
pub use tree::{Reconciled, Tree};
pub use used::{UsedId, UsedIds};
use versions::Versions;
pub use versions::{Recalled, VersionEntry, VersionKind};

use crate::ids::{CallId, SessionId, TurnId};
use crate::protocol::{AgentConfig, AgentTool, TreeNode, WorkerIdentity};
use crate::time::Timestamp;

/// How many ended turns the head keeps whole; older ones are rebuilt from the log.
pub const RECENT_TURNS: usize = 1;

/// How many ids of older ended turns the head remembers for idempotency: resubmitting a turn
/// id older than these (hundreds of turns back) starts a new turn.
pub const PAST_TURN_IDS: usize = 8;

/// How many closed call ids the head remembers (to refuse late settles clearly and to make a
/// reused id a no-op); older ids are forgotten, so a settle for one is an unknown call.
pub const RECENT_CLOSED_CALLS: usize = 64;

/// Rebuilds a turn's record from the session's log (for turns the head no longer holds).
pub fn turn_from_log<'a>(
    turn_id: &TurnId,
    events: impl IntoIterator<Item = &'a Event>,
) -> Option<TurnRecord> {
    let mut turn: Option<TurnRecord> = None;
    let mut call_turns: BTreeMap<&CallId, bool> = BTreeMap::new();
    for event in events {
        match event {
            Event::TurnStarted { turn: t } | Event::TurnQueued { turn: t } if &t.id == turn_id => {
                turn = Some(t.clone())
            }
            Event::TurnActivated { turn_id: id, at } if id == turn_id => {
                if let Some(t) = turn.as_mut() {
                    t.status = TurnStatus::Active;
                    t.started_at = Some(*at);
                    t.input = None;
                }
            }
            Event::TurnEnded { turn_id: id, status, data, error, code, at } if id == turn_id => {
                if let Some(t) = turn.as_mut() {
                    t.status = *status;
                    t.data = data.clone();
                    t.error = error.clone();
                    t.code = *code;
                    t.ended_at = Some(*at);
                }
            }
            Event::CallCreated { call } => {
                call_turns.insert(&call.id, call.turn_id.as_ref() == Some(turn_id));
            }
            Event::CallSettled { call_id, outcome: Ok(CallValue::Llm(response)), .. }
            | Event::ContextCompacted { call_id, response: Some(response), .. }
                if call_turns.get(call_id) == Some(&true) =>
            {
                if let Some(t) = turn.as_mut() {
                    t.usage.add(response.usage.as_ref(), response.cost.as_deref());
                }
            }
            _ => {}
        }
    }
    turn
}

/// What a command needs from the outside world: the time, entropy for fresh ids, and what
/// the store knows that the head forgot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ctx {
    pub now: Timestamp,
    /// Seeds the ids this command mints; use fresh randomness per command.
    pub seed: u64,
    /// Turn and call ids the session used before, beyond what its head remembers (the store's
    /// answer after it refused a commit that used one again; empty otherwise).
    pub used: UsedIds,
    /// What the session may be sent or hold.
    pub limits: Limits,
    /// Versions of the state and agent config the head let go, read back from the log for this
    /// command (the store's answer to [`Rejection::Recall`]; empty otherwise).
    pub recalled: Recalled,
}

impl Ctx {
    /// A context at `now` with entropy `seed`, knowing nothing beyond the head.
    pub fn new(now: Timestamp, seed: u64) -> Self {
        Ctx { now, seed, used: UsedIds::default(), limits: Limits::default(), recalled: Recalled::default() }
    }
}

/// How a call left the open set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallClosure {
    /// Settled and reported.
    Reported,
    /// Voided by a fork, cancel or failed turn.
    Voided,
}

/// One agent session: the message tree, calls, decisions, turns, interrupts, versions.
///
/// Closed: only [`handle`] (through events) changes it, and readers use its methods. The
/// fields' names and order are the snapshot's JSON, which stores persist.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Session {
    id: SessionId,
    /// `None` until created. The snapshot leaves the declared agent config out: it never
    /// changes and is most of an agent's size (a system prompt, every tool's schema), so stores
    /// keep it apart, written once, and put it back with [`Session::restore_declared`].
    #[serde(serialize_with = "init_without_declared")]
    init: Option<Arc<SessionInit>>,
    created_at: Timestamp,
    tree: Tree,
    /// Agent state versions (the head holds the current one's value; see [`versions`]).
    #[serde(default, skip_serializing_if = "Versions::is_empty")]
    states: Versions<Value>,
    /// Agent config versions (the head holds the current one's and those open calls refer to).
    #[serde(default, skip_serializing_if = "Versions::is_empty")]
    agents: Versions<AgentConfig>,
    /// Calls not yet reported, in creation order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    calls: Vec<CallRecord>,
    /// The most recent calls that left the open set, and how, oldest first (at most
    /// [`RECENT_CLOSED_CALLS`]: the head holds open work, not history).
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    closed_calls: VecDeque<(CallId, CallClosure)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    decision: Option<Decision>,
    /// News waiting for a decision, in arrival order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    triggers: Vec<PendingTrigger>,
    /// The active and queued turns and the most recent ended ones (at most
    /// [`RECENT_TURNS`]), by id. Older ended turns are in the log (see [`turn_from_log`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    turns: BTreeMap<TurnId, TurnRecord>,
    /// Ended turns in the order they ended, for eviction.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    ended_order: VecDeque<TurnId>,
    /// Ids of ended turns evicted from `turns`, oldest first (at most [`PAST_TURN_IDS`]):
    /// still known, so resubmitting one is a no-op.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    past_turns: VecDeque<TurnId>,
    /// Extra idempotency ids naming existing turns.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    turn_aliases: BTreeMap<TurnId, TurnId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    active_turn: Option<TurnId>,
    /// Turns waiting to start, in arrival order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    queued_turns: Vec<TurnId>,
    /// Open interrupts, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    interrupts: Vec<Interrupt>,
    /// Undelivered work for other sessions, by sequence number.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    outbox: BTreeMap<u64, OutboxItem>,
    #[serde(default, skip_serializing_if = "is_zero")]
    next_outbox_seq: u64,
    /// Model usage over the whole session.
    usage: Usage,
    /// How many events have been applied (the log's length).
    events_applied: u64,
    /// The task each open delegation sent its child (what a retry sends again), by call id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    tasks: BTreeMap<CallId, ChildTask>,
    /// Its title, once its first turn or a person gave it one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    title: Option<String>,
    /// What the provider counted for the last completed server model call's prompt: the
    /// base of the next request's token estimate (see [`context`]).
    #[serde(default, rename = "prompt", skip_serializing_if = "Option::is_none")]
    prompt_measure: Option<PromptMeasure>,
    /// Sizes known without serializing again ([`Session::approx_bytes`]).
    #[serde(skip)]
    sizes: Sizes,
}

/// How many times a session's snapshot was serialized in this process: a count the tests that
/// guard a turn's cost read ([`snapshot_serializations`]).
static SNAPSHOT_SERIALIZATIONS: AtomicU64 = AtomicU64::new(0);

/// How many session snapshots this process serialized (a store's commit, a size measured).
pub fn snapshot_serializations() -> u64 {
    SNAPSHOT_SERIALIZATIONS.load(Ordering::Relaxed)
}

/// Byte sizes of a session known without serializing it again: its snapshot's JSON as a store
/// last wrote it (0: unknown since the session last changed) and its declared agent config's
/// (0: not measured yet). Hints for weighing caches: clones copy them, equality ignores them.
#[derive(Debug, Default)]
struct Sizes {
    snapshot: AtomicUsize,
    declared: AtomicUsize,
}

impl Clone for Sizes {
    fn clone(&self) -> Self {
        Sizes {
            snapshot: AtomicUsize::new(self.snapshot.load(Ordering::Relaxed)),
            declared: AtomicUsize::new(self.declared.load(Ordering::Relaxed)),
        }
    }
}

impl PartialEq for Sizes {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn init_without_declared<S: serde::Serializer>(
    init: &Option<Arc<SessionInit>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    // Called once per snapshot serialized: the count the cost guards read.
    SNAPSHOT_SERIALIZATIONS.fetch_add(1, Ordering::Relaxed);
    // The fields but the declared config (most of an agent's size), borrowed, not cloned.
    #[derive(Serialize)]
    struct Without<'a> {
        agent_id: &'a str,
        identity: &'a WorkerIdentity,
        has_worker: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        parent: Option<&'a ParentLink>,
        #[serde(skip_serializing_if = "<[SessionId]>::is_empty")]
        ancestry: &'a [SessionId],
        #[serde(skip_serializing_if = "Defaults::is_default")]
        defaults: Defaults,
        #[serde(skip_serializing_if = "Budget::is_unlimited")]
        budget: Budget,
        #[serde(skip_serializing_if = "Option::is_none")]
        fork: Option<&'a ForkOrigin>,
    }
    init.as_deref()
        .map(|i| Without {
            agent_id: &i.agent_id,
            identity: &i.identity,
            has_worker: i.has_worker,
            parent: i.parent.as_ref(),
            ancestry: &i.ancestry,
            defaults: i.defaults,
            budget: i.budget,
            fork: i.fork.as_ref(),
        })
        .serialize(s)
}

/// The result of handling a command: the events to persist, and the session after them.
#[derive(Debug, Clone)]
pub struct Transition {
    pub events: Vec<Event>,
    /// The session with the events applied.
    pub session: Session,
}

/// Handles `command` against `session`: the events it causes, or why it is refused.
/// Pure: the same session, command and ctx always give the same events.
pub fn handle(session: &Session, command: Command, ctx: &Ctx) -> Result<Transition, Rejection> {
    let mut tx = handle::Tx::new(session.clone(), ctx);
    tx.run(command)?;
    if !tx.recall.is_empty() {
        return Err(Rejection::Recall(tx.recall));
    }
    Ok(Transition { events: tx.events, session: tx.session })
}

impl Session {
    /// An empty, not yet created session with this id.
    pub fn new(id: impl Into<SessionId>) -> Self {
        Session { id: id.into(), ..Session::default() }
    }

    /// Rebuilds a session by folding `events` in order.
    pub fn replay<'a>(id: impl Into<SessionId>, events: impl IntoIterator<Item = &'a Event>) -> Self {
        let mut session = Session::new(id);
        for event in events {
            session.apply(event);
        }
        session
    }

    pub fn id(&self) -> &SessionId {
        &self.id
    }

    /// What the provider counted for the last completed server model call's prompt, when it
    /// was large enough to keep ([`context`]).
    pub fn prompt_measure(&self) -> Option<&PromptMeasure> {
        self.prompt_measure.as_ref()
    }

    /// Agent, owner, parent and defaults; `None` until created.
    pub fn init(&self) -> Option<&SessionInit> {
        self.init.as_deref()
    }

    /// Whether the session has been created.
    pub fn is_created(&self) -> bool {
        self.init.is_some()
    }

    /// When it was created (the epoch until it is).
    pub fn created_at(&self) -> Timestamp {
        self.created_at
    }

    /// Every recorded message. A snapshot keeps only the tree's head: after loading one, put
    /// the stored nodes back with [`Session::restore_messages`] (or its siblings).
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The declared agent config a store keeps apart from the snapshot (written once, when the
    /// session is created).
    pub fn declared(&self) -> Option<&AgentConfig> {
        self.init.as_ref().and_then(|i| i.declared.as_ref())
    }

    /// Puts back the declared agent config a store keeps apart from the snapshot. A snapshot
    /// written before it was left out still holds it; `None` keeps what the snapshot holds.
    pub fn restore_declared(&mut self, declared: Option<AgentConfig>) {
        if let (Some(init), Some(declared)) = (self.init.as_mut(), declared) {
            Arc::make_mut(init).declared = Some(declared);
            self.sizes = Sizes::default();
        }
    }

    /// Puts back the message nodes a store keeps apart from the snapshot, in tree order.
    pub fn restore_messages(&mut self, nodes: Vec<TreeNode>) {
        self.tree.restore(nodes);
    }

    /// [`Session::restore_messages`] with nodes shared with another copy of the session.
    pub fn restore_shared_messages(&mut self, nodes: Vec<Arc<TreeNode>>) {
        self.tree.restore_shared(nodes);
    }

    /// Puts back the nodes of `known` (an earlier copy of this session's tree, held by a warm
    /// host) followed by `new`, the nodes stored since.
    pub fn restore_messages_onto(&mut self, known: &Tree, new: Vec<TreeNode>) {
        self.tree.restore_onto(known, new);
    }

    /// About how many bytes the session holds, as JSON: its snapshot (the head, with the
    /// version values it holds), its declared agent config and its message nodes. What a cache
    /// of sessions is bounded by; the memory a session takes is within a small factor of it.
    pub fn approx_bytes(&self) -> usize {
        let snapshot = match self.sizes.snapshot.load(Ordering::Relaxed) {
            0 => crate::json_len(self),
            known => known,
        };
        let declared = match self.sizes.declared.load(Ordering::Relaxed) {
            0 => {
                let measured = self.declared().map_or(0, crate::json_len);
                self.sizes.declared.store(measured, Ordering::Relaxed);
                measured
            }
            known => known,
        };
        snapshot + declared + self.tree.bytes()
    }

    /// A store wrote the session's snapshot as `len` bytes of JSON: weighing the session
    /// later need not serialize it again (until it changes).
    pub fn wrote_snapshot(&self, len: usize) {
        self.sizes.snapshot.store(len, Ordering::Relaxed);
    }

    /// Its title: from its first turn's message, or as a person renamed it.
    pub fn title(&self) -> Option<&str> {
        self.title.as_deref()
    }

    /// The parent, for a sub-agent's session.
    pub fn parent(&self) -> Option<&ParentLink> {
        self.init.as_ref().and_then(|i| i.parent.as_ref())
    }

    /// Calls not yet reported, in creation order.
    pub fn calls(&self) -> &[CallRecord] {
        &self.calls
    }

    /// The most recently closed calls (at most [`RECENT_CLOSED_CALLS`]), oldest first.
    pub fn closed_calls(&self) -> impl ExactSizeIterator<Item = (&CallId, CallClosure)> {
        self.closed_calls.iter().map(|(id, how)| (id, *how))
    }

    /// The live decision.
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_ref()
    }

    /// News waiting for a decision, in arrival order.
    pub fn triggers(&self) -> &[PendingTrigger] {
        &self.triggers
    }

    /// The turns the head holds: active, queued, and the most recent ended ones (at most
    /// [`RECENT_TURNS`]), in id order. Older ones: [`turn_from_log`].
    pub fn turns(&self) -> impl ExactSizeIterator<Item = &TurnRecord> {
        self.turns.values()
    }

    pub fn active_turn_id(&self) -> Option<&TurnId> {
        self.active_turn.as_ref()
    }

    pub fn active_turn(&self) -> Option<&TurnRecord> {
        self.active_turn.as_ref().and_then(|t| self.turns.get(t))
    }

    /// Turns waiting to start, in arrival order.
    pub fn queued_turn_ids(&self) -> &[TurnId] {
        &self.queued_turns
    }

    /// Ids of ended turns the head no longer holds but still knows (at most
    /// [`PAST_TURN_IDS`]), oldest first.
    pub fn past_turn_ids(&self) -> impl ExactSizeIterator<Item = &TurnId> {
        self.past_turns.iter()
    }

    /// Open interrupts, oldest first (on any branch; see [`Session::pausing_interrupts`]).
    pub fn interrupts(&self) -> &[Interrupt] {
        &self.interrupts
    }

    /// Undelivered work for other sessions, by sequence number ([`Session::plan`] routes it).
    pub fn outbox(&self) -> &BTreeMap<u64, OutboxItem> {
        &self.outbox
    }

    /// Model usage over the whole session.
    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// How many events have been applied: the log's length, so the last event's sequence
    /// number.
    pub fn events_applied(&self) -> u64 {
        self.events_applied
    }

    /// The session's agent.
    pub fn agent_id(&self) -> &str {
        self.init.as_ref().map_or("", |i| i.agent_id.as_str())
    }

    /// The session owner.
    pub fn identity(&self) -> WorkerIdentity {
        self.init.as_ref().map(|i| i.identity.clone()).unwrap_or_default()
    }

    /// Whether a worker answers this session's decisions.
    pub fn has_worker(&self) -> bool {
        self.init.as_ref().is_some_and(|i| i.has_worker)
    }

    /// The engine default policies.
    pub fn defaults(&self) -> Defaults {
        self.init.as_ref().map(|i| i.defaults).unwrap_or_default()
    }

    /// Ancestor session ids, nearest last.
    pub fn ancestry(&self) -> Vec<SessionId> {
        self.init.as_ref().map(|i| i.ancestry.clone()).unwrap_or_default()
    }

    /// The agent state on the active path (`null` when never written).
    pub fn current_state(&self) -> Value {
        self.states.current_value(&self.tree).cloned().unwrap_or(Value::Null)
    }

    /// The agent config on the active path. An engine-hosted agent's is its declared config
    /// until a response writes another: the engine accepts its `session.start` proposal (the
    /// declared config) at once, so that version is derived from the init, never written.
    pub fn current_agent(&self) -> Option<&AgentConfig> {
        self.agents
            .current_value(&self.tree)
            .or_else(|| self.init.as_ref().filter(|i| !i.has_worker).and_then(|i| i.declared.as_ref()))
    }

    /// The agent config version on the active path (its index among the versions), if one
    /// was written.
    pub fn current_agent_version(&self) -> Option<u32> {
        self.agents.current(&self.tree)
    }

    /// Agent config version `index`, if the head holds it (it holds the current one and every
    /// one an open call refers to).
    pub fn agent_version(&self, index: u32) -> Option<&AgentConfig> {
        self.agents.value(index)
    }

    /// Where each state and agent config version applies from, as a store keeps it apart from
    /// the snapshot, in log order.
    pub fn version_entries(&self) -> Vec<VersionEntry> {
        let mut entries: Vec<VersionEntry> =
            self.states.entries(VersionKind::State).chain(self.agents.entries(VersionKind::Agent)).collect();
        entries.sort_by_key(|e| e.seq);
        entries
    }

    /// The newest `n` of [`Session::version_entries`], in log order: what a store has not kept
    /// yet, at the cost of those `n`, not of every version of a long session.
    pub fn newest_version_entries(&self, n: usize) -> Vec<VersionEntry> {
        let mut states = self.states.entries_newest_first(VersionKind::State).peekable();
        let mut agents = self.agents.entries_newest_first(VersionKind::Agent).peekable();
        let mut newest = Vec::with_capacity(n);
        while newest.len() < n {
            let next = match (states.peek(), agents.peek()) {
                (Some(s), Some(a)) if s.seq > a.seq => states.next(),
                (Some(_), Some(_)) | (None, Some(_)) => agents.next(),
                (Some(_), None) => states.next(),
                (None, None) => break,
            };
            newest.extend(next);
        }
        newest.reverse();
        newest
    }

    /// How many entries [`Session::version_entries`] holds.
    pub fn version_entry_count(&self) -> usize {
        self.states.kept_apart() + self.agents.kept_apart()
    }

    /// Puts back the version entries a store keeps apart from the snapshot (every one it kept,
    /// in log order), after loading the snapshot and restoring its messages. An error says
    /// what does not add up (the store and the head disagree: a partly read checkpoint, or
    /// corruption).
    pub fn restore_versions(&mut self, entries: Vec<VersionEntry>) -> Result<(), String> {
        let (states, agents): (Vec<_>, Vec<_>) =
            entries.into_iter().partition(|e| e.kind == VersionKind::State);
        self.states.restore(VersionKind::State, states)?;
        self.agents.restore(VersionKind::Agent, agents)
    }

    /// The current versions whose values the head let go (after a head move, before they
    /// are restored): kind, number and the log position of the event that wrote each.
    #[doc(hidden)]
    pub fn missing_versions(&self) -> Vec<(VersionKind, u32, u64)> {
        let state = self.states.missing(&self.tree).map(|(i, seq)| (VersionKind::State, i, seq));
        let agent = self.agents.missing(&self.tree).map(|(i, seq)| (VersionKind::Agent, i, seq));
        state.into_iter().chain(agent).collect()
    }

    /// Lets go of the version values the head no longer needs: all but the current ones and
    /// the agent configs open calls refer to.
    fn settle_versions(&mut self) {
        self.states.settle(&self.tree, |_| false);
        let calls = &self.calls;
        self.agents.settle(&self.tree, |index| {
            calls.iter().any(|c| matches!(&c.spec, CallSpec::LlmCall { agent: Some(v), .. } if *v == index))
        });
    }

    /// An open (not yet reported) call.
    pub fn call(&self, id: &CallId) -> Option<&CallRecord> {
        self.calls.iter().find(|c| &c.id == id)
    }

    /// Whether a call id was ever used in this session.
    pub fn call_id_used(&self, id: &CallId) -> bool {
        self.call(id).is_some() || self.closed_call(id).is_some()
    }

    /// How a recently closed call left the open set.
    pub fn closed_call(&self, id: &CallId) -> Option<CallClosure> {
        self.closed_calls.iter().rev().find(|(c, _)| c == id).map(|(_, how)| *how)
    }

    /// The task an open delegation sent its child (what a retry sends again).
    pub fn task(&self, call_id: &CallId) -> Option<&ChildTask> {
        self.tasks.get(call_id)
    }

    /// How long one delivery of the live decision may take, in milliseconds (`None`: no
    /// limit): for a `tool.execute` or `llm.execute` decision the executing call's own timeout
    /// (its policy's `timeout_secs`: action > agent > engine default), since the worker runs the
    /// call inside the delivery; otherwise, and with no live decision, the engine's decision
    /// policy. The runtime bounds its HTTP request to the worker by it; the engine sets the
    /// delivery's deadline from it when the delivery is claimed.
    pub fn delivery_timeout_ms(&self) -> Option<u64> {
        match self.decision.as_ref().and_then(|d| self.executing_call(d)) {
            Some(call) => call.policy.timeout_ms(),
            None => self.defaults().decision.timeout_ms(),
        }
    }

    /// The call an execute decision (`tool.execute`, `llm.execute`) runs.
    pub(crate) fn executing_call(&self, decision: &Decision) -> Option<&CallRecord> {
        match &decision.trigger {
            crate::protocol::Trigger::ToolExecute(_) | crate::protocol::Trigger::LlmExecute(_) => {
                decision.call_id.as_ref().and_then(|id| self.call(id))
            }
            _ => None,
        }
    }

    /// Tool and sub-agent calls not yet reported (the protocol's `pending_calls`).
    pub fn pending_calls(&self) -> usize {
        self.calls.iter().filter(|c| c.counts_as_pending()).count()
    }

    /// A turn by its id or an alias, if the head still holds its record.
    pub fn turn(&self, id: &TurnId) -> Option<&TurnRecord> {
        self.turns.get(self.resolve_turn_id(id))
    }

    /// The turn an id or alias names.
    pub fn resolve_turn_id<'a>(&'a self, id: &'a TurnId) -> &'a TurnId {
        self.turn_aliases.get(id).unwrap_or(id)
    }

    /// Whether a turn id (or alias) was ever used in this session.
    pub fn knows_turn(&self, id: &TurnId) -> bool {
        let id = self.resolve_turn_id(id);
        self.turns.contains_key(id) || self.past_turns.contains(id)
    }

    /// The open interrupts that pause the active branch.
    pub fn pausing_interrupts(&self) -> Vec<&Interrupt> {
        self.interrupts.iter().filter(|i| self.tree.is_on_active_path(i.anchor.as_ref())).collect()
    }

    /// Whether the active branch is paused.
    pub fn is_paused(&self) -> bool {
        !self.pausing_interrupts().is_empty()
    }

    /// The declaration of tool `name` for a call in `turn_id`: the agent's tools, then the
    /// client tools the turn brought (always run by the client, see [`client_tool`]).
    pub fn tool_declaration(&self, name: &str, turn_id: Option<&TurnId>) -> Option<AgentTool> {
        let agent = self.current_agent().and_then(|a| a.tools().iter().find(|t| t.name == name)).cloned();
        agent.or_else(|| self.client_tools(turn_id).iter().find(|t| t.name == name).map(client_tool))
    }

    /// The client that runs tool `name`'s calls in turn `turn_id`: the one whose tools the turn
    /// brought (`ClientContext::client_id`), when `name` is one of them (an agent's own client
    /// tool of that name included: that client implements it). Whether the call is a client's
    /// at all is the declaration's ([`Session::tool_declaration`]).
    pub fn tool_client(&self, name: &str, turn_id: Option<&TurnId>) -> Option<&str> {
        let turn = turn_id.and_then(|t| self.turns.get(t))?;
        let brought = turn.client_tools.iter().any(|t| t.name == name);
        turn.client_id.as_deref().filter(|_| brought)
    }

    /// The client tools turn `turn_id` brought, as the client declared them; empty once the
    /// turn has ended.
    pub fn client_tools(&self, turn_id: Option<&TurnId>) -> &[AgentTool] {
        turn_id.and_then(|t| self.turns.get(t)).map(|t| t.client_tools.as_slice()).unwrap_or_default()
    }

    /// The agent config as decisions of turn `turn_id` see it: the config on the active path
    /// with the turn's client tools layered onto its tools (as client tools; a name the agent
    /// already declares as a tool or sub-agent keeps the agent's declaration). Without client
    /// tools, or without a config to layer them onto, the config itself.
    pub fn layered_agent(&self, turn_id: Option<&TurnId>) -> Option<AgentConfig> {
        let mut config = self.current_agent()?.clone();
        let extra: Vec<AgentTool> = self
            .client_tools(turn_id)
            .iter()
            .filter(|c| !config.tools().iter().any(|t| t.name == c.name))
            .filter(|c| !config.sub_agents().iter().any(|s| s.id == c.name))
            .map(client_tool)
            .collect();
        if !extra.is_empty() {
            config.tools.get_or_insert_with(Vec::new).extend(extra);
        }
        Some(config)
    }

    /// `config` (from a response in turn `turn_id`) without the turn's layered client tools,
    /// as it is stored: echoing the layered config writes nothing, and the client tools stay
    /// the turn's.
    pub(crate) fn unlayered_agent(&self, turn_id: Option<&TurnId>, mut config: AgentConfig) -> AgentConfig {
        if self.layered_agent(turn_id).as_ref() == Some(&config)
            && let Some(current) = self.current_agent()
        {
            return current.clone();
        }
        let layer: Vec<AgentTool> = self.client_tools(turn_id).iter().map(client_tool).collect();
        if let Some(tools) = config.tools.as_mut() {
            let before = tools.len();
            tools.retain(|t| !layer.contains(t));
            if tools.is_empty() && before > 0 {
                config.tools = None;
            }
        }
        config
    }

    /// Whether `name` is a sub-agent of the current config.
    pub fn is_sub_agent(&self, name: &str) -> bool {
        self.current_agent().is_some_and(|a| a.sub_agents().iter().any(|s| s.id == name))
    }
}

/// A client tool's declaration as the engine uses it: the client runs it, whatever its
/// `handler` says (a client tool cannot be a worker's).
pub(crate) fn client_tool(tool: &AgentTool) -> AgentTool {
    AgentTool { handler: Some(crate::protocol::ToolHandler::Client), ..tool.clone() }
}

#[cfg(test)]
mod snapshot_tests {
    use super::*;

    /// A snapshot's `init` is the session's init without its declared config, field for field
    /// (the borrowed view the snapshot writes must not drift from `SessionInit`'s own shape).
    #[test]
    fn a_snapshot_writes_the_init_without_its_declared_config() {
        let policy = |secs: u64| serde_json::json!({"timeout_secs": secs, "max_retries": 1, "backoff_base_secs": 1, "backoff_max_secs": 2});
        for init in [
            serde_json::json!({"agent_id": "demo", "identity": {}, "has_worker": false}),
            serde_json::json!({
                "agent_id": "helper", "identity": {"id": "ana", "metadata": {"team": "ops"}},
                "declared": {"model": "m", "system": "be brief"}, "has_worker": true,
                "parent": {"session_id": "p", "tool_call_id": "c1"}, "ancestry": ["p", "q"],
                "defaults": {"llm": policy(9), "tool": policy(30), "client_tool": policy(0), "sub_agent": policy(0),
                             "decision": policy(5)},
                "budget": {"max_llm_calls": 3}, "fork": {"session_id": "s0", "turn_id": "t1"}
            }),
        ] {
            let init: SessionInit = serde_json::from_value(init).unwrap();
            let session = Session { init: Some(Arc::new(init.clone())), ..Session::default() };
            let written = serde_json::to_value(&session).unwrap();
            let expected = serde_json::to_value(SessionInit { declared: None, ..init }).unwrap();
            assert_eq!(written["init"], expected);
        }
    }
}
