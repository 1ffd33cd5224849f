//! The HTTP API's OpenAPI 3.1 document, generated (feature `openapi`): `openapi.json` at the
//! repository root is its output, and `GET /v1/openapi.json` serves that file.
//!
//! The schemas come from the types, through `schemars`, the same derive that generates the
//! protocol's `schema/*.json`: the API's bodies ([`crate::api`]) derive `JsonSchema` under this
//! feature, and the protocol types they carry (`ClientInput`, `Action`, `Message`, ...) bring
//! the derives the engine's `schema` feature gives them, tidied by the same
//! [`turnstone_engine::schema::tidied`]. So a protocol type's schema under
//! `components/schemas` is the one in `schema/` (a test checks it), with one derive to keep in
//! step with the hand-written parsers, not two. OpenAPI 3.1's schema objects are JSON Schema
//! 2020-12, which is what schemars writes.
//!
//! What the types cannot say is written here, once per route: the paths (checked against the
//! router's list, [`crate::http::route_paths`]), their parameters, and which statuses each
//! answers. Two bodies are described rather than derived: a log event (the engine's `Event`,
//! a large internal enum: documented as an object with its `type`) and the AHP `ChatState`
//! (defined by the Agent Host Protocol's own crate).

use std::borrow::Cow;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::{Map, Value, json};
use turnstone_engine::protocol::{Action, ClientInput, MessageTree};

use crate::api::{
    ActivePath, CancelRequest, Cancelled, CreateSessionRequest, CreatedSession, Disposed, ErrorBody,
    EventPage, ForkRequest, Forked, SessionPage, SessionSummary, Settled, Submitted, TokenDelta, Turn,
};

/// The command that rewrites `openapi.json` from the code.
pub const REGENERATE: &str = "cargo run -p turnstone-runtime --features openapi --example openapi -- --write";

/// The document's file, relative to the repository root.
pub const FILE: &str = "openapi.json";

/// What a new session's id must match (`turnstone_engine::ids::is_safe`).
const SAFE_ID_PATTERN: &str = "^[A-Za-z0-9._:-]{1,128}$";

/// The schema of [`crate::api::ForkRequest`]'s `session_id`: a new session's id, or none.
pub(crate) fn new_session_id(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": ["string", "null"], "pattern": SAFE_ID_PATTERN })
}

/// An event of a session's log, as the API shows it: an object named by its `type`.
struct LogEvent;

impl JsonSchema for LogEvent {
    fn schema_name() -> Cow<'static, str> {
        "Event".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A fact of the session's log (the engine's `Event`), named by its `type` \
                (`session_created`, `turn_started`, `message_recorded`, `call_created`, \
                `turn_ended`, ...); its other fields depend on the type. The log's event types \
                grow with the engine: a client ignores types and fields it does not know.",
            "type": "object",
            "properties": { "type": { "type": "string" } },
            "required": ["type"]
        })
    }
}

/// `GET /v1/sessions/{id}/chat`'s body: the Agent Host Protocol's `ChatState`.
struct ChatState;

impl JsonSchema for ChatState {
    fn schema_name() -> Cow<'static, str> {
        "ChatState".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "The session as an Agent Host Protocol `ChatState` (its active path): \
                turns with their message, reply parts, tool calls, usage and end state, newest \
                last, and `turnsNextCursor` for older turns. Its schema is the Agent Host \
                Protocol's.",
            "type": "object"
        })
    }
}

/// One operation of a path.
struct Op {
    method: &'static str,
    path: &'static str,
    id: &'static str,
    summary: &'static str,
    description: &'static str,
    params: Vec<Value>,
    /// The body's schema and whether it is required.
    body: Option<(Value, bool)>,
    /// Success answers: status, description, content (`None`: no body).
    ok: Vec<(u16, &'static str, Option<Value>)>,
    /// Error statuses, each a `components/responses` entry ([`error_responses`]).
    errors: &'static [u16],
    /// Whether `[auth]` applies (everything but the health check and this document).
    auth: bool,
    /// The first success answer's links to other operations (OpenAPI `links`).
    links: Value,
    /// An example body.
    example: Option<Value>,
}

fn json_content(schema: Value) -> Option<Value> {
    Some(json!({ "application/json": { "schema": schema } }))
}

fn path_param(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": schema })
}

fn query_param(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema })
}

