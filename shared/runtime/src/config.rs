//! The configuration file (`turnstone.toml`): server settings, engine defaults, model
//! providers, agents and auth, one file for both deployments.
//!
//! ```toml
//! [server]                      # optional; the local host only
//! addr = "127.0.0.1:8787"
//! data_dir = "./turnstone-data" # relative to the working directory
//! max_body_bytes = 1048576
//!
//! [defaults]                    # optional; engine default retry policies per kind of call
//! llm = { timeout_secs = 120, max_retries = 2, backoff_base_secs = 1, backoff_max_secs = 30 }
//! # tool, client_tool, sub_agent and decision likewise; a kind left out keeps the engine's.
//!
//! [llm.openai]                  # a model provider the engine calls (`handler = "server"`)
//! type = "openai"               # openai | anthropic | scripted
//! base_url = "https://api.openai.com/v1"  # optional: the provider's public API
//! api_key_env = "OPENAI_API_KEY"          # the NAME of the variable holding the key
//!
//! [agent.demo]                  # the seed's AgentConfig fields, plus:
//! model = "gpt-4o"
//! llm = "openai"                # which [llm.<id>] runs its server LLM calls
//! worker = "https://worker.example.com/decide"  # optional worker webhook
//! worker_secret_env = "DEMO_WORKER_SECRET"      # optional: its HMAC secret's variable
//!
//! [auth]                        # optional; absent: no auth
//! api_keys_env = "TURNSTONE_API_KEYS"           # `name:key,name:key`
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
    AgentConfig, AgentTool, LlmFormat, LlmHandler, RetryPolicy, SubAgent, ToolHandler,
};
use turnstone_engine::session::Defaults;

/// The bundled demo configuration, the one a new user reads first.
pub const DEMO_TOML: &str = include_str!("demo.toml");

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
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 8787)),
            data_dir: PathBuf::from("./turnstone-data"),
            max_body_bytes: 1024 * 1024,
        }
    }
}

/// A model provider the engine calls for server LLM calls (`[llm.<id>]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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
}

/// The kinds of model provider, by their `type` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmKind {
    /// OpenAI chat completions, or a compatible server at `base_url`.
    Openai,
    /// Anthropic messages.
    Anthropic,
    /// The deterministic built-in model, for demos and tests.
    Scripted,
}

impl LlmKind {
    /// The `type` name.
    pub fn name(self) -> &'static str {
        match self {
            LlmKind::Openai => "openai",
            LlmKind::Anthropic => "anthropic",
            LlmKind::Scripted => "scripted",
        }
    }

    /// The provider kind that [`crate::llm::provider_for`] builds.
    pub fn provider_kind(self) -> crate::llm::ProviderKind {
        match self {
            LlmKind::Openai => crate::llm::ProviderKind::Openai,
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

/// API-key auth (`[auth]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The environment variable holding comma-separated `name:key` pairs.
    pub api_keys_env: String,
}

/// Where in the file a problem is, 1-based; the column counts characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// The line.
    pub line: usize,
    /// The column.
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
        }
        if let Some(auth) = &self.auth {
            let var = &auth.api_keys_env;
            let list = read(var, "auth.api_keys_env".to_owned(), "[auth]".to_owned())?;
            let keys = parse_api_keys(&list).map_err(|m| {
                ConfigError::at(&self.file, "auth.api_keys_env", format!("environment variable {var}: {m}"))
            })?;
            secrets.api_keys = Some(keys);
        }
        Ok(secrets)
    }
}

/// The secret values a [`Config`] names, read from the environment. `Debug` shows names only.
#[derive(Clone, Default)]
pub struct Secrets {
    llm_keys: BTreeMap<String, String>,
    worker_secrets: BTreeMap<String, String>,
    api_keys: Option<Vec<(String, String)>>,
}

impl Secrets {
    /// The API key of llm `id`, if its block names one.
    pub fn llm_api_key(&self, id: &str) -> Option<&str> {
        self.llm_keys.get(id).map(String::as_str)
    }

    /// The HMAC secret of agent `id`'s worker, if its section names one.
    pub fn worker_secret(&self, agent: &str) -> Option<&str> {
        self.worker_secrets.get(agent).map(String::as_str)
    }

    /// Whether clients must present an API key (`[auth]` is configured).
    pub fn auth_enabled(&self) -> bool {
        self.api_keys.is_some()
    }

    /// The names of the configured API keys, in the variable's order.
    pub fn api_key_names(&self) -> impl Iterator<Item = &str> {
        self.api_keys.iter().flatten().map(|(name, _)| name.as_str())
    }

    /// The name of the API key equal to `presented`, compared in constant time per key.
    pub fn authenticate(&self, presented: &str) -> Option<&str> {
        let mut found = None;
        for (name, key) in self.api_keys.iter().flatten() {
            if constant_time_eq(key.as_bytes(), presented.as_bytes()) && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let api_keys =
            self.api_keys.as_ref().map(|keys| Names(keys.iter().map(|(n, _)| n.as_str()).collect()));
        f.debug_struct("Secrets")
            .field("llm_keys", &Names(self.llm_keys.keys().map(String::as_str).collect()))
            .field("worker_secrets", &Names(self.worker_secrets.keys().map(String::as_str).collect()))
            .field("api_keys", &api_keys)
            .finish()
    }
}

/// Debug-prints names, each mapped to `<redacted>`.
struct Names<'a>(Vec<&'a str>);

impl fmt::Debug for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Redacted;
        impl fmt::Debug for Redacted {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("<redacted>")
            }
        }
        f.debug_map().entries(self.0.iter().map(|name| (name, Redacted))).finish()
    }
}

/// Compares two byte strings without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Parses `name:key,name:key`; messages never show a key.
fn parse_api_keys(list: &str) -> Result<Vec<(String, String)>, String> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for (i, entry) in list.split(',').map(str::trim).enumerate().filter(|(_, e)| !e.is_empty()) {
        let n = i + 1;
        let Some((name, key)) = entry.split_once(':') else {
            return Err(format!("entry {n} is not `name:key`"));
        };
        let (name, key) = (name.trim(), key.trim());
        if name.is_empty() || name.chars().any(char::is_whitespace) {
            return Err(format!("entry {n} has an empty name or one with spaces (expected `name:key`)"));
        }
        if key.is_empty() {
            return Err(format!("entry {n} ({name:?}) has an empty key"));
        }
        if keys.iter().any(|(other, _)| other == name) {
            return Err(format!("entry {n} repeats the name {name:?}"));
        }
        if keys.iter().any(|(_, other)| other == key) {
            return Err(format!("entry {n} ({name:?}) repeats the key of another entry"));
        }
        keys.push((name.to_owned(), key.to_owned()));
    }
    if keys.is_empty() {
        return Err("holds no `name:key` entry; auth would refuse every request".to_owned());
    }
    Ok(keys)
}

