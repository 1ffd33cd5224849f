//! Building a host from its configuration, once for every host (the local binary, the test
//! host, the benchmark, the Lambda functions): the agents (one model provider per `[llm.X]`
//! block, shared by the agents that use it, and each agent's worker endpoint with its secret),
//! the [`App`] and its [`Dispatcher`] over a store and a queue, and the HTTP API's settings.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::app::{AgentRuntime, App, Parts};
use crate::auth::Authenticator;
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, Secrets};
use crate::dispatch::Dispatcher;
use crate::http::HttpConfig;
use crate::llm::pricing::{ModelPrices, Priced};
use crate::llm::{ModelProvider, ProviderSetupError, provider_for};
use crate::notify::{FollowStore, Hub, Notifier};
use crate::queue::Queue;
use crate::store::Store;
use crate::worker::WorkerClient;
use crate::worker::WorkerEndpoint;

/// Why the agents cannot be built.
#[derive(Debug, thiserror::Error)]
#[error("{file}: llm.{llm}: {source}")]
pub struct SetupError {
    pub file: String,
    /// The `[llm.X]` block.
    pub llm: String,
    /// What went wrong.
    #[source]
    pub source: ProviderSetupError,
}

/// The agents of `config`, ready to run.
pub fn agents(config: &Config, secrets: &Secrets) -> Result<BTreeMap<String, AgentRuntime>, SetupError> {
    let mut providers: BTreeMap<&str, Arc<dyn ModelProvider>> = BTreeMap::new();
    for (id, llm) in &config.llms {
        let key = secrets.llm_api_key(id).map(str::to_owned);
        let provider = provider_for(llm.kind.provider_kind(), llm.base_url.as_deref(), key)
            .map_err(|source| SetupError { file: config.file.clone(), llm: id.clone(), source })?;
        let provider = match llm.kind.format() {
            Some(_) if !llm.prices.is_empty() => {
                let prices = llm
                    .prices
                    .iter()
                    .map(|(model, p)| {
                        (
                            model.clone(),
                            ModelPrices::per_million(p.input, p.output, p.cache_read, p.cache_write),
                        )
                    })
                    .collect();
                Arc::new(Priced::new(provider, prices)) as Arc<dyn ModelProvider>
            }
            _ => provider,
        };
        providers.insert(id, provider);
    }
    Ok(config
        .agents
        .iter()
        .map(|(id, def)| {
            let worker = def.worker.as_ref().map(|url| WorkerEndpoint {
                url: url.clone(),
                secret: secrets.worker_secret(id).map(str::to_owned),
                transcript: def.worker_messages,
            });
            let llm = def.llm_for(config);
            let provider = llm.and_then(|llm| providers.get(llm).cloned());
            let llm = llm.and_then(|llm| config.llms.get(llm));
            let reasoning = llm.and_then(|llm| llm.reasoning.clone());
            let prompt_cache = llm.and_then(|llm| llm.prompt_cache.ttl());
            let thinking_forms = llm
                .map(|llm| llm.thinking.iter().map(|(prefix, s)| (prefix.clone(), s.form())).collect())
                .unwrap_or_default();
            let agent = AgentRuntime {
                id: id.clone(),
                declared: def.config.clone(),
                worker,
                provider,
                budget: def.budget,
                reasoning,
                prompt_cache,
                thinking_forms,
                mcp: mcp_servers(id, &def.mcp, secrets),
                context: crate::llm::ContextSettings {
                    window: def.context_window.or(llm.and_then(|l| l.context_window)),
                    max_output: def.max_output_tokens.or(llm.and_then(|l| l.max_output_tokens)),
                    compaction: def.compaction.clone(),
                },
            };
            (id.clone(), agent)
        })
        .collect())
}

