//! Turnstone's runtime: everything between the pure engine and the outside world.

pub mod ahp;
pub mod api;
pub mod app;
pub mod assemble;
pub mod auth;
pub mod clock;
pub mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod dispatch;
pub mod error;
pub mod fork;
pub mod host;
pub mod http;
pub mod llm;
pub mod locks;
mod memo;
pub mod metrics;
pub mod net;
pub mod notify;
#[cfg(feature = "openapi")]
pub mod openapi;
pub mod per_caller;
pub mod pool;
pub mod queue;
pub mod store;
pub mod trace;
pub mod worker;
