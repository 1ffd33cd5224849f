//! Conversation messages: roles, content, tool calls, and the message tree.

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use serde_json::Value;

use crate::ids::{CallId, MessageId};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions; never stored in the transcript (the agent config holds the system prompt).
    System,
    /// The person (or client) talking to the agent.
    User,
    /// The model.
    Assistant,
    /// A tool's answer to one tool call.
    Tool,
}

/// A message body: plain text or a list of typed parts.
///
/// Deserialized by hand rather than `#[serde(untagged)]`: a string is [`Content::Text`], an
/// array is [`Content::Parts`] read part by part (so an error names the part, e.g.
/// `content[1].text`), and anything else is "expected a string or an array of content parts".
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(description = "A message body: plain text or a list of typed parts.")
)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Multimodal parts.
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ContentVisitor)
    }
}

struct ContentVisitor;

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = Content;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string or an array of content parts")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Content, E> {
        Ok(Content::Text(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Content, E> {
        Ok(Content::Text(text))
    }

    // Each part is read through the sequence, so the caller's path tracking (see
    // `parse::parse`) records its index, and a part's own error (from the tagged union)
    // carries its inner path: together `content[1].text`.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
        let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(part) = seq.next_element::<ContentPart>()? {
            parts.push(part);
        }
        Ok(Content::Parts(parts))
    }
}

impl Content {
    /// The text of this content: the string itself, or every text part joined by newlines.
    pub fn text(&self) -> String {
        match self {
            Content::Text(text) => text.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|part| match part {
                    ContentPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

impl ContentPart {
    /// The part as a line of text: a text part's text, any other named by its kind (`[image_url]`).
    pub fn summary(&self) -> String {
        match self {
            ContentPart::Text { text } => text.clone(),
            other => format!("[{}]", other.kind()),
        }
    }

    /// The part's `type` on the wire: `text`, `image_url`, `file`, `input_audio`, `video_url`.
    pub fn kind(&self) -> &'static str {
        match self {
            ContentPart::Text { .. } => "text",
            ContentPart::ImageUrl { .. } => "image_url",
            ContentPart::File { .. } => "file",
            ContentPart::InputAudio { .. } => "input_audio",
            ContentPart::VideoUrl { .. } => "video_url",
        }
    }
}

impl From<&str> for Content {
    fn from(text: &str) -> Self {
        Content::Text(text.to_owned())
    }
}

impl From<String> for Content {
    fn from(text: String) -> Self {
        Content::Text(text)
    }
}

/// One part of a multimodal message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text {
        text: String,
    },
    /// An image by URL (or data URL).
    ImageUrl {
        /// Where the image is.
        image_url: UrlRef,
    },
    /// An attached file, base64 encoded.
    File {
        file: FileData,
    },
    /// Audio input, base64 encoded.
    InputAudio {
        input_audio: AudioData,
    },
    /// A video by URL.
    VideoUrl {
        /// Where the video is.
        video_url: UrlRef,
    },
}

/// `{ url }`, as used by image and video parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct UrlRef {
    pub url: String,
}

/// The `file` of a file part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct FileData {
    /// The file's name.
    pub filename: String,
    /// The file's bytes, base64 (or a data URL).
    pub file_data: String,
}

/// The `input_audio` of an audio part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct AudioData {
    /// The audio bytes, base64.
    pub data: String,
    /// The audio format, e.g. `wav`.
    pub format: String,
}

// The parts' bodies, read through `objects_only!` like every protocol struct (so a lenient
// parse names their unknown fields too); never serialized (`ContentPart` serializes itself).
#[derive(Serialize, Deserialize)]
#[serde(remote = "Self")]
struct TextPart {
    text: String,
}
#[derive(Serialize, Deserialize)]
#[serde(remote = "Self")]
struct ImageUrlPart {
    image_url: UrlRef,
}
#[derive(Serialize, Deserialize)]
#[serde(remote = "Self")]
struct FilePart {
    file: FileData,
}
#[derive(Serialize, Deserialize)]
#[serde(remote = "Self")]
struct InputAudioPart {
    input_audio: AudioData,
}
#[derive(Serialize, Deserialize)]
#[serde(remote = "Self")]
struct VideoUrlPart {
    video_url: UrlRef,
}

super::parse::objects_only!(TextPart, ImageUrlPart, FilePart, InputAudioPart, VideoUrlPart);

super::parse::tagged_deserialize! {
    ContentPart, "content part", {
        "text" => TextPart => |p: TextPart| ContentPart::Text { text: p.text },
        "image_url" => ImageUrlPart => |p: ImageUrlPart| ContentPart::ImageUrl { image_url: p.image_url },
        "file" => FilePart => |p: FilePart| ContentPart::File { file: p.file },
        "input_audio" => InputAudioPart => |p: InputAudioPart| ContentPart::InputAudio { input_audio: p.input_audio },
        "video_url" => VideoUrlPart => |p: VideoUrlPart| ContentPart::VideoUrl { video_url: p.video_url },
    }
}

/// A tool call requested by the model, in the OpenAI shape the protocol uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct ToolCall {
    /// The answering tool message carries it as `tool_call_id`; a `tool.call` or delegation
    /// made for it takes it as its call id.
    pub id: CallId,
    /// Always `function` today.
    #[serde(rename = "type")]
    pub kind: String,
    /// Which function, with what arguments.
    pub function: FunctionCall,
}

