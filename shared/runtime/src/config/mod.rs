//! The configuration file (`turnstone.toml`): server settings, engine defaults, model
//! providers, agents and auth, one file for both deployments.
//!
//! ```toml
//! [server]                      # optional; the local host's (Lambda reads allow_anonymous, expose_internal_events)
//! addr = "127.0.0.1:8787"
//! data_dir = "./turnstone-data" # relative to the working directory
//! max_body_bytes = 1048576
//! durability = "full"           # full | process: what a commit survives (see Durability)
//! allow_anonymous = false       # without [auth]: refuse to listen beyond loopback
//! expose_internal_events = false  # clients see worker state and system prompts in the log
//!
//! [defaults]                    # optional; engine default retry policies per kind of call
//! llm = { timeout_secs = 120, max_retries = 2, backoff_base_secs = 1, backoff_max_secs = 30 }
//! # tool, client_tool, sub_agent and decision likewise; a kind left out keeps the engine's.
//!
//! [llm.openai]                  # a model provider the engine calls (`handler = "server"`)
//! type = "openai"               # openai | anthropic | scripted
//! base_url = "https://api.openai.com/v1"  # optional: the provider's public API
//! api_key_env = "OPENAI_API_KEY"          # the NAME of the variable holding the key
//! prices."gpt-4o" = { input = 2.5, output = 10.0, cache_read = 1.25 }  # $ per million tokens
//!
//! [agent.demo]                  # the seed's AgentConfig fields, plus:
//! model = "gpt-4o"
//! llm = "openai"                # which [llm.<id>] runs its server LLM calls
//! worker = "https://worker.example.com/decide"  # optional worker webhook
//! worker_secret_env = "DEMO_WORKER_SECRET"      # optional: its HMAC secret's variable
//! worker_messages = 40          # optional: decision requests carry the last 40 messages, not all
//! max_cost = "0.50"             # optional: a turn's model calls may cost at most $0.50
//! max_llm_calls = 20            # optional: and make at most 20 model calls
//!
//! [limits]                      # optional; each refused with an error naming it
//! messages_per_input = 1000     # messages in one client.messages input
//! message_bytes = 262144        # one message's content, one tool result (client or worker)
//! state_bytes = 262144          # the agent state a worker writes
//! queued_turns = 32             # turns waiting behind the active one
//! sub_agent_depth = 8           # how deep sub-agents nest
//! sub_agent_fanout = 32         # delegations of one session open at once
//! sessions_per_owner = 1000     # optional: sessions one owner may have (none: no limit)
//! session_cache_mb = 256        # optional: MiB of sessions each cache of the process holds
//! streams_per_caller = 64       # event streams one authenticated caller holds open
//! sockets_per_caller = 16       # AHP WebSockets one authenticated caller holds open
//! subscriptions_per_socket = 256  # sessions one AHP WebSocket follows
//! active_client_grace_secs = 60 # an AHP client gone this long leaves its sessions' active clients
//!
//! [auth]                        # optional; absent: no auth (loopback development)
//! api_keys_env = "TURNSTONE_API_KEYS"           # clients: `name:key,name:key`
//! machine_keys_env = "TURNSTONE_MACHINE_KEYS"   # workers: settle calls of their agents
//! admin_keys_env = "TURNSTONE_ADMIN_KEYS"       # admins: read every session
//! jwt_secret_env = "TURNSTONE_JWT_SECRET"       # HS256 bearer tokens; `sub` is the client
//! jwt_issuer = "https://id.example.com"         # optional: required `iss`
//! jwt_audience = "turnstone"                    # optional: required `aud`
//! jwt_metadata_claims = ["plan", "org"]         # optional: claims kept in the owner's metadata
//! jwt_sub_is_api_key_name = false               # optional: a JWT `sub` is the client key of that name
//! [auth.machines]                               # which agents each machine key serves
//! billing-worker = ["billing"]                  # "*": every agent
//! ```
//!
//! Rules checked at load, each failure a [`ConfigError`] that names the file, the line and
//! column, and the field, e.g. `turnstone.toml:12:1: agent.demo.llm: unknown llm "gpt"
//! (defined: openai, scripted)`:
//! - unknown keys are errors everywhere (a typo never passes silently);
//! - agent and llm ids use only `A-Z a-z 0-9 _ -`;
//! - an agent's `llm` names an `[llm.<id>]` block; an agent whose LLM calls run on the server
//!   (`handler` absent or `"server"`) may leave `llm` out only when exactly one `[llm]` block
//!   exists, which is then its default;
//! - `sub_agents` name defined agents; `worker` and `base_url` are http(s) URLs without
//!   credentials; `format` needs `handler = "worker"` and a `worker`; so does any work the
//!   worker runs (a worker LLM handler, a tool whose handler is `worker`, the default);
//! - the seed's own rules ([`AgentConfig::validate`]): unique tool and sub-agent names, sane
//!   retry policies.
//!
//! TOML has no `null`: a retry policy without `timeout_secs` has no timeout (the seed's
//! `"timeout_secs": null`). Secrets never live in the file: it names environment variables,
//! and [`Config::resolve_secrets`] reads them into [`Secrets`], whose `Debug` shows no value.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use turnstone_engine::protocol::{
    AgentConfig, AgentTool, CacheTtl, LlmFormat, LlmHandler, ReasoningConfig, RetryPolicy, SubAgent,
    ThinkingForm, ToolHandler,
};
use turnstone_engine::session::{Budget, Defaults, Limits, Transcript, parse_picodollars};

