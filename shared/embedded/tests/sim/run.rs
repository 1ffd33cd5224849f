//! The scheduler: one seeded run of the simulation, and the checks after it.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde_json::json;
use turnstone_engine::ids::{CallId, IdMinter, InterruptId, TurnId};
use turnstone_engine::protocol::{
    AgentConfig, AgentTool, ClientInput, ClientMessageInput, DraftMessage, InterruptResumeInput, ToolHandler,
    ToolResultInput,
};
use turnstone_engine::session::{Defaults, Event, Session, TurnStatus};
use turnstone_engine::testing::check_invariants;
use turnstone_runtime::api::{Placement, Submitted};
use turnstone_runtime::app::{AgentRuntime, App, Parts};
use turnstone_runtime::auth::Caller;
use turnstone_runtime::config::LimitsConfig;
use turnstone_runtime::conformance::all_events;
use turnstone_runtime::dispatch::Dispatcher;
use turnstone_runtime::error::Result as RunResult;
use turnstone_runtime::notify::Hub;
use turnstone_runtime::queue::WakeUp;
use turnstone_runtime::worker::WorkerEndpoint;

use super::endpoints::{SimModel, SimWorker};
use super::ports::{SimQueue, SimStore, block};
use super::{Backend, Host, Life, World, digest};

/// How long a delivered wake-up stays invisible before the queue delivers it again, unless
/// acknowledged (the local host's, and a typical SQS visibility timeout).
const VISIBILITY_MS: i64 = 60_000;
/// The sessions: one per agent, so the model knows whose call it answers.
const SESSIONS: [(&str, &str); 2] = [("s-looped", "looped"), ("s-hosted", "hosted")];
/// Inputs a run sends at most (retries of unanswered ones aside).
const MAX_INPUTS: usize = 40;
/// Iterations a drain may take before the run is declared stuck.
const MAX_DRAIN: usize = 3_000;

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub digest: u64,
    pub faults: u64,
    pub crashes: u64,
    pub events: usize,
}

fn tool(name: &str, handler: Option<ToolHandler>) -> AgentTool {
    AgentTool {
        name: name.into(),
        description: None,
        input: None,
        output: None,
        handler,
        approval: None,
        mcp: None,
    }
}

fn agents(world: &Arc<World>, life: &Arc<Life>) -> BTreeMap<String, AgentRuntime> {
    let mut looped = AgentConfig::new("m");
    looped.tools =
        Some(vec![tool("time", None), tool("weather", None), tool("pick", Some(ToolHandler::Client))]);
    let mut hosted = AgentConfig::new("m");
    hosted.tools = Some(vec![tool("pick", Some(ToolHandler::Client))]);
    let model = |session_id: &str, tools: Vec<(&'static str, &'static str)>| {
        Arc::new(SimModel {
            world: Arc::clone(world),
            life: Arc::clone(life),
            session_id: session_id.into(),
            tools,
        })
    };
    let runtime = |id: &str, declared: AgentConfig, worker: bool, provider: Arc<SimModel>| AgentRuntime {
        id: id.into(),
        declared,
        worker: worker.then(|| WorkerEndpoint::new("http://worker.sim/decide", None)),
        provider: Some(provider),
        budget: Default::default(),
        reasoning: None,
        prompt_cache: None,
        thinking_forms: Default::default(),
        mcp: None,
        context: Default::default(),
    };
    BTreeMap::from([
        (
            "looped".to_owned(),
            runtime(
                "looped",
                looped,
                true,
                model("s-looped", vec![("time", "{}"), ("weather", "{}"), ("pick", "{}")]),
            ),
        ),
        ("hosted".to_owned(), runtime("hosted", hosted, false, model("s-hosted", vec![("pick", "{}")]))),
    ])
}

/// One process: an app and its dispatcher over the world.
struct Process {
    life: Arc<Life>,
    app: Arc<App>,
    dispatcher: Arc<Dispatcher>,
}

