//! The Lambda deployment as the cost examples (`aws_cost`, `long_session`) run it against moto:
//! an `api` engine per client input and a `dispatch` engine per SQS batch on one metered
//! `DynamoStore` table and `SqsQueue` (see `aws_cost.rs`). Shared by two examples; each uses part.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_trait::async_trait;
use turnstone_aws::{AwsClients, DynamoRegistry, DynamoStore, ManagementFrames, SqsQueue, moto};
use turnstone_engine::ids::TurnId;
use turnstone_engine::protocol::{ClientInput, ClientMessagesInput, DraftMessage, Role};
use turnstone_engine::session::{TurnStatus, UsedId};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::ahp::{Pusher, Pushes};
use turnstone_runtime::api::Placement;
use turnstone_runtime::app::AgentRuntime;
use turnstone_runtime::assemble::{self, Engine, Topology};
use turnstone_runtime::auth::Caller;
use turnstone_runtime::clock::Clock;
use turnstone_runtime::config::Config;
use turnstone_runtime::queue::{Consumer, Queue, WakeUp};
use turnstone_runtime::store::{
    Commit, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError,
};

use crate::meter::{Meter, Tally};

/// The program's own looks while it waits for a turn to end (not the functions' work): batches
/// asked of the event source that came back empty, and the observer's loads of the session.
/// More of them per step means the program polled more, as when moto answers slower.
pub static HARNESS_POLLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long a turn may take before the run fails.
pub const TURN_DEADLINE: Duration = Duration::from_secs(120);
/// How long the event source waits for a message while a turn is still running.
pub const POLL: Duration = Duration::from_secs(1);
/// The most messages one `dispatch` invocation gets (the event source's default batch size).
pub const BATCH: usize = 10;
/// The most new messages of one pre-fill turn (odd: user, assistant, ..., user), so its first
/// commit stays well under a transaction's 100 items.
pub const PREFILL_CHUNK: usize = 39;

// ---------------------------------------------------------------------------------------------
// The store, counting commits
// ---------------------------------------------------------------------------------------------

/// A store (DynamoDB's, or SQLite's for `long_session`); a successful commit is a step.
pub struct CountingStore<S> {
    pub inner: S,
    pub meter: Arc<Meter>,
}

#[async_trait]
impl<S: Store> Store for CountingStore<S> {
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError> {
        self.inner.load(session_id).await
    }

    async fn load_since(
        &self,
        session_id: &str,
        from: u64,
    ) -> Result<Option<(Loaded, Vec<turnstone_engine::protocol::TreeNode>)>, StoreError> {
        self.inner.load_since(session_id, from).await
    }

    async fn used_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError> {
        self.inner.used_ids(session_id, ids).await
    }

    async fn commit(
        &self,
        session_id: &str,
        expected_version: u64,
        commit: Commit<'_>,
    ) -> Result<u64, StoreError> {
        let result = self.inner.commit(session_id, expected_version, commit).await;
        if result.is_ok() {
            self.meter.committed();
        }
        result
    }

