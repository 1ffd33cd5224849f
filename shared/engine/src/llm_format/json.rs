//! Small readers over `serde_json::Value` whose errors name the path of the offending field.

use serde_json::{Map, Value};

use super::FormatError;

/// `value` as a JSON number, whole values as integers (`1`, not `1.0`); non-finite values as `null`.
pub(crate) fn number(value: f64) -> Value {
    /// The largest integer an `f64` holds exactly (2^53).
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if value.is_finite() && value.fract() == 0.0 && value.abs() <= EXACT {
        Value::from(value as i64)
    } else {
        Value::from(value)
    }
}

/// `base.key`, or `key` alone at the document root.
pub(crate) fn join(base: &str, key: &str) -> String {
    if base.is_empty() { key.to_owned() } else { format!("{base}.{key}") }
}

/// `base[i]`.
pub(crate) fn index(base: &str, i: usize) -> String {
    format!("{base}[{i}]")
}

pub(crate) use crate::protocol::parse::json_kind as kind;

fn expected(path: String, what: &str, found: &Value) -> FormatError {
    FormatError::new(path, format!("expected {what}, found {}", kind(found)))
}

/// `value` as an object, or an error at `path`.
pub(crate) fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, FormatError> {
    value.as_object().ok_or_else(|| expected(path.to_owned(), "an object", value))
}

/// Field `key` of `obj`; `None` when absent or null.
pub(crate) fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// Field `key` of the object at `base` as a string, if present and not null.
pub(crate) fn opt_str<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    base: &str,
) -> Result<Option<&'a str>, FormatError> {
    match get(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(expected(join(base, key), "a string", other)),
    }
}

/// Field `key` of the object at `base` as a string, required.
pub(crate) fn req_str<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    base: &str,
) -> Result<&'a str, FormatError> {
    opt_str(obj, key, base)?.ok_or_else(|| FormatError::new(join(base, key), "missing"))
}

/// Field `key` of the object at `base` as an array, if present and not null.
pub(crate) fn opt_array<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    base: &str,
) -> Result<Option<&'a Vec<Value>>, FormatError> {
    match get(obj, key) {
        None => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(other) => Err(expected(join(base, key), "an array", other)),
    }
}

/// Field `key` of the object at `base` as an array, required.
pub(crate) fn req_array<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    base: &str,
) -> Result<&'a Vec<Value>, FormatError> {
    opt_array(obj, key, base)?.ok_or_else(|| FormatError::new(join(base, key), "missing"))
}

/// Field `key` of the object at `base` as an object, if present and not null.
pub(crate) fn opt_object<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    base: &str,
) -> Result<Option<&'a Map<String, Value>>, FormatError> {
    get(obj, key).map(|v| object(v, &join(base, key))).transpose()
}

/// Field `key` of the object at `base` as an object, required.
pub(crate) fn req_object<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    base: &str,
) -> Result<&'a Map<String, Value>, FormatError> {
    opt_object(obj, key, base)?.ok_or_else(|| FormatError::new(join(base, key), "missing"))
}

/// Field `key` of the object at `base` as a non-negative integer, if present and not null.
pub(crate) fn opt_u64(obj: &Map<String, Value>, key: &str, base: &str) -> Result<Option<u64>, FormatError> {
    match get(obj, key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| expected(join(base, key), "a non-negative integer", v)),
    }
}

/// Field `key` of the object at `base` as a non-negative integer, required.
pub(crate) fn req_u64(obj: &Map<String, Value>, key: &str, base: &str) -> Result<u64, FormatError> {
    opt_u64(obj, key, base)?.ok_or_else(|| FormatError::new(join(base, key), "missing"))
}

/// The provider error a body carries in its `error` field, if any.
///
/// Both providers shape it `{"error": {"type": ..., "message": ...}}` (OpenAI adds `code`);
/// some OpenAI-compatible servers send a bare string.
/// What a provider's error says when it says nothing.
const NO_MESSAGE: &str = "the provider reported an error without a message";

pub(crate) fn provider_error(obj: &Map<String, Value>) -> Option<FormatError> {
    let error = get(obj, "error")?;
    let message = match error {
        Value::String(s) if !s.is_empty() => s.clone(),
        Value::String(_) => NO_MESSAGE.to_owned(),
        Value::Object(e) => {
            let text =
                e.get("message").and_then(Value::as_str).filter(|m| !m.is_empty()).unwrap_or(NO_MESSAGE);
            let kind = e
                .get("type")
                .and_then(Value::as_str)
                .or_else(|| e.get("code").and_then(Value::as_str))
                .filter(|k| !k.is_empty());
            match kind {
                Some(kind) => format!("{kind}: {text}"),
                None => text.to_owned(),
            }
        }
        other => other.to_string(),
    };
    Some(FormatError::new("error", message))
}
