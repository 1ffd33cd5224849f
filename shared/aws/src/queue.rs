//! The SQS queue: the `Queue` and `Consumer` ports on a standard queue (DESIGN.md section 6).
//!
//! A message's body is the JSON [`WakeUp`]; it carries no state. Delivery is at least once and
//! unordered, and wake-ups do not coalesce: two sends are two messages. A send's delay becomes
//! `DelaySeconds`, rounded up to whole seconds (never early) and capped at SQS's 900 s: a
//! wake-up for a later time arrives early, and the dispatcher, which plans from the session's
//! stored wake time on every arrival, finds nothing due yet and leaves the next wake-up (the
//! sweep of due heads finds anything a capped wake-up did not cover). A queue with a
//! [`Scheduler`] ([`SqsQueue::scheduling`], as the Lambda functions build it) sends those as
//! one-time schedules instead, which Scheduler delivers to this queue when they are due.
//!
//! `receive` long-polls (20 s at most per request, SQS's limit) until something arrives or the
//! wait is over; a received message stays invisible for the queue's visibility timeout, and
//! comes back unless acknowledged (`ack` deletes it by receipt handle). A body that is not a
//! wake-up is logged and left alone, so the queue's redrive policy moves it to the dead-letter
//! queue.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;
use tokio::sync::watch;
use tokio::time::Instant;
use turnstone_runtime::queue::{Consumer, Delivery, Queue, QueueError, WakeUp};

use crate::error::{AwsError, describe};
use crate::schedule::Scheduler;

/// The longest delay SQS takes.
pub const MAX_DELAY: Duration = Duration::from_secs(900);
/// The longest one receive request waits (SQS's `WaitTimeSeconds` limit).
const MAX_WAIT_SECS: u64 = 20;
/// The most messages one receive request returns.
const MAX_BATCH: usize = 10;

/// How [`SqsQueue::create_queue`] sets a queue up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// How long a received message stays invisible: longer than one dispatcher run, so a
    /// message is not delivered again while it is handled.
    pub visibility_timeout: Duration,
    /// How long an undelivered message is kept.
    pub retention: Duration,
    /// After how many receives a message moves to the dead-letter queue `<name>-dlq`; `None`:
    /// no dead-letter queue.
    pub max_receive_count: Option<u32>,
}

impl Default for QueueSettings {
    /// As `infra/template.yaml` deploys it: 960 s, 4 days, five receives.
    fn default() -> Self {
        QueueSettings {
            visibility_timeout: Duration::from_secs(960),
            retention: Duration::from_secs(4 * 24 * 3600),
            max_receive_count: Some(5),
        }
    }
}

/// SQS's `RedrivePolicy` attribute.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RedrivePolicy {
    dead_letter_target_arn: String,
    max_receive_count: u32,
}

/// How long the dead-letter queue keeps messages (SQS's maximum, 14 days).
const DEAD_LETTER_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);

/// How long a received wake-up stays invisible while its session runs, renewed every half of
/// it until the run ends. A run that dies (a Lambda invocation that timed out, ran out of
/// memory or crashed; a host killed) renews nothing, so its wake-up comes back within this,
/// not after the queue's visibility timeout, which Lambda requires to be at least the
/// function's (960 s against 900).
pub const LEASE: Duration = Duration::from_secs(60);

/// The wake-up queue on SQS. Cheap to clone: clones share the SDK client and the closed flag.
#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: Client,
    url: String,
    /// Set by `close`: waiting and later receives return [`QueueError::Closed`].
    closed: std::sync::Arc<watch::Sender<bool>>,
    /// How long a receive takes each message for ([`SqsQueue::leased`]); `None`: the queue's
    /// visibility timeout.
    lease: Option<Duration>,
    /// Where wake-ups further away than [`MAX_DELAY`] go ([`SqsQueue::scheduling`]); `None`:
    /// they are sent capped, and re-armed on arrival.
    scheduler: Option<Scheduler>,
}

impl SqsQueue {
    /// The queue at `url`.
    pub fn new(client: Client, url: impl Into<String>) -> Self {
        SqsQueue {
            client,
            url: url.into(),
            closed: std::sync::Arc::new(watch::Sender::new(false)),
            lease: None,
            scheduler: None,
        }
    }

    /// The same queue, whose wake-ups further away than [`MAX_DELAY`] are scheduled once
    /// with `scheduler` instead of re-armed every 15 minutes.
    pub fn scheduling(self, scheduler: Scheduler) -> Self {
        SqsQueue { scheduler: Some(scheduler), ..self }
    }

    /// The same queue, whose receives take each message for `lease` instead of the queue's
    /// visibility timeout, renewed by its receiver while it works (`Consumer::renew`): the
    /// wake-ups of a host that dies come back after at most `lease` ([`LEASE`]).
    pub fn leased(self, lease: Duration) -> Self {
        SqsQueue { lease: Some(lease), ..self }
    }

