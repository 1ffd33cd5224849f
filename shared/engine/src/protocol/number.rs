//! Numbers on the wire: `f64` fields serialize whole values as JSON integers.
//!
//! serde_json writes `30.0_f64` as `30.0`, so a document that arrived with `"timeout_secs": 30`
//! would leave as `30.0`: equal in value, but no longer the same JSON (`serde_json::Value`
//! compares `30` and `30.0` as different numbers). The protocol's numbers are plain JSON
//! numbers, so a whole value is written the way every other JSON writer writes it.

use serde::Serializer;

/// The largest integer an `f64` holds exactly (2^53).
const EXACT: f64 = 9_007_199_254_740_992.0;

/// Serializes `value` as an integer when it is whole and exactly representable, else as a float.
pub fn compact_f64<S: Serializer>(value: &f64, s: S) -> Result<S::Ok, S::Error> {
    let v = *value;
    if v.is_finite() && v.fract() == 0.0 && v.abs() <= EXACT {
        s.serialize_i64(v as i64)
    } else {
        s.serialize_f64(v)
    }
}

/// [`compact_f64`] for an optional number; `None` serializes as `null`.
pub fn compact_opt_f64<S: Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) => compact_f64(v, s),
        None => s.serialize_none(),
    }
}
