//! Turnstone sessions shown as Agent Host Protocol (AHP) chats.
//!
//! A session's durable log is projected, event by event, into the AHP chat actions a client
//! would receive, and every action is reduced at once with the protocol's own reducer
//! (`ahp::reducers::apply_action_to_chat`), so the projection's [`ChatState`] is by construction
//! the state any AHP client builds from the same actions. Live token deltas of a running model
//! call join the same chat ([`ChatProjection::delta`]); the durable reply that follows ends each
//! part with exactly the recorded text, so a chat rebuilt from the log alone
//! ([`chat_from_log`]) equals the live one.
//!
//! Pure: no I/O, no clock; every time shown comes from the events.

mod compaction;
mod error;
mod input;
mod input_needed;
mod message;
mod parts;
mod projection;
mod stream;
mod tool_call;
mod turn;
mod uri;
mod usage;

pub use ahp_types::StateAction;
pub use ahp_types::state::ChatState;
pub use error::ProjectionError;
pub use input::TOOL_RESULT_QUESTION;
pub use input_needed::{entry_key, input_needed};
pub use projection::{ChatProjection, chat_from_log, shows_in_chat};
pub use turn::Resumption;
pub use uri::{chat_uri, session_uri};
