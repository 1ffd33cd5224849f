//! A tools/call result: MCP's content kept as it came, and the text a model reads of it.

use serde_json::Value;

/// A tools/call result, MCP's content kept as it came.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// MCP content blocks as JSON (`{"type": "text", "text": …}`, `{"type": "image", …}`, …).
    pub content: Vec<Value>,
    /// `structuredContent`, for a tool with an output schema.
    pub structured: Option<Value>,
    /// `isError`: the tool ran and failed (spec "Tools", error handling: a tool execution
    /// error is a result, for the model to read, not a protocol error).
    pub is_error: bool,
}

impl ToolResult {
    /// What a model reads: the text blocks, joined by newlines; the structured content as JSON
    /// when no block is text; other blocks summarised (`[image image/png, 1234 bytes base64]`).
    pub fn text(&self) -> String {
        let mut parts = Vec::new();
        let has_text = self.content.iter().any(|b| kind(b) == "text");
        if !has_text && let Some(structured) = &self.structured {
            parts.push(structured.to_string());
        }
        for block in &self.content {
            parts.push(summary(block));
        }
        parts.join("\n")
    }
}

impl From<rmcp::model::CallToolResult> for ToolResult {
    fn from(result: rmcp::model::CallToolResult) -> Self {
        ToolResult {
            content: result
                .content
                .iter()
                // A content block is plain data: serializing it cannot fail, and if it ever
                // did the block would show as null rather than vanish.
                .map(|block| serde_json::to_value(block).unwrap_or(Value::Null))
                .collect(),
            structured: result.structured_content,
            is_error: result.is_error.unwrap_or(false),
        }
    }
}

fn kind(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

fn field<'a>(value: &'a Value, name: &str) -> &'a str {
    value.get(name).and_then(Value::as_str).unwrap_or("")
}

/// One block as a model reads it: text as it is, binary data as its type and size.
fn summary(block: &Value) -> String {
    match kind(block) {
        "text" => field(block, "text").to_owned(),
        kind @ ("image" | "audio") => {
            format!("[{kind} {}, {} bytes base64]", field(block, "mimeType"), field(block, "data").len())
        }
        "resource_link" => format!("[resource link {}]", field(block, "uri")),
        "resource" => {
            let resource = block.get("resource").unwrap_or(&Value::Null);
            match resource.get("text").and_then(Value::as_str) {
                Some(text) => text.to_owned(),
                None => format!(
                    "[resource {} {}, {} bytes base64]",
                    field(resource, "uri"),
                    field(resource, "mimeType"),
                    field(resource, "blob").len()
                ),
            }
        }
        other => format!("[{other} content]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(content: Vec<Value>, structured: Option<Value>) -> ToolResult {
        ToolResult { content, structured, is_error: false }
    }

    #[test]
    fn text_blocks_are_joined() {
        let r = result(
            vec![json!({"type": "text", "text": "a"}), json!({"type": "text", "text": "b"})],
            Some(json!({"x": 1})),
        );
        assert_eq!(r.text(), "a\nb");
    }

    #[test]
    fn structured_content_stands_in_for_missing_text() {
        let r = result(vec![], Some(json!({"sum": 3})));
        assert_eq!(r.text(), r#"{"sum":3}"#);
    }

    #[test]
    fn binary_blocks_are_summarised() {
        let r = result(
            vec![
                json!({"type": "image", "mimeType": "image/png", "data": "AAAA"}),
                json!({"type": "resource_link", "uri": "file:///a", "name": "a"}),
                json!({"type": "resource", "resource": {"uri": "file:///b", "text": "inside"}}),
                json!({"type": "resource", "resource": {"uri": "file:///c", "mimeType": "application/pdf", "blob": "AAAAAAAA"}}),
            ],
            None,
        );
        assert_eq!(
            r.text(),
            "[image image/png, 4 bytes base64]\n[resource link file:///a]\ninside\n\
             [resource file:///c application/pdf, 8 bytes base64]"
        );
    }
}
