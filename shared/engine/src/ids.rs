//! Typed ids, and minting fresh ones deterministically from the entropy a command brings.
//!
//! Every id the engine handles is a newtype over `String` that serializes as the bare string,
//! so the wire and snapshot JSON are what they were with plain strings, while a session id can
//! no longer be passed where a call id is expected. Agent ids stay `String`: they name
//! configuration, not anything the engine creates.

use std::borrow::Borrow;
use std::fmt;

use serde::{Deserialize, Serialize};

/// What [`is_safe`] allows, for error messages.
pub const SAFE_ID: &str = "1-128 characters of A-Z, a-z, 0-9, '-', '_', '.', ':'";

/// Whether `id` may name something clients address (a session, a turn): such ids travel in
/// URLs and storage keys, so they keep to a small alphabet and length ([`SAFE_ID`]).
pub fn is_safe(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

macro_rules! ids {
    ($($(#[$doc:meta])* $name:ident;)+) => {$(
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps `id` as is (no check: ids from outside are opaque strings).
            pub fn new(id: impl Into<String>) -> Self {
                $name(id.into())
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id as a `String`.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                $name(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                $name(id.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> Self {
                id.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        // An id reads as the string it is (store keys, URLs, headers, logs); what keeps ids
        // apart is that parameters and fields are typed, and a `&str` never becomes an id
        // without `From`.
        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }
    )+};
}

ids! {
    /// A session; chosen by the client (or `<decision id>-<tool call id>` for a child the
    /// engine's proposal spawns).
    SessionId;
    /// A turn's idempotency id: given by the client, or minted as `turn_<16 hex>`.
    TurnId;
    /// A call: tool calls (`call_<16 hex>`, or the model's tool call id), LLM calls
    /// (`llm_<16 hex>`) and sub-agent delegations (the parent's tool call id).
    CallId;
    /// A decision, `dec_<16 hex>`; its redeliveries carry the same id.
    DecisionId;
    /// A node of the message tree: given by the client, minted as `msg_<16 hex>`, or the id of
    /// the LLM call whose answer it records.
    MessageId;
    /// An interrupt: given by the worker, or minted as `int_<16 hex>`.
    InterruptId;
}

/// Mints ids from a seed: the same seed gives the same ids, so a command handled twice with
/// the same [`crate::session::Ctx`] yields identical events (the ids land in the events, so
/// replay never mints).
#[derive(Debug, Clone)]
pub struct IdMinter {
    state: u64,
}

impl IdMinter {
    /// A minter seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        IdMinter { state: seed }
    }

    /// The next 64 random-looking bits (splitmix64).
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `prefix_<16 hex>`.
    fn mint(&mut self, prefix: &str) -> String {
        format!("{prefix}_{:016x}", self.next_u64())
    }

    /// A fresh `turn_<16 hex>`.
    pub fn turn_id(&mut self) -> TurnId {
        TurnId(self.mint("turn"))
    }

    /// A fresh `call_<16 hex>`, for a tool call.
    pub fn tool_call_id(&mut self) -> CallId {
        CallId(self.mint("call"))
    }

    /// A fresh `llm_<16 hex>`, for an LLM call.
    pub fn llm_call_id(&mut self) -> CallId {
        CallId(self.mint("llm"))
    }

    /// A fresh `dec_<16 hex>`.
    pub fn decision_id(&mut self) -> DecisionId {
        DecisionId(self.mint("dec"))
    }

    /// A fresh `msg_<16 hex>`.
    pub fn message_id(&mut self) -> MessageId {
        MessageId(self.mint("msg"))
    }

    /// A fresh `int_<16 hex>`.
    pub fn interrupt_id(&mut self) -> InterruptId {
        InterruptId(self.mint("int"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn ids_are_transparent_strings() {
        let id = CallId::new("call_1");
        assert_eq!(format!("{id:?}"), "\"call_1\"");
        assert_eq!(id.to_string(), "call_1");
        assert_eq!(serde_json::to_string(&id).ok().as_deref(), Some("\"call_1\""));
        assert_eq!(serde_json::from_str::<CallId>("\"call_1\"").ok(), Some(id.clone()));
        assert_eq!(id, "call_1");
        assert_eq!("call_1", id);
        let map = BTreeMap::from([(TurnId::from("t1"), 1)]);
        assert_eq!(map.get("t1"), Some(&1));
        assert_eq!(serde_json::to_string(&map).ok().as_deref(), Some(r#"{"t1":1}"#));
    }

    #[test]
    fn minting_keeps_the_prefixes() {
        let mut ids = IdMinter::new(7);
        let mut same = IdMinter::new(7);
        assert_eq!(ids.turn_id().as_str(), same.mint("turn"));
        assert!(ids.tool_call_id().as_str().starts_with("call_"));
        assert!(ids.llm_call_id().as_str().starts_with("llm_"));
        assert!(ids.decision_id().as_str().starts_with("dec_"));
        assert!(ids.message_id().as_str().starts_with("msg_"));
        assert_eq!(ids.interrupt_id().as_str().len(), "int_".len() + 16);
    }
}
