//! Turnstone's runtime: everything between the pure engine and the outside world.

pub mod worker;
