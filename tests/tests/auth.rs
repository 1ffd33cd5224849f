//! Sessions belong to their owner: every session route against every kind of caller, through
//! the HTTP API of a running host with `[auth]` on (client keys, a machine key, an admin key,
//! HS256 JWTs), and an open host without `[auth]`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use jsonwebtoken::{EncodingKey, Header};
use serde_json::{Value, json};
use tempfile::TempDir;
use turnstone_engine::protocol::Trigger;
use turnstone_runtime::api::{SessionPage, SessionSummary};
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_tests::{ApiClient, FakeAnswer, FakeWorker, Gate, TestHost};

const JWT_SECRET: &str = "jwt-secret-for-tests-only-0123456789";

const CONFIG: &str = r#"
[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
llm = "s"

[agent.other]
model = "scripted"
llm = "s"

[auth]
api_keys_env = "KEYS"
machine_keys_env = "MACHINES"
admin_keys_env = "ADMINS"
jwt_secret_env = "JWT"
jwt_issuer = "https://id.test"
jwt_audience = "turnstone"
jwt_metadata_claims = ["plan"]
# A token's `sub` is the client key of that name: "owner by JWT" below is alice.
jwt_sub_is_api_key_name = true

[auth.machines]
w-demo = ["demo"]
w-other = ["other"]
"#;

fn env(name: &str) -> Option<String> {
    let value = match name {
        "KEYS" => "alice:key-alice,bob:key-bob,root:key-root-client",
        "MACHINES" => "w-demo:key-w-demo,w-other:key-w-other",
        "ADMINS" => "root:key-root",
        "JWT" => JWT_SECRET,
        _ => return None,
    };
    Some(value.to_owned())
}

fn now_secs() -> u64 {
    (SystemClock.now().0 / 1000) as u64
}

/// An HS256 token for `sub`, expiring `exp_in` seconds from now (negative: already expired).
fn jwt(sub: &str, exp_in: i64, extra: Value) -> String {
    let mut claims = json!({
        "sub": sub,
        "iss": "https://id.test",
        "aud": "turnstone",
        "exp": now_secs() as i64 + exp_in,
    });
    if let (Some(claims), Some(extra)) = (claims.as_object_mut(), extra.as_object()) {
        claims.extend(extra.clone());
    }
    jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(JWT_SECRET.as_bytes()))
        .unwrap()
}

fn message(agent: &str, text: &str) -> Value {
    json!({"type": "client.message", "agent_id": agent, "message": {"role": "user", "content": text}})
}

/// A route to call: method, path, body, and the answers of the owner, of the agent's machine
/// key and of an admin.
type Route<'a> = (&'a str, &'a str, Option<&'a Value>, Expected<'a>, Expected<'a>, Expected<'a>);

/// A status and an error code (empty for a success).
type Expected<'a> = (u16, &'a str);

async fn start() -> (TestHost, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start_with_env(CONFIG, dir.path(), env).await;
    (host, dir)
}

/// What a caller got: the status and, for an error, its code.
async fn outcome(client: &ApiClient, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let (status, answer) = match (method, body) {
        ("GET", _) if path.ends_with("/events/stream") => {
            let response = client
                .request(reqwest::Method::GET, path)
                .header("accept", "text/event-stream")
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            // An open stream has no end: read the body only when it is an error.
            let answer =
                if status == 200 { Value::Null } else { response.json().await.unwrap_or(Value::Null) };
            (status, answer)
        }
        ("GET", _) => client.get(path).await,
        (_, Some(body)) => client.post(path, body).await,
        (_, None) => client.post_raw(path, "").await,
    };
    let code = answer["error"]["code"].as_str().unwrap_or("").to_owned();
    (status, code)
}

