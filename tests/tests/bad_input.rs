//! Bad input at every route of the HTTP API: malformed JSON, wrong types, unknown
//! discriminators, oversized bodies, deep nesting, invalid UTF-8, huge strings, ids with path or
//! control characters, out-of-range numbers and bad query strings. Each gets a 4xx in the API's
//! error shape naming the problem (its `param` when a field or parameter is at fault), and
//! nothing is written: the store holds no session afterwards.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};
use turnstone_tests::TestHost;

const CONFIG: &str = r#"
[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
llm = "s"
"#;

/// One bad request and what it must get.
struct Case {
    what: &'static str,
    method: &'static str,
    path: String,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
    /// The `param` the error names (`None`: the error names none, e.g. a syntax error).
    param: Option<&'static str>,
    /// Words the message must hold.
    says: &'static str,
}

fn post(what: &'static str, path: &str, body: impl Into<Vec<u8>>) -> Case {
    Case {
        what,
        method: "POST",
        path: path.to_owned(),
        body: body.into(),
        status: 422,
        code: "invalid_request",
        param: None,
        says: "",
    }
}

fn get(what: &'static str, path: &str) -> Case {
    Case { method: "GET", ..post(what, path, Vec::new()) }
}

impl Case {
    fn answers(
        mut self,
        status: u16,
        code: &'static str,
        param: Option<&'static str>,
        says: &'static str,
    ) -> Self {
        (self.status, self.code, self.param, self.says) = (status, code, param, says);
        self
    }
}

fn message(extra: Value) -> Vec<u8> {
    let mut input =
        json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "x"}});
    input.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    input.to_string().into_bytes()
}