fn session_param() -> Value {
    path_param("id", "The session's id.", json!({ "type": "string" }))
}

/// The error answers, by status: every one is `ErrorBody`, with the codes it may carry.
fn error_responses() -> Vec<(u16, &'static str, &'static str)> {
    vec![
        (
            400,
            "BadRequest",
            "A malformed request: `invalid_query` (a query parameter, named by `param`), \
             `invalid_cursor`, `invalid_session_id` (session ids are 1-128 characters of A-Z, a-z, \
             0-9, '-', '_', '.', ':'), `invalid_body` (a body that could not be read).",
        ),
        (
            401,
            "Unauthorized",
            "With `[auth]` configured, no valid bearer token: `unauthorized`, `token_expired`.",
        ),
        (
            403,
            "Forbidden",
            "The caller may not do this: `forbidden` (a machine key only settles calls; with auth \
             on, only an admin key reads `/metrics`), `settle_forbidden` (a client settles only \
             its client tools' calls, a machine key only the calls its worker runs), \
             `cross_origin` (a host without `[auth]` takes state-changing requests and WebSocket \
             upgrades only from its own pages).",
        ),
        (
            404,
            "NotFound",
            "`session_not_found` (also for a session the caller may not reach), `turn_not_found`, \
             `unknown_agent`, `unknown_call`, `unknown_interrupt`.",
        ),
        (
            409,
            "Conflict",
            "The session's state refuses it: `turn_already_active`, `stale_attempt`, \
             `call_already_settled`, `call_voided`, `branch_paused`, `not_awaiting_approval`, \
             `session_disposed`, `queue_full`, `too_many_sessions`, ...",
        ),
        (413, "PayloadTooLarge", "The body is over `[server] max_body_bytes`: `body_too_large`."),
        (
            422,
            "UnprocessableEntity",
            "The body is not a valid message of its type, or over a limit: `invalid_request`, \
             `param` naming the field (e.g. `message.role`); `agent_mismatch`.",
        ),
        (
            415,
            "UnsupportedMediaType",
            "On a host without `[auth]`, a body that is not declared JSON (`Content-Type: \
             application/json`): `unsupported_media_type`.",
        ),
        (
            421,
            "MisdirectedRequest",
            "On a host without `[auth]`, a `Host` that is neither a loopback name nor the host's \
             own address: `misdirected_request`.",
        ),
        (426, "UpgradeRequired", "Not a WebSocket upgrade: `websocket_required`."),
        (
            429,
            "TooManyRequests",
            "The caller holds as many as its limit allows open: `too_many_streams` \
             (`[limits] streams_per_caller`), `too_many_sockets` (`sockets_per_caller`).",
        ),
        (500, "InternalServerError", "The session's log could not be projected: `internal`."),
        (
            503,
            "ServiceUnavailable",
            "The store or queue failed, or the session stayed too busy; retry later: \
             `unavailable`, `contended`.",
        ),
    ]
}

