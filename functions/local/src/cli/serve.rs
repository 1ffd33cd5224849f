//! `turnstone serve`: the all-in-one local host, over the embedded store and queue or (with
//! `--backend aws`) over a DynamoDB table and an SQS queue, as a deployment on AWS uses.

use anyhow::Context;
use turnstone_aws::{AwsConfig, QueueSettings};
use turnstone_runtime::assemble::{self, Topology};
use turnstone_runtime::config::{Backend, Config, McpApprove, McpServerConfig};
use turnstone_runtime::host::Backing;

use super::{BackendArg, ServeArgs};

/// The target of the host's own notices (listening, exporting), logged at `info` by default.
pub const LOG_TARGET: &str = "turnstone::serve";

/// The bundled demo on this host: its agent also lists `notes`, an MCP server over stdio that
/// is this binary (`turnstone mcp-notes`). Not in `Config::demo` itself: a Lambda function
/// (which runs that configuration when given none) keeps no child process.
fn with_demo_notes(mut config: Config) -> Config {
    let Ok(exe) = std::env::current_exe() else {
        tracing::warn!(target: LOG_TARGET, "cannot tell this program's path: the demo runs without its notes MCP server");
        return config;
    };
    if let Some(demo) = config.agents.get_mut("demo") {
        demo.mcp.push(McpServerConfig {
            name: "notes".to_owned(),
            url: None,
            command: Some(vec![exe.display().to_string(), "mcp-notes".to_owned()]),
            headers_env: Default::default(),
            tools: Default::default(),
            approve: McpApprove::Destructive,
            timeout_secs: 30.0,
        });
    }
    config
}

/// Runs the host until Ctrl-C / SIGTERM.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => with_demo_notes(Config::demo()?),
    };
    apply_flags(&mut config, &args);
    let secrets = config.resolve_secrets(|name| std::env::var(name).ok())?;
    let addr = args.addr.unwrap_or(config.server.addr);
    if config.auth.is_none() && !addr.ip().is_loopback() {
        if !config.server.allow_anonymous {
            anyhow::bail!(
                "refusing to listen on {addr} without [auth]: every caller could read and drive every \
                 session. Listen on loopback (127.0.0.1), configure [auth], or set [server] \
                 allow_anonymous = true to serve anyone who can reach {addr}"
            );
        }
        tracing::warn!(
            target: LOG_TARGET,
            "listening on {addr} with no [auth] (allow_anonymous = true): anyone who reaches it may read and drive every session"
        );
    }
    let (backing, data) = match config.server.backend {
        Backend::Local => {
            let data_dir = args.data_dir.clone().unwrap_or_else(|| config.server.data_dir.clone());
            let (store, queue) = turnstone_embedded::open_local(&config, &data_dir)
                .with_context(|| format!("opening the store in {}", data_dir.display()))?;
            let data = format!("{}, durability {}", data_dir.display(), config.server.durability);
            (Backing::new(store, queue), data)
        }
        Backend::Aws => {
            let aws = AwsConfig::from(&config.server.aws);
            let clients = aws.clients().await;
            let (store, queue) = aws
                .open(&clients, args.create, &QueueSettings::default())
                .await
                .context("opening the aws backend (add --create to create a missing table and queue)")?;
            // A host killed mid-run leaves its wake-ups leased, not hidden for the queue's 960 s.
            let queue = queue.leased(turnstone_aws::LEASE);
            let budget = turnstone_runtime::memo::session_budget(config.limits.session_cache_mb);
            let store = store.with_cache_bytes(budget);
            let data = format!("DynamoDB table {}, SQS queue {}", store.table(), queue.url());
            (Backing::new(store, queue), data)
        }
    };
    let agents = assemble::agents(&config, &secrets)?;
    let engine = assemble::engine(&config, agents, backing.store, backing.queue, Topology::OneProcess)
        .context("building the worker HTTP client")?;
    let http = assemble::http(&config, &secrets);
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let agents: Vec<&str> = engine.app.agent_ids().collect();
    tracing::info!(
        target: LOG_TARGET,
        "turnstone listening on http://{addr} (agents: {}; data: {data})",
        agents.join(", ")
    );
    if let Some(endpoint) = args.otlp_endpoint.as_deref().filter(|e| !e.trim().is_empty()) {
        tracing::info!(target: LOG_TARGET, "exporting traces to {endpoint}");
    }
    turnstone_runtime::host::serve(engine, backing.consumer, http, listener, args.workers, shutdown_signal())
        .await?;
    Ok(())
}

/// The command line's backend settings over the file's.
fn apply_flags(config: &mut Config, args: &ServeArgs) {
    let server = &mut config.server;
    match args.backend {
        Some(BackendArg::Local) => server.backend = Backend::Local,
        Some(BackendArg::Aws) => server.backend = Backend::Aws,
        None => {}
    }
    if let Some(url) = &args.endpoint_url {
        server.aws.endpoint_url = Some(url.clone());
    }
    if let Some(table) = &args.table {
        server.aws.table = table.clone();
    }
    if let Some(queue) = &args.queue {
        server.aws.queue = queue.clone();
    }
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