/// The bundled demo configuration, the one a new user reads first.
pub const DEMO_TOML: &str = include_str!("../demo.toml");

/// A loaded and checked configuration file. Holds no secret, only the names of variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where the configuration was read from, as error messages name it.
    pub file: String,
    /// The local host's settings (`[server]`).
    pub server: ServerConfig,
    /// The engine's default retry policies (`[defaults]`), the engine's own where left out.
    pub defaults: Defaults,
    /// The model providers (`[llm.<id>]`), by id.
    pub llms: BTreeMap<String, LlmConfig>,
    /// The agents (`[agent.<id>]`), by id.
    pub agents: BTreeMap<String, AgentDef>,
    /// API-key auth (`[auth]`); `None`: no auth.
    pub auth: Option<AuthConfig>,
    /// What sessions may be sent and hold (`[limits]`).
    pub limits: LimitsConfig,
}

/// `[limits]`: the engine's [`Limits`] (each field's default is the engine's), and how many
/// sessions one owner may create. The request body limit is `[server] max_body_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    pub messages_per_input: usize,
    pub message_bytes: usize,
    pub state_bytes: usize,
    pub queued_turns: usize,
    pub sub_agent_depth: usize,
    pub sub_agent_fanout: usize,
    /// Sessions one owner may have, sub-agent sessions included; `None`: no limit. Counted by
    /// the store in each creating commit, so exact however many hosts create at once.
    pub sessions_per_owner: Option<usize>,
    /// MiB of sessions each of the process's session caches may hold (the store's and the
    /// app's); `None`: an eighth of the Lambda function's memory there, 256 elsewhere.
    pub session_cache_mb: Option<usize>,
    /// Event streams (`GET .../events/stream`) one authenticated caller may hold open at once.
    pub streams_per_caller: usize,
    /// AHP WebSockets one authenticated caller may hold open at once.
    pub sockets_per_caller: usize,
    /// Sessions one AHP WebSocket may subscribe to at once.
    pub subscriptions_per_socket: usize,
    /// Seconds an AHP client may be gone (no connection with its client id) before it leaves
    /// the active clients of the sessions it joined: long enough for a reconnect.
    pub active_client_grace_secs: usize,
}