// ---------------------------------------------------------------------------------------------
// The file as written, before checks.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: Option<ServerConfig>,
    #[serde(default)]
    defaults: Option<RawDefaults>,
    #[serde(default)]
    llm: BTreeMap<String, LlmConfig>,
    #[serde(default)]
    agent: BTreeMap<String, RawAgent>,
    #[serde(default)]
    auth: Option<AuthConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    llm: Option<RawRetry>,
    tool: Option<RawRetry>,
    client_tool: Option<RawRetry>,
    sub_agent: Option<RawRetry>,
    decision: Option<RawRetry>,
}

/// The seed's `RetryPolicy`, with `timeout_secs` left out for "no timeout" (TOML has no null).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    timeout_secs: Option<f64>,
    max_retries: u32,
    backoff_base_secs: f64,
    backoff_max_secs: f64,
}

impl RawRetry {
    fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            timeout_secs: self.timeout_secs,
            max_retries: self.max_retries,
            backoff_base_secs: self.backoff_base_secs,
            backoff_max_secs: self.backoff_max_secs,
        }
    }
}

/// The seed's `AgentConfig` fields plus the host's; built into [`AgentConfig`] field by field,
/// so a field added to the seed's type fails to compile here until it is added.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    model: String,
    system: Option<String>,
    stream: Option<bool>,
    handler: Option<LlmHandler>,
    format: Option<LlmFormat>,
    retry: Option<RawRetry>,
    tools: Option<Vec<AgentTool>>,
    sub_agents: Option<Vec<SubAgent>>,
    llm: Option<String>,
    worker: Option<String>,
    worker_secret_env: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Checks.

fn build(raw: RawConfig, src: &Source<'_>) -> Result<Config, ConfigError> {
    let mut problems = Problems { src, found: Vec::new() };
    let server = raw.server.unwrap_or_default();
    if server.max_body_bytes == 0 {
        problems.add(path(&["server", "max_body_bytes"]), "must be at least 1");
    }
    let defaults = build_defaults(raw.defaults, &mut problems);
    for (id, llm) in &raw.llm {
        check_llm(id, llm, &mut problems);
    }
    let llm_ids: Vec<&str> = raw.llm.keys().map(String::as_str).collect();
    let agent_ids: Vec<String> = raw.agent.keys().cloned().collect();
    let agent_ids: Vec<&str> = agent_ids.iter().map(String::as_str).collect();
    let mut agents = BTreeMap::new();
    for (id, agent) in raw.agent {
        let def = build_agent(id, agent, &llm_ids, &agent_ids, &mut problems);
        agents.insert(def.id.clone(), def);
    }
    if let Some(auth) = &raw.auth {
        check_env_name(&auth.api_keys_env, path(&["auth", "api_keys_env"]), &mut problems);
    }
    if let Some(first) = problems.first() {
        return Err(first);
    }
    Ok(Config { file: src.file.to_owned(), server, defaults, llms: raw.llm, agents, auth: raw.auth })
}

fn build_defaults(raw: Option<RawDefaults>, problems: &mut Problems<'_>) -> Defaults {
    let mut defaults = Defaults::default();
    let Some(raw) = raw else { return defaults };
    let kinds = [
        ("llm", &mut defaults.llm, raw.llm),
        ("tool", &mut defaults.tool, raw.tool),
        ("client_tool", &mut defaults.client_tool, raw.client_tool),
        ("sub_agent", &mut defaults.sub_agent, raw.sub_agent),
        ("decision", &mut defaults.decision, raw.decision),
    ];
    for (kind, slot, given) in kinds {
        if let Some(given) = given {
            let policy = given.policy();
            if let Err(e) = policy.validate() {
                problems.add(join(path(&["defaults", kind]), &e.path), e.message);
            }
            *slot = policy;
        }
    }
    defaults
}

fn check_llm(id: &str, llm: &LlmConfig, problems: &mut Problems<'_>) {
    let at = |field: &str| path(&["llm", id, field]);
    check_id("llm", id, path(&["llm", id]), problems);
    if let Some(url) = &llm.base_url {
        if llm.kind == LlmKind::Scripted {
            problems.add(at("base_url"), "the scripted model takes no base_url");
        } else if let Err(m) = check_url(url) {
            problems.add(at("base_url"), m);
        }
    }
    if let Some(var) = &llm.api_key_env {
        if llm.kind == LlmKind::Scripted {
            problems.add(at("api_key_env"), "the scripted model takes no API key");
        } else {
            check_env_name(var, at("api_key_env"), problems);
        }
    }
}