#[tokio::test]
async fn every_session_route_answers_only_its_owner() {
    let (host, _dir) = start().await;
    let alice = host.with_token("key-alice");
    let (status, body) = alice.submit("as1", &message("demo", "hello")).await;
    assert_eq!(status, 202, "{body}");
    let turn_id = body["turn_id"].as_str().unwrap().to_owned();
    alice.wait_turn("as1", &turn_id).await;

    let callers: Vec<(&str, ApiClient)> = vec![
        ("owner", alice.clone()),
        ("owner by JWT", host.with_token(jwt("alice", 300, json!({})))),
        ("other client", host.with_token("key-bob")),
        ("other client by JWT", host.with_token(jwt("mallory", 300, json!({})))),
        ("machine of the agent", host.with_token("key-w-demo")),
        ("machine of another agent", host.with_token("key-w-other")),
        ("admin", host.with_token("key-root")),
        // A client key named as the admin key is: another identity (client:root, admin:root).
        ("client named as the admin", host.with_token("key-root-client")),
        ("no key", (*host).clone()),
        ("bad key", host.with_token("key-alice-but-wrong")),
        ("expired JWT", host.with_token(jwt("alice", -3600, json!({})))),
        ("JWT not valid yet", host.with_token(jwt("alice", 7200, json!({"nbf": now_secs() + 3600})))),
        ("JWT of another issuer", host.with_token({
            let claims = json!({"sub": "alice", "iss": "https://evil.test", "aud": "turnstone", "exp": now_secs() + 300});
            jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(JWT_SECRET.as_bytes()))
                .unwrap()
        })),
        ("JWT signed with another secret", host.with_token({
            let claims = json!({"sub": "alice", "iss": "https://id.test", "aud": "turnstone", "exp": now_secs() + 300});
            jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(b"not-the-secret")).unwrap()
        })),
    ];
    let not_found = (404, "session_not_found");
    let unauthorized = (401, "unauthorized");
    let expired = (401, "token_expired");
    let resume = json!({"type": "interrupt.resume", "interrupt_id": "int_none", "payload": "x"});
    let settle = json!({"type": "tool.result", "id": "call_none", "result": "x"});
    let turn_path = format!("/v1/sessions/as1/turns/{turn_id}");
    // (method, path, body, owner's answer, machine-of-the-agent's, admin's)
    let routes: Vec<Route> = vec![
        ("GET", "/v1/sessions/as1", None, (200, ""), not_found, (200, "")),
        ("GET", "/v1/sessions/as1/messages", None, (200, ""), not_found, (200, "")),
        ("GET", &turn_path, None, (200, ""), not_found, (200, "")),
        ("GET", "/v1/sessions/as1/events", None, (200, ""), not_found, (200, "")),
        ("GET", "/v1/sessions/as1/events/stream", None, (200, ""), not_found, (200, "")),
        ("GET", "/v1/sessions/as1/chat", None, (200, ""), not_found, (200, "")),
        // The owner gets past ownership to the engine, which knows no such interrupt.
        ("POST", "/v1/sessions/as1/inputs", Some(&resume), (404, "unknown_interrupt"), not_found, not_found),
        ("POST", "/v1/sessions/as1/cancel", None, (409, "no_active_turn"), not_found, not_found),
        (
            "POST",
            "/v1/sessions/as1/calls/settle",
            Some(&settle),
            (404, "unknown_call"),
            (404, "unknown_call"),
            not_found,
        ),
    ];
    let mut mismatches = Vec::new();
    for (method, path, body, owner, machine, admin) in &routes {
        for (who, client) in &callers {
            let expected = match *who {
                "owner" | "owner by JWT" => *owner,
                "machine of the agent" => *machine,
                "admin" => *admin,
                "other client"
                | "other client by JWT"
                | "machine of another agent"
                | "client named as the admin" => not_found,
                "expired JWT" => expired,
                _ => unauthorized,
            };
            let got = outcome(client, method, path, *body).await;
            if (got.0, got.1.as_str()) != expected {
                mismatches.push(format!("{method} {path} as {who}: got {got:?}, expected {expected:?}"));
            }
        }
    }
    // A session that does not exist answers every caller exactly as another's session does.
    for (who, client) in &callers[..3] {
        let got = outcome(client, "GET", "/v1/sessions/no-such-session", None).await;
        if got != (404, "session_not_found".to_owned()) {
            mismatches.push(format!("GET a missing session as {who}: got {got:?}"));
        }
    }
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));

    // Bob's own input to alice's session id cannot take it over, nor start a turn in it.
    let (status, body) = host.with_token("key-bob").submit("as1", &message("demo", "mine now")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("session_not_found")), "{body}");
    assert_eq!(
        alice.summary("as1").await.last_seq,
        host.with_token("key-root").summary("as1").await.last_seq
    );
    let summary: SessionSummary = alice.summary("as1").await;
    assert_eq!(summary.owner.as_deref(), Some("client:alice"));
    assert!(summary.active_turn.is_none(), "nobody else started a turn: {summary:?}");

    // Only the owner disposes of it: to everyone else it does not exist (an admin reads only).
    for (who, client) in callers.iter().filter(|(who, _)| !who.starts_with("owner")) {
        let (status, body) = client.delete("/v1/sessions/as1").await;
        assert!(matches!(status, 401 | 404), "DELETE as {who}: {status} {body}");
    }
    assert_eq!(alice.summary("as1").await.last_seq, summary.last_seq, "nothing was disposed");
    let (status, body) = alice.delete("/v1/sessions/as1").await;
    assert_eq!((status, &body), (200, &json!({"session_id": "as1", "disposed": ["as1"]})));
    let (status, body) = alice.get("/v1/sessions/as1").await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("session_not_found")), "{body}");
    // Its id is not used again, by anyone.
    let (status, body) = alice.submit("as1", &message("demo", "again")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("session_disposed")), "{body}");
    let (status, body) = alice.delete("/v1/sessions/as1").await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("session_not_found")), "{body}");
    host.stop().await;
}

