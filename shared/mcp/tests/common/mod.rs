//! The crate's test servers ([`turnstone_mcp::testing`]) and argument objects.

#![allow(dead_code)] // Each test binary uses its own part of this.
#![allow(clippy::panic)] // test support: fails loudly

pub use turnstone_mcp::testing::*;

pub fn args(value: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match value {
        serde_json::Value::Object(map) => map,
        other => panic!("arguments must be an object, not {other}"),
    }
}
