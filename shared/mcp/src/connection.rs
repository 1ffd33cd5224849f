//! One open connection to a server: the transport, the initialize handshake, and the client
//! side's handling of what the server sends unasked (notifications/tools/list_changed).

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use http::{HeaderName, HeaderValue};
use rmcp::{
    ClientHandler, RoleClient, ServiceError, ServiceExt,
    model::{
        CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientCapabilities, ClientConfig,
        ClientRequest, Implementation, ListToolsRequest, PaginatedRequestParams, ProtocolVersion, RequestId,
        ServerResult,
    },
    service::{NotificationContext, Peer, PeerRequestOptions, RunningService},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use tokio::io::AsyncBufReadExt;

use crate::{
    error::{Context, McpError, Stage},
    http::HttpClient,
    result::ToolResult,
    spec::{ServerSpec, Transport},
    tool::Tool,
};

/// The client's side of a session: its name for the handshake, and a count of the server's
/// notifications/tools/list_changed (spec "Tools", list changed notification).
struct Handler {
    generation: Arc<AtomicU64>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("turnstone", env!("CARGO_PKG_VERSION")),
        )
        // The newest version with the initialize handshake, which every server still speaks.
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// An initialized session with one server. Dropping it ends the session (an HTTP DELETE, or
/// the child process killed).
pub(crate) struct Connection {
    service: RunningService<RoleClient, Handler>,
    server: String,
    target: String,
    timeout: Duration,
}

impl Connection {
    /// Opens the transport and initializes the session, within the spec's timeout.
    pub(crate) async fn open(spec: &ServerSpec, generation: Arc<AtomicU64>) -> Result<Connection, McpError> {
        let target = spec.transport.target();
        let context = Context {
            server: &spec.name,
            target: &target,
            method: "initialize",
            tool: None,
            stage: Stage::Opening,
        };
        let handler = Handler { generation };
        let opening = async {
            match &spec.transport {
                Transport::Http { url, headers } => {
                    let client = HttpClient::new().map_err(|e| McpError::Connect {
                        server: spec.name.clone(),
                        target: target.clone(),
                        reason: format!("cannot make an HTTP client: {e}"),
                    })?;
                    let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                        .custom_headers(header_map(spec, headers)?);
                    let transport = StreamableHttpClientTransport::with_client(client, config);
                    handler.serve(transport).await.map_err(|e| context.initialize(e))
                }
                Transport::Stdio { command } => {
                    let transport = spawn(spec, command)?;
                    handler.serve(transport).await.map_err(|e| context.initialize(e))
                }
            }
        };
        // A server that never answers initialize must not hold the caller forever; dropping the
        // half-open transport ends it (and kills a child process).
        let service = match tokio::time::timeout(spec.timeout, opening).await {
            Ok(service) => service?,
            Err(_) => {
                return Err(McpError::Timeout {
                    server: spec.name.clone(),
                    method: "initialize",
                    after: spec.timeout,
                    delivery: crate::Delivery::NotSent,
                });
            }
        };
        Ok(Connection { service, server: spec.name.clone(), target, timeout: spec.timeout })
    }

    /// Whether rmcp's service loop still runs (it stops when a stdio child exits, for one).
    pub(crate) fn is_open(&self) -> bool {
        !self.service.is_closed() && !self.service.peer().is_transport_closed()
    }

    /// Every page of tools/list, following nextCursor (spec "Tools", listing tools).
    pub(crate) async fn list_tools(&self) -> Result<Vec<Tool>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        loop {
            let params = PaginatedRequestParams::default().with_cursor(cursor.take());
            let request = ClientRequest::ListToolsRequest(ListToolsRequest::with_param(params));
            match self.request("tools/list", None, request).await? {
                ServerResult::ListToolsResult(page) => {
                    tools.extend(page.tools.into_iter().map(Tool::from));
                    // An empty cursor is no cursor: some servers send "" on the last page.
                    match page.next_cursor.filter(|c| !c.is_empty()) {
                        // A cursor given twice would page forever.
                        Some(next) if !seen.insert(next.clone()) => {
                            return Err(McpError::Malformed {
                                server: self.server.clone(),
                                reason: format!("tools/list gave the cursor {next:?} twice"),
                                delivery: crate::Delivery::MaybeSent,
                            });
                        }
                        Some(next) => cursor = Some(next),
                        None => return Ok(tools),
                    }
                }
                _ => return Err(self.unexpected("tools/list")),
            }
        }
    }

    /// One tools/call, bounded by the spec's timeout.
    pub(crate) async fn call_tool(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Result<ToolResult, McpError> {
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        match self.request("tools/call", Some(tool), request).await? {
            ServerResult::CallToolResult(result) => Ok(result.into()),
            // `{}` is a result with no content.
            ServerResult::EmptyResult(_) => {
                Ok(ToolResult { content: Vec::new(), structured: None, is_error: false })
            }
            // MRTR input requests and tasks (2026 drafts) are not asked for by this client.
            _ => Err(self.unexpected("tools/call")),
        }
    }

    /// Sends one request and waits for its answer, at most the spec's timeout. On timeout
    /// rmcp sends notifications/cancelled (spec "Cancellation"), and so does the guard when the
    /// caller drops the future first.
    async fn request(
        &self,
        method: &'static str,
        tool: Option<&str>,
        request: ClientRequest,
    ) -> Result<ServerResult, McpError> {
        let mut context =
            Context { server: &self.server, target: &self.target, method, tool, stage: Stage::Handing };
        let peer = self.service.peer();
        let handle = peer
            .send_request_with_option(request, PeerRequestOptions::with_timeout(self.timeout))
            .await
            .map_err(|e| context.service(e))?;
        context.stage = Stage::Sent;
        let mut guard = CancelOnDrop { peer: peer.clone(), id: Some(handle.id.clone()) };
        let answer = handle.await_response().await;
        guard.id = None;
        answer.map_err(|e: ServiceError| context.service(e))
    }

    fn unexpected(&self, method: &str) -> McpError {
        McpError::Malformed {
            server: self.server.clone(),
            reason: format!("an unexpected kind of result to {method}"),
            delivery: crate::Delivery::MaybeSent,
        }
    }
}

/// Sends notifications/cancelled for a request whose caller stopped waiting (dropped the
/// future), so the server can stop working on a result nobody will read.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let peer = self.peer.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let reason = Some("the caller stopped waiting".to_owned());
                let _ = peer.notify_cancelled(CancelledNotificationParam::new(Some(id), reason)).await;
            });
        }
    }
}

