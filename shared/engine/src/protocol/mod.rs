//! The decision protocol's wire types (seed 000), exactly as they travel as JSON.
//!
//! Optional fields are omitted when absent; `unknown` fields are `serde_json::Value`.
//! Parse untrusted documents with [`parse`], [`parse_str`] or [`parse_slice`]: their errors
//! name the path of the offending field.

mod action;
mod agent;
mod client_input;
mod decision;
mod llm;
mod message;
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
