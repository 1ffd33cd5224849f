//! Writes (`--write`) or checks `openapi.json` at the repository root, the HTTP API's OpenAPI
//! document generated from the router's types.
//!
//!     cargo run -p turnstone-runtime --features openapi --example openapi -- --write
//!     cargo run -p turnstone-runtime --features openapi --example openapi     # check only
//!
//! The runtime's test `openapi::tests` makes the same check in every `cargo test`.

use std::path::PathBuf;
use std::process::ExitCode;

use turnstone_runtime::openapi::{FILE, REGENERATE, text};

fn main() -> ExitCode {
    let write = std::env::args().any(|a| a == "--write");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(FILE);
    let text = text();
    if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
        return ExitCode::SUCCESS;
    }
    if !write {
        println!("{FILE} is out of date; regenerate it with: {REGENERATE}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = std::fs::write(&path, &text) {
        eprintln!("cannot write {FILE}: {e}");
        return ExitCode::FAILURE;
    }
    println!("wrote {FILE}");
    ExitCode::SUCCESS
}
