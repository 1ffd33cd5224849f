//! `turnstone mcp-notes`: a small MCP server over stdio, the one the bundled demo's agent lists
//! (no network, nothing to install: it is this binary). A notepad kept for the server
//! process's life, with a tool of each kind the engine treats differently: one that only reads
//! (runs at once), one that writes (a person approves it first), one that says repeating it is
//! harmless.

use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

/// Serves the notepad on stdin and stdout until the client hangs up.
pub async fn run() -> anyhow::Result<()> {
    let service = Notes::default().serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}

#[derive(Default)]
struct Notes {
    notes: Mutex<Vec<String>>,
}

impl Notes {
    fn notes(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        // Held for a push or a read, never across an await.
        self.notes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn call(&self, name: &str, arguments: &JsonObject) -> Result<String, String> {
        let text = |field: &str| match arguments.get(field) {
            Some(Value::String(text)) => Ok(text.clone()),
            _ => Err(format!("{name} needs a string `{field}`")),
        };
        match name {
            "add_note" => {
                let mut notes = self.notes();
                notes.push(text("text")?);
                Ok(format!("noted ({} in all)", notes.len()))
            }
            "list_notes" => {
                let notes = self.notes();
                Ok(if notes.is_empty() {
                    "no notes yet".to_owned()
                } else {
                    notes
                        .iter()
                        .enumerate()
                        .map(|(i, n)| format!("{}. {n}", i + 1))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
            }
            "count_words" => Ok(text("text")?.split_whitespace().count().to_string()),
            other => Err(format!("no tool {other:?}")),
        }
    }
}

fn tools() -> Vec<Tool> {
    let schema = |properties: Value, required: &[&str]| -> Arc<JsonObject> {
        let schema = json!({"type": "object", "properties": properties, "required": required});
        Arc::new(schema.as_object().cloned().unwrap_or_default())
    };
    let text = json!({"text": {"type": "string"}});
    vec![
        Tool::new("add_note", "Writes a note on the notepad.", schema(text.clone(), &["text"]))
            .annotate(ToolAnnotations::new().read_only(false).destructive(false).idempotent(false)),
        Tool::new("list_notes", "Reads every note, oldest first.", schema(json!({}), &[]))
            .annotate(ToolAnnotations::new().read_only(true)),
        Tool::new("count_words", "Counts the words of a text.", schema(text, &["text"]))
            .annotate(ToolAnnotations::new().read_only(true).idempotent(true)),
    ]
}

impl ServerHandler for Notes {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("turnstone-notes", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let result = match self.call(&request.name, &arguments) {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            // A tool's own failure is a result the model reads (spec "Tools", error handling).
            Err(text) => CallToolResult::error(vec![ContentBlock::text(text)]),
        };
        Ok(result.into())
    }
}
