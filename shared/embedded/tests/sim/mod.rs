//! A deterministic simulation of the runtime: the real `App` and `Dispatcher` over a store
//! (in memory or SQLite on a file), a queue the scheduler delivers from, a simulated worker
//! and model, and crashes at every boundary. See `tests/simulation.rs`.

pub mod endpoints;
pub mod ports;
pub mod run;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use turnstone_embedded::{MemoryStore, SqliteOptions, SqliteStore};
use turnstone_engine::ids::IdMinter;
use turnstone_runtime::clock::{Clock, ManualClock};
use turnstone_runtime::config::Durability;
use turnstone_runtime::queue::WakeUp;
use turnstone_runtime::store::Store;

/// The engine simulation's convention: a seeded stream of numbers.
pub struct Rng(pub IdMinter);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Where the sessions live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Sqlite,
}

/// How the host is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// The local host: an in-process queue (lost with the process; `recover` on restart) and
    /// submits that claim their first effect and hand it to a queue worker.
    Local,
    /// Split processes over a durable queue (SQS-like: a delivery not acknowledged comes back
    /// after the visibility timeout).
    Split,
}

/// What happens at one boundary (a commit, a send, an outbound call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Go,
    /// The process dies before the operation: nothing is written or sent.
    CrashBefore,
    /// The operation is done, then the process dies before it hears the result.
    CrashAfter,
    /// The operation fails (a queue refusing a send).
    Fail,
}

/// One process's life.
#[derive(Debug, Default)]
pub struct Life(AtomicBool);

impl Life {
    pub fn kill(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_dead(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A wake-up in the mailbox.
#[derive(Debug, Clone)]
pub struct Queued {
    pub id: u64,
    pub wake_up: WakeUp,
    /// Deliverable from then on (its delay, or a delivery's visibility timeout).
    pub visible_at: i64,
}

#[derive(Debug, Default)]
pub struct Mailbox {
    pub next_id: u64,
    pub queued: Vec<Queued>,
}

/// What outlives a process: the clock, the store, the mailbox (if the queue is durable), the
/// dice, and what the endpoints saw.
pub struct World {
    pub clock: ManualClock,
    pub host: Host,
    store: Mutex<Arc<dyn Store>>,
    sqlite_path: Option<PathBuf>,
    rng: Mutex<Rng>,
    chaos: AtomicBool,
    /// Percent of boundaries at which the process crashes (half before, half after).
    pub crash_percent: u64,
    pub mailbox: Mutex<Mailbox>,
    pub sleepers: Mutex<BTreeSet<i64>>,
    /// Effects performed, by `kind session id attempt`, and how often.
    executed: Mutex<BTreeMap<String, u32>>,
    /// What the endpoints answered successfully, by `call attempt`: a settle must record its
    /// own attempt's answer.
    answers: Mutex<BTreeMap<(String, u32), String>>,
    violations: Mutex<Vec<String>>,
    trace: Mutex<Vec<String>>,
    numbers: AtomicU64,
    pub faults: AtomicU64,
    pub send_failures: AtomicU64,
}

impl World {
    pub fn new(seed: u64, backend: Backend, host: Host, dir: &std::path::Path) -> Arc<World> {
        let clock = ManualClock::at(turnstone_runtime::conformance::T0);
        let mut rng = Rng(IdMinter::new(seed ^ 0x5eed));
        let crash_percent = 1 + rng.below(4);
        let sqlite_path = (backend == Backend::Sqlite).then(|| dir.join("sim.sqlite"));
        let world = Arc::new(World {
            clock: clock.clone(),
            host,
            store: Mutex::new(Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())))),
            sqlite_path,
            rng: Mutex::new(rng),
            chaos: AtomicBool::new(true),
            crash_percent,
            mailbox: Mutex::new(Mailbox::default()),
            sleepers: Mutex::new(BTreeSet::new()),
            executed: Mutex::new(BTreeMap::new()),
            answers: Mutex::new(BTreeMap::new()),
            violations: Mutex::new(Vec::new()),
            trace: Mutex::new(Vec::new()),
            numbers: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            send_failures: AtomicU64::new(0),
        });
        world.reopen();
        world
    }

