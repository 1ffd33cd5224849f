//! Test support (feature `moto`): a moto server to test against, and fresh tables and queues
//! on it, for this crate's tests and for every crate that runs something on the AWS adapters.
//!
//! `TURNSTONE_MOTO_ENDPOINT` names a running moto server (`scripts/test` starts one for the
//! whole run). Without it, the first test of a test binary starts `.venv/bin/moto_server` on a
//! free loopback port, waits until it answers, and leaves it to die with the test process: it
//! runs under a shell that kills it (moto keeps nothing worth a clean exit) when its standard
//! input, a pipe from this process, closes, which happens however this process ends. Neither available: the tests fail, saying how to
//! install moto. Every table and queue gets a unique name, so tests never see each other's data.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support: fails loudly

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::{AwsClients, AwsConfig, DynamoStore, QueueSettings, SqsQueue};
use aws_sdk_dynamodb::config::Credentials;
use turnstone_runtime::clock::{Clock, SystemClock};

/// The variable naming a running moto server, e.g. `http://127.0.0.1:5000`.
pub const ENDPOINT_ENV: &str = "TURNSTONE_MOTO_ENDPOINT";

const INSTALL: &str = "install moto: python3 -m venv .venv && .venv/bin/pip install 'moto[server]' \
     (in the workspace root), or run scripts/test, which installs and starts it";

/// The moto server of this test process (or the one named by `TURNSTONE_MOTO_ENDPOINT`).
struct Moto {
    endpoint: String,
    /// The shell that runs moto; kept so its standard input stays open until the process ends.
    _guard: Option<Child>,
}

static MOTO: OnceLock<Moto> = OnceLock::new();

/// The moto endpoint, starting a server on first use if none is named.
pub fn endpoint() -> &'static str {
    &MOTO.get_or_init(start_moto).endpoint
}

fn start_moto() -> Moto {
    if let Ok(endpoint) = std::env::var(ENDPOINT_ENV)
        && !endpoint.is_empty()
    {
        return Moto { endpoint, _guard: None };
    }
    if INDEXED.load(Ordering::Relaxed) {
        let site = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/moto_indexed");
        return spawn(&[("PYTHONPATH", &site.to_string_lossy())]);
    }
    spawn(&[])
}

static INDEXED: AtomicBool = AtomicBool::new(false);

/// Called by a benchmark before its first use of moto: the server [`endpoint`] starts then
/// does DynamoDB's transactions and queries at a real table's cost, not at a cost that grows
/// with the table (`scripts/moto_indexed/sitecustomize.py` says how; the answers are moto's
/// own). Tests never call it.
pub fn prefer_indexed() {
    INDEXED.store(true, Ordering::Relaxed);
}

/// How many requests a server from [`enforcing_endpoint`] serves before it enforces IAM: the
/// three that make its administrator (CreateUser, PutUserPolicy, CreateAccessKey).
pub const UNAUTHENTICATED_REQUESTS: u32 = 3;

static ENFORCING: OnceLock<Moto> = OnceLock::new();

/// A moto server of this test process's own, with its IAM enforcement on
/// (`INITIAL_NO_AUTH_ACTION_COUNT`): after [`UNAUTHENTICATED_REQUESTS`] requests, each must be
/// signed by an access key of one of its IAM users, and the signature must verify. Never the
/// shared server: every other test signs with made-up keys.
pub fn enforcing_endpoint() -> &'static str {
    &ENFORCING
        .get_or_init(|| spawn(&[("INITIAL_NO_AUTH_ACTION_COUNT", &UNAUTHENTICATED_REQUESTS.to_string())]))
        .endpoint
}

/// Starts `.venv/bin/moto_server` on a free port with `env` set.
fn spawn(env: &[(&str, &str)]) -> Moto {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let moto = root.join(".venv/bin/moto_server");
    if !moto.is_file() {
        panic!("no moto server: {ENDPOINT_ENV} is not set and {} does not exist; {INSTALL}", moto.display());
    }
    // A free port: bind to port 0, read it, let it go (moto binds it a moment later).
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = std::env::temp_dir().join(format!("turnstone-moto-{port}.log"));
    let script = r#""$0" -H 127.0.0.1 -p "$1" >"$2" 2>&1 & moto=$!
cat >/dev/null
kill -KILL "$moto" 2>/dev/null"#;
    let mut child = Command::new("sh")
        .args(["-c", script])
        .arg(&moto)
        .arg(port.to_string())
        .arg(&log)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}; {INSTALL}", moto.display()));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let output = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("moto_server exited ({status}) before answering: {output}\n{INSTALL}");
        }
        if Instant::now() >= deadline {
            panic!("moto_server did not answer on {addr} within 60 s (log: {})", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Moto { endpoint: format!("http://{addr}"), _guard: Some(child) }
}

/// A name no other test (of this or another process on the same server) uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{}-{n}", std::process::id(), SystemClock.now().0)
}

/// The adapters' config for moto (dummy credentials, us-east-1).
pub fn config(table: &str, queue: &str) -> AwsConfig {
    AwsConfig {
        endpoint_url: Some(endpoint().to_owned()),
        region: Some("us-east-1".to_owned()),
        table: table.to_owned(),
        queue: queue.to_owned(),
    }
}

/// SDK clients for moto.
pub async fn clients() -> AwsClients {
    let sdk = config("unused", "unused")
        .loader()
        .credentials_provider(Credentials::new("test", "test", None, None, "moto"))
        .load()
        .await;
    AwsClients::new(&sdk)
}

/// A store on a fresh table.
pub async fn store() -> DynamoStore {
    store_and_clients().await.0
}

/// A store on a fresh table, and the clients, to look at the items themselves.
pub async fn store_and_clients() -> (DynamoStore, AwsClients) {
    let clients = clients().await;
    let store = DynamoStore::new(clients.dynamodb.clone(), unique("turnstone-test"));
    store.create_table().await.unwrap();
    (store, clients)
}

/// A fresh queue with `settings`, the clients, and its name.
pub async fn queue(settings: &QueueSettings) -> (SqsQueue, AwsClients, String) {
    let clients = clients().await;
    let name = unique("tq");
    let url = SqsQueue::create_queue(&clients.sqs, &name, settings).await.unwrap();
    (SqsQueue::new(clients.sqs.clone(), url), clients, name)
}
