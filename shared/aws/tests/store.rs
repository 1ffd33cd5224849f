//! `DynamoStore` beyond the conformance suite, on a moto server: conflicts and used ids as
//! DynamoDB reports them, incremental message reads, chunked payloads, the transaction's
//! limits, event packs at every offset, the due index across its shards.
//!
//! No test races two writers concurrently: moto does not isolate concurrent transactions (it
//! checks conditions and writes item by item, and a cancelled transaction restores a copy of
//! the whole table taken when it began, which can undo a transaction that succeeded meanwhile).
//! DynamoDB serializes them; the conflict is tested with the writers one after the other.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

use turnstone_aws::moto as support;

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::AttributeValue;
use turnstone_aws::{AwsClients, DynamoStore};
use turnstone_engine::protocol::{ClientInput, ClientMessageInput, DraftMessage};
use turnstone_engine::session::{Command, TurnOrigin, UsedId};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::conformance::{Commits, Driver, T0, all_events, assert_log, assert_stored};
use turnstone_runtime::store::{Commit, Store, StoreError};

/// Every item of a session's partition, by sort key.
async fn items_of(
    store: &DynamoStore,
    clients: &AwsClients,
    session_id: &str,
) -> BTreeMap<String, std::collections::HashMap<String, AttributeValue>> {
    let mut out = BTreeMap::new();
    let mut start = None;
    loop {
        let page = clients
            .dynamodb
            .query()
            .table_name(store.table())
            .key_condition_expression("PK = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(format!("S#{session_id}")))
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        for item in page.items.unwrap_or_default() {
            let sk = item["SK"].as_s().unwrap().clone();
            out.insert(sk, item);
        }
        match page.last_evaluated_key {
            Some(key) if !key.is_empty() => start = Some(key),
            _ => return out,
        }
    }
}

fn submit_turn(turn_id: &str, text: &str) -> Command {
    Command::Submit {
        input: ClientInput::Message(ClientMessageInput {
            agent_id: "agent".into(),
            turn_id: Some(turn_id.into()),
            message: DraftMessage::user(text),
            stream: None,
            client: None,
        }),
        queue: false,
        origin: TurnOrigin::Client,
    }
}

fn text(len: usize) -> String {
    (0..len).map(|i| char::from(b'a' + (i % 26) as u8)).collect()
}

#[tokio::test]
async fn two_writers_at_one_version_one_wins() {
    let store = support::store().await;
    let mut base = Driver::create("race", "agent", Some("owner"), false, T0);
    base.commit_ok(&store).await;
    for round in 0..3 {
        let (mut a, mut b) = (base.clone(), base.clone());
        a.submit(&format!("a{round}"));
        b.submit(&format!("b{round}"));
        a.commit_ok(&store).await;
        match b.commit(&store).await {
            Err(StoreError::Conflict { session_id, expected }) => {
                assert_eq!((session_id.as_str(), expected), ("race", base.version));
            }
            other => panic!(
                "round {round}: the second writer at version {} must conflict, got {other:?}",
                base.version
            ),
        }
        assert_stored(&store, &a).await;
        assert_log(&store, &a, 100).await;
        base = a;
        let call = base.claim_llm();
        base.finish_llm(call, "ok");
        base.commit_ok(&store).await;
    }
}

#[tokio::test]
async fn ids_used_before_are_named_exactly() {
    use turnstone_engine::session::{PAST_TURN_IDS, RECENT_TURNS};
    let (store, clients) = support::store_and_clients().await;
    let mut d = Driver::create("ids", "agent", None, false, T0);
    d.commit_ok(&store).await;
    d.exec(submit_turn("t-shared", "first"));
    let call = d.claim_llm();
    d.finish_llm(call.clone(), "answer");
    d.commit_ok(&store).await;
    // The session forgets t-shared after a few turns; the store keeps it, first with the packs
    // since the last checkpoint, then (from the next checkpoint on) as an item.
    let call_item = format!("C#{}", call.0.as_str());
    for i in 0.. {
        d.turn(&format!("q{i}"), &format!("a{i}"));
        d.commit_ok(&store).await;
        if i == RECENT_TURNS + PAST_TURN_IDS {
            assert!(!d.session.knows_turn(&"t-shared".into()));
            let mut again = d.clone();
            again.exec(submit_turn("t-shared", "too early"));
            match again.commit(&store).await {
                Err(StoreError::IdsUsed { ids, .. }) => assert_eq!(ids, [UsedId::Turn("t-shared".into())]),
                other => panic!("t-shared is among the packs' ids: refused, got {other:?}"),
            }
        }
        let items = items_of(&store, &clients, "ids").await;
        if items.contains_key("T#t-shared") {
            assert!(items.contains_key(&call_item), "{:?}", items.keys());
            break;
        }
        assert!(i < 40, "a checkpoint within 40 commits");
    }
    d.forget_committed();

    // A commit that uses the id again, between checkpoints: the id items are read first.
    let committed = d.clone();
    d.exec(submit_turn("t-shared", "again"));
    match d.commit(&store).await {
        Err(StoreError::IdsUsed { session_id, ids }) => {
            assert_eq!(session_id, "ids");
            assert_eq!(ids, [UsedId::Turn("t-shared".into())], "exactly the ids used before");
        }
        other => panic!("a commit reusing t-shared must be refused with IdsUsed, got {other:?}"),
    }
    assert_stored(&store, &committed).await;

    // Ids used since the last checkpoint are not items yet, and are used all the same.
    let mut d = committed;
    d.exec(submit_turn("t-new", "new"));
    d.commit_ok(&store).await;
    assert!(!items_of(&store, &clients, "ids").await.contains_key("T#t-new"));
    let probe = [
        UsedId::Call(call.0),
        UsedId::Turn("t-new".into()),
        UsedId::Turn("t-shared".into()),
        UsedId::Turn("t-other".into()),
    ];
    assert_eq!(store.used_ids("ids", &probe).await.unwrap(), probe[..3]);
    let cold = DynamoStore::new(clients.dynamodb.clone(), store.table());
    assert_eq!(
        cold.used_ids("ids", &probe).await.unwrap(),
        probe[..3],
        "a store that read the session afresh"
    );
}

#[tokio::test]
async fn most_commits_write_one_pack_and_a_checkpoint_now_and_then() {
    let (store, clients) = support::store_and_clients().await;
    let mut d = Driver::create("packs", "agent", None, false, T0);
    d.commit_ok(&store).await;
    let heads = |items: &BTreeMap<String, std::collections::HashMap<String, AttributeValue>>| {
        items["H"]["version"].as_n().unwrap().parse::<u64>().unwrap()
    };
    assert_eq!(heads(&items_of(&store, &clients, "packs").await), 1, "the creating commit is a checkpoint");
    // A plain turn's three commits (submit, claim, outcome) are packs alone: the head stays.
    d.submit("q");
    d.commit_ok(&store).await;
    assert_eq!(heads(&items_of(&store, &clients, "packs").await), 1, "submit");
    let call = d.claim_llm();
    d.commit_ok(&store).await;
    assert_eq!(heads(&items_of(&store, &clients, "packs").await), 1, "claim");
    d.finish_llm(call, "a");
    d.commit_ok(&store).await;
    let items = items_of(&store, &clients, "packs").await;
    assert_eq!(heads(&items), 1, "outcome");
    assert_eq!(items.keys().filter(|k| k.starts_with("E#")).count(), 4);
    assert!(
        !items.keys().any(|k| k.starts_with("M#") || k.starts_with("T#") || k.starts_with("C#")),
        "{:?}",
        items.keys()
    );
    // After enough commits, a checkpoint: the head moves on, the messages and ids since the last
    // one become items.
    let mut checkpointed = None;
    for i in 0..40 {
        d.turn(&format!("q{i}"), &format!("a{i}"));
        d.commit_ok(&store).await;
        let items = items_of(&store, &clients, "packs").await;
        if heads(&items) > 1 {
            checkpointed = Some(items);
            break;
        }
    }
    let items = checkpointed.expect("a checkpoint within 40 commits");
    assert_eq!(heads(&items), d.version);
    let stored: u64 = items["H"]["messages"].as_n().unwrap().parse().unwrap();
    assert_eq!(stored, d.session.tree().len() as u64);
    let batch = &items[&format!("M#{:020}", stored - 1)];
    assert_eq!(batch["first"].as_n().unwrap(), "0");
    assert_eq!(batch["count"].as_n().unwrap(), &stored.to_string());
    assert!(items.keys().any(|k| k.starts_with("T#")), "the turn ids became items");
    // A store that never saw the session reads it whole: checkpoint, message items, packs after.
    let cold = DynamoStore::new(clients.dynamodb.clone(), store.table());
    let loaded = cold.load("packs").await.unwrap().unwrap();
    assert_eq!((loaded.session, loaded.version), (d.session.clone(), d.version));
}

#[tokio::test]
async fn the_declared_agent_config_is_written_once_and_kept_out_of_the_head() {
    let (store, clients) = support::store_and_clients().await;
    let mut d = Driver::create("declared", "agent", None, false, T0);
    d.commit_ok(&store).await;
    let declared = |items: &BTreeMap<String, std::collections::HashMap<String, AttributeValue>>| {
        items["I"]["body"].as_s().unwrap().clone()
    };
    let first = items_of(&store, &clients, "declared").await;
    assert!(declared(&first).contains("test-model"), "the creating commit writes the config");
    for i in 0..3 {
        d.turn(&format!("q{i}"), &format!("a{i}"));
        d.commit_ok(&store).await;
    }
    let items = items_of(&store, &clients, "declared").await;
    let head = items["H"]["body"].as_s().unwrap();
    assert!(!head.contains("test-model"), "the head leaves the config out: {head}");
    assert_eq!(declared(&items), declared(&first), "written once, never again");
    // Loaded whole: the session has its declared config back.
    assert_stored(&store, &d).await;
    let loaded = store.load("declared").await.unwrap().unwrap();
    assert_eq!(loaded.session.init().unwrap().declared, d.session.init().unwrap().declared);
    assert!(loaded.session.init().unwrap().declared.is_some());
}

#[tokio::test]
async fn load_since_reads_only_the_messages_from_a_position() {
    let (store, clients) = support::store_and_clients().await;
    assert!(store.load_since("since-missing", 0).await.unwrap().is_none());
    let mut d = Driver::create("since", "agent", None, false, T0);
    d.commit_ok(&store).await;
    let (head, nodes) = store.load_since("since", 0).await.unwrap().unwrap();
    assert_eq!((head.version, nodes.len()), (1, 0), "a new session has no messages");
    for i in 0..5 {
        d.turn(&format!("q{i}"), &format!("a{i}"));
        d.commit_ok(&store).await;
    }
    let all: Vec<_> = d.session.tree().nodes().cloned().collect();
    assert_eq!(all.len(), 10);
    // From this store (which remembers the session) and from one that reads it afresh.
    let cold = || DynamoStore::new(clients.dynamodb.clone(), store.table());
    for from in 0..=12 {
        for reader in [store.clone(), cold()] {
            let (head, nodes) = reader.load_since("since", from).await.unwrap().unwrap();
            assert_eq!(head.version, d.version);
            assert_eq!(head.session.tree().len(), 0, "the nodes come apart from the session");
            assert_eq!(nodes, all[(from as usize).min(10)..], "load_since(since, {from})");
        }
    }
}

#[tokio::test]
async fn a_message_over_a_megabyte_round_trips_in_chunks() {
    let (store, clients) = support::store_and_clients().await;
    let mut d = Driver::create("chunked", "agent", Some("owner"), false, T0);
    // Past the engine's default message limit: a host may raise it, and the store must cope.
    d.limits.message_bytes = usize::MAX;
    d.commit_ok(&store).await;
    d.turn("small", "reply");
    d.commit_ok(&store).await;
    let big = format!("{} ✓ {}", text(600 * 1024), text(600 * 1024));
    assert!(big.len() > 1024 * 1024);
    d.turn(&big, "that was long");
    d.commit_ok(&store).await;
    d.turn("after", "still fine");
    d.commit_ok(&store).await;
    assert_stored(&store, &d).await;
    assert_log(&store, &d, 3).await;

    let items = items_of(&store, &clients, "chunked").await;
    let message_chunks = items.keys().filter(|k| k.starts_with("B#M#")).count();
    let event_chunks = items.keys().filter(|k| k.starts_with("B#E#")).count();
    assert_eq!(message_chunks, 4, "1.2 MB in chunks of 350 KB: {:?}", items.keys());
    assert_eq!(event_chunks, 4, "the event pack recording it is chunked too: {:?}", items.keys());
    assert!(items.values().all(|item| item.get("body").is_some()
        || item.get("chunks").is_some()
        || item["SK"].as_s().unwrap().starts_with("T#")
        || item["SK"].as_s().unwrap().starts_with("C#")));

    let (_, nodes) = store.load_since("chunked", 2).await.unwrap().unwrap();
    assert_eq!(nodes[0].message.content_text(), big, "the big message, whole");
    let events = all_events(&store, "chunked", 1).await;
    assert_eq!(events.len(), d.log.len());
}

#[tokio::test]
async fn a_large_head_is_chunked_and_read_at_its_version() {
    let (store, clients) = support::store_and_clients().await;
    let model = turnstone_engine::protocol::AgentConfig::new("test-model");
    let mut init = turnstone_engine::testing::init("agent", Some(model), false);
    init.identity.metadata = Some(BTreeMap::from([("notes".to_owned(), text(800 * 1024))]));
    let mut d = Driver::created("big-head", init, T0);
    d.commit_ok(&store).await;
    assert_stored(&store, &d).await;
    let head = &items_of(&store, &clients, "big-head").await["H"];
    assert!(head.get("body").is_none());
    assert_eq!(head["chunks"].as_n().unwrap(), "3");

    // A checkpoint rewrites the head's chunks in place, tagged with its version.
    let mut items = items_of(&store, &clients, "big-head").await;
    for i in 0..40 {
        d.turn(&format!("q{i}"), &format!("a{i}"));
        d.commit_ok(&store).await;
        items = items_of(&store, &clients, "big-head").await;
        if items["H"]["version"].as_n().unwrap() != "1" {
            break;
        }
    }
    assert_stored(&store, &d).await;
    let version = items["H"]["version"].as_n().unwrap();
    assert_ne!(version, "1", "a checkpoint since the creating one");
    for n in 0..3 {
        let chunk = &items[&format!("B#H#{n:04}")];
        assert_eq!(chunk["version"].as_n().unwrap(), version);
    }
    // A chunk of another version than the head (a commit in between) is read again, and a
    // head whose chunks never match is reported, naming the session.
    clients
        .dynamodb
        .update_item()
        .table_name(store.table())
        .key("PK", AttributeValue::S("S#big-head".into()))
        .key("SK", AttributeValue::S("B#H#0001".into()))
        .update_expression("SET version = :v")
        .expression_attribute_values(":v", AttributeValue::N("999".into()))
        .send()
        .await
        .unwrap();
    let cold = DynamoStore::new(clients.dynamodb.clone(), store.table());
    let err = cold.load("big-head").await.expect_err("chunks of another version");
    assert!(err.to_string().contains("big-head") && err.to_string().contains("kept changing"), "{err}");
}

#[tokio::test]
async fn a_commit_beyond_a_transaction_is_refused_whole() {
    let store = support::store().await;
    let mut d = Driver::create("too-large", "agent", None, false, T0);
    // Past the engine's default message limit: a host may raise it, and the store must cope.
    d.limits.message_bytes = usize::MAX;
    d.commit_ok(&store).await;
    let committed = d.clone();

    // 2.5 MB in the message and again in its event: more than 4 MB in one transaction.
    let mut huge = d.clone();
    huge.turn(&text(2_500_000), "no");
    let err = huge.commit(&store).await.expect_err("more than 4 MB cannot be one transaction");
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.contains("too-large") && shown.contains("does not fit") && shown.contains("bytes"),
        "{shown}"
    );
    assert_stored(&store, &committed).await;

    // 65 turns at once: 258 items, more than the 100 a transaction takes.
    let mut many = d.clone();
    for i in 0..65 {
        many.turn(&format!("q{i}"), &format!("a{i}"));
    }
    let err = many.commit(&store).await.expect_err("more than 100 items cannot be one transaction");
    let shown = err.to_string();
    assert!(shown.contains("too-large") && shown.contains("at most 100"), "{shown}");
    assert_stored(&store, &committed).await;
    assert_log(&store, &committed, 100).await;

    // The same turns in commits that fit.
    for i in 0..65 {
        d.turn(&format!("q{i}"), &format!("a{i}"));
        if i % 20 == 19 {
            d.commit_ok(&store).await;
        }
    }
    d.commit_ok(&store).await;
    assert_stored(&store, &d).await;
    assert_log(&store, &d, 1000).await;
}

