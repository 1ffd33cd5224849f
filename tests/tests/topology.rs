//! The template's functions under the template's IAM (issue 24): each function built as its
//! `main.rs` builds it, signing as its own principal, whose statements are read from
//! `infra/template.yaml`; every AWS call authorized as IAM would (`turnstone_tests::topology`).
//! The same template with one statement taken out shows what that statement is for: the
//! operation that needs it is refused, and the user sees the failure it causes.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use ahp::{Client, ClientConfig, SubscriptionEvent};
use ahp_types::commands::SubscribeResult;
use ahp_types::state::{ChatState, SnapshotState};
use ahp_ws::WebSocketTransport;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use turnstone_engine::protocol::Trigger;
use turnstone_engine::session::TurnStatus;
use turnstone_tests::ledger::{Ledger, Rng, assert_survived, calc_turn, ledger_worker, scripted_config};
use turnstone_tests::topology::gate::Call;
use turnstone_tests::topology::template::Template;
use turnstone_tests::topology::{Deployed, Encryption, StartError};
use turnstone_tests::{ApiClient, FakeAnswer, FakeWorker, tool_answer};

const CONFIG: &str = r#"
[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
llm = "s"

[[agent.demo.tools]]
name = "confirm"
description = "Asks the user."
handler = "client"
input = { type = "object" }
"#;

fn template() -> Template {
    Template::load().unwrap()
}

async fn deploy(template: &Template) -> Deployed {
    Deployed::start(CONFIG, |_| None, template).await.unwrap_or_else(|e| panic!("{e}"))
}

/// A client of the stack, as its outputs name it: `ApiUrl`, and `StreamUrl` for event streams.
fn client(deployed: &Deployed) -> ApiClient {
    ApiClient::new(deployed.url()).with_streams_at(deployed.stream_url())
}

/// One turn of the scripted demo agent on `session`, to its end.
async fn one_turn(api: &ApiClient, session: &str) {
    let turn = api.submit_ok(session, &json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "hello"}})).await;
    let ended = api.wait_turn(session, &turn).await;
    assert_eq!(ended.status, TurnStatus::Completed, "{ended:?}");
}

/// Stops the stack, which must stop within 10 s and cleanly.
async fn stop(deployed: &mut Deployed) {
    let stopped = tokio::time::timeout(Duration::from_secs(10), deployed.stop().unwrap()).await;
    stopped.expect("the stack stops within 10 s").unwrap().unwrap();
}

/// The operations `function` made, as `service:Operation`.
fn operations(calls: &[Call], function: &str) -> BTreeSet<String> {
    calls.iter().filter(|c| c.function == function).map(|c| c.operation.clone()).collect()
}

