//! Nobody where they don't belong (issue 23): each test is a way in that a hostile tenant
//! found, tried against a running host over HTTP (the same wiring as `turnstone serve`, with
//! `[auth]` on), and what the host does about it now:
//! - a refused spawn onto another tenant's session id leaves that session alone when the
//!   spawner disposes its own, and tells the worker nothing of it;
//! - a worker may spawn only the sub-agents its agent declares, and sub-agent sessions count
//!   toward `sessions_per_owner`;
//! - a client settles only its client tools' calls, a machine key only its worker's;
//! - client, admin and JWT identities of one name never meet;
//! - `POST /v1/sessions` answers another tenant's id as a missing session, and mints ids;
//! - the event log shows clients neither worker state nor system prompts.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jsonwebtoken::{EncodingKey, Header};
use serde_json::{Value, json};
use tempfile::TempDir;
use turnstone_engine::protocol::{Action, DecisionResponse, Trigger};
use turnstone_runtime::api::SessionPage;
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_tests::{ApiClient, FakeAnswer, FakeWorker, Gate, TestHost, WorkerRecord, tool_answer};

const PATIENCE: Duration = Duration::from_secs(15);
const JWT_SECRET: &str = "tenancy-jwt-secret-of-32-bytes-or-more";

fn env(name: &str) -> Option<String> {
    let value = match name {
        "KEYS" => "alice:key-alice,bob:key-bob,root:key-root-client",
        "MACHINES" => "w:key-w,w-demo:key-w-demo",
        "ADMINS" => "root:key-root-admin",
        "JWT" => JWT_SECRET,
        _ => return None,
    };
    Some(value.to_owned())
}

