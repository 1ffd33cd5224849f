//! Turnstone's client for Model Context Protocol servers: the tools an agent may call that live
//! in another process, reached over Streamable HTTP or a child process's stdio. Built on the
//! official Rust SDK, rmcp.
//!
//! [`Servers`] keeps one connection per configured server, opened on first use and again after
//! a failure; it lists a server's tools ([`Tool`], annotations' defaults applied) and calls them
//! ([`ToolResult`], content kept as MCP sent it). Every failure is an [`McpError`] that names the
//! server and says, as [`Delivery`], whether the request may have reached the tool.
//!
//! [`AgentServers`] is the engine's view of one agent's servers: their tools as the agent's
//! tools, and a call's outcome as the engine settles it.
//!
//! What it leaves to its caller, the engine: durability. It sends each call once and never
//! retries one that may have been delivered; claiming a call before sending it, deciding on a
//! retry from [`McpError::delivery`], asking for approval from the tools' [`Hints`], and what to
//! trust those hints with, are the engine's. So is re-listing tools when
//! [`Servers::tools_generation`] moves.

mod agent;
mod connection;
mod error;
mod http;
mod result;
mod servers;
mod spec;
#[cfg(feature = "testing")]
pub mod testing;
mod tool;

pub use agent::{AgentServer, AgentServers, Approve, NAME_SEPARATOR};
pub use error::{Delivery, McpError};
pub use result::ToolResult;
pub use servers::Servers;
pub use spec::{ServerSpec, Transport};
pub use tool::{Hints, Tool};
