//! `SqsQueue` beyond the conformance suite, on a moto server: delays (and their cap),
//! redelivery after a lost acknowledgement, bodies that are not wake-ups (skipped by the
//! consumer, reported by message id for a Lambda batch, moved to the dead-letter queue),
//! batch sizes, and closing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

use turnstone_aws::moto as support;

use std::time::Duration;

use tokio::time::Instant;
use turnstone_aws::QueueSettings;
use turnstone_runtime::queue::{Consumer, Queue, QueueError, WakeUp};

fn wake(session_id: &str, reason: &str) -> WakeUp {
    WakeUp::new(session_id, reason)
}

fn settings(visibility_secs: u64) -> QueueSettings {
    QueueSettings { visibility_timeout: Duration::from_secs(visibility_secs), ..QueueSettings::default() }
}

#[tokio::test]
async fn a_delayed_wake_up_arrives_after_its_delay_and_long_delays_are_capped() {
    let (queue, ..) = support::queue(&settings(30)).await;
    // Beyond SQS's 900 s: sent capped, so it is simply not there yet.
    queue.send(wake("later", "timer"), Duration::from_secs(3600)).await.unwrap();
    let sent = Instant::now();
    queue.send(wake("soon", "timer"), Duration::from_millis(1500)).await.unwrap();
    assert!(queue.receive(10, Duration::from_millis(900)).await.unwrap().is_empty(), "not before its delay");
    let mut got = Vec::new();
    while got.is_empty() && sent.elapsed() < Duration::from_secs(8) {
        got = queue.receive(10, Duration::from_secs(2)).await.unwrap();
    }
    // 1.5 s rounds up to 2 s: never early.
    assert!(sent.elapsed() >= Duration::from_secs(2), "arrived after {:?}", sent.elapsed());
    assert_eq!(got.iter().map(|d| d.wake_up.clone()).collect::<Vec<_>>(), [wake("soon", "timer")]);
    queue.ack(&got[0]).await.unwrap();
    assert!(queue.receive(10, Duration::from_secs(1)).await.unwrap().is_empty(), "the capped one waits");
}

#[tokio::test]
async fn a_lost_acknowledgement_means_redelivery_after_the_visibility_timeout() {
    let (queue, ..) = support::queue(&settings(2)).await;
    queue.send(wake("s", "input"), Duration::ZERO).await.unwrap();
    let first = queue.receive(10, Duration::from_secs(2)).await.unwrap();
    assert_eq!(first.len(), 1);
    let received = Instant::now();
    // The handler dies before acknowledging: nothing until the timeout, then the same wake-up.
    assert!(queue.receive(10, Duration::from_secs(1)).await.unwrap().is_empty(), "invisible while in flight");
    let mut again = Vec::new();
    while again.is_empty() && received.elapsed() < Duration::from_secs(8) {
        again = queue.receive(10, Duration::from_secs(2)).await.unwrap();
    }
    assert_eq!(again.len(), 1, "delivered again");
    assert_eq!(again[0].wake_up, first[0].wake_up);
    assert_ne!(again[0].receipt, first[0].receipt, "a new receipt handle per receive");
    queue.ack(&again[0]).await.unwrap();
    assert!(queue.receive(10, Duration::from_secs(4)).await.unwrap().is_empty(), "acknowledged: gone");
}

