//! The runtime's conformance suite against `DynamoStore` and `SqsQueue` on a moto server
//! (see `support`): every store case on its own fresh table, every queue case on its own
//! fresh queue (a queue case leaves other sessions' deliveries unacknowledged, so cases must
//! not share a queue).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

use turnstone_aws::moto as support;

use std::time::Duration;

use turnstone_aws::QueueSettings;
use turnstone_runtime::conformance::{self, QueueSuite};

/// The store cases, each its own test on its own table.
macro_rules! store_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let store = support::store().await;
                conformance::$case(&store).await;
            }
        )*
    };
}

store_cases!(
    store_round_trip,
    store_create_conflicts,
    store_stale_commit_writes_nothing,
    store_events_after_pages,
    store_list_sessions,
    store_due,
    store_large_session,
    store_long_lived_state,
    store_owner_quota,
    store_dispose,
);

/// `store_used_ids_are_kept_for_good` commits 65 turns in one commit; DynamoDB takes at most
/// 100 items in a transaction, and such a commit needs 258 (two ids and two messages a turn),
/// so the same case runs here with the turns committed 16 at a time (66 items each). A commit
/// of 65 turns is refused whole: `a_commit_beyond_a_transaction_is_refused_whole` in
/// `store.rs` pins that.
#[tokio::test]
async fn store_used_ids_are_kept_for_good() {
    let store = support::store().await;
    conformance::store_used_ids_are_kept_for_good_in_batches(&store, 16).await;
    conformance::store_dispose(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_store_suite_on_one_table() {
    let store = support::store().await;
    conformance::store_round_trip(&store).await;
    conformance::store_create_conflicts(&store).await;
    conformance::store_stale_commit_writes_nothing(&store).await;
    conformance::store_events_after_pages(&store).await;
    conformance::store_list_sessions(&store).await;
    conformance::store_due(&store).await;
    conformance::store_large_session(&store).await;
    conformance::store_used_ids_are_kept_for_good_in_batches(&store, 16).await;
    conformance::store_dispose(&store).await;
}

/// SQS does not coalesce; moto's long poll notices a message that became visible within a
/// second, so the visibility timeout leaves room for that.
// 10 s: moto makes a message visible again only about once a second, and on a loaded machine
// the answer to a receive can reach the test seconds after moto hid the message (a 3 s timeout
// once missed the window for the redelivery, a 5 s one the "invisible while in flight" one).
const QUEUE: QueueSuite = QueueSuite {
    visibility_timeout: Duration::from_secs(10),
    delay: Duration::from_secs(2),
    coalesces: false,
};

fn settings() -> QueueSettings {
    QueueSettings { visibility_timeout: QUEUE.visibility_timeout, ..QueueSettings::default() }
}

macro_rules! queue_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let (queue, ..) = support::queue(&settings()).await;
                conformance::$case(&queue, QUEUE).await;
            }
        )*
    };
}

queue_cases!(
    queue_delay_respected,
    queue_duplicate_sends,
    queue_redelivers_without_ack,
    queue_no_redelivery_after_ack,
);

#[tokio::test]
async fn whole_queue_suite_on_one_queue() {
    let (queue, ..) = support::queue(&settings()).await;
    conformance::queue_suite(&queue, QUEUE).await;
}

/// A store that may remember only 64 KB of sessions lets them go (least recently used first)
/// and reads them again: the cases pass the same, its sessions larger than what it remembers.
#[tokio::test]
async fn a_store_that_remembers_little_conforms_the_same() {
    let store = support::store().await.with_cache_bytes(64 * 1024);
    conformance::store_round_trip(&store).await;
    conformance::store_stale_commit_writes_nothing(&store).await;
    conformance::store_large_session(&store).await;
    conformance::store_dispose(&store).await;
}
