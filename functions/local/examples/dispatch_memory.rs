//! What memory the `dispatch` Lambda function needs (issue 25): the peak RSS of one real
//! `dispatch` container, the deployed binary in a process of its own, serving `--sessions`
//! sessions of `--messages` messages each, once per `--memory-mb` size. A program that prints
//! figures, never a test.
//!
//! ```text
//! cargo build --release -p turnstone-dispatch
//! cargo run --release -p turnstone --example dispatch_memory -- \
//!     [--sessions 1000] [--messages 1000] [--memory-mb 128,256,512]
//! ```
//!
//! It starts its own moto server (`.venv/bin/moto_server`, with `scripts/moto_indexed` loaded,
//! as `long_session` does) unless `TURNSTONE_MOTO_ENDPOINT` names one, and makes a table and a
//! wake-up queue as the template deploys them (`QueueSettings::default()`).
//!
//! 1. **Seeding** (not measured), in this process with the in-process harness of `aws_cost`
//!    (`aws_cost/lambda.rs`: `api` and `dispatch` engines on the table and the queue): every
//!    session gets one `client.messages` input of `--messages` − 1 messages (user and assistant
//!    alternating, ending with the user's, 150 to 250 bytes each, ids named by the client), the
//!    built-in demo configuration's `demo` agent (the deterministic `scripted` model: no worker,
//!    no network) answers it: `--messages` messages. Once, for every memory size.
//! 2. **Each memory size**: every session gets one more `client.message` through an in-process
//!    `api` engine, which queues its wake-up on SQS. Then the `dispatch` binary
//!    (`target/release/turnstone-dispatch`, or `--binary`) starts as a child process with the
//!    environment Lambda and the template give it (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE` the size,
//!    the template's `TURNSTONE_*` settings, the moto endpoint in `AWS_ENDPOINT_URL`), and
//!    `AWS_LAMBDA_RUNTIME_API` pointing at a fake Lambda Runtime API this program serves on
//!    loopback. The program plays Lambda's SQS event source: it receives batches of up to 10
//!    wake-ups, hands each batch to the container as one invocation (an SQS event as Lambda
//!    builds it) and, from the partial batch response, deletes the records the function did not
//!    report failed. It goes on until every session's new turn has ended (read from the
//!    table's event log) and the queue is empty. One container serves every session, one
//!    invocation at a time: what a container sees when the sessions outnumber the containers.
//! 3. **Memory**: `/proc/<pid>/status` of the child, sampled while it runs (`VmRSS`), and its
//!    `VmHWM` (the kernel's peak RSS) before it is stopped.
//!
//! The report is a markdown table per memory size: the cache budget the size implies (each of
//! the process's session memos holds an eighth of the memory, `turnstone_runtime::memo::
//! session_budget`), the session's size as the memos weigh it (`Session::approx_bytes`, about
//! its JSON), the invocations, the wall time, and the peak RSS against the memory size. Not
//! modelled: Lambda freezing the process between invocations, and the memory Lambda's own
//! runtime processes take (the function's memory size is the whole sandbox's).
//!
//! The child's standard output and error (its JSON log lines and EMF metrics) go to
//! `target/dispatch-memory/dispatch-<MB>.log` (or `--log-dir`).

// The functions on moto (and the meter their store decorator reports to), shared with
// `aws_cost` and `long_session`.
#[path = "aws_cost/lambda.rs"]
mod lambda;
#[path = "aws_cost/meter.rs"]
mod meter;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use clap::Parser;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{Mutex, Notify, mpsc};
use turnstone_aws::{DynamoStore, ManagementFrames, QueueSettings, SqsQueue, moto};
use turnstone_engine::ids::TurnId;
use turnstone_engine::protocol::{ClientInput, ClientMessageInput, ClientMessagesInput, DraftMessage, Role};
use turnstone_engine::session::{Event, TurnStatus};
use turnstone_runtime::assemble;
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_runtime::config::Config;
use turnstone_runtime::queue::Queue;
use turnstone_runtime::store::Store;
// The binary's allocator for this process too (the seeding engines); the measured process is
// the child, which has the dispatch function's own.
use turnstone as _;

use lambda::{Bench, Functions, Invocations, POLL};
use meter::Meter;

#[derive(Debug, Parser)]
#[command(
    about = "Measures the peak RSS of the real dispatch Lambda binary serving many long sessions (moto, a fake Lambda Runtime API)."
)]
struct Args {
    /// Sessions the container serves.
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// Messages each session holds before the measured turn (its own two come on top).
    #[arg(long, default_value_t = 1000)]
    messages: usize,
    /// The function's memory sizes (AWS_LAMBDA_FUNCTION_MEMORY_SIZE), one container each.
    #[arg(long, value_delimiter = ',', default_values_t = [128, 256, 512])]
    memory_mb: Vec<u64>,
    /// The dispatch function's binary; default: `<target>/release/turnstone-dispatch`.
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Where the child's output goes; default: `<target>/dispatch-memory`.
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Sessions this process seeds and submits to at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// More of the container's environment, `NAME=value` (repeatable): e.g.
    /// `MALLOC_ARENA_MAX=2`, to see what the allocator's settings do.
    #[arg(long = "env", value_parser = name_value)]
    env: Vec<(String, String)>,
}