fn build_agent(
    id: String,
    raw: RawAgent,
    llm_ids: &[&str],
    agent_ids: &[&str],
    problems: &mut Problems<'_>,
) -> AgentDef {
    let at = |field: &str| join(path(&["agent", &id]), field);
    check_id("agent", &id, path(&["agent", &id]), problems);
    if raw.model.trim().is_empty() {
        problems.add(at("model"), "must not be empty");
    }
    let config = AgentConfig {
        model: raw.model,
        system: raw.system,
        stream: raw.stream,
        handler: raw.handler,
        format: raw.format,
        retry: raw.retry.as_ref().map(RawRetry::policy),
        tools: raw.tools,
        sub_agents: raw.sub_agents,
    };
    if let Err(e) = config.validate() {
        problems.add(at(&e.path), e.message);
    }
    let handler = config.handler.unwrap_or_default();
    match &raw.llm {
        Some(name) if !llm_ids.contains(&name.as_str()) => {
            problems.add(at("llm"), format!("unknown llm {name:?} ({})", defined(llm_ids)));
        }
        None if handler == LlmHandler::Server && llm_ids.is_empty() => problems.add(
            at("llm"),
            "missing: this agent's LLM calls run on the server (handler \"server\", the default) and no \
             [llm.<id>] block is defined; add one (e.g. [llm.scripted] with type = \"scripted\") or set \
             handler = \"worker\"",
        ),
        None if handler == LlmHandler::Server && llm_ids.len() > 1 => problems.add(
            at("llm"),
            format!(
                "missing: this agent's LLM calls run on the server (handler \"server\", the default) and \
                 {} [llm] blocks are defined ({}); name one with llm = \"<id>\"",
                llm_ids.len(),
                llm_ids.join(", ")
            ),
        ),
        _ => {}
    }
    if let Some(url) = &raw.worker
        && let Err(m) = check_url(url)
    {
        problems.add(at("worker"), m);
    }
    if raw.worker.is_none() {
        let worker = format!("agent.{id}.worker");
        if config.format.is_some() && handler == LlmHandler::Worker {
            problems.add(at("format"), format!("requires a worker URL ({worker} is not set)"));
        } else if handler == LlmHandler::Worker {
            problems.add(
                at("handler"),
                format!(
                    "\"worker\" sends LLM calls to the worker, but the agent has none ({worker} is not set)"
                ),
            );
        }
        for (i, tool) in config.tools().iter().enumerate() {
            if tool.handler.unwrap_or_default() == ToolHandler::Worker {
                let how = if tool.handler.is_none() { " (the default handler)" } else { "" };
                problems.add(
                    at(&format!("tools[{i}].handler")),
                    format!(
                        "tool {:?} runs on the worker{how}, but the agent has none ({worker} is not set); \
                         set handler = \"client\" or a worker",
                        tool.name
                    ),
                );
            }
        }
        if raw.worker_secret_env.is_some() {
            problems.add(
                at("worker_secret_env"),
                format!("there is no worker to sign requests for ({worker} is not set)"),
            );
        }
    }
    if let Some(var) = &raw.worker_secret_env {
        check_env_name(var, at("worker_secret_env"), problems);
    }
    for (i, sub) in config.sub_agents().iter().enumerate() {
        if !agent_ids.contains(&sub.id.as_str()) {
            problems.add(
                at(&format!("sub_agents[{i}].id")),
                format!("unknown agent {:?} ({})", sub.id, defined(agent_ids)),
            );
        }
    }
    AgentDef { id, config, llm: raw.llm, worker: raw.worker, worker_secret_env: raw.worker_secret_env }
}

fn defined(ids: &[&str]) -> String {
    if ids.is_empty() { "none defined".to_owned() } else { format!("defined: {}", ids.join(", ")) }
}

fn check_id(what: &str, id: &str, at: Vec<Seg>, problems: &mut Problems<'_>) {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        problems.add(at, format!("invalid {what} id {id:?}: use only letters, digits, '_' and '-'"));
    }
}

fn check_env_name(var: &str, at: Vec<Seg>, problems: &mut Problems<'_>) {
    let mut chars = var.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        // Not echoed: a value here is most likely the secret itself.
        problems.add(
            at,
            "must be the NAME of an environment variable (letters, digits and '_', not starting with a \
             digit); the secret itself goes in that variable, never in this file",
        );
    }
}

fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("is not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("must be an http:// or https:// URL, not scheme {:?}", parsed.scheme()));
    }
    if !parsed.has_host() {
        return Err("must be an http:// or https:// URL with a host".to_owned());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("must not carry credentials (user:password@); secrets never go in this file".to_owned());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Locating problems in the text.

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

fn path(keys: &[&str]) -> Vec<Seg> {
    keys.iter().map(|k| Seg::Key((*k).to_owned())).collect()
}

/// Appends a relative path such as `tools[1].name` (as the engine's errors give them).
fn join(mut base: Vec<Seg>, rel: &str) -> Vec<Seg> {
    for part in rel.split('.').filter(|p| !p.is_empty()) {
        let (name, indices) = part.find('[').map_or((part, ""), |i| part.split_at(i));
        if !name.is_empty() {
            base.push(Seg::Key(name.to_owned()));
        }
        for index in indices.split('[').filter_map(|s| s.strip_suffix(']')) {
            if let Ok(n) = index.parse() {
                base.push(Seg::Index(n));
            }
        }
    }
    base
}

fn render(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                    out.push_str(key);
                } else {
                    out.push_str(&format!("{key:?}"));
                }
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn segments(path: &serde_path_to_error::Path) -> Vec<Seg> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|seg| match seg {
            Segment::Seq { index } => Some(Seg::Index(*index)),
            Segment::Map { key } | Segment::Enum { variant: key } => Some(Seg::Key(key.clone())),
            Segment::Unknown => None,
        })
        .collect()
}

/// The span of the deepest part of `path` written in the file: a key, or an array element.
fn locate(doc: &DeTable<'_>, path: &[Seg]) -> Option<Range<usize>> {
    let mut span = None;
    let mut node: Option<&DeValue<'_>> = None;
    for seg in path {
        let table = match node {
            None => Some(doc),
            Some(DeValue::Table(t)) => Some(t),
            Some(_) => None,
        };
        let next = match (seg, table, node) {
            (Seg::Key(key), Some(table), _) => {
                table.get_key_value(key.as_str()).map(|(k, v)| (k.span(), v.get_ref()))
            }
            (Seg::Index(i), _, Some(DeValue::Array(items))) => items.get(*i).map(|v| (v.span(), v.get_ref())),
            _ => None,
        };
        let Some((at, value)) = next else { break };
        span = Some(at);
        node = Some(value);
    }
    span
}

/// The 1-based line and column of byte `offset` in `text`.
fn position(text: &str, offset: usize) -> Position {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Position { line: before.matches('\n').count() + 1, column: before[line_start..].chars().count() + 1 }
}

/// The text being parsed, for errors that point into it.
struct Source<'a> {
    file: &'a str,
    text: &'a str,
    doc: &'a DeTable<'a>,
}

impl Source<'_> {
    fn error_at(&self, span: Option<Range<usize>>, path: &[Seg], message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            position: span.map(|s| position(self.text, s.start)),
            path: render(path),
            message: message.into(),
            io: None,
        }
    }

    /// A type or shape error from deserializing, at the field it names.
    fn serde_error(&self, err: &serde_path_to_error::Error<toml::de::Error>) -> ConfigError {
        let mut path = segments(err.path());
        let message = reword(&mut path, err.inner().message());
        let span = err.inner().span().or_else(|| locate(self.doc, &path));
        self.error_at(span, &path, message)
    }
}

/// The problems found after parsing; the first in the file is reported.
struct Problems<'a> {
    src: &'a Source<'a>,
    found: Vec<(usize, ConfigError)>,
}

