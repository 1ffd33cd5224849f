//! Keeping a server model call within its model's context window: before an attempt is sent,
//! the dispatcher estimates its request and, past the agent's threshold, compacts the
//! conversation's view (the engine's [`Session::plan_compaction`]): clearing old tool results,
//! or a summarizing model call. The compaction is committed as the claimed attempt's
//! (`Command::Compact`, fenced by it) before the request is sent, so a crash or a timeout
//! loses at most an unrecorded summary, never a turn, and a compaction that landed is never
//! made twice: the next attempt's view already holds it. A request the provider still refuses
//! for its length is compacted once more, harder, and sent again within the same attempt.

use std::time::Duration;

use turnstone_engine::ids::CallId;
use turnstone_engine::protocol::LlmRequest;
use turnstone_engine::session::{
    CallError, CallSpec, Command, CompactionPlan, ContextLimits, Rejection, Session, TooLarge, ViewOptions,
};

use super::{Dispatcher, IN_RUN};
use crate::app::AgentRuntime;
use crate::error::{Error, Result};
use crate::llm::{ContextOverflow, ProviderError};

/// Why a request is compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// Its estimate passed the agent's threshold.
    Threshold,
    /// The provider refused it for its length (`tokens` as it counted them, when it said).
    Refused(ContextOverflow),
}

impl Why {
    fn name(self) -> &'static str {
        match self {
            Why::Threshold => "threshold",
            Why::Refused(_) => "refused",
        }
    }
}

/// A request that fits, or may be sent as it is.
pub(super) struct Ready {
    /// The session as the attempt now stands (compacted or not).
    pub claimed: (Session, u64),
    /// The request built from it while checking, when nothing changed after: sent as it is
    /// instead of built again.
    pub request: Option<LlmRequest>,
}

/// What making a request fit came to.
pub(super) enum Fit {
    Ready(Box<Ready>),
    /// It cannot fit: the call fails with this error.
    Failed(CallError),
    /// The attempt is no longer claimed (timed out, voided): nothing more to do.
    Gone,
}

impl Fit {
    fn ready(claimed: (Session, u64), request: Option<LlmRequest>) -> Self {
        Fit::Ready(Box::new(Ready { claimed, request }))
    }
}

