//! The JSON Schema of the decision protocol, generated from the wire types (feature `schema`).
//!
//! [`documents`] is what `schema/*.json` at the repository root holds, one document per
//! top-level type, each self-contained (what it refers to is in its own `$defs`). The schemas
//! come from `schemars`' derive, which reads the same serde attributes the derived
//! `Serialize` uses; where deserialization is written by hand the types carry what the derive
//! cannot see:
//!
//! - the tagged unions (`Trigger`, `Action`, `ClientInput`, `ContentPart`, `ToolInput`) read
//!   their tag themselves (`parse::tagged_deserialize!`) exactly as serde's `tag = "..."`
//!   would; `Trigger` and `ToolInput` also refuse unknown fields in every variant (their
//!   private body structs do), hence `schemars(deny_unknown_fields)` on them;
//! - `T | null` fields that must be present (`parse::nullable`) use [`Nullable`];
//! - the worker's answer (`decision-response.json`) is read leniently (`parse_response`):
//!   unknown fields are ignored at any depth, so that document drops every
//!   `additionalProperties: false`; a `proposed` response inside a `DecisionRequest` stays
//!   strict, as `parse` reads it.
//!
//! The engine's tests check the committed files against this, the round-trip fixtures against
//! the files, and that schema and parser accept and refuse the same mutations of the fixtures.

use std::borrow::Cow;
use std::marker::PhantomData;

use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings};
use serde_json::{Map, Value};

use crate::protocol::{ClientInput, DecisionRequest, DecisionResponse, LlmRequest, LlmResponse, StreamDelta};

/// The command that rewrites `schema/*.json` from the types.
pub const REGENERATE: &str = "cargo run -p turnstone-engine --features schema --example schema -- --write";

/// The schema of a field that must be present and may be `null` (read with `parse::nullable`):
/// `Option<T>`'s schema, but required (schemars takes every `Option` field as optional).
pub struct Nullable<T>(PhantomData<T>);

impl<T: JsonSchema> JsonSchema for Nullable<T> {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        <Option<T>>::schema_name()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        <Option<T>>::json_schema(generator)
    }
}

/// One file of `schema/`.
pub struct Document {
    /// Its name under `schema/`, e.g. `decision-request.json`.
    pub file: &'static str,
    /// The schema.
    pub schema: Value,
}

impl Document {
    /// The file's exact text: pretty JSON, keys sorted, one trailing newline.
    pub fn text(&self) -> String {
        // Serializing a `Value` cannot fail (its keys are strings).
        let mut text = serde_json::to_string_pretty(&self.schema).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// Every schema document, in a fixed order.
pub fn documents() -> Vec<Document> {
    let mut response = generate::<DecisionResponse>();
    lenient(&mut response);
    if let Value::Object(root) = &mut response {
        root.insert(
            "description".into(),
            Value::String(
                "A worker's answer to a DecisionRequest (a webhook's JSON body, or the data of a \
                 `decision.result` event). Fields the protocol does not know are ignored at any \
                 depth; unknown variants (an action type, an enum value, a content part) are \
                 refused."
                    .into(),
            ),
        );
    }
    vec![
        Document { file: "decision-request.json", schema: generate::<DecisionRequest>() },
        Document { file: "decision-response.json", schema: response },
        Document { file: "client-input.json", schema: generate::<ClientInput>() },
        Document { file: "llm-request.json", schema: generate::<LlmRequest>() },
        Document { file: "llm-response.json", schema: generate::<LlmResponse>() },
        Document { file: "stream-delta.json", schema: generate::<StreamDelta>() },
    ]
}

fn generate<T: JsonSchema>() -> Value {
    let schema = SchemaGenerator::new(SchemaSettings::draft2020_12()).into_root_schema_for::<T>();
    tidied(schema.to_value())
}

/// A generated schema as the files hold it: doc links as code spans, `u32` bounds stated, keys
/// sorted. The HTTP API's OpenAPI document passes its schemas through this too, so a type's
/// schema reads the same there as in `schema/`.
pub fn tidied(mut value: Value) -> Value {
    tidy(&mut value);
    sorted(value)
}

/// Rustdoc's intra-doc links (``[`Message`]``) read as plain code spans (`` `Message` ``), and a
/// `u32` says its upper bound (schemars gives only `format: uint32`, which validators do not
/// assert; serde refuses a larger number).
fn tidy(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("format").and_then(Value::as_str) == Some("uint32") && !map.contains_key("maximum") {
                map.insert("maximum".into(), Value::from(u32::MAX));
            }
            for (key, v) in map.iter_mut() {
                match v {
                    Value::String(text) if key == "description" => {
                        *text = text.replace("[`", "`").replace("`]", "`");
                    }
                    _ => tidy(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

/// Drops every `additionalProperties: false`: the lenient parse ignores unknown fields.
fn lenient(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("additionalProperties") == Some(&Value::Bool(false)) {
                map.remove("additionalProperties");
            }
            map.values_mut().for_each(lenient);
        }
        Value::Array(items) => items.iter_mut().for_each(lenient),
        _ => {}
    }
}

/// `value` with every object's keys in order, so the files' text does not depend on whether
/// serde_json's `preserve_order` is on in a build.
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect::<Map<_, _>>())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
