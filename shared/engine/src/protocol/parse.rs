//! Parsing protocol documents with errors that name the offending field's path.
//!
//! `serde` alone loses the path inside internally tagged enums (it buffers the map before
//! it knows the variant), so the protocol's tagged unions (`Trigger`, `Action`,
//! `ClientInput`, `ContentPart`, and `ToolInput` on its `status`) deserialize through
//! [`tagged_deserialize!`], which reads the tag itself and carries the inner path out in the
//! error message. [`parse`] then joins the outer and inner paths into one, e.g.
//! `actions[2].type: unknown action "tool.cal"`. `Content` (a string or an array of parts)
//! has its own visitor for the same reason `#[serde(untagged)]` would lose the path.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A document that is not a valid message of its type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.display())]
pub struct ProtocolError {
    /// Where the problem is, e.g. `actions[2].type`; empty for the document itself.
    pub path: String,
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
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        // A syntax error is about the text, not a field's value: keep its line and column.
        if err.inner().is_syntax() || err.inner().is_eof() {
            ProtocolError::new(render_path(err.path()), err.inner().to_string())
        } else {
            from_path_error(err)
        }
    })?;
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

/// Reads a field that the protocol requires but allows to be `null` (`T | null`): `null` is
/// `None`, and, unlike a plain `Option` field, an omitted field is a "missing field" error.
/// Use with `#[serde(deserialize_with = "...")]` and without `default`.
pub fn nullable<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    <Option<T> as serde::Deserialize>::deserialize(d)
}

/// The JSON type of `value`, for messages: `a number`, `an object`, ...
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Reads the JSON object of a tagged union's value; anything else is "expected an object
/// with a \"type\" field" (naming the union's tag field).
pub struct TaggedBody {
    /// The tag field's name.
    pub tag: &'static str,
}

impl<'de> serde::de::DeserializeSeed<'de> for TaggedBody {
    type Value = serde_json::Map<String, Value>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TaggedBody {
    type Value = serde_json::Map<String, Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "an object with a {:?} field", self.tag)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut body = serde_json::Map::new();
        while let Some((key, value)) = map.next_entry::<String, Value>()? {
            body.insert(key, value);
        }
        Ok(body)
    }
}

/// Implements `Deserialize` for an internally tagged union whose variants are read from
/// private body structs, with errors that keep their path. The tag is the `"type"` field
/// unless `tag = "..."` names another (e.g. `ToolInput`'s `"status"`).
macro_rules! tagged_deserialize {
    ($ty:ty, $what:literal, { $($rest:tt)* }) => {
        $crate::protocol::parse::tagged_deserialize!($ty, $what, tag = "type", { $($rest)* });
    };
    ($ty:ty, $what:literal, tag = $field:literal, { $($tag:literal => $body:ty => $make:expr),+ $(,)? }) => {
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                use $crate::protocol::parse::{json_kind, nested_error, variant, ProtocolError};
                use serde::de::DeserializeSeed;
                let mut body = $crate::protocol::parse::TaggedBody { tag: $field }.deserialize(d)?;
                let tag = match body.remove($field) {
                    Some(serde_json::Value::String(tag)) => tag,
                    Some(other) => {
                        return Err(nested_error(ProtocolError::new(
                            $field,
                            format!(concat!("the ", $what, " ", $field, " must be a string, not {}"), json_kind(&other)),
                        )))
                    }
                    None => return Err(nested_error(ProtocolError::new($field, concat!("missing ", $what, " ", $field)))),
                };
                match tag.as_str() {
                    $($tag => variant::<$body>(body).map($make).map_err(nested_error),)+
                    other => Err(nested_error(ProtocolError::new(
                        $field,
                        format!(concat!("unknown ", $what, " {:?} (expected one of: {})"), other, [$($tag),+].join(", ")),
                    ))),
                }
            }
        }
    };
}
pub(crate) use tagged_deserialize;

/// Passes a struct's deserialization through, refusing the positional (array) form that serde's
/// derive also accepts: without it, `[]` is a valid `DecisionResponse` (every field optional)
/// and `"agent": ["gpt"]` an `AgentConfig` with model `gpt`. The protocol's structs are objects.
pub struct MapOnly<D>(pub D);

impl<'de, D: serde::Deserializer<'de>> serde::Deserializer<'de> for MapOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(visitor)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_struct(name, fields, ObjectOnly(visitor))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

/// A struct visitor that accepts only a map; anything else is an "invalid type" error.
struct ObjectOnly<V>(V);

impl<'de, V: serde::de::Visitor<'de>> serde::de::Visitor<'de> for ObjectOnly<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.0.expecting(f)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(map)
    }
}

/// Implements `Serialize` and `Deserialize` for structs that derive them with
/// `#[serde(remote = "Self")]` (which makes the derived code inherent functions), reading
/// them through [`MapOnly`] so that only a JSON object is accepted.
macro_rules! objects_only {
    ($($ty:ty),+ $(,)?) => {
        $(
            impl serde::Serialize for $ty {
                fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    <$ty>::serialize(self, s)
                }
            }

            impl<'de> serde::Deserialize<'de> for $ty {
                fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    <$ty>::deserialize($crate::protocol::parse::MapOnly(d))
                }
            }
        )+
    };
}
pub(crate) use objects_only;