#[tokio::test]
async fn the_consumer_skips_bodies_that_are_not_wake_ups_and_they_go_to_the_dead_letter_queue() {
    let settings = QueueSettings { max_receive_count: Some(1), ..settings(1) };
    let (queue, clients, name) = support::queue(&settings).await;
    for body in ["not json", r#"{"session_id":"","reason":"input"}"#] {
        clients.sqs.send_message().queue_url(queue.url()).message_body(body).send().await.unwrap();
    }
    queue.send(wake("good", "input"), Duration::ZERO).await.unwrap();
    let delivered = queue.receive(10, Duration::from_secs(2)).await.unwrap();
    assert_eq!(delivered.iter().map(|d| d.wake_up.clone()).collect::<Vec<_>>(), [wake("good", "input")]);
    queue.ack(&delivered[0]).await.unwrap();
    // Received once, not acknowledged: on the next receive after the visibility timeout the
    // redrive policy moves them to the dead-letter queue.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(queue.receive(10, Duration::from_secs(2)).await.unwrap().is_empty());
    let dlq = clients.sqs.get_queue_url().queue_name(format!("{name}-dlq")).send().await.unwrap();
    let dead = clients
        .sqs
        .receive_message()
        .queue_url(dlq.queue_url().unwrap())
        .max_number_of_messages(10)
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    let mut bodies: Vec<&str> = dead.iter().map(|m| m.body().unwrap()).collect();
    bodies.sort_unstable();
    assert_eq!(bodies, ["not json", r#"{"session_id":"","reason":"input"}"#]);
}

#[tokio::test]
async fn a_receive_returns_at_most_max_and_at_most_ten() {
    let (queue, ..) = support::queue(&settings(30)).await;
    for i in 0..15 {
        queue.send(wake(&format!("s{i}"), "input"), Duration::ZERO).await.unwrap();
    }
    let three = queue.receive(3, Duration::from_secs(2)).await.unwrap();
    assert!(!three.is_empty() && three.len() <= 3, "{three:?}");
    let rest = queue.receive(100, Duration::from_secs(2)).await.unwrap();
    assert!(!rest.is_empty() && rest.len() <= 10, "{}", rest.len());
    assert!(queue.receive(0, Duration::from_secs(5)).await.unwrap().is_empty(), "max 0 asks for nothing");
}

#[tokio::test]
async fn a_short_wait_is_kept() {
    let (queue, ..) = support::queue(&settings(30)).await;
    let start = Instant::now();
    assert!(queue.receive(10, Duration::from_millis(300)).await.unwrap().is_empty());
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(2), "took {took:?}");
}

#[tokio::test]
async fn closing_ends_a_waiting_receive_and_later_ones() {
    let (queue, ..) = support::queue(&settings(30)).await;
    queue.send(wake("handled", "input"), Duration::ZERO).await.unwrap();
    let handled = queue.receive(10, Duration::from_secs(2)).await.unwrap();
    assert_eq!(handled.len(), 1);
    let waiting = {
        let queue = queue.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            (queue.receive(10, Duration::from_secs(20)).await, start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    queue.close().await;
    let (result, took) = waiting.await.unwrap();
    assert!(matches!(result, Err(QueueError::Closed)), "{result:?}");
    assert!(took < Duration::from_secs(5), "the waiting receive ended at the close, after {took:?}");
    assert!(matches!(queue.receive(10, Duration::from_secs(1)).await, Err(QueueError::Closed)));
    // A wake-up handled during shutdown is still acknowledged.
    queue.ack(&handled[0]).await.unwrap();
}

#[tokio::test]
async fn the_config_connects_to_the_table_and_the_queue_by_name() {
    let (queue, clients, name) = support::queue(&settings(30)).await;
    let config = support::config("some-table", &name);
    let (store, by_name) = config.connect_with(&clients).await.unwrap();
    assert_eq!((store.table(), by_name.url()), ("some-table", queue.url()));
    let by_url = support::config("some-table", queue.url()).connect_with(&clients).await.unwrap().1;
    assert_eq!(by_url.url(), queue.url());
    let err = support::config("t", "turnstone-no-such-queue").connect_with(&clients).await.unwrap_err();
    assert!(
        err.to_string().contains("GetQueueUrl") && err.to_string().contains("turnstone-no-such-queue"),
        "{err}"
    );
}

/// With a scheduler, a wake-up beyond SQS's 900 s is one EventBridge Scheduler schedule: at
/// its due second, in the group, its target the queue with the scheduler role and the wake-up
/// as its input, deleted once it fired; asked for twice, it is still one. A short delay stays
/// an SQS message.
#[tokio::test]
async fn a_wake_up_beyond_sqs_delays_is_scheduled_once() {
    use turnstone_aws::Scheduler;
    use turnstone_aws::schedule::{at_expression, schedule_name};
    use turnstone_runtime::clock::{Clock, SystemClock};

    let (queue, _, name) = support::queue(&settings(30)).await;
    let sdk = support::config("unused", "unused")
        .loader()
        .credentials_provider(aws_sdk_scheduler::config::Credentials::new("test", "test", None, None, "moto"))
        .load()
        .await;
    let client = aws_sdk_scheduler::Client::new(&sdk);
    let group = support::unique("wakeups");
    client.create_schedule_group().name(&group).send().await.unwrap();
    let role = "arn:aws:iam::123456789012:role/turnstone-scheduler";
    let queue_arn = format!("arn:aws:sqs:us-east-1:123456789012:{name}");
    let queue = queue.scheduling(Scheduler::new(client.clone(), &group, role, &queue_arn));

    let day = Duration::from_secs(24 * 3600);
    let before = SystemClock.now();
    let waiting = WakeUp { seq: Some(7), ..wake("s-waiting", "commit") };
    queue.send(waiting.clone(), day).await.unwrap();
    queue.send(waiting.clone(), day).await.unwrap();
    queue.send(wake("s-soon", "timer"), Duration::from_secs(1)).await.unwrap();

    let listed = client.list_schedules().group_name(&group).send().await.unwrap();
    let names: Vec<&str> = listed.schedules().iter().filter_map(|s| s.name()).collect();
    assert_eq!(names.len(), 1, "one schedule for one wake-up: {names:?}");
    let schedule = client.get_schedule().group_name(&group).name(names[0]).send().await.unwrap();
    // Sent within this second or the next: its name and expression are of that second.
    let due = |after: u64| before.plus_ms(24 * 3600 * 1000 + after);
    let seconds = [0, 1000, 2000];
    assert!(seconds.iter().any(|&s| names[0] == schedule_name("s-waiting", due(s))), "{}", names[0]);
    let expression = schedule.schedule_expression().unwrap_or_default();
    assert!(seconds.iter().any(|&s| expression == at_expression(due(s))), "{expression}");
    assert!(expression.starts_with("at(") && !expression.contains('Z'), "{expression}");
    let target = schedule.target().unwrap();
    assert_eq!((target.arn(), target.role_arn()), (queue_arn.as_str(), role));
    assert_eq!(WakeUp::from_body(target.input().unwrap_or_default()), Ok(waiting));
    assert_eq!(schedule.action_after_completion().map(|a| a.as_str()), Some("DELETE"));
    assert_eq!(schedule.flexible_time_window().map(|w| w.mode().as_str()), Some("OFF"));

    // The short one is on the queue, not scheduled.
    let mut got = Vec::new();
    let sent = Instant::now();
    while got.is_empty() && sent.elapsed() < Duration::from_secs(8) {
        got = queue.receive(10, Duration::from_secs(2)).await.unwrap();
    }
    assert_eq!(got.iter().map(|d| d.wake_up.session_id.as_str()).collect::<Vec<_>>(), ["s-soon"]);
}