fn corpus() -> Vec<Case> {
    let inputs = "/v1/sessions/s-bad/inputs";
    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let huge = "x".repeat(2 * 1024 * 1024);
    vec![
        post("truncated JSON", inputs, "{\"type\": \"client.mess").answers(422, "invalid_request", Some("type"), "EOF"),
        post("an empty body", inputs, "").answers(422, "invalid_request", None, "EOF"),
        post("not an object", inputs, "[]").answers(422, "invalid_request", None, "expected an object"),
        post("a number for the type", inputs, r#"{"type": 5}"#).answers(422, "invalid_request", Some("type"), "string"),
        post("an unknown input type", inputs, r#"{"type": "client.nope"}"#).answers(
            422,
            "invalid_request",
            Some("type"),
            "unknown client input \"client.nope\"",
        ),
        post("a wrong type deep inside", inputs, message(json!({"message": {"role": "user", "content": 5}})))
            .answers(422, "invalid_request", Some("message.content"), "integer"),
        post("an unknown role", inputs, message(json!({"message": {"role": "robot", "content": "x"}})))
            .answers(422, "invalid_request", Some("message.role"), "robot"),
        post("a missing field", inputs, r#"{"type": "client.message", "agent_id": "demo"}"#)
            .answers(422, "invalid_request", Some("message"), "missing field"),
        post("an unknown field", inputs, message(json!({"colour": "blue"}))).answers(
            422,
            "invalid_request",
            Some("colour"),
            "unknown field",
        ),
        post(
            "nesting 10,000 deep",
            inputs,
            format!(r#"{{"type": "client.message", "agent_id": "demo", "stream": {deep}}}"#),
        )
        .answers(422, "invalid_request", Some("stream[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]..."), "recursion limit"),
        post("invalid UTF-8", inputs, b"{\"type\": \"client.message\", \"agent_id\": \"demo\", \"message\": {\"role\": \"user\", \"content\": \"\xff\xfe\"}}".to_vec())
            .answers(422, "invalid_request", None, "UTF-8"),
        post("a body past the limit", inputs, message(json!({"message": {"role": "user", "content": huge}})))
            .answers(413, "body_too_large", None, "exceeds"),
        post("a negative attempt", inputs, r#"{"type": "tool.result", "id": "c1", "attempt": -1}"#)
            .answers(422, "invalid_request", Some("attempt"), "-1"),
        post("an attempt past u32", inputs, r#"{"type": "tool.result", "id": "c1", "attempt": 4294967296}"#)
            .answers(422, "invalid_request", Some("attempt"), "4294967296"),
        post("a float attempt", inputs, r#"{"type": "tool.result", "id": "c1", "attempt": 1e40}"#)
            .answers(422, "invalid_request", Some("attempt"), "floating point"),
        post("a turn id with a slash and a NUL", inputs, message(json!({"turn_id": "a/b\u{0}"})))
            .answers(422, "invalid_request", Some("turn_id"), "not a turn id"),
        post("an empty turn id", inputs, message(json!({"turn_id": ""})))
            .answers(422, "invalid_request", Some("turn_id"), "not a turn id"),
        post("a turn id of 129 characters", inputs, message(json!({"turn_id": "t".repeat(129)})))
            .answers(422, "invalid_request", Some("turn_id"), "not a turn id"),
        post("a session id with an encoded slash", "/v1/sessions/a%2Fb/inputs", message(json!({})))
            .answers(400, "invalid_session_id", None, "session ids are"),
        post("a session id with a NUL", "/v1/sessions/a%00b/inputs", message(json!({})))
            .answers(400, "invalid_session_id", None, "session ids are"),
        post("queue and steer at once", &format!("{inputs}?queue=true&steer=true"), message(json!({})))
            .answers(422, "invalid_request", Some("steer"), "cannot both"),
        post("a non-boolean queue", &format!("{inputs}?queue=maybe"), message(json!({})))
            .answers(400, "invalid_query", Some("queue"), "`true` or `false`"),
        post("a settle without its result", "/v1/sessions/s-bad/calls/settle", r#"{"type": "tool.result", "id": "c1"}"#)
            .answers(422, "invalid_request", Some("result"), "missing field"),
        post("a settle of an unknown action", "/v1/sessions/s-bad/calls/settle", r#"{"type": "tool.maybe"}"#)
            .answers(422, "invalid_request", Some("type"), "tool.maybe"),
        post("a cancel reason of the wrong type", "/v1/sessions/s-bad/cancel", r#"{"reason": 5}"#)
            .answers(422, "invalid_request", Some("reason"), "string"),
        post("a fork without a turn", "/v1/sessions/s-bad/forks", r#"{"turn": "t1"}"#)
            .answers(422, "invalid_request", Some("turn"), "unknown field"),
        post("a fork into a bad session id", "/v1/sessions/s-bad/forks", r#"{"turn_id": "t1", "session_id": "../x"}"#)
            .answers(400, "invalid_session_id", None, "session ids are"),
        get("a limit that is not a number", "/v1/sessions?limit=abc").answers(400, "invalid_query", Some("limit"), "invalid digit"),
        get("a negative limit", "/v1/sessions?limit=-1").answers(400, "invalid_query", Some("limit"), "invalid digit"),
        get("a cursor that is not one", "/v1/sessions?cursor=%ff%fe").answers(400, "invalid_cursor", Some("cursor"), "cursor"),
        get("a wait that is not a number", "/v1/sessions/s-bad/turns/t1?wait=soon").answers(400, "invalid_query", Some("wait"), "float"),
        get("a wait that is not a length of time", "/v1/sessions/s-bad/turns/t1?wait=NaN").answers(400, "invalid_query", Some("wait"), "number of seconds"),
        get("a negative wait", "/v1/sessions/s-bad/turns/t1?wait=-8.2e307").answers(400, "invalid_query", Some("wait"), "0 or more"),
        get("an event position below zero", "/v1/sessions/s-bad/events?after=-5").answers(400, "invalid_query", Some("after"), "invalid digit"),
        get("a turn count that is not a number", "/v1/sessions/s-bad/chat?turns=x").answers(400, "invalid_query", Some("turns"), "invalid digit"),
        get("a tree flag that is neither", "/v1/sessions/s-bad/messages?tree=maybe").answers(400, "invalid_query", Some("tree"), "maybe"),
        get("a session path that climbs", "/v1/sessions/..%2f..%2fetc/messages").answers(404, "session_not_found", None, "does not exist"),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_refuses_bad_input_clearly_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    let mut failures = Vec::new();
    for case in corpus() {
        let (status, answer) = match case.method {
            "GET" => host.get(&case.path).await,
            _ => host.post_raw(&case.path, case.body.clone()).await,
        };
        let error = &answer["error"];
        let ok = status == case.status
            && error["code"] == case.code
            && error.get("param").and_then(Value::as_str) == case.param
            && error["message"].as_str().is_some_and(|m| m.contains(case.says));
        if !ok {
            failures.push(format!("{}: {} {} -> {status} {answer}", case.what, case.method, case.path));
        }
    }
    assert!(failures.is_empty(), "{} case(s) answered otherwise:\n{}", failures.len(), failures.join("\n"));
    let (status, listed) = host.get("/v1/sessions").await;
    assert_eq!((status, &listed["sessions"]), (200, &json!([])), "nothing was written");
    host.stop().await;
}

const LIMITED: &str = r#"
[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
llm = "s"

[limits]
message_bytes = 200
messages_per_input = 3
queued_turns = 1
sessions_per_owner = 2

[auth]
api_keys_env = "KEYS"
"#;

/// `[limits]` over HTTP: each limit crossed is refused, naming it, and writes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn limits_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestHost::start_with_env(LIMITED, dir.path(), |name| {
        (name == "KEYS").then(|| "alice:key-a".to_owned())
    })
    .await;
    let host = server.with_token("key-a");
    let (status, body) = host
        .post_raw(
            "/v1/sessions/l1/inputs",
            message(json!({"message": {"role": "user", "content": "x".repeat(300)}})),
        )
        .await;
    assert_eq!((status, body["error"]["param"].as_str()), (422, Some("message.content")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("limits.message_bytes"), "{body}");
    let view = json!({"type": "client.messages", "agent_id": "demo",
        "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"}, {"role": "user", "content": "d"}]});
    let (status, body) = host.submit("l1", &view).await;
    assert_eq!((status, body["error"]["param"].as_str()), (422, Some("messages")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("limits.messages_per_input"), "{body}");
    let (_, listed) = host.get("/v1/sessions").await;
    assert_eq!(listed["sessions"], json!([]), "refused inputs create nothing");

    // The quota: two sessions, not a third.
    for id in ["l1", "l2"] {
        host.submit_ok(id, &json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "hi"}})).await;
    }
    let (status, body) = host.submit("l3", &json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "hi"}})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("too_many_sessions")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("limits.sessions_per_owner"), "{body}");
    let (status, _) = host.get("/v1/sessions/l3").await;
    assert_eq!(status, 404, "the refused session was not created");
    server.stop().await;
}

/// A page of messages that starts after a message the session does not have (the tree), or
/// one that is not on the active path, is refused, naming it; a page after the last message
/// is empty and the last.
#[tokio::test(flavor = "multi_thread")]
async fn a_page_of_messages_after_a_message_it_cannot_place_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    let input =
        json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "hi"}});
    let turn = host.submit_ok("s-pages", &input).await;
    host.wait_turn("s-pages", &turn).await;
    let (status, body) = host.get("/v1/sessions/s-pages/messages?tree=1&after=msg_none").await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("unknown_message")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("msg_none"), "{body}");
    let (status, body) = host.get("/v1/sessions/s-pages/messages?after=msg_none").await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("not_on_active_path")), "{body}");
    let messages = host.messages("s-pages").await;
    let last = messages.last().unwrap()["id"].as_str().unwrap().to_owned();
    let (status, page) = host.get(&format!("/v1/sessions/s-pages/messages?after={last}&limit=1")).await;
    assert_eq!((status, page["messages"].as_array().map(Vec::len)), (200, Some(0)), "{page}");
    assert!(page.get("next_after").is_none(), "the last page: {page}");
    host.stop().await;
}