/// Waits until `done` holds of the stack's calls.
async fn until(deployed: &Deployed, what: &str, done: impl Fn(&[Call]) -> bool) -> Vec<Call> {
    let started = tokio::time::Instant::now();
    loop {
        let calls = deployed.calls();
        if done(&calls) {
            return calls;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{what} never happened; calls: {calls:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_function_runs_under_its_own_role_and_iam_allows_what_it_calls() {
    let mut deployed = deploy(&template()).await;
    let api = client(&deployed);
    one_turn(&api, "s-iam").await;
    // The stream function serves the event log.
    let mut stream = api.stream("s-iam", None).await;
    stream.until(Duration::from_secs(10), |f| f.event == "turn.ended").await;
    // An open stream would hold the graceful stop below.
    drop(stream);
    // Disposing purges the session (BatchWriteItem).
    let (status, body) = api.delete("/v1/sessions/s-iam").await;
    assert!(status == 200 || status == 202 || status == 204, "{status} {body}");
    let (status, _) = api.get("/v1/sessions/s-iam").await;
    assert_eq!(status, 404);
    let calls =
        until(&deployed, "a sweep", |calls| operations(calls, "SweepFunction").contains("dynamodb:Query"))
            .await;

    let refused: Vec<_> = calls.iter().filter_map(|c| c.refused.clone()).collect();
    assert!(refused.is_empty(), "IAM refused: {refused:#?}");
    for function in ["ApiFunction", "StreamFunction", "DispatchFunction", "SweepFunction"] {
        let made = operations(&calls, function);
        // Every function starts from the configuration parameter and the secret.
        for start in ["ssm:GetParameter", "secretsmanager:GetSecretValue"] {
            assert!(made.contains(start), "{function} made no {start}: {made:?}");
        }
    }
    let api_made = operations(&calls, "ApiFunction");
    for needed in ["dynamodb:TransactWriteItems", "dynamodb:BatchWriteItem", "sqs:SendMessage"] {
        assert!(api_made.contains(needed), "the api function made no {needed}: {api_made:?}");
    }
    let dispatch_made = operations(&calls, "DispatchFunction");
    for needed in ["sqs:ReceiveMessage", "sqs:DeleteMessageBatch", "dynamodb:PutItem"] {
        assert!(dispatch_made.contains(needed), "the dispatch function made no {needed}: {dispatch_made:?}");
    }
    // The stream function only reads, and IAM was asked only for reads on its behalf.
    let stream_actions: BTreeSet<_> = calls
        .iter()
        .filter(|c| c.function == "StreamFunction")
        .flat_map(|c| c.requests.iter().map(|r| r.action.clone()))
        .collect();
    let reads = [
        "dynamodb:GetItem",
        "dynamodb:BatchGetItem",
        "dynamodb:Query",
        "ssm:GetParameter",
        "secretsmanager:GetSecretValue",
    ];
    assert!(stream_actions.iter().all(|a| reads.contains(&a.as_str())), "{stream_actions:?}");
    // A transaction is authorized item by item: IAM was asked for PutItem and friends, never
    // for the wire operation's name.
    let transact = calls.iter().find(|c| c.operation == "dynamodb:TransactWriteItems").unwrap();
    assert!(transact.requests.iter().all(|r| r.action != "dynamodb:TransactWriteItems"), "{transact:?}");
    stop(&mut deployed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_batch_write_the_purge_of_a_disposed_session_is_refused() {
    let template =
        template().without_action("ApiFunction", "SessionsReadWrite", "dynamodb:BatchWriteItem").unwrap();
    let deployed = deploy(&template).await;
    let api = client(&deployed);
    one_turn(&api, "s-purge").await;
    let (status, body) = api.delete("/v1/sessions/s-purge").await;
    assert!(status >= 500, "the purge cannot succeed without BatchWriteItem: {status} {body}");
    let refused = deployed.refused();
    let purge = refused
        .iter()
        .find(|c| c.operation == "dynamodb:BatchWriteItem")
        .unwrap_or_else(|| panic!("{refused:#?}"));
    assert_eq!(purge.function, "ApiFunction");
    let message = purge.refused.as_deref().unwrap();
    assert!(
        message.contains("is not authorized to perform: dynamodb:BatchWriteItem on resource: arn:aws:dynamodb:us-east-1:123456789012:table/turnstone-"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_put_item_a_dispatch_run_cannot_commit_its_step() {
    let template =
        template().without_action("DispatchFunction", "SessionsReadWrite", "dynamodb:PutItem").unwrap();
    let deployed = deploy(&template).await;
    let api = client(&deployed);
    // The api function commits the input; the dispatch function's run cannot commit its step.
    let turn = api.submit_ok("s-put", &json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "hello"}})).await;
    let calls = until(&deployed, "a refused dispatch commit", |calls| {
        calls.iter().any(|c| c.function == "DispatchFunction" && c.refused.is_some())
    })
    .await;
    let refused = calls.iter().find(|c| c.function == "DispatchFunction" && c.refused.is_some()).unwrap();
    assert!(
        refused.refused.as_deref().unwrap().contains("perform: dynamodb:PutItem on resource"),
        "{refused:?}"
    );
    let (_, turn) = api.get(&format!("/v1/sessions/s-put/turns/{turn}")).await;
    assert_eq!(turn["status"], "active", "{turn}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_cannot_start_without_reading_the_configuration_and_the_secrets() {
    for (policy, refused) in
        [("ConfigReadPolicy", "ssm:GetParameter"), ("SecretsReadPolicy", "secretsmanager:GetSecretValue")]
    {
        let template = template().without_policy("SweepFunction", policy).unwrap();
        let error = match Deployed::start(CONFIG, |_| None, &template).await {
            Err(StartError::Function { function, error }) => {
                assert_eq!(function, "SweepFunction", "{error}");
                error.to_string()
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("the sweep started without {policy}"),
        };
        assert!(error.contains("AccessDenied") && error.contains(refused), "without {policy}: {error}");
    }
}

#[test]
fn a_statement_named_wrongly_is_an_error_not_a_silent_copy() {
    let err = template().without_action("ApiFunction", "NoSuchSid", "dynamodb:GetItem").unwrap_err();
    assert!(err.to_string().contains("no such statement"), "{err}");
    let err = template().without_policy("ApiFunction", "NoSuchPolicy").unwrap_err();
    assert!(err.to_string().contains("NoSuchPolicy"), "{err}");
}

/// A dispatch invocation killed while its model call runs (as Lambda ends one that times out,
/// runs out of memory or crashes) leaves its wake-up leased for at most a minute, not for the
/// queue's visibility timeout (960 s): the next invocation retries the call and the turn ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_dispatch_run_comes_back_within_its_lease_not_the_visibility_timeout() {
    let openai = turnstone_tests::FakeOpenAi::start().await;
    openai.push(turnstone_tests::Reply::text("Never seen.").delay(Duration::from_secs(3)));
    openai.push(turnstone_tests::Reply::text("Recovered."));
    let config = format!(
        "[defaults]\nllm = {{ timeout_secs = 5, max_retries = 2, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }}\n\n\
         [llm.fake]\ntype = \"openai\"\nbase_url = \"{}\"\n\n[agent.plain]\nmodel = \"gpt-fake\"\nllm = \"fake\"\n",
        openai.base_url()
    );
    let deployed = Deployed::start(&config, |_| None, &template()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(template().visibility_timeout("WakeUpQueue").unwrap(), Duration::from_secs(960));
    deployed.kill_next_dispatch(Duration::from_secs(1));
    let api = client(&deployed);
    let killed_at = tokio::time::Instant::now() + Duration::from_secs(1);
    let turn = api.submit_ok("s-kill", &json!({"type": "client.message", "agent_id": "plain", "message": {"role": "user", "content": "hi"}})).await;
    let ended = loop {
        let (status, body) = api.get(&format!("/v1/sessions/s-kill/turns/{turn}?wait=20")).await;
        assert_eq!(status, 200, "{body}");
        if body["status"] != "active" {
            break body;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(150),
            "the turn is still active {:?} after the kill",
            killed_at.elapsed()
        );
    };
    let recovered_after = killed_at.elapsed();
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(ended["data"], "Recovered.", "{ended}");
    assert_eq!(openai.requests().len(), 2, "the killed call, then its retry");
    // Within the lease (60 s) and the claim's 5 s timeout, with room for the sweep's pace.
    assert!(recovered_after < Duration::from_secs(120), "recovered after {recovered_after:?}");
    let refused = deployed.refused();
    assert!(refused.is_empty(), "{refused:#?}");
}

/// At-least-once delivery on the real handler: every batch carries each wake-up twice, the
/// order reversed, across sessions submitted together. Each turn runs once: one reply, the
/// transcript intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_and_reordered_wake_ups_in_a_batch_run_each_turn_once() {
    let deployed = deploy(&template()).await;
    deployed.duplicate_batches();
    let api = client(&deployed);
    let sessions: Vec<String> = (0..6).map(|i| format!("s-dup-{i}")).collect();
    let mut turns = Vec::new();
    for session in &sessions {
        let input = json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": format!("hello {session}")}});
        turns.push(api.submit_ok(session, &input).await);
    }
    for (session, turn) in sessions.iter().zip(&turns) {
        let ended = api.wait_turn(session, turn).await;
        assert_eq!(ended.status, TurnStatus::Completed, "{session}: {ended:?}");
        let (_, page) = api.get(&format!("/v1/sessions/{session}/messages")).await;
        let roles: Vec<&str> =
            page["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant"], "{session}: {page}");
    }
    assert!(deployed.largest_batch() >= 2, "the batches carried their copies");
    let refused = deployed.refused();
    assert!(refused.is_empty(), "{refused:#?}");
}

/// The event stream on `ApiUrl`, where the web console opens it on its own origin: API Gateway
/// hands a response on only once it is whole, so a stream that did not end would reach the
/// browser never (before the fix: the function ran to its 29 s timeout and API Gateway
/// answered 500). Each response ends once it has news, with a `retry:`; the next one resumes
/// from `Last-Event-ID`; a stream with nothing to send ends before the 30 s cut, as a long-poll
/// does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_through_the_http_api_ends_with_its_news_before_the_30_s_cut() {
    let mut deployed = deploy(&template()).await;
    let api = client(&deployed);
    one_turn(&api, "s-buffered").await;
    let on_api = ApiClient::new(deployed.url());
    let stream_path = "/v1/sessions/s-buffered/events/stream";
    let open = |last: Option<u64>| {
        let mut request =
            on_api.request(reqwest::Method::GET, stream_path).header("accept", "text/event-stream");
        if let Some(id) = last {
            request = request.header("last-event-id", id.to_string());
        }
        request.send()
    };
    let started = tokio::time::Instant::now();
    let response = open(None).await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body = response.text().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "the backlog took {:?}", started.elapsed());
    let ids: Vec<u64> =
        body.lines().filter_map(|l| l.strip_prefix("id:")).map(|i| i.trim().parse().unwrap()).collect();
    assert!(body.contains("event: turn.ended"), "{body}");
    assert!(body.contains("retry:"), "the response ends asking the client back: {body}");
    let last = *ids.last().unwrap();
    assert_eq!(last, ids.len() as u64, "every event, in order: {ids:?}");

    // Resumed after the last event, with nothing new: a long-poll that ends before 30 s. A
    // turn submitted meanwhile is news, and ends it early.
    let (quiet, ()) = tokio::join!(
        async {
            let started = tokio::time::Instant::now();
            let response = open(Some(last)).await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap(), started.elapsed())
        },
        async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            one_turn(&api, "s-buffered").await;
        }
    );
    let (status, body, took) = quiet;
    assert_eq!(status, 200, "{body}");
    assert!(took < Duration::from_secs(25), "the news came at 2 s, the answer at {took:?}");
    let first_new: u64 = body.lines().find_map(|l| l.strip_prefix("id:")).unwrap().trim().parse().unwrap();
    assert_eq!(first_new, last + 1, "resumed where it left off: {body}");
    drop(api);
    stop(&mut deployed).await;
}

/// The HTTP API serves only the template's routes (`ANY /{proxy+}`, `GET /`), and a long-poll
/// through it is cut before API Gateway's 30 s, to answer as a long-poll, not as a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_routes_as_the_template_says_and_long_polls_end_before_its_cut() {
    let mut deployed = deploy(&template()).await;
    let api = client(&deployed);
    let (status, body) = api.post_raw("/", "").await;
    assert_eq!((status, body), (404, json!({"message": "Not Found"})), "no route takes POST /");
    let page = api.request(reqwest::Method::GET, "/").send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200, "GET / is the console's route");
    assert!(page.text().await.unwrap().contains("<html"), "the console's page");
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, 200);

    // A turn that waits for a client tool's result, which nobody sends: a long-poll of it
    // waits out its time, and answers the turn still active.
    let turn = api.submit_ok("s-poll", &json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "/tool confirm {}"}})).await;
    let started = tokio::time::Instant::now();
    let (status, body) = api.get(&format!("/v1/sessions/s-poll/turns/{turn}?wait=60")).await;
    let took = started.elapsed();
    assert_eq!((status, body["status"].as_str()), (200, Some("active")), "{body}");
    assert!(took > Duration::from_secs(20) && took < Duration::from_secs(30), "{took:?}");
    stop(&mut deployed).await;
}

