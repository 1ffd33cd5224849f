//! The `sweep` function: on its schedule, enqueue every session whose wake time passed and that
//! the store's due index holds: those whose wake-up could not be sent (a commit's wake-up goes
//! out before it, and a run's before its wake-up is acknowledged, so no other is ever lost).

use std::sync::Arc;

use serde::Serialize;
use turnstone_runtime::dispatch::Dispatcher;

/// How many due sessions one sweep enqueues at most (the next sweep takes the rest).
pub const SWEEP_LIMIT: usize = 1000;

/// What a sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Swept {
    /// Sessions enqueued.
    pub enqueued: usize,
}

/// Handles one scheduled event.
pub async fn handle_schedule(dispatcher: &Dispatcher) -> Result<Swept, turnstone_runtime::error::Error> {
    let enqueued = dispatcher.sweep(SWEEP_LIMIT).await?;
    if enqueued > 0 {
        tracing::info!(enqueued, "swept sessions whose wake time passed");
    }
    Ok(Swept { enqueued })
}

/// Runs the `sweep` function.
pub async fn run_sweep(dispatcher: Arc<Dispatcher>) -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(lambda_runtime::service_fn(
        // The event (EventBridge's "Scheduled Event", or the Scheduler's input) says nothing the
        // sweep needs: any JSON is accepted.
        move |_: lambda_runtime::LambdaEvent<serde_json::Value>| {
            let dispatcher = Arc::clone(&dispatcher);
            async move { handle_schedule(&dispatcher).await.map_err(lambda_runtime::Error::from) }
        },
    ))
    .await
}
