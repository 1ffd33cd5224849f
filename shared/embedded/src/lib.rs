//! Turnstone's single-machine adapters: [`SqliteStore`], the `Store` port on a SQLite file,
//! and [`MemoryQueue`], the `Queue` port as an in-process delay queue (DESIGN.md section 2).

mod error;
pub mod queue;
pub mod sqlite;

pub use error::SqliteError;
pub use queue::MemoryQueue;
pub use sqlite::{Durability, GroupStats, SqliteOptions, SqliteStore, StoreStats};
