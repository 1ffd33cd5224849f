//! The runtime's core: one place that loads a session, handles commands with the engine,
//! commits the result, and tells the queue and the notifier. The HTTP router, the dispatcher,
//! the local host and the Lambda functions all go through [`App`].

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::broadcast;
use turnstone_engine::ids::{SessionId, TurnId};
use turnstone_engine::protocol::{
    Action, AgentConfig, CacheTtl, ClientInput, ReasoningConfig, ThinkingForm, WorkerIdentity,
};
use turnstone_engine::session::{
    Budget, CallSpec, Command, Ctx, Defaults, Effect, Event, ParentLink, Plan, Recalled, Rejection, Session,
    SessionInit, Tree, TurnOrigin, TurnRecord, UsedId, UsedIds, handle,
};
use turnstone_engine::time::Timestamp;

use crate::api::{Placement, Submitted};
use crate::auth::{Access, Caller, Settler};
use crate::clock::Clock;
use crate::config::LimitsConfig;
use crate::error::{Error, Result};
use crate::llm::ModelProvider;
use crate::memo::Memo;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::queue::{Queue, WakeUp};
use crate::store::{Commit, Store, StoreError};
use crate::worker::WorkerEndpoint;

/// How often a commit is retried when another writer moved the session on.
const MAX_CONFLICT_RETRIES: usize = 16;

/// A commit that lands this long after its wake-up went out is announced again: the run that
/// wake-up started waits half a second for it (`dispatch::ANNOUNCED_COMMIT_LAST_PAUSE`), so one
/// that landed sooner was surely seen. (A commit that slow is a throttled or loaded store; the
/// second wake-up costs one send, where missing it would leave the session a minute idle.)
const SLOW_COMMIT: Duration = Duration::from_millis(250);

/// What the runtime knows about one agent: its declared config and how its work is run.
#[derive(Clone)]
pub struct AgentRuntime {
    pub id: String,
    /// Its declared config, proposed at `session.start`.
    pub declared: AgentConfig,
    /// The worker webhook, if the agent has one.
    pub worker: Option<WorkerEndpoint>,
    /// The provider of its server LLM calls, if any.
    pub provider: Option<Arc<dyn ModelProvider>>,
    /// Per-turn limits of its sessions.
    pub budget: Budget,
    /// The reasoning of its server model calls that ask for none (`[llm.<id>] reasoning`).
    pub reasoning: Option<ReasoningConfig>,
    /// How long a provider keeps its server model calls' prompt prefixes (`[llm.<id>]
    /// prompt_cache`); `None`: not cached.
    pub prompt_cache: Option<CacheTtl>,
    /// How models take thinking where their id does not say, by model-name prefix
    /// (`[llm.<id>] thinking`).
    pub thinking_forms: BTreeMap<String, ThinkingForm>,
    /// Its MCP servers (`[[agent.<id>.mcp]]`), whose tools the engine offers and runs.
    pub mcp: Option<Arc<turnstone_mcp::AgentServers>>,
    /// How its server model calls are kept within their model's context window.
    pub context: crate::llm::ContextSettings,
}

impl AgentRuntime {
    /// The thinking form the configuration gives `model`: the longest prefix that names it.
    pub fn thinking_form(&self, model: &str) -> Option<ThinkingForm> {
        self.thinking_forms
            .iter()
            .filter(|(prefix, _)| model.starts_with(prefix.as_str()))
            .max_by_key(|(p, _)| p.len())
            .map(|(_, form)| *form)
    }
}

impl std::fmt::Debug for AgentRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRuntime")
            .field("id", &self.id)
            .field("worker", &self.worker)
            .field("provider", &self.provider.is_some())
            .finish()
    }
}

/// The parts an [`App`] is built from.
pub struct Parts {
    /// Where sessions live.
    pub store: Arc<dyn Store>,
    /// Where wake-ups go.
    pub queue: Arc<dyn Queue>,
    /// Who hears of commits (long-polls and event streams wait on it).
    pub notifier: Arc<dyn Notifier>,
    pub clock: Arc<dyn Clock>,
    /// The agents, by id.
    pub agents: BTreeMap<String, AgentRuntime>,
    /// Engine default policies.
    pub defaults: Defaults,
    /// What sessions may be sent and hold, and how many one owner may create.
    pub limits: LimitsConfig,
    /// Claim a submitted turn's first model call or delivery in the submit's own commit and
    /// hand it to this process's queue workers (one commit less per turn). Only for hosts
    /// whose queue workers run in the same process as the API (the local host).
    pub claim_ahead: bool,
}

/// The engine facade: store, queue, notifier, clock and agents.
pub struct App {
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    notifier: Arc<dyn Notifier>,
    clock: Arc<dyn Clock>,
    agents: BTreeMap<String, AgentRuntime>,
    defaults: Defaults,
    limits: LimitsConfig,
    claim_ahead: bool,
    /// Effects claimed in a submit's commit, waiting for a queue worker of this process.
    handoff: Memo<String, ClaimedAhead>,
    /// What this process knows of each session's newest commit (bounded by keys and by
    /// `[limits] session_cache_mb`, least recently used first out):
    /// a hand-off starts from it while it is still the state the submit's claim left, and
    /// where this app is the store's only writer (`sole_writer`) loads are served from it.
    committed: Memo<String, Newest>,
    /// Every commit to the store goes through this app: one process serves the API and runs
    /// the dispatcher (`Parts::claim_ahead`), and the store is written by this process only
    /// ([`Store::exclusive`]). The state this app committed last is then the stored one.
    sole_writer: bool,
    /// The records of the turns this process's commits ended lately, as those commits left
    /// them (bounded; cleared when full): a long-poll woken by a turn's end answers from here
    /// instead of loading the session again.
    ended: Memo<(String, TurnId), TurnRecord>,
    /// The message nodes this host last saw per session: messages are immutable and only
    /// appended, so a load re-reads only the nodes after them (bounded by keys and bytes).
    messages: Memo<String, Tree>,
    entropy: AtomicU64,
    /// Sessions this process created, as they are committed (for catalogs that announce them,
    /// such as AHP's `root/sessionAdded`).
    created: broadcast::Sender<SessionId>,
    /// Sessions this process disposed (AHP's `root/sessionRemoved`).
    removed: broadcast::Sender<Removed>,
    /// Commits of this process that change a session's summary.
    changed: broadcast::Sender<SessionChanged>,
    /// What this process committed, counted.
    metrics: Metrics,
}

