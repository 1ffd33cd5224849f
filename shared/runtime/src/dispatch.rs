//! The dispatcher: for one session, plan what is due, claim it by committing its dispatch,
//! perform the I/O outside any transaction, and commit the outcome as a command; repeat while
//! work is due. A crash anywhere loses nothing: a claimed effect that never finishes times
//! out at its deadline and is retried by policy.

use std::sync::Arc;
use std::time::Duration;

use tracing::{Instrument, Span};

use turnstone_engine::ids::{CallId, DecisionId, SessionId};
use turnstone_engine::llm_format::anthropic::DEFAULT_MAX_TOKENS;
use turnstone_engine::protocol::{LlmRequest, LlmResponse, PromptCache, StreamDelta, Trigger};
use turnstone_engine::session::{
    CallError, CallRecord, CallSpec, Command, ContextLimits, Effect, OutboxItem, Rejection, Route, Session,
    ViewOptions, child_failed, route,
};
use turnstone_engine::time::Timestamp;

use crate::app::{App, Executed, Mode, claim_command, is_stale_claim, still_claimed};
use crate::error::{Error, Result};
use crate::llm::ContextOverflow;
use crate::queue::WakeUp;
use crate::trace::{self, SpanContext};
use crate::worker::Deliver;

mod compaction;
use compaction::{Fit, Why};

/// Bounds the effects one run performs before yielding the session to the queue again.
const MAX_EFFECTS_PER_RUN: usize = 256;

/// What a run keeps in hand before its deadline besides an effect's own bound: the commit of
/// the effect's outcome and the wake-up that hands the rest back.
const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// The longest pause of a wake-up waiting for the commit it announced: pauses of 2, 4, ...,
/// 256 ms, half a second in all (a commit lands within milliseconds), before it leaves the
/// check to a later wake-up.
const ANNOUNCED_COMMIT_LAST_PAUSE: Duration = Duration::from_millis(256);
/// When that later wake-up looks again: after any commit in flight has certainly landed or
/// failed (a Lambda function's timeout bounds it).
const LATE_COMMIT_CHECK: Duration = Duration::from_secs(60);

/// A run's commits to its own session: the run arms the next wake-up when it ends.
const IN_RUN: Mode = Mode { claim_next: false, claim_before: None, in_run: true };

/// An effect's outcome, claiming the next due effect in the same write if it can end before
/// the run's `deadline`.
fn in_run_claiming(deadline: Option<Timestamp>) -> Mode {
    Mode { claim_next: true, claim_before: deadline, in_run: true }
}

/// Runs sessions' due work: what every host's wake-up consumer calls (the local host's queue
/// workers, the Lambda `dispatch` function's SQS batch handler).
pub struct Dispatcher {
    app: Arc<App>,
    worker: Arc<dyn Deliver>,
}

impl Dispatcher {
    /// A dispatcher over `app`, delivering decisions with `worker` (a
    /// [`WorkerClient`](crate::worker::WorkerClient), or a simulation's worker).
    pub fn new(app: Arc<App>, worker: impl Deliver) -> Arc<Self> {
        Arc::new(Dispatcher { app, worker: Arc::new(worker) })
    }

    /// The app it runs sessions of.
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Handles one wake-up: runs the session's due work until none is left, then arms the
    /// next wake-up if work is due later (after a bounded number of effects it re-enqueues
    /// itself instead). Idempotent: a duplicate or late wake-up finds nothing due, or re-arms.
    /// An error leaves the wake-up to be delivered again.
    pub async fn run(&self, wake_up: &WakeUp) -> Result<()> {
        self.run_until(wake_up, None).await
    }

