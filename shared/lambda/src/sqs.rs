//! The `dispatch` function: a batch of wake-ups from the SQS event source.
//!
//! Each session named in the batch is run once (a queue may carry several wake-ups for one
//! session: the first run does all that is due), sessions concurrently. The wake-ups of one
//! session are merged ([`WakeUp::merge`]): one announcing a commit that has not landed yet
//! makes the run wait for it, whichever record of the batch carried it. A record whose run
//! failed is reported as a batch item failure, so SQS delivers it again after the queue's
//! visibility timeout and, after the redrive limit, moves it to the dead-letter queue; a
//! record that is not a wake-up at all is reported the same way, so it ends in the
//! dead-letter queue for someone to look at instead of being dropped.

use std::collections::BTreeMap;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use futures_util::StreamExt;
use turnstone_engine::time::Timestamp;
use turnstone_runtime::dispatch::Dispatcher;
use turnstone_runtime::queue::WakeUp;

/// How many sessions of one batch run at the same time.
const CONCURRENT_SESSIONS: usize = 10;

/// Runs the sessions a batch wakes, each within `deadline` (the invocation's, when there is
/// one: a run hands the rest of its work back to the queue instead of starting an effect that
/// could not end before it); answers the records that must come back.
pub async fn handle_batch(
    dispatcher: &Dispatcher,
    event: SqsEvent,
    deadline: Option<Timestamp>,
) -> SqsBatchResponse {
    let mut failed: Vec<String> = Vec::new();
    // Message ids by session, in arrival order.
    let mut sessions: BTreeMap<String, (WakeUp, Vec<String>)> = BTreeMap::new();
    for record in event.records {
        let message_id = record.message_id.unwrap_or_default();
        match record.body.as_deref().map(WakeUp::from_body) {
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
                failed.push(message_id);
            }
            None => {
                tracing::error!(message_id, "an SQS record has no body; it goes to the dead-letter queue");
                failed.push(message_id);
            }
        }
    }
    let runs = futures_util::stream::iter(sessions.into_values())
        .map(|(wake_up, message_ids)| async move {
            match dispatcher.run_until(&wake_up, deadline).await {
                Ok(()) => Vec::new(),
                Err(e) => {
                    tracing::warn!(session_id = %wake_up.session_id, error = %e, "session run failed; its wake-up comes back");
                    message_ids
                }
            }
        })
        .buffer_unordered(CONCURRENT_SESSIONS)
        .collect::<Vec<_>>()
        .await;
    failed.extend(runs.into_iter().flatten());
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

/// Runs the `dispatch` function.
pub async fn run_dispatch(dispatcher: std::sync::Arc<Dispatcher>) -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(lambda_runtime::service_fn(move |event: lambda_runtime::LambdaEvent<SqsEvent>| {
        let dispatcher = std::sync::Arc::clone(&dispatcher);
        async move {
            // Lambda's deadline: milliseconds since the epoch, as the clock's.
            let deadline = i64::try_from(event.context.deadline).ok().map(Timestamp);
            let response = handle_batch(&dispatcher, event.payload, deadline).await;
            crate::emit_metrics(dispatcher.app());
            Ok::<_, lambda_runtime::Error>(response)
        }
    }))
    .await
}
