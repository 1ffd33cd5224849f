//! Turnstone's pure core: the decision protocol's types and the event-sourced session.
//!
//! Nothing here does I/O, spawns tasks or reads a clock: time and fresh ids come in through
//! [`session::Ctx`], so replaying a session's events rebuilds the identical state.

pub mod ids;
pub mod llm_format;
pub mod protocol;
#[cfg(feature = "schema")]
pub mod schema;
pub mod session;
pub mod time;

#[cfg(feature = "testing")]
pub mod testing;