/// Sessions started per round of faults.
const SESSIONS_PER_ROUND: u64 = 4;

/// Dispatch invocations killed at random points, throttled, and run with a deadline of
/// seconds (so runs hand back work, and one that overruns is killed), while twelve turns of
/// two worker tools each run across the stack. The kill test's invariants hold (every turn
/// once with its answer, each tool call answered once, no (call, attempt) run twice, replay
/// rebuilds what is served), and every turn ends within 2 minutes of the last fault.
/// `TURNSTONE_KILL_SEED` replays a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_runs_killed_throttled_and_timed_out_at_random_lose_nothing_and_run_nothing_twice() {
    let seed = std::env::var("TURNSTONE_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x70b0_u64);
    println!(
        "seed {seed} (replay: TURNSTONE_KILL_SEED={seed} cargo test -p turnstone-tests --test topology dispatch_runs_killed)"
    );
    let mut rng = Rng(seed | 1);
    let ledger = std::sync::Arc::new(std::sync::Mutex::new(Ledger::default()));
    let worker = ledger_worker(ledger.clone(), None, true).await;
    let mut deployed = Deployed::start(&scripted_config(&worker), |_| None, &template())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let api = client(&deployed);
    let mut sessions = Vec::new();
    let mut kills = 0;
    for round in 0..3 {
        match round {
            0 => deployed.set_dispatch_timeout(Some(Duration::from_secs(4))),
            _ => deployed.set_dispatch_timeout(None),
        }
        deployed.kill_next_dispatch(Duration::from_millis(rng.below(1500)));
        kills += 1;
        if round != 1 {
            deployed.throttle_next_dispatch(Duration::from_millis(500 + rng.below(2500)));
        } else {
            deployed.kill_next_dispatch(Duration::from_millis(rng.below(1500)));
            kills += 1;
        }
        for i in 0..SESSIONS_PER_ROUND {
            let n = round * SESSIONS_PER_ROUND + i;
            let (session, input) = calc_turn(n);
            api.submit_ok(&session, &input).await;
            sessions.push((session, n));
        }
        tokio::time::sleep(Duration::from_millis(1000 + rng.below(2000))).await;
    }
    deployed.set_dispatch_timeout(None);
    // Every turn ends, each within 2 minutes of the last fault.
    let patience = Duration::from_secs(120);
    for (session, _) in &sessions {
        loop {
            let (status, turn) =
                api.get(&format!("/v1/sessions/{session}/turns/turn-{session}?wait=20")).await;
            assert_eq!(status, 200, "{turn}");
            if turn["status"] != "active" && turn["status"] != "queued" {
                break;
            }
            let since = deployed.last_fault().map(|f| f.elapsed()).unwrap_or_default();
            assert!(
                since < patience,
                "{session}'s turn is still {} {since:?} after the last fault",
                turn["status"]
            );
        }
    }
    let since_last_fault = deployed.last_fault().expect("the faults struck").elapsed();
    assert_eq!(deployed.faults_pending(), 0, "every queued kill and throttle struck");
    let executions = assert_survived(&api, &sessions, &ledger).await;
    println!(
        "{} turns, {kills} kills, 2 throttles, 4 s deadlines in the first round: {executions} tool executions, \
         {} redeliveries answered from the ledger; the last turn ended within {since_last_fault:?} of the last fault",
        sessions.len(),
        ledger.lock().unwrap().redelivered.len()
    );
    drop(worker);
    stop(&mut deployed).await;
}