/// The agents: `demo` (engine-run), `spawner` (a worker agent that may delegate to `demo`),
/// `tooler` (a worker tool `slow` and a client tool `ask`), `selfhosted` (the worker runs its
/// model), and `[auth]` with the machine key `w` of the three worker agents.
fn config(worker: &FakeWorker, extra: &str) -> String {
    let url = worker.url();
    format!(
        r#"
[defaults]
decision = {{ timeout_secs = 10, max_retries = 1, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }}
tool = {{ timeout_secs = 30, max_retries = 0, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }}

[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
system = "The demo's secret instructions."
llm = "s"

[agent.spawner]
model = "scripted"
llm = "s"
worker = "{url}"
[[agent.spawner.sub_agents]]
id = "demo"

[agent.tooler]
model = "scripted"
llm = "s"
worker = "{url}"
[[agent.tooler.tools]]
name = "slow"
[[agent.tooler.tools]]
name = "ask"
handler = "client"

[agent.selfhosted]
model = "worker-model"
handler = "worker"
worker = "{url}"

{extra}

[auth]
api_keys_env = "KEYS"
machine_keys_env = "MACHINES"
admin_keys_env = "ADMINS"
jwt_secret_env = "JWT"

[auth.machines]
w = ["spawner", "tooler", "selfhosted"]
w-demo = ["demo"]
"#
    )
}

async fn start(worker: &FakeWorker, extra: &str) -> (TestHost, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start_with_env(&config(worker, extra), dir.path(), env).await;
    (host, dir)
}

fn message(agent: &str, text: &str) -> Value {
    json!({"type": "client.message", "agent_id": agent, "message": {"role": "user", "content": text}})
}

/// A worker that accepts every proposal, except that a delegation the model asked for with
/// `/agent <name> into:<id>` is spawned as session `<id>` (what a hostile worker may answer),
/// and a spawn's agent is `<agent>` when the task says `as:<agent>`.
async fn spawning_worker() -> FakeWorker {
    FakeWorker::start(None, |request, _| {
        let Trigger::LlmFinished(_) = &request.trigger else { return FakeAnswer::Accept };
        let mut proposed = request.proposed.clone();
        let Some(actions) = proposed.actions.as_mut() else { return FakeAnswer::Accept };
        let task = actions.iter().find_map(|a| match a {
            Action::MessageSend(send) => Some(send.message.content_text()),
            _ => None,
        });
        let Some(task) = task else { return FakeAnswer::Accept };
        let word =
            |prefix: &str| task.split_whitespace().find_map(|w| w.strip_prefix(prefix).map(str::to_owned));
        let (target, agent) = (word("into:"), word("as:"));
        for action in actions.iter_mut() {
            match action {
                Action::SubAgentSpawn(spawn) => {
                    if let Some(target) = &target {
                        spawn.session_id = target.as_str().into();
                    }
                    if let Some(agent) = &agent {
                        spawn.agent_id = agent.clone();
                    }
                }
                Action::MessageSend(send) => {
                    if let Some(target) = &target {
                        send.session_id = target.as_str().into();
                    }
                }
                _ => {}
            }
        }
        FakeAnswer::Respond(proposed)
    })
    .await
}

/// The `sub_agent.finished` trigger the worker got for session `session`.
async fn finished_delegation(worker: &FakeWorker, session: &str) -> WorkerRecord {
    worker
        .wait_for(PATIENCE, |r| r.request.session_id == session && r.trigger_name() == "sub_agent.finished")
        .await
}

fn delegation_error(record: &WorkerRecord) -> String {
    let Trigger::SubAgentFinished(finished) = &record.request.trigger else { panic!("{:?}", record.request) };
    assert!(!finished.ok, "{finished:?}");
    finished.error.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn disposing_a_session_never_disposes_another_tenants_session_its_worker_named() {
    let worker = spawning_worker().await;
    let (host, _dir) = start(&worker, "").await;
    let (alice, bob) = (host.with_token("key-alice"), host.with_token("key-bob"));
    let turn = bob.submit_ok("bob-b1", &message("demo", "bob's work")).await;
    bob.wait_turn("bob-b1", &turn).await;
    let bob_seq = bob.summary("bob-b1").await.last_seq;

    // alice's worker spawns its delegation onto bob's session id: refused.
    let turn = alice.submit_ok("alice-s1", &message("spawner", "/agent demo into:bob-b1")).await;
    let error = delegation_error(&finished_delegation(&worker, "alice-s1").await);
    assert!(error.contains("\"bob-b1\"") && error.contains("not available"), "{error}");
    // Nothing of bob's session: not its agent, not whose child it is or is not.
    for leak in ["demo", "top-level", "parent", "child of"] {
        assert!(!error.contains(leak), "the refusal tells alice's worker {leak:?}: {error}");
    }
    alice.wait_turn("alice-s1", &turn).await;

    // A delegation that did start is still disposed with its parent.
    let turn = alice.submit_ok("alice-s2", &message("spawner", "/agent demo into:alice-child")).await;
    alice.wait_turn("alice-s2", &turn).await;
    assert_eq!(alice.summary("alice-child").await.parent.unwrap().session_id, "alice-s2");

    let (status, body) = alice.delete("/v1/sessions/alice-s1").await;
    assert_eq!((status, &body), (200, &json!({"session_id": "alice-s1", "disposed": ["alice-s1"]})));
    let (status, body) = alice.delete("/v1/sessions/alice-s2").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["disposed"], json!(["alice-s2", "alice-child"]));
    // bob's session is as bob left it.
    let summary = bob.summary("bob-b1").await;
    assert_eq!(summary.last_seq, bob_seq, "{summary:?}");
    assert_eq!(summary.owner.as_deref(), Some("client:bob"));
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_spawns_only_declared_sub_agents_and_they_count_toward_the_quota() {
    let worker = spawning_worker().await;
    let (host, _dir) = start(&worker, "[limits]\nsessions_per_owner = 2\n").await;
    let alice = host.with_token("key-alice");

    // `tooler` is an agent of this host, but not one `spawner` declares.
    let turn = alice.submit_ok("q1", &message("spawner", "/agent demo as:tooler into:q-tooler")).await;
    let ended = alice.wait_turn("q1", &turn).await;
    let error = ended.error.clone().unwrap_or_default();
    assert!(
        error.contains("invalid_response: actions[0].agent_id")
            && error.contains("\"tooler\" is not one of this agent's sub_agents (demo)"),
        "{ended:?}"
    );
    let (status, _) = alice.get("/v1/sessions/q-tooler").await;
    assert_eq!(status, 404, "no session of the undeclared agent was started");

    // q1 is alice's first session; a sub-agent's session is her second: allowed.
    let turn = alice.submit_ok("q1", &message("spawner", "/agent demo into:q-child1")).await;
    alice.wait_turn("q1", &turn).await;
    assert_eq!(alice.summary("q-child1").await.owner.as_deref(), Some("client:alice"));
    // A third, as a sub-agent, is over the quota: the delegation fails, naming the limit.
    let turn = alice.submit_ok("q1", &message("spawner", "/agent demo into:q-child2")).await;
    alice.wait_turn("q1", &turn).await;
    let records: Vec<WorkerRecord> =
        worker.records().into_iter().filter(|r| r.trigger_name() == "sub_agent.finished").collect();
    let error = delegation_error(records.last().unwrap());
    assert!(error.contains("limits.sessions_per_owner"), "{error}");
    let (status, _) = alice.get("/v1/sessions/q-child2").await;
    assert_eq!(status, 404);
    // And so is a third top-level session.
    let (status, body) = alice.submit("q3", &message("demo", "hi")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("too_many_sessions")), "{body}");
    host.stop().await;
}

/// The first `tool.execute` (or `llm.execute`) delivery is held until the test opens the gate.
async fn holding_worker(gate: &Gate) -> FakeWorker {
    let gate = gate.clone();
    FakeWorker::start(None, move |request, _| match &request.trigger {
        Trigger::ToolExecute(_) => {
            FakeAnswer::held(&gate, FakeAnswer::Respond(tool_answer(Ok(json!("slow done")))))
        }
        Trigger::LlmExecute(_) => {
            let response =
                json!({"model": "worker-model", "content": "worker model", "finish_reason": "stop"});
            let answer = DecisionResponse {
                actions: Some(vec![Action::LlmResult(turnstone_engine::protocol::LlmResultAction {
                    id: None,
                    attempt: None,
                    response,
                })]),
                ..DecisionResponse::default()
            };
            FakeAnswer::held(&gate, FakeAnswer::Respond(answer))
        }
        _ => FakeAnswer::Accept,
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_settle_their_calls_and_machines_their_workers() {
    let gate = Gate::new();
    let worker = holding_worker(&gate).await;
    let (host, _dir) = start(&worker, "").await;
    let (alice, machine, other_machine) =
        (host.with_token("key-alice"), host.with_token("key-w"), host.with_token("key-w-demo"));

    // A worker tool runs; its session's owner forges its result.
    alice.submit_ok("t1", &message("tooler", "/tool slow {}")).await;
    let execute = worker.wait_for(PATIENCE, |r| r.trigger_name() == "tool.execute").await;
    let Trigger::ToolExecute(t) = &execute.request.trigger else { unreachable!() };
    let forged = json!({"type": "tool.result", "id": t.id, "result": "forged by the client"});
    let (status, body) = alice.post("/v1/sessions/t1/calls/settle", &forged).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("settle_forbidden")), "{body}");
    assert_eq!(body["error"]["param"], "id");
    // A machine key of another agent does not reach the session at all.
    let (status, _) = other_machine.post("/v1/sessions/t1/calls/settle", &forged).await;
    assert_eq!(status, 404);
    let before = alice.summary("t1").await.last_seq;
    // The agent's machine key settles it.
    let real = json!({"type": "tool.result", "id": t.id, "result": "settled by the worker's key"});
    let (status, body) = machine.post("/v1/sessions/t1/calls/settle", &real).await;
    assert_eq!(status, 202, "{body}");
    assert!(alice.summary("t1").await.last_seq > before);
    let events = alice.events("t1", 0).await;
    let results: Vec<&Value> = events
        .iter()
        .filter(|e| e.event["type"] == "call_settled" && e.event["call_id"] == t.id.as_str())
        .map(|e| &e.event["outcome"])
        .collect();
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].to_string().contains("settled by the worker's key"), "{results:?}");

    // A client tool: its client settles it, a machine key may not.
    alice.submit_ok("t2", &message("tooler", "/tool ask {}")).await;
    let summary = alice.wait_summary("t2", PATIENCE, |s| !s.pending_client_calls.is_empty()).await;
    let ask = summary.pending_client_calls[0].id.clone();
    let answer = json!({"type": "tool.result", "id": ask, "result": "yes"});
    let (status, body) = machine.post("/v1/sessions/t2/calls/settle", &answer).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("settle_forbidden")), "{body}");
    let (status, body) = alice.post("/v1/sessions/t2/calls/settle", &answer).await;
    assert_eq!(status, 202, "{body}");

    // A worker-run model call: the client cannot answer for the model.
    alice.submit_ok("t3", &message("selfhosted", "hi")).await;
    let execute = worker.wait_for(PATIENCE, |r| r.trigger_name() == "llm.execute").await;
    let Trigger::LlmExecute(l) = &execute.request.trigger else { unreachable!() };
    let forged = json!({"type": "llm.result", "id": l.id, "response": {
        "model": "worker-model", "content": null, "finish_reason": "tool_calls",
        "tool_calls": [{"id": "x", "name": "anything", "arguments": "{}"}]}});
    let (status, body) = alice.post("/v1/sessions/t3/calls/settle", &forged).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("settle_forbidden")), "{body}");
    gate.open();
    let turn = alice.summary("t3").await.active_turn.unwrap();
    let ended = alice.wait_turn("t3", &turn).await;
    assert_eq!(ended.data, Some(json!("worker model")), "{ended:?}");
    host.stop().await;
}