/// `NAME=value`.
fn name_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("{s:?} is not NAME=value")),
    }
}

/// The agent of the demo configuration (`shared/runtime/src/demo.toml`): the scripted model.
const AGENT: &str = "demo";
/// The dispatch function's timeout (`infra/template.yaml`, `DispatchFunction.Timeout`): an
/// invocation's deadline is this far from when it starts.
const DISPATCH_TIMEOUT: Duration = Duration::from_secs(900);
/// The event source's batch size (`infra/template.yaml`, `DispatchFunction.Events.WakeUps`).
const BATCH_SIZE: i32 = 10;
/// How long the event source's receive waits for messages (the real one long-polls up to 20 s;
/// shorter here so that an empty queue is noticed soon).
const RECEIVE_WAIT_SECS: i32 = 1;
/// How often the child's memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// How long the container may take to start (its init) before the run fails.
const INIT_DEADLINE: Duration = Duration::from_secs(60);
/// How long a memory size's run may take before it fails.
const RUN_DEADLINE: Duration = Duration::from_secs(3600);
/// The account, region and names the fake Lambda gives the function.
const REGION: &str = "us-east-1";
const FUNCTION_NAME: &str = "turnstone-bench-dispatch";
const FUNCTION_ARN: &str = "arn:aws:lambda:us-east-1:123456789012:function:turnstone-bench-dispatch";
/// The parent's session caches (seeding and submitting engines, the observer), in MiB each:
/// small, so this process stays small beside moto; it is not what is measured.
const PARENT_CACHE_MB: usize = 32;

const MIB: f64 = 1024.0 * 1024.0;

// ---------------------------------------------------------------------------------------------
// The conversation
// ---------------------------------------------------------------------------------------------

/// Message `n` (from 0) of a session's seeded conversation of `count` messages, with the id the
/// client names it by: user and assistant alternate and the last is the user's (so the model
/// answers it); 150 to 250 bytes of text.
fn seeded_message(n: usize, count: usize) -> DraftMessage {
    // Up to 100 more bytes, varying with n (the texts below are about 150 bytes).
    let extra = " Please also check the other parcels of this order and the invoice address.";
    let pad = &extra.repeat(2)[..(n * 37) % 100];
    let from_user = (count - 1 - n).is_multiple_of(2);
    let message = if from_user {
        DraftMessage::user(format!(
            "Question {n}: my order ord_{n:05} says shipped, but the tracking number does not work yet. \
             When will it arrive, and which carrier has it?{pad}"
        ))
    } else {
        DraftMessage::text(
            Role::Assistant,
            format!(
                "Answer {n}: ord_{n:05} left the east warehouse on Monday with UPS; tracking usually \
                 starts within 48 hours. I will keep an eye on it for you.{pad}"
            ),
        )
    };
    // Named by the client, as `aws_cost`'s pre-fill does: one command then mints no message ids.
    message.with_id(format!("msg_seed_{n:05}"))
}

/// The input that seeds a session: `count` messages in one `client.messages` input.
fn seed_input(count: usize) -> ClientInput {
    ClientInput::Messages(ClientMessagesInput {
        agent_id: AGENT.to_owned(),
        turn_id: None,
        messages: (0..count).map(|n| seeded_message(n, count)).collect(),
        stream: None,
        client: None,
    })
}

/// The measured turn's input for memory size `mb`: one new user message.
fn round_input(mb: u64, session: usize) -> ClientInput {
    ClientInput::Message(ClientMessageInput {
        agent_id: AGENT.to_owned(),
        turn_id: None,
        message: DraftMessage::user(format!(
            "One more thing ({mb} MB round, session {session}): the parcel of ord_{session:05} arrived \
             but the box was damaged. Can you send a replacement, and do I need to return the old one?"
        )),
        stream: None,
        client: None,
    })
}

fn session_id(n: usize) -> String {
    format!("dispatch-memory-{n:05}")
}

// ---------------------------------------------------------------------------------------------
// The sessions, as this process follows them
// ---------------------------------------------------------------------------------------------

/// What this process knows of a session: the last event it has read, and the turn it waits for.
struct Followed {
    id: String,
    /// The last event read of the session's log.
    seq: u64,
    /// The turn that must end (with `Completed`).
    turn: Option<TurnId>,
}