/// The per-caller caps' defaults: a busy client's browser tabs and editor windows, well
/// short of what one caller could use to starve the host.
pub const STREAMS_PER_CALLER: usize = 64;
pub const SOCKETS_PER_CALLER: usize = 16;
pub const SUBSCRIPTIONS_PER_SOCKET: usize = 256;
/// VS Code's client retries a lost connection after 1, 2, 4, ... seconds (30 at most): a
/// minute covers its first six attempts.
pub const ACTIVE_CLIENT_GRACE_SECS: usize = 60;

impl Default for LimitsConfig {
    fn default() -> Self {
        let Limits {
            messages_per_input,
            message_bytes,
            state_bytes,
            queued_turns,
            sub_agent_depth,
            sub_agent_fanout,
        } = Limits::default();
        LimitsConfig {
            messages_per_input,
            message_bytes,
            state_bytes,
            queued_turns,
            sub_agent_depth,
            sub_agent_fanout,
            sessions_per_owner: None,
            session_cache_mb: None,
            streams_per_caller: STREAMS_PER_CALLER,
            sockets_per_caller: SOCKETS_PER_CALLER,
            subscriptions_per_socket: SUBSCRIPTIONS_PER_SOCKET,
            active_client_grace_secs: ACTIVE_CLIENT_GRACE_SECS,
        }
    }
}

impl LimitsConfig {
    /// The engine's share.
    pub fn engine(&self) -> Limits {
        Limits {
            messages_per_input: self.messages_per_input,
            message_bytes: self.message_bytes,
            state_bytes: self.state_bytes,
            queued_turns: self.queued_turns,
            sub_agent_depth: self.sub_agent_depth,
            sub_agent_fanout: self.sub_agent_fanout,
        }
    }
}

/// The local host's settings (`[server]`); every field has a default.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// The address to listen on (default `127.0.0.1:8787`).
    pub addr: SocketAddr,
    /// Where the embedded store keeps its files (default `./turnstone-data`), as written.
    pub data_dir: PathBuf,
    /// The largest request body accepted, in bytes (default 1 MiB).
    pub max_body_bytes: usize,
    /// What an acknowledged commit of the embedded store survives (default `full`).
    pub durability: Durability,
    /// Where sessions and wake-ups live (default `local`: the embedded store and queue).
    pub backend: Backend,
    /// The table and queue of the `aws` backend (`[server.aws]`).
    pub aws: AwsBackend,
    /// Without `[auth]`, whether `serve` may listen beyond loopback (default false: it refuses
    /// to, since every caller could then do everything).
    pub allow_anonymous: bool,
    /// Whether clients see the log's internal events in full: a worker's `state` and the
    /// agent's system prompt and tool definitions (default false: they are left out for
    /// clients; admins always see them).
    pub expose_internal_events: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 8787)),
            data_dir: PathBuf::from("./turnstone-data"),
            max_body_bytes: 1024 * 1024,
            durability: Durability::default(),
            backend: Backend::default(),
            aws: AwsBackend::default(),
            allow_anonymous: false,
            expose_internal_events: false,
        }
    }
}

/// Where the local host keeps sessions and wake-ups (`[server] backend`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The embedded SQLite store and the in-process queue.
    #[default]
    Local,
    /// A DynamoDB table and an SQS queue (`[server.aws]`), as a deployment on AWS uses.
    Aws,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Local => "local",
            Backend::Aws => "aws",
        })
    }
}

/// The `aws` backend's table when none is named.
pub const DEFAULT_AWS_TABLE: &str = "turnstone";
/// The `aws` backend's queue when none is named.
pub const DEFAULT_AWS_QUEUE: &str = "turnstone-wakeups";

/// The DynamoDB table and SQS queue of the `aws` backend (`[server.aws]`); credentials and,
/// unless set here, the region come from the usual AWS environment.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsBackend {
    /// The table (default `turnstone`).
    pub table: String,
    /// The queue's name or URL (default `turnstone-wakeups`).
    pub queue: String,
    /// Another endpoint for both services, e.g. a local stand-in such as moto.
    pub endpoint_url: Option<String>,
    /// The region (default: from the environment).
    pub region: Option<String>,
}

