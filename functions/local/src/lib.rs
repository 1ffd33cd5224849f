//! The `turnstone` binary's code, as a library so its tests can drive the commands in-process.

pub mod cli;

/// The process's allocator, for every program that links this crate (the binary and its
/// benchmark): a turn allocates and frees many small strings and maps, and glibc's malloc and
/// free were about a fifth of a turn's CPU (README, "Performance").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
