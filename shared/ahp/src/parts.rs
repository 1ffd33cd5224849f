//! Ids of the text and reasoning parts a model call's reply fills.
//!
//! A part's id must be known while the reply streams, before any message id exists, and the
//! same id must come out of a replay without deltas: so it is derived from the model call and
//! its attempt (a retried call streams its new attempt into a part of its own).

use turnstone_engine::ids::CallId;

/// The markdown part of attempt `attempt` of model call `call_id`.
pub(crate) fn text_id(call_id: &CallId, attempt: u32) -> String {
    format!("{call_id}/{attempt}/text")
}

/// The reasoning part of attempt `attempt` of model call `call_id`.
pub(crate) fn reasoning_id(call_id: &CallId, attempt: u32) -> String {
    format!("{call_id}/{attempt}/reasoning")
}
