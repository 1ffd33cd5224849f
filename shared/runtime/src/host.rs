//! A long-running host: the HTTP API, the queue workers and the sweep, in one process. The
//! local deployment (`turnstone serve`) runs this over the embedded store and queue.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;

use crate::assemble::Engine;
use crate::http::{HttpConfig, router};
use crate::pool::Pool;
use crate::queue::{Consumer, PolledQueue, Queue};
use crate::store::Store;

/// Where a long-running host keeps its sessions and takes its wake-ups from.
pub struct Backing {
    pub store: Arc<dyn Store>,
    /// Where wake-ups go.
    pub queue: Arc<dyn Queue>,
    /// The same queue's consuming side, which this host's workers poll.
    pub consumer: Arc<dyn Consumer>,
}

impl Backing {
    /// `store` and `queue`, which the host both sends to and polls.
    pub fn new(store: impl Store, queue: impl PolledQueue) -> Self {
        let queue = Arc::new(queue);
        Backing { store: Arc::new(store), queue: queue.clone(), consumer: queue }
    }
}

/// How often the sweep looks for sessions whose wake-up was lost.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Serves `engine` on `listener` until `shutdown` resolves: HTTP, `workers` queue workers
/// taking wake-ups from `consumer`, and a periodic sweep (which also picks up work left by a
/// previous process that crashed).
pub async fn serve(
    engine: Engine,
    consumer: Arc<dyn Consumer>,
    http: HttpConfig,
    listener: tokio::net::TcpListener,
    workers: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let Engine { app, dispatcher } = engine;
    // Without `[auth]`, this host answers only this machine (see `http::OpenHost`).
    let mut http = http;
    if http.auth.is_none() {
        let open = crate::http::OpenHost { addr: listener.local_addr()? };
        http.anonymous = crate::http::Anonymous::ThisMachine(open);
    }
    match dispatcher.recover(100_000).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(sessions = n, "resuming sessions with pending work"),
        Err(e) => {
            tracing::warn!(error = %e, "could not list sessions with pending work; the sweep will find them")
        }
    }
    let pool = Pool::spawn(Arc::clone(&dispatcher), consumer, workers);
    let sweeper = {
        tokio::spawn(async move {
            loop {
                if let Err(e) = dispatcher.sweep(1000).await {
                    tracing::warn!(error = %e, "sweep failed");
                }
                tokio::time::sleep(SWEEP_EVERY).await;
            }
        })
    };
    let listener = listener.tap_io(|tcp| {
        // Small request/response exchanges: never wait on Nagle's algorithm.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
    });
    let service = router(app, http).into_make_service_with_connect_info::<SocketAddr>();
    let result = axum::serve(listener, service).with_graceful_shutdown(shutdown).await;
    sweeper.abort();
    pool.shutdown().await;
    result
}
