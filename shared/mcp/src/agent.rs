//! The MCP servers of one agent as the engine sees them: their tools as the agent's tools
//! (`<server>__<tool>`, run by the engine, approval by the server's rule), and a call's outcome
//! in the engine's terms, where a failure that may have reached the tool is retried only when
//! the tool says repeating it is harmless.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use turnstone_engine::protocol::{AgentTool, Approval, Content, McpToolSource, ToolHandler};
use turnstone_engine::session::CallError;

use crate::{Delivery, McpError, ServerSpec, Servers, Tool};

/// Between a server's tool name and its tools' own: `files__read_file`.
pub const NAME_SEPARATOR: &str = "__";

/// How long a listing is reused without a `notifications/tools/list_changed`.
const LISTING_TTL: Duration = Duration::from_secs(300);
/// The longest a listing may hold up the request that needs it.
const LISTING_WAIT: Duration = Duration::from_secs(10);
/// How long a server that could not be listed is left alone before it is tried again, so
/// that a server that is down does not slow every new session.
const FAILED_LISTING_TTL: Duration = Duration::from_secs(30);

/// Which of a server's calls wait for a person's approval (`approve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Approve {
    Never,
    /// The calls of tools that do not say they only read (MCP's `readOnlyHint`; a tool that
    /// says `destructiveHint: false` may still write, so it is asked about too).
    #[default]
    Destructive,
    Always,
}

/// One server of an agent: where it is and what of it the agent offers.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentServer {
    pub spec: ServerSpec,
    /// Only these tools (all when `None`).
    pub include: Option<Vec<String>>,
    /// Never these.
    pub exclude: Vec<String>,
    pub approve: Approve,
}

impl AgentServer {
    fn offers(&self, tool: &str) -> bool {
        self.include.as_ref().is_none_or(|names| names.iter().any(|n| n == tool))
            && !self.exclude.iter().any(|n| n == tool)
    }

    /// `tool` as one of the agent's tools.
    fn agent_tool(&self, tool: &Tool) -> AgentTool {
        let asks = match self.approve {
            Approve::Never => false,
            Approve::Destructive => !tool.hints.read_only,
            Approve::Always => true,
        };
        AgentTool {
            name: format!("{}{NAME_SEPARATOR}{}", self.spec.name, tool.name),
            description: tool.description.clone().or_else(|| tool.title.clone()),
            input: Some(tool.input_schema.clone()),
            // Not `output`: the model reads the call's text, whose shape the server's schema
            // for `structuredContent` does not describe.
            output: None,
            handler: Some(ToolHandler::Server),
            approval: asks.then_some(Approval::Always),
            mcp: Some(McpToolSource {
                server: self.spec.name.clone(),
                tool: tool.name.clone(),
                timeout_secs: self.spec.timeout.as_secs_f64(),
                idempotent: tool.hints.idempotent,
            }),
        }
    }
}

/// A listing kept for reuse: the server's tools as the agent's, and when it was read.
struct Listing {
    generation: u64,
    at: Instant,
    tools: Vec<AgentTool>,
    /// Whether the last try listed the server (otherwise `tools` are the last good ones).
    ok: bool,
}

impl Listing {
    fn is_fresh(&self, generation: u64) -> bool {
        let ttl = if self.ok { LISTING_TTL } else { FAILED_LISTING_TTL };
        self.generation == generation && self.at.elapsed() < ttl
    }
}

/// An agent's MCP servers, with one connection pool and the last listing of each.
pub struct AgentServers {
    servers: Vec<AgentServer>,
    pool: Servers,
    listings: Mutex<HashMap<String, Listing>>,
}

impl AgentServers {
    pub fn new(servers: Vec<AgentServer>) -> Self {
        let pool = Servers::new(servers.iter().map(|s| s.spec.clone()).collect());
        AgentServers { servers, pool, listings: Mutex::new(HashMap::new()) }
    }

    /// Lists the tools of every server whose last listing is stale (a `list_changed` came, a
    /// connection was opened again, or [`LISTING_TTL`] passed), all at once, within
    /// [`LISTING_WAIT`]. A server that cannot be listed keeps its last listing, or offers
    /// nothing; the reason is logged with its name.
    pub async fn refresh(&self) {
        let stale = self.servers.iter().filter(|server| {
            let generation = self.pool.tools_generation(&server.spec.name);
            !self.listings().get(&server.spec.name).is_some_and(|l| l.is_fresh(generation))
        });
        futures_util::future::join_all(stale.map(|server| self.list(server))).await;
    }

    /// Lists one server's tools and keeps them.
    async fn list(&self, server: &AgentServer) {
        let name = &server.spec.name;
        // The generation read before listing: a change notified meanwhile lists again.
        let generation = self.pool.tools_generation(name);
        // Bounded apart from the server's own timeout: a listing holds up a client's request
        // (a new session, a turn), and an API gateway gives up on those within seconds.
        let listed = tokio::time::timeout(LISTING_WAIT, self.pool.list_tools(name)).await;
        let listed = listed.unwrap_or_else(|_| {
            Err(McpError::Timeout {
                server: name.clone(),
                method: "tools/list",
                after: LISTING_WAIT,
                delivery: Delivery::MaybeSent,
            })
        });
        let listing = match listed {
            Ok(tools) => {
                let tools = tools.iter().filter(|t| server.offers(&t.name)).map(|t| server.agent_tool(t));
                Listing { generation, at: Instant::now(), tools: tools.collect(), ok: true }
            }
            Err(e) => {
                tracing::warn!(server = %name, "cannot list the tools of MCP server: {e}");
                let last = self.listings().get(name).map(|l| l.tools.clone()).unwrap_or_default();
                Listing { generation, at: Instant::now(), tools: last, ok: false }
            }
        };
        self.listings().insert(name.clone(), listing);
    }

