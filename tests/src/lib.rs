//! Test support for Turnstone's end-to-end tests: in-process fakes of the outside world.
//!
//! - [`fake_openai::FakeOpenAi`]: an OpenAI Chat Completions server.
//! - [`fake_openai_responses::FakeOpenAiResponses`]: an OpenAI Responses server, strict.
//! - [`fake_anthropic::FakeAnthropic`]: an Anthropic Messages server.
//! - [`fake_worker::FakeWorker`]: a worker webhook answering decisions by a per-test script.
//! - [`fake_collector::FakeCollector`]: an OpenTelemetry collector (OTLP/HTTP, JSON).
//! - [`ledger`]: the kill tests' worker, which runs each (call, attempt) once, and their
//!   invariants.
//! - [`host::TestHost`]: a local host (SQLite store, in-process queue) run in the test's
//!   process, with a client for its HTTP API.
//!
//! The model fakes are axum servers on `127.0.0.1:0`, started inside the test's runtime. They speak the
//! real wire formats (JSON answers and event streams, each event flushed on its own), record
//! every request they receive ([`fake::Recorded`]) and answer from a script of
//! [`fake::Reply`]s the test queues up: text, parallel tool calls, error statuses, delays,
//! streams that pause, break, end early or report an error midway.

// This crate only ever runs inside tests: a fake that cannot do its job should fail the test
// loudly, so unwrap/expect/panic are allowed here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fake;
pub mod fake_anthropic;
pub mod fake_collector;
pub mod fake_openai;
pub mod fake_openai_responses;
pub mod fake_prompt_cache;
pub mod fake_worker;
pub mod host;
pub mod ledger;
pub mod model_fake;
pub mod topology;

pub use fake::{FakeServer, FakeToolCall, Recorded, Reply};
pub use fake_anthropic::FakeAnthropic;
pub use fake_openai::FakeOpenAi;
pub use fake_openai_responses::FakeOpenAiResponses;
pub use fake_worker::{FakeAnswer, FakeWorker, Gate, WorkerRecord, tool_answer, tools_script};
pub use host::{ApiClient, EventStream, FrameExt, SseFrame, TestHost};
pub use model_fake::ModelFake;