#[tokio::test]
async fn listing_shows_each_caller_its_own() {
    let (host, _dir) = start().await;
    let alice = host.with_token("key-alice");
    let bob = host.with_token("key-bob");
    for (client, id) in [(&alice, "a1"), (&alice, "a2"), (&bob, "b1")] {
        let (status, body) = client.submit(id, &message("demo", "hi")).await;
        assert_eq!(status, 202, "{body}");
    }
    let ids = |page: SessionPage| {
        let mut ids: Vec<String> = page.sessions.into_iter().map(|s| s.session_id).collect();
        ids.sort();
        ids
    };
    let list = |client: &ApiClient, query: &'static str| {
        let client = client.clone();
        async move { client.get_ok::<SessionPage>(&format!("/v1/sessions{query}")).await }
    };
    assert_eq!(ids(list(&alice, "").await), ["a1", "a2"]);
    // A client cannot list another owner's sessions by asking for them.
    assert_eq!(ids(list(&alice, "?owner=bob").await), ["a1", "a2"]);
    assert_eq!(ids(list(&bob, "").await), ["b1"]);
    let root = host.with_token("key-root");
    assert_eq!(ids(list(&root, "").await), ["a1", "a2", "b1"]);
    assert_eq!(ids(list(&root, "?owner=client:bob").await), ["b1"]);
    let (status, body) = host.with_token("key-w-demo").get("/v1/sessions").await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")), "{body}");
    let (status, body) = host.get("/v1/sessions").await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("unauthorized")), "{body}");
    host.stop().await;
}

#[tokio::test]
async fn a_jwt_client_owns_its_sessions_and_its_claims_reach_the_worker_identity() {
    let (host, _dir) = start().await;
    let carol = host.with_token(jwt("carol", 300, json!({"plan": "pro", "email": "c@x.test"})));
    let (status, body) = carol.submit("c1", &message("demo", "hi")).await;
    assert_eq!(status, 202, "{body}");
    let summary = carol.summary("c1").await;
    assert_eq!(summary.owner.as_deref(), Some("client:carol"));
    let created = &carol.events("c1", 0).await[0].event;
    assert_eq!(created["type"], "session_created");
    // Only the claims the config names are kept.
    assert_eq!(created["init"]["identity"], json!({"id": "client:carol", "metadata": {"plan": "pro"}}));
    // A machine key cannot start sessions.
    let (status, body) = host.with_token("key-w-demo").submit("m1", &message("demo", "hi")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("session_not_found")), "{body}");
    host.stop().await;
}

#[tokio::test]
async fn without_auth_everything_stays_open() {
    let dir = tempfile::tempdir().unwrap();
    let config = CONFIG.split("[auth]").next().unwrap();
    let host = TestHost::start_with_env(config, dir.path(), |_| None).await;
    let turn_id = host.submit_ok("open1", &message("demo", "hi")).await;
    host.wait_turn("open1", &turn_id).await;
    // Any token, or none, reaches any session.
    for client in [(*host).clone(), host.with_token("anything")] {
        let (status, _) = client.get("/v1/sessions/open1").await;
        assert_eq!(status, 200);
    }
    let page: SessionPage = host.get_ok("/v1/sessions").await;
    assert_eq!(page.sessions.len(), 1);
    host.stop().await;
}

