//! The template's functions under the template's IAM (issue 24): each function built as its
//! `main.rs` builds it, signing as its own principal, whose statements are read from
//! `infra/template.yaml`; every AWS call authorized as IAM would (`turnstone_tests::topology`).
//! The same template with one statement taken out shows what that statement is for: the
//! operation that needs it is refused, and the user sees the failure it causes.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use turnstone_engine::session::TurnStatus;
use turnstone_tests::ApiClient;
use turnstone_tests::topology::gate::Call;
use turnstone_tests::topology::template::Template;
use turnstone_tests::topology::{Deployed, StartError};

const CONFIG: &str = r#"
[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
llm = "s"
"#;

fn template() -> Template {
    Template::load().unwrap()
}

async fn deploy(template: &Template) -> Deployed {
    Deployed::start(CONFIG, |_| None, template).await.unwrap_or_else(|e| panic!("{e}"))
}

/// One turn of the scripted demo agent on `session`, to its end.
async fn one_turn(api: &ApiClient, session: &str) {
    let turn = api.submit_ok(session, &json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "hello"}})).await;
    let ended = api.wait_turn(session, &turn).await;
    assert_eq!(ended.status, TurnStatus::Completed, "{ended:?}");
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
    let api = ApiClient::new(deployed.url());
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
    let stopped = tokio::time::timeout(Duration::from_secs(10), deployed.stop().unwrap()).await;
    stopped.expect("the stack stops within 10 s").unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_batch_write_the_purge_of_a_disposed_session_is_refused() {
    let template =
        template().without_action("ApiFunction", "SessionsReadWrite", "dynamodb:BatchWriteItem").unwrap();
    let deployed = deploy(&template).await;
    let api = ApiClient::new(deployed.url());
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
    let api = ApiClient::new(deployed.url());
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
    let api = ApiClient::new(deployed.url());
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
    let api = ApiClient::new(deployed.url());
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