/// `[auth]` with one client key, for the WebSocket API's `$connect`.
const AUTH: &str = r#"
[auth]
api_keys_env = "KEYS"
"#;

fn keys(name: &str) -> Option<String> {
    (name == "KEYS").then(|| "alice:key-alice".to_owned())
}

/// An AHP client on the stack's WebSocket API, its token as the `tkn` query parameter (how a
/// browser's WebSocket, which sets no headers, sends it).
async fn ahp_client(
    deployed: &Deployed,
    token: &str,
) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
    let request = format!("{}?tkn={token}", deployed.ahp_url()).into_client_request()?;
    let (stream, _) = tokio_tungstenite::connect_async(request).await?;
    let config =
        ClientConfig { default_request_timeout: Some(Duration::from_secs(20)), subscription_buffer: 1 << 12 };
    let client = Client::connect(WebSocketTransport::from_stream(stream), config).await.unwrap();
    client.initialize("topology".into(), vec!["1.0.0".into()], vec![]).await.unwrap();
    Ok(client)
}

/// The AHP host as deployed: the official client connects to the WebSocket API's stage (each
/// upgrade, message and close an event of the ahp function), subscribes to a chat, and a turn
/// submitted over HTTP reaches it as the actions the dispatch function pushes through the
/// Management API (`execute-api:ManageConnections`, authorized by the gate): the chat it
/// reduces from the snapshot and those actions equals `GET .../chat`. A key nobody has is
/// refused at `$connect` (401), so no connection opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ahp_client_follows_a_chat_through_the_websocket_api() {
    let config = format!("{CONFIG}{AUTH}");
    let mut deployed = Deployed::start(&config, keys, &template()).await.unwrap_or_else(|e| panic!("{e}"));
    let api = client(&deployed).with_token("key-alice");
    one_turn(&api, "s-ahp").await;

    let refused = ahp_client(&deployed, "key-nobody").await.err().expect("an unknown key is refused");
    assert!(refused.to_string().contains("401"), "{refused}");

    let client = ahp_client(&deployed, "key-alice").await.unwrap();
    let (subscribed, mut sub): (SubscribeResult, _) =
        client.subscribe("ahp-chat:/s-ahp".to_owned()).await.unwrap();
    let SnapshotState::Chat(chat) = subscribed.snapshot.expect("a snapshot").state else {
        panic!("not a chat")
    };
    let mut chat: ChatState = *chat;
    one_turn(&api, "s-ahp").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let served: ChatState = api.get_ok("/v1/sessions/s-ahp/chat").await;
        if served == chat {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the client's chat {chat:#?} is not the served {served:#?}"
        );
        if let Ok(Some(SubscriptionEvent::Action(envelope))) =
            tokio::time::timeout(Duration::from_millis(500), sub.recv()).await
        {
            let outcome = ahp::reducers::apply_action_to_chat(&mut chat, &envelope.action);
            assert_eq!(outcome, ahp::reducers::ReduceOutcome::Applied, "{envelope:?}");
        }
    }
    drop(sub);
    drop(client);
    let calls = deployed.calls();
    let posts: BTreeSet<&str> = calls
        .iter()
        .filter(|c| c.operation == "execute-api:PostToConnection")
        .map(|c| c.function.as_str())
        .collect();
    assert!(posts.contains("AhpFunction"), "the ahp function answers through the Management API: {posts:?}");
    // The turn's actions are pushed by the function that commits them (the scripted model's
    // steps run inline in the api function; a model call on the queue, in dispatch).
    assert!(
        posts.contains("ApiFunction") || posts.contains("DispatchFunction"),
        "a committing function pushes the turn's actions: {posts:?}"
    );
    let refused: Vec<_> = calls.iter().filter_map(|c| c.refused.clone()).collect();
    assert!(refused.is_empty(), "IAM refused: {refused:#?}");
    stop(&mut deployed).await;
}

