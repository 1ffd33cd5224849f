//! Where a Turnstone session lives in AHP's address space.
//!
//! A session is an AHP session; its one chat, the default chat, is the session's active path.
//! AHP never encodes the session in a chat URI, so both take the session id as their path.

use turnstone_engine::ids::SessionId;

/// The AHP session URI of Turnstone session `id`: `ahp-session:/<id>`.
pub fn session_uri(id: &SessionId) -> String {
    format!("ahp-session:/{id}")
}

/// The URI of session `id`'s default chat: `ahp-chat:/<id>`.
pub fn chat_uri(id: &SessionId) -> String {
    format!("ahp-chat:/{id}")
}
