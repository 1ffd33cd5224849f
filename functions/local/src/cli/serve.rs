//! `turnstone serve`: the all-in-one local host over the embedded store and queue.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use turnstone_embedded::{MemoryQueue, SqliteOptions, SqliteStore};
use turnstone_runtime::app::{App, Parts};
use turnstone_runtime::auth::Authenticator;
use turnstone_runtime::clock::SystemClock;
use turnstone_runtime::config::Config;
use turnstone_runtime::http::HttpConfig;
use turnstone_runtime::worker::WorkerClient;

use super::ServeArgs;

/// Runs the host until Ctrl-C / SIGTERM.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::demo()?,
    };
    let secrets = config.resolve_secrets(|name| std::env::var(name).ok())?;
    let addr = args.addr.unwrap_or(config.server.addr);
    let data_dir = args.data_dir.clone().unwrap_or_else(|| config.server.data_dir.clone());
    let options = SqliteOptions { durability: config.server.durability, ..SqliteOptions::default() };
    let store = SqliteStore::open_with(data_dir.join("turnstone.sqlite"), options, Arc::new(SystemClock))
        .with_context(|| format!("opening the store in {}", data_dir.display()))?;
    let agents = turnstone_runtime::assemble::agents(&config, &secrets)?;
    let app = App::new(Parts {
        store: Arc::new(store),
        queue: Arc::new(MemoryQueue::new(Duration::from_secs(60))),
        clock: Arc::new(SystemClock),
        agents,
        defaults: config.defaults,
        worker: WorkerClient::new().context("building the worker HTTP client")?,
        claim_ahead: true,
    });
    let http = HttpConfig {
        max_body_bytes: config.server.max_body_bytes,
        auth: Authenticator::new(config.auth.as_ref(), &secrets).map(Arc::new),
    };
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let agents: Vec<&str> = app.agent_ids().collect();
    eprintln!(
        "turnstone listening on http://{addr} (agents: {}; data: {}, durability {})",
        agents.join(", "),
        data_dir.display(),
        config.server.durability
    );
    turnstone_runtime::host::serve(app, http, listener, args.workers, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
