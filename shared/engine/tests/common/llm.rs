//! Builders shared by the wire-format tests (`llm_format.rs`, `llm_format_responses.rs`).
#![allow(dead_code)]
// Test support: a failed expectation here is a failed test.
#![allow(clippy::expect_used)]

use serde_json::Value;
use turnstone_engine::protocol::{LlmRequest, StreamDelta, ToolCallDelta};

/// An `LlmRequest` from its JSON.
pub fn req(value: Value) -> LlmRequest {
    serde_json::from_value(value).expect("a valid LlmRequest")
}

pub fn text_delta(text: &str) -> StreamDelta {
    StreamDelta { text: Some(text.to_owned()), ..StreamDelta::default() }
}

pub fn reasoning_delta(text: &str) -> StreamDelta {
    StreamDelta { reasoning: Some(text.to_owned()), ..StreamDelta::default() }
}

pub fn finish_delta(reason: &str) -> StreamDelta {
    StreamDelta { finish_reason: Some(reason.to_owned()), ..StreamDelta::default() }
}

pub fn call_delta(id: &str, name: Option<&str>, arguments: Option<&str>) -> StreamDelta {
    StreamDelta {
        tool_calls: Some(vec![ToolCallDelta {
            id: id.into(),
            name: name.map(str::to_owned),
            arguments: arguments.map(str::to_owned),
        }]),
        ..StreamDelta::default()
    }
}