impl Default for AwsBackend {
    fn default() -> Self {
        AwsBackend {
            table: DEFAULT_AWS_TABLE.to_owned(),
            queue: DEFAULT_AWS_QUEUE.to_owned(),
            endpoint_url: None,
            region: None,
        }
    }
}

/// What a commit of the embedded store survives once `commit` returned (`[server] durability`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// A power loss or an OS crash: the commit is fsynced before it is acknowledged (SQLite
    /// `synchronous=FULL`; concurrent commits share one fsync). The default.
    #[default]
    Full,
    /// The process being killed, not a power loss or OS crash, which may lose the last commits
    /// (never consistency). No fsync per commit (SQLite `synchronous=NORMAL`).
    Process,
}

impl Durability {
    /// The setting's name in the file.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Full => "full",
            Durability::Process => "process",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A model provider the engine calls for server LLM calls (`[llm.<id>]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// The provider's wire protocol (`type`).
    #[serde(rename = "type")]
    pub kind: LlmKind,
    /// The provider's base URL; `None`: its public API.
    #[serde(default)]
    pub base_url: Option<String>,
    /// The name of the environment variable holding the API key; `None`: no key is sent.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Prices by model name (a model the provider answers as `gpt-4o-2024-08-06` takes the
    /// prices of `gpt-4o`), so calls get a cost; models without prices cost nothing.
    #[serde(default)]
    pub prices: BTreeMap<String, PriceConfig>,
    /// The reasoning of the server model calls that ask for none (an engine-hosted agent's
    /// never do): e.g. `{ effort = "medium" }`, which Claude 4.6 and later take as adaptive
    /// thinking at that effort, older Claude models as a thinking budget, OpenAI as
    /// `reasoning_effort`.
    #[serde(default)]
    pub reasoning: Option<ReasoningConfig>,
    /// Prompt caching of the server model calls: `5m` (the default) or `1h`, how long a cached
    /// prefix lives (Anthropic's cache breakpoints; OpenAI caches by itself and is sent the
    /// session as `prompt_cache_key`), or `off`.
    #[serde(default)]
    pub prompt_cache: PromptCacheSetting,
    /// How models take thinking where their id does not say (an alias, a cloud's inference
    /// profile), by model-name prefix, the longest matching: `adaptive` or `budget`
    /// (Anthropic). Ids naming a Claude version need none.
    #[serde(default)]
    pub thinking: BTreeMap<String, ThinkingSetting>,
    /// The context window of its models in tokens, for models the engine's table does not
    /// know (a compatible server, a local model) or to override it.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// The largest reply of its models in tokens: the reserve a request keeps for it when it
    /// names no `max_completion_tokens`.
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
}

/// How an agent keeps its model requests within the context window (`[agent.<id>.compaction]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionConfig {
    /// Whether the engine compacts at all (a request past the window then fails).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Compact when a request's estimated prompt plus reply passes this share of the window.
    #[serde(default = "default_compact_at")]
    pub at: f64,
    /// How much of the window the newest messages kept word for word may take.
    #[serde(default = "default_keep_recent")]
    pub keep_recent: f64,
    /// Clear old tool results' bodies (no model call) before summarizing, when that is enough.
    #[serde(default = "yes")]
    pub clear_tool_results: bool,
    /// The most one tool result may take in a model's request, in tokens (the log keeps it whole).
    #[serde(default)]
    pub tool_result_max_tokens: Option<u64>,
    /// The model that summarizes (on the agent's provider); default: the call's own model.
    #[serde(default)]
    pub model: Option<String>,
    /// The summarizing call's instructions; default: the engine's.
    #[serde(default)]
    pub prompt: Option<String>,
    /// The longest summary asked for, in tokens; default: a twentieth of the window, 1,024 to 8,192.
    #[serde(default)]
    pub summary_max_tokens: Option<u64>,
}

fn yes() -> bool {
    true
}

fn default_compact_at() -> f64 {
    0.8
}

fn default_keep_recent() -> f64 {
    0.25
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            enabled: true,
            at: default_compact_at(),
            keep_recent: default_keep_recent(),
            clear_tool_results: true,
            tool_result_max_tokens: None,
            model: None,
            prompt: None,
            summary_max_tokens: None,
        }
    }
}

