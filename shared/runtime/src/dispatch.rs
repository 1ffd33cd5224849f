//! The dispatcher: for one session, plan what is due, claim it by committing its dispatch,
//! perform the I/O outside any transaction, and commit the outcome as a command; repeat while
//! work is due. A crash anywhere loses nothing: a claimed effect that never finishes times
//! out at its deadline and is retried by policy.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use turnstone_engine::ids::{CallId, DecisionId, SessionId};
use turnstone_engine::protocol::{StreamDelta, Trigger};
use turnstone_engine::session::{
    CallSpec, Command, Effect, OutboxItem, Rejection, Route, Session, child_failed, route,
};

use crate::app::{App, Executed, claim_command, is_stale_claim, still_claimed};
use crate::error::{Error, Result};
use crate::queue::QueueError;

/// Bounds the effects one run performs before yielding the session to the queue again.
const MAX_EFFECTS_PER_RUN: usize = 256;

impl App {
    /// Performs a session's due work until none is left (or the run's budget is spent, in
    /// which case it re-enqueues itself).
    pub async fn run_session(self: &Arc<Self>, session_id: &str) -> Result<()> {
        // The state the last effect committed: the next plan starts from it instead of a load
        // (commits are version-checked, so a state that went stale only costs a reload).
        let mut known = None;
        // An effect already claimed (by the last commit, or by a submit of this process).
        let mut claimed = self.take_handoff(session_id);
        for _ in 0..MAX_EFFECTS_PER_RUN {
            let (session, version) = match known.take() {
                Some(known) => known,
                None => self.load(session_id).await?,
            };
            if !session.is_created() {
                return Ok(());
            }
            if let Some(effect) = claimed.take() {
                if still_claimed(&session, &effect) {
                    let after = self.perform_claimed(session_id, effect, (session, version)).await?;
                    (known, claimed) = split(after);
                } else {
                    known = Some((session, version));
                }
                continue;
            }
            let plan = session.plan(self.now());
            // Timers first (they may void work), then routing, then I/O.
            let Some(effect) = plan
                .effects
                .iter()
                .find(|e| matches!(e, Effect::Tick))
                .or_else(|| plan.effects.iter().find(|e| matches!(e, Effect::Route { .. })))
                .or_else(|| plan.effects.first())
                .cloned()
            else {
                // Nothing is due yet. The wake-up for the next due time may have been merged
                // into the one that brought us here (a queue keeps a session's earliest
                // wake-up only), so arm it again; without this a retry backoff or deadline
                // would wait for the sweep.
                if let Some(at) = plan.wake_at {
                    let delay = Duration::from_millis(u64::try_from(at.0 - self.now().0).unwrap_or(0));
                    let wake = crate::queue::WakeUp {
                        session_id: session_id.to_owned(),
                        reason: "timer".to_owned(),
                    };
                    if let Err(e) = self.queue.send(wake, delay).await {
                        // The head records the wake time; the sweep picks the session up.
                        tracing::warn!(session_id, error = %e, "could not enqueue a timer wake-up");
                    }
                }
                return Ok(());
            };
            match self.perform(session_id, effect, (session, version)).await {
                Ok(after) => (known, claimed) = split(after),
                Err(e) if is_stale_claim(&e) => {}
                Err(e) => return Err(e),
            }
        }
        self.wake(session_id, "budget").await
    }

    pub(crate) async fn wake(&self, session_id: &str, reason: &str) -> Result<()> {
        let wake = crate::queue::WakeUp { session_id: session_id.to_owned(), reason: reason.to_owned() };
        self.queue.send(wake, Duration::ZERO).await.map_err(Error::from)
    }

    /// Performs `effect`, planned from `known`; returns what it committed last, if it knows it,
    /// for the next plan (with the effect that commit claimed, if any).
    async fn perform(
        self: &Arc<Self>,
        session_id: &str,
        effect: Effect,
        known: (Session, u64),
    ) -> Result<Option<Executed>> {
        match effect {
            Effect::Tick => self.command_from(session_id, Some(known), Command::Tick).await.map(Some),
            Effect::Route { seq, item } => self.route(session_id, seq, item).await.map(|()| None),
            Effect::DeliverDecision { .. } | Effect::RunLlmCall { .. } => {
                let claim = self.command_from(session_id, Some(known), claim_command(&effect)).await?;
                let state = (claim.session, claim.version);
                self.perform_claimed(session_id, effect, state).await
            }
        }
    }

