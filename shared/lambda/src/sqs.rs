//! The `dispatch` function: a batch of wake-ups from the SQS event source.
//!
//! Each session named in the batch is run once (a queue may carry several wake-ups for one
//! session: the first run does all that is due), sessions concurrently. The wake-ups of one
//! session are merged ([`WakeUp::merge`]): one announcing a commit that has not landed yet
//! makes the run wait for it, whichever record of the batch carried it. A record whose run
//! failed is reported as a batch item failure, so SQS delivers it again (after [`retry_after`])
//! and, after the redrive limit, moves it to the dead-letter queue; a record that is not a
//! wake-up at all is reported the same way and made visible at once, so it is in the
//! dead-letter queue within seconds for someone to look at instead of being dropped.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use futures_util::StreamExt;
use turnstone_aws::SqsQueue;
use turnstone_engine::ids::SessionId;
use turnstone_engine::time::Timestamp;
use turnstone_runtime::ahp::Pushes;
use turnstone_runtime::dispatch::Dispatcher;
use turnstone_runtime::queue::WakeUp;

/// How many sessions of one batch run at the same time.
const CONCURRENT_SESSIONS: usize = 10;

/// How long a message of a batch stays invisible while its session runs, renewed every half of
/// it until the run ends (the local host leases its receives the same way).
pub use turnstone_aws::LEASE;

/// When a failed run's wake-up comes back: after [`LEASE`] the first time, twice as long
/// each time after, at most 15 minutes (then the redrive limit parks it).
pub fn retry_after(receive_count: u32) -> Duration {
    LEASE.saturating_mul(1 << receive_count.clamp(1, 5).saturating_sub(1)).min(Duration::from_secs(900))
}