/// A value of `[llm.<id>] thinking`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThinkingSetting {
    Adaptive,
    Budget,
}

impl ThinkingSetting {
    /// The form the format sends.
    pub fn form(self) -> ThinkingForm {
        match self {
            ThinkingSetting::Adaptive => ThinkingForm::Adaptive,
            ThinkingSetting::Budget => ThinkingForm::Budget,
        }
    }
}

/// `[llm.<id>] prompt_cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum PromptCacheSetting {
    #[default]
    #[serde(rename = "5m")]
    FiveMinutes,
    #[serde(rename = "1h")]
    OneHour,
    #[serde(rename = "off")]
    Off,
}

impl PromptCacheSetting {
    /// The lifetime of a cached prefix; `None`: no caching asked for.
    pub fn ttl(self) -> Option<CacheTtl> {
        match self {
            PromptCacheSetting::FiveMinutes => Some(CacheTtl::FiveMinutes),
            PromptCacheSetting::OneHour => Some(CacheTtl::OneHour),
            PromptCacheSetting::Off => None,
        }
    }
}

/// A model's prices in dollars per million tokens (`[llm.<id>.prices."<model>"]`).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    pub input: f64,
    pub output: f64,
    /// Cached input read back (OpenAI cached tokens, Anthropic cache reads); default `input`.
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Input written to the cache (Anthropic); default `input`.
    #[serde(default)]
    pub cache_write: Option<f64>,
}

/// The kinds of model provider, by their `type` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmKind {
    /// OpenAI chat completions, or a compatible server at `base_url`.
    Openai,
    /// OpenAI responses (`type = "openai-responses"`).
    #[serde(rename = "openai-responses")]
    OpenaiResponses,
    /// Anthropic messages.
    Anthropic,
    /// The deterministic built-in model, for demos and tests.
    Scripted,
}

impl LlmKind {
    /// The wire format of an HTTP provider; `None` for the scripted model.
    pub fn format(self) -> Option<turnstone_engine::protocol::LlmFormat> {
        match self {
            LlmKind::Openai => Some(turnstone_engine::protocol::LlmFormat::Openai),
            LlmKind::OpenaiResponses => Some(turnstone_engine::protocol::LlmFormat::OpenaiResponses),
            LlmKind::Anthropic => Some(turnstone_engine::protocol::LlmFormat::Anthropic),
            LlmKind::Scripted => None,
        }
    }

    /// The `type` name.
    pub fn name(self) -> &'static str {
        match self {
            LlmKind::Openai => "openai",
            LlmKind::OpenaiResponses => "openai-responses",
            LlmKind::Anthropic => "anthropic",
            LlmKind::Scripted => "scripted",
        }
    }

    /// The provider kind that [`crate::llm::provider_for`] builds.
    pub fn provider_kind(self) -> crate::llm::ProviderKind {
        match self {
            LlmKind::Openai => crate::llm::ProviderKind::Openai,
            LlmKind::OpenaiResponses => crate::llm::ProviderKind::OpenaiResponses,
            LlmKind::Anthropic => crate::llm::ProviderKind::Anthropic,
            LlmKind::Scripted => crate::llm::ProviderKind::Scripted,
        }
    }
}