/// A session this process disposed, and who owned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub session_id: SessionId,
    pub owner: Option<String>,
    /// Its agent (an AHP session URI may be spelled with it).
    pub agent_id: Option<String>,
}

/// A commit of this process that changed what a session's summary shows (a catalog's
/// `root/sessionSummaryChanged`): its status, its title, or its chat.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionChanged {
    pub session_id: SessionId,
    pub agent_id: String,
    pub owner: Option<String>,
    pub status: crate::api::SessionStatus,
    /// The commit changed the status (what it was before differs).
    pub status_changed: bool,
    /// The commit set the title.
    pub titled: bool,
    pub title: Option<String>,
    /// The forks of it the commit made (new chats of its catalog).
    pub forks: Vec<SessionId>,
    /// The session whose catalog lists this one as a chat: a sub-agent's parent, a fork's
    /// source (AHP shows such a session there, not at the root).
    pub chat_of: Option<SessionId>,
    /// The commit created it: a sub-agent's chat is new in its parent's catalog.
    pub created: bool,
    /// When the commit was made.
    pub at: Timestamp,
}

/// The session whose catalog lists `session` as a chat: a sub-agent's parent, a fork's source.
pub fn chat_of(session: &Session) -> Option<SessionId> {
    let init = session.init()?;
    let parent = init.parent.as_ref().map(|p| p.session_id.clone());
    parent.or_else(|| init.fork.as_ref().map(|f| f.session_id.clone()))
}

/// Session creations buffered per listener before a slow one skips some.
const CREATED_BUFFER: usize = 256;
/// Summary changes buffered per listener before a slow one skips some.
const CHANGED_BUFFER: usize = 1024;

/// What the store told a command that the head forgot, kept across its attempts.
#[derive(Debug, Default)]
struct Known {
    /// Ids used before, from a refused commit.
    used: UsedIds,
    /// Versions read back from the log.
    recalled: Recalled,
}

/// The result of a commit: the session after it and the events it wrote.
#[derive(Debug, Clone)]
pub struct Executed {
    /// The session after the commit.
    pub session: Session,
    /// The new events (empty: nothing changed and nothing was written).
    pub events: Vec<Event>,
    /// The head's version after the commit (as loaded, when nothing was written).
    pub version: u64,
    /// An effect this commit also claimed (see `Mode::claim_next`): the caller performs
    /// it next, without a claim commit of its own.
    pub claimed: Option<Effect>,
}

impl App {
    /// An app from its parts.
    pub fn new(parts: Parts) -> Arc<Self> {
        let seed = app_seed(parts.clock.now());
        Self::with_seed(parts, seed)
    }

    /// An app whose ids come from `seed` instead of the OS's entropy: a simulation replays a
    /// seed to the same ids. Two apps over one store must be given different seeds.
    pub fn with_seed(parts: Parts, seed: u64) -> Arc<Self> {
        let sole_writer = parts.claim_ahead && parts.store.exclusive();
        let metrics = Metrics::for_models(parts.agents.values().map(|agent| agent.declared.model.clone()));
        Arc::new(App {
            store: parts.store,
            queue: parts.queue,
            notifier: parts.notifier,
            clock: parts.clock,
            agents: parts.agents,
            defaults: parts.defaults,
            limits: parts.limits,
            claim_ahead: parts.claim_ahead,
            handoff: Memo::new(),
            committed: Memo::weighed(crate::memo::session_budget(parts.limits.session_cache_mb), |n| {
                n.session.as_ref().map_or(0, Session::approx_bytes)
            }),
            sole_writer,
            ended: Memo::new(),
            messages: Memo::weighed(crate::memo::session_budget(parts.limits.session_cache_mb), Tree::bytes),
            entropy: AtomicU64::new(seed),
            created: broadcast::channel(CREATED_BUFFER).0,
            removed: broadcast::channel(CREATED_BUFFER).0,
            changed: broadcast::channel(CHANGED_BUFFER).0,
            metrics,
        })
    }

    /// Follows the sessions this process creates from now on (over HTTP, AHP, or as
    /// sub-agents), each announced once its creation is committed.
    pub fn sessions_created(&self) -> broadcast::Receiver<SessionId> {
        self.created.subscribe()
    }

    /// Follows the sessions this process disposes from now on, each announced once it is
    /// gone from the store.
    pub fn sessions_removed(&self) -> broadcast::Receiver<Removed> {
        self.removed.subscribe()
    }

    /// Follows this process's commits that change a session's summary (its status, its title,
    /// or its chat), from now on.
    pub fn sessions_changed(&self) -> broadcast::Receiver<SessionChanged> {
        self.changed.subscribe()
    }