/// Runs the sessions a batch wakes, each within `deadline` (the invocation's, when there is
/// one: a run hands the rest of its work back to the queue instead of starting an effect that
/// could not end before it); answers the records that must come back. With `queue`, each
/// session's messages are held for a [`LEASE`] renewed while it runs, and a failed one comes
/// back after [`retry_after`].
pub async fn handle_batch(
    dispatcher: &Dispatcher,
    event: SqsEvent,
    deadline: Option<Timestamp>,
    queue: Option<&SqsQueue>,
    ahp: Option<&Pushes>,
) -> SqsBatchResponse {
    let mut failed: Vec<String> = Vec::new();
    // Records that are not wake-ups: they come back at once, so after the redrive limit they
    // are in the dead-letter queue within seconds (no later receive can make them one).
    let mut poisoned: Vec<String> = Vec::new();
    // Message ids by session, in arrival order.
    let mut sessions: BTreeMap<String, (WakeUp, Vec<String>)> = BTreeMap::new();
    // AHP clients' departures due (not runs of their sessions), with their message ids.
    let mut departures: Vec<(WakeUp, String)> = Vec::new();
    // Receipt handle and receive count by message id.
    let mut receipts: BTreeMap<String, (String, u32)> = BTreeMap::new();
    for record in event.records {
        let message_id = record.message_id.unwrap_or_default();
        if let Some(receipt) = record.receipt_handle {
            let count =
                record.attributes.get("ApproximateReceiveCount").and_then(|c| c.parse().ok()).unwrap_or(1);
            receipts.insert(message_id.clone(), (receipt, count));
        }
        match record.body.as_deref().map(WakeUp::from_body) {
            Some(Ok(wake_up)) if wake_up.departed.is_some() => departures.push((wake_up, message_id)),
            Some(Ok(wake_up)) => match sessions.get_mut(&wake_up.session_id) {
                Some((merged, message_ids)) => {
                    merged.merge(&wake_up);
                    message_ids.push(message_id);
                }
                None => {
                    sessions.insert(wake_up.session_id.clone(), (wake_up, vec![message_id]));
                }
            },
            Some(Err(e)) => {
                tracing::error!(message_id, error = %e, "an SQS record is not a wake-up; it goes to the dead-letter queue");
                poisoned.push(message_id);
            }
            None => {
                tracing::error!(message_id, "an SQS record has no body; it goes to the dead-letter queue");
                poisoned.push(message_id);
            }
        }
    }
    let held = |ids: &[String]| {
        ids.iter().filter_map(|id| receipts.get(id)).map(|(r, _)| r.clone()).collect::<Vec<_>>()
    };
    // The receipts of the sessions still running, renewed until their run ends.
    let running: Mutex<BTreeMap<String, Vec<String>>> =
        Mutex::new(sessions.iter().map(|(id, (_, ids))| (id.clone(), held(ids))).collect());
    let renew = async {
        let Some(queue) = queue else { return std::future::pending::<std::convert::Infallible>().await };
        loop {
            let receipts: Vec<String> = lock(&running).values().flatten().cloned().collect();
            if !receipts.is_empty()
                && let Err(e) = queue.hold(&receipts, LEASE).await
            {
                // The queue's own visibility timeout still holds them: a slower return, no loss.
                tracing::warn!(error = %e, "could not renew the lease of a batch's wake-ups");
            }
            tokio::time::sleep(LEASE / 2).await;
        }
    };
    let runs = futures_util::stream::iter(sessions.into_values())
        .map(|(wake_up, message_ids)| {
            let running = &running;
            async move {
                let result = dispatcher.run_until(&wake_up, deadline).await;
                lock(running).remove(&wake_up.session_id);
                match result {
                    Ok(()) => Vec::new(),
                    Err(e) => {
                        let session_id = &wake_up.session_id;
                        tracing::warn!(%session_id, error = %e, "session run failed; its wake-up comes back");
                        message_ids
                    }
                }
            }
        })
        .buffer_unordered(CONCURRENT_SESSIONS)
        .collect::<Vec<_>>();
    let runs = tokio::select! {
        runs = runs => runs,
        never = renew => match never {},
    };
    failed.extend(runs.into_iter().flatten());
    for (wake_up, message_id) in departures {
        let (Some(departed), Some(ahp)) = (&wake_up.departed, ahp) else {
            tracing::warn!(
                message_id,
                "an AHP client's departure came to a dispatch function without AHP; dropped"
            );
            continue;
        };
        let session = SessionId::from(wake_up.session_id.as_str());
        if let Err(e) = ahp.depart(&session, departed).await {
            tracing::warn!(%session, client_id = departed.client_id, error = %e, "an AHP client's departure failed; it comes back");
            failed.push(message_id);
        }
    }
    if let Some(queue) = queue {
        let back =
            failed.iter().map(|id| (id, None)).chain(poisoned.iter().map(|id| (id, Some(Duration::ZERO))));
        for (id, after) in back {
            let Some((receipt, count)) = receipts.get(id) else { continue };
            let after = after.unwrap_or_else(|| retry_after(*count));
            if let Err(e) = queue.hold(std::slice::from_ref(receipt), after).await {
                tracing::warn!(message_id = %id, error = %e, "could not set when a failed record comes back");
            }
        }
    }
    failed.extend(poisoned);
    // Pushes to AHP subscribers finish before the invocation ends (the process may freeze).
    dispatcher.app().notifier().flush().await;
    // Both types are non-exhaustive: built from their defaults.
    let mut response = SqsBatchResponse::default();
    response.batch_item_failures = failed
        .into_iter()
        // An empty identifier would fail the whole batch (Lambda's partial batch response
        // treats an empty or null itemIdentifier as a complete failure: AWS Lambda developer
        // guide, "Implementing partial batch responses"), running every other session's wake-up
        // again; a record sent without a message id cannot be named, so it is logged and left.
        .filter(|id| {
            if id.is_empty() {
                tracing::error!(
                    "a failed SQS record has no messageId: it cannot be reported alone and is dropped"
                );
            }
            !id.is_empty()
        })
        .map(|id| {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            failure
        })
        .collect();
    response
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs the `dispatch` function.
pub async fn run_dispatch(
    dispatcher: std::sync::Arc<Dispatcher>,
    queue: SqsQueue,
    ahp: Option<std::sync::Arc<Pushes>>,
) -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(lambda_runtime::service_fn(move |event: lambda_runtime::LambdaEvent<SqsEvent>| {
        let (dispatcher, queue, ahp) = (std::sync::Arc::clone(&dispatcher), queue.clone(), ahp.clone());
        async move {
            // Lambda's deadline: milliseconds since the epoch, as the clock's.
            let deadline = i64::try_from(event.context.deadline).ok().map(Timestamp);
            let response =
                handle_batch(&dispatcher, event.payload, deadline, Some(&queue), ahp.as_deref()).await;
            crate::emit_metrics(dispatcher.app());
            Ok::<_, lambda_runtime::Error>(response)
        }
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_wake_up_comes_back_later_each_time_up_to_15_minutes() {
        let secs: Vec<u64> = (0..8).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(secs, [60, 60, 120, 240, 480, 900, 900, 900]);
    }
}