impl fmt::Display for LlmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An agent (`[agent.<id>]`): the seed's `AgentConfig` plus how the host runs it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentDef {
    /// The agent's id, the `<id>` of its section.
    pub id: String,
    /// The declared config, checked by [`AgentConfig::validate`].
    pub config: AgentConfig,
    /// The `[llm.<id>]` named for server LLM calls, as written; see [`AgentDef::llm_for`].
    pub llm: Option<String>,
    /// The worker webhook URL; `None`: the engine accepts its own proposals.
    pub worker: Option<String>,
    /// The name of the environment variable holding the worker's HMAC secret.
    pub worker_secret_env: Option<String>,
    /// How much of the conversation its worker's decision requests carry (`worker_messages`):
    /// the whole of it (the protocol's request), or the last messages of the active path.
    pub worker_messages: Transcript,
    /// The context window of its model in tokens (`context_window`), over the `[llm]` block's
    /// and the engine's table.
    pub context_window: Option<u64>,
    /// Its model's largest reply in tokens (`max_output_tokens`).
    pub max_output_tokens: Option<u64>,
    /// How its requests are kept within the window (`[agent.<id>.compaction]`).
    pub compaction: CompactionConfig,
    /// Per-turn limits (`max_cost` in dollars, `max_llm_calls`): a turn past one fails with
    /// `budget_exceeded`.
    pub budget: Budget,
    /// The MCP servers whose tools the engine offers and runs (`[[agent.<id>.mcp]]`).
    pub mcp: Vec<McpServerConfig>,
}

/// One MCP server of an agent (`[[agent.<id>.mcp]]`): its tools are offered to the model as
/// `<name>__<tool>` and run by the engine.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The prefix of its tools' names.
    pub name: String,
    /// Its Streamable HTTP endpoint; or `command`.
    #[serde(default)]
    pub url: Option<String>,
    /// The program and arguments of a stdio server (the local host only); or `url`.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// HTTP headers, each value read from the named environment variable at start.
    #[serde(default)]
    pub headers_env: BTreeMap<String, String>,
    /// Which of its tools are offered.
    #[serde(default)]
    pub tools: McpToolFilter,
    /// Which calls wait for a person's approval: `never`, `destructive` (the default: tools
    /// that do not say they only read), `always`.
    #[serde(default)]
    pub approve: McpApprove,
    /// The longest wait for one call (default 60).
    #[serde(default = "default_mcp_timeout")]
    pub timeout_secs: f64,
}

fn default_mcp_timeout() -> f64 {
    60.0
}

/// `tools = { include = [...], exclude = [...] }`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolFilter {
    /// Only these (all when left out).
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// Never these.
    #[serde(default)]
    pub exclude: Vec<String>,
}

/// `approve`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum McpApprove {
    Never,
    #[default]
    Destructive,
    Always,
}

impl AgentDef {
    /// Whether a worker webhook answers this agent's decisions.
    pub fn has_worker(&self) -> bool {
        self.worker.is_some()
    }

    /// The llm id that runs this agent's server LLM calls: its `llm`, else the only one defined.
    pub fn llm_for<'a>(&'a self, config: &'a Config) -> Option<&'a str> {
        match &self.llm {
            Some(id) => Some(id.as_str()),
            None if config.llms.len() == 1 => config.llms.keys().next().map(String::as_str),
            None => None,
        }
    }
}

/// Authentication (`[auth]`); see [`crate::auth`] for what each kind of caller may do. Each
/// `*_env` names the environment variable holding the secret (key lists are `name:key,...`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Client keys: a client owns the sessions it creates.
    pub api_keys_env: Option<String>,
    /// Worker keys: settle calls (`calls/settle`) of the agents `machines` lists for them.
    pub machine_keys_env: Option<String>,
    /// Admin keys: read every session.
    pub admin_keys_env: Option<String>,
    /// The HS256 secret of client JWTs.
    pub jwt_secret_env: Option<String>,
    /// The `iss` a JWT must carry.
    pub jwt_issuer: Option<String>,
    /// The `aud` a JWT must carry.
    pub jwt_audience: Option<String>,
    /// JWT claims copied into the session owner's `WorkerIdentity.metadata` (workers see them).
    pub jwt_metadata_claims: Vec<String>,
    /// Whether a JWT's `sub` names the client key of that name (one identity, `client:<sub>`);
    /// default false: JWT subjects are identities of their own (`jwt:<sub>`).
    pub jwt_sub_is_api_key_name: bool,
    /// Machine key name -> the agents whose calls it may settle (`"*"`: every agent).
    pub machines: BTreeMap<String, Vec<String>>,
}