/// Without the `AhpPush` statement of the functions that commit (api, dispatch), their pushes
/// to subscribers are refused as API Gateway refuses them (403): the Management API is
/// authorized by the role, not reached around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ahp_push_a_committing_function_cannot_reach_a_subscriber() {
    let config = format!("{CONFIG}{AUTH}");
    let template = template()
        .without_statement("DispatchFunction", "AhpPush")
        .and_then(|t| t.without_statement("ApiFunction", "AhpPush"))
        .unwrap();
    let mut deployed = Deployed::start(&config, keys, &template).await.unwrap_or_else(|e| panic!("{e}"));
    let api = client(&deployed).with_token("key-alice");
    one_turn(&api, "s-nopush").await;
    let client = ahp_client(&deployed, "key-alice").await.unwrap();
    let (_, sub): (SubscribeResult, _) = client.subscribe("ahp-chat:/s-nopush".to_owned()).await.unwrap();
    one_turn(&api, "s-nopush").await;
    let pushes_from = |c: &Call| c.function == "ApiFunction" || c.function == "DispatchFunction";
    let refused = until(&deployed, "a refused push", |calls| {
        calls.iter().any(|c| pushes_from(c) && c.refused.is_some())
    })
    .await;
    let push = refused.iter().find(|c| pushes_from(c) && c.refused.is_some()).unwrap();
    assert_eq!(push.operation, "execute-api:PostToConnection");
    let why = push.refused.as_deref().unwrap();
    assert!(why.contains("execute-api:ManageConnections") && why.contains("/POST/@connections/"), "{why}");
    drop(sub);
    drop(client);
    drop(deployed.stop());
}

