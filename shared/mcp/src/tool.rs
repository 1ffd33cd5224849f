//! A tool as the server lists it (tools/list), with its annotations' defaults applied.

use serde_json::Value;

/// One tool as the server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    /// The JSON Schema of the arguments (`inputSchema`).
    pub input_schema: Value,
    /// The JSON Schema of `structuredContent`, when the tool declares one (`outputSchema`).
    pub output_schema: Option<Value>,
    pub hints: Hints,
}

/// MCP tool annotations with the spec's defaults applied when absent (spec 2025-06-18, "Tools",
/// ToolAnnotations): readOnlyHint false, destructiveHint true, idempotentHint false,
/// openWorldHint true. They are hints from the server, not guarantees: the caller decides what
/// to trust them with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

impl Default for Hints {
    /// What a tool without annotations is taken to be: one that may change anything, not
    /// safely repeated, reaching outside.
    fn default() -> Self {
        Hints { read_only: false, destructive: true, idempotent: false, open_world: true }
    }
}

impl From<rmcp::model::Tool> for Tool {
    fn from(tool: rmcp::model::Tool) -> Self {
        let defaults = Hints::default();
        let annotations = tool.annotations.unwrap_or_default();
        let hints = Hints {
            read_only: annotations.read_only_hint.unwrap_or(defaults.read_only),
            destructive: annotations.destructive_hint.unwrap_or(defaults.destructive),
            idempotent: annotations.idempotent_hint.unwrap_or(defaults.idempotent),
            open_world: annotations.open_world_hint.unwrap_or(defaults.open_world),
        };
        Tool {
            name: tool.name.into_owned(),
            // The tool's own title comes first; the annotation's is the older place for it.
            title: tool.title.or(annotations.title),
            description: tool.description.map(|d| d.into_owned()),
            input_schema: Value::Object((*tool.input_schema).clone()),
            output_schema: tool.output_schema.map(|s| Value::Object((*s).clone())),
            hints,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn listed(value: Value) -> Tool {
        let tool: rmcp::model::Tool = serde_json::from_value(value).unwrap();
        tool.into()
    }

    #[test]
    fn absent_annotations_take_the_spec_defaults() {
        let tool = listed(json!({"name": "t", "inputSchema": {"type": "object"}}));
        assert_eq!(
            tool.hints,
            Hints { read_only: false, destructive: true, idempotent: false, open_world: true }
        );
        assert_eq!(tool.input_schema, json!({"type": "object"}));
        assert_eq!(tool.output_schema, None);
    }

    #[test]
    fn present_annotations_override_only_what_they_say() {
        let tool = listed(json!({
            "name": "t", "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object", "properties": {"sum": {"type": "number"}}},
            "annotations": {"title": "T", "readOnlyHint": true, "openWorldHint": false}
        }));
        assert!(tool.hints.read_only && !tool.hints.open_world);
        assert!(tool.hints.destructive && !tool.hints.idempotent);
        assert_eq!(tool.title.as_deref(), Some("T"));
        assert!(tool.output_schema.is_some());
    }
}
