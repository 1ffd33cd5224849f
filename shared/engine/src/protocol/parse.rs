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

/// Parses a worker's `DecisionResponse` (a webhook's body, or the data of a `decision.result`
/// event of its stream) leniently: fields the protocol does not know, at any depth, are
/// ignored and their paths returned (`session_id`, `actions[1].trace`) in the order they are
/// read (document order, but key order inside an action or a content part).
/// Everything else is as strict as [`parse_slice`]: an unknown action `type`, enum value or
/// content part, a missing field or a wrong type is an error naming its path.
pub fn parse_response(bytes: &[u8]) -> Result<(super::DecisionResponse, Vec<String>), ProtocolError> {
    lenient(|| parse_slice(bytes))
}

/// Runs `parse` with unknown fields ignored and collected (see [`parse_response`]).
fn lenient<T>(parse: impl FnOnce() -> Result<T, ProtocolError>) -> Result<(T, Vec<String>), ProtocolError> {
    let scope = LenientScope::enter();
    let value = parse()?;
    Ok((value, scope.ignored()))
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
        // A missing field is named by the object that lacks it: name the field itself.
        None => match missing_field(text) {
            Some(field) => ProtocolError::new(join(outer, field), strip_position(text)),
            None => ProtocolError::new(outer, strip_position(text)),
        },
    }
}

/// The field of serde's "missing field `x`" message.
fn missing_field(text: &str) -> Option<&str> {
    text.strip_prefix("missing field `")?.split_once('`').map(|(field, _)| field)
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

/// Segments a path shows at most: a document nested past serde_json's recursion limit would
/// otherwise be named by a path thousands of characters long.
const MAX_PATH_SEGMENTS: usize = 16;

fn render_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for (i, segment) in path.iter().enumerate() {
        if i == MAX_PATH_SEGMENTS {
            out.push_str("...");
            break;
        }
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
///
/// It is also where a lenient parse ([`parse_response`]) drops unknown fields: every protocol
/// struct is read through it, knowing its field names, so a key that is not one of them is
/// recorded (with the path [`Tracked`] keeps) and skipped before the derived code (strict or
/// not) sees it. Outside a lenient parse it changes nothing.
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
        self.0.deserialize_struct(name, fields, ObjectOnly { visitor, fields })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

/// A struct visitor that accepts only a map; anything else is an "invalid type" error.
struct ObjectOnly<V> {
    visitor: V,
    /// The struct's field names.
    fields: &'static [&'static str],
}

impl<'de, V: serde::de::Visitor<'de>> serde::de::Visitor<'de> for ObjectOnly<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        if is_lenient() {
            self.visitor.visit_map(KnownFields { inner: map, fields: self.fields, key: None })
        } else {
            self.visitor.visit_map(map)
        }
    }
}

// ----- the lenient parse -------------------------------------------------------------------
//
// serde gives a `Deserialize` impl no context, and the tagged unions re-parse their bodies
// from a `Value` (see `variant`), so the state of a lenient parse lives in a thread-local for
// the parse's duration: whether it is on, the path of the value being read, and the ignored
// fields so far. It is set and cleared by `LenientScope` (also on unwinding), never outlives
// one parse, and holds no data across calls: parsing stays a pure function of its input.

/// One step of a path.
enum Segment {
    Field(String),
    Index(usize),
}

#[derive(Default)]
struct LenientState {
    path: Vec<Segment>,
    ignored: Vec<String>,
}

std::thread_local! {
    static LENIENT: std::cell::RefCell<Option<LenientState>> = const { std::cell::RefCell::new(None) };
}

/// A lenient parse running on this thread; restores what was there before when dropped.
struct LenientScope {
    outer: Option<LenientState>,
}

impl LenientScope {
    fn enter() -> Self {
        let outer = LENIENT.with(|l| l.borrow_mut().replace(LenientState::default()));
        LenientScope { outer }
    }

    /// The ignored fields' paths so far.
    fn ignored(&self) -> Vec<String> {
        LENIENT.with(|l| l.borrow_mut().as_mut().map(|s| std::mem::take(&mut s.ignored)).unwrap_or_default())
    }
}

impl Drop for LenientScope {
    fn drop(&mut self) {
        let outer = self.outer.take();
        LENIENT.with(|l| *l.borrow_mut() = outer);
    }
}

fn is_lenient() -> bool {
    LENIENT.with(|l| l.borrow().is_some())
}

/// Records the unknown field `key` of the value being read.
fn ignore_field(key: &str) {
    LENIENT.with(|l| {
        if let Some(state) = l.borrow_mut().as_mut() {
            let mut path = String::new();
            for segment in state.path.iter().chain(std::iter::once(&Segment::Field(key.to_owned()))) {
                match segment {
                    Segment::Index(i) => path.push_str(&format!("[{i}]")),
                    Segment::Field(name) => {
                        if !path.is_empty() {
                            path.push('.');
                        }
                        path.push_str(name);
                    }
                }
            }
            state.ignored.push(path);
        }
    });
}