impl Process {
    fn start(world: &Arc<World>, seed: u64, generation: u64) -> Process {
        let life = Arc::new(Life::default());
        let parts = Parts {
            store: Arc::new(SimStore { world: Arc::clone(world), life: Arc::clone(&life) }),
            queue: Arc::new(SimQueue { world: Arc::clone(world), life: Arc::clone(&life) }),
            notifier: Arc::new(Hub::default()),
            clock: Arc::new(world.clock.clone()),
            agents: agents(world, &life),
            defaults: Defaults::default(),
            limits: LimitsConfig::default(),
            claim_ahead: world.host == Host::Local,
        };
        // Each process mints ids from its own part of the seed's space.
        let app = App::with_seed(parts, IdMinter::new(seed ^ (generation << 40)).next_u64());
        let dispatcher = Dispatcher::new(
            Arc::clone(&app),
            SimWorker { world: Arc::clone(world), life: Arc::clone(&life) },
        );
        Process { life, app, dispatcher }
    }
}

enum Job {
    Submit(usize),
    Run { delivery: u64, session_id: String },
    Sweep,
}

enum Done {
    Submitted(RunResult<Submitted>),
    Ran(RunResult<()>),
    Swept,
}

struct Task {
    job: Job,
    fut: Pin<Box<dyn Future<Output = Done>>>,
}

#[derive(Debug, Clone)]
enum What {
    Message(Placement),
    ToolResult(CallId),
    Resume(InterruptId),
}

/// A client input, as sent (and sent again if its answer was lost with a process).
#[derive(Debug, Clone)]
struct Input {
    session_id: &'static str,
    agent_id: &'static str,
    what: What,
    turn_id: Option<TurnId>,
    /// The turn the submit answered with, once it succeeded.
    accepted: Option<Option<TurnId>>,
    /// Whether a submit of it got an answer (success or refusal).
    answered: bool,
}

impl Input {
    fn client_input(&self) -> ClientInput {
        match &self.what {
            What::Message(_) => ClientInput::Message(ClientMessageInput {
                agent_id: self.agent_id.into(),
                turn_id: self.turn_id.clone(),
                message: DraftMessage::user("hello"),
                stream: None,
                client: None,
            }),
            What::ToolResult(id) => ClientInput::ToolResult(ToolResultInput {
                id: id.clone(),
                attempt: None,
                result: Some(json!("blue")),
            }),
            What::Resume(id) => ClientInput::InterruptResume(InterruptResumeInput {
                interrupt_id: id.clone(),
                payload: Some(json!(1)),
            }),
        }
    }

    fn placement(&self) -> Placement {
        match self.what {
            What::Message(placement) => placement,
            _ => Placement::Start,
        }
    }
}

struct Sim {
    seed: u64,
    world: Arc<World>,
    process: Process,
    generation: u64,
    tasks: Vec<Task>,
    inputs: Vec<Input>,
    crashes: u64,
}

/// Runs seed `seed` for `steps` scheduler steps, drains, and checks the invariants (panics
/// naming the broken one).
pub async fn run(seed: u64, steps: usize, backend: Backend, host: Host) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let world = World::new(seed, backend, host, dir.path());
    let process = Process::start(&world, seed, 0);
    let mut sim =
        Sim { seed, world, process, generation: 0, tasks: Vec::new(), inputs: Vec::new(), crashes: 0 };
    for _ in 0..steps {
        sim.step().await;
    }
    let checked = std::panic::AssertUnwindSafe(async {
        sim.drain().await;
        sim.check();
    });
    if let Err(panic) = futures_catch(checked).await {
        if std::env::var("TURNSTONE_RUNTIME_SIM_TRACE").is_ok() {
            for line in sim.world.trace_lines() {
                eprintln!("{line}");
            }
        }
        std::panic::resume_unwind(panic);
    }
    let lines = sim.world.trace_lines();
    let events = lines.iter().filter(|l| l.starts_with("commit ")).count();
    Outcome {
        digest: digest(&lines),
        faults: sim.world.faults.load(Ordering::SeqCst),
        crashes: sim.crashes,
        events,
    }
}