fn operations(g: &mut SchemaGenerator) -> Vec<Op> {
    let mut schema = |f: fn(&mut SchemaGenerator) -> Schema| f(g).to_value();
    let submitted = schema(|g| g.subschema_for::<Submitted>());
    let client_input = schema(|g| g.subschema_for::<ClientInput>());
    let summary = schema(|g| g.subschema_for::<SessionSummary>());
    let disposed = schema(|g| g.subschema_for::<Disposed>());
    let active_path = schema(|g| g.subschema_for::<ActivePath>());
    // `TreePage`: the protocol's `MessageTree` and the page's `next_after`.
    let tree = json!({ "allOf": [
        schema(|g| g.subschema_for::<MessageTree>()),
        { "type": "object", "properties": { "next_after": {
            "type": "string",
            "description": "Pass as `?after=` for the next page; absent on the last.",
        } } },
    ] });
    let turn = schema(|g| g.subschema_for::<Turn>());
    let events = schema(|g| g.subschema_for::<EventPage<LogEvent>>());
    let chat = schema(|g| g.subschema_for::<ChatState>());
    let action = schema(|g| g.subschema_for::<Action>());
    let settled = schema(|g| g.subschema_for::<Settled>());
    let cancel = schema(|g| g.subschema_for::<CancelRequest>());
    let cancelled = schema(|g| g.subschema_for::<Cancelled>());
    let fork = schema(|g| g.subschema_for::<ForkRequest>());
    let create_session = schema(|g| g.subschema_for::<CreateSessionRequest>());
    let created = schema(|g| g.subschema_for::<CreatedSession>());
    let forked = schema(|g| g.subschema_for::<Forked>());
    let page = schema(|g| g.subschema_for::<SessionPage>());
    // Named in the event stream's description; listed under `components/schemas` by this.
    schema(|g| g.subschema_for::<TokenDelta>());
    // Read as `usize` and `u64` (this host is 64-bit): a larger number is a 400.
    let count = json!({ "type": "integer", "minimum": 0, "maximum": u64::MAX });
    let seq = json!({ "type": "integer", "minimum": 0, "maximum": u64::MAX });
    vec![
        Op {
            method: "get",
            path: "/v1/sessions",
            id: "listSessions",
            summary: "List sessions, newest first",
            description: "With `[auth]`, a client key lists its own sessions, an admin key any \
                owner's; a machine key is refused.",
            params: vec![
                query_param("agent", "Only this agent's sessions.", json!({ "type": "string" })),
                query_param(
                    "owner",
                    "Only this owner's (an admin key's filter).",
                    json!({ "type": "string" }),
                ),
                query_param(
                    "cursor",
                    "A page's `next_cursor`: the sessions after it.",
                    json!({ "type": "string" }),
                ),
                query_param("limit", "Sessions per page: default 50, at most 500.", count.clone()),
            ],
            body: None,
            ok: vec![(200, "A page of sessions.", json_content(page))],
            errors: &[400, 401, 403, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "post",
            path: "/v1/sessions",
            id: "createSession",
            summary: "Create a session, with no turn yet",
            description: "Owned by the caller. Session ids are global: without `session_id` the \
                host mints one no one can guess (`s-<32 hex>`). An id of the caller's own session \
                answers 200 with it (a retried create); an id taken by a session the caller may \
                not reach answers 404, as every route does.",
            params: vec![],
            body: Some((create_session, true)),
            ok: vec![
                (201, "Created.", json_content(created.clone())),
                (200, "The caller's session of that id exists already.", json_content(created)),
            ],
            errors: &[400, 401, 404, 409, 413, 422, 503],
            auth: true,
            links: Value::Null,
            example: Some(json!({ "agent_id": "demo" })),
        },
        Op {
            method: "get",
            path: "/v1/sessions/{id}",
            id: "getSession",
            summary: "A session at a glance",
            description: "Agent, status, active turn, queued turns, open interrupts, pending client \
                calls, calls awaiting approval, usage, cost and `last_seq`.",
            params: vec![session_param()],
            body: None,
            ok: vec![(200, "The session's summary.", json_content(summary))],
            errors: &[401, 404, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "delete",
            path: "/v1/sessions/{id}",
            id: "disposeSession",
            summary: "Dispose of a session and the sub-agent sessions it started",
            description: "Deleted from the store for good; work in flight stops at its next commit. \
                The id is never used again: a later input answers 409 `session_disposed`.",
            params: vec![session_param()],
            body: None,
            ok: vec![(200, "What was disposed.", json_content(disposed))],
            errors: &[401, 404, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "post",
            path: "/v1/sessions/{id}/inputs",
            id: "submitInput",
            summary: "Submit a client input",
            description: "The first input creates the session. While a turn runs, a turn-starting \
                input is refused (409 `turn_already_active`) unless queued (`?queue=true`) or \
                steering (`?steer=true`, a `client.message` only). An input naming a known \
                `turn_id` returns that turn and writes nothing.",
            params: vec![
                path_param(
                    "id",
                    "The session's id: 1-128 characters of A-Z, a-z, 0-9, '-', '_', '.', ':'.",
                    json!({ "type": "string", "pattern": SAFE_ID_PATTERN }),
                ),
                query_param(
                    "queue",
                    "Queue the turn behind the active one (not with `steer`).",
                    json!({ "type": "boolean" }),
                ),
                query_param(
                    "steer",
                    "Steer the active turn: the message enters it at its next safe point.",
                    json!({ "type": "boolean" }),
                ),
            ],
            body: Some((client_input, true)),
            ok: vec![(
                202,
                "Accepted: the turn the input started, joined or named.",
                json_content(submitted),
            )],
            errors: &[400, 401, 404, 409, 413, 422, 503],
            auth: true,
            // What a client does next with the session it wrote to (and what schemathesis's
            // stateful phase follows, reaching real sessions and turns).
            links: submit_links(),
            example: Some(json!({
                "type": "client.message",
                "agent_id": "demo",
                "message": { "role": "user", "content": "hello" },
            })),
        },
        Op {
            method: "get",
            path: "/v1/sessions/{id}/messages",
            id: "getMessages",
            summary: "The conversation",
            description: "A page of the active path, root first; with `?tree=1` a page of the \
                message tree's nodes, parents before children. A page holds at most `limit` \
                messages and at most 4 MiB of them (one at least); `next_after`, absent on the \
                last page, is the `after` of the next. An `after` no longer on the active path \
                (an edit moved it) is 409 `not_on_active_path`.",
            params: vec![
                session_param(),
                query_param(
                    "tree",
                    "`1` or `true`: the whole tree, every branch.",
                    json!({ "type": "string", "enum": ["0", "1", "false", "true"] }),
                ),
                query_param(
                    "after",
                    "The `next_after` of the page before: the page starts after that message.",
                    json!({ "type": "string" }),
                ),
                query_param("limit", "Messages per page: default 500, at most 1000.", count.clone()),
            ],
            body: None,
            ok: vec![(
                200,
                "The active path (`messages`), or the tree (`nodes`) with `?tree=1`.",
                json_content(json!({ "anyOf": [active_path, tree] })),
            )],
            errors: &[400, 401, 404, 409, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "get",
            path: "/v1/sessions/{id}/turns/{turn_id}",
            id: "getTurn",
            summary: "A turn's status and result",
            description: "With `?wait=s`, a long-poll: answers when the turn ends or after `s` \
                seconds (at most 60; 25 on AWS, under API Gateway's 30).",
            params: vec![
                session_param(),
                path_param("turn_id", "The turn's id.", json!({ "type": "string" })),
                query_param(
                    "wait",
                    "Seconds to wait for the turn to end (cut to the host's maximum).",
                    json!({ "type": "number", "minimum": 0 }),
                ),
            ],
            body: None,
            ok: vec![(200, "The turn.", json_content(turn))],
            errors: &[400, 401, 404, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "get",
            path: "/v1/sessions/{id}/events",
            id: "getEvents",
            summary: "The durable log",
            description: "A page of the session's events after `after`, in order.",
            params: vec![
                session_param(),
                query_param("after", "The last sequence number seen (default 0).", seq.clone()),
                query_param("limit", "Events per page: default 500, at most 1000.", count.clone()),
            ],
            body: None,
            ok: vec![(200, "A page of the log.", json_content(events))],
            errors: &[400, 401, 404, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "get",
            path: "/v1/sessions/{id}/events/stream",
            id: "streamEvents",
            summary: "The log as Server-Sent Events",
            description: "Every durable event as a frame (`id`: its sequence number, `event`: its \
                type, `data`: the event as JSON), then new ones as they are committed, with \
                coalesced `llm.token.delta` frames (no `id`; `data`: a `TokenDelta`) in between. \
                Resumable with `Last-Event-ID` (or `?after=`). The stream does not end.",
            params: vec![
                session_param(),
                query_param("after", "Start after this sequence number.", seq),
                json!({
                    "name": "Last-Event-ID", "in": "header", "required": false,
                    "description": "Resume after this sequence number (wins over `after`).",
                    "schema": { "type": "string" }
                }),
            ],
            body: None,
            ok: vec![(
                200,
                "The event stream.",
                Some(json!({ "text/event-stream": { "schema": { "type": "string" } } })),
            )],
            errors: &[400, 401, 404, 429, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "get",
            path: "/v1/sessions/{id}/chat",
            id: "getChat",
            summary: "The session as an Agent Host Protocol chat",
            description: "Its active path as a `ChatState`: the newest turns (50 unless `turns` \
                says otherwise), `turnsNextCursor` for older ones.",
            params: vec![
                session_param(),
                query_param("turns", "How many turns: default 50, at most 500.", count.clone()),
                query_param(
                    "cursor",
                    "A page's `turnsNextCursor`: the turns before it.",
                    json!({ "type": "string" }),
                ),
            ],
            body: None,
            ok: vec![(200, "The chat.", json_content(chat))],
            errors: &[400, 401, 404, 500, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "post",
            path: "/v1/sessions/{id}/calls/settle",
            id: "settleCall",
            summary: "A worker settles a deferred call",
            description: "`tool.result`, `tool.error`, `llm.result` or `llm.error`, fenced by the \
                call's attempt.",
            params: vec![session_param()],
            body: Some((action, true)),
            ok: vec![(202, "Accepted.", json_content(settled))],
            errors: &[400, 401, 403, 404, 409, 413, 422, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "post",
            path: "/v1/sessions/{id}/cancel",
            id: "cancelTurn",
            summary: "End the active turn",
            description: "Open work is voided and unanswered tool calls get an error result. The \
                body is optional.",
            params: vec![session_param()],
            body: Some((cancel, false)),
            ok: vec![(202, "Accepted: the turn that ended, if one was active.", json_content(cancelled))],
            errors: &[400, 401, 404, 409, 413, 422, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "post",
            path: "/v1/sessions/{id}/forks",
            id: "forkSession",
            summary: "Fork the conversation through a completed turn",
            description: "A new session continuing this one's conversation through `turn_id`.",
            params: vec![session_param()],
            body: Some((fork, true)),
            ok: vec![
                (201, "The fork was made.", json_content(forked.clone())),
                (200, "That fork exists already.", json_content(forked)),
            ],
            errors: &[400, 401, 404, 409, 413, 422, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "get",
            path: "/v1/ahp",
            id: "agentHostProtocol",
            summary: "The Agent Host Protocol over a WebSocket",
            description: "A WebSocket upgrade (`Connection: Upgrade`, `Upgrade: websocket`), then \
                AHP's JSON-RPC; a plain GET is refused with 426.",
            params: vec![],
            body: None,
            ok: vec![(101, "Switching to the WebSocket.", None)],
            errors: &[401, 426, 429],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "get",
            path: "/v1/openapi.json",
            id: "getOpenApi",
            summary: "This document",
            description: "The HTTP API's OpenAPI 3.1 document.",
            params: vec![],
            body: None,
            ok: vec![(200, "The document.", json_content(json!({ "type": "object" })))],
            errors: &[],
            auth: false,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "get",
            path: "/metrics",
            id: "getMetrics",
            summary: "Metrics",
            description: "The host's counters in the Prometheus text format: turns, steps, decision deliveries, \
                          call attempts and latency, tokens, cost, sessions with work due. With auth on, only \
                          an admin key reads them.",
            params: vec![],
            body: None,
            ok: vec![(
                200,
                "The counters.",
                Some(json!({ "text/plain": { "schema": { "type": "string" } } })),
            )],
            errors: &[401, 403, 503],
            auth: true,
            links: Value::Null,
            example: None,
        },
        Op {
            method: "get",
            path: "/healthz",
            id: "health",
            summary: "Liveness",
            description: "`ok` while the host serves.",
            params: vec![],
            body: None,
            ok: vec![(
                200,
                "The host is up.",
                Some(json!({ "text/plain": { "schema": { "type": "string", "const": "ok" } } })),
            )],
            errors: &[],
            auth: false,
            links: Value::Null,
            example: None,
        },
        console_op("/", "getConsole", "The web console", "text/html"),
        console_op("/console/app.js", "getConsoleScript", "The web console's script", "text/javascript"),
        console_op("/console/app.css", "getConsoleStyle", "The web console's style sheet", "text/css"),
    ]
}

/// A file of the web console: open (it holds no data; the API it calls asks for the key).
fn console_op(path: &'static str, id: &'static str, summary: &'static str, media: &str) -> Op {
    Op {
        method: "get",
        path,
        id,
        summary,
        description: "A static file of the web console, embedded in the host. The console calls \
            only this API.",
        params: vec![],
        body: None,
        ok: vec![(200, "The file.", Some(json!({ media: { "schema": { "type": "string" } } })))],
        errors: &[],
        auth: false,
        links: Value::Null,
        example: None,
    }
}

/// From a submitted input to the session's and the turn's other operations.
fn submit_links() -> Value {
    let session = json!({ "id": "$request.path.id" });
    let turn = json!({ "id": "$request.path.id", "turn_id": "$response.body#/turn_id" });
    let mut links = Map::new();
    for (name, operation, parameters) in [
        ("GetTurn", "getTurn", &turn),
        ("GetSession", "getSession", &session),
        ("GetMessages", "getMessages", &session),
        ("GetEvents", "getEvents", &session),
        ("GetChat", "getChat", &session),
        ("CancelTurn", "cancelTurn", &session),
        ("ForkSession", "forkSession", &session),
        ("DisposeSession", "disposeSession", &session),
    ] {
        links.insert(name.to_owned(), json!({ "operationId": operation, "parameters": parameters }));
    }
    Value::Object(links)
}

/// The document.
pub fn document() -> Value {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
    });
    let mut generator = SchemaGenerator::new(settings);
    let operations = operations(&mut generator);
    let error_body = generator.subschema_for::<ErrorBody>().to_value();
    let errors = error_responses();
    let mut paths = Map::new();
    for op in operations {
        let mut responses = Map::new();
        for (i, (status, description, content)) in op.ok.into_iter().enumerate() {
            let mut response = json!({ "description": description });
            if let Some(content) = content {
                response["content"] = content;
            }
            if i == 0 && !op.links.is_null() {
                response["links"] = op.links.clone();
            }
            responses.insert(status.to_string(), response);
        }
        // What a host without `[auth]` refuses before any route runs (`http::OpenHost`).
        let changes_state = op.method != "get" || op.path == "/v1/ahp";
        let open_host: &[u16] = match (changes_state, op.body.is_some()) {
            (true, true) => &[403, 415, 421],
            (true, false) => &[403, 421],
            (false, _) => &[421],
        };
        for status in op.errors.iter().chain(open_host) {
            let name = errors.iter().find(|(s, ..)| s == status).map_or("", |(_, name, _)| *name);
            responses.insert(status.to_string(), json!({ "$ref": format!("#/components/responses/{name}") }));
        }
        let mut operation = json!({
            "operationId": op.id,
            "summary": op.summary,
            "description": op.description,
            "responses": responses,
        });
        if !op.params.is_empty() {
            operation["parameters"] = Value::Array(op.params);
        }
        if let Some((schema, required)) = op.body {
            let mut media = json!({ "schema": schema });
            if let Some(example) = op.example {
                media["example"] = example;
            }
            operation["requestBody"] =
                json!({ "required": required, "content": { "application/json": media } });
        }
        if !op.auth {
            // No security requirement: open even with `[auth]`.
            operation["security"] = json!([]);
        }
        let item = paths.entry(op.path).or_insert_with(|| json!({}));
        item[op.method] = operation;
    }
    let responses: Map<String, Value> = errors
        .into_iter()
        .map(|(_, name, description)| {
            let response = json!({
                "description": description,
                "content": { "application/json": { "schema": error_body.clone() } },
            });
            (name.to_owned(), response)
        })
        .collect();
    let schemas = generator.take_definitions(true);
    let document = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Turnstone HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Turnstone runs AI agent sessions durably. Every error is \
                `{\"error\": {\"code\", \"message\", \"param\"?}}` with its status. With `[auth]` \
                in the host's configuration every route but `/healthz` and this document needs \
                a bearer token (a client key, a JWT, a machine or an admin key); without it the \
                host is open.",
            "license": { "name": "Apache-2.0", "identifier": "Apache-2.0" },
        },
        // Either no credentials (a host without `[auth]`) or a bearer token.
        "security": [{}, { "bearer": [] }],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": responses,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A client, machine or admin key, or an HS256 JWT (`[auth]`).",
                },
            },
        },
    });
    turnstone_engine::schema::tidied(document)
}

/// The file's exact text: pretty JSON, keys sorted, one trailing newline.
pub fn text() -> String {
    // Serializing a `Value` cannot fail (its keys are strings).
    let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The committed file (which the host serves) is what the code generates today.
    #[test]
    fn committed_document_is_what_the_code_generates() {
        let generated = text();
        let committed = crate::http::openapi::DOCUMENT;
        if committed != generated {
            let line = committed
                .lines()
                .zip(generated.lines())
                .position(|(a, b)| a != b)
                .map_or_else(|| committed.lines().count().min(generated.lines().count()) + 1, |i| i + 1);
            panic!(
                "{FILE} differs from what the code generates (from line {line}); regenerate it with: \
                 {REGENERATE}"
            );
        }
    }

    /// The document's paths are the router's, no more and no fewer.
    #[test]
    fn every_route_is_documented_and_nothing_else() {
        let document = document();
        let documented: BTreeSet<&str> =
            document["paths"].as_object().map(|p| p.keys().map(String::as_str).collect()).unwrap_or_default();
        let routed: BTreeSet<&str> = crate::http::route_paths().into_iter().collect();
        assert_eq!(documented, routed, "the OpenAPI paths and the router's routes differ");
    }

    /// Every `$ref` in the document resolves, and every error status names a response.
    #[test]
    fn every_reference_resolves() {
        fn refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
            match value {
                Value::Object(map) => {
                    if let Some(Value::String(r)) = map.get("$ref") {
                        out.push(r);
                    }
                    map.values().for_each(|v| refs(v, out));
                }
                Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let document = document();
        let mut found = Vec::new();
        refs(&document, &mut found);
        assert!(found.len() > 50, "only {} references", found.len());
        for r in found {
            let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{r} is not local"));
            assert!(document.pointer(pointer).is_some(), "{r} resolves to nothing");
        }
    }

    /// A protocol type's schema here is the one in `schema/` (its `$ref`s aside): one derive,
    /// one schema.
    #[test]
    fn protocol_schemas_are_those_of_schema_dir() {
        let document = document();
        let components = &document["components"]["schemas"];
        let mut compared = BTreeSet::new();
        // `decision-response.json` is the lenient reading of a worker's answer, not these types'.
        for doc in turnstone_engine::schema::documents() {
            if doc.file == "decision-response.json" {
                continue;
            }
            let text =
                serde_json::to_string(&doc.schema).unwrap().replace("#/$defs/", "#/components/schemas/");
            let mut schema: Value = serde_json::from_str(&text).unwrap();
            let defs = schema.as_object_mut().and_then(|s| s.remove("$defs")).unwrap_or_default();
            let root = schema["title"].as_str().unwrap_or_default().to_owned();
            let mut root_schema = schema.as_object().cloned().unwrap_or_default();
            root_schema.remove("$schema");
            root_schema.remove("title");
            let mut all: Vec<(String, Value)> =
                defs.as_object().cloned().unwrap_or_default().into_iter().collect();
            all.push((root, Value::Object(root_schema)));
            for (name, schema) in all {
                if let Some(component) = components.get(&name) {
                    assert_eq!(component, &schema, "{name} differs from its schema in schema/{}", doc.file);
                    compared.insert(name);
                }
            }
        }
        for name in ["ClientInput", "Action", "Message", "MessageTree", "DraftMessage", "StreamDelta"] {
            assert!(compared.contains(name), "{name} was not compared (compared: {compared:?})");
        }
    }
}