    /// The queue named `name_or_url` (a URL is taken as it is; a name is looked up).
    pub async fn open(client: Client, name_or_url: &str) -> Result<Self, AwsError> {
        if is_url(name_or_url) {
            return Ok(Self::new(client, name_or_url));
        }
        let out =
            client.get_queue_url().queue_name(name_or_url).send().await.map_err(|err| AwsError::Queue {
                operation: "GetQueueUrl",
                queue: name_or_url.to_owned(),
                message: describe(&err),
            })?;
        let url = out.queue_url.ok_or_else(|| AwsError::Queue {
            operation: "GetQueueUrl",
            queue: name_or_url.to_owned(),
            message: "no URL in the answer".to_owned(),
        })?;
        Ok(Self::new(client, url))
    }

    /// The queue's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Makes each received message (by its receipt handle) invisible for `visibility` from
    /// now, whatever the queue's visibility timeout (`ChangeMessageVisibilityBatch`, ten at a
    /// time). A zero `visibility` makes them visible at once.
    pub async fn hold(&self, receipts: &[String], visibility: Duration) -> Result<(), AwsError> {
        let seconds = i32::try_from(visibility.as_secs()).unwrap_or(i32::MAX);
        let failed = |message: String| AwsError::Queue {
            operation: "ChangeMessageVisibilityBatch",
            queue: self.url.clone(),
            message,
        };
        for chunk in receipts.chunks(10) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, receipt)| {
                    aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(receipt)
                        .visibility_timeout(seconds)
                        .build()
                        .map_err(|e| failed(e.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let out = self
                .client
                .change_message_visibility_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|err| failed(describe(&err)))?;
            if let Some(entry) = out.failed.first() {
                return Err(failed(format!(
                    "{} of {} entries failed, e.g. {}: {}",
                    out.failed.len(),
                    chunk.len(),
                    entry.code,
                    entry.message.as_deref().unwrap_or_default()
                )));
            }
        }
        Ok(())
    }

    /// Creates the standard queue `name` (and its dead-letter queue `<name>-dlq` with a redrive
    /// policy, if asked for), or finds it with the same settings; returns its URL.
    pub async fn create_queue(
        client: &Client,
        name: &str,
        settings: &QueueSettings,
    ) -> Result<String, AwsError> {
        let mut attributes = vec![
            (QueueAttributeName::VisibilityTimeout, settings.visibility_timeout.as_secs().to_string()),
            (QueueAttributeName::MessageRetentionPeriod, settings.retention.as_secs().to_string()),
        ];
        if let Some(max_receive_count) = settings.max_receive_count {
            let dead_letter = format!("{name}-dlq");
            let retention = vec![(
                QueueAttributeName::MessageRetentionPeriod,
                DEAD_LETTER_RETENTION.as_secs().to_string(),
            )];
            let dlq_url = create(client, &dead_letter, retention).await?;
            let arn = queue_arn(client, &dead_letter, &dlq_url).await?;
            let redrive = RedrivePolicy { dead_letter_target_arn: arn, max_receive_count };
            let redrive = serde_json::to_string(&redrive).map_err(|err| AwsError::Queue {
                operation: "CreateQueue",
                queue: name.to_owned(),
                message: format!("cannot serialize the redrive policy: {err}"),
            })?;
            attributes.push((QueueAttributeName::RedrivePolicy, redrive));
        }
        create(client, name, attributes).await
    }

    fn failed(&self, operation: &'static str, message: String) -> QueueError {
        AwsError::Queue { operation, queue: self.url.clone(), message }.into()
    }

    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// One receive request waiting up to `wait_secs`; a close while it waits ends it.
    async fn poll(&self, max: usize, wait_secs: u64) -> Result<Vec<Delivery>, QueueError> {
        let request = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(i32::try_from(max.clamp(1, MAX_BATCH)).unwrap_or(1))
            .wait_time_seconds(i32::try_from(wait_secs.min(MAX_WAIT_SECS)).unwrap_or(0))
            .set_visibility_timeout(self.lease.map(|l| i32::try_from(l.as_secs()).unwrap_or(i32::MAX)))
            .send();
        let mut closed = self.closed.subscribe();
        let out = tokio::select! {
            // A message SQS hands out to a request dropped here stays invisible for the
            // visibility timeout, then comes back: at least once, never lost.
            _ = closed.wait_for(|closed| *closed) => return Err(QueueError::Closed),
            out = request => out.map_err(|err| self.failed("ReceiveMessage", describe(&err)))?,
        };
        let mut deliveries = Vec::new();
        for message in out.messages.unwrap_or_default() {
            let id = message.message_id.as_deref().unwrap_or("?");
            let (Some(body), Some(receipt)) = (message.body.as_deref(), message.receipt_handle.clone())
            else {
                tracing::warn!(queue = %self.url, message_id = id, "a message without body or receipt handle");
                continue;
            };
            match WakeUp::from_body(body) {
                Ok(wake_up) => deliveries.push(Delivery { wake_up, receipt }),
                Err(error) => {
                    tracing::warn!(queue = %self.url, message_id = id, %error, "not a wake-up; left for the dead-letter queue");
                }
            }
        }
        Ok(deliveries)
    }
}

