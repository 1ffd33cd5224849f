//! Against the MCP Python SDK's server (tests/mcp/server.py), over Streamable HTTP and stdio.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

mod common;

use std::time::{Duration, Instant};

use common::{HttpServer, Log, args, free_port, http_spec, python_stdio_command, stdio_spec};
use serde_json::json;
use turnstone_mcp::{Delivery, McpError, ServerSpec, Servers, Transport};

const TIMEOUT: Duration = Duration::from_secs(20);

fn pool(spec: ServerSpec) -> Servers {
    Servers::new(vec![spec])
}

#[tokio::test]
async fn lists_tools_with_their_hints_and_output_schema() {
    let server = HttpServer::python(free_port(), None, None);
    let servers = pool(http_spec("py", server.port, TIMEOUT));
    let tools = servers.list_tools("py").await.unwrap();
    let tool = |name: &str| {
        tools.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name} in {tools:?}"))
    };
    let names: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
    for name in ["echo", "add", "fail", "delete_note", "slow", "enable_extra", "image"] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }

    let echo = tool("echo");
    assert!(echo.hints.read_only);
    // Not said, so the spec's defaults.
    assert!(echo.hints.destructive && !echo.hints.idempotent && echo.hints.open_world);
    assert_eq!(echo.description.as_deref(), Some("Returns its text."));
    assert_eq!(echo.input_schema["properties"]["text"]["type"], "string");

    let delete = tool("delete_note");
    assert!(!delete.hints.read_only && delete.hints.destructive);
    assert!(delete.hints.idempotent && !delete.hints.open_world);

    let add = tool("add");
    let output = add.output_schema.as_ref().expect("add has an output schema");
    assert!(output["properties"].get("sum").is_some(), "{output}");
}

#[tokio::test]
async fn calls_tools_and_reads_their_results() {
    let server = HttpServer::python(free_port(), None, None);
    let servers = pool(http_spec("py", server.port, TIMEOUT));

    let echo = servers.call_tool("py", "echo", args(json!({"text": "hello"}))).await.unwrap();
    assert!(!echo.is_error);
    assert_eq!(echo.text(), "hello");
    assert_eq!(echo.content, vec![json!({"type": "text", "text": "hello"})]);

    let add = servers.call_tool("py", "add", args(json!({"a": 2, "b": 3.5}))).await.unwrap();
    assert_eq!(add.structured, Some(json!({"sum": 5.5})));
    assert!(add.text().contains("5.5"), "{}", add.text());
    // The SDK sends the structured content as text too: the model reads it once.
    assert_eq!(add.text().matches("5.5").count(), 1, "{}", add.text());

    // A sentence beside structured content: the model reads both (issue 46).
    let tally = servers.call_tool("py", "tally", args(json!({"a": 2, "b": 3}))).await.unwrap();
    assert_eq!(tally.structured, Some(json!({"total": 5.0, "terms": [2.0, 3.0]})));
    assert_eq!(tally.text(), "The total of the two is 5.\n{\"terms\":[2.0,3.0],\"total\":5.0}");

    // A tool execution error is a result the model reads (spec "Tools", error handling).
    let fail = servers.call_tool("py", "fail", args(json!({"message": "disk full"}))).await.unwrap();
    assert!(fail.is_error);
    assert!(fail.text().contains("disk full"), "{}", fail.text());

    let image = servers.call_tool("py", "image", args(json!({}))).await.unwrap();
    assert_eq!(image.content[0]["type"], "image");
    assert_eq!(image.content[0]["mimeType"], "image/png");
    let text = image.text();
    assert!(text.starts_with("[image image/png, ") && text.ends_with(" bytes base64]"), "{text}");
}