impl Problems<'_> {
    fn add(&mut self, path: Vec<Seg>, message: impl Into<String>) {
        let span = locate(self.src.doc, &path);
        let start = span.as_ref().map_or(usize::MAX, |s| s.start);
        self.found.push((start, self.src.error_at(span, &path, message)));
    }

    fn first(self) -> Option<ConfigError> {
        let mut found = self.found;
        found.sort_by_key(|(start, _)| *start);
        found.into_iter().next().map(|(_, e)| e)
    }
}

/// A TOML syntax error's message; a duplicate key is named (a key is never a secret).
fn syntax_message(text: &str, err: &toml::de::Error) -> String {
    let key = err
        .span()
        .and_then(|s| text.get(s))
        .filter(|k| err.message() == "duplicate key" && !k.contains('\n'));
    match key {
        Some(key) => format!("invalid TOML: duplicate key {:?}", key.trim_matches('"')),
        None => format!("invalid TOML: {}", err.message()),
    }
}

/// Rewrites serde's messages in the file's words: keys, not fields; the key joins the path.
fn reword(path: &mut Vec<Seg>, message: &str) -> String {
    let quoted = |rest: &str| rest.split_once('`').map(|(name, tail)| (name.to_owned(), backticked(tail)));
    if let Some((key, expected)) = message.strip_prefix("unknown field `").and_then(quoted) {
        if path.last() != Some(&Seg::Key(key.clone())) {
            path.push(Seg::Key(key.clone()));
        }
        return unknown("key", &key, &expected);
    }
    if let Some((value, expected)) = message.strip_prefix("unknown variant `").and_then(quoted) {
        return unknown("value", &value, &expected);
    }
    if let Some((key, _)) = message.strip_prefix("missing field `").and_then(quoted) {
        return format!("missing required key {key:?}");
    }
    if let Some((found, expected)) =
        message.strip_prefix("invalid type: ").and_then(|m| m.rsplit_once(", expected "))
    {
        // The value is not echoed: a misplaced secret must not reach the log.
        let found = match found.split(' ').next().unwrap_or_default() {
            "string" => "a string",
            "integer" => "an integer",
            "floating" => "a float",
            "boolean" => "a boolean",
            "sequence" => "an array",
            "map" => "a table",
            _ => found,
        };
        return format!("expected {}, found {found}", expected_in_toml(expected));
    }
    if let Some((value, expected)) =
        message.strip_prefix("invalid value: ").and_then(|m| m.rsplit_once(", expected "))
    {
        let value = backticked(value).into_iter().next().unwrap_or_else(|| value.to_owned());
        return format!("invalid value {value}, expected {}", expected_in_toml(expected));
    }
    if message == "invalid socket address syntax" {
        return "invalid socket address, expected an IP address and port such as \"127.0.0.1:8787\""
            .to_owned();
    }
    message.to_owned()
}

/// Serde's name of an expected type, in TOML's words.
fn expected_in_toml(expected: &str) -> &str {
    match expected {
        "a sequence" => "an array",
        "a map" => "a table",
        "u8" | "u16" | "u32" | "u64" | "usize" => "a non-negative integer",
        "f32" | "f64" => "a number",
        _ if expected.starts_with("struct ") => "a table",
        _ => expected,
    }
}