/// Reads session `s`'s log from its last read event: whether its turn has ended. A turn that
/// ended other than completed fails the run (the figures would not be of the work meant).
async fn turn_ended(store: &DynamoStore, s: &mut Followed) -> anyhow::Result<bool> {
    let Some(turn) = s.turn.clone() else { return Ok(true) };
    loop {
        let events = store.events_after(&s.id, s.seq, 256).await?;
        let Some(last) = events.last() else { return Ok(false) };
        s.seq = last.seq;
        for logged in &events {
            if let Event::TurnEnded { turn_id, status, error, .. } = &logged.event
                && *turn_id == turn
            {
                if *status != TurnStatus::Completed {
                    bail!("turn {turn} of {} ended {status:?}: {error:?}", s.id);
                }
                s.turn = None;
                return Ok(true);
            }
        }
    }
}

/// How many of `sessions` still wait for their turn (their logs read `concurrency` at a time).
async fn still_waiting(
    store: &DynamoStore,
    sessions: &mut [Followed],
    concurrency: usize,
) -> anyhow::Result<usize> {
    let results: Vec<anyhow::Result<bool>> = futures_util::stream::iter(sessions.iter_mut())
        .map(|s| turn_ended(store, s))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut waiting = 0;
    for ended in results {
        if !ended? {
            waiting += 1;
        }
    }
    Ok(waiting)
}

// ---------------------------------------------------------------------------------------------
// Seeding and submitting (in this process: not measured)
// ---------------------------------------------------------------------------------------------

/// Seeds every session with `--messages` messages; returns them, followed from their last
/// event.
async fn seed(
    bench: &Bench,
    lanes: &mut [Functions],
    args: &Args,
    store: &DynamoStore,
) -> anyhow::Result<Vec<Followed>> {
    let started = Instant::now();
    let input = seed_input(args.messages - 1);
    let mut sessions: Vec<Followed> =
        (0..args.sessions).map(|n| Followed { id: session_id(n), seq: 0, turn: None }).collect();
    submit_all(bench, lanes, &mut sessions, |_| input.clone()).await?;
    eprintln!(
        "  seeding: {} inputs of {} messages submitted after {:.0} s",
        args.sessions,
        args.messages - 1,
        started.elapsed().as_secs_f64()
    );
    drain(bench, lanes, store, &mut sessions, args.concurrency).await?;
    eprintln!("  seeding: every turn ended after {:.0} s", started.elapsed().as_secs_f64());
    // Every session holds the conversation meant: checked on one (the others had the same
    // input and the same deterministic model).
    let (session, _) = bench.observer.app.load(&sessions[0].id).await?;
    if session.tree().len() != args.messages {
        bail!("a seeded session holds {} messages, not {}", session.tree().len(), args.messages);
    }
    Ok(sessions)
}

/// Submits `input(n)` to every session through the `api` engines of `lanes`, one lane per
/// concurrent submit, as the `api` function takes client inputs; each session then waits for
/// the turn it started.
async fn submit_all(
    bench: &Bench,
    lanes: &mut [Functions],
    sessions: &mut [Followed],
    input: impl Fn(usize) -> ClientInput,
) -> anyhow::Result<()> {
    let per_lane = sessions.len().div_ceil(lanes.len().max(1)).max(1);
    let input = &input;
    let submits = lanes.iter_mut().zip(sessions.chunks_mut(per_lane).enumerate()).map(
        |(functions, (lane, chunk))| async move {
            for (i, s) in chunk.iter_mut().enumerate() {
                let n = lane * per_lane + i;
                let mut invocations = Invocations::default();
                let turn = bench.submit(functions, false, &s.id, input(n), &mut invocations).await?;
                s.turn = Some(turn);
            }
            anyhow::Ok(())
        },
    );
    for result in futures_util::future::join_all(submits).await {
        result?;
    }
    Ok(())
}

