//! Against the reference server of the TypeScript SDK, @modelcontextprotocol/server-everything
//! (tests/mcp/node_modules), over stdio and Streamable HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

mod common;

use std::time::Duration;

use common::{HttpServer, args, everything_stdio_command, free_port, http_spec, stdio_spec};
use serde_json::json;
use turnstone_mcp::Servers;

/// The same checks over either transport.
async fn exercise(servers: &Servers) {
    let tools = servers.list_tools("everything").await.unwrap();
    let tool = |name: &str| {
        tools.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name} in {tools:?}"))
    };
    let echo = tool("echo");
    assert_eq!(echo.title.as_deref(), Some("Echo Tool"));
    assert!(echo.hints.read_only && !echo.hints.destructive && !echo.hints.open_world);
    assert!(tool("get-structured-content").output_schema.is_some());

    let result = servers.call_tool("everything", "echo", args(json!({"message": "hi"}))).await.unwrap();
    assert_eq!(result.text(), "Echo: hi");

    let sum = servers.call_tool("everything", "get-sum", args(json!({"a": 2, "b": 3}))).await.unwrap();
    assert_eq!(sum.text(), "The sum of 2 and 3 is 5.");

    let weather = servers
        .call_tool("everything", "get-structured-content", args(json!({"location": "Chicago"})))
        .await
        .unwrap();
    assert_eq!(weather.structured.as_ref().unwrap()["temperature"], 36);

    let image = servers.call_tool("everything", "get-tiny-image", args(json!({}))).await.unwrap();
    assert!(image.text().contains("[image image/png, "));

    // This SDK answers an unknown tool with an isError result, not a protocol error: a result,
    // kept as it came.
    let unknown = servers.call_tool("everything", "nope", args(json!({}))).await.unwrap();
    assert!(unknown.is_error);
    assert_eq!(unknown.text(), "MCP error -32602: Tool nope not found");
}

#[tokio::test]
async fn over_stdio() {
    let servers = Servers::new(vec![stdio_spec("everything", everything_stdio_command())]);
    exercise(&servers).await;
}

#[tokio::test]
async fn over_streamable_http() {
    let server = HttpServer::everything(free_port());
    let servers = Servers::new(vec![http_spec("everything", server.port, Duration::from_secs(20))]);
    exercise(&servers).await;
}