/// Who may settle which call, for every kind of caller: a client tool's call is its session's
/// client's to answer, a worker's call its agent's machine keys'. Each caller settles with an
/// attempt that is not the call's: one allowed past the rules reaches the engine, which refuses
/// it as `stale_attempt` (so nothing is settled and every caller sees the same calls); one the
/// rules refuse never gets there.
#[tokio::test(flavor = "multi_thread")]
async fn who_may_settle_which_call() {
    let gate = Gate::new();
    let held = gate.clone();
    let worker = FakeWorker::start(None, move |request, _| match &request.trigger {
        // The worker tool runs until the test is done with it.
        Trigger::ToolExecute(_) => FakeAnswer::held(&held, FakeAnswer::Status(500, "{}".to_owned())),
        _ => FakeAnswer::Accept,
    })
    .await;
    let plain = "[agent.other]\nmodel = \"scripted\"\nllm = \"s\"\n";
    assert!(CONFIG.contains(plain));
    let tools = format!(
        "[agent.other]\nmodel = \"scripted\"\nllm = \"s\"\nworker = \"{}\"\n\
         [[agent.other.tools]]\nname = \"slow\"\n[[agent.other.tools]]\nname = \"ask\"\nhandler = \"client\"\n",
        worker.url()
    );
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start_with_env(&CONFIG.replace(plain, &tools), dir.path(), env).await;
    let alice = host.with_token("key-alice");
    alice.submit_ok("st", &message("other", "/tool slow {}\n/tool ask {}")).await;
    let execute =
        worker.wait_for(std::time::Duration::from_secs(15), |r| r.trigger_name() == "tool.execute").await;
    let Trigger::ToolExecute(slow) = &execute.request.trigger else { unreachable!() };
    let summary = alice
        .wait_summary("st", std::time::Duration::from_secs(15), |s| !s.pending_client_calls.is_empty())
        .await;
    let ask = summary.pending_client_calls[0].id.to_string();
    let settle = |id: &str| json!({"type": "tool.result", "id": id, "attempt": 99, "result": "x"});
    let passes = (409, "stale_attempt");
    let (forbidden, not_found) = ((403, "settle_forbidden"), (404, "session_not_found"));
    // (caller, token, the client tool's call, the worker's call)
    let matrix: Vec<(&str, String, Expected, Expected)> = vec![
        ("owner", "key-alice".into(), passes, forbidden),
        ("owner by JWT", jwt("alice", 300, json!({})), passes, forbidden),
        ("other client", "key-bob".into(), not_found, not_found),
        ("client named as the admin", "key-root-client".into(), not_found, not_found),
        ("machine of the agent", "key-w-other".into(), forbidden, passes),
        ("machine of another agent", "key-w-demo".into(), not_found, not_found),
        ("admin", "key-root".into(), not_found, not_found),
        ("no key", String::new(), (401, "unauthorized"), (401, "unauthorized")),
    ];
    let mut mismatches = Vec::new();
    for (who, token, client_call, worker_call) in &matrix {
        let client = if token.is_empty() { (*host).clone() } else { host.with_token(token.clone()) };
        for (call, expected) in [(ask.as_str(), client_call), (slow.id.as_str(), worker_call)] {
            let got = outcome(&client, "POST", "/v1/sessions/st/calls/settle", Some(&settle(call))).await;
            if (got.0, got.1.as_str()) != *expected {
                mismatches.push(format!("{who} settling {call}: got {got:?}, expected {expected:?}"));
            }
        }
    }
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
    // Still open, both.
    let summary = alice.summary("st").await;
    assert_eq!(summary.pending_client_calls.len(), 1, "{summary:?}");
    gate.open();
    host.stop().await;
}

/// One leeway rule for every route that reads a token (issue 46): none. A JWT that expired 25 s
/// ago is refused over HTTP and at the WebSocket upgrade alike; one valid for 30 s more opens both.
#[tokio::test]
async fn a_token_just_past_its_expiry_is_refused_on_every_route() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let (host, _dir) = start().await;
    let upgrade = |token: String| {
        let url = format!("{}?tkn={token}", host.ahp_url());
        async move { tokio_tungstenite::connect_async(url.into_client_request().unwrap()).await.map(drop) }
    };
    let late = jwt("alice", -25, json!({}));
    let (status, body) = host.with_token(late.clone()).get("/v1/sessions").await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("token_expired")), "{body}");
    let refused = upgrade(late).await.unwrap_err();
    assert!(refused.to_string().contains("401"), "{refused}");

    let fresh = jwt("alice", 30, json!({}));
    let (status, body) = host.with_token(fresh.clone()).get("/v1/sessions").await;
    assert_eq!(status, 200, "{body}");
    upgrade(fresh).await.unwrap();
    host.stop().await;
}