fn header_map(
    spec: &ServerSpec,
    headers: &[(String, String)],
) -> Result<HashMap<HeaderName, HeaderValue>, McpError> {
    headers
        .iter()
        .map(|(name, value)| {
            let invalid = |what: &str| McpError::Connect {
                server: spec.name.clone(),
                target: spec.transport.target(),
                reason: format!("invalid HTTP header {what} for {name:?}"),
            };
            Ok((
                HeaderName::try_from(name.as_str()).map_err(|_| invalid("name"))?,
                HeaderValue::try_from(value.as_str()).map_err(|_| invalid("value"))?,
            ))
        })
        .collect()
}

/// Starts the server's command with piped stdin and stdout (the transport), and its stderr
/// forwarded to the log line by line, so a failing server says why.
fn spawn(spec: &ServerSpec, command: &[String]) -> Result<TokioChildProcess, McpError> {
    let not_started = |reason: String| McpError::Connect {
        server: spec.name.clone(),
        target: spec.transport.target(),
        reason,
    };
    let Some((program, args)) = command.split_first() else {
        return Err(not_started("no command to start".to_owned()));
    };
    let mut cmd = tokio::process::Command::new(program);
    // rmcp kills the child from a task spawned on drop; should the runtime be gone by then
    // (a runtime shutting down), the dropped handle still kills it.
    cmd.args(args).kill_on_drop(true);
    let (transport, stderr) = TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| not_started(format!("cannot start the command: {e}")))?;
    if let Some(stderr) = stderr {
        let server = spec.name.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(server = %server, "{line}");
            }
        });
    }
    Ok(transport)
}
