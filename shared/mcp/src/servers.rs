//! The pool: one connection per configured server, opened on first use and opened again after
//! a failure that may have broken it.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use crate::{connection::Connection, error::McpError, result::ToolResult, spec::ServerSpec, tool::Tool};
use serde_json::{Map, Value};

/// A pool of connections, one per server, opened lazily and reopened after failure.
///
/// An expired Streamable HTTP session (HTTP 404 to a request carrying Mcp-Session-Id) is
/// renewed inside rmcp's transport: it initializes again and sends the request once more,
/// since the server did not process it (spec "Transports", session management).
pub struct Servers {
    slots: HashMap<String, Slot>,
}

struct Slot {
    spec: ServerSpec,
    /// Counts the server's notifications/tools/list_changed, and reopened connections.
    generation: Arc<AtomicU64>,
    /// The open connection, if any. Calls hold an `Arc` of it, so replacing it here lets calls
    /// still running on the old one finish; the old session ends with the last of them.
    connection: Mutex<Option<Arc<Connection>>>,
    /// Held while opening, so that callers for the same server wait for one opening rather
    /// than each opening their own.
    opening: tokio::sync::Mutex<()>,
}

impl Servers {
    pub fn new(specs: Vec<ServerSpec>) -> Self {
        let slots = specs
            .into_iter()
            .map(|spec| {
                let slot = Slot {
                    spec,
                    generation: Arc::new(AtomicU64::new(0)),
                    connection: Mutex::new(None),
                    opening: tokio::sync::Mutex::new(()),
                };
                (slot.spec.name.clone(), slot)
            })
            .collect();
        Servers { slots }
    }

    /// Every tool the server lists, all pages.
    pub async fn list_tools(&self, server: &str) -> Result<Vec<Tool>, McpError> {
        let slot = self.slot(server)?;
        let connection = slot.connect().await?;
        let listed = connection.list_tools().await;
        slot.after(&connection, listed)
    }

    /// Calls a tool, waiting at most the server's timeout. Whether a failure may have reached
    /// the tool is the error's [`McpError::delivery`]; nothing here sends a call twice.
    pub async fn call_tool(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<ToolResult, McpError> {
        let slot = self.slot(server)?;
        let connection = slot.connect().await?;
        let called = connection.call_tool(tool, arguments).await;
        slot.after(&connection, called)
    }

    /// Bumps on each notifications/tools/list_changed from the server, and when a connection
    /// is opened again (what changed meanwhile was not notified): a caller whose cached list
    /// was read at another generation should list again. 0 for an unknown server.
    pub fn tools_generation(&self, server: &str) -> u64 {
        self.slots.get(server).map_or(0, |slot| slot.generation.load(Ordering::SeqCst))
    }

    fn slot(&self, server: &str) -> Result<&Slot, McpError> {
        self.slots.get(server).ok_or_else(|| McpError::NotConfigured { server: server.to_owned() })
    }
}

impl Slot {
    /// The open connection, opening one if there is none or it has stopped.
    async fn connect(&self) -> Result<Arc<Connection>, McpError> {
        if let Some(connection) = self.open_connection() {
            return Ok(connection);
        }
        let _opening = self.opening.lock().await;
        // Another caller may have opened it while this one waited.
        if let Some(connection) = self.open_connection() {
            return Ok(connection);
        }
        let connection = Arc::new(Connection::open(&self.spec, self.generation.clone()).await?);
        if self.current().replace(connection.clone()).is_some() {
            // A stopped connection replaced: what changed meanwhile was not notified.
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
        Ok(connection)
    }

    fn open_connection(&self) -> Option<Arc<Connection>> {
        self.current().as_ref().filter(|c| c.is_open()).cloned()
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<Arc<Connection>>> {
        // Held for no more than a swap, never across an await; a panic elsewhere while it was
        // held leaves a plain Option behind, still usable.
        self.connection.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets the connection after a failure that may have broken it, so the next request
    /// opens a new one (unless another request already replaced it).
    fn after<T>(&self, connection: &Arc<Connection>, outcome: Result<T, McpError>) -> Result<T, McpError> {
        if let Err(error) = &outcome
            && !error.keeps_connection()
        {
            let mut current = self.current();
            if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
                tracing::info!(server = %self.spec.name, "{error}; the next request reconnects");
                *current = None;
                // Whatever the server notified on the lost connection went with it.
                self.generation.fetch_add(1, Ordering::SeqCst);
            }
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine shares one pool between tasks and spawns the calls.
    #[test]
    fn the_pool_and_its_calls_can_move_between_threads() {
        fn send_sync<T: Send + Sync>(_: &T) {}
        fn send<T: Send>(_: T) {}
        let servers = Servers::new(Vec::new());
        send_sync(&servers);
        send(servers.call_tool("s", "t", Map::new()));
        send(servers.list_tools("s"));
    }
}
