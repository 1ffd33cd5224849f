//! What the caller says about each server: its name, how to reach it, how long to wait.

use std::time::Duration;

/// One MCP server the pool may connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// The name errors and the caller use for it (`MCP server "files" …`).
    pub name: String,
    pub transport: Transport,
    /// The longest wait for one request (initialize, a page of tools/list, tools/call).
    pub timeout: Duration,
}

/// How to reach a server: the two standard transports of the MCP spec ("Transports").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Streamable HTTP: JSON-RPC POSTed to one endpoint, answered with JSON or an SSE stream.
    /// `headers` go on every request (e.g. `Authorization`); their values are already resolved.
    Http { url: String, headers: Vec<(String, String)> },
    /// A child process speaking JSON-RPC on its stdin and stdout: the program, then its arguments.
    Stdio { command: Vec<String> },
}

impl Transport {
    /// Where the server is, for error messages: the URL, or the command line.
    pub fn target(&self) -> String {
        match self {
            Transport::Http { url, .. } => url.clone(),
            Transport::Stdio { command } => command.join(" "),
        }
    }
}