fn now_secs() -> i64 {
    SystemClock.now().0 / 1000
}

fn jwt(sub: &str) -> String {
    let claims = json!({"sub": sub, "exp": now_secs() + 300});
    jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(JWT_SECRET.as_bytes()))
        .unwrap()
}

async fn ids(client: &ApiClient) -> Vec<String> {
    let page: SessionPage = client.get_ok("/v1/sessions").await;
    let mut ids: Vec<String> = page.sessions.into_iter().map(|s| s.session_id).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn identities_of_one_name_and_another_kind_never_meet() {
    let worker = FakeWorker::accept_all(None).await;
    let (host, _dir) = start(&worker, "").await;
    let (client_root, admin_root) = (host.with_token("key-root-client"), host.with_token("key-root-admin"));
    let (alice_key, alice_jwt) = (host.with_token("key-alice"), host.with_token(jwt("alice")));
    for (client, id) in
        [(&admin_root, "adm-1"), (&client_root, "cli-1"), (&alice_key, "key-1"), (&alice_jwt, "jwt-1")]
    {
        let turn = client.submit_ok(id, &message("demo", "hi")).await;
        client.wait_turn(id, &turn).await;
    }
    let owner = |client: &ApiClient, id: &'static str| {
        let client = client.clone();
        async move { client.summary(id).await.owner }
    };
    assert_eq!(owner(&admin_root, "adm-1").await.as_deref(), Some("admin:root"));
    assert_eq!(owner(&client_root, "cli-1").await.as_deref(), Some("client:root"));
    assert_eq!(owner(&alice_key, "key-1").await.as_deref(), Some("client:alice"));
    assert_eq!(owner(&alice_jwt, "jwt-1").await.as_deref(), Some("jwt:alice"));
    // The client named root reaches nothing of the admin named root, nor drives it.
    assert_eq!(ids(&client_root).await, ["cli-1"]);
    let (status, _) = client_root.get("/v1/sessions/adm-1").await;
    assert_eq!(status, 404);
    let (status, _) = client_root.submit("adm-1", &message("demo", "mine")).await;
    assert_eq!(status, 404);
    // The admin reads every session, and drives only its own.
    assert_eq!(ids(&admin_root).await, ["adm-1", "cli-1", "jwt-1", "key-1"]);
    let (status, _) = admin_root.submit("cli-1", &message("demo", "mine")).await;
    assert_eq!(status, 404);
    // A JWT whose sub is alice is not the client key named alice (unless the config says so:
    // `auth.rs` runs with `jwt_sub_is_api_key_name = true`).
    assert_eq!(ids(&alice_key).await, ["key-1"]);
    assert_eq!(ids(&alice_jwt).await, ["jwt-1"]);
    let (status, _) = alice_jwt.get("/v1/sessions/key-1").await;
    assert_eq!(status, 404);
    let page: SessionPage = admin_root.get_ok("/v1/sessions?owner=jwt:alice").await;
    assert_eq!(page.sessions.iter().map(|s| s.session_id.as_str()).collect::<Vec<_>>(), ["jwt-1"]);
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn creating_a_session_answers_another_tenants_id_as_missing_and_mints_ids() {
    let worker = FakeWorker::accept_all(None).await;
    let (host, _dir) = start(&worker, "").await;
    let (alice, bob) = (host.with_token("key-alice"), host.with_token("key-bob"));
    let (status, body) = bob.post("/v1/sessions", &json!({"agent_id": "demo", "session_id": "b-own"})).await;
    assert_eq!((status, &body), (201, &json!({"session_id": "b-own", "agent_id": "demo"})));
    // Again: the caller's own session, answered as it is.
    let (status, _) = bob.post("/v1/sessions", &json!({"agent_id": "demo", "session_id": "b-own"})).await;
    assert_eq!(status, 200);
    // Another tenant's id: as for a session that does not exist, over every route.
    let (status, body) =
        alice.post("/v1/sessions", &json!({"agent_id": "demo", "session_id": "b-own"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("session_not_found")), "{body}");
    let (status, missing) = alice.get("/v1/sessions/b-own").await;
    assert_eq!((status, &missing["error"]["code"]), (404, &body["error"]["code"]));
    // No id: one no one can guess.
    let mut minted = Vec::new();
    for _ in 0..2 {
        let (status, body) = alice.post("/v1/sessions", &json!({"agent_id": "demo"})).await;
        assert_eq!(status, 201, "{body}");
        let id = body["session_id"].as_str().unwrap().to_owned();
        let hex = id.strip_prefix("s-").unwrap();
        assert!(hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        minted.push(id);
    }
    assert_ne!(minted[0], minted[1]);
    let turn = alice.submit_ok(&minted[0], &message("demo", "hello")).await;
    alice.wait_turn(&minted[0], &turn).await;
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_see_neither_worker_state_nor_the_system_prompt_admins_do() {
    let state = Arc::new(Mutex::new(0u32));
    let counter = Arc::clone(&state);
    let worker = FakeWorker::start(None, move |request, _| {
        let mut n = counter.lock().unwrap();
        *n += 1;
        let mut response = request.proposed.clone();
        response.state = Some(json!({"secret_state": *n}));
        FakeAnswer::Respond(response)
    })
    .await;
    let run = |expose: bool| {
        let worker_config =
            config(&worker, if expose { "[server]\nexpose_internal_events = true\n" } else { "" });
        async move {
            let dir = tempfile::tempdir().unwrap();
            let host = TestHost::start_with_env(&worker_config, dir.path(), env).await;
            let alice = host.with_token("key-alice");
            let turn = alice.submit_ok("i1", &message("tooler", "hello")).await;
            alice.wait_turn("i1", &turn).await;
            let engine_run = alice.submit_ok("i2", &message("demo", "hello")).await;
            alice.wait_turn("i2", &engine_run).await;
            let text = |client: ApiClient, id: &'static str| async move {
                let events = client.events(id, 0).await;
                serde_json::to_string(&events).unwrap()
            };
            let client_view =
                format!("{}{}", text(alice.clone(), "i1").await, text(alice.clone(), "i2").await);
            let admin = host.with_token("key-root-admin");
            let admin_view = format!("{}{}", text(admin.clone(), "i1").await, text(admin, "i2").await);
            // The live stream shows what the page shows.
            let mut stream = alice.stream("i1", None).await;
            let frames = stream.until(PATIENCE, |f| f.event == "turn.ended").await;
            drop(stream);
            let streamed: String = frames.iter().map(|f| f.data.clone()).collect();
            host.stop().await;
            (client_view, admin_view, streamed)
        }
    };
    let (client_view, admin_view, streamed) = run(false).await;
    for secret in ["secret_state", "The demo's secret instructions."] {
        assert!(!client_view.contains(secret), "a client sees {secret:?}");
        assert!(!streamed.contains(secret), "a client's stream shows {secret:?}");
        assert!(admin_view.contains(secret), "an admin sees {secret:?}");
    }
    // The events keep their shape: a state write is still there, its value empty.
    assert!(client_view.contains("state_written"), "{client_view}");
    let (client_view, ..) = run(true).await;
    assert!(client_view.contains("secret_state") && client_view.contains("The demo's secret instructions."));
}