    /// Disposes session `session_id` if `caller` may drive it (else [`Error::SessionNotFound`],
    /// as for a session that does not exist), and with it every sub-agent session it started,
    /// children before their parent: each is deleted from the store for good (see
    /// [`Store::dispose`]). Work in flight stops at its next commit, which is refused; a
    /// child's result for a disposed parent is dropped. Returns the sessions disposed.
    pub async fn dispose(&self, session_id: &str, caller: &Caller) -> Result<Vec<SessionId>> {
        let session = self.session(session_id).await?;
        if !caller.may(Access::Drive, &session) {
            return Err(Error::SessionNotFound(session_id.to_owned()));
        }
        // The tree of sessions, parents before children.
        let mut tree = vec![session.id().clone()];
        let mut next = 0;
        while let Some(id) = tree.get(next).cloned() {
            next += 1;
            for child in self.children(&id).await? {
                if !tree.contains(&child) {
                    tree.push(child);
                }
            }
        }
        let mut disposed = Vec::with_capacity(tree.len());
        for id in tree.into_iter().rev() {
            // Its owner, for whoever announces the removal to the callers that may know.
            let (owner, agent_id) = match self.store.load(&id).await? {
                Some(loaded) => (
                    loaded.session.init().and_then(|i| i.identity.id.clone()),
                    Some(loaded.session.agent_id().to_owned()),
                ),
                None => (None, None),
            };
            if self.store.dispose(&id).await? {
                self.messages.remove(id.as_str());
                self.handoff.remove(id.as_str());
                self.committed.remove(id.as_str());
                let removed = Removed { session_id: id.clone(), owner, agent_id };
                self.notifier.root(crate::notify::RootNotice::SessionRemoved(removed.clone()));
                // Nobody listening is fine.
                let _ = self.removed.send(removed);
                disposed.push(id);
            }
        }
        disposed.reverse();
        Ok(disposed)
    }

    /// The sub-agent sessions session `session_id` started: of the sessions its log's
    /// delegations name, those whose recorded parent is this session and that delegation's
    /// call. A delegation whose spawn failed or was refused (the id was another session's)
    /// names a session that is not its child, and that session is left alone.
    async fn children(&self, session_id: &str) -> Result<Vec<SessionId>> {
        const PAGE: usize = 1000;
        let mut named = Vec::new();
        let mut after = 0;
        loop {
            let events = self.store.events_after(session_id, after, PAGE).await?;
            for logged in &events {
                if let Event::CallCreated { call } = &logged.event
                    && let CallSpec::SubAgent { session_id: child, .. } = &call.spec
                {
                    let link = ParentLink { session_id: session_id.into(), tool_call_id: call.id.clone() };
                    named.push((child.clone(), link));
                }
            }
            match events.last() {
                Some(last) if events.len() == PAGE => after = last.seq,
                _ => break,
            }
        }
        let mut children = Vec::new();
        for (child, link) in named {
            if let Some(loaded) = self.store.load(&child).await?
                && loaded.session.parent() == Some(&link)
            {
                children.push(child);
            }
        }
        Ok(children)
    }