/// Runs the in-process `dispatch` engines of `lanes` on the queue until every session's turn
/// has ended (the seeding's turns; the event source of the measured runs is another).
async fn drain(
    bench: &Bench,
    lanes: &mut [Functions],
    store: &DynamoStore,
    sessions: &mut [Followed],
    concurrency: usize,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + RUN_DEADLINE;
    loop {
        let runs = lanes.iter_mut().map(|functions| async move {
            let mut invocations = Invocations::default();
            while bench.dispatch_once(functions, false, POLL, &mut invocations).await? {}
            anyhow::Ok(())
        });
        for result in futures_util::future::join_all(runs).await {
            result?;
        }
        let waiting = still_waiting(store, sessions, concurrency).await?;
        if waiting == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{waiting} seeding turns did not end within {RUN_DEADLINE:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The fake Lambda Runtime API
// ---------------------------------------------------------------------------------------------
//
// The HTTP API a custom runtime talks to inside a Lambda execution environment, as the AWS
// Lambda developer guide documents it ("Using the Lambda runtime API for custom runtimes",
// https://docs.aws.amazon.com/lambda/latest/dg/runtimes-api.html, and its OpenAPI
// specification, runtime API version 2018-06-01): the runtime finds it at
// `http://${AWS_LAMBDA_RUNTIME_API}/2018-06-01/...`.

/// One invocation handed to the function.
struct Invocation {
    request_id: String,
    /// The X-Ray trace id's unique part (24 hex digits).
    trace: String,
    /// The event (JSON).
    event: String,
}

/// What the function said.
enum Outcome {
    /// `POST /runtime/invocation/{id}/response`: the function's result.
    Response { request_id: String, body: Bytes },
    /// `POST /runtime/invocation/{id}/error`: the invocation failed.
    Error { request_id: String, body: Bytes },
    /// `POST /runtime/init/error`: the function could not start.
    InitError(Bytes),
}

struct RuntimeApi {
    /// The invocations to hand out, one per `next` request.
    invocations: Mutex<mpsc::Receiver<Invocation>>,
    outcomes: mpsc::UnboundedSender<Outcome>,
    /// Told on every `next` request: the function is ready for an invocation.
    polled: Notify,
}

/// Serves the runtime API on a free loopback port; returns its `host:port` (what
/// `AWS_LAMBDA_RUNTIME_API` holds), where to send invocations, and where outcomes arrive.
async fn serve_runtime_api()
-> anyhow::Result<(String, mpsc::Sender<Invocation>, mpsc::UnboundedReceiver<Outcome>, Arc<RuntimeApi>)> {
    let (to_function, invocations) = mpsc::channel(1);
    let (outcomes, from_function) = mpsc::unbounded_channel();
    let api = Arc::new(RuntimeApi { invocations: Mutex::new(invocations), outcomes, polled: Notify::new() });
    let router = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next_invocation))
        .route("/2018-06-01/runtime/invocation/{request_id}/response", post(invocation_response))
        .route("/2018-06-01/runtime/invocation/{request_id}/error", post(invocation_error))
        .route("/2018-06-01/runtime/init/error", post(init_error))
        .with_state(Arc::clone(&api));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding the runtime API")?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            eprintln!("  the fake runtime API stopped: {e}");
        }
    });
    Ok((addr.to_string(), to_function, from_function, api))
}

/// `GET /runtime/invocation/next` ("Next invocation"): blocks until there is an invocation;
/// the body is the event, the headers say which invocation it is:
/// `Lambda-Runtime-Aws-Request-Id` (the request id), `Lambda-Runtime-Deadline-Ms` (when the
/// function times out, Unix milliseconds), `Lambda-Runtime-Invoked-Function-Arn` (the function
/// invoked) and `Lambda-Runtime-Trace-Id` (the X-Ray tracing header).
async fn next_invocation(State(api): State<Arc<RuntimeApi>>) -> axum::response::Response {
    api.polled.notify_one();
    let Some(invocation) = api.invocations.lock().await.recv().await else {
        // The run is over; the container is stopped next.
        return (StatusCode::SERVICE_UNAVAILABLE, "no more invocations").into_response();
    };
    let now = SystemClock.now().0;
    let deadline = now + i64::try_from(DISPATCH_TIMEOUT.as_millis()).unwrap_or(i64::MAX);
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        // The values are ASCII we build (ids, digits, an ARN); one that were not is left out.
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    };
    set("Lambda-Runtime-Aws-Request-Id", invocation.request_id.clone());
    set("Lambda-Runtime-Deadline-Ms", deadline.to_string());
    set("Lambda-Runtime-Invoked-Function-Arn", FUNCTION_ARN.to_owned());
    set("Lambda-Runtime-Trace-Id", format!("Root=1-{:08x}-{};Sampled=0", now / 1000, invocation.trace));
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    (StatusCode::OK, headers, invocation.event).into_response()
}