/// Where in the file a problem is, 1-based; the column counts characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

/// A configuration that cannot be used: `file:line:column: field.path: what is wrong`.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.render())]
pub struct ConfigError {
    /// The file, as given to [`Config::parse`] or [`Config::load`].
    pub file: String,
    /// Where in the file, when the problem is in its text.
    pub position: Option<Position>,
    /// The field, e.g. `agent.demo.tools[1].name`; empty for the file as a whole.
    pub path: String,
    /// What is wrong; never a secret's value.
    pub message: String,
    /// The I/O error, when the file could not be read.
    #[source]
    pub io: Option<std::io::Error>,
}

impl ConfigError {
    fn render(&self) -> String {
        let mut out = self.file.clone();
        if let Some(p) = self.position {
            out.push_str(&format!(":{}:{}", p.line, p.column));
        }
        out.push_str(": ");
        if !self.path.is_empty() {
            out.push_str(&self.path);
            out.push_str(": ");
        }
        out.push_str(&self.message);
        out
    }

    /// An error about a field, outside the file's text (e.g. a missing environment variable).
    fn at(file: &str, path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_owned(),
            position: None,
            path: path.into(),
            message: message.into(),
            io: None,
        }
    }
}

impl Config {
    /// Parses and checks a configuration; `file` names it in error messages.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let doc = DeTable::parse(text).map_err(|e| ConfigError {
            file: file.to_owned(),
            position: e.span().map(|s| position(text, s.start)),
            path: String::new(),
            message: syntax_message(text, &e),
            io: None,
        })?;
        let src = Source { file, text, doc: doc.get_ref() };
        let raw: RawConfig = serde_path_to_error::deserialize(toml::de::Deserializer::from(doc.clone()))
            .map_err(|e| src.serde_error(&e))?;
        build(raw, &src)
    }

    /// Reads, parses and checks the configuration file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            message: format!("cannot read the configuration file: {e}"),
            io: Some(e),
            ..ConfigError::at(&file, "", "")
        })?;
        Config::parse(&text, &file)
    }

    /// The bundled demo configuration ([`DEMO_TOML`]).
    pub fn demo() -> Result<Config, ConfigError> {
        Config::parse(DEMO_TOML, "demo.toml")
    }

    /// The agent `id`, if defined.
    pub fn agent(&self, id: &str) -> Option<&AgentDef> {
        self.agents.get(id)
    }

    /// The llm `id`, if defined.
    pub fn llm(&self, id: &str) -> Option<&LlmConfig> {
        self.llms.get(id)
    }

    /// Checks what only a long-lived process can run: a stdio MCP server is a child process
    /// of the local host, and a Lambda function keeps none between invocations.
    pub fn check_for_functions(&self) -> Result<(), ConfigError> {
        for (id, agent) in &self.agents {
            if let Some(i) = agent.mcp.iter().position(|server| server.command.is_some()) {
                return Err(ConfigError::at(
                    &self.file,
                    format!("agent.{id}.mcp[{i}].command"),
                    "a stdio MCP server runs only on the local host (turnstone serve); on AWS give the \
                     server's url (Streamable HTTP)",
                ));
            }
        }
        Ok(())
    }

    /// Reads every secret the file names from `env` (e.g. `|k| std::env::var(k).ok()`).
    /// A variable that is unset or empty is an error naming the variable and who needs it.
    pub fn resolve_secrets(&self, env: impl Fn(&str) -> Option<String>) -> Result<Secrets, ConfigError> {
        let read = |var: &str, path: String, who: String| {
            env(var).filter(|v| !v.trim().is_empty()).ok_or_else(|| {
                let state = if env(var).is_some() { "is empty" } else { "is not set" };
                ConfigError::at(
                    &self.file,
                    path,
                    format!("environment variable {var} {state} ({who} needs it)"),
                )
            })
        };
        let mut secrets = Secrets::default();
        for (id, llm) in &self.llms {
            if let Some(var) = &llm.api_key_env {
                let key = read(var, format!("llm.{id}.api_key_env"), format!("llm {id:?}"))?;
                secrets.llm_keys.insert(id.clone(), key);
            }
        }
        for (id, agent) in &self.agents {
            if let Some(var) = &agent.worker_secret_env {
                let secret = read(var, format!("agent.{id}.worker_secret_env"), format!("agent {id:?}"))?;
                secrets.worker_secrets.insert(id.clone(), secret);
            }
            for (i, server) in agent.mcp.iter().enumerate() {
                let mut headers = Vec::new();
                for (header, var) in &server.headers_env {
                    let path = format!("agent.{id}.mcp[{i}].headers_env.{header}");
                    let who = format!("MCP server {:?} of agent {id:?}", server.name);
                    headers.push((header.clone(), read(var, path, who)?));
                }
                secrets.mcp_headers.insert((id.clone(), server.name.clone()), headers);
            }
        }
        if let Some(auth) = &self.auth {
            let keys = |field: &str, var: &Option<String>| -> Result<Vec<(String, String)>, ConfigError> {
                let Some(var) = var else { return Ok(Vec::new()) };
                let path = format!("auth.{field}");
                let list = read(var, path.clone(), "[auth]".to_owned())?;
                parse_api_keys(&list).map_err(|m| {
                    ConfigError::at(&self.file, path, format!("environment variable {var}: {m}"))
                })
            };
            let clients = keys("api_keys_env", &auth.api_keys_env)?;
            let machines = keys("machine_keys_env", &auth.machine_keys_env)?;
            let admins = keys("admin_keys_env", &auth.admin_keys_env)?;
            let jwt_secret = match &auth.jwt_secret_env {
                Some(var) => {
                    let secret = read(var, "auth.jwt_secret_env".to_owned(), "[auth]".to_owned())?;
                    let min = crate::auth::MIN_JWT_SECRET_BYTES;
                    if secret.len() < min {
                        return Err(ConfigError::at(
                            &self.file,
                            "auth.jwt_secret_env",
                            format!(
                                "environment variable {var} holds {} bytes; an HS256 secret needs at least {min}",
                                secret.len()
                            ),
                        ));
                    }
                    Some(secret)
                }
                None => None,
            };
            let all = clients.iter().chain(&machines).chain(&admins);
            let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
            for (name, key) in all {
                if let Some(other) = seen.insert(key, name) {
                    return Err(ConfigError::at(
                        &self.file,
                        "auth",
                        format!("keys {other:?} and {name:?} are the same key; every key must be its own"),
                    ));
                }
            }
            for (name, _) in &machines {
                if !auth.machines.contains_key(name) {
                    return Err(ConfigError::at(
                        &self.file,
                        "auth.machines",
                        format!(
                            "machine key {name:?} serves no agent: add `{name} = [\"<agent>\", ...]` (or [\"*\"])"
                        ),
                    ));
                }
            }
            secrets.auth = Some(AuthSecrets { clients, machines, admins, jwt_secret });
        }
        Ok(secrets)
    }
}
mod build;
mod locate;
mod secrets;
#[cfg(test)]
mod tests;

use build::*;
use locate::*;
pub use secrets::Secrets;
use secrets::{AuthSecrets, parse_api_keys};