/// The names quoted in backticks: "expected one of `a`, `b`" -> [a, b].
fn backticked(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

fn unknown(what: &str, got: &str, expected: &[String]) -> String {
    let mut message = format!("unknown {what} {got:?}");
    let near = |e: &&String| {
        edit_distance(got, e) <= 2 || (got.len() >= 3 && (e.starts_with(got) || got.starts_with(e.as_str())))
    };
    if let Some(near) = expected.iter().filter(near).min_by_key(|e| edit_distance(got, e)) {
        message.push_str(&format!(" (did you mean {near:?}?)"));
    }
    if !expected.is_empty() {
        message.push_str(&format!("; expected one of: {}", expected.join(", ")));
    }
    message
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The message of the error `text` must fail with.
    fn err(text: &str) -> String {
        match Config::parse(text, "turnstone.toml") {
            Ok(config) => panic!("parsed, expected an error: {config:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// `text` after a `[llm.scripted]` block, so agents have a default llm.
    fn with_llm(text: &str) -> String {
        format!("[llm.scripted]\ntype = \"scripted\"\n\n{text}")
    }

    const FULL: &str = r#"[server]
addr = "0.0.0.0:9000"
data_dir = "/var/lib/turnstone"
max_body_bytes = 2048

[defaults]
llm = { timeout_secs = 60, max_retries = 1, backoff_base_secs = 0.5, backoff_max_secs = 5 }
client_tool = { max_retries = 0, backoff_base_secs = 0, backoff_max_secs = 0 }

[llm.openai]
type = "openai"
base_url = "http://localhost:11434/v1"
api_key_env = "OPENAI_API_KEY"

[llm.claude]
type = "anthropic"
api_key_env = "ANTHROPIC_API_KEY"

[agent.main]
model = "claude-sonnet"
system = "Be brief."
stream = false
handler = "worker"
format = "anthropic"
retry = { timeout_secs = 30, max_retries = 4, backoff_base_secs = 2, backoff_max_secs = 20 }
llm = "claude"
worker = "https://worker.example.com/decide"
worker_secret_env = "MAIN_WORKER_SECRET"
sub_agents = [{ id = "helper", description = "Helps." }]

[[agent.main.tools]]
name = "search"
description = "Search the web."
input = { type = "object", properties = { q = { type = "string" } }, required = ["q"] }
output = { type = "string" }
handler = "worker"

[[agent.main.tools]]
name = "ask"
handler = "client"

[agent.helper]
model = "gpt-4o-mini"
llm = "openai"

[auth]
api_keys_env = "TURNSTONE_API_KEYS"
"#;

    #[test]
    fn the_demo_parses() {
        let config = Config::demo().unwrap();
        assert_eq!(config.file, "demo.toml");
        assert_eq!(config.server, ServerConfig::default());
        assert_eq!(config.defaults, Defaults::default());
        assert_eq!(config.llms.keys().collect::<Vec<_>>(), ["scripted"]);
        assert_eq!(config.llms["scripted"].kind, LlmKind::Scripted);
        assert!(config.auth.is_none());

        let demo = config.agent("demo").unwrap();
        assert_eq!(demo.config.model, "scripted");
        assert_eq!(demo.config.stream, Some(true));
        assert!(demo.config.system.as_deref().is_some_and(|s| !s.is_empty()));
        assert_eq!(demo.llm_for(&config), Some("scripted"));
        assert!(!demo.has_worker());
        let [confirm] = demo.config.tools() else { panic!("one tool: {:?}", demo.config.tools) };
        assert_eq!(confirm.name, "confirm");
        assert_eq!(confirm.handler, Some(ToolHandler::Client));
        assert_eq!(confirm.input.as_ref().unwrap()["properties"]["question"]["type"], "string");
        assert_eq!(
            demo.config.sub_agents().iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["researcher"]
        );

        let researcher = config.agent("researcher").unwrap();
        assert_eq!(researcher.config.model, "scripted");
        assert_eq!(researcher.llm_for(&config), Some("scripted"));
        assert!(config.agent("nobody").is_none());

        let secrets = config.resolve_secrets(|_| None).unwrap();
        assert!(!secrets.auth_enabled());
    }

    #[test]
    fn the_demos_commented_examples_parse_once_uncommented() {
        let is_toml = |line: &str| {
            line.starts_with('[')
                || line.split_once(" = ").is_some_and(|(key, _)| {
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                })
        };
        let text: String = DEMO_TOML
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest) if is_toml(rest) => format!("{rest}\n"),
                _ => format!("{line}\n"),
            })
            .collect();
        let config = Config::parse(&text, "demo.toml").unwrap();
        // The commented [defaults] spell out the engine's own.
        assert_eq!(config.defaults, Defaults::default());
        assert_eq!(config.llms.keys().collect::<Vec<_>>(), ["anthropic", "openai", "scripted"]);
        let demo = config.agent("demo").unwrap();
        assert!(demo.has_worker());
        assert_eq!(demo.worker_secret_env.as_deref(), Some("DEMO_WORKER_SECRET"));
        assert!(demo.config.retry.is_some());
        assert_eq!(config.auth, Some(AuthConfig { api_keys_env: "TURNSTONE_API_KEYS".into() }));
    }

    #[test]
    fn a_full_example_parses_to_every_field() {
        let config = Config::parse(FULL, "turnstone.toml").unwrap();
        assert_eq!(
            config.server,
            ServerConfig {
                addr: "0.0.0.0:9000".parse().unwrap(),
                data_dir: PathBuf::from("/var/lib/turnstone"),
                max_body_bytes: 2048,
            }
        );
        let engine = Defaults::default();
        assert_eq!(
            config.defaults,
            Defaults {
                llm: RetryPolicy {
                    timeout_secs: Some(60.0),
                    max_retries: 1,
                    backoff_base_secs: 0.5,
                    backoff_max_secs: 5.0
                },
                client_tool: RetryPolicy::NONE,
                ..engine
            }
        );
        assert_eq!(
            config.llms["openai"],
            LlmConfig {
                kind: LlmKind::Openai,
                base_url: Some("http://localhost:11434/v1".into()),
                api_key_env: Some("OPENAI_API_KEY".into()),
            }
        );
        assert_eq!(
            config.llms["claude"],
            LlmConfig {
                kind: LlmKind::Anthropic,
                base_url: None,
                api_key_env: Some("ANTHROPIC_API_KEY".into())
            }
        );
        assert_eq!(config.llms["claude"].kind.provider_kind(), crate::llm::ProviderKind::Anthropic);

        let main = config.agent("main").unwrap();
        let expected = AgentConfig {
            model: "claude-sonnet".into(),
            system: Some("Be brief.".into()),
            stream: Some(false),
            handler: Some(LlmHandler::Worker),
            format: Some(LlmFormat::Anthropic),
            retry: Some(RetryPolicy {
                timeout_secs: Some(30.0),
                max_retries: 4,
                backoff_base_secs: 2.0,
                backoff_max_secs: 20.0,
            }),
            tools: Some(vec![
                AgentTool {
                    name: "search".into(),
                    description: Some("Search the web.".into()),
                    input: Some(json!({
                        "type": "object",
                        "properties": {"q": {"type": "string"}},
                        "required": ["q"]
                    })),
                    output: Some(json!({"type": "string"})),
                    handler: Some(ToolHandler::Worker),
                },
                AgentTool {
                    name: "ask".into(),
                    description: None,
                    input: None,
                    output: None,
                    handler: Some(ToolHandler::Client),
                },
            ]),
            sub_agents: Some(vec![SubAgent { id: "helper".into(), description: Some("Helps.".into()) }]),
        };
        assert_eq!(
            *main,
            AgentDef {
                id: "main".into(),
                config: expected,
                llm: Some("claude".into()),
                worker: Some("https://worker.example.com/decide".into()),
                worker_secret_env: Some("MAIN_WORKER_SECRET".into()),
            }
        );
        assert!(main.has_worker());
        assert_eq!(main.llm_for(&config), Some("claude"));

        let helper = config.agent("helper").unwrap();
        assert_eq!(helper.config, AgentConfig::new("gpt-4o-mini"));
        assert_eq!(helper.llm_for(&config), Some("openai"));
        assert!(!helper.has_worker());
        assert_eq!(config.auth, Some(AuthConfig { api_keys_env: "TURNSTONE_API_KEYS".into() }));
    }

    #[test]
    fn the_only_llm_is_the_default_and_worker_agents_need_none() {
        let config = Config::parse(&with_llm("[agent.a]\nmodel = \"m\"\n"), "t.toml").unwrap();
        let a = config.agent("a").unwrap();
        assert_eq!(a.llm, None);
        assert_eq!(a.llm_for(&config), Some("scripted"));

        let text = "[agent.w]\nmodel = \"m\"\nhandler = \"worker\"\nworker = \"http://127.0.0.1:9/\"\n";
        let config = Config::parse(text, "t.toml").unwrap();
        assert_eq!(config.agent("w").unwrap().llm_for(&config), None);
    }

    #[test]
    fn syntax_errors_name_the_line_and_column() {
        assert_eq!(
            err("[agent.demo\nmodel = \"x\"\n"),
            "turnstone.toml:1:12: invalid TOML: unclosed table, expected `]`"
        );
        assert_eq!(
            err("[server]\naddr = \"a\"\naddr = \"b\"\n"),
            "turnstone.toml:3:1: invalid TOML: duplicate key \"addr\""
        );
        assert_eq!(
            err("[server]\n\nmax_body_bytes = = 3\n"),
            "turnstone.toml:3:18: invalid TOML: extra `=`, expected nothing"
        );
    }

    #[test]
    fn unknown_keys_are_named_where_they_are() {
        assert_eq!(
            err("[agents.demo]\nmodel = \"x\"\n"),
            "turnstone.toml:1:2: agents: unknown key \"agents\" (did you mean \"agent\"?); \
             expected one of: server, defaults, llm, agent, auth"
        );
        assert_eq!(
            err(&with_llm("[agent.demo]\nmodel = \"x\"\nmodle = \"y\"\n")),
            "turnstone.toml:6:1: agent.demo.modle: unknown key \"modle\" (did you mean \"model\"?); \
             expected one of: model, system, stream, handler, format, retry, tools, sub_agents, llm, \
             worker, worker_secret_env"
        );
        assert_eq!(
            err(&with_llm(
                "[agent.demo]\nmodel = \"x\"\ntools = [{ name = \"a\", handler = \"client\", inptu = {} }]\n"
            )),
            "turnstone.toml:6:44: agent.demo.tools[0].inptu: unknown key \"inptu\" (did you mean \"input\"?); \
             expected one of: name, description, input, output, handler"
        );
        assert_eq!(
            err(&with_llm(
                "[agent.demo]\nmodel = \"x\"\n\n[[agent.demo.sub_agents]]\nid = \"demo\"\nwhy = 1\n"
            )),
            "turnstone.toml:9:1: agent.demo.sub_agents[0].why: unknown key \"why\"; expected one of: id, description"
        );
        assert_eq!(
            err(
                "[defaults]\nllm = { max_retries = 1, backoff_base_secs = 1, backoff_max_secs = 2, jitter = 1 }\n"
            ),
            "turnstone.toml:2:71: defaults.llm.jitter: unknown key \"jitter\"; \
             expected one of: timeout_secs, max_retries, backoff_base_secs, backoff_max_secs"
        );
        assert_eq!(
            err("[defaults]\nllms = { max_retries = 1, backoff_base_secs = 1, backoff_max_secs = 2 }\n"),
            "turnstone.toml:2:1: defaults.llms: unknown key \"llms\" (did you mean \"llm\"?); \
             expected one of: llm, tool, client_tool, sub_agent, decision"
        );
        assert_eq!(
            err("[llm.openai]\ntype = \"openai\"\napi_key = \"x\"\n"),
            "turnstone.toml:3:1: llm.openai.api_key: unknown key \"api_key\" (did you mean \"api_key_env\"?); \
             expected one of: type, base_url, api_key_env"
        );
        assert_eq!(
            err("[server]\nport = 8787\n"),
            "turnstone.toml:2:1: server.port: unknown key \"port\"; expected one of: addr, data_dir, max_body_bytes"
        );
        assert_eq!(
            err("[auth]\napi_keys = \"x\"\n"),
            "turnstone.toml:2:1: auth.api_keys: unknown key \"api_keys\" (did you mean \"api_keys_env\"?); \
             expected one of: api_keys_env"
        );
    }

    #[test]
    fn wrong_types_and_values_name_the_field() {
        assert_eq!(
            err(&with_llm("[agent.demo]\nmodel = \"x\"\nstream = \"yes\"\n")),
            "turnstone.toml:6:10: agent.demo.stream: expected a boolean, found a string"
        );
        assert_eq!(
            err(&with_llm("[agent.demo]\nmodel = \"x\"\ntools = [\"confirm\"]\n")),
            "turnstone.toml:6:10: agent.demo.tools[0]: expected a table, found a string"
        );
        assert_eq!(
            err(&with_llm("[agent.demo]\nmodel = \"x\"\nhandler = \"client\"\n")),
            "turnstone.toml:6:11: agent.demo.handler: unknown value \"client\"; expected one of: server, worker"
        );
        assert_eq!(
            err("[llm.x]\ntype = \"gpt\"\n"),
            "turnstone.toml:2:8: llm.x.type: unknown value \"gpt\"; expected one of: openai, anthropic, scripted"
        );
        assert_eq!(
            err("[llm.x]\nbase_url = \"http://h\"\n"),
            "turnstone.toml:1:1: llm.x: missing required key \"type\""
        );
        assert_eq!(
            err(&with_llm("[agent.demo]\nsystem = \"hi\"\n")),
            "turnstone.toml:4:1: agent.demo: missing required key \"model\""
        );
        assert_eq!(
            err("[defaults]\nllm = { max_retries = -1, backoff_base_secs = 1, backoff_max_secs = 2 }\n"),
            "turnstone.toml:2:23: defaults.llm.max_retries: invalid value -1, expected a non-negative integer"
        );
        assert_eq!(
            err("[server]\naddr = \"localhost\"\n"),
            "turnstone.toml:2:8: server.addr: invalid socket address, expected an IP address and port \
             such as \"127.0.0.1:8787\""
        );
        assert_eq!(
            err("[server]\nmax_body_bytes = 0\n"),
            "turnstone.toml:2:1: server.max_body_bytes: must be at least 1"
        );
        assert_eq!(err("agent = 3\n"), "turnstone.toml:1:9: agent: expected a table, found an integer");
    }

    #[test]
    fn the_seeds_own_rules_are_checked() {
        assert_eq!(
            err(&with_llm("[agent.demo]\nmodel = \"x\"\nformat = \"openai\"\n")),
            "turnstone.toml:6:1: agent.demo.format: requires handler \"worker\""
        );
        let dup = "[agent.demo]\nmodel = \"x\"\n\n[[agent.demo.tools]]\nname = \"a\"\nhandler = \"client\"\n\n\
                   [[agent.demo.tools]]\nname = \"a\"\nhandler = \"client\"\n";
        assert_eq!(
            err(&with_llm(dup)),
            "turnstone.toml:12:1: agent.demo.tools[1].name: duplicate tool \"a\""
        );
        let clash = "[agent.demo]\nmodel = \"x\"\ntools = [{ name = \"demo\", handler = \"client\" }]\n\
                     sub_agents = [{ id = \"demo\" }]\n";
        assert_eq!(
            err(&with_llm(clash)),
            "turnstone.toml:7:17: agent.demo.sub_agents[0].id: \"demo\" is already the name of a tool or sub-agent"
        );
        assert_eq!(
            err(&with_llm(
                "[agent.demo]\nmodel = \"x\"\nretry = { max_retries = 1, backoff_base_secs = 3, backoff_max_secs = 2 }\n"
            )),
            "turnstone.toml:6:51: agent.demo.retry.backoff_max_secs: must be a number no smaller than backoff_base_secs"
        );
        assert_eq!(
            err(
                "[defaults]\ndecision = { timeout_secs = 0, max_retries = 1, backoff_base_secs = 1, backoff_max_secs = 2 }\n"
            ),
            "turnstone.toml:2:14: defaults.decision.timeout_secs: must be a positive number of seconds or null"
        );
        assert_eq!(
            err(&with_llm("[agent.demo]\nmodel = \" \"\n")),
            "turnstone.toml:5:1: agent.demo.model: must not be empty"
        );
    }

    #[test]
    fn an_agents_llm_must_be_defined_or_the_only_one() {
        let text = "[llm.openai]\ntype = \"openai\"\n\n[llm.scripted]\ntype = \"scripted\"\n\n\
                    [agent.demo]\nmodel = \"x\"\nstream = true\n\n\n\nllm = \"gpt\"\n";
        assert_eq!(
            err(text),
            "turnstone.toml:13:1: agent.demo.llm: unknown llm \"gpt\" (defined: openai, scripted)"
        );
        assert_eq!(
            err("[agent.demo]\nmodel = \"x\"\nllm = \"gpt\"\n"),
            "turnstone.toml:3:1: agent.demo.llm: unknown llm \"gpt\" (none defined)"
        );
        let two = "[llm.a]\ntype = \"scripted\"\n[llm.b]\ntype = \"scripted\"\n[agent.demo]\nmodel = \"x\"\n";
        assert_eq!(
            err(two),
            "turnstone.toml:5:8: agent.demo.llm: missing: this agent's LLM calls run on the server \
             (handler \"server\", the default) and 2 [llm] blocks are defined (a, b); name one with llm = \"<id>\""
        );
        assert_eq!(
            err("[agent.demo]\nmodel = \"x\"\nhandler = \"server\"\n"),
            "turnstone.toml:1:8: agent.demo.llm: missing: this agent's LLM calls run on the server \
             (handler \"server\", the default) and no [llm.<id>] block is defined; add one \
             (e.g. [llm.scripted] with type = \"scripted\") or set handler = \"worker\""
        );
    }

    #[test]
    fn sub_agents_must_be_defined() {
        assert_eq!(
            err(&with_llm(
                "[agent.demo]\nmodel = \"x\"\nsub_agents = [{ id = \"demo\" }, { id = \"ghost\" }]\n"
            )),
            "turnstone.toml:6:34: agent.demo.sub_agents[1].id: unknown agent \"ghost\" (defined: demo)"
        );
    }

    #[test]
    fn worker_urls_are_http() {
        let agent = |url: &str| err(&with_llm(&format!("[agent.demo]\nmodel = \"x\"\nworker = \"{url}\"\n")));
        assert_eq!(
            agent("ftp://files.example.com/"),
            "turnstone.toml:6:1: agent.demo.worker: must be an http:// or https:// URL, not scheme \"ftp\""
        );
        assert_eq!(
            agent("worker.example.com"),
            "turnstone.toml:6:1: agent.demo.worker: is not a URL (relative URL without a base)"
        );
        assert_eq!(
            agent("https://me:hunter2@worker.example.com/"),
            "turnstone.toml:6:1: agent.demo.worker: must not carry credentials (user:password@); \
             secrets never go in this file"
        );
        assert_eq!(
            err("[llm.o]\ntype = \"openai\"\nbase_url = \"localhost:11434\"\n"),
            "turnstone.toml:3:1: llm.o.base_url: must be an http:// or https:// URL, not scheme \"localhost\""
        );
    }

    #[test]
    fn worker_work_needs_a_worker() {
        assert_eq!(
            err("[agent.demo]\nmodel = \"x\"\nhandler = \"worker\"\nformat = \"openai\"\n"),
            "turnstone.toml:4:1: agent.demo.format: requires a worker URL (agent.demo.worker is not set)"
        );
        assert_eq!(
            err("[agent.demo]\nmodel = \"x\"\nhandler = \"worker\"\n"),
            "turnstone.toml:3:1: agent.demo.handler: \"worker\" sends LLM calls to the worker, but the agent \
             has none (agent.demo.worker is not set)"
        );
        assert_eq!(
            err(&with_llm("[agent.demo]\nmodel = \"x\"\n\n[[agent.demo.tools]]\nname = \"search\"\n")),
            "turnstone.toml:7:1: agent.demo.tools[0].handler: tool \"search\" runs on the worker (the default \
             handler), but the agent has none (agent.demo.worker is not set); set handler = \"client\" or a worker"
        );
        assert_eq!(
            err(&with_llm("[agent.demo]\nmodel = \"x\"\nworker_secret_env = \"SECRET\"\n")),
            "turnstone.toml:6:1: agent.demo.worker_secret_env: there is no worker to sign requests for \
             (agent.demo.worker is not set)"
        );
    }

    #[test]
    fn ids_use_a_safe_alphabet() {
        assert_eq!(
            err(&with_llm("[agent.\"my agent\"]\nmodel = \"x\"\n")),
            "turnstone.toml:4:8: agent.\"my agent\": invalid agent id \"my agent\": use only letters, digits, '_' and '-'"
        );
        assert_eq!(
            err("[llm.\"gpt.4\"]\ntype = \"scripted\"\n"),
            "turnstone.toml:1:6: llm.\"gpt.4\": invalid llm id \"gpt.4\": use only letters, digits, '_' and '-'"
        );
    }

    #[test]
    fn secrets_are_named_never_written() {
        let message = err("[llm.openai]\ntype = \"openai\"\napi_key_env = \"sk-live-123\"\n");
        assert_eq!(
            message,
            "turnstone.toml:3:1: llm.openai.api_key_env: must be the NAME of an environment variable \
             (letters, digits and '_', not starting with a digit); the secret itself goes in that variable, \
             never in this file"
        );
        assert!(!message.contains("sk-live-123"));
        let message = err("[server]\naddr = { secret = \"sk-live-123\" }\n");
        assert!(!message.contains("sk-live-123"), "{message}");
        assert_eq!(
            err("[llm.s]\ntype = \"scripted\"\napi_key_env = \"KEY\"\n"),
            "turnstone.toml:3:1: llm.s.api_key_env: the scripted model takes no API key"
        );
    }

    #[test]
    fn the_first_problem_in_the_file_is_reported() {
        let text = "[agent.b]\nmodel = \"x\"\nllm = \"nope\"\n\n[agent.a]\nmodel = \"x\"\nllm = \"nope\"\n";
        assert_eq!(err(text), "turnstone.toml:3:1: agent.b.llm: unknown llm \"nope\" (none defined)");
    }

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        move |name| vars.get(name).cloned()
    }

    const ALL_SET: &[(&str, &str)] = &[
        ("OPENAI_API_KEY", "sk-openai-secret"),
        ("ANTHROPIC_API_KEY", "sk-ant-secret"),
        ("MAIN_WORKER_SECRET", "whsec-main"),
        ("TURNSTONE_API_KEYS", " alice:key-alice-1 , ci:key-ci-2,"),
    ];

    #[test]
    fn secrets_resolve_from_the_environment() {
        let config = Config::parse(FULL, "turnstone.toml").unwrap();
        let secrets = config.resolve_secrets(env(ALL_SET)).unwrap();
        assert_eq!(secrets.llm_api_key("openai"), Some("sk-openai-secret"));
        assert_eq!(secrets.llm_api_key("claude"), Some("sk-ant-secret"));
        assert_eq!(secrets.llm_api_key("nope"), None);
        assert_eq!(secrets.worker_secret("main"), Some("whsec-main"));
        assert_eq!(secrets.worker_secret("helper"), None);
        assert!(secrets.auth_enabled());
        assert_eq!(secrets.api_key_names().collect::<Vec<_>>(), ["alice", "ci"]);
        assert_eq!(secrets.authenticate("key-ci-2"), Some("ci"));
        assert_eq!(secrets.authenticate("key-alice-1"), Some("alice"));
        assert_eq!(secrets.authenticate("key-alice-"), None);
        assert_eq!(secrets.authenticate(""), None);

        let debug = format!("{secrets:?}");
        for (_, value) in ALL_SET {
            for part in
                value.split([',', ':']).map(str::trim).filter(|p| p.starts_with("key") || p.contains("sec"))
            {
                assert!(!debug.contains(part), "{debug} shows {part}");
            }
        }
        assert_eq!(
            debug,
            "Secrets { llm_keys: {\"claude\": <redacted>, \"openai\": <redacted>}, \
             worker_secrets: {\"main\": <redacted>}, api_keys: Some({\"alice\": <redacted>, \"ci\": <redacted>}) }"
        );
    }

    #[test]
    fn a_missing_secret_names_the_variable_and_who_needs_it() {
        let config = Config::parse(FULL, "turnstone.toml").unwrap();
        let without = |name: &str| {
            let vars: Vec<(&str, &str)> = ALL_SET.iter().copied().filter(|(k, _)| *k != name).collect();
            config.resolve_secrets(env(&vars)).unwrap_err().to_string()
        };
        assert_eq!(
            without("ANTHROPIC_API_KEY"),
            "turnstone.toml: llm.claude.api_key_env: environment variable ANTHROPIC_API_KEY is not set \
             (llm \"claude\" needs it)"
        );
        assert_eq!(
            without("MAIN_WORKER_SECRET"),
            "turnstone.toml: agent.main.worker_secret_env: environment variable MAIN_WORKER_SECRET is not set \
             (agent \"main\" needs it)"
        );
        assert_eq!(
            without("TURNSTONE_API_KEYS"),
            "turnstone.toml: auth.api_keys_env: environment variable TURNSTONE_API_KEYS is not set ([auth] needs it)"
        );
        let mut vars = ALL_SET.to_vec();
        vars[0].1 = "  ";
        assert_eq!(
            config.resolve_secrets(env(&vars)).unwrap_err().to_string(),
            "turnstone.toml: llm.openai.api_key_env: environment variable OPENAI_API_KEY is empty \
             (llm \"openai\" needs it)"
        );
    }

    #[test]
    fn malformed_api_keys_are_refused_without_showing_them() {
        let config = Config::parse("[auth]\napi_keys_env = \"KEYS\"\n", "t.toml").unwrap();
        let fail = |value: &str| config.resolve_secrets(env(&[("KEYS", value)])).unwrap_err().to_string();
        let message = fail("alice:k1,sk-live-999");
        assert_eq!(
            message,
            "t.toml: auth.api_keys_env: environment variable KEYS: entry 2 is not `name:key`"
        );
        assert_eq!(
            fail("alice:k1,alice:k2"),
            "t.toml: auth.api_keys_env: environment variable KEYS: entry 2 repeats the name \"alice\""
        );
        assert_eq!(
            fail("alice:k1,bob:k1"),
            "t.toml: auth.api_keys_env: environment variable KEYS: entry 2 (\"bob\") repeats the key of another entry"
        );
        assert_eq!(
            fail("alice:"),
            "t.toml: auth.api_keys_env: environment variable KEYS: entry 1 (\"alice\") has an empty key"
        );
        assert_eq!(
            fail(":k1"),
            "t.toml: auth.api_keys_env: environment variable KEYS: entry 1 has an empty name or one with spaces \
             (expected `name:key`)"
        );
        assert_eq!(
            fail(" , "),
            "t.toml: auth.api_keys_env: environment variable KEYS: holds no `name:key` entry; \
             auth would refuse every request"
        );
    }

    #[test]
    fn load_reads_a_file_and_names_it() {
        let dir = std::env::temp_dir().join(format!("turnstone-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("turnstone.toml");
        std::fs::write(&path, with_llm("[agent.demo]\nmodel = \"x\"\nllm = \"gpt\"\n")).unwrap();
        let message = Config::load(&path).unwrap_err().to_string();
        assert_eq!(
            message,
            format!("{}:6:1: agent.demo.llm: unknown llm \"gpt\" (defined: scripted)", path.display())
        );
        std::fs::write(&path, DEMO_TOML).unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(config.file, path.display().to_string());
        assert_eq!(config.agents.keys().collect::<Vec<_>>(), ["demo", "researcher"]);

        let missing = dir.join("absent.toml");
        let error = Config::load(&missing).unwrap_err();
        assert!(error.io.is_some());
        assert!(
            error
                .to_string()
                .starts_with(&format!("{}: cannot read the configuration file: ", missing.display())),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn positions_count_characters() {
        assert_eq!(position("ab\ncd", 4), Position { line: 2, column: 2 });
        assert_eq!(position("é = 1", 2), Position { line: 1, column: 2 });
        assert_eq!(position("é", 1), Position { line: 1, column: 1 });
        assert_eq!(position("", 10), Position { line: 1, column: 1 });
    }
}