impl Sim {
    async fn step(&mut self) {
        let world = Arc::clone(&self.world);
        match world.roll(100) {
            0..=9 if self.inputs.len() < MAX_INPUTS => self.new_input(),
            10..=12 => self.retry_input(),
            13..=29 => {
                self.deliver(world.chance(8));
            }
            30..=33 => {
                let next = self.next_instant().unwrap_or(world.now() + 1_000);
                let jitter = world.roll(3_000) as i64;
                self.advance(next - world.now() + jitter).await;
            }
            34..=38 => self.advance(1 + world.roll(2_000) as i64).await,
            39 if world.chance(30) => {
                // The process dies at an arbitrary point, not at an I/O boundary.
                world.faults.fetch_add(1, Ordering::SeqCst);
                world.trace("fault kill".into());
                self.process.life.kill();
                self.restart();
            }
            40 if world.chance(20) => self.spawn(Job::Sweep),
            _ => {
                if !self.tasks.is_empty() {
                    let i = world.roll(self.tasks.len() as u64) as usize;
                    for _ in 0..1 + world.roll(3) {
                        if !self.poll(i) {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Polls task `i` once; false when it finished (or its process died).
    fn poll(&mut self, i: usize) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let poll = self.tasks[i].fut.as_mut().poll(&mut cx);
        let alive = match poll {
            Poll::Ready(done) => {
                let task = self.tasks.remove(i);
                self.finished(task.job, done);
                false
            }
            Poll::Pending => true,
        };
        if self.process.life.is_dead() {
            self.restart();
            return false;
        }
        alive
    }

    fn spawn(&mut self, job: Job) {
        let app = Arc::clone(&self.process.app);
        let dispatcher = Arc::clone(&self.process.dispatcher);
        let fut: Pin<Box<dyn Future<Output = Done>>> = match &job {
            Job::Submit(i) => {
                let input = self.inputs[*i].clone();
                Box::pin(async move {
                    let submitted = app
                        .submit(input.session_id, input.client_input(), input.placement(), &Caller::Anyone)
                        .await;
                    Done::Submitted(submitted)
                })
            }
            Job::Run { session_id, .. } => {
                let wake_up = self
                    .world
                    .mailbox
                    .lock()
                    .unwrap()
                    .queued
                    .iter()
                    .find(|q| matches!(&job, Job::Run { delivery, .. } if *delivery == q.id))
                    .map(|q| q.wake_up.clone())
                    .unwrap_or_else(|| WakeUp::new(session_id.clone(), "lost"));
                Box::pin(async move { Done::Ran(dispatcher.run(&wake_up).await) })
            }
            Job::Sweep => Box::pin(async move {
                let _ = dispatcher.sweep(100).await;
                Done::Swept
            }),
        };
        self.tasks.push(Task { job, fut });
    }

    fn finished(&mut self, job: Job, done: Done) {
        match (job, done) {
            (Job::Submit(i), Done::Submitted(result)) => {
                let input = &mut self.inputs[i];
                input.answered = true;
                // A message sent again under a turn id that was accepted names that turn again
                // and writes nothing (a client that did not hear the first answer).
                let again = match (&input.what, &input.turn_id, &input.accepted) {
                    (What::Message(_), Some(turn_id), Some(_)) => Some(turn_id.clone()),
                    _ => None,
                };
                match result {
                    Ok(submitted) => {
                        self.world.trace(format!("accepted {i} {:?}", submitted.turn_id));
                        // (A steering turn that joined the running one names that turn.)
                        let steered = matches!(input.what, What::Message(Placement::Steer));
                        if let Some(turn_id) = again
                            && submitted.turn_id.as_ref() != Some(&turn_id)
                            && !(steered && submitted.turn_id.is_some())
                        {
                            self.world
                                .violation(format!("input {i} sent again answered {:?}", submitted.turn_id));
                        }
                        input.accepted = Some(submitted.turn_id);
                    }
                    Err(e) => {
                        self.world.trace(format!("refused {i} {e}"));
                        if again.is_some() {
                            self.world.violation(format!(
                                "input {i} sent again under its accepted turn id was refused: {e}"
                            ));
                        }
                    }
                }
            }
            (Job::Run { delivery, session_id }, Done::Ran(result)) => match result {
                // Acknowledged: gone from the queue.
                Ok(()) => self.world.mailbox.lock().unwrap().queued.retain(|q| q.id != delivery),
                // Left to come back after the visibility timeout.
                Err(e) => self.world.trace(format!("run of {session_id} failed: {e}")),
            },
            _ => {}
        }
    }

    /// The process died: every future of it is dropped with it, and a new one starts over the
    /// same store (reopened), calling `recover` if its queue was in-process.
    fn restart(&mut self) {
        self.crashes += 1;
        self.generation += 1;
        self.world.trace(format!("restart {}", self.generation));
        self.tasks.clear();
        if self.world.host == Host::Local {
            self.world.mailbox.lock().unwrap().queued.clear();
        }
        let dead =
            std::mem::replace(&mut self.process, Process::start(&self.world, self.seed, self.generation));
        drop(dead);
        self.world.reopen();
        // Still faithful: a dead process's stores are not used again; a new store handle is
        // read by the new process through the world.
        if self.world.host == Host::Local {
            let chaos = self.world.chaos();
            self.world.set_chaos(false);
            let dispatcher = Arc::clone(&self.process.dispatcher);
            drive(async move { dispatcher.recover(1000).await }).unwrap();
            self.world.set_chaos(chaos);
        }
        self.check_stored("after a restart");
    }

    fn stored(&self, session_id: &str) -> Option<Session> {
        block(self.world.store().load(session_id)).unwrap().map(|l| l.session)
    }

    fn new_input(&mut self) {
        let world = Arc::clone(&self.world);
        let (session_id, agent_id) = SESSIONS[world.roll(SESSIONS.len() as u64) as usize];
        let stored = self.stored(session_id);
        let client_tool = stored.as_ref().and_then(|s| {
            s.calls().iter().find(|c| c.is_client_tool() && c.is_pending()).map(|c| c.id.clone())
        });
        let interrupt = stored.as_ref().and_then(|s| s.interrupts().first().map(|i| i.id.clone()));
        let what = match (client_tool, interrupt) {
            (Some(id), _) if world.chance(60) => What::ToolResult(id),
            (_, Some(id)) if world.chance(60) => What::Resume(id),
            _ => What::Message(match world.roll(10) {
                0..=5 => Placement::Start,
                6..=8 => Placement::Queue,
                _ => Placement::Steer,
            }),
        };
        let n = self.inputs.len();
        let turn_id =
            (matches!(what, What::Message(_)) && world.chance(50)).then(|| TurnId::from(format!("in-{n}")));
        self.inputs.push(Input { session_id, agent_id, what, turn_id, accepted: None, answered: false });
        self.spawn(Job::Submit(n));
    }

    /// Sends again an input whose answer was lost with a process (a client retrying).
    fn retry_input(&mut self) {
        let submitting: BTreeSet<usize> = self
            .tasks
            .iter()
            .filter_map(|t| if let Job::Submit(i) = t.job { Some(i) } else { None })
            .collect();
        // Mostly one whose answer was lost; now and then one accepted under a turn id of its own.
        let duplicate = self.world.chance(30);
        let lost: Vec<usize> = (0..self.inputs.len())
            .filter(|i| !submitting.contains(i))
            .filter(|i| {
                let input = &self.inputs[*i];
                if duplicate {
                    input.accepted.is_some()
                        && input.turn_id.is_some()
                        && matches!(input.what, What::Message(_))
                } else {
                    !input.answered
                }
            })
            .collect();
        if lost.is_empty() {
            return;
        }
        let i = lost[self.world.roll(lost.len() as u64) as usize];
        self.world.trace(format!("retry {i}"));
        self.spawn(Job::Submit(i));
    }

    /// Delivers a visible wake-up (any of them: out of order); `twice`: one that is already
    /// being handled, as a queue may deliver twice.
    fn deliver(&mut self, twice: bool) -> bool {
        let now = self.world.now();
        let running: BTreeSet<String> = self
            .tasks
            .iter()
            .filter_map(|t| {
                if let Job::Run { session_id, .. } = &t.job { Some(session_id.clone()) } else { None }
            })
            .collect();
        let host = self.world.host;
        let candidates: Vec<(u64, String)> = self
            .world
            .mailbox
            .lock()
            .unwrap()
            .queued
            .iter()
            .filter(|q| q.visible_at <= now || (twice && host == Host::Split))
            // The local host's queue workers run one session at a time.
            .filter(|q| host == Host::Split || !running.contains(&q.wake_up.session_id))
            .map(|q| (q.id, q.wake_up.session_id.clone()))
            .collect();
        if candidates.is_empty() {
            return false;
        }
        let (id, session_id) = candidates[self.world.roll(candidates.len() as u64) as usize].clone();
        let keep_visible = host == Host::Split && self.world.chance(5);
        if !keep_visible
            && let Some(q) = self.world.mailbox.lock().unwrap().queued.iter_mut().find(|q| q.id == id)
        {
            q.visible_at = now + VISIBILITY_MS;
        }
        self.world.trace(format!("deliver {id} {session_id}"));
        self.spawn(Job::Run { delivery: id, session_id });
        true
    }

    async fn advance(&self, ms: i64) {
        if ms <= 0 {
            return;
        }
        self.world.clock.advance(ms);
        tokio::time::advance(Duration::from_millis(ms as u64)).await;
        self.world.trace(format!("advance {ms}"));
    }

    /// The next moment something is due: a sleeping endpoint, a queued wake-up, a session's
    /// timer.
    fn next_instant(&self) -> Option<i64> {
        let now = self.world.now();
        let mut next: Option<i64> = None;
        let mut consider = |t: i64| {
            if t > now {
                next = Some(next.map_or(t, |n: i64| n.min(t)));
            }
        };
        {
            let mut sleepers = self.world.sleepers.lock().unwrap();
            sleepers.retain(|&t| t > now);
            sleepers.iter().take(1).for_each(|&t| consider(t));
        }
        self.world.mailbox.lock().unwrap().queued.iter().for_each(|q| consider(q.visible_at));
        for (session_id, _) in SESSIONS {
            if let Some(at) = self.stored(session_id).and_then(|s| s.plan(self.world.clock_now()).wake_at) {
                consider(at.0);
            }
        }
        next
    }

    /// Faults off, time runs on: every wake-up is delivered, every deadline passes, the worker
    /// and model answer, until nothing is left to do.
    async fn drain(&mut self) {
        self.world.set_chaos(false);
        self.world.trace("drain".into());
        let mut sweeps = 0;
        for _ in 0..MAX_DRAIN {
            for _ in 0..20 {
                let mut i = 0;
                while i < self.tasks.len() {
                    if self.poll(i) {
                        i += 1;
                    }
                }
            }
            if self.deliver(false) {
                continue;
            }
            if self.tasks.is_empty() && self.world.mailbox.lock().unwrap().queued.is_empty() {
                let busy: Vec<&str> = SESSIONS
                    .iter()
                    .map(|(id, _)| *id)
                    .filter(|id| {
                        self.stored(id).is_some_and(|s| {
                            let plan = s.plan(self.world.clock_now());
                            !plan.effects.is_empty() || plan.wake_at.is_some()
                        })
                    })
                    .collect();
                if busy.is_empty() {
                    return;
                }
                // Work is due (or will be) and no wake-up will come: only a refused send excuses
                // that, and the host's periodic sweep finds the session once it is due.
                if self.world.send_failures.load(Ordering::SeqCst) == 0 {
                    panic!(
                        "sessions {busy:?} have work due but no wake-up is queued for them (a lost wake-up)"
                    );
                }
                sweeps += 1;
                self.spawn(Job::Sweep);
            }
            match self.next_instant() {
                Some(next) => self.advance(next - self.world.now()).await,
                None => self.advance(1_000).await,
            }
        }
        panic!("the drain did not reach quiescence in {MAX_DRAIN} iterations ({sweeps} sweeps)");
    }

    /// Replay and the engine's invariants of each stored session.
    fn check_stored(&self, when: &str) {
        for (session_id, _) in SESSIONS {
            let Some(session) = self.stored(session_id) else { continue };
            let log: Vec<Event> = block(all_events(self.world.store().as_ref(), session_id, 1000))
                .into_iter()
                .map(|e| e.event)
                .collect();
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_invariants(&session, &log)));
            if outcome.is_err() {
                panic!("{session_id}: the engine's invariants fail {when}");
            }
        }
    }

    fn check(&self) {
        let world = &self.world;
        let violations = world.violations();
        assert!(violations.is_empty(), "violations: {violations:?}");
        let twice = world.executed_twice();
        assert!(twice.is_empty(), "effects performed twice: {twice:?}");
        self.check_stored("at the end");
        let mut logs = BTreeMap::new();
        for (session_id, _) in SESSIONS {
            let Some(session) = self.stored(session_id) else { continue };
            let log: Vec<Event> = block(all_events(world.store().as_ref(), session_id, 1000))
                .into_iter()
                .map(|e| e.event)
                .collect();
            check_quiet(&session);
            self.check_settles(session_id, &log);
            logs.insert(session_id, log);
        }
        // Every accepted input started exactly one turn (a steering one may later join another).
        for (i, input) in self.inputs.iter().enumerate() {
            let (What::Message(_), Some(accepted)) = (&input.what, &input.accepted) else { continue };
            let Some(turn_id) = input.turn_id.clone().or_else(|| accepted.clone()) else {
                panic!("input {i} was accepted without a turn");
            };
            let log = logs.get(input.session_id).map(Vec::as_slice).unwrap_or_default();
            let starts = log
                .iter()
                .filter(|e| match e {
                    Event::TurnStarted { turn } | Event::TurnQueued { turn } => turn.id == turn_id,
                    _ => false,
                })
                .count();
            assert_eq!(starts, 1, "accepted input {i} ({:?}) started {starts} turns {turn_id}", input.what);
        }
    }
}

impl Sim {
    /// Every successful settle of a call the endpoints ran records the answer of its own
    /// attempt (never a late answer of an earlier attempt).
    fn check_settles(&self, session_id: &str, log: &[Event]) {
        for event in log {
            let Event::CallSettled { call_id, attempt, .. } = event else { continue };
            let value = serde_json::to_value(event).unwrap();
            let Some(ok) = value.get("outcome").and_then(|o| o.get("Ok")).and_then(|o| o.get("value")) else {
                continue;
            };
            let recorded = super::fingerprint(ok);
            // Client tools' results ("blue") come from the simulated client, not an endpoint.
            if recorded == "blue" {
                continue;
            }
            let answered = self.world.answer(call_id, *attempt);
            assert_eq!(
                answered.as_deref(),
                Some(recorded.as_str()),
                "{session_id}: call {call_id} settled at attempt {attempt} with an answer its attempt did not give"
            );
        }
    }
}

impl World {
    fn clock_now(&self) -> turnstone_engine::time::Timestamp {
        use turnstone_runtime::clock::Clock;
        self.clock.now()
    }
}

/// After the drain: every turn has ended or waits for a person (an open interrupt, a client
/// tool call, an approval), and every tool call on the active path has its one result unless
/// a client is still to give it.
fn check_quiet(session: &Session) {
    let id = session.id();
    let waiting_call =
        session.calls().iter().any(|c| (c.is_client_tool() && c.is_pending()) || c.awaiting_approval);
    let waits = !session.interrupts().is_empty() || waiting_call;
    for turn in session.turns() {
        match turn.status {
            TurnStatus::Active => assert!(waits, "{id}: turn {} is active and waits for nothing", turn.id),
            TurnStatus::Queued => assert!(
                session.active_turn_id().is_some(),
                "{id}: turn {} is queued behind no active turn",
                turn.id
            ),
            _ => {}
        }
    }
    // While a person is asked (an open interrupt), the step's other results wait in the
    // session's queue of triggers: they are recorded once it is resumed.
    if !session.interrupts().is_empty() {
        return;
    }
    for (tool_call_id, name) in session.tree().unanswered_tool_calls() {
        let waiting = session
            .call(&tool_call_id)
            .is_some_and(|c| (c.is_client_tool() && c.is_pending()) || c.awaiting_approval);
        assert!(waiting, "{id}: tool call {tool_call_id} ({name}) on the active path has no result");
    }
}

/// Runs `fut`, catching a panic in it (a failed check) so the trace can be printed first.
async fn futures_catch<F: Future<Output = ()>>(fut: F) -> std::thread::Result<()> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Ready(())) => Poll::Ready(Ok(())),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    })
    .await
}

/// Runs a future of the process to its end outside the scheduler (recovery at start-up).
fn drive<T>(fut: impl Future<Output = T>) -> T {
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1_000_000 {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
    panic!("recovery did not finish");
}