    /// What this process committed, counted (`GET /metrics`, EMF lines on Lambda).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Who hears of commits.
    pub fn notifier(&self) -> &Arc<dyn Notifier> {
        &self.notifier
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The host's limits (`[limits]`).
    pub fn limits(&self) -> &LimitsConfig {
        &self.limits
    }

    /// An agent by id.
    pub fn agent(&self, id: &str) -> Option<&AgentRuntime> {
        self.agents.get(id)
    }

    /// The ids of the configured agents.
    pub fn agent_ids(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// A context for one command, knowing the ids in `used` beyond the session's head.
    fn ctx(&self, known: &Known) -> Ctx {
        let n = self.entropy.fetch_add(1, Ordering::Relaxed);
        Ctx {
            now: self.clock.now(),
            seed: command_seed(n),
            used: known.used.clone(),
            limits: self.limits.engine(),
            recalled: known.recalled.clone(),
        }
    }

    /// Reads back from the log the versions a command asked for ([`Rejection::Recall`]).
    async fn recall(&self, session_id: &str, seqs: &[u64], into: &mut Recalled) -> Result<()> {
        for &seq in seqs {
            if into.has(seq) {
                continue;
            }
            let logged = self.store.events_after(session_id, seq.saturating_sub(1), 1).await?;
            let found = logged.first().filter(|l| l.seq == seq).is_some_and(|l| into.insert(seq, &l.event));
            if !found {
                return Err(StoreError::Corrupt {
                    session_id: session_id.to_owned(),
                    message: format!("event {seq} is not the version the head says it wrote"),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Lists the tools of agent `agent_id`'s MCP servers where the last listing is stale
    /// (the server said `tools/list_changed`, a connection was reopened, or five minutes
    /// passed), so that the sessions [`App::session_init`] starts next offer them, and the
    /// turns [`App::submit`] starts in existing sessions (a new agent config version).
    pub(crate) async fn list_mcp_tools(&self, agent_id: &str) {
        if let Some(mcp) = self.agents.get(agent_id).and_then(|a| a.mcp.as_ref()) {
            mcp.refresh().await;
        }
    }

    /// The init of a new session for `agent_id`. Its declared config holds the tools of the
    /// agent's MCP servers as last listed ([`App::list_mcp_tools`]): what a session's model is
    /// offered is in its log, and a replay offers the same.
    pub(crate) fn session_init(&self, agent_id: &str, identity: WorkerIdentity) -> Result<SessionInit> {
        let agent = self.agents.get(agent_id).ok_or_else(|| Error::UnknownAgent(agent_id.to_owned()))?;
        let mut declared = agent.declared.clone();
        if let Some(mcp) = &agent.mcp {
            let tools = mcp.tools();
            if !tools.is_empty() {
                declared.tools.get_or_insert_with(Vec::new).extend(tools);
            }
        }
        Ok(SessionInit {
            agent_id: agent_id.to_owned(),
            identity,
            declared: Some(declared),
            has_worker: agent.worker.is_some(),
            parent: None,
            ancestry: Vec::new(),
            defaults: self.defaults,
            budget: agent.budget,
            fork: None,
        })
    }

    /// Loads a session, or a fresh uncreated one with version 0. Only the messages this host
    /// has not seen yet are read.
    pub async fn load(&self, session_id: &str) -> Result<(Session, u64)> {
        if self.sole_writer
            && let Some(Newest { version, session: Some(session) }) = self.committed.get(session_id)
        {
            return Ok((session, version));
        }
        self.load_stored(session_id).await
    }

    /// [`App::load`] from the store, whatever this app committed.
    async fn load_stored(&self, session_id: &str) -> Result<(Session, u64)> {
        let known = self.messages.get(session_id);
        if let Some(known) = known {
            let Some((loaded, new)) = self.store.load_since(session_id, known.len() as u64).await? else {
                return Ok((Session::new(session_id), 0));
            };
            let mut session = loaded.session;
            session.restore_messages_onto(&known, new);
            if session.tree().is_whole() {
                self.remember_messages(&session);
                return Ok((session, loaded.version));
            }
            // Not a prefix after all (cannot happen with append-only messages): read it all.
        }
        Ok(match self.store.load(session_id).await? {
            Some(loaded) => {
                self.remember_messages(&loaded.session);
                (loaded.session, loaded.version)
            }
            None => (Session::new(session_id), 0),
        })
    }

    fn remember_messages(&self, session: &Session) {
        self.messages.insert(session.id().to_string(), session.tree().clone());
    }

    /// Loads `session_id`, asks `build` for the commands to run against it, handles them in
    /// order and commits the events atomically. A concurrent writer makes it reload and try
    /// again; a rejection of any command writes nothing and is returned.
    pub async fn execute<F>(&self, session_id: &str, build: F) -> Result<Executed>
    where
        F: FnMut(&Session) -> Result<Vec<Command>>,
    {
        self.execute_with(session_id, None, Mode::default(), build).await
    }

    /// [`App::execute`], starting from `known`, a session and version this host has just loaded
    /// or committed, instead of loading it again, and committing as `mode` says. The store's
    /// version check decides whether `known` is still current: if the session moved on, the
    /// commit conflicts and it is loaded afresh. A `known` state that gives nothing to write or
    /// a refusal is checked against a fresh load too, so the outcome is always the one a fresh
    /// load gives.
    pub(crate) async fn execute_with<F>(
        &self,
        session_id: &str,
        known: Option<(Session, u64)>,
        mode: Mode,
        build: F,
    ) -> Result<Executed>
    where
        F: FnMut(&Session) -> Result<Vec<Command>>,
    {
        // Boxed: it holds sessions by value and awaits the store, and every path that commits
        // (a dispatcher run's, several calls deep) would otherwise carry it inline; in a debug
        // build those frames overflowed a 2 MiB worker stack (a sub-agent spawn refused on the
        // AWS backend did: 1.9 MiB in eleven frames).
        Box::pin(self.execute_inline(session_id, known, mode, build)).await
    }

    async fn execute_inline<F>(
        &self,
        session_id: &str,
        mut known: Option<(Session, u64)>,
        mode: Mode,
        mut build: F,
    ) -> Result<Executed>
    where
        F: FnMut(&Session) -> Result<Vec<Command>>,
    {
        // What the store knows that the head forgot: ids used before, learnt from a refused
        // commit (see `UsedIds`), and versions read back from the log.
        let mut known_ids = Known::default();
        // A commit creating the session was refused: if the session still does not exist, no
        // racing create won, the store keeps the id of a disposed session.
        let mut create_refused = false;
        // A commit conflicted: what this app committed is not the newest, read the store.
        let mut conflicted = false;
        for _ in 0..MAX_CONFLICT_RETRIES + usize::from(known.is_some()) {
            let hinted = known.is_some();
            let (session, version) = match known.take() {
                Some(known) => known,
                None if conflicted => self.load_stored(session_id).await?,
                None => self.load(session_id).await?,
            };
            if create_refused && !session.is_created() {
                return Err(Error::SessionDisposed(session_id.to_owned()));
            }
            let now = self.clock.now();
            // When the session was due to be looked at before this commit (a wake-up for it is
            // on its way, or a run is at it).
            let scheduled = if mode.in_run { None } else { wake_time(&session.plan(now), now) };
            // What the session's summary showed before: its status, for whoever is told of a change.
            let status_before = crate::api::SessionStatus::of(&session);
            let handled = self.handle_all(session_id, session, &mut build, &mut known_ids).await;
            if hinted && !handled.as_ref().is_ok_and(|(_, events)| !events.is_empty()) {
                continue;
            }
            let (mut session, mut events) = handled?;
            if events.is_empty() {
                return Ok(Executed { session, events, version, claimed: None });
            }
            let mut claimed = None;
            let mut plan = session.plan(now);
            if mode.claim_next
                && let Some(effect) = claimable(&plan)
                && mode
                    .claim_before
                    .is_none_or(|deadline| crate::dispatch::fits(&session, &effect, now, deadline))
                && let Ok(t) = handle(&session, claim_command(&effect), &self.ctx(&known_ids))
            {
                events.extend(t.events);
                session = t.session;
                claimed = Some(effect);
                plan = session.plan(now);
            }
            let wake_at = wake_time(&plan, now);
            // A run of the session arms its next wake-up when it ends, and whoever holds a
            // claimed effect performs it; otherwise a wake-up goes out when the session is due
            // sooner than it already was. It goes out before the commit, so no crash can leave
            // a commit without one (at worst a wake-up finds nothing new).
            let announced = match wake_at {
                Some(at)
                    if !mode.in_run && claimed.is_none() && scheduled.is_none_or(|before| at < before) =>
                {
                    self.announce(session_id, at, session.events_applied())
                        .await
                        .then(|| (at, self.clock.now()))
                }
                _ => None,
            };
            let commit = Commit {
                session: &session,
                events: &events,
                wake_at,
                wake_queued: mode.in_run || announced.is_some(),
                sessions_per_owner: self.limits.sessions_per_owner.map(|n| n as u64),
            };
            // Until the store answers for sure, the commit may land unseen (see `PendingCommit`).
            let pending = PendingCommit { committed: &self.committed, session_id, expected: version };
            let outcome = self.store.commit(session_id, version, commit).await;
            // Landed, or refused having written nothing; any other error may hide a landed
            // write (a lost answer), and `pending` forgets the state as it drops.
            if matches!(
                outcome,
                Ok(_)
                    | Err(StoreError::Conflict { .. }
                        | StoreError::IdsUsed { .. }
                        | StoreError::OwnerFull { .. })
            ) {
                pending.settled();
            }
            match outcome {
                Ok(version) => {
                    // A slow commit: the run its wake-up started may have stopped waiting for it
                    // (and looks again only a minute later), so the news goes out once more.
                    if let Some((at, sent)) = announced
                        && self.clock.now().0 - sent.0 >= SLOW_COMMIT.as_millis() as i64
                    {
                        tracing::info!(session_id, "a slow commit landed; its wake-up goes out again");
                        self.announce(session_id, at, session.events_applied()).await;
                    }
                    self.remember_commit(session_id, &session, version);
                    self.remember_messages(&session);
                    self.notify(session_id, &session, &events, status_before);
                    return Ok(Executed { session, events, version, claimed });
                }
                Err(StoreError::Conflict { .. }) => {
                    create_refused = version == 0;
                    conflicted = true;
                }
                // The head forgot these ids, the store did not: handle again knowing them (an
                // old turn id then names its turn, a reused call id is a no-op).
                Err(StoreError::IdsUsed { ids, .. }) => known_ids.used.extend(ids),
                Err(StoreError::OwnerFull { limit, .. }) => {
                    return Err(Error::TooManySessions {
                        limit: usize::try_from(limit).unwrap_or(usize::MAX),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contended(session_id.to_owned()))
    }

    /// Handles the commands `build` asks for against `session`, in order; a command that
    /// needs versions the head let go is handled again once they are read back.
    async fn handle_all<F>(
        &self,
        session_id: &str,
        mut session: Session,
        build: &mut F,
        known: &mut Known,
    ) -> Result<(Session, Vec<Event>)>
    where
        F: FnMut(&Session) -> Result<Vec<Command>>,
    {
        let commands = build(&session)?;
        let mut events = Vec::new();
        for command in commands {
            let transition = loop {
                match handle(&session, command.clone(), &self.ctx(known)) {
                    // Each round reads what it lacks; a recall of what was read is a fault.
                    Err(Rejection::Recall(seqs)) if seqs.iter().any(|&seq| !known.recalled.has(seq)) => {
                        self.recall(session_id, &seqs, &mut known.recalled).await?;
                    }
                    handled => break handled?,
                }
            };
            events.extend(transition.events);
            session = transition.session;
        }
        Ok((session, events))
    }

    /// Tells listeners what a commit wrote.
    fn notify(
        &self,
        session_id: &str,
        session: &Session,
        events: &[Event],
        status_before: crate::api::SessionStatus,
    ) {
        let ended_turns: Vec<TurnId> = events
            .iter()
            .filter_map(|e| match e {
                Event::TurnEnded { turn_id, .. } => Some(turn_id.clone()),
                _ => None,
            })
            .collect();
        for turn in ended_turns.iter().filter_map(|id| session.turn(id)) {
            self.ended.insert((session_id.to_owned(), turn.id.clone()), turn.clone());
        }
        self.metrics.observe(session, events, self.clock.now());
        crate::trace::turn_ended(session, events, self.clock.now());
        let shows = events.iter().any(turnstone_ahp::shows_in_chat);
        self.notifier.committed(session_id, session.events_applied(), &ended_turns, shows);
        // A creating commit's summary is `root/sessionAdded`'s.
        let created = events.iter().any(|e| matches!(e, Event::SessionCreated { .. }));
        let titled = events.iter().any(|e| matches!(e, Event::SessionTitled { .. }));
        let forks: Vec<SessionId> = events
            .iter()
            .filter_map(|e| match e {
                Event::Forked { session_id, .. } => Some(session_id.clone()),
                _ => None,
            })
            .collect();
        // A sub-agent's creation is news in its parent's catalog; a fork's is told by its
        // source's commit (`session.forked`).
        let spawned = created && session.init().is_some_and(|i| i.parent.is_some());
        let changed = (shows || titled || !forks.is_empty()) && !created;
        // Nobody follows the catalog (no AHP root subscriber here, no notifier beyond): no notice.
        let heard = self.notifier.hears_root() || self.changed.receiver_count() > 0;
        if (changed || spawned) && heard {
            let status = crate::api::SessionStatus::of(session);
            let summary = SessionChanged {
                session_id: session.id().clone(),
                agent_id: session.agent_id().to_owned(),
                owner: session.init().and_then(|i| i.identity.id.clone()),
                status,
                status_changed: status != status_before,
                titled,
                title: session.title().map(str::to_owned),
                forks,
                chat_of: chat_of(session),
                created,
                at: self.clock.now(),
            };
            self.notifier.root(crate::notify::RootNotice::SummaryChanged(Box::new(summary.clone())));
            if self.changed.receiver_count() > 0 {
                let _ = self.changed.send(summary);
            }
        }
        if created {
            // No listener is no error.
            let _ = self.created.send(session.id().clone());
            if self.notifier.hears_root() {
                self.notifier.root(crate::notify::RootNotice::SessionAdded(session.id().clone()));
            }
        }
    }

    /// Enqueues a wake-up for `session_id` at `at`.
    pub(crate) async fn wake_at(&self, session_id: &str, reason: &str, at: Timestamp) -> Result<()> {
        self.queue.send(WakeUp::new(session_id, reason), self.delay_until(at)).await.map_err(Error::from)
    }

    fn delay_until(&self, at: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(at.0 - self.clock.now().0).unwrap_or(0))
    }

    /// Enqueues, ahead of the commit that reaches log length `seq`, the wake-up it needs at
    /// `at`. Whether it went out: if not, the commit asks the store to index its wake time
    /// (see [`Commit::wake_queued`]), and the sweep finds the session.
    async fn announce(&self, session_id: &str, at: Timestamp, seq: u64) -> bool {
        let wake = WakeUp { seq: Some(seq), ..WakeUp::new(session_id, "commit") };
        match self.queue.send(wake, self.delay_until(at)).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(session_id, error = %e, "could not enqueue a wake-up; the sweep will");
                false
            }
        }
    }

    /// Enqueues `wake_up` to be delivered after `delay`.
    pub(crate) async fn enqueue(&self, wake_up: WakeUp, delay: Duration) -> Result<()> {
        self.queue.send(wake_up, delay).await.map_err(Error::from)
    }

    /// Enqueues a wake-up for `session_id` now.
    pub(crate) async fn wake(&self, session_id: &str, reason: &str) -> Result<()> {
        self.queue.send(WakeUp::new(session_id, reason), Duration::ZERO).await.map_err(Error::from)
    }

    /// Submits a client input for `caller`; creates the session, owned by the caller, on its
    /// first input. A session the caller may not drive is not found, as one that does not
    /// exist.
    pub async fn submit(
        &self,
        session_id: &str,
        input: ClientInput,
        placement: Placement,
        caller: &Caller,
    ) -> Result<Submitted> {
        let command = match (placement, &input) {
            (Placement::Steer, ClientInput::Message(message)) => Command::Steer { input: message.clone() },
            (Placement::Steer, other) => {
                return Err(Error::Rejected(Rejection::invalid(
                    "steer",
                    format!("only a client.message can steer a turn, not {}", other.name()),
                )));
            }
            (placement, _) => Command::Submit {
                input: input.clone(),
                queue: placement == Placement::Queue,
                origin: TurnOrigin::Client,
            },
        };
        let not_found = || Error::SessionNotFound(session_id.to_owned());
        if let Some(agent_id) = input.agent_id() {
            self.list_mcp_tools(agent_id).await;
        }
        let build = |session: &Session| {
            let mut commands = Vec::new();
            if session.is_created() {
                if !caller.may(Access::Drive, session) {
                    return Err(not_found());
                }
                // What its MCP servers offer now (a no-op when the session offers it already).
                if let Some(mcp) = self.agent(session.agent_id()).and_then(|a| a.mcp.as_ref()) {
                    commands.push(Command::McpToolsListed { tools: mcp.tools() });
                }
            } else {
                let agent_id = input.agent_id().ok_or_else(not_found)?;
                let owner = caller.owner().ok_or_else(not_found)?;
                let init = self.session_init(agent_id, owner)?;
                commands.push(Command::Create { init: Box::new(init) });
            }
            commands.push(command.clone());
            Ok(commands)
        };
        let mode = Mode { claim_next: self.claim_ahead, ..Mode::default() };
        let executed = match self.execute_with(session_id, None, mode, build).await {
            Ok(executed) => executed,
            Err(Error::Rejected(rejection)) => {
                // The engine answers a known turn id before any other check, but knows only the
                // turns its head remembers: a refused input whose turn id only the store
                // remembers (an old turn, sent again by a client that missed the answer) is a
                // known turn too, and writes nothing. Refusals never reach the store's
                // `IdsUsed` check, so it is asked here, on the refusal path only. (Found by the
                // runtime simulation, seed 9: a retry was refused while another turn ran.)
                let starts_turn = matches!(input, ClientInput::Message(_) | ClientInput::Messages(_));
                if let Some(id) = input.turn_id().filter(|_| starts_turn)
                    && !self.store.used_ids(session_id, &[UsedId::Turn(id.clone())]).await?.is_empty()
                {
                    return Ok(Submitted {
                        session_id: session_id.into(),
                        turn_id: Some(id.clone()),
                        queued: false,
                    });
                }
                return Err(Error::Rejected(rejection));
            }
            Err(e) => return Err(e),
        };
        if let Some(effect) = executed.claimed.clone() {
            // Claimed in the submit's commit: a queue worker of this process performs it,
            // starting from the state that commit left (see `take_handoff`).
            let version = executed.version;
            self.handoff.insert(session_id.to_owned(), ClaimedAhead { effect, version });
            if let Err(e) = self.wake(session_id, "handoff").await {
                tracing::warn!(session_id, error = %e, "could not enqueue a hand-off; its deadline retries it");
            }
        }
        let session = &executed.session;
        let turn_id = match input.turn_id() {
            // A known turn id writes nothing; one only the store remembered writes nothing too.
            Some(id) => (session.knows_turn(id) || executed.events.is_empty())
                .then(|| session.resolve_turn_id(id).to_owned()),
            None => executed.events.iter().find_map(|e| match e {
                Event::TurnStarted { turn } | Event::TurnQueued { turn } => Some(turn.id.clone()),
                _ => None,
            }),
        }
        .or_else(|| match input {
            ClientInput::Message(_) | ClientInput::Messages(_) | ClientInput::Action(_) => {
                session.active_turn_id().cloned()
            }
            _ => None,
        });
        let queued = turn_id
            .as_ref()
            .and_then(|t| session.turn(t))
            .is_some_and(|t| t.status == turnstone_engine::session::TurnStatus::Queued);
        Ok(Submitted { session_id: session_id.into(), turn_id, queued })
    }

    /// Creates session `session_id` of agent `agent_id`, owned by `caller`, with no turn yet
    /// (AHP's `createSession`). A session that exists already is refused
    /// (`Rejection::AlreadyExists`), whoever owns it.
    pub async fn create_session(
        &self,
        session_id: &str,
        agent_id: &str,
        caller: &Caller,
    ) -> Result<Executed> {
        let owner = caller.owner().ok_or_else(|| Error::SessionNotFound(session_id.to_owned()))?;
        self.list_mcp_tools(agent_id).await;
        let init = self.session_init(agent_id, owner)?;
        self.execute(session_id, |_| Ok(vec![Command::Create { init: Box::new(init.clone()) }])).await
    }

    /// Runs one command against an existing session that `caller` may `access` (any other is
    /// not found, as one that does not exist).
    pub async fn command_as(
        &self,
        session_id: &str,
        caller: &Caller,
        access: Access,
        command: Command,
    ) -> Result<Executed> {
        self.command_where(session_id, None, Mode::default(), command, |session| caller.may(access, session))
            .await
    }

    /// Settles a call of session `session_id` with `action` (`calls/settle`), if `caller` may:
    /// it must reach the session ([`Access::Settle`]) and answer calls of the call's side
    /// ([`Caller::may_settle`]): a client settles only client-handled calls, a machine key
    /// only those its worker runs. A refused settle writes nothing. A call the session does
    /// not have is left to the engine to refuse (`unknown_call`).
    pub async fn settle_as(&self, session_id: &str, caller: &Caller, action: Action) -> Result<Executed> {
        let call_id = match &action {
            Action::ToolResult(a) => a.id.clone(),
            Action::ToolError(a) | Action::LlmError(a) => a.id.clone(),
            Action::LlmResult(a) => a.id.clone(),
            _ => None,
        };
        self.execute_with(session_id, None, Mode::default(), |session| {
            if !session.is_created() || !caller.may(Access::Settle, session) {
                return Err(Error::SessionNotFound(session_id.to_owned()));
            }
            if let Some(call) = call_id.as_ref().and_then(|id| session.call(id)) {
                let (settler, whose) = if call.is_client_tool() {
                    (Settler::Client, "a client tool's call, answered by the session's client")
                } else {
                    (Settler::Worker, "run by the agent's worker, answered with its machine key")
                };
                if !caller.may_settle(settler) {
                    return Err(Error::SettleForbidden { call_id: call.id.to_string(), whose });
                }
            }
            Ok(vec![Command::Settle { action: action.clone() }])
        })
        .await
    }

    /// Runs one command against an existing session.
    pub async fn command(&self, session_id: &str, command: Command) -> Result<Executed> {
        self.command_with(session_id, None, Mode::default(), command).await
    }

    /// [`App::command`], starting from a state this host just loaded or committed, committed
    /// as `mode` says (see [`App::execute_with`]).
    pub(crate) async fn command_with(
        &self,
        session_id: &str,
        known: Option<(Session, u64)>,
        mode: Mode,
        command: Command,
    ) -> Result<Executed> {
        self.command_where(session_id, known, mode, command, |_| true).await
    }

    /// One command against an existing session that `reachable` accepts; any other session is
    /// not found.
    async fn command_where(
        &self,
        session_id: &str,
        known: Option<(Session, u64)>,
        mode: Mode,
        command: Command,
        reachable: impl Fn(&Session) -> bool,
    ) -> Result<Executed> {
        self.execute_with(session_id, known, mode, |session| {
            if !session.is_created() || !reachable(session) {
                return Err(Error::SessionNotFound(session_id.to_owned()));
            }
            Ok(vec![command.clone()])
        })
        .await
    }

    /// The record of turn `turn_id` (its own id, not an alias) as the commit of this process
    /// that ended it left it, if that was lately; None tells the caller to load.
    pub fn ended_turn(&self, session_id: &str, turn_id: &TurnId) -> Option<TurnRecord> {
        self.ended.get(&(session_id.to_owned(), turn_id.clone()))
    }

    /// A turn's record: from the head, or rebuilt from the log for an older turn.
    pub async fn turn_record(&self, session: &Session, turn_id: &TurnId) -> Result<Option<TurnRecord>> {
        if let Some(turn) = session.turn(turn_id) {
            return Ok(Some(turn.clone()));
        }
        if !session.knows_turn(turn_id) {
            // Older than the head remembers: the store knows whether it ever was a turn.
            let used = self.store.used_ids(session.id(), &[UsedId::Turn(turn_id.clone())]).await?;
            if used.is_empty() {
                return Ok(None);
            }
        }
        let turn_id = session.resolve_turn_id(turn_id);
        let mut events = Vec::new();
        let mut after = 0;
        loop {
            let page = self.store.events_after(session.id(), after, 1000).await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            events.extend(page.into_iter().map(|e| e.event));
        }
        Ok(turnstone_engine::session::turn_from_log(turn_id, &events))
    }

    /// Takes the effect a submit claimed for `session_id`, if one waits, with the state its
    /// commit left unless this process committed the session again since (a run that came
    /// first may have moved on: then the state is dropped, and the worker loads).
    pub(crate) fn take_handoff(&self, session_id: &str) -> Option<Handoff> {
        let ClaimedAhead { effect, version } = self.handoff.remove(session_id)?;
        let state = match self.committed.get(session_id) {
            Some(Newest { version: newest, session: Some(session) }) if newest == version => {
                Some((session, version))
            }
            _ => None,
        };
        Some(Handoff { effect, state })
    }

    /// Keeps the state a commit left, unless this app knows of a newer commit.
    fn remember_commit(&self, session_id: &str, session: &Session, version: u64) {
        self.committed.update(session_id.to_owned(), |newest| match newest {
            Some(newest) if newest.version > version => newest.clone(),
            _ => Newest { version, session: Some(session.clone()) },
        });
    }

    /// Loads an existing session.
    pub async fn session(&self, session_id: &str) -> Result<Session> {
        // Through the host's message cache: a read costs the messages recorded since this host
        // last saw the session, not the transcript (long-polls read on every turn end).
        let (session, _) = self.load(session_id).await?;
        if session.is_created() { Ok(session) } else { Err(Error::SessionNotFound(session_id.to_owned())) }
    }
}

/// The seed of the `n`th command's ids: the counter scrambled. A command mints its ids by
/// stepping its seed (splitmix64); seeds that themselves stepped by that same increment would
/// make one command's second id the next command's first (two messages with one id in a
/// session), so consecutive commands get unrelated seeds instead.
fn command_seed(n: u64) -> u64 {
    turnstone_engine::ids::IdMinter::new(n).next_u64()
}

/// Where an app's id seeds start: random per app (the standard library's hasher keys come from
/// the OS and differ for every `RandomState`), so two apps started in the same millisecond, in
/// one process or in two containers with the same pid, never mint the same ids.
fn app_seed(now: Timestamp) -> u64 {
    random_u64(now.0)
}

/// 64 bits from the OS's randomness: each `RandomState` is keyed from it, so hashing anything
/// (`salt` only varies the input) gives a number no one can predict. For what must not be
/// guessed or repeat across processes: minted session ids, error references, app seeds.
pub(crate) fn random_u64(salt: impl std::hash::Hash) -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(salt)
}

/// An effect a submit claimed, for a queue worker of this process to perform, and the state
/// the submit's commit left if no commit of this process came after it (a hint: commits are
/// version-checked, so a state that went stale only costs a reload).
pub(crate) struct Handoff {
    pub effect: Effect,
    pub state: Option<(Session, u64)>,
}

/// What an app knows of a session's newest commit: its version, and the state it left if the
/// commit was this app's and its outcome is known.
#[derive(Debug, Clone)]
struct Newest {
    version: u64,
    session: Option<Session>,
}

/// A commit on its way to the store. Dropped before the store answered for sure (its caller
/// went away, or the store failed in a way that may hide a landed write), it makes the app
/// forget the session's state: the commit expecting version `expected` may have landed, so
/// nothing older than its version is the newest, and loads read the store until the app's
/// next successful commit.
struct PendingCommit<'a> {
    committed: &'a Memo<String, Newest>,
    session_id: &'a str,
    expected: u64,
}

impl PendingCommit<'_> {
    /// The store answered for sure: nothing to forget.
    fn settled(self) {
        std::mem::forget(self);
    }
}

impl Drop for PendingCommit<'_> {
    fn drop(&mut self) {
        self.committed.update(self.session_id.to_owned(), |newest| Newest {
            version: newest.map_or(0, |n| n.version).max(self.expected + 1),
            session: None,
        });
    }
}

/// An effect a submit's commit claimed, and the version that commit made.
#[derive(Debug, Clone)]
struct ClaimedAhead {
    effect: Effect,
    version: u64,
}

/// How a commit is made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Mode {
    /// Also claim the model call or decision delivery the new state makes due next (unless a
    /// timer or routing comes first): the step and the next effect's claim cost one write.
    /// The claimed effect is returned in [`Executed::claimed`]; if nobody performs it, its
    /// deadline retries it.
    pub claim_next: bool,
    /// Claim only an effect that can end before this (a run's deadline, with its margin:
    /// `dispatch::fits`); one that cannot is left unclaimed, for the run that the one at work
    /// hands the session back to, instead of held by a claim nobody will perform.
    pub claim_before: Option<Timestamp>,
    /// The commit is made by a run of this session, which arms the next wake-up when it ends:
    /// the commit itself sends none.
    pub in_run: bool,
}

/// When a session with `plan` should next be looked at: now if work is due (recorded so the
/// sweep finds it if the wake-up is lost), else its next timer.
fn wake_time(plan: &Plan, now: Timestamp) -> Option<Timestamp> {
    if plan.effects.is_empty() { plan.wake_at } else { Some(now) }
}

/// The effect a commit may claim ahead: the first model call or decision delivery, unless a
/// timer or routing is due first (those run through the dispatcher's own order).
fn claimable(plan: &Plan) -> Option<Effect> {
    if plan.effects.iter().any(|e| matches!(e, Effect::Tick | Effect::Route { .. })) {
        return None;
    }
    plan.effects
        .iter()
        .find(|e| matches!(e, Effect::RunLlmCall { .. } | Effect::DeliverDecision { .. }))
        .cloned()
}

/// The command that claims `effect`.
pub(crate) fn claim_command(effect: &Effect) -> Command {
    match effect {
        Effect::RunLlmCall { call_id, attempt } => {
            Command::ClaimLlmCall { call_id: call_id.clone(), attempt: *attempt }
        }
        Effect::DeliverDecision { decision_id, attempt } => {
            Command::ClaimDecision { decision_id: decision_id.clone(), attempt: *attempt }
        }
        Effect::RunToolCall { call_id, attempt } => {
            Command::ClaimToolCall { call_id: call_id.clone(), attempt: *attempt }
        }
        // Not claimable; `claimable` never returns these.
        Effect::Tick | Effect::Route { .. } => Command::Tick,
    }
}

/// Whether `effect` is still claimed in `session` at its attempt (and so still to perform).
pub(crate) fn still_claimed(session: &Session, effect: &Effect) -> bool {
    match effect {
        Effect::RunLlmCall { call_id, attempt } | Effect::RunToolCall { call_id, attempt } => {
            session.call(call_id).is_some_and(|c| c.is_pending() && c.attempt == *attempt)
        }
        Effect::DeliverDecision { decision_id, attempt } => {
            session.decision().is_some_and(|d| &d.id == decision_id && d.in_flight && d.attempts == *attempt)
        }
        Effect::Tick | Effect::Route { .. } => false,
    }
}

/// Whether an error is the engine saying a claim is no longer due.
pub(crate) fn is_stale_claim(e: &Error) -> bool {
    matches!(e, Error::Rejected(Rejection::StaleClaim(_)))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use turnstone_engine::ids::IdMinter;

    use super::{app_seed, command_seed};

    #[test]
    fn apps_started_at_one_time_start_apart() {
        let now = turnstone_engine::time::Timestamp(1_796_000_000_000);
        let seeds: HashSet<u64> = (0..100).map(|_| app_seed(now)).collect();
        assert_eq!(seeds.len(), 100);
    }

    #[test]
    fn consecutive_commands_mint_no_id_twice() {
        let mut seen = HashSet::new();
        let base = 0x1234_5678_9abc_def0_u64;
        for n in 0..2000 {
            let mut minter = IdMinter::new(command_seed(base.wrapping_add(n)));
            for _ in 0..8 {
                assert!(seen.insert(minter.next_u64()), "command {n} minted an id an earlier command had");
            }
        }
    }
}
