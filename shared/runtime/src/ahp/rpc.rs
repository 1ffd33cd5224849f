//! JSON-RPC 2.0 framing: what a text frame from the client is, and the frames the host sends.

use ahp_types::errors::json_rpc_error_codes;
use ahp_types::messages::{
    JsonRpcError, JsonRpcErrorResponse, JsonRpcMessage, JsonRpcNotification, JsonRpcSuccessResponse,
    JsonRpcVersion,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One frame from the client.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// A request: it gets exactly one response with its id.
    Request { id: u64, method: String, params: Value },
    /// A notification (`dispatchAction`, `unsubscribe`): no response.
    Notification { method: String, params: Value },
    /// Not JSON-RPC; answered with an error when it carries a numeric id.
    Invalid { id: Option<u64>, error: RpcError },
}

/// Reads a text frame.
pub(crate) fn parse(text: &str) -> Incoming {
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => {
            return Incoming::Invalid {
                id: None,
                error: RpcError::new(json_rpc_error_codes::PARSE_ERROR, format!("not JSON: {e}")),
            };
        }
    };
    let id = value.get("id").and_then(Value::as_u64);
    let invalid = |message: &str| Incoming::Invalid {
        id,
        error: RpcError::new(json_rpc_error_codes::INVALID_REQUEST, message.to_owned()),
    };
    if value.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid("jsonrpc must be \"2.0\"");
    }
    let Some(method) = value.get("method").and_then(Value::as_str).map(str::to_owned) else {
        return invalid("a request needs a method");
    };
    let params = value.get("params").cloned().unwrap_or(Value::Null);
    match (value.get("id"), id) {
        (None, _) => Incoming::Notification { method, params },
        (Some(_), Some(id)) => Incoming::Request { id, method, params },
        // AHP's ids are numbers.
        (Some(_), None) => invalid("id must be a non-negative integer"),
    }
}

/// A JSON-RPC error to answer with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RpcError {
    pub code: i32,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        RpcError { code, message: message.into(), data: None }
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// -32602 for params that do not read as `what`.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        RpcError::new(json_rpc_error_codes::INVALID_PARAMS, message)
    }

    /// -32602 for a request on a channel that needs the client's chat subscription.
    pub fn needs_subscription(method: &str) -> Self {
        RpcError::invalid_params(format!("params.channel: {method} needs a subscribed chat channel"))
    }

    /// -32603 for a failure inside the host (a store or registry error, a broken log): the
    /// client gets `internal error` and a reference, never the detail (a store's errors may
    /// name tables, files and other sessions); the detail is logged under that reference.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        let reference = format!("{:016x}", crate::app::random_u64("internal error"));
        tracing::error!(reference = %reference, error = %detail, "an AHP request failed inside the host");
        RpcError::new(json_rpc_error_codes::INTERNAL_ERROR, format!("internal error (ref {reference})"))
            .with_data(serde_json::json!({ "ref": reference }))
    }
}

/// `params` read as `T`; -32602 naming the offending field otherwise.
pub(crate) fn params<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_path_to_error::deserialize(params).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "params".to_owned() } else { format!("params.{path}") };
        RpcError::invalid_params(format!("{field}: {}", e.inner()))
    })
}

/// A success response (every response carries `result`, `null` included).
pub(crate) fn success(id: u64, result: Value) -> String {
    frame(&JsonRpcMessage::SuccessResponse(JsonRpcSuccessResponse {
        jsonrpc: JsonRpcVersion::V2,
        id,
        result,
    }))
}

/// An error response.
pub(crate) fn failure(id: u64, error: RpcError) -> String {
    frame(&JsonRpcMessage::ErrorResponse(JsonRpcErrorResponse {
        jsonrpc: JsonRpcVersion::V2,
        id,
        error: JsonRpcError { code: error.code, message: error.message, data: error.data },
    }))
}

/// A notification from the host (`action`, `root/sessionAdded`).
pub(crate) fn notification(method: &str, params: &impl Serialize) -> String {
    let params = serde_json::to_value(params).unwrap_or(Value::Null);
    frame(&JsonRpcMessage::Notification(JsonRpcNotification {
        jsonrpc: JsonRpcVersion::V2,
        method: method.to_owned(),
        params: Some(params),
    }))
}

/// A result as JSON.
pub(crate) fn to_value(result: &impl Serialize) -> Result<Value, RpcError> {
    serde_json::to_value(result).map_err(|e| RpcError::internal(format!("could not write the result: {e}")))
}

fn frame(message: &JsonRpcMessage) -> String {
    // The wire types serialize infallibly (plain data, string keys).
    serde_json::to_string(message).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_told_apart() {
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","id":3,"method":"ping","params":{}}"#),
            Incoming::Request { id: 3, .. }
        ));
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","method":"unsubscribe","params":{}}"#),
            Incoming::Notification { .. }
        ));
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","id":"x","method":"ping"}"#),
            Incoming::Invalid { id: None, .. }
        ));
        assert!(matches!(parse("nope"), Incoming::Invalid { id: None, .. }));
    }

    #[test]
    fn internal_errors_hide_their_detail() {
        let error = RpcError::internal("DynamoDB GetItem failed: table sessions-prod, session bob-b1");
        assert_eq!(error.code, -32603);
        assert!(error.message.starts_with("internal error (ref "), "{}", error.message);
        assert!(!error.message.contains("bob-b1") && !error.message.contains("DynamoDB"));
        let reference = error.data.as_ref().and_then(|d| d["ref"].as_str()).unwrap_or_default().to_owned();
        assert!(error.message.contains(&reference) && reference.len() == 16, "{error:?}");
        assert_ne!(RpcError::internal("again").data, error.data, "each failure has its own reference");
    }

    #[test]
    fn bad_params_name_the_field() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct P {
            channel: String,
        }
        let error = params::<P>(serde_json::json!({"channel": 3})).unwrap_err();
        assert_eq!(error.code, -32602);
        assert!(error.message.starts_with("params.channel:"), "{}", error.message);
    }
}
