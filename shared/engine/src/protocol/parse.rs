//! Parsing protocol documents with errors that name the offending field's path.
//!
//! `serde` alone loses the path inside internally tagged enums (it buffers the map before
//! it knows the variant), so the protocol's tagged unions (`Trigger`, `Action`,
//! `ClientInput`, `ContentPart`) deserialize through [`tagged_deserialize!`], which reads
//! the tag itself and carries the inner path out in the error message. [`parse`] then joins
//! the outer and inner paths into one, e.g. `actions[2].type: unknown action "tool.cal"`.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A document that is not a valid message of its type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.display())]
pub struct ProtocolError {
    /// Where the problem is, e.g. `actions[2].type`; empty for the document itself.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl ProtocolError {
    /// An error at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ProtocolError { path: path.into(), message: message.into() }
    }

    fn display(&self) -> String {
        if self.path.is_empty() { self.message.clone() } else { format!("{}: {}", self.path, self.message) }
    }
}

/// Separates an inner path from its message inside a serde error string.
const MARK: char = '\u{1f}';

/// Parses `T` from JSON text.
pub fn parse_str<T: DeserializeOwned>(text: &str) -> Result<T, ProtocolError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(from_path_error)?;
    de.end().map_err(|e| ProtocolError::new("", e.to_string()))?;
    Ok(value)
}

/// Parses `T` from JSON bytes.
pub fn parse_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ProtocolError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ProtocolError::new("", format!("not UTF-8: {e}")))?;
    parse_str(text)
}

/// Parses `T` from a JSON value.
pub fn parse<T: DeserializeOwned>(value: Value) -> Result<T, ProtocolError> {
    serde_path_to_error::deserialize(value).map_err(from_path_error)
}

fn from_path_error<E: std::fmt::Display>(err: serde_path_to_error::Error<E>) -> ProtocolError {
    let outer = render_path(err.path());
    let text = err.inner().to_string();
    split(&outer, &text)
}

/// Splits a message that may carry an inner path (see [`nested_error`]) and joins it to `outer`.
fn split(outer: &str, text: &str) -> ProtocolError {
    // serde_json appends " at line L column C" to custom messages; keep it out of the path.
    match text.split_once(MARK) {
        Some((inner, rest)) => {
            let message = rest.split_once(MARK).map_or(rest, |(m, _)| m);
            ProtocolError::new(join(outer, inner), message)
        }
        None => ProtocolError::new(outer, strip_position(text)),
    }
}

fn strip_position(text: &str) -> String {
    match text.rfind(" at line ") {
        Some(i) if text[i..].contains(" column ") => text[..i].to_owned(),
        _ => text.to_owned(),
    }
}

fn join(outer: &str, inner: &str) -> String {
    match (outer.is_empty() || outer == ".", inner.is_empty()) {
        (true, _) => inner.to_owned(),
        (false, true) => outer.to_owned(),
        (false, false) if inner.starts_with('[') => format!("{outer}{inner}"),
        (false, false) => format!("{outer}.{inner}"),
    }
}

fn render_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {}
        }
    }
    out
}

/// Encodes an error at `path` (relative to the value being deserialized) so that
/// [`parse`] can recover the path. Used by the tagged unions.
pub fn nested_error<E: serde::de::Error>(err: ProtocolError) -> E {
    E::custom(format!("{}{MARK}{}{MARK}", err.path, err.message))
}

/// Deserializes the variant body of a tagged union, keeping the path of any error.
pub fn variant<T: DeserializeOwned>(body: serde_json::Map<String, Value>) -> Result<T, ProtocolError> {
    parse(Value::Object(body))
}

/// Implements `Deserialize` for an internally tagged union (`"type"` field) whose variants
/// are read from private body structs, with errors that keep their path.
macro_rules! tagged_deserialize {
    ($ty:ty, $what:literal, { $($tag:literal => $body:ty => $make:expr),+ $(,)? }) => {
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                use $crate::protocol::parse::{nested_error, variant, ProtocolError};
                let mut body = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
                let tag = match body.remove("type") {
                    Some(serde_json::Value::String(tag)) => tag,
                    Some(_) => return Err(nested_error(ProtocolError::new("type", "must be a string"))),
                    None => return Err(nested_error(ProtocolError::new("type", concat!("missing ", $what, " type")))),
                };
                match tag.as_str() {
                    $($tag => variant::<$body>(body).map($make).map_err(nested_error),)+
                    other => Err(nested_error(ProtocolError::new(
                        "type",
                        format!(concat!("unknown ", $what, " {:?} (expected one of: {})"), other, [$($tag),+].join(", ")),
                    ))),
                }
            }
        }
    };
}
pub(crate) use tagged_deserialize;
