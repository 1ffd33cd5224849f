//! Turnstone's runtime: everything between the pure engine and the outside world.

pub mod clock;
pub mod queue;
pub mod store;
pub mod worker;