    /// [`Dispatcher::run`] within a deadline (a Lambda invocation's): an effect starts only
    /// when it can end before it, bounded by its own timeout plus [`DEADLINE_MARGIN`];
    /// otherwise the run hands the rest back to the queue (a wake-up now) and ends, so no
    /// effect is cut off by the deadline and run again after it. The first effect of a run
    /// always starts, so a session whose next effect is longer than any invocation still moves.
    pub async fn run_until(&self, wake_up: &WakeUp, deadline: Option<Timestamp>) -> Result<()> {
        let session_id = wake_up.session_id.as_str();
        // The state the last effect committed: the next plan starts from it instead of a load
        // (commits are version-checked, so a state that went stale only costs a reload).
        let mut known = None;
        if let Some(seq) = wake_up.seq {
            match self.announced_commit(session_id, seq).await? {
                Some(landed) => known = Some(landed),
                None => return Ok(()),
            }
        }
        // An effect already claimed (by the last commit, or by a submit of this process, which
        // hands over the state its commit left: no load before the effect).
        let mut claimed = None;
        if let Some(handoff) = self.app.take_handoff(session_id) {
            claimed = Some(handoff.effect);
            known = known.or(handoff.state);
        }
        for performed in 0..MAX_EFFECTS_PER_RUN {
            let (session, version) = match known.take() {
                Some(known) => known,
                None => self.app.load(session_id).await?,
            };
            if !session.is_created() {
                return Ok(());
            }
            if let Some(effect) = claimed.take() {
                if still_claimed(&session, &effect) {
                    let after =
                        self.perform_claimed(session_id, effect, (session, version), deadline).await?;
                    (known, claimed) = split(after);
                } else {
                    known = Some((session, version));
                }
                continue;
            }
            let plan = session.plan(self.app.now());
            // Timers first (they may void work), then routing, then I/O.
            let Some(effect) = plan
                .effects
                .iter()
                .find(|e| matches!(e, Effect::Tick))
                .or_else(|| plan.effects.iter().find(|e| matches!(e, Effect::Route { .. })))
                .or_else(|| plan.effects.first())
                .cloned()
            else {
                // Nothing is due yet: arm the wake-up for what is due later. The run's own
                // commits sent none, and a queue may have merged it into the one that brought
                // us here (the in-process queue keeps a session's earliest only).
                // Its own commits left the wake time to this wake-up (`Commit::wake_queued`):
                // if arming fails, the error leaves this one to be delivered again.
                if let Some(at) = plan.wake_at {
                    self.app.wake_at(session_id, "timer", at).await?;
                }
                return Ok(());
            };
            if performed > 0
                && let Some(deadline) = deadline
                && !fits(&session, &effect, self.app.now(), deadline)
            {
                return self.app.wake(session_id, "deadline").await;
            }
            match self.perform(session_id, effect, (session, version), deadline).await {
                Ok(after) => (known, claimed) = split(after),
                Err(e) if is_stale_claim(&e) => {}
                Err(e) => return Err(e),
            }
        }
        self.app.wake(session_id, "budget").await
    }

