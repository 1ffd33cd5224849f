//! The local host's queue workers: tasks that take wake-ups from a polled queue and hand each
//! to the [`Dispatcher`], one run per session at a time within the process.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use crate::dispatch::Dispatcher;
use crate::locks::SessionLocks;
use crate::queue::{Consumer, Delivery, QueueError};

/// How long a worker waits for a wake-up before asking again.
const RECEIVE_WAIT: Duration = Duration::from_secs(5);

/// Running queue workers.
pub struct Pool {
    consumer: Arc<dyn Consumer>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Pool {
    /// Starts `workers` tasks that run the sessions `consumer` delivers, until it closes. A
    /// wake-up for a session already running waits for that run.
    pub fn spawn(dispatcher: Arc<Dispatcher>, consumer: Arc<dyn Consumer>, workers: usize) -> Pool {
        let locks = Arc::new(SessionLocks::default());
        let workers = (0..workers.max(1))
            .map(|_| {
                let (dispatcher, consumer, locks) =
                    (Arc::clone(&dispatcher), Arc::clone(&consumer), Arc::clone(&locks));
                tokio::spawn(async move { work(&dispatcher, consumer.as_ref(), &locks).await })
            })
            .collect();
        Pool { consumer, workers }
    }

    /// Stops taking wake-ups and waits for the runs in progress to end.
    pub async fn shutdown(self) {
        self.consumer.close().await;
        for worker in self.workers {
            let _ = worker.await;
        }
    }
}

async fn work(dispatcher: &Dispatcher, consumer: &dyn Consumer, locks: &SessionLocks) {
    loop {
        let deliveries = match consumer.receive(1, RECEIVE_WAIT).await {
            Ok(d) => d,
            Err(QueueError::Closed) => return,
            Err(e) => {
                tracing::warn!(error = %e, "queue receive failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        for delivery in deliveries {
            let session_id = delivery.wake_up.session_id.as_str();
            let guard = locks.lock(session_id).await;
            // A bug that panics while running one session must not take the worker down with
            // it: the session is left unacked (and retried later), the worker goes on.
            let run = AssertUnwindSafe(dispatcher.run(&delivery.wake_up)).catch_unwind();
            let outcome = match consumer.lease() {
                None => run.await,
                Some(lease) => tokio::select! {
                    outcome = run => outcome,
                    never = renew(consumer, &delivery, lease) => match never {},
                },
            };
            drop(guard);
            match outcome {
                Ok(Ok(())) => {
                    if let Err(e) = consumer.ack(&delivery).await {
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

/// Renews `delivery`'s lease every half of it, for as long as it is polled (its run lasts).
async fn renew(consumer: &dyn Consumer, delivery: &Delivery, lease: Duration) -> std::convert::Infallible {
    loop {
        tokio::time::sleep(lease / 2).await;
        if let Err(e) = consumer.renew(delivery).await {
            // The lease from before still holds it for a while: a slower return, no loss.
            let session_id = delivery.wake_up.session_id.as_str();
            tracing::warn!(session_id, error = %e, "could not renew a wake-up's lease");
        }
    }
}