/// The value at `segment` is being read until the guard drops.
struct At;

impl At {
    fn enter(segment: Segment) -> At {
        LENIENT.with(|l| {
            if let Some(state) = l.borrow_mut().as_mut() {
                state.path.push(segment);
            }
        });
        At
    }
}

impl Drop for At {
    fn drop(&mut self) {
        LENIENT.with(|l| {
            if let Some(state) = l.borrow_mut().as_mut() {
                state.path.pop();
            }
        });
    }
}

/// A struct's map with the keys that are not its fields recorded and skipped; each field's
/// value is read [`Tracked`] under its name.
struct KnownFields<A> {
    inner: A,
    fields: &'static [&'static str],
    /// The key whose value comes next.
    key: Option<String>,
}

impl<'de, A: serde::de::MapAccess<'de>> serde::de::MapAccess<'de> for KnownFields<A> {
    type Error = A::Error;

    fn next_key_seed<K: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        use serde::de::IntoDeserializer;
        while let Some(key) = self.inner.next_key::<String>()? {
            if self.fields.contains(&key.as_str()) {
                let field = seed.deserialize(key.as_str().into_deserializer())?;
                self.key = Some(key);
                return Ok(Some(field));
            }
            ignore_field(&key);
            self.inner.next_value::<serde::de::IgnoredAny>()?;
        }
        Ok(None)
    }

    fn next_value_seed<V: serde::de::DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        let _at = At::enter(Segment::Field(self.key.take().unwrap_or_default()));
        self.inner.next_value_seed(Tracked(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// Keeps the lenient parse's path while a field's value is read: as a seed, a deserializer and
/// a visitor it passes everything through, and counts the elements of sequences (and of
/// sequences inside options) into the path. Structs inside keep their own field names (each is
/// read through [`MapOnly`]); the tagged unions' bodies are re-parsed inside the same path.
struct Tracked<T>(T);

impl<'de, S: serde::de::DeserializeSeed<'de>> serde::de::DeserializeSeed<'de> for Tracked<S> {
    type Value = S::Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(TrackedDe(d))
    }
}

/// [`Tracked`] as a deserializer.
struct TrackedDe<D>(D);

macro_rules! forward_deserialize {
    ($($method:ident),+ $(,)?) => {
        $(
            fn $method<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
                self.0.$method(Tracked(visitor))
            }
        )+
    };
}

impl<'de, D: serde::Deserializer<'de>> serde::Deserializer<'de> for TrackedDe<D> {
    type Error = D::Error;

    forward_deserialize!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_unit,
        deserialize_seq,
        deserialize_map,
        deserialize_identifier,
        deserialize_ignored_any,
    );

    fn deserialize_unit_struct<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_unit_struct(name, Tracked(visitor))
    }

    fn deserialize_newtype_struct<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_newtype_struct(name, Tracked(visitor))
    }

    fn deserialize_tuple<V: serde::de::Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, Tracked(visitor))
    }

    fn deserialize_tuple_struct<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple_struct(name, len, Tracked(visitor))
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_struct(name, fields, Tracked(visitor))
    }

    fn deserialize_enum<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_enum(name, variants, Tracked(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident: $ty:ty),+ $(,)?) => {
        $(
            fn $method<E: serde::de::Error>(self, v: $ty) -> Result<V::Value, E> {
                self.0.$method(v)
            }
        )+
    };
}

impl<'de, V: serde::de::Visitor<'de>> serde::de::Visitor<'de> for Tracked<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.0.expecting(f)
    }

    forward_visit!(
        visit_bool: bool,
        visit_i8: i8,
        visit_i16: i16,
        visit_i32: i32,
        visit_i64: i64,
        visit_i128: i128,
        visit_u8: u8,
        visit_u16: u16,
        visit_u32: u32,
        visit_u64: u64,
        visit_u128: u128,
        visit_f32: f32,
        visit_f64: f64,
        visit_char: char,
        visit_str: &str,
        visit_borrowed_str: &'de str,
        visit_string: String,
        visit_bytes: &[u8],
        visit_borrowed_bytes: &'de [u8],
        visit_byte_buf: Vec<u8>,
    );

    fn visit_none<E: serde::de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(TrackedDe(d))
    }

    fn visit_newtype_struct<D: serde::Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.0.visit_newtype_struct(TrackedDe(d))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(TrackedSeq { inner: seq, index: 0 })
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(map)
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.0.visit_enum(data)
    }
}

/// A sequence whose elements are read [`Tracked`] under their index.
struct TrackedSeq<A> {
    inner: A,
    index: usize,
}

impl<'de, A: serde::de::SeqAccess<'de>> serde::de::SeqAccess<'de> for TrackedSeq<A> {
    type Error = A::Error;

    fn next_element_seed<T: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        let _at = At::enter(Segment::Index(self.index));
        self.index += 1;
        self.inner.next_element_seed(Tracked(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
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