    /// The session once the commit a wake-up announced (reaching log length `seq`) has
    /// landed: it was sent just before that commit was written, so it may arrive first. A
    /// commit that has not landed after a short wait failed, or is slow: one more wake-up,
    /// [`LATE_COMMIT_CHECK`] later, looks again, and this one ends (None).
    async fn announced_commit(&self, session_id: &str, seq: u64) -> Result<Option<(Session, u64)>> {
        let mut pause = Duration::from_millis(2);
        loop {
            let (session, version) = self.app.load(session_id).await?;
            if session.events_applied() >= seq {
                return Ok(Some((session, version)));
            }
            if pause > ANNOUNCED_COMMIT_LAST_PAUSE {
                tracing::debug!(session_id, seq, "the announced commit has not landed; looking again later");
                let at = self.app.now().plus_ms(LATE_COMMIT_CHECK.as_millis() as u64);
                self.app.wake_at(session_id, "late commit", at).await?;
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }

    /// Enqueues every session whose wake time has passed (a wake-up may have been lost).
    pub async fn sweep(&self, limit: usize) -> Result<usize> {
        self.wake_due(self.app.now(), "sweep", limit).await
    }

    /// Enqueues every session that has a wake time, due or not: after a restart, an
    /// in-process queue has lost the delayed wake-ups of the previous process.
    pub async fn recover(&self, limit: usize) -> Result<usize> {
        self.wake_due(Timestamp(i64::MAX), "recover", limit).await
    }

    async fn wake_due(&self, until: Timestamp, reason: &str, limit: usize) -> Result<usize> {
        let due = self.app.store().due(until, limit).await?;
        for session_id in &due {
            self.app.wake(session_id, reason).await?;
        }
        Ok(due.len())
    }

    /// Performs `effect`, planned from `known`; returns what it committed last, if it knows it,
    /// for the next plan (with the effect that commit claimed, if any).
    async fn perform(
        &self,
        session_id: &str,
        effect: Effect,
        known: (Session, u64),
        deadline: Option<Timestamp>,
    ) -> Result<Option<Executed>> {
        match effect {
            Effect::Tick => {
                self.app.command_with(session_id, Some(known), IN_RUN, Command::Tick).await.map(Some)
            }
            Effect::Route { seq, item } => self.route(session_id, seq, item).await.map(|()| None),
            Effect::DeliverDecision { .. } | Effect::RunLlmCall { .. } | Effect::RunToolCall { .. } => {
                let claim =
                    self.app.command_with(session_id, Some(known), IN_RUN, claim_command(&effect)).await?;
                let state = (claim.session, claim.version);
                self.perform_claimed(session_id, effect, state, deadline).await
            }
        }
    }

    /// Performs the I/O of a claimed effect and commits its outcome (claiming the next effect
    /// in the same commit, if it can end before `deadline`).
    async fn perform_claimed(
        &self,
        session_id: &str,
        effect: Effect,
        claimed: (Session, u64),
        deadline: Option<Timestamp>,
    ) -> Result<Option<Executed>> {
        match effect {
            Effect::DeliverDecision { decision_id, attempt } => {
                self.deliver_decision(session_id, decision_id, attempt, claimed, deadline).await
            }
            Effect::RunLlmCall { call_id, attempt } => {
                self.run_llm_call(session_id, call_id, attempt, claimed, deadline).await
            }
            Effect::RunToolCall { call_id, attempt } => {
                self.run_tool_call(session_id, call_id, attempt, claimed, deadline).await
            }
            Effect::Tick | Effect::Route { .. } => Ok(None),
        }
    }

    /// Commits an effect's outcome, claiming the next due effect in the same write if it can
    /// end before `deadline`.
    async fn outcome(
        &self,
        session_id: &str,
        known: (Session, u64),
        command: Command,
        deadline: Option<Timestamp>,
    ) -> Result<Executed> {
        self.app.command_with(session_id, Some(known), in_run_claiming(deadline), command).await
    }

    async fn deliver_decision(
        &self,
        session_id: &str,
        decision_id: DecisionId,
        attempt: u32,
        claimed: (Session, u64),
        deadline: Option<Timestamp>,
    ) -> Result<Option<Executed>> {
        let session = &claimed.0;
        if session.decision().is_none() {
            return Ok(None);
        }
        let agent = self.app.agent(session.agent_id());
        let Some(endpoint) = agent.and_then(|a| a.worker.clone()) else {
            let error = format!("agent {:?} has no worker configured", session.agent_id());
            return self.delivery_failed(session_id, decision_id, attempt, error, false).await.map(|()| None);
        };
        let Some(request) = session.decision_request_with(endpoint.transcript) else { return Ok(None) };
        // A `tool.execute`/`llm.execute` delivery is bounded by its call's own timeout.
        let timeout = session.delivery_timeout_ms().map(Duration::from_millis);
        let stream_call = match &request.trigger {
            Trigger::LlmExecute(t) => Some(t.id.clone()),
            _ => None,
        };
        let notifier = Arc::clone(self.app.notifier());
        let sid = session_id.to_owned();
        let mut on_delta = move |delta: StreamDelta| {
            if let Some(call_id) = &stream_call {
                notifier.delta(&sid, call_id, delta);
            }
        };
        let now_unix = self.app.now().0 / 1000;
        let spans = DeliverySpans::new(session, &request.trigger, &decision_id, attempt);
        let delivery = self.worker.deliver(&endpoint, &request, timeout, now_unix, &mut on_delta);
        let delivered = trace::scope(spans.context, delivery.instrument(spans.deliver.clone()))
            .instrument(spans.work.clone().unwrap_or_else(Span::none))
            .await;
        spans.outcome(delivered.as_ref().map(drop).map_err(|e| (e.code(), e.to_string())));
        match delivered {
            Ok(answer) => {
                let command = Command::Answer {
                    decision_id,
                    attempt,
                    response: Box::new(answer.response),
                    ignored_fields: answer.ignored_fields,
                    transcript: endpoint.transcript,
                };
                self.outcome(session_id, claimed, command, deadline).await.map(Some)
            }
            Err(e) => {
                tracing::info!(session_id, attempt, code = e.code(), error = %e, "decision delivery failed");
                let error = format!("{}: {e}", e.code());
                self.delivery_failed(session_id, decision_id, attempt, error, e.is_retryable())
                    .await
                    .map(|()| None)
            }
        }
    }

    async fn delivery_failed(
        &self,
        session_id: &str,
        decision_id: DecisionId,
        attempt: u32,
        error: String,
        retryable: bool,
    ) -> Result<()> {
        let command = Command::DeliveryFailed { decision_id, attempt, error, retryable };
        self.app.command_with(session_id, None, IN_RUN, command).await.map(drop)
    }

    async fn run_llm_call(
        &self,
        session_id: &str,
        call_id: CallId,
        attempt: u32,
        mut claimed: (Session, u64),
        deadline: Option<Timestamp>,
    ) -> Result<Option<Executed>> {
        let agent = self.app.agent(claimed.0.agent_id());
        // The model the request names (filled in when the call was made), without building it.
        let model = claimed.0.call(&call_id).and_then(|c| match &c.spec {
            CallSpec::LlmCall { action, .. } => action.model.clone(),
            _ => None,
        });
        let mut limits = agent.zip(model.as_deref()).and_then(|(a, m)| a.context.limits(m));
        let mut prepared = None;
        if let (Some(agent), Some(limits)) = (agent, limits.as_ref()) {
            match self.fit(session_id, (&call_id, attempt), claimed, agent, limits, Why::Threshold).await? {
                Fit::Ready(ready) => (claimed, prepared) = (ready.claimed, ready.request),
                Fit::Gone => return Ok(None),
                Fit::Failed(error) => {
                    return self.model_call_failed(session_id, call_id, attempt, error).await;
                }
            }
        }
        let (mut outcome, overflow) =
            self.call_model(session_id, &call_id, attempt, &claimed.0, limits.as_ref(), prepared).await;
        // Refused for its length: compacted (harder than the estimate asked) and sent again, once.
        if let (Some(overflow), Some(agent)) = (overflow, agent) {
            let window = overflow
                .window
                .or(limits.map(|l| l.window))
                .or(overflow.tokens)
                .unwrap_or_else(|| claimed.0.call(&call_id).map_or(0, |c| whole_estimate(&claimed.0, c)));
            let base = limits.unwrap_or_else(|| {
                ContextLimits::with_window(window, agent.context.max_output.unwrap_or(DEFAULT_MAX_TOKENS))
            });
            let refused = base.narrowed(window);
            limits = Some(refused);
            match self
                .fit(session_id, (&call_id, attempt), claimed, agent, &refused, Why::Refused(overflow))
                .await?
            {
                Fit::Ready(ready) => {
                    claimed = ready.claimed;
                    let session = &claimed.0;
                    outcome = self
                        .call_model(session_id, &call_id, attempt, session, limits.as_ref(), ready.request)
                        .await
                        .0;
                }
                Fit::Gone => return Ok(None),
                Fit::Failed(error) => {
                    return self.model_call_failed(session_id, call_id, attempt, error).await;
                }
            }
        }
        let command = Command::LlmCallFinished { call_id, attempt, outcome };
        self.call_finished(session_id, claimed, command, deadline).await
    }

    /// Commits the failure of a model call's attempt that was never sent (it cannot fit).
    async fn model_call_failed(
        &self,
        session_id: &str,
        call_id: CallId,
        attempt: u32,
        error: CallError,
    ) -> Result<Option<Executed>> {
        let command = Command::LlmCallFinished { call_id, attempt, outcome: Err(error) };
        self.app.command_with(session_id, None, IN_RUN, command).await.map(|_| None)
    }

    /// Sends one request of a claimed server model call (`prepared`, when checking its size
    /// built it already, else its view as `limits` cut it) and returns its outcome, and whether
    /// the provider refused it for its length.
    async fn call_model(
        &self,
        session_id: &str,
        call_id: &CallId,
        attempt: u32,
        session: &Session,
        limits: Option<&ContextLimits>,
        prepared: Option<LlmRequest>,
    ) -> (std::result::Result<LlmResponse, CallError>, Option<ContextOverflow>) {
        let Some(call) = session.call(call_id) else {
            return (Err(CallError::terminal("the call is gone")), None);
        };
        let stream = matches!(call.spec, CallSpec::LlmCall { stream: true, .. });
        let timeout = call.policy.timeout_ms().map(Duration::from_millis);
        let agent = self.app.agent(session.agent_id());
        let view = limits.map(ViewOptions::from).unwrap_or_default();
        let mut request = prepared.or_else(|| session.llm_request_with(call, &view));
        if let Some(request) = request.as_mut() {
            if request.reasoning.is_none() {
                request.reasoning = agent.and_then(|a| a.reasoning.clone());
            }
            // One cache key per session: its steps share the conversation's prefix.
            let ttl = agent.and_then(|a| a.prompt_cache);
            request.cache = ttl.map(|ttl| PromptCache { key: session_id.to_owned(), ttl });
            request.thinking_form = agent.and_then(|a| a.thinking_form(&request.model));
        }
        let provider = agent.and_then(|a| a.provider.clone());
        let turn_id = call.turn_id.as_ref().map(|t| session.resolve_turn_id(t).as_str());
        let about = trace::About { session_id, turn_id, agent_id: session.agent_id() };
        let context = SpanContext::work(session_id, turn_id, "llm.call", call_id, attempt);
        let model = request.as_ref().map_or("", |r| r.model.as_str());
        let provider_name = provider.as_ref().map_or("none", |p| p.name());
        let span = trace::llm_call_span(&context, about, call_id, attempt, model, provider_name);
        let mut overflow = None;
        let outcome = match (request, provider) {
            (Some(request), Some(provider)) => {
                let notifier = Arc::clone(self.app.notifier());
                let (sid, cid) = (session_id.to_owned(), call_id.clone());
                let mut on_delta = move |delta: StreamDelta| {
                    notifier.delta(&sid, &cid, delta);
                };
                let call = provider.complete(&request, stream, timeout, &mut on_delta);
                trace::scope(context, call.instrument(span.clone())).await.map_err(|e| {
                    overflow = e.context_overflow();
                    e.into_call_error()
                })
            }
            (None, _) => Err(CallError::terminal("the call has no model to call")),
            (_, None) => Err(CallError::terminal(format!(
                "agent {:?} has no model provider (set `llm` in its config)",
                session.agent_id()
            ))),
        };
        let failure =
            outcome.as_ref().err().map(|e| (e.code.map_or_else(|| "error".to_owned(), code_name), &e.error));
        trace::record_outcome(&span, failure.as_ref().map_or(Ok(()), |(code, error)| Err((code, error))));
        (outcome, overflow)
    }

    /// Runs an attempt of a server tool call: a call of one of the agent's MCP servers' tools.
    async fn run_tool_call(
        &self,
        session_id: &str,
        call_id: CallId,
        attempt: u32,
        claimed: (Session, u64),
        deadline: Option<Timestamp>,
    ) -> Result<Option<Executed>> {
        let session = &claimed.0;
        let Some(call) = session.call(&call_id) else { return Ok(None) };
        let CallSpec::ToolCall { name, arguments, .. } = &call.spec else { return Ok(None) };
        let source = session.tool_declaration(name, call.turn_id.as_ref()).and_then(|t| t.mcp);
        let servers = self.app.agent(session.agent_id()).and_then(|a| a.mcp.clone());
        let outcome = match (source, servers) {
            (Some(source), Some(servers)) => servers.call(&source, arguments).await,
            (Some(source), None) => Err(CallError::terminal(format!(
                "tool {name:?}: agent {:?} has no MCP server {:?} in this host's configuration",
                session.agent_id(),
                source.server
            ))),
            (None, _) => {
                Err(CallError::terminal(format!("tool {name:?} is no tool of the agent's MCP servers")))
            }
        };
        if let Err(e) = &outcome {
            tracing::info!(session_id, call_id = %call_id, attempt, tool = %name, error = %e.error, "MCP tool call failed");
        }
        let command = Command::ToolCallFinished { call_id, attempt, outcome };
        self.call_finished(session_id, claimed, command, deadline).await
    }

    /// Commits a call attempt's outcome ([`Dispatcher::outcome`]). The attempt may have timed
    /// out or been voided meanwhile: its result is then refused, rightly, and nothing follows.
    async fn call_finished(
        &self,
        session_id: &str,
        claimed: (Session, u64),
        command: Command,
        deadline: Option<Timestamp>,
    ) -> Result<Option<Executed>> {
        match self.outcome(session_id, claimed, command, deadline).await {
            Err(Error::Rejected(_)) => Ok(None),
            other => other.map(Some),
        }
    }

    /// Delivers outbox work to another session, then acknowledges it. What each item becomes
    /// is the engine's [`route`]; both sides are idempotent, so a crash between them
    /// only repeats a no-op.
    async fn route(&self, session_id: &str, seq: u64, item: OutboxItem) -> Result<()> {
        let from = SessionId::from(session_id);
        match route(&from, item) {
            Route::Spawn(spawn) => {
                // A session that already has the child's id is left alone unless it is this
                // delegation's own child (a redelivered spawn).
                let mut refused: Option<String> = None;
                self.app.list_mcp_tools(&spawn.agent_id).await;
                // A sub-agent's session is one of its owner's sessions: it counts toward
                // `sessions_per_owner` as any other (the creating commit is refused past it).
                let created = self
                    .app
                    .execute(&spawn.session_id, |s| {
                        if s.is_created() {
                            refused = spawn.check_existing(s).err();
                            return Ok(Vec::new());
                        }
                        let base = self.app.session_init(&spawn.agent_id, spawn.identity.clone())?;
                        Ok(vec![spawn.command(base)])
                    })
                    .await;
                let failure = match created {
                    Err(e) => Some(format!("cannot start sub-agent {:?}: {e}", spawn.agent_id)),
                    Ok(_) => refused,
                };
                if let Some(error) = failure {
                    let (parent, command) = spawn.failed(error);
                    self.app.command(&parent, command).await?;
                }
            }
            Route::Send(send) => {
                let target = send.session_id.clone();
                let (target_session, version) = self.app.load(&target).await?;
                if let Err(why) = send.check_target(&target_session) {
                    // Never a turn in a session that is not the sender's child; the sender's
                    // delegation settles through its spawn's failure.
                    tracing::warn!(session_id, target = %target, "{why}");
                } else {
                    // `check_target` passed: the target is the sender's child.
                    let link = target_session.parent().cloned();
                    let command = send.command(target_session.agent_id());
                    // From the state just loaded: no second load of the child.
                    let known = Some((target_session, version));
                    if let Err(e) = self.app.command_with(&target, known, Mode::default(), command).await {
                        if e.is_retryable() {
                            return Err(e);
                        }
                        if let Some(link) = link {
                            let error = format!("cannot send to sub-agent session {target:?}: {e}");
                            self.app.command(&link.session_id, child_failed(&link, &target, error)).await?;
                        }
                    }
                }
            }
            Route::Deliver { target, command } => match self.app.command(&target, command).await {
                Ok(_) | Err(Error::Rejected(Rejection::NoActiveTurn)) | Err(Error::SessionNotFound(_)) => {}
                Err(e) => return Err(e),
            },
        }
        self.app.command_with(session_id, None, IN_RUN, Command::OutboxDelivered { seq }).await.map(drop)
    }
}

/// Whether `effect` of `session`, started at `now`, ends before `deadline`: its own bound
/// (the call's or the delivery's timeout; a timer or a route, none) plus [`DEADLINE_MARGIN`].
/// An unbounded effect fits only a run without a deadline.
pub(crate) fn fits(session: &Session, effect: &Effect, now: Timestamp, deadline: Timestamp) -> bool {
    let bound = match effect {
        Effect::Tick | Effect::Route { .. } => Some(0),
        Effect::DeliverDecision { .. } => session.delivery_timeout_ms(),
        Effect::RunLlmCall { call_id, .. } | Effect::RunToolCall { call_id, .. } => {
            session.call(call_id).and_then(|c| c.policy.timeout_ms())
        }
    };
    bound.is_some_and(|ms| {
        let margin = DEADLINE_MARGIN.as_millis() as u64;
        now.plus_ms(ms.saturating_add(margin)) <= deadline
    })
}

/// The spans of one decision delivery: `decision.deliver`, inside a `tool.call` or `llm.call`
/// span when the delivery runs a call's attempt (`tool.execute`, `llm.execute`).
struct DeliverySpans {
    /// What the worker's `traceparent` names: the delivery.
    context: SpanContext,
    deliver: Span,
    work: Option<Span>,
}

impl DeliverySpans {
    fn new(session: &Session, trigger: &Trigger, decision_id: &DecisionId, attempt: u32) -> Self {
        let session_id = session.id().as_str();
        let turn_id =
            session.decision().and_then(|d| d.turn_id.as_ref()).map(|t| session.resolve_turn_id(t).as_str());
        let about = trace::About { session_id, turn_id, agent_id: session.agent_id() };
        let (parent, work) = match trigger {
            Trigger::ToolExecute(t) => {
                let context = SpanContext::work(session_id, turn_id, "tool.call", &t.id, t.attempt);
                (Some(context), Some(trace::tool_call_span(&context, about, &t.id, t.attempt, &t.name)))
            }
            Trigger::LlmExecute(t) => {
                let context = SpanContext::work(session_id, turn_id, "llm.call", &t.id, t.attempt);
                let model = t.request.get("model").and_then(|m| m.as_str()).unwrap_or("");
                (
                    Some(context),
                    Some(trace::llm_call_span(&context, about, &t.id, t.attempt, model, "worker")),
                )
            }
            _ => (None, None),
        };
        let context = match parent {
            Some(parent) => parent.child("decision.deliver", decision_id, attempt),
            None => SpanContext::work(session_id, turn_id, "decision.deliver", decision_id, attempt),
        };
        let make = || trace::deliver_span(&context, about, decision_id, attempt, trigger.name());
        let deliver = match &work {
            Some(work) => work.in_scope(make),
            None => make(),
        };
        DeliverySpans { context, deliver, work }
    }

    /// Records the delivery's outcome (a call's attempt ends with its delivery).
    fn outcome(&self, outcome: Result<(), (&str, String)>) {
        let outcome = match &outcome {
            Ok(()) => Ok(()),
            Err((code, message)) => Err((*code, message.as_str())),
        };
        trace::record_outcome(&self.deliver, outcome);
        if let Some(work) = &self.work {
            trace::record_outcome(work, outcome);
        }
    }
}

/// An error code's protocol name (`rate_limited`).
fn code_name(code: turnstone_engine::protocol::ErrorCode) -> String {
    match serde_json::to_value(code) {
        Ok(serde_json::Value::String(name)) => name,
        _ => "error".to_owned(),
    }
}

/// The state a commit left and the effect it claimed, for the dispatcher's next step.
fn split(after: Option<Executed>) -> (Option<(Session, u64)>, Option<Effect>) {
    match after {
        Some(e) => (Some((e.session, e.version)), e.claimed),
        None => (None, None),
    }
}

/// A request's tokens estimated from the whole of its view: the window a refusal that named
/// none is taken to have.
fn whole_estimate(session: &Session, call: &CallRecord) -> u64 {
    session.llm_request(call).map_or(0, |r| session.prompt_estimate(call, &r, &ViewOptions::default()))
}
