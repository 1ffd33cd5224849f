//! Checking tool arguments and results against the tool's JSON Schemas.

use serde_json::{Map, Value};

use crate::protocol::ToolInput;

/// Validates a tool call's raw argument string against the tool's input schema: `valid`
/// (parsed and conforming), `invalid` (parsed, violates the schema) or `malformed` (not a
/// JSON object). An empty string counts as `{}`, as models send for argument-less tools.
pub fn validate_arguments(raw: &str, schema: Option<&Value>) -> ToolInput {
    let value = if raw.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        match serde_json::from_str::<Value>(raw) {
            Ok(value) => value,
            Err(e) => return ToolInput::Malformed { error: format!("arguments are not valid JSON: {e}") },
        }
    };
    if !value.is_object() {
        let kind = crate::protocol::parse::json_kind(&value);
        return ToolInput::Malformed { error: format!("arguments must be a JSON object, not {kind}") };
    }
    let Some(schema) = schema else { return ToolInput::Valid { value } };
    match problems(&value, schema) {
        Ok(()) => ToolInput::Valid { value },
        Err(error) => ToolInput::Invalid { value, error },
    }
}

/// Checks a tool result against the tool's output schema; `Err` says what is wrong.
pub fn check_output(result: &Value, schema: &Value) -> Result<(), String> {
    problems(result, schema)
}

/// Every way `instance` violates `schema`, joined: `/path: message; ...`.
fn problems(instance: &Value, schema: &Value) -> Result<(), String> {
    let validator =
        jsonschema::validator_for(schema).map_err(|e| format!("the tool's schema is itself invalid: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() { e.to_string() } else { format!("{at}: {e}") }
        })
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn classifies_arguments() {
        let schema =
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        assert!(matches!(validate_arguments(r#"{"city":"Oslo"}"#, Some(&schema)), ToolInput::Valid { .. }));
        match validate_arguments(r#"{"city":3}"#, Some(&schema)) {
            ToolInput::Invalid { error, .. } => assert!(error.contains("/city"), "{error}"),
            other => panic!("{other:?}"),
        }
        match validate_arguments("{}", Some(&schema)) {
            ToolInput::Invalid { error, .. } => assert!(error.contains("city"), "{error}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(validate_arguments("{nope", Some(&schema)), ToolInput::Malformed { .. }));
        assert!(matches!(validate_arguments("[1]", None), ToolInput::Malformed { .. }));
        assert_eq!(validate_arguments("", None), ToolInput::Valid { value: json!({}) });
    }

    #[test]
    fn checks_output() {
        let schema = json!({"type": "number"});
        assert!(check_output(&json!(3), &schema).is_ok());
        assert!(check_output(&json!("x"), &schema).is_err());
    }
}