#[tokio::test]
async fn events_after_reads_packs_from_any_offset() {
    let store = support::store().await;
    let mut d = Driver::create("packs", "agent", None, false, T0);
    d.commit_ok(&store).await;
    // Packs of different sizes: a whole turn, a submit, a claim, a finish, two turns at once.
    d.turn("q0", "a0");
    d.commit_ok(&store).await;
    d.submit("q1");
    d.commit_ok(&store).await;
    let call = d.claim_llm();
    d.commit_ok(&store).await;
    d.finish_llm(call, "a1");
    d.commit_ok(&store).await;
    d.turn("q2", "a2");
    d.turn("q3", "a3");
    d.commit_ok(&store).await;
    let total = d.log.len() as u64;
    for after in 0..=total + 1 {
        for limit in [1, 2, 3, 7, 1000] {
            let got = store.events_after("packs", after, limit).await.unwrap();
            let expected: Vec<u64> = (after + 1..=total).take(limit).collect();
            let seqs: Vec<u64> = got.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, expected, "events_after({after}, {limit})");
            for e in &got {
                assert_eq!(e.event, d.log[e.seq as usize - 1], "event {}", e.seq);
            }
        }
    }
}

#[tokio::test]
async fn due_work_is_found_across_the_index_shards_soonest_first() {
    let (store, clients) = support::store_and_clients().await;
    let now = Timestamp(1_000_000_000_000);
    let mut drivers = Vec::new();
    // 24 sessions over the 8 shards; wake times not in the order of the ids.
    for i in 0..24u64 {
        let id = format!("due-{i:02}");
        let wake = Timestamp(now.0 - 1_000 + ((i * 7) % 24) as i64 * 10);
        let mut d = Driver::create(&id, "agent", None, false, Timestamp(now.0 - 100_000));
        d.commit_waking(&store, Some(wake)).await.unwrap();
        drivers.push((id, wake, d));
    }
    let mut by_time: Vec<(Timestamp, String)> = drivers.iter().map(|(id, w, _)| (*w, id.clone())).collect();
    by_time.sort();
    let ids = |n: usize| -> Vec<String> { by_time.iter().take(n).map(|(_, id)| id.clone()).collect() };
    for limit in [1, 5, 24, 100] {
        assert_eq!(store.due(now, limit).await.unwrap(), ids(limit.min(24)), "due(now, {limit})");
    }
    let cut = by_time[9].0;
    assert_eq!(store.due(cut, 100).await.unwrap(), ids(10), "due at exactly a wake time");

    // A commit without a wake time: its pack carries no due keys, and the pack before it (the
    // session's entry until now) is out of date, taken out of the index by the next `due`.
    let (id, _, d) = drivers.iter_mut().find(|(id, ..)| *id == by_time[0].1).unwrap();
    d.submit("handled");
    d.commit_waking(&store, None).await.unwrap();
    let due_keys = |item: &std::collections::HashMap<String, AttributeValue>| {
        ["wake_at", "due_shard", "wake_key"].iter().filter(|k| item.contains_key(**k)).count()
    };
    let items = items_of(&store, &clients, id).await;
    let packs: Vec<_> = items.iter().filter(|(k, _)| k.starts_with("E#")).map(|(_, v)| v).collect();
    assert_eq!(
        packs.iter().map(|p| due_keys(p)).collect::<Vec<_>>(),
        [3, 0],
        "the old pack's entry, none on the new"
    );
    assert_eq!(
        store.due(now, 3).await.unwrap(),
        by_time[1..4].iter().map(|(_, id)| id.clone()).collect::<Vec<_>>()
    );
    let items = items_of(&store, &clients, id).await;
    assert!(items.iter().filter(|(k, _)| k.starts_with("E#")).all(|(_, p)| due_keys(p) == 0), "taken out");

    // A wake time a queued wake-up covers is left out of the index (the queue holds it).
    let (id, _, d) = drivers.iter_mut().find(|(id, ..)| *id == by_time[1].1).unwrap();
    d.submit("covered");
    let commit = Commit {
        session: &d.session,
        events: d.uncommitted(),
        wake_at: Some(now),
        wake_queued: true,
        sessions_per_owner: None,
    };
    let version = store.commit(id, d.version, commit).await.unwrap();
    d.committed(version);
    assert_eq!(
        store.due(now, 2).await.unwrap(),
        by_time[2..4].iter().map(|(_, id)| id.clone()).collect::<Vec<_>>()
    );
    let items = items_of(&store, &clients, id).await;
    assert!(items.iter().filter(|(k, _)| k.starts_with("E#")).all(|(_, p)| due_keys(p) == 0));
}