    async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>, StoreError> {
        self.inner.events_after(session_id, after_seq, limit).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError> {
        self.inner.list_sessions(filter, cursor, limit).await
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<String>, StoreError> {
        self.inner.due(now, limit).await
    }

    async fn dispose(&self, session_id: &str) -> Result<bool, StoreError> {
        self.inner.dispose(session_id).await
    }

    fn exclusive(&self) -> bool {
        self.inner.exclusive()
    }
}

// ---------------------------------------------------------------------------------------------
// The Lambda model
// ---------------------------------------------------------------------------------------------

/// The invocations of one turn, by function, with their wall times.
#[derive(Debug, Default)]
pub struct Invocations {
    pub api: Vec<Duration>,
    pub dispatch: Vec<Duration>,
}

impl Invocations {
    pub fn count(&self) -> u64 {
        (self.api.len() + self.dispatch.len()) as u64
    }

    /// Billed milliseconds (each invocation rounded up to the millisecond).
    pub fn billed_ms(&self) -> u64 {
        self.api.iter().chain(&self.dispatch).map(|d| d.as_micros().div_ceil(1000) as u64).sum()
    }

    /// SQS requests of the event source: one receive and one batch delete per `dispatch`
    /// invocation.
    pub fn event_source_requests(&self) -> u64 {
        2 * self.dispatch.len() as u64
    }
}

/// The `api` and the `dispatch` function's engines.
pub struct Functions {
    pub api: Engine,
    pub dispatch: Engine,
}

/// What every cell shares.
pub struct Shared {
    /// The Management API the functions would push through (no session has a subscriber).
    pub frames: ManagementFrames,
    pub no_ahp: bool,
    pub config: Config,
    pub agents: BTreeMap<String, AgentRuntime>,
    /// The functions' DynamoDB client, metered.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// Clients without the meter: tables, the event source, the observer.
    pub plain: AwsClients,
    /// The functions' queue, metered.
    pub queue: Arc<dyn Queue>,
    /// The event source's view of the queue (not metered: its requests are modelled).
    pub source: SqsQueue,
    pub meter: Arc<Meter>,
    /// The functions' clock (the system's, or one a benchmark moves on).
    pub clock: Arc<dyn Clock>,
}

impl Shared {
    /// A cell of the matrix on a fresh table.
    pub async fn cell(&self) -> anyhow::Result<Bench> {
        let table = moto::unique("aws-cost");
        DynamoStore::new(self.plain.dynamodb.clone(), table.clone()).create_table().await?;
        let dynamodb = self.dynamodb.clone();
        let observer_store: Arc<dyn Store> =
            Arc::new(DynamoStore::new(self.plain.dynamodb.clone(), table.clone()));
        let observer = assemble::engine(
            &self.config,
            self.agents.clone(),
            observer_store,
            Arc::clone(&self.queue),
            Topology::Split,
        )?;
        Ok(Bench {
            frames: self.frames.clone(),
            no_ahp: self.no_ahp,
            config: self.config.clone(),
            agents: self.agents.clone(),
            table,
            dynamodb,
            queue: Arc::clone(&self.queue),
            source: self.source.clone(),
            observer,
            meter: Arc::clone(&self.meter),
            clock: Arc::clone(&self.clock),
        })
    }

    /// Drops a cell's table (moto keeps everything in memory) and what the meter knows of it.
    pub async fn drop_cell(&self, bench: Bench) -> anyhow::Result<()> {
        self.plain.dynamodb.delete_table().table_name(&bench.table).send().await?;
        self.meter.forget();
        Ok(())
    }
}

/// One cell of the matrix: a table, and the functions' store and queue on it.
pub struct Bench {
    pub frames: ManagementFrames,
    pub no_ahp: bool,
    pub config: Config,
    pub agents: BTreeMap<String, AgentRuntime>,
    pub table: String,
    /// The metered client: each engine gets a store of its own on it, as each container has.
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub queue: Arc<dyn Queue>,
    /// The event source's view of the queue (not metered: its requests are modelled).
    pub source: SqsQueue,
    /// An engine on an unmetered store, to see how a turn ends.
    pub observer: Engine,
    pub meter: Arc<Meter>,
    pub clock: Arc<dyn Clock>,
}

/// One measured turn.
pub struct Measured {
    pub tally: Tally,
    pub invocations: Invocations,
    pub trace: Vec<String>,
    /// Messages in the session before and after the turn.
    pub before: usize,
    pub after: usize,
}

impl Bench {
    /// An engine on a store of its own, which has seen nothing (a new container).
    pub fn cold_engine(&self) -> anyhow::Result<Engine> {
        let inner = DynamoStore::new(self.dynamodb.clone(), self.table.clone());
        self.engine_on(Arc::new(CountingStore { inner, meter: Arc::clone(&self.meter) }))
    }

    pub fn engine_on(&self, store: Arc<dyn Store>) -> anyhow::Result<Engine> {
        // As `Deployment::open` with an AHP endpoint: commits read the session's subscribers
        // (on the metered client); nothing is posted, since no session has one.
        let pushes = (!self.no_ahp).then(|| {
            let registry = DynamoRegistry::new(self.dynamodb.clone(), self.table.clone());
            Pushes::new(Arc::new(registry), Arc::new(self.frames.clone()))
        });
        let wrap = pushes.clone();
        let engine = assemble::engine_at(
            &self.config,
            self.agents.clone(),
            store,
            Arc::clone(&self.queue),
            Topology::Split,
            move |notifier| match wrap {
                Some(pushes) => Arc::new(Pusher::new(notifier, pushes)),
                None => notifier,
            },
            Arc::clone(&self.clock),
        )?;
        if let Some(pushes) = pushes {
            pushes.attach(&engine.app);
        }
        Ok(engine)
    }

    /// The two functions, each a container of its own: a store each, warm from then on.
    pub fn functions(&self) -> anyhow::Result<Functions> {
        Ok(Functions { api: self.cold_engine()?, dispatch: self.cold_engine()? })
    }

    /// Messages the session holds (read without the meter).
    pub async fn messages(&self, session_id: &str) -> anyhow::Result<usize> {
        Ok(self.observer.app.load(session_id).await?.0.tree().len())
    }

    /// One client input and every invocation it takes, as on Lambda; with `cold`, each
    /// invocation gets fresh engines. Returns the messages the session holds afterwards.
    pub async fn run_turn(
        &self,
        functions: &mut Functions,
        cold: bool,
        session_id: &str,
        input: ClientInput,
        invocations: &mut Invocations,
    ) -> anyhow::Result<usize> {
        let turn_id = self.submit(functions, cold, session_id, input, invocations).await?;
        self.finish_turn(functions, cold, session_id, &turn_id, invocations).await
    }

    /// The `api` invocation of a client input: the turn it started.
    pub async fn submit(
        &self,
        functions: &mut Functions,
        cold: bool,
        session_id: &str,
        input: ClientInput,
        invocations: &mut Invocations,
    ) -> anyhow::Result<TurnId> {
        if cold {
            functions.api = self.cold_engine()?;
        }
        let started = Instant::now();
        let submitted =
            functions.api.app.submit(session_id, input, Placement::Start, &Caller::Anyone).await?;
        functions.api.app.notifier().flush().await;
        invocations.api.push(started.elapsed());
        submitted.turn_id.context("the input started no turn")
    }

    /// Runs `dispatch` invocations until `turn_id` has ended and nothing is queued; returns the
    /// messages the session holds then.
    pub async fn finish_turn(
        &self,
        functions: &mut Functions,
        cold: bool,
        session_id: &str,
        turn_id: &TurnId,
        invocations: &mut Invocations,
    ) -> anyhow::Result<usize> {
        let deadline = Instant::now() + TURN_DEADLINE;
        let mut ended: Option<usize> = None;
        loop {
            // Once the turn has ended, only what is queued already is left to run.
            let wait = if ended.is_some() { Duration::ZERO } else { POLL };
            let dispatched = self.dispatch_once(functions, cold, wait, invocations).await?;
            if !dispatched && let Some(messages) = ended {
                return Ok(messages);
            }
            if !dispatched {
                HARNESS_POLLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if ended.is_none() {
                HARNESS_POLLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (session, _) = self.observer.app.load(session_id).await?;
                if let Some(turn) = session.turn(turn_id).filter(|t| t.status.is_ended()) {
                    if turn.status != TurnStatus::Completed {
                        bail!("turn {turn_id} of {session_id} ended {:?}: {:?}", turn.status, turn.error);
                    }
                    ended = Some(session.tree().len());
                }
            }
            if Instant::now() > deadline {
                bail!("turn {turn_id} of {session_id} did not end within {TURN_DEADLINE:?}");
            }
        }
    }

    /// One `dispatch` invocation, if a batch arrives within `wait`: as the event source and
    /// the function do it, each session of the batch once, in order, then the batch deleted.
    /// Whether there was one.
    pub async fn dispatch_once(
        &self,
        functions: &mut Functions,
        cold: bool,
        wait: Duration,
        invocations: &mut Invocations,
    ) -> anyhow::Result<bool> {
        let batch = self.source.receive(BATCH, wait).await?;
        if batch.is_empty() {
            return Ok(false);
        }
        if cold {
            functions.dispatch = self.cold_engine()?;
        }
        let mut sessions: BTreeMap<&str, &WakeUp> = BTreeMap::new();
        for delivery in &batch {
            sessions.entry(delivery.wake_up.session_id.as_str()).or_insert(&delivery.wake_up);
        }
        let started = Instant::now();
        for wake_up in sessions.values() {
            functions
                .dispatch
                .dispatcher
                .run(wake_up)
                .await
                .with_context(|| format!("dispatch of {}", wake_up.session_id))?;
        }
        functions.dispatch.app.notifier().flush().await;
        invocations.dispatch.push(started.elapsed());
        for delivery in &batch {
            self.source.ack(delivery).await?;
        }
        Ok(true)
    }

    /// Runs plain turns on a session until it holds `target` messages (not metered).
    pub async fn prefill(
        &self,
        functions: &mut Functions,
        session_id: &str,
        agent: &str,
        target: usize,
    ) -> anyhow::Result<usize> {
        let mut messages = 0;
        let mut n = 0;
        while messages < target {
            // The conversation so far, by id, then new messages (user, assistant, ..., user)
            // that the model answers: `new + 1` messages.
            let (session, _) = self.observer.app.load(session_id).await?;
            let mut view: Vec<DraftMessage> =
                session.tree().active_path().iter().map(|m| m.to_draft()).collect();
            let new = target.saturating_sub(messages + 1).clamp(1, PREFILL_CHUNK);
            let new = if new.is_multiple_of(2) { new - 1 } else { new };
            for i in 0..new {
                n += 1;
                // Named by the client: an engine minting several message ids in one command
                // repeats them in the next command of the same app (see the report), which
                // would put two nodes with one id into the tree.
                let id = format!("msg_prefill_{n:05}");
                view.push(
                    if i % 2 == 0 {
                        DraftMessage::user(format!(
                            "Question {n}: my order ord_{n:05} says shipped, but the tracking number does \
                         not work yet. When will it arrive, and which carrier has it?"
                        ))
                    } else {
                        DraftMessage::text(
                            Role::Assistant,
                            format!(
                                "Answer {n}: ord_{n:05} left the east warehouse on Monday with UPS; tracking \
                             usually starts within 48 hours. I will keep an eye on it."
                            ),
                        )
                    }
                    .with_id(id),
                );
            }
            let input = ClientInput::Messages(ClientMessagesInput {
                agent_id: agent.to_owned(),
                turn_id: None,
                messages: view,
                stream: None,
                client: None,
            });
            messages =
                self.run_turn(functions, false, session_id, input, &mut Invocations::default()).await?;
        }
        Ok(messages)
    }

    /// Runs `input` as the measured turn, `turns` times one after another.
    pub async fn measure(
        &self,
        functions: &mut Functions,
        cold: bool,
        session_id: &str,
        input: ClientInput,
        turns: usize,
    ) -> anyhow::Result<Measured> {
        let before = self.messages(session_id).await?;
        let mut invocations = Invocations::default();
        self.meter.start();
        let mut result = Ok(before);
        for _ in 0..turns {
            result = self.run_turn(functions, cold, session_id, input.clone(), &mut invocations).await;
            if result.is_err() {
                break;
            }
        }
        let (tally, trace) = self.meter.stop();
        let after = result?;
        Ok(Measured { tally, invocations, trace, before, after })
    }
}