    /// The tools of the last listings, in the servers' order.
    pub fn tools(&self) -> Vec<AgentTool> {
        let listings = self.listings();
        self.servers.iter().filter_map(|s| listings.get(&s.spec.name)).flat_map(|l| l.tools.clone()).collect()
    }

    /// Runs one call of `source` with `arguments` (the JSON the model wrote): what the model
    /// is given of the result ([`crate::ToolResult::content`]), or the failure as the engine
    /// settles it.
    pub async fn call(&self, source: &McpToolSource, arguments: &str) -> Result<Content, CallError> {
        let arguments = parse_arguments(arguments)?;
        match self.pool.call_tool(&source.server, &source.tool, arguments).await {
            Ok(result) if result.is_error => Err(CallError::terminal(result.text())),
            Ok(result) => Ok(result.content()),
            Err(e) => Err(call_error(&e, source)),
        }
    }

    fn listings(&self) -> std::sync::MutexGuard<'_, HashMap<String, Listing>> {
        // Held for a lookup or an insert, never across an await; a panic elsewhere while it
        // was held leaves a plain map behind, still usable.
        self.listings.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A tool's arguments: an object, or nothing (`""` from a model that passed none).
fn parse_arguments(arguments: &str) -> Result<Map<String, Value>, CallError> {
    if arguments.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(CallError::terminal(format!("the arguments must be a JSON object, not {other}"))),
        Err(e) => Err(CallError::terminal(format!("the arguments are not JSON: {e}"))),
    }
}

/// A failed call in the engine's terms. Never sent: retried by policy. Answered: final. Maybe
/// sent: retried only when the tool says repeating it is harmless, and otherwise final, saying
/// it may have run.
fn call_error(e: &McpError, source: &McpToolSource) -> CallError {
    match e.delivery() {
        Delivery::NotSent => CallError { retryable: true, ..CallError::terminal(e.to_string()) },
        Delivery::Answered => CallError::terminal(e.to_string()),
        Delivery::MaybeSent if source.idempotent => {
            CallError { retryable: true, ..CallError::terminal(e.to_string()) }
        }
        Delivery::MaybeSent => CallError::terminal(format!(
            "{e}; the call may have run, and is not sent again because the tool does not say repeating it is harmless"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Hints, Transport};

    fn server(approve: Approve) -> AgentServer {
        AgentServer {
            spec: ServerSpec {
                name: "files".into(),
                transport: Transport::Stdio { command: vec!["x".into()] },
                timeout: Duration::from_secs(60),
            },
            include: None,
            exclude: vec!["secret".into()],
            approve,
        }
    }

    fn tool(name: &str, hints: Hints) -> Tool {
        Tool {
            name: name.into(),
            title: None,
            description: Some("d".into()),
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
            hints,
        }
    }

    #[test]
    fn tools_are_named_after_their_server_and_asked_about_unless_they_only_read() {
        let s = server(Approve::Destructive);
        let reader = s.agent_tool(&tool("read", Hints { read_only: true, ..Hints::default() }));
        let writer = s.agent_tool(&tool("write", Hints { destructive: false, ..Hints::default() }));
        assert_eq!((reader.name.as_str(), reader.approval), ("files__read", None));
        assert_eq!((writer.name.as_str(), writer.approval), ("files__write", Some(Approval::Always)));
        assert_eq!(reader.handler, Some(ToolHandler::Server));
        let source = reader.mcp.unwrap();
        assert_eq!(
            (source.server.as_str(), source.tool.as_str(), source.timeout_secs),
            ("files", "read", 60.0)
        );
        assert_eq!(server(Approve::Never).agent_tool(&tool("w", Hints::default())).approval, None);
        let always =
            server(Approve::Always).agent_tool(&tool("r", Hints { read_only: true, ..Hints::default() }));
        assert_eq!(always.approval, Some(Approval::Always));
        assert!(!s.offers("secret") && s.offers("read"));
    }

    /// A server that takes the connection and never answers holds a new session up for
    /// [`LISTING_WAIT`], not for its call timeout, and is then left out; a listed server is
    /// not held up by it.
    #[tokio::test]
    async fn a_server_that_never_answers_holds_a_listing_up_for_the_listing_wait_only() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/mcp", silent.local_addr().unwrap());
        let spec = ServerSpec {
            name: "silent".into(),
            transport: Transport::Http { url, headers: Vec::new() },
            timeout: Duration::from_secs(600),
        };
        let servers = AgentServers::new(vec![AgentServer {
            spec,
            include: None,
            exclude: Vec::new(),
            approve: Approve::Never,
        }]);
        let started = Instant::now();
        servers.refresh().await;
        let waited = started.elapsed();
        assert!(waited >= LISTING_WAIT && waited < LISTING_WAIT + Duration::from_secs(5), "{waited:?}");
        assert!(servers.tools().is_empty());
        // Left alone for a while: the next session is not held up again.
        let started = Instant::now();
        servers.refresh().await;
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(silent);
    }

    #[test]
    fn arguments_are_an_object_or_nothing() {
        assert_eq!(parse_arguments("").unwrap(), Map::new());
        assert_eq!(parse_arguments(r#"{"a":1}"#).unwrap().get("a"), Some(&serde_json::json!(1)));
        assert!(parse_arguments("[1]").unwrap_err().error.contains("JSON object"));
        assert!(parse_arguments("{").unwrap_err().error.contains("not JSON"));
    }
}
