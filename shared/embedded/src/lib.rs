//! Turnstone's single-machine adapters: [`SqliteStore`], the `Store` port on a SQLite file,
//! and [`MemoryQueue`], the `Queue` port as an in-process delay queue (DESIGN.md section 2);
//! [`MemoryStore`], the `Store` port in memory, for tests and simulations.

mod error;
pub mod memory;
pub mod queue;
pub mod sqlite;

pub use error::SqliteError;

use std::path::Path;
use std::sync::Arc;

use turnstone_runtime::clock::SystemClock;
use turnstone_runtime::config::Config;

/// How long a wake-up a local queue worker took stays invisible before it is delivered again:
/// longer than most model calls, so a running session is not woken twice.
const LOCAL_VISIBILITY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The store and queue of a local host: `turnstone.sqlite` in `data_dir` at the config's
/// durability, and an in-process queue.
pub fn open_local(config: &Config, data_dir: &Path) -> Result<(SqliteStore, MemoryQueue), SqliteError> {
    let options = SqliteOptions { durability: config.server.durability, ..SqliteOptions::default() };
    let store = SqliteStore::open_with(data_dir.join("turnstone.sqlite"), options, Arc::new(SystemClock))?;
    Ok((store, MemoryQueue::new(LOCAL_VISIBILITY_TIMEOUT)))
}
pub use memory::MemoryStore;
pub use queue::MemoryQueue;
pub use sqlite::{Durability, GroupStats, SqliteOptions, SqliteStore, StoreStats};