/// A dispatch run that is told its invocation's deadline hands the rest of its work back to
/// the queue instead of starting an effect that cannot end before it: with 4 s invocations and
/// worker tools of 1.5 s (2 s timeouts), four queued turns of one session (6 s of tools in a
/// row) complete, over more invocations than one, and none ran into its timeout. Before the
/// deadline was read, a run went on into its next effect, was killed at the timeout, and that
/// effect ran again after the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_run_hands_back_its_work_before_its_deadline() {
    let worker = FakeWorker::start(None, |request, _| match &request.trigger {
        Trigger::ToolExecute(_) if request.proposed.is_empty() => {
            FakeAnswer::delayed(Duration::from_millis(1500), FakeAnswer::Respond(tool_answer(Ok(json!(7)))))
        }
        _ => FakeAnswer::Accept,
    })
    .await;
    let mut deployed = Deployed::start(&scripted_config(&worker), |_| None, &template())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    deployed.set_dispatch_timeout(Some(Duration::from_secs(4)));
    let api = client(&deployed);
    let turns: Vec<String> = (0..4).map(|n| format!("turn-budget-{n}")).collect();
    for turn in &turns {
        let input = json!({"type": "client.message", "agent_id": "calc", "turn_id": turn,
            "message": {"role": "user", "content": "/tool add {\"a\": 1, \"b\": 2}"}});
        // Behind the first, each waits its turn.
        let (status, body) = api.post("/v1/sessions/s-budget/inputs?queue=true", &input).await;
        assert_eq!(status, 202, "{body}");
    }
    for turn in &turns {
        let ended = api.wait_turn_within("s-budget", turn, Duration::from_secs(90)).await;
        assert_eq!(ended.status, TurnStatus::Completed, "{ended:?}");
    }
    let (invocations, timed_out) = deployed.dispatch_invocations();
    println!(
        "{invocations} dispatch invocations of 4 s for 4 turns of 1.5 s tools, {timed_out} ran into their timeout"
    );
    assert_eq!(timed_out, 0, "a run went on past its deadline and was killed ({invocations} invocations)");
    assert!(invocations > 1, "the run handed work back: {invocations} invocations");
    drop(worker);
    stop(&mut deployed).await;
}