impl Dispatcher {
    /// Compacts the view of `call_id`'s claimed `attempt` until its request fits `limits` (at
    /// most twice: a clearing that is not enough is followed by a summary), or says why it
    /// cannot. `why` is [`Why::Refused`] when the provider refused the request as it was.
    pub(super) async fn fit(
        &self,
        session_id: &str,
        (call_id, attempt): (&CallId, u32),
        mut claimed: (Session, u64),
        agent: &AgentRuntime,
        limits: &ContextLimits,
        why: Why,
    ) -> Result<Fit> {
        let view = ViewOptions::from(limits);
        let mut forced = matches!(why, Why::Refused(_));
        for _ in 0..2 {
            let session = &claimed.0;
            let Some(call) = session.call(call_id).filter(|c| c.is_pending() && c.attempt == attempt) else {
                return Ok(Fit::Gone);
            };
            // Explicit messages are the worker's own view: sent as given.
            if matches!(&call.spec, CallSpec::LlmCall { action, .. } if action.messages.is_some()) {
                return Ok(Fit::ready(claimed, None));
            }
            let Some(request) = session.llm_request_with(call, &view) else {
                return Ok(Fit::ready(claimed, None));
            };
            let reserve = agent.context.reserve(&request, limits);
            let mut estimate = session.prompt_estimate(call, &request, &view);
            if let Why::Refused(overflow) = why {
                // The provider's count is the truth the estimate missed.
                estimate = estimate.max(overflow.tokens.unwrap_or(0).saturating_sub(reserve));
            }
            if !forced && estimate <= limits.threshold(reserve) {
                return Ok(Fit::ready(claimed, Some(request)));
            }
            let plan = match session.plan_compaction(
                call,
                limits,
                reserve,
                Session::fixed_tokens(&request),
                estimate,
            ) {
                Ok(Some(plan)) => plan,
                Ok(None) if estimate + reserve <= limits.window => {
                    return Ok(Fit::ready(claimed, Some(request)));
                }
                Ok(None) => {
                    let tokens = estimate + reserve;
                    return Ok(Fit::Failed(too_large(TooLarge { tokens, window: limits.window })));
                }
                Err(e) => return Ok(Fit::Failed(too_large(e))),
            };
            let response = match plan.compaction.kind {
                turnstone_engine::protocol::CompactionKind::ClearedToolResults => None,
                turnstone_engine::protocol::CompactionKind::Summary => {
                    match self.summarize(session, call_id, &plan, &request, agent, limits).await {
                        Ok(response) => Some(response),
                        Err(e) => return Ok(Fit::Failed(e.into_call_error())),
                    }
                }
            };
            tracing::info!(
                session_id,
                call_id = %call_id,
                kind = ?plan.compaction.kind,
                before = plan.tokens_before,
                after = plan.tokens_after,
                why = why.name(),
                "compacting the conversation's view"
            );
            let command = Command::Compact {
                call_id: call_id.clone(),
                attempt,
                compaction: plan.compaction,
                response,
                tokens_before: plan.tokens_before,
                tokens_after: plan.tokens_after,
                reason: why.name().to_owned(),
            };
            let known = claimed.clone();
            claimed = match self.app.command_with(session_id, Some(claimed), IN_RUN, command).await {
                Ok(done) => (done.session, done.version),
                // The attempt is no longer the claimed one: nothing more to do for it.
                Err(Error::Rejected(e @ Rejection::StaleClaim(_))) => {
                    tracing::info!(session_id, call_id = %call_id, "compaction not recorded: {e}");
                    return Ok(Fit::Gone);
                }
                // The compaction cannot be recorded (the conversation moved on past the call's
                // anchor): the request goes as it is, and a refusal for length fails the call.
                Err(Error::Rejected(e)) => {
                    tracing::warn!(session_id, call_id = %call_id, "compaction refused, sending as is: {e}");
                    return Ok(Fit::ready(known, None));
                }
                Err(e) => return Err(e),
            };
            // A refused request compacted once is sent again; a threshold's is checked again.
            forced = false;
            if matches!(why, Why::Refused(_)) {
                return Ok(Fit::ready(claimed, None));
            }
        }
        Ok(Fit::ready(claimed, None))
    }

    /// The summarizing model call of `plan`, on the agent's provider: the agent's summary
    /// model, or the call's own, bounded by the time left in the attempt.
    async fn summarize(
        &self,
        session: &Session,
        call_id: &CallId,
        plan: &CompactionPlan,
        request: &LlmRequest,
        agent: &AgentRuntime,
        limits: &ContextLimits,
    ) -> std::result::Result<turnstone_engine::protocol::LlmResponse, ProviderError> {
        let Some(provider) = agent.provider.clone() else {
            return Err(ProviderError::terminal("the agent has no model provider to summarize with"));
        };
        let compaction = &agent.context.compaction;
        let model = compaction.model.clone().unwrap_or_else(|| request.model.clone());
        // The summarizer's own window, when it is another model; else the call's.
        let window = agent.context.limits(&model).map_or(limits.window, |l| l.window);
        let input = window.saturating_sub(limits.summary_max_tokens).saturating_mul(3) / 4;
        let summary =
            plan.summary_request(&model, compaction.prompt.as_deref(), input, limits.summary_max_tokens);
        let timeout = session.call(call_id).and_then(|c| c.deadline).map(|deadline| {
            Duration::from_millis(deadline.0.saturating_sub(self.app.now().0).max(1_000) as u64)
        });
        provider.complete(&summary, false, timeout, &mut |_| {}).await
    }
}

/// The error of a request that cannot be made to fit: final, its turn fails saying so.
fn too_large(e: TooLarge) -> CallError {
    CallError::terminal(e.to_string())
}