impl ToolCall {
    /// A `function` tool call.
    pub fn function(id: impl Into<CallId>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ToolCall {
            id: id.into(),
            kind: "function".to_owned(),
            function: FunctionCall { name: name.into(), arguments: arguments.into() },
        }
    }
}

/// The function of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct FunctionCall {
    pub name: String,
    /// The raw argument string, usually JSON.
    pub arguments: String,
}

/// A message not yet recorded: the same shape as [`Message`] with an optional id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct DraftMessage {
    /// The recorded node this message is, if it is one; absent for news.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<MessageId>,
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
    /// Tool calls the assistant made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// For a tool message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<CallId>,
    /// For a tool message: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// For an assistant message: what its model's provider needs back with it (an extension
    /// of the protocol, [`ProviderBlocks`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_blocks: Option<Box<ProviderBlocks>>,
}

/// Blocks of a model's reply that its provider requires back, unchanged, whenever the reply
/// is sent to it again (an extension of the protocol): Anthropic's signed `thinking` and
/// `redacted_thinking` blocks, which must lead the assistant turn that called a tool while
/// thinking is on; the Responses API's reasoning items with their encrypted content, with
/// markers of where the reply's other items stood. Sent back only to the provider that wrote them (an agent may change
/// models mid-session); clients see their text only as the reply's reasoning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct ProviderBlocks {
    /// The wire format that wrote them: `anthropic`, `openai-responses`.
    pub provider: String,
    /// The blocks, in the order the provider sent them.
    pub blocks: Vec<Value>,
}

impl DraftMessage {
    /// A message of `role` with text content and nothing else.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        DraftMessage {
            id: None,
            role,
            content: Some(Content::Text(text.into())),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            provider_blocks: None,
        }
    }

    /// A user message with text content.
    pub fn user(text: impl Into<String>) -> Self {
        Self::text(Role::User, text)
    }

    /// A tool message answering `tool_call_id`.
    pub fn tool_result(
        tool_call_id: impl Into<CallId>,
        name: impl Into<String>,
        content: impl Into<Content>,
    ) -> Self {
        DraftMessage {
            tool_call_id: Some(tool_call_id.into()),
            name: Some(name.into()),
            content: Some(content.into()),
            ..Self::text(Role::Tool, "")
        }
    }

    /// The same message with `id` set.
    pub fn with_id(mut self, id: impl Into<MessageId>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// This draft recorded as node `id`.
    pub fn into_message(self, id: MessageId) -> Message {
        Message {
            id,
            role: self.role,
            content: self.content,
            tool_calls: self.tool_calls,
            tool_call_id: self.tool_call_id,
            name: self.name,
            provider_blocks: self.provider_blocks,
            compaction: None,
        }
    }

    /// The text of the content, empty when there is none.
    pub fn content_text(&self) -> String {
        self.content.as_ref().map(Content::text).unwrap_or_default()
    }
}

/// A recorded message: a node of the session's message tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct Message {
    pub id: MessageId,
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
    /// Tool calls the assistant made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// For a tool message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<CallId>,
    /// For a tool message: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// For an assistant message: what its model's provider needs back with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_blocks: Option<Box<ProviderBlocks>>,
    /// Set on the engine's compaction marker: a system message recording what the model's view
    /// of the conversation leaves out from here on (an extension of the protocol, see
    /// [`Compaction`]). Only the engine writes one; a draft cannot carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Box<Compaction>>,
}

/// What a compaction marker does to the model's view of the path it is on (an extension of the
/// protocol). The conversation itself is never changed: every message stays recorded and in
/// `messages`; only the requests the engine builds for a model leave out what a marker covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct Compaction {
    /// What it does: `summary` (the marker's content summarizes the path through `through`,
    /// which a model is sent instead) or `cleared_tool_results` (the bodies of the tool
    /// results through `through` are sent as a short stub).
    pub kind: CompactionKind,
    /// The last message it covers, an ancestor of the marker; the messages after it are sent
    /// as they are.
    pub through: MessageId,
}

/// The kinds of [`Compaction`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CompactionKind {
    Summary,
    ClearedToolResults,
}

impl Message {
    /// This message as a draft that names its recorded id.
    pub fn to_draft(&self) -> DraftMessage {
        DraftMessage {
            id: Some(self.id.clone()),
            role: self.role,
            content: self.content.clone(),
            tool_calls: self.tool_calls.clone(),
            tool_call_id: self.tool_call_id.clone(),
            name: self.name.clone(),
            provider_blocks: self.provider_blocks.clone(),
        }
    }

    /// The text of the content, empty when there is none.
    pub fn content_text(&self) -> String {
        self.content.as_ref().map(Content::text).unwrap_or_default()
    }

    /// The tool calls of this message, empty when it has none.
    pub fn tool_calls(&self) -> &[ToolCall] {
        self.tool_calls.as_deref().unwrap_or_default()
    }
}

/// Every recorded message of a session, with the branch structure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct MessageTree {
    /// Every node, parents before children.
    pub nodes: Vec<TreeNode>,
    /// The head of the active branch; absent while the tree is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_id: Option<MessageId>,
}

/// One node of a [`MessageTree`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct TreeNode {
    pub message: Message,
    /// Absent for a root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<MessageId>,
}

super::parse::objects_only!(
    ProviderBlocks,
    UrlRef,
    FileData,
    AudioData,
    ToolCall,
    FunctionCall,
    DraftMessage,
    Message,
    MessageTree,
    TreeNode,
    Compaction
);