/// A record that is not a wake-up is in the dead-letter queue within seconds (the template's
/// redrive limit of receives, each coming back at once), while the sessions beside it run on.
/// Before, it came back after 60, 60, 120 and 240 s like a failed run: 16 minutes of retries
/// that could never succeed before anyone could look at it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_is_not_a_wake_up_reaches_the_dead_letter_queue_within_seconds() {
    let mut deployed = deploy(&template()).await;
    let api = client(&deployed);
    deployed.send_to_wake_ups("this is not a wake-up").await;
    one_turn(&api, "s-beside").await;
    let started = tokio::time::Instant::now();
    loop {
        if deployed.dead_letters().await.iter().any(|b| b == "this is not a wake-up") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "not in the dead-letter queue after a minute");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("in the dead-letter queue after {:?}", started.elapsed());
    stop(&mut deployed).await;
}

/// A conversation of 8 MB (sixteen turns of a 250 KB message, each echoed), read through the
/// HTTP API as a client reads it: the active path, the tree and the log come in pages that each
/// fit Lambda's 6 MB response limit. Before they were paged in bytes, each read was one
/// response of all of it, and Lambda refused it: API Gateway answered 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_conversation_reads_in_pages_under_lambdas_response_limit() {
    let mut deployed = deploy(&template()).await;
    let api = client(&deployed);
    for n in 0..16 {
        let text = format!("{n:02}{}", "x".repeat(250_000));
        let input = json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": text}});
        let turn = api.submit_ok("s-long", &input).await;
        assert_eq!(api.wait_turn("s-long", &turn).await.status, TurnStatus::Completed);
    }
    for path in ["/v1/sessions/s-long/messages", "/v1/sessions/s-long/messages?tree=1"] {
        let pages = api.pages(path).await;
        assert!(pages.len() >= 2, "{path}: 8 MB in one page?");
        let items: usize =
            pages.iter().map(|p| p["messages"].as_array().or(p["nodes"].as_array()).unwrap().len()).sum();
        assert_eq!(items, 32, "{path}: every message, once");
    }
    let messages = api.messages("s-long").await;
    let first: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or_default()[..2].to_owned())
        .collect();
    assert_eq!(first, (0..16).map(|n| format!("{n:02}")).collect::<Vec<_>>(), "in order, root first");
    let events = api.events("s-long", 0).await;
    assert!(events.len() > 32, "the log, every page: {}", events.len());
    // The chat as AHP's `ChatState`: its turns page newest first, each page within the bound.
    let (mut turns, mut cursor, mut pages) = (0, None::<String>, 0);
    loop {
        let path = match &cursor {
            None => "/v1/sessions/s-long/chat?turns=50".to_owned(),
            Some(c) => format!("/v1/sessions/s-long/chat?turns=50&cursor={c}"),
        };
        let (status, chat) = api.get(&path).await;
        assert_eq!(status, 200, "GET {path}: {}", chat.to_string().chars().take(300).collect::<String>());
        turns += chat["turns"].as_array().unwrap().len();
        pages += 1;
        match chat["turnsNextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(turns, 16, "every turn, once");
    assert!(pages >= 2, "8 MB of turns in one page?");
    stop(&mut deployed).await;
}

/// A configuration and secret under a customer managed KMS key (`ConfigKeyArn`): every
/// function reads them, each read also authorized as `kms:Decrypt` on the key through its
/// service, which the template grants only then. Without that statement a function cannot
/// start: IAM refuses the decrypt (before, the read policies had no `kms:Decrypt` at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_under_a_customer_key_is_read_with_kms_decrypt() {
    let mut deployed = Deployed::start_with(CONFIG, |_| None, &template(), Encryption::CustomerKey)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    one_turn(&client(&deployed), "s-kms").await;
    let calls = deployed.calls();
    let decrypts: BTreeSet<&str> = calls
        .iter()
        .filter(|c| c.requests.iter().any(|r| r.action == "kms:Decrypt"))
        .map(|c| c.operation.as_str())
        .collect();
    assert_eq!(
        decrypts,
        BTreeSet::from(["secretsmanager:GetSecretValue", "ssm:GetParameter"]),
        "each read of the configuration and the secret needs the key"
    );
    let refused: Vec<_> = calls.iter().filter_map(|c| c.refused.clone()).collect();
    assert!(refused.is_empty(), "IAM refused: {refused:#?}");
    stop(&mut deployed).await;

    let without = template().without_statement_of_policy("ConfigReadPolicy", 1).unwrap();
    let error = Deployed::start_with(CONFIG, |_| None, &without, Encryption::CustomerKey)
        .await
        .err()
        .expect("no function starts");
    let error = error.to_string();
    assert!(error.contains("kms:Decrypt"), "{error}");
}

