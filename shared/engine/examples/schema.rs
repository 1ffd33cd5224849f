//! Writes (`--write`) or checks the JSON Schema of the decision protocol in `schema/` at the
//! repository root, generated from the engine's wire types.
//!
//!     cargo run -p turnstone-engine --features schema --example schema -- --write
//!     cargo run -p turnstone-engine --features schema --example schema     # check only
//!
//! The engine's test `tests/schema.rs` makes the same check in every `cargo test`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let write = std::env::args().any(|a| a == "--write");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schema");
    let mut stale = 0;
    for doc in turnstone_engine::schema::documents() {
        let path = dir.join(doc.file);
        let text = doc.text();
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() == Some(text.as_str()) {
            continue;
        }
        if write {
            if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &text)) {
                eprintln!("cannot write schema/{}: {e}", doc.file);
                return ExitCode::FAILURE;
            }
            println!("wrote schema/{}", doc.file);
        } else {
            println!("schema/{} is out of date", doc.file);
            stale += 1;
        }
    }
    if stale > 0 {
        println!("regenerate with: {}", turnstone_engine::schema::REGENERATE);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