/// `POST /runtime/invocation/{AwsRequestId}/response` ("Invocation response"): the function's
/// result; answered `202 Accepted`.
async fn invocation_response(
    State(api): State<Arc<RuntimeApi>>,
    UrlPath(request_id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    let _ = api.outcomes.send(Outcome::Response { request_id, body });
    StatusCode::ACCEPTED
}

/// `POST /runtime/invocation/{AwsRequestId}/error` ("Invocation error"): the invocation failed
/// (the body names the error, `Lambda-Runtime-Function-Error-Type` its type); `202 Accepted`.
async fn invocation_error(
    State(api): State<Arc<RuntimeApi>>,
    UrlPath(request_id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    let _ = api.outcomes.send(Outcome::Error { request_id, body });
    StatusCode::ACCEPTED
}

/// `POST /runtime/init/error` ("Initialization error"): the function could not initialize;
/// `202 Accepted` (Lambda then discards the environment).
async fn init_error(State(api): State<Arc<RuntimeApi>>, body: Bytes) -> StatusCode {
    let _ = api.outcomes.send(Outcome::InitError(body));
    StatusCode::ACCEPTED
}

// ---------------------------------------------------------------------------------------------
// The container and its memory
// ---------------------------------------------------------------------------------------------

/// The child's memory in KiB, from `/proc/<pid>/status`: (`VmRSS`, `VmHWM`).
fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// What is known of the moto side: where the functions find the table and the queue.
struct Place {
    endpoint: String,
    table: String,
    queue_url: String,
    queue_arn: String,
    schedule_group: String,
}

/// The environment of the dispatch function's container: what Lambda sets for a function
/// (the reserved variables of the developer guide's "Defined runtime environment variables")
/// and what `infra/template.yaml` sets (`Globals.Function.Environment`, read by
/// `shared/aws/src/deployment.rs` `Settings::from_vars`). One departure: `AWS_ENDPOINT_URL`
/// sends the SDK's requests to moto (the SDK's own setting; the template sets none).
fn container_env(place: &Place, memory_mb: u64, runtime_api: &str) -> Vec<(&'static str, String)> {
    vec![
        // Lambda's.
        ("AWS_LAMBDA_RUNTIME_API", runtime_api.to_owned()),
        ("AWS_LAMBDA_FUNCTION_NAME", FUNCTION_NAME.to_owned()),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", memory_mb.to_string()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        ("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand".to_owned()),
        ("AWS_LAMBDA_LOG_GROUP_NAME", "/turnstone/bench/dispatch".to_owned()),
        ("AWS_LAMBDA_LOG_STREAM_NAME", format!("{memory_mb}-mb")),
        ("AWS_REGION", REGION.to_owned()),
        ("AWS_DEFAULT_REGION", REGION.to_owned()),
        ("AWS_ACCESS_KEY_ID", "test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
        ("AWS_SESSION_TOKEN", "test".to_owned()),
        ("_HANDLER", "bootstrap".to_owned()),
        ("TZ", ":UTC".to_owned()),
        ("LANG", "en_US.UTF-8".to_owned()),
        // The template's (empty: the demo configuration, no secrets).
        ("TURNSTONE_TABLE", place.table.clone()),
        ("TURNSTONE_QUEUE_URL", place.queue_url.clone()),
        ("TURNSTONE_CONFIG_PARAMETER", String::new()),
        ("TURNSTONE_CONFIG_BUCKET", String::new()),
        ("TURNSTONE_CONFIG_KEY", String::new()),
        ("TURNSTONE_CONFIG_VERSION", String::new()),
        ("TURNSTONE_SECRETS_ARN", String::new()),
        // No session has an AHP subscriber: nothing is ever posted there.
        ("TURNSTONE_AHP_ENDPOINT", "http://127.0.0.1:9/unused".to_owned()),
        ("TURNSTONE_SCHEDULE_GROUP", place.schedule_group.clone()),
        ("TURNSTONE_SCHEDULER_ROLE_ARN", "arn:aws:iam::123456789012:role/turnstone-bench-wake".to_owned()),
        ("TURNSTONE_QUEUE_ARN", place.queue_arn.clone()),
        ("RUST_LOG", "info".to_owned()),
        ("TURNSTONE_METRICS_NAMESPACE", "Turnstone/bench".to_owned()),
        // moto.
        ("AWS_ENDPOINT_URL", place.endpoint.clone()),
    ]
}

/// The SQS event of one batch, as Lambda's SQS event source builds it: a `Records` list, one
/// record per message (as the topology tests' event source builds it).
fn sqs_event(messages: &[aws_sdk_sqs::types::Message], queue_arn: &str) -> Value {
    json!({ "Records": turnstone_tests::topology::sqs_records(messages, queue_arn) })
}

/// The message ids a response reports failed (`ReportBatchItemFailures`), or `None` when the
/// whole batch failed. The rules of the developer guide ("Handling errors for an SQS event
/// source in Lambda", "Implementing partial batch responses"): an empty or null response, no
/// `batchItemFailures` or an empty one is a complete success; an `itemIdentifier` that is
/// empty, null or not a message of the batch fails the whole batch.
fn reported_failures(body: &[u8], batch: &BTreeSet<String>) -> Option<BTreeSet<String>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Some(BTreeSet::new());
    }
    let response: Value = serde_json::from_slice(body).ok()?;
    let Some(failures) = response.get("batchItemFailures").filter(|f| !f.is_null()) else {
        return Some(BTreeSet::new());
    };
    let mut failed = BTreeSet::new();
    for failure in failures.as_array()? {
        let id = failure.get("itemIdentifier")?.as_str()?;
        if !batch.contains(id) {
            return None;
        }
        failed.insert(id.to_owned());
    }
    Some(failed)
}

/// One memory size's figures.
struct Figures {
    memory_mb: u64,
    invocations: u64,
    records: u64,
    /// Records reported failed, and invocations that failed whole.
    failed_records: u64,
    failed_invocations: u64,
    wall: Duration,
    /// KiB: after init (at the first `next`), the sampled peak, the kernel's peak, at the end.
    init_kib: u64,
    sampled_peak_kib: u64,
    hwm_kib: u64,
    end_kib: u64,
    /// Messages of one session, and its size as the memos weigh it, after the turn.
    messages: usize,
    session_bytes: usize,
}

/// Runs the dispatch binary for memory size `mb` until every session's turn has ended.
#[allow(clippy::too_many_arguments)] // one call site; the run's parts, each needed
async fn run_container(
    binary: &Path,
    log_path: &Path,
    place: &Place,
    mb: u64,
    sqs: &aws_sdk_sqs::Client,
    store: &DynamoStore,
    sessions: &mut [Followed],
    concurrency: usize,
    extra_env: &[(String, String)],
) -> anyhow::Result<Figures> {
    let (runtime_api, to_function, mut outcomes, api) = serve_runtime_api().await?;
    let log = std::fs::File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(binary)
        .env_clear()
        .envs(container_env(place, mb, &runtime_api))
        .envs(extra_env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = child.id().context("the container exited at once")?;

    // The sampler: the highest VmRSS seen while the container runs.
    let sampled_peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let sampled_peak = Arc::clone(&sampled_peak);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SAMPLE_EVERY);
            loop {
                every.tick().await;
                let Some((rss, _)) = memory_kib(pid) else { break };
                sampled_peak.fetch_max(rss, Ordering::Relaxed);
            }
        })
    };

    // Init: until the function asks for its first invocation.
    tokio::select! {
        () = api.polled.notified() => {}
        status = child.wait() => bail!("the dispatch container exited during init ({}); see {}", status?, log_path.display()),
        Some(Outcome::InitError(body)) = outcomes.recv() => {
            bail!("the dispatch container failed to initialize: {}; see {}", String::from_utf8_lossy(&body), log_path.display())
        }
        () = tokio::time::sleep(INIT_DEADLINE) => bail!("the dispatch container did not start within {INIT_DEADLINE:?}"),
    }
    let init_kib = memory_kib(pid).map_or(0, |(rss, _)| rss);

    let mut figures = Figures {
        memory_mb: mb,
        invocations: 0,
        records: 0,
        failed_records: 0,
        failed_invocations: 0,
        wall: Duration::ZERO,
        init_kib,
        sampled_peak_kib: 0,
        hwm_kib: 0,
        end_kib: 0,
        messages: 0,
        session_bytes: 0,
    };
    let deadline = Instant::now() + RUN_DEADLINE;
    loop {
        // The event source: a receive of up to a batch.
        let received = sqs
            .receive_message()
            .queue_url(&place.queue_url)
            .max_number_of_messages(BATCH_SIZE)
            .wait_time_seconds(RECEIVE_WAIT_SECS)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .context("receiving from the queue")?;
        let messages = received.messages();
        if messages.is_empty() {
            // Nothing queued: done once every session's turn has ended.
            let waiting = still_waiting(store, sessions, concurrency).await?;
            if waiting == 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!("{waiting} sessions' turns did not end within {RUN_DEADLINE:?}");
            }
            continue;
        }
        figures.invocations += 1;
        figures.records += messages.len() as u64;
        let request_id = format!("00000000-0000-4000-8000-{:012x}", figures.invocations);
        let event = sqs_event(messages, &place.queue_arn).to_string();
        to_function
            .send(Invocation {
                request_id: request_id.clone(),
                trace: format!("{:024x}", figures.invocations),
                event,
            })
            .await
            .context("the runtime API is gone")?;
        let outcome = tokio::select! {
            outcome = outcomes.recv() => outcome.context("the runtime API is gone")?,
            status = child.wait() => bail!("the dispatch container exited during invocation {} ({}); see {}", figures.invocations, status?, log_path.display()),
            () = tokio::time::sleep(DISPATCH_TIMEOUT) => bail!("invocation {} timed out", figures.invocations),
        };
        let ids: BTreeSet<String> =
            messages.iter().filter_map(|m| m.message_id().map(str::to_owned)).collect();
        let failed = match outcome {
            Outcome::Response { request_id: answered, body } if answered == request_id => {
                reported_failures(&body, &ids)
            }
            Outcome::Error { request_id: answered, body } if answered == request_id => {
                eprintln!(
                    "  {mb} MB: invocation {} failed: {}",
                    figures.invocations,
                    String::from_utf8_lossy(&body)
                );
                None
            }
            Outcome::InitError(body) => bail!("init error after init: {}", String::from_utf8_lossy(&body)),
            Outcome::Response { request_id: answered, .. } | Outcome::Error { request_id: answered, .. } => {
                bail!("an answer for invocation {answered}, not {request_id}")
            }
        };
        // A failed record (or a failed batch) stays in the queue: it comes back when its
        // visibility ends (the function sets when, `retry_after`). The others are deleted.
        let Some(failed) = failed else {
            figures.failed_invocations += 1;
            continue;
        };
        figures.failed_records += failed.len() as u64;
        let entries: Vec<DeleteMessageBatchRequestEntry> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.message_id().is_none_or(|id| !failed.contains(id)))
            .filter_map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .set_receipt_handle(m.receipt_handle().map(str::to_owned))
                    .build()
                    .ok()
            })
            .collect();
        if !entries.is_empty() {
            sqs.delete_message_batch()
                .queue_url(&place.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .context("deleting a batch")?;
        }
        if figures.invocations.is_multiple_of(100) {
            let rss = memory_kib(pid).map_or(0, |(rss, _)| rss);
            eprintln!(
                "  {mb} MB: {} invocations after {:.0} s, RSS {:.1} MiB",
                figures.invocations,
                started.elapsed().as_secs_f64(),
                rss as f64 / 1024.0
            );
        }
    }
    figures.wall = started.elapsed();
    let (end_kib, hwm_kib) = memory_kib(pid).context("the container's /proc status is gone")?;
    figures.end_kib = end_kib;
    figures.hwm_kib = hwm_kib;
    sampler.abort();
    figures.sampled_peak_kib = sampled_peak.load(Ordering::Relaxed).max(end_kib);
    // The container is this program's child: stopped by its own handle (its pid).
    child.start_kill().context("stopping the container")?;
    let _ = child.wait().await;
    drop(to_function);
    Ok(figures)
}

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn print_report(args: &Args, seeding: Duration, binary: &Path, rows: &[Figures]) {
    println!();
    println!(
        "Peak RSS of the dispatch function ({}), one container serving {} sessions of {} messages \
         (seeded in {:.0} s), one new turn each:",
        binary.display(),
        args.sessions,
        args.messages,
        seeding.as_secs_f64()
    );
    println!();
    println!(
        "| memory (MB) | cache budget per memo | sessions | messages/session | session size (KiB) | invocations | wall (s) | RSS after init (MiB) | peak RSS, VmHWM (MiB) | RSS at end (MiB) | peak / memory |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for f in rows {
        let budget = budget_mib(f.memory_mb);
        let mut failures = String::new();
        if f.failed_records > 0 || f.failed_invocations > 0 {
            let _ = write!(
                failures,
                " ({} records, {} invocations failed)",
                f.failed_records, f.failed_invocations
            );
        }
        println!(
            "| {} | {:.0} MiB | {} | {} | {:.0} | {}{} | {:.0} | {:.1} | {:.1} | {:.1} | {:.0}% |",
            f.memory_mb,
            budget,
            args.sessions,
            f.messages,
            f.session_bytes as f64 / 1024.0,
            f.invocations,
            failures,
            f.wall.as_secs_f64(),
            mib(f.init_kib),
            mib(f.hwm_kib),
            mib(f.end_kib),
            100.0 * mib(f.hwm_kib) / f.memory_mb as f64
        );
    }
    if !args.env.is_empty() {
        let env: Vec<String> = args.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!();
        println!("  the container's environment also had {}", env.join(" "));
    }
    println!();
    for f in rows {
        let data = args.sessions as f64 * f.session_bytes as f64 / MIB;
        println!(
            "  {} MB: {} wake-ups in {} invocations; sampled peak VmRSS {:.1} MiB; the sessions' total {:.0} MiB against a budget of {:.0} MiB per memo{}",
            f.memory_mb,
            f.records,
            f.invocations,
            mib(f.sampled_peak_kib),
            data,
            budget_mib(f.memory_mb),
            if mib(f.hwm_kib) > f.memory_mb as f64 {
                "; OVER the memory size: Lambda would end it"
            } else {
                ""
            }
        );
    }
    // How the peak follows the budget: the line through the smallest and the largest size.
    if let (Some(low), Some(high)) =
        (rows.iter().min_by_key(|f| f.memory_mb), rows.iter().max_by_key(|f| f.memory_mb))
        && high.memory_mb > low.memory_mb
    {
        let slope =
            (mib(high.hwm_kib) - mib(low.hwm_kib)) / (budget_mib(high.memory_mb) - budget_mib(low.memory_mb));
        let base = mib(low.hwm_kib) - slope * budget_mib(low.memory_mb);
        println!(
            "  peak RSS ~ {base:.0} MiB + {slope:.2} x the budget per memo (= {base:.0} MiB + {:.2} x the memory size), from {} MB and {} MB",
            slope / 8.0,
            low.memory_mb,
            high.memory_mb
        );
    }
}

