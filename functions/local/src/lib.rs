//! The `turnstone` binary's code, as a library so its tests can drive the commands in-process.

pub mod cli;
