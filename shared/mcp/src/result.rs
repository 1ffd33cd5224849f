//! A tools/call result: MCP's content kept as it came, and the text a model reads of it.

use serde_json::Value;
use turnstone_engine::protocol::{Content, ContentPart, UrlRef};

/// The image types a model takes back in a tool result: those Anthropic's Messages API and
/// OpenAI's APIs both accept (docs.claude.com "Vision": JPEG, PNG, GIF, WebP;
/// platform.openai.com "Images and vision": PNG, JPEG, WEBP, non-animated GIF). Other images
/// reach the model as their summary.
const MODEL_IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

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
    /// unless a text block already carries it (first when no block is text, else after the
    /// blocks); other blocks summarised (`[image image/png, 1234 bytes base64]`).
    pub fn text(&self) -> String {
        self.lines().collect::<Vec<_>>().join("\n")
    }

    /// What a model is given: [`ToolResult::text`], unless a block is an image a model takes
    /// ([`MODEL_IMAGE_TYPES`]); then parts in the blocks' order, each such image a data-URL
    /// image part and everything else a text part as `text` reads it.
    pub fn content(&self) -> Content {
        if !self.content.iter().any(is_model_image) {
            return Content::Text(self.text());
        }
        let (lead, tail) = self.structured_text();
        let blocks = self.content.iter().map(|block| match model_image(block) {
            Some(url) => ContentPart::ImageUrl { image_url: UrlRef { url } },
            None => ContentPart::Text { text: summary(block) },
        });
        let text = |text| ContentPart::Text { text };
        Content::Parts(lead.map(text).into_iter().chain(blocks).chain(tail.map(text)).collect())
    }

    /// The result's lines: the structured content where [`ToolResult::text`] puts it, and each
    /// block.
    fn lines(&self) -> impl Iterator<Item = String> + '_ {
        let (lead, tail) = self.structured_text();
        lead.into_iter().chain(self.content.iter().map(summary)).chain(tail)
    }

    /// The structured content as JSON, unless a text block carries it already (the spec asks a
    /// server to send it as text too, but many send a sentence instead, and the data would be
    /// lost): before the blocks when none is text (it stands in for the text), else after them.
    fn structured_text(&self) -> (Option<String>, Option<String>) {
        let Some(structured) = &self.structured else { return (None, None) };
        let texts: Vec<&str> =
            self.content.iter().filter(|b| kind(b) == "text").map(|b| field(b, "text")).collect();
        if texts.iter().any(|t| carries(t, structured)) {
            return (None, None);
        }
        let json = Some(structured.to_string());
        if texts.is_empty() { (json, None) } else { (None, json) }
    }
}

/// Whether text `text` says what `structured` holds: it is that JSON, or, for an SDK's wrapping
/// of a tool's plain return value as a one-field object (the Python SDK's `{"result": …}`), it
/// is that value (as JSON, or as the string itself).
fn carries(text: &str, structured: &Value) -> bool {
    let parsed = serde_json::from_str::<Value>(text).ok();
    if parsed.as_ref() == Some(structured) {
        return true;
    }
    match structured.as_object() {
        Some(fields) if fields.len() == 1 => {
            fields.values().next().is_some_and(|v| v.as_str() == Some(text) || parsed.as_ref() == Some(v))
        }
        _ => false,
    }
}

fn is_model_image(block: &Value) -> bool {
    model_image(block).is_some()
}

/// An image block a model takes, as a data URL.
fn model_image(block: &Value) -> Option<String> {
    let mime = field(block, "mimeType");
    let data = field(block, "data");
    (kind(block) == "image" && MODEL_IMAGE_TYPES.contains(&mime) && !data.is_empty())
        .then(|| format!("data:{mime};base64,{data}"))
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

    #[test]
    fn an_image_a_model_takes_makes_the_result_parts_in_order() {
        let r = result(
            vec![
                json!({"type": "text", "text": "a chart"}),
                json!({"type": "image", "mimeType": "image/png", "data": "iVBORw0K"}),
                json!({"type": "image", "mimeType": "image/svg+xml", "data": "PHN2Zz4="}),
            ],
            None,
        );
        let Content::Parts(parts) = r.content() else { panic!("{:?}", r.content()) };
        assert_eq!(
            parts,
            vec![
                ContentPart::Text { text: "a chart".into() },
                ContentPart::ImageUrl { image_url: UrlRef { url: "data:image/png;base64,iVBORw0K".into() } },
                ContentPart::Text { text: "[image image/svg+xml, 8 bytes base64]".into() },
            ]
        );
    }

    #[test]
    fn a_result_without_such_an_image_is_its_text() {
        let r = result(
            vec![json!({"type": "image", "mimeType": "image/svg+xml", "data": "PHN2Zz4="})],
            Some(json!({"n": 1})),
        );
        assert_eq!(r.content(), Content::Text(r.text()));
        assert_eq!(r.text(), "{\"n\":1}\n[image image/svg+xml, 8 bytes base64]");
    }

    fn result(content: Vec<Value>, structured: Option<Value>) -> ToolResult {
        ToolResult { content, structured, is_error: false }
    }

    #[test]
    fn text_blocks_are_joined() {
        let r = result(
            vec![json!({"type": "text", "text": "a"}), json!({"type": "text", "text": "b"})],
            Some(json!({"x": 1})),
        );
        assert_eq!(r.text(), "a\nb\n{\"x\":1}");
    }

    #[test]
    fn structured_content_a_text_block_carries_is_not_repeated() {
        let r = result(vec![json!({"type": "text", "text": "{\"x\": 1}"})], Some(json!({"x": 1})));
        assert_eq!(r.text(), "{\"x\": 1}");
        // The Python SDK's wrapping of a plain return value.
        let r = result(vec![json!({"type": "text", "text": "hello"})], Some(json!({"result": "hello"})));
        assert_eq!(r.text(), "hello");
        let r = result(vec![json!({"type": "text", "text": "42"})], Some(json!({"result": 42})));
        assert_eq!(r.text(), "42");
        let r = result(vec![json!({"type": "text", "text": "hello"})], Some(json!({"result": "bye"})));
        assert_eq!(r.text(), "hello\n{\"result\":\"bye\"}");
    }

    #[test]
    fn structured_content_beside_a_sentence_is_kept_after_it() {
        let r = result(vec![json!({"type": "text", "text": "The total is 3."})], Some(json!({"total": 3})));
        assert_eq!(r.text(), "The total is 3.\n{\"total\":3}");
        let with_image = result(
            vec![
                json!({"type": "text", "text": "See."}),
                json!({"type": "image", "mimeType": "image/png", "data": "AAAA"}),
            ],
            Some(json!({"n": 1})),
        );
        let Content::Parts(parts) = with_image.content() else { panic!("parts") };
        assert_eq!(parts.last(), Some(&ContentPart::Text { text: "{\"n\":1}".into() }));
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