#[tokio::test]
async fn an_unknown_tool_is_answered() {
    let server = HttpServer::python(free_port(), None, None);
    let servers = pool(http_spec("py", server.port, TIMEOUT));
    let error = servers.call_tool("py", "nope", args(json!({}))).await.unwrap_err();
    assert!(matches!(error, McpError::NoTool { .. }), "{error:?}");
    assert_eq!(error.delivery(), Delivery::Answered);
    assert_eq!(error.to_string(), r#"MCP server "py" has no tool "nope""#);
    // The server answered: the connection is still good.
    servers.call_tool("py", "echo", args(json!({"text": "still here"}))).await.unwrap();
}

#[tokio::test]
async fn list_changed_bumps_the_generation_and_the_new_tool_is_listed() {
    let server = HttpServer::python(free_port(), None, None);
    let servers = pool(http_spec("py", server.port, TIMEOUT));
    let before = servers.list_tools("py").await.unwrap();
    assert!(!before.iter().any(|t| t.name == "extra"));
    let generation = servers.tools_generation("py");

    servers.call_tool("py", "enable_extra", args(json!({}))).await.unwrap();
    // The notification comes on the session's GET stream, in its own time.
    let deadline = Instant::now() + Duration::from_secs(10);
    while servers.tools_generation("py") == generation {
        assert!(Instant::now() < deadline, "no notifications/tools/list_changed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = servers.list_tools("py").await.unwrap();
    assert!(after.iter().any(|t| t.name == "extra"));
    let extra = servers.call_tool("py", "extra", args(json!({}))).await.unwrap();
    assert_eq!(extra.text(), "extra");
}

#[tokio::test]
async fn a_server_down_is_not_sent_and_the_pool_reconnects_when_it_is_back() {
    let port = free_port();
    let servers = pool(http_spec("files", port, TIMEOUT));
    let error = servers.call_tool("files", "echo", args(json!({"text": "x"}))).await.unwrap_err();
    assert_eq!(error.delivery(), Delivery::NotSent, "{error:?}");
    assert_eq!(error.server(), "files");
    assert_eq!(
        error.to_string(),
        format!(r#"MCP server "files": connection refused (http://127.0.0.1:{port}/mcp)"#)
    );

    let _server = HttpServer::python(port, None, None);
    let echo = servers.call_tool("files", "echo", args(json!({"text": "back"}))).await.unwrap();
    assert_eq!(echo.text(), "back");
}

#[tokio::test]
async fn an_expired_session_is_renewed_and_the_call_sent_once() {
    // A restarted server knows nothing of the session: it answers 404, the request was not
    // processed, and the client initializes again and sends it once more.
    let port = free_port();
    let log = Log::new("expired");
    let servers = pool(http_spec("py", port, TIMEOUT));
    let first = HttpServer::python(port, None, Some(&log.0));
    servers.call_tool("py", "echo", args(json!({"text": "one"}))).await.unwrap();
    first.kill();
    let _second = HttpServer::python(port, None, Some(&log.0));
    let slow = servers
        .call_tool("py", "slow", args(json!({"seconds": 0, "marker": "after-restart"})))
        .await
        .unwrap();
    assert!(slow.text().contains("after-restart"));
    assert_eq!(log.lines(), vec!["after-restart"]);
}

#[tokio::test]
async fn headers_carry_the_token_and_a_wrong_one_is_401_not_sent() {
    let server = HttpServer::python(free_port(), Some("s3cret"), None);
    let spec = |token: &str| ServerSpec {
        name: format!("auth-{token}"),
        transport: Transport::Http {
            url: format!("http://127.0.0.1:{}/mcp", server.port),
            headers: vec![("Authorization".to_owned(), format!("Bearer {token}"))],
        },
        timeout: TIMEOUT,
    };
    let servers = Servers::new(vec![spec("wrong"), spec("s3cret")]);

    let error = servers.call_tool("auth-wrong", "echo", args(json!({"text": "x"}))).await.unwrap_err();
    assert_eq!(error.delivery(), Delivery::NotSent, "{error:?}");
    assert!(error.to_string().starts_with(r#"MCP server "auth-wrong" answered 401 Unauthorized"#), "{error}");

    let echo = servers.call_tool("auth-s3cret", "echo", args(json!({"text": "in"}))).await.unwrap();
    assert_eq!(echo.text(), "in");
}

#[tokio::test]
async fn a_server_killed_mid_call_is_maybe_sent_and_ran_once() {
    let log = Log::new("killed");
    let server = HttpServer::python(free_port(), None, Some(&log.0));
    let servers = pool(http_spec("py", server.port, TIMEOUT));
    let call = servers.call_tool("py", "slow", args(json!({"seconds": 30, "marker": "killed"})));
    let kill = async {
        assert!(log.wait_for("killed", Duration::from_secs(10)).await);
        server.kill();
    };
    let (result, ()) = tokio::join!(call, kill);
    let error = result.unwrap_err();
    assert_eq!(error.delivery(), Delivery::MaybeSent, "{error:?}");
    assert!(
        error.to_string().starts_with(r#"MCP server "py": connection lost during tools/call"#),
        "{error}"
    );
    assert_eq!(log.lines(), vec!["killed"]);
}

#[tokio::test]
async fn a_timeout_is_maybe_sent_and_cancels_the_call() {
    let log = Log::new("timeout");
    let server = HttpServer::python(free_port(), None, Some(&log.0));
    let timeout = Duration::from_secs(2);
    let servers = pool(http_spec("py", server.port, timeout));
    // Connect first, so that the timeout measures the call alone.
    servers.list_tools("py").await.unwrap();

    let started = Instant::now();
    let error =
        servers.call_tool("py", "slow", args(json!({"seconds": 30, "marker": "t"}))).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, McpError::Timeout { .. }), "{error:?}");
    assert_eq!(error.delivery(), Delivery::MaybeSent);
    assert_eq!(error.to_string(), r#"MCP server "py": tools/call timed out after 2 s"#);
    assert!(took >= timeout && took < timeout + Duration::from_secs(3), "{took:?}");
    // notifications/cancelled reached the server, which stopped the tool.
    assert!(log.wait_for("cancelled t", Duration::from_secs(5)).await, "{:?}", log.lines());
    assert_eq!(log.lines(), vec!["t", "cancelled t"]);
}

#[tokio::test]
async fn over_stdio() {
    let servers = pool(stdio_spec("py", python_stdio_command()));
    let tools = servers.list_tools("py").await.unwrap();
    assert!(tools.iter().any(|t| t.name == "echo" && t.hints.read_only));
    let echo = servers.call_tool("py", "echo", args(json!({"text": "piped"}))).await.unwrap();
    assert_eq!(echo.text(), "piped");
    let add = servers.call_tool("py", "add", args(json!({"a": 1, "b": 2}))).await.unwrap();
    assert_eq!(add.structured, Some(json!({"sum": 3.0})));
    let error = servers.call_tool("py", "nope", args(json!({}))).await.unwrap_err();
    assert_eq!(error.delivery(), Delivery::Answered, "{error:?}");
}

#[tokio::test]
async fn a_child_that_dies_mid_call_is_maybe_sent_and_the_pool_starts_another() {
    let log = Log::new("stdio-killed");
    let killed = log.0.with_extension("killed");
    // A shell between the pool and the server, which kills the server (SIGKILL) once `slow`
    // has logged its call, and exits; started again, it just runs the server.
    let server = format!("{} {} --stdio", common::python().display(), common::python_server().display());
    let script = format!(
        "exec 3<&0
         if [ -e {killed} ]; then exec {server}; fi
         {server} <&3 3<&- &
         pid=$!
         while ! grep -q died {log} 2>/dev/null; do sleep 0.05; done
         touch {killed}; kill -9 $pid; wait",
        killed = killed.display(),
        log = log.0.display(),
    );
    let command = vec![
        "env".to_owned(),
        format!("MCP_TEST_LOG={}", log.0.display()),
        "sh".to_owned(),
        "-c".to_owned(),
        script,
    ];
    let servers = pool(stdio_spec("py", command));
    let error =
        servers.call_tool("py", "slow", args(json!({"seconds": 30, "marker": "died"}))).await.unwrap_err();
    assert_eq!(error.delivery(), Delivery::MaybeSent, "{error:?}");
    assert!(
        error.to_string().starts_with(r#"MCP server "py": connection lost during tools/call"#),
        "{error}"
    );
    assert_eq!(log.lines(), vec!["died"]);

    // The next call starts a new child.
    let echo = servers.call_tool("py", "echo", args(json!({"text": "again"}))).await.unwrap();
    assert_eq!(echo.text(), "again");
    let _ = std::fs::remove_file(killed);
}

#[tokio::test]
async fn a_command_that_cannot_start_is_not_sent() {
    let servers = pool(stdio_spec("ghost", vec!["/nonexistent/mcp-server".to_owned()]));
    let error = servers.list_tools("ghost").await.unwrap_err();
    assert_eq!(error.delivery(), Delivery::NotSent);
    assert!(error.to_string().starts_with(r#"MCP server "ghost": cannot start the command: "#), "{error}");
}

#[tokio::test]
async fn a_server_that_never_answers_initialize_times_out_not_sent() {
    let mut spec = stdio_spec("mute", vec!["sleep".to_owned(), "30".to_owned()]);
    spec.timeout = Duration::from_millis(500);
    let servers = pool(spec);
    let error = servers.call_tool("mute", "echo", args(json!({}))).await.unwrap_err();
    assert_eq!(error.delivery(), Delivery::NotSent);
    assert_eq!(error.to_string(), r#"MCP server "mute": initialize timed out after 0.5 s"#);
}

#[tokio::test]
async fn a_server_not_configured_is_named() {
    let servers = Servers::new(Vec::new());
    let error = servers.call_tool("nowhere", "echo", args(json!({}))).await.unwrap_err();
    assert_eq!(error.delivery(), Delivery::NotSent);
    assert_eq!(error.to_string(), r#"MCP server "nowhere" is not configured"#);
}