    /// Performs the I/O of a claimed effect and commits its outcome (claiming the next effect
    /// in the same commit).
    async fn perform_claimed(
        self: &Arc<Self>,
        session_id: &str,
        effect: Effect,
        claimed: (Session, u64),
    ) -> Result<Option<Executed>> {
        match effect {
            Effect::DeliverDecision { decision_id, attempt } => {
                self.deliver_decision(session_id, decision_id, attempt, claimed).await
            }
            Effect::RunLlmCall { call_id, attempt } => {
                self.run_llm_call(session_id, call_id, attempt, claimed).await
            }
            Effect::Tick | Effect::Route { .. } => Ok(None),
        }
    }

    /// Commits an effect's outcome, claiming the next due effect in the same write.
    async fn outcome(&self, session_id: &str, known: (Session, u64), command: Command) -> Result<Executed> {
        self.execute_claiming(session_id, Some(known), |session| {
            if !session.is_created() {
                return Err(Error::SessionNotFound(session_id.to_owned()));
            }
            Ok(vec![command.clone()])
        })
        .await
    }

    async fn deliver_decision(
        self: &Arc<Self>,
        session_id: &str,
        decision_id: DecisionId,
        attempt: u32,
        claimed: (Session, u64),
    ) -> Result<Option<Executed>> {
        let Some(request) = claimed.0.decision_request() else { return Ok(None) };
        let session = &claimed.0;
        let agent = self.agent(session.agent_id());
        let Some(endpoint) = agent.and_then(|a| a.worker.clone()) else {
            let error = format!("agent {:?} has no worker configured", session.agent_id());
            return self.delivery_failed(session_id, decision_id, attempt, error, false).await.map(|()| None);
        };
        // A `tool.execute`/`llm.execute` delivery is bounded by its call's own timeout.
        let timeout = session.delivery_timeout_ms().map(Duration::from_millis);
        let stream_call = match &request.trigger {
            Trigger::LlmExecute(t) => Some(t.id.clone()),
            _ => None,
        };
        let hub = self.hub().clone();
        let sid = session_id.to_owned();
        let on_delta = move |delta: StreamDelta| {
            if let Some(call_id) = &stream_call {
                hub.delta(&sid, call_id, delta);
            }
        };
        let now_unix = self.now().0 / 1000;
        match self.worker.deliver(&endpoint, &request, timeout, now_unix, on_delta).await {
            Ok(answer) => {
                let command = Command::Answer {
                    decision_id,
                    attempt,
                    response: Box::new(answer.response),
                    ignored_fields: answer.ignored_fields,
                };
                self.outcome(session_id, claimed, command).await.map(Some)
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
        self.command(session_id, Command::DeliveryFailed { decision_id, attempt, error, retryable })
            .await
            .map(drop)
    }

    async fn run_llm_call(
        self: &Arc<Self>,
        session_id: &str,
        call_id: CallId,
        attempt: u32,
        claimed: (Session, u64),
    ) -> Result<Option<Executed>> {
        let session = &claimed.0;
        let Some(call) = session.call(&call_id) else { return Ok(None) };
        let stream = matches!(call.spec, CallSpec::LlmCall { stream: true, .. });
        let timeout = call.policy.timeout_ms().map(Duration::from_millis);
        let request = session.llm_request(call);
        let provider = self.agent(session.agent_id()).and_then(|a| a.provider.clone());
        let outcome = match (request, provider) {
            (Some(request), Some(provider)) => {
                let hub = self.hub().clone();
                let (sid, cid) = (session_id.to_owned(), call_id.clone());
                let mut on_delta = move |delta: StreamDelta| {
                    hub.delta(&sid, &cid, delta);
                };
                provider
                    .complete(&request, stream, timeout, &mut on_delta)
                    .await
                    .map_err(|e| e.into_call_error())
            }
            (None, _) => Err(turnstone_engine::session::CallError::terminal("the call has no model to call")),
            (_, None) => Err(turnstone_engine::session::CallError::terminal(format!(
                "agent {:?} has no model provider (set `llm` in its config)",
                session.agent_id()
            ))),
        };
        let command = Command::LlmCallFinished { call_id, attempt, outcome };
        match self.outcome(session_id, claimed, command).await {
            // The attempt timed out or was voided meanwhile: its result is refused, rightly.
            Err(Error::Rejected(_)) => Ok(None),
            other => other.map(Some),
        }
    }

    /// Delivers outbox work to another session, then acknowledges it. What each item becomes
    /// is the engine's [`route`]; both sides are idempotent, so a crash between them
    /// only repeats a no-op.
    async fn route(self: &Arc<Self>, session_id: &str, seq: u64, item: OutboxItem) -> Result<()> {
        let from = SessionId::from(session_id);
        match route(&from, item) {
            Route::Spawn(spawn) => {
                // A session that already has the child's id is left alone unless it is this
                // delegation's own child (a redelivered spawn).
                let mut refused: Option<String> = None;
                let created = self
                    .execute(&spawn.session_id, |s| {
                        if s.is_created() {
                            refused = spawn.check_existing(s).err();
                            return Ok(Vec::new());
                        }
                        let base = self.session_init(&spawn.agent_id, spawn.identity.clone())?;
                        Ok(vec![spawn.command(base)])
                    })
                    .await;
                let failure = match created {
                    Err(e) => Some(format!("cannot start sub-agent {:?}: {e}", spawn.agent_id)),
                    Ok(_) => refused,
                };
                if let Some(error) = failure {
                    let (parent, command) = spawn.failed(error);
                    self.command(&parent, command).await?;
                }
            }
            Route::Send(send) => {
                let target = send.session_id.clone();
                let (target_session, version) = self.load(&target).await?;
                if let Err(why) = send.check_target(&target_session) {
                    // Never a turn in a session that is not the sender's child; the sender's
                    // delegation settles through its spawn's failure.
                    tracing::warn!(session_id, target = %target, "{why}");
                } else {
                    // `check_target` passed: the target is the sender's child.
                    let link = target_session.parent().cloned();
                    let command = send.command(target_session.agent_id());
                    // From the state just loaded: no second load of the child.
                    if let Err(e) = self.command_from(&target, Some((target_session, version)), command).await
                    {
                        if e.is_retryable() {
                            return Err(e);
                        }
                        if let Some(link) = link {
                            let error = format!("cannot send to sub-agent session {target:?}: {e}");
                            self.command(&link.session_id, child_failed(&link, &target, error)).await?;
                        }
                    }
                }
            }
            Route::Deliver { target, command } => match self.command(&target, command).await {
                Ok(_) | Err(Error::Rejected(Rejection::NoActiveTurn)) | Err(Error::SessionNotFound(_)) => {}
                Err(e) => return Err(e),
            },
        }
        self.command(session_id, Command::OutboxDelivered { seq }).await.map(drop)
    }

    /// Runs `workers` tasks that take wake-ups from the queue and run their sessions, until
    /// the queue closes. Sessions are run one at a time each (a wake-up for a session already
    /// running waits for it).
    pub fn spawn_workers(self: &Arc<Self>, workers: usize) -> Vec<tokio::task::JoinHandle<()>> {
        let locks = Arc::new(crate::locks::SessionLocks::default());
        (0..workers.max(1))
            .map(|_| {
                let app = Arc::clone(self);
                let locks = Arc::clone(&locks);
                tokio::spawn(async move { app.work_loop(&locks).await })
            })
            .collect()
    }

    async fn work_loop(self: &Arc<Self>, locks: &crate::locks::SessionLocks) {
        loop {
            let deliveries = match self.queue.receive(1, Duration::from_secs(5)).await {
                Ok(d) => d,
                Err(QueueError::Closed) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "queue receive failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            for delivery in deliveries {
                let session_id = delivery.wake_up.session_id.clone();
                let guard = locks.lock(&session_id).await;
                // A bug that panics while running one session must not take the worker down
                // with it: the session is left unacked (and retried later), the worker goes on.
                let outcome = AssertUnwindSafe(self.run_session(&session_id)).catch_unwind().await;
                drop(guard);
                match outcome {
                    Ok(Ok(())) => {
                        if let Err(e) = self.queue.ack(&delivery).await {
                            tracing::warn!(session_id, error = %e, "queue ack failed");
                        }
                    }
                    // Not acked: the queue delivers it again after its visibility timeout.
                    Ok(Err(e)) => tracing::warn!(session_id, error = %e, "session run failed"),
                    Err(_) => tracing::error!(session_id, "session run panicked; it will be retried"),
                }
            }
        }
    }

    /// Enqueues every session that has a wake time, due or not: after a restart, an
    /// in-process queue has lost the delayed wake-ups of the previous process.
    pub async fn recover(&self, limit: usize) -> Result<usize> {
        let scheduled = self.store.due(turnstone_engine::time::Timestamp(i64::MAX), limit).await?;
        for session_id in &scheduled {
            self.wake(session_id, "recover").await?;
        }
        Ok(scheduled.len())
    }

    /// Enqueues every session whose wake time has passed (a wake-up may have been lost).
    pub async fn sweep(&self, limit: usize) -> Result<usize> {
        let due = self.store.due(self.now(), limit).await?;
        for session_id in &due {
            self.wake(session_id, "sweep").await?;
        }
        Ok(due.len())
    }
}

/// The state a commit left and the effect it claimed, for the dispatcher's next step.
fn split(after: Option<Executed>) -> (Option<(Session, u64)>, Option<Effect>) {
    match after {
        Some(e) => (Some((e.session, e.version)), e.claimed),
        None => (None, None),
    }
}
