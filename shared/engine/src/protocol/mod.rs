//! The decision protocol's wire types (seed 000), exactly as they travel as JSON.
//!
//! Optional fields are omitted when absent; `unknown` fields are `serde_json::Value`; a
//! `T | null` field is required and may be `null`. Parse untrusted documents with [`parse`],
//! [`parse_str`] or [`parse_slice`]: their errors name the path of the offending field.
//!
//! Every struct is read from a JSON object only: each derives with `#[serde(remote = "Self")]`
//! and gets its trait impls from `parse::objects_only!`, which refuses the array form serde's
//! derive would otherwise accept. Whole `f64` values serialize as JSON integers (`number`).

mod action;
mod agent;
mod client_input;
mod decision;
mod llm;
mod message;
mod number;
pub(crate) mod parse;
mod trigger;

pub use action::*;
pub use agent::*;
pub use client_input::*;
pub use decision::*;
pub use llm::*;
pub use message::*;
pub use parse::{ProtocolError, parse, parse_slice, parse_str};
pub use trigger::*;