    /// The store as a fresh process finds it: the memory store as it was, the SQLite file
    /// closed and opened again.
    pub fn reopen(&self) {
        let Some(path) = &self.sqlite_path else { return };
        // Close the old file first (dropping the store waits for its writer).
        *self.store.lock().unwrap() = Arc::new(MemoryStore::new());
        let options = SqliteOptions { durability: Durability::Process, ..SqliteOptions::default() };
        let store = SqliteStore::open_with(path, options, Arc::new(self.clock.clone())).unwrap();
        *self.store.lock().unwrap() = Arc::new(store);
    }

    pub fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store.lock().unwrap())
    }

    pub fn now(&self) -> i64 {
        self.clock.now().0
    }

    pub fn chaos(&self) -> bool {
        self.chaos.load(Ordering::SeqCst)
    }

    pub fn set_chaos(&self, on: bool) {
        self.chaos.store(on, Ordering::SeqCst);
    }

    pub fn roll(&self, n: u64) -> u64 {
        self.rng.lock().unwrap().below(n)
    }

    pub fn chance(&self, percent: u64) -> bool {
        self.rng.lock().unwrap().chance(percent)
    }

    /// The fate of the operation at `site`; `may_fail`: the operation can fail by itself.
    pub fn fate(&self, site: &str, may_fail: bool) -> Fate {
        if !self.chaos() {
            return Fate::Go;
        }
        let roll = self.roll(200);
        let fate = if roll < self.crash_percent {
            Fate::CrashBefore
        } else if roll < 2 * self.crash_percent {
            Fate::CrashAfter
        } else if may_fail && roll < 2 * self.crash_percent + 3 {
            self.send_failures.fetch_add(1, Ordering::SeqCst);
            Fate::Fail
        } else {
            Fate::Go
        };
        if fate != Fate::Go {
            self.faults.fetch_add(1, Ordering::SeqCst);
            self.trace(format!("fault {site} {fate:?}"));
        }
        fate
    }

    pub fn trace(&self, line: String) {
        self.trace.lock().unwrap().push(line);
    }

    pub fn trace_lines(&self) -> Vec<String> {
        self.trace.lock().unwrap().clone()
    }

    pub fn executed(&self, effect: String) {
        self.trace(format!("executed {effect}"));
        *self.executed.lock().unwrap().entry(effect).or_insert(0) += 1;
    }

    pub fn executed_twice(&self) -> Vec<String> {
        self.executed
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(e, n)| format!("{e} x{n}"))
            .collect()
    }

    pub fn answered(&self, call_id: &str, attempt: u32, fingerprint: String) {
        self.answers.lock().unwrap().insert((call_id.to_owned(), attempt), fingerprint);
    }

    pub fn answer(&self, call_id: &str, attempt: u32) -> Option<String> {
        self.answers.lock().unwrap().get(&(call_id.to_owned(), attempt)).cloned()
    }

    pub fn violation(&self, what: String) {
        self.trace(format!("violation {what}"));
        self.violations.lock().unwrap().push(what);
    }

    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }

    pub fn next_number(&self) -> u64 {
        self.numbers.fetch_add(1, Ordering::SeqCst) + 1
    }
}

/// What identifies a successful outcome: a model reply's text or tool call ids, a tool's
/// result text (as `call_settled` events and the endpoints' answers hold them).
pub fn fingerprint(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        other => match other.get("content").and_then(serde_json::Value::as_str) {
            Some(text) => text.to_owned(),
            None => other
                .get("tool_calls")
                .and_then(serde_json::Value::as_array)
                .map(|calls| calls.iter().filter_map(|c| c.get("id")?.as_str()).collect::<Vec<_>>().join(","))
                .unwrap_or_default(),
        },
    }
}

/// FNV-1a over the trace: the same seed must give the same digest.
pub fn digest(lines: &[String]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for line in lines {
        for byte in line.bytes().chain([b'\n']) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}