#[tokio::test]
async fn creating_the_table_again_changes_nothing() {
    let store = support::store().await;
    let mut d = Driver::create("kept", "agent", None, false, T0);
    d.commit_ok(&store).await;
    store.create_table().await.unwrap();
    assert_stored(&store, &d).await;
}

#[tokio::test]
async fn a_missing_table_is_a_named_backend_error() {
    let clients = support::clients().await;
    let store = DynamoStore::new(clients.dynamodb, "turnstone-no-such-table");
    let err = store.load("some-session").await.expect_err("no table");
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    let shown = err.to_string();
    assert!(shown.contains("some-session") && shown.contains("turnstone-no-such-table"), "{shown}");
    let mut d = Driver::create("some-session", "agent", None, false, T0);
    let err = d.commit(&store).await.expect_err("no table");
    assert!(err.is_retryable() && err.to_string().contains("TransactWriteItems"), "{err}");
}

/// `infra/template.yaml`'s `SessionsTable` declares the key schema and indexes that
/// `create_table` makes (compared word by word, comments left out).
#[tokio::test]
async fn the_template_declares_the_table_create_table_makes() {
    use aws_sdk_dynamodb::types::{KeySchemaElement, KeyType};
    let (store, clients) = support::store_and_clients().await;
    let described = clients.dynamodb.describe_table().table_name(store.table()).send().await.unwrap();
    let table = described.table().unwrap();

    let template =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra/template.yaml")).unwrap();
    let start = template.find("  SessionsTable:\n").expect("SessionsTable in the template");
    let end = template[start..].find("\n\n").map_or(template.len(), |e| start + e);
    let words: Vec<&str> = template[start..end]
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .flat_map(str::split_whitespace)
        .collect();
    let declared = words.join(" ");
    let keys = |schema: &[KeySchemaElement]| -> String {
        schema
            .iter()
            .map(|k| {
                let kind = if *k.key_type() == KeyType::Hash { "HASH" } else { "RANGE" };
                format!("- AttributeName: {} KeyType: {kind}", k.attribute_name())
            })
            .collect::<Vec<_>>()
            .join(" ")
    };

    assert!(declared.contains("BillingMode: PAY_PER_REQUEST"), "{declared}");
    assert!(declared.contains(&format!("KeySchema: {} GlobalSecondaryIndexes:", keys(table.key_schema()))));
    let definitions = table.attribute_definitions();
    for d in definitions {
        let expected =
            format!("- AttributeName: {} AttributeType: {}", d.attribute_name(), d.attribute_type().as_str());
        assert!(declared.contains(&expected), "the template lacks {expected}");
    }
    assert_eq!(words.iter().filter(|w| **w == "AttributeType:").count(), definitions.len());
    let indexes = table.global_secondary_indexes();
    assert_eq!(words.iter().filter(|w| **w == "IndexName:").count(), indexes.len());
    for index in indexes {
        let projection = index.projection().unwrap();
        let mut expected = format!(
            "- IndexName: {} KeySchema: {} Projection: ProjectionType: {}",
            index.index_name().unwrap(),
            keys(index.key_schema()),
            projection.projection_type().unwrap().as_str()
        );
        if !projection.non_key_attributes().is_empty() {
            expected.push_str(" NonKeyAttributes:");
            for attribute in projection.non_key_attributes() {
                expected.push_str(&format!(" - {attribute}"));
            }
        }
        assert!(declared.contains(&expected), "the template lacks {expected}\nin {declared}");
    }
}