/// What `turnstone_runtime::memo::session_budget` gives a function of `mb` MB (its rule, an
/// eighth of the memory per memo, restated: the parent's own environment is not a function's).
fn budget_mib(mb: u64) -> f64 {
    mb as f64 / 8.0
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

/// The workspace's target directory (`CARGO_TARGET_DIR` if set).
fn target_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    // Without the `..` where it exists (paths are printed).
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Unless TURNSTONE_MOTO_ENDPOINT names a server: moto at a real table's costs.
    moto::prefer_indexed();
    run(args).await
}

async fn run(args: Args) -> anyhow::Result<()> {
    let binary = args.binary.clone().unwrap_or_else(|| target_dir().join("release/turnstone-dispatch"));
    if !binary.is_file() {
        bail!(
            "no dispatch binary at {}: build it with `cargo build --release -p turnstone-dispatch` (or name one with --binary)",
            binary.display()
        );
    }
    let log_dir = args.log_dir.clone().unwrap_or_else(|| target_dir().join("dispatch-memory"));
    std::fs::create_dir_all(&log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    let mut config = Config::demo()?;
    if args.messages < 2 || args.sessions == 0 {
        bail!("--messages must be at least 2 and --sessions at least 1");
    }
    // One input carries the whole conversation but the model's answer.
    if args.messages - 1 > config.limits.messages_per_input {
        bail!(
            "--messages {} needs an input of {} messages; [limits] messages_per_input is {}",
            args.messages,
            args.messages - 1,
            config.limits.messages_per_input
        );
    }
    config.limits.session_cache_mb = Some(PARENT_CACHE_MB);

    let endpoint = tokio::task::spawn_blocking(moto::endpoint).await?.to_owned();
    eprintln!("  moto at {endpoint} (scripts/moto_indexed)");
    let plain = moto::clients().await;
    let queue_name = moto::unique("dispatch-memory");
    // As the template deploys it: 960 s visibility, 4 days, a dead-letter queue after 5.
    let queue_url = SqsQueue::create_queue(&plain.sqs, &queue_name, &QueueSettings::default()).await?;
    let queue_arn = plain
        .sqs
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await?
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .context("the queue has no ARN")?;
    let sdk = moto::config("unused", &queue_name)
        .loader()
        .credentials_provider(Credentials::new("test", "test", None, None, "moto"))
        .load()
        .await;
    let schedule_group = moto::unique("dispatch-memory-wake");
    aws_sdk_scheduler::Client::new(&sdk).create_schedule_group().name(&schedule_group).send().await?;

    let secrets = config.resolve_secrets(|_| None)?;
    let queue: Arc<dyn Queue> = Arc::new(SqsQueue::new(plain.sqs.clone(), queue_url.clone()));
    let shared = lambda::Shared {
        frames: ManagementFrames::new(&sdk, "http://127.0.0.1:9/unused"),
        // The seeding engines push nothing (they are not measured).
        no_ahp: true,
        config: config.clone(),
        agents: assemble::agents(&config, &secrets)?,
        dynamodb: plain.dynamodb.clone(),
        source: SqsQueue::new(plain.sqs.clone(), queue_url.clone()),
        plain: plain.clone(),
        queue,
        meter: Meter::new(Vec::new(), false),
        clock: Arc::new(SystemClock),
    };
    let bench = shared.cell().await?;
    let store = DynamoStore::new(plain.dynamodb.clone(), bench.table.clone());
    let place = Place {
        endpoint: endpoint.clone(),
        table: bench.table.clone(),
        queue_url: queue_url.clone(),
        queue_arn,
        schedule_group,
    };
    let mut lanes =
        (0..args.concurrency.max(1)).map(|_| bench.functions()).collect::<anyhow::Result<Vec<_>>>()?;

    let seeding = Instant::now();
    let mut sessions = seed(&bench, &mut lanes, &args, &store).await?;
    let seeding = seeding.elapsed();
    eprintln!(
        "  seeded {} sessions of {} messages in {:.0} s",
        args.sessions,
        args.messages,
        seeding.as_secs_f64()
    );

    let mut rows = Vec::new();
    for &mb in &args.memory_mb {
        let began = Instant::now();
        submit_all(&bench, &mut lanes, &mut sessions, |n| round_input(mb, n)).await?;
        eprintln!(
            "  {mb} MB: {} new turns submitted in {:.0} s; starting the container",
            sessions.len(),
            began.elapsed().as_secs_f64()
        );
        let log_path = log_dir.join(format!("dispatch-{mb}.log"));
        let mut figures = run_container(
            &binary,
            &log_path,
            &place,
            mb,
            &plain.sqs,
            &store,
            &mut sessions,
            args.concurrency,
            &args.env,
        )
        .await?;
        let (session, _) = bench.observer.app.load(&sessions[0].id).await?;
        figures.messages = session.tree().len();
        figures.session_bytes = session.approx_bytes();
        eprintln!(
            "  {mb} MB: {} invocations in {:.0} s, peak RSS {:.1} MiB (log: {})",
            figures.invocations,
            figures.wall.as_secs_f64(),
            mib(figures.hwm_kib),
            log_path.display()
        );
        rows.push(figures);
    }
    print_report(&args, seeding, &binary, &rows);
    shared.drop_cell(bench).await?;
    Ok(())
}