/// Agent `agent`'s MCP servers, `None` when it has none.
fn mcp_servers(
    agent: &str,
    servers: &[crate::config::McpServerConfig],
    secrets: &Secrets,
) -> Option<Arc<turnstone_mcp::AgentServers>> {
    use crate::config::McpApprove;
    use turnstone_mcp::{AgentServer, Approve, ServerSpec, Transport};
    if servers.is_empty() {
        return None;
    }
    let servers = servers
        .iter()
        .map(|server| {
            let transport = match (&server.url, &server.command) {
                (Some(url), _) => Transport::Http {
                    url: url.clone(),
                    headers: secrets.mcp_headers(agent, &server.name).to_vec(),
                },
                // The configuration's checks leave one of the two.
                (None, command) => Transport::Stdio { command: command.clone().unwrap_or_default() },
            };
            AgentServer {
                spec: ServerSpec {
                    name: server.name.clone(),
                    transport,
                    timeout: std::time::Duration::from_secs_f64(server.timeout_secs),
                },
                include: server.tools.include.clone(),
                exclude: server.tools.exclude.clone(),
                approve: match server.approve {
                    McpApprove::Never => Approve::Never,
                    McpApprove::Destructive => Approve::Destructive,
                    McpApprove::Always => Approve::Always,
                },
            }
        })
        .collect();
    Some(Arc::new(turnstone_mcp::AgentServers::new(servers)))
}

/// Where a host's parts run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One process serves the API and runs the dispatcher (the local host): a submit claims
    /// the turn's first effect in its own commit and hands it to this process's queue workers,
    /// and notices stay in the process.
    OneProcess,
    /// The API and the dispatcher run in different processes (Lambda functions): nothing is
    /// handed over, and waiting clients follow the store.
    Split,
}

/// A host's engine: the app and the dispatcher that runs its sessions.
pub struct Engine {
    pub app: Arc<App>,
    pub dispatcher: Arc<Dispatcher>,
}

/// The engine of a host: `agents` (from [`agents`], possibly wrapped) over `store` and
/// `queue`, with the config's engine defaults and the system clock, for `topology`.
pub fn engine(
    config: &Config,
    agents: BTreeMap<String, AgentRuntime>,
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    topology: Topology,
) -> Result<Engine, reqwest::Error> {
    engine_at(config, agents, store, queue, topology, |notifier| notifier, Arc::new(SystemClock))
}

/// [`engine`] on `clock` (a test's, to let a day pass in a moment), with the topology's
/// notifier wrapped by `wrap` (on AWS, to push commits to AHP subscribers).
pub fn engine_at(
    config: &Config,
    agents: BTreeMap<String, AgentRuntime>,
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    topology: Topology,
    wrap: impl FnOnce(Arc<dyn Notifier>) -> Arc<dyn Notifier>,
    clock: Arc<dyn Clock>,
) -> Result<Engine, reqwest::Error> {
    let notifier: Arc<dyn Notifier> = match topology {
        Topology::OneProcess => Arc::new(Hub::default()),
        Topology::Split => Arc::new(FollowStore::new(Arc::clone(&store))),
    };
    let notifier = wrap(notifier);
    let app = App::new(Parts {
        store,
        queue,
        notifier,
        clock,
        agents,
        defaults: config.defaults,
        limits: config.limits,
        claim_ahead: topology == Topology::OneProcess,
    });
    // Lambda functions write what they counted as EMF lines after each invocation.
    if topology == Topology::Split {
        app.metrics().collect_emf();
    }
    let dispatcher = Dispatcher::new(Arc::clone(&app), WorkerClient::new()?);
    Ok(Engine { app, dispatcher })
}

/// The HTTP API's settings: the body limit and who may call (`[auth]`).
pub fn http(config: &Config, secrets: &Secrets) -> HttpConfig {
    HttpConfig {
        max_body_bytes: config.server.max_body_bytes,
        auth: Authenticator::new(config.auth.as_ref(), secrets).map(Arc::new),
        expose_internal_events: config.server.expose_internal_events,
        streams_per_caller: config.limits.streams_per_caller,
        ..HttpConfig::default()
    }
}
