//! `turnstone serve`: the all-in-one local host over the embedded store and queue.

use std::sync::Arc;

use anyhow::Context;
use turnstone_runtime::assemble::{self, Topology};
use turnstone_runtime::config::Config;

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
    let (store, queue) = turnstone_embedded::open_local(&config, &data_dir)
        .with_context(|| format!("opening the store in {}", data_dir.display()))?;
    let agents = assemble::agents(&config, &secrets)?;
    let queue = Arc::new(queue);
    let engine = assemble::engine(&config, agents, Arc::new(store), queue.clone(), Topology::OneProcess)
        .context("building the worker HTTP client")?;
    let http = assemble::http(&config, &secrets);
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let agents: Vec<&str> = engine.app.agent_ids().collect();
    eprintln!(
        "turnstone listening on http://{addr} (agents: {}; data: {}, durability {})",
        agents.join(", "),
        data_dir.display(),
        config.server.durability
    );
    turnstone_runtime::host::serve(engine, queue, http, listener, args.workers, shutdown_signal()).await?;
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
