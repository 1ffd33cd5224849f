//! `MemoryQueue` beyond the shared suite: exact timing under paused time, coalescing bounds,
//! holding a session's wake-up while it is in flight, stale receipts, and closing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use turnstone_embedded::MemoryQueue;
use turnstone_runtime::queue::{Consumer, Queue, QueueError, WakeUp};

const VT: Duration = Duration::from_secs(30);

fn wake(session_id: &str, reason: &str) -> WakeUp {
    WakeUp::new(session_id, reason)
}

fn ids(deliveries: &[turnstone_runtime::queue::Delivery]) -> Vec<&str> {
    deliveries.iter().map(|d| d.wake_up.session_id.as_str()).collect()
}

#[tokio::test(start_paused = true)]
async fn receive_returns_exactly_when_the_earliest_wake_up_is_due() {
    let queue = MemoryQueue::new(VT);
    queue.send(wake("late", "timer"), Duration::from_secs(9)).await.unwrap();
    queue.send(wake("soon", "timer"), Duration::from_secs(5)).await.unwrap();
    let start = Instant::now();
    let got = queue.receive(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(ids(&got), ["soon"]);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    let got = queue.receive(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(ids(&got), ["late"]);
    assert_eq!(start.elapsed(), Duration::from_secs(9));
}

#[tokio::test(start_paused = true)]
async fn receive_times_out_empty_after_its_wait() {
    let queue = MemoryQueue::new(VT);
    queue.send(wake("s", "timer"), Duration::from_secs(100)).await.unwrap();
    let start = Instant::now();
    assert!(queue.receive(10, Duration::from_secs(3)).await.unwrap().is_empty());
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    assert!(queue.receive(10, Duration::ZERO).await.unwrap().is_empty());
    assert!(queue.receive(0, Duration::from_secs(1000)).await.unwrap().is_empty(), "max 0 returns at once");
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn a_send_wakes_a_waiting_receiver() {
    let queue = Arc::new(MemoryQueue::new(VT));
    let receiver = {
        let queue = Arc::clone(&queue);
        tokio::spawn(async move {
            let start = Instant::now();
            let got = queue.receive(10, Duration::from_secs(600)).await.unwrap();
            (got, start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    queue.send(wake("s", "input"), Duration::ZERO).await.unwrap();
    let (got, waited) = receiver.await.unwrap();
    assert_eq!(ids(&got), ["s"]);
    assert_eq!(waited, Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn receive_takes_at_most_max_earliest_first() {
    let queue = MemoryQueue::new(VT);
    for (i, id) in ["c", "a", "d", "b"].iter().enumerate() {
        queue.send(wake(id, "input"), Duration::from_millis(10 * i as u64)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = queue.receive(2, Duration::ZERO).await.unwrap();
    assert_eq!(ids(&got), ["c", "a"]);
    let got = queue.receive(10, Duration::ZERO).await.unwrap();
    assert_eq!(ids(&got), ["d", "b"]);
}

#[tokio::test(start_paused = true)]
async fn the_queue_holds_one_entry_per_session_however_often_it_is_sent() {
    let queue = MemoryQueue::new(VT);
    for round in 0..1000_u64 {
        let id = format!("s{}", round % 10);
        queue.send(wake(&id, "timer"), Duration::from_millis(round)).await.unwrap();
    }
    assert_eq!(queue.sessions(), 10);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = queue.receive(100, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 10, "one delivery per session");
    for d in &got {
        queue.ack(d).await.unwrap();
    }
    assert_eq!(queue.sessions(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_sent_while_in_flight_waits_for_the_ack_then_is_delivered() {
    let queue = MemoryQueue::new(VT);
    queue.send(wake("s", "input"), Duration::ZERO).await.unwrap();
    let first = queue.receive(10, Duration::ZERO).await.unwrap();
    assert_eq!(ids(&first), ["s"]);
    // News arrives while the session is being handled.
    queue.send(wake("s", "child"), Duration::ZERO).await.unwrap();
    assert!(queue.receive(10, Duration::from_secs(5)).await.unwrap().is_empty(), "held while in flight");
    let start = Instant::now();
    queue.ack(&first[0]).await.unwrap();
    let second = queue.receive(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "delivered as soon as the first is acknowledged");
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].wake_up.reason, "child");
    assert_ne!(second[0].receipt, first[0].receipt);
    queue.ack(&second[0]).await.unwrap();
    assert_eq!(queue.sessions(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_delivery_absorbs_a_wake_up_already_due() {
    let queue = MemoryQueue::new(VT);
    queue.send(wake("s", "input"), Duration::ZERO).await.unwrap();
    let first = queue.receive(10, Duration::ZERO).await.unwrap();
    queue.send(wake("s", "timer"), Duration::from_secs(1)).await.unwrap();
    // Never acknowledged: after the visibility timeout, one redelivery covers both.
    let again = queue.receive(10, VT * 2).await.unwrap();
    assert_eq!(ids(&again), ["s"]);
    assert_eq!(again[0].wake_up, first[0].wake_up);
    queue.ack(&again[0]).await.unwrap();
    assert!(queue.receive(10, VT * 2).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_delivery_keeps_a_later_timer() {
    let queue = MemoryQueue::new(VT);
    queue.send(wake("s", "input"), Duration::ZERO).await.unwrap();
    let first = queue.receive(10, Duration::ZERO).await.unwrap();
    queue.send(wake("s", "timer"), VT * 3).await.unwrap();
    let start = Instant::now();
    let again = queue.receive(10, VT * 2).await.unwrap();
    assert_eq!(start.elapsed(), VT, "redelivered at the visibility timeout");
    assert_eq!(again[0].wake_up, first[0].wake_up);
    queue.ack(&again[0]).await.unwrap();
    let timer = queue.receive(10, VT * 5).await.unwrap();
    assert_eq!(start.elapsed(), VT * 3, "the later timer still fires");
    assert_eq!(timer[0].wake_up.reason, "timer");
}

#[tokio::test(start_paused = true)]
async fn acking_a_stale_receipt_changes_nothing() {
    let queue = MemoryQueue::new(VT);
    queue.send(wake("s", "input"), Duration::ZERO).await.unwrap();
    let first = queue.receive(10, Duration::ZERO).await.unwrap().remove(0);
    let second = queue.receive(10, VT * 2).await.unwrap().remove(0);
    assert_ne!(first.receipt, second.receipt);
    queue.ack(&first).await.unwrap(); // stale: the redelivery is still in flight
    let third = queue.receive(10, VT * 2).await.unwrap();
    assert_eq!(ids(&third), ["s"], "the stale ack did not acknowledge the redelivery");
    queue.ack(&third[0]).await.unwrap();
    queue.ack(&third[0]).await.unwrap(); // twice: no-op
    queue.ack(&second).await.unwrap();
    assert_eq!(queue.sessions(), 0);
    assert!(queue.receive(10, VT * 2).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn close_wakes_waiting_receivers_with_closed() {
    let queue = Arc::new(MemoryQueue::default());
    assert_eq!(queue.visibility_timeout(), Duration::from_secs(30));
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move { queue.receive(10, Duration::from_secs(3600)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = Instant::now();
    queue.close();
    for waiter in waiters {
        assert!(matches!(waiter.await.unwrap(), Err(QueueError::Closed)));
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(queue.is_closed());
    assert!(matches!(queue.send(wake("s", "input"), Duration::ZERO).await, Err(QueueError::Closed)));
    assert!(matches!(queue.receive(1, Duration::ZERO).await, Err(QueueError::Closed)));
    assert!(matches!(queue.receive(0, Duration::ZERO).await, Err(QueueError::Closed)));
}

#[tokio::test(start_paused = true)]
async fn huge_delays_are_capped_not_overflowed() {
    let queue = MemoryQueue::new(VT);
    queue.send(wake("s", "timer"), Duration::MAX).await.unwrap();
    assert!(queue.receive(10, Duration::from_secs(3600)).await.unwrap().is_empty());
    assert!(queue.receive(10, Duration::MAX).await.unwrap().len() == 1, "delivered at the cap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_receivers_never_share_a_delivery() {
    let queue = Arc::new(MemoryQueue::new(VT));
    for i in 0..500 {
        queue.send(wake(&format!("s{i}"), "input"), Duration::ZERO).await.unwrap();
    }
    let receivers: Vec<_> = (0..4)
        .map(|_| {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let batch = queue.receive(7, Duration::from_millis(50)).await.unwrap();
                    if batch.is_empty() {
                        return got;
                    }
                    for d in batch {
                        queue.ack(&d).await.unwrap();
                        got.push(d.wake_up.session_id);
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for r in receivers {
        all.extend(r.await.unwrap());
    }
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 500);
    assert_eq!(queue.sessions(), 0);
}

#[tokio::test(start_paused = true)]
async fn closing_through_the_port_closes_the_queue() {
    let queue: Arc<dyn Consumer> = Arc::new(MemoryQueue::new(VT));
    let waiter = {
        let queue = Arc::clone(&queue);
        tokio::spawn(async move { queue.receive(1, Duration::from_secs(3600)).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    queue.close().await;
    assert!(matches!(waiter.await.unwrap(), Err(QueueError::Closed)));
}

#[tokio::test(start_paused = true)]
async fn coalesced_wake_ups_wait_for_the_latest_commit_they_announce() {
    let queue = MemoryQueue::new(VT);
    let announcing = |seq: Option<u64>| WakeUp { seq, ..wake("s", "commit") };
    // Kept: the earlier wake-up; it waits for the later commit either announces.
    queue.send(announcing(Some(5)), Duration::from_secs(1)).await.unwrap();
    queue.send(announcing(Some(9)), Duration::from_secs(3)).await.unwrap();
    queue.send(announcing(None), Duration::from_secs(2)).await.unwrap();
    // Replaced by a sooner one, which takes the commit over.
    queue.send(announcing(Some(7)), Duration::ZERO).await.unwrap();
    let got = queue.receive(10, Duration::from_secs(10)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].wake_up.seq, Some(9));
    // A redelivery after the timeout takes in a pending wake-up that is due by then.
    queue.send(announcing(Some(12)), Duration::from_secs(1)).await.unwrap();
    tokio::time::sleep(VT).await;
    let again = queue.receive(10, Duration::ZERO).await.unwrap();
    assert_eq!((again.len(), again[0].wake_up.seq), (1, Some(12)));
}