async fn create(
    client: &Client,
    name: &str,
    attributes: Vec<(QueueAttributeName, String)>,
) -> Result<String, AwsError> {
    let failed =
        |message: String| AwsError::Queue { operation: "CreateQueue", queue: name.to_owned(), message };
    let out = client
        .create_queue()
        .queue_name(name)
        .set_attributes(Some(attributes.into_iter().collect()))
        .send()
        .await
        .map_err(|err| failed(describe(&err)))?;
    out.queue_url.ok_or_else(|| failed("no URL in the answer".to_owned()))
}

async fn queue_arn(client: &Client, name: &str, url: &str) -> Result<String, AwsError> {
    let failed = |message: String| AwsError::Queue {
        operation: "GetQueueAttributes",
        queue: name.to_owned(),
        message,
    };
    let out = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|err| failed(describe(&err)))?;
    out.attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
        .ok_or_else(|| failed("no QueueArn in the answer".to_owned()))
}

/// `delay` in whole seconds for `DelaySeconds`: rounded up (never delivered early), at most
/// [`MAX_DELAY`] (the dispatcher re-checks due times on arrival).
pub fn delay_seconds(delay: Duration) -> i32 {
    let secs = delay.as_secs().saturating_add(u64::from(delay.subsec_nanos() > 0));
    i32::try_from(secs.min(MAX_DELAY.as_secs())).unwrap_or(0)
}

#[async_trait]
impl Queue for SqsQueue {
    async fn send(&self, wake_up: WakeUp, delay: Duration) -> Result<(), QueueError> {
        if delay > MAX_DELAY
            && let Some(scheduler) = &self.scheduler
        {
            return scheduler.schedule(&wake_up, delay).await.map_err(QueueError::from);
        }
        let body = wake_up.to_body();
        let delay_seconds = delay_seconds(delay);
        if delay > MAX_DELAY {
            tracing::debug!(session_id = %wake_up.session_id, ?delay, "delay capped at 900 s; re-checked on arrival");
        }
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .delay_seconds(delay_seconds)
            .send()
            .await
            .map_err(|err| {
                let message = format!("for session {}: {}", wake_up.session_id, describe(&err));
                self.failed("SendMessage", message)
            })?;
        Ok(())
    }
}

#[async_trait]
impl Consumer for SqsQueue {
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, QueueError> {
        if self.is_closed() {
            return Err(QueueError::Closed);
        }
        if max == 0 {
            return Ok(Vec::new());
        }
        let deadline = Instant::now() + wait;
        loop {
            // Whole seconds only, rounded down, so a request never outlasts the wait.
            let remaining = deadline.saturating_duration_since(Instant::now());
            let got = self.poll(max, remaining.as_secs()).await?;
            if !got.is_empty() {
                return Ok(got);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Ok(got);
            }
            if remaining < Duration::from_secs(1) {
                // Too short for a long poll: wait it out, then one last look (wait 0).
                let mut closed = self.closed.subscribe();
                tokio::select! {
                    _ = closed.wait_for(|closed| *closed) => return Err(QueueError::Closed),
                    () = tokio::time::sleep(remaining) => {}
                }
            }
        }
    }

    async fn ack(&self, delivery: &Delivery) -> Result<(), QueueError> {
        // Allowed after `close`: a wake-up handled during shutdown is still acknowledged.
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(&delivery.receipt)
            .send()
            .await
            .map_err(|err| {
                let message = format!("for session {}: {}", delivery.wake_up.session_id, describe(&err));
                self.failed("DeleteMessage", message)
            })?;
        Ok(())
    }

    async fn close(&self) {
        self.closed.send_replace(true);
    }

    fn lease(&self) -> Option<Duration> {
        self.lease
    }

    async fn renew(&self, delivery: &Delivery) -> Result<(), QueueError> {
        let Some(lease) = self.lease else { return Ok(()) };
        self.hold(std::slice::from_ref(&delivery.receipt), lease)
            .await
            .map_err(|e| QueueError::Backend(Box::new(e)))
    }
}

/// Whether a queue is named by its URL (else by its name).
pub(crate) fn is_url(name_or_url: &str) -> bool {
    name_or_url.starts_with("https://") || name_or_url.starts_with("http://")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_and_cap() {
        assert_eq!(delay_seconds(Duration::ZERO), 0);
        assert_eq!(delay_seconds(Duration::from_millis(1)), 1);
        assert_eq!(delay_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(delay_seconds(Duration::from_secs(900)), 900);
        assert_eq!(delay_seconds(Duration::from_secs(3600)), 900);
        assert_eq!(delay_seconds(Duration::MAX), 900);
    }
}