/// A session waiting a day for a person: its wake-up is one EventBridge Scheduler schedule at
/// the call's deadline (authorized by the template's `WakeUpSchedulePolicy`), not a wake-up
/// re-armed every 15 minutes (96 dispatch invocations a day). A day later (the stack's clock
/// moved on) Scheduler sends it as the template's scheduler role, and the dispatch run it
/// wakes times the call out: the wait cost at most two dispatch invocations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_long_wait_is_one_schedule_and_at_most_two_dispatch_invocations() {
    let config = format!(
        "{CONFIG}\n[defaults]\nclient_tool = {{ timeout_secs = 86400, max_retries = 0, backoff_base_secs = 0, backoff_max_secs = 0 }}\n"
    );
    let mut deployed =
        Deployed::start(&config, |_| None, &template()).await.unwrap_or_else(|e| panic!("{e}"));
    let api = client(&deployed);
    let ask = json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "/tool confirm {}"}});
    let turn = api.submit_ok("s-wait", &ask).await;
    let started = tokio::time::Instant::now();
    while deployed.schedules_waiting().is_empty() {
        if started.elapsed() > Duration::from_secs(20) {
            let session = deployed.app.session("s-wait").await.unwrap();
            let ops: Vec<_> =
                deployed.calls().into_iter().map(|c| (c.function, c.operation, c.refused)).collect();
            panic!(
                "no schedule; plan {:?}; calls {:?}; {ops:#?}",
                session.plan(deployed.now()),
                session.calls()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The client tool waits for the person: nothing runs meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (waiting, _) = deployed.dispatch_invocations();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(deployed.dispatch_invocations().0, waiting, "a waiting session is not re-armed");
    let scheduled = deployed.schedules_waiting();
    assert_eq!(scheduled.len(), 1, "{scheduled:?}");
    let calls = deployed.calls();
    let created: Vec<_> = calls.iter().filter(|c| c.operation == "scheduler:CreateSchedule").collect();
    assert!(!created.is_empty() && created.iter().all(|c| c.refused.is_none()), "{created:#?}");
    assert!(
        created.iter().all(|c| c.requests.iter().any(|r| r.action == "iam:PassRole")),
        "CreateSchedule passes the scheduler role: {created:#?}"
    );

    deployed.advance(Duration::from_secs(24 * 3600 + 60));
    let ended = api.wait_turn_within("s-wait", &turn, Duration::from_secs(30)).await;
    assert_eq!(ended.status, TurnStatus::Completed, "{ended:?}");
    let fired = deployed.schedules_fired();
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert!(fired[0].1.contains("s-wait"), "{fired:?}");
    let (after, _) = deployed.dispatch_invocations();
    assert!(after - waiting <= 2, "the day's wait cost {} dispatch invocations", after - waiting);
    println!("a day's wait: 1 schedule, {} dispatch invocation(s)", after - waiting);
    stop(&mut deployed).await;
}

/// A configuration kept as a file in a versioned S3 bucket (`ConfigBucket`, `ConfigObjectKey`,
/// `ConfigObjectVersion`): every function reads the pinned version under the template's
/// `ConfigObjectReadPolicy` (`s3:GetObjectVersion`) and serves a turn; without that policy a
/// function cannot start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_in_a_versioned_s3_object_is_read_under_the_templates_policy() {
    use turnstone_tests::topology::ConfigIn;
    let mut deployed =
        Deployed::start_from(CONFIG, |_| None, &template(), Encryption::AwsOwned, ConfigIn::Object)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    one_turn(&client(&deployed), "s-s3").await;
    let calls = deployed.calls();
    let refused: Vec<_> = calls.iter().filter_map(|c| c.refused.clone()).collect();
    assert!(refused.is_empty(), "IAM refused: {refused:#?}");
    for function in ["ApiFunction", "StreamFunction", "DispatchFunction", "SweepFunction", "AhpFunction"] {
        let made = operations(&calls, function);
        assert!(made.contains("s3:GetObjectVersion"), "{function} did not read the pinned object: {made:?}");
        assert!(!made.contains("ssm:GetParameter"), "{function} read a parameter: {made:?}");
    }
    stop(&mut deployed).await;

    let template = template().without_policy("DispatchFunction", "ConfigObjectReadPolicy").unwrap();
    match Deployed::start_from(CONFIG, |_| None, &template, Encryption::AwsOwned, ConfigIn::Object).await {
        Err(StartError::Function { function, error }) => {
            assert_eq!(function, "DispatchFunction", "{error}");
            let error = error.to_string();
            assert!(error.contains("AccessDenied") && error.contains("s3:GetObjectVersion"), "{error}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("the dispatch function started without ConfigObjectReadPolicy"),
    }
}
