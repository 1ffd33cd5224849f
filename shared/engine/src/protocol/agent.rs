//! Agent configuration: model, system prompt, tools, sub-agents and retry policy.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a call runs: the engine, the worker, or the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Handler {
    /// The engine runs it (server LLM calls).
    Server,
    /// The worker webhook runs it.
    Worker,
    /// The client answers it with a `tool.result` / `tool.error` input.
    Client,
}

/// Where an LLM call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum LlmHandler {
    /// The engine calls the model with its provider (the default).
    #[default]
    Server,
    /// The worker runs it, as an `llm.execute` decision.
    Worker,
}

impl From<LlmHandler> for Handler {
    fn from(h: LlmHandler) -> Self {
        match h {
            LlmHandler::Server => Handler::Server,
            LlmHandler::Worker => Handler::Worker,
        }
    }
}

/// Where a tool call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ToolHandler {
    /// The worker runs it, as a `tool.execute` decision (the default).
    #[default]
    Worker,
    /// The client runs it and answers with a `tool.result` / `tool.error` input.
    Client,
    /// The engine runs it: a tool of an MCP server the agent lists (an extension of the
    /// protocol; the tool's declaration names the server in `mcp`).
    Server,
}

/// Where a tool the engine runs comes from: a tool of an MCP server (an extension of the
/// protocol, set by the engine on the tools it lists from the agent's servers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct McpToolSource {
    /// The server's name in the agent's configuration (the tool's name is `<server>__<tool>`).
    pub server: String,
    /// The tool's own name on that server.
    pub tool: String,
    /// The longest wait for one call.
    #[serde(serialize_with = "super::number::compact_f64")]
    pub timeout_secs: f64,
    /// The server says repeating a call is harmless (MCP's `idempotentHint`): a call whose
    /// outcome is unknown (the host stopped after sending it) may be sent again. Otherwise such
    /// a call fails saying it may have run, and is never sent twice.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idempotent: bool,
}

/// Whether a person must approve a tool's calls before they run (an extension of the
/// protocol: AHP's tool confirmation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Approval {
    /// Every call waits, `pending-confirmation`, until a client approves or denies it
    /// (`tool.approval`).
    Always,
    /// Calls run as soon as they are made (the default).
    #[default]
    Never,
}

impl From<ToolHandler> for Handler {
    fn from(h: ToolHandler) -> Self {
        match h {
            ToolHandler::Worker => Handler::Worker,
            ToolHandler::Client => Handler::Client,
            ToolHandler::Server => Handler::Server,
        }
    }
}

/// A provider wire format for worker-run LLM calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum LlmFormat {
    /// OpenAI chat completions.
    Openai,
    /// Anthropic messages.
    Anthropic,
    /// OpenAI responses (`POST /v1/responses`).
    #[serde(rename = "openai-responses")]
    OpenaiResponses,
}

/// An agent's configuration, versioned per branch of the session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct AgentConfig {
    /// The model to call; the only required field.
    pub model: String,
    /// The system prompt, prepended at call time (never stored as a message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Whether LLM calls stream (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Where LLM calls run (default server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<LlmHandler>,
    /// Wire format of worker-handled LLM calls; requires `handler: worker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<LlmFormat>,
    /// The retry policy of this agent's calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// The tools the model may call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<AgentTool>>,
    /// Agents the model may delegate to; each is a tool named by its id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_agents: Option<Vec<SubAgent>>,
}

impl AgentConfig {
    /// A config with only a model.
    pub fn new(model: impl Into<String>) -> Self {
        AgentConfig {
            model: model.into(),
            system: None,
            stream: None,
            handler: None,
            format: None,
            retry: None,
            tools: None,
            sub_agents: None,
        }
    }

    /// The declared tools, empty when none.
    pub fn tools(&self) -> &[AgentTool] {
        self.tools.as_deref().unwrap_or_default()
    }

    /// The declared sub-agents, empty when none.
    pub fn sub_agents(&self) -> &[SubAgent] {
        self.sub_agents.as_deref().unwrap_or_default()
    }

    /// Checks what the types cannot: `format` requires `handler: worker`, names are unique.
    pub fn validate(&self) -> Result<(), super::ProtocolError> {
        use super::ProtocolError;
        if self.format.is_some() && self.handler != Some(LlmHandler::Worker) {
            return Err(ProtocolError::new("format", "requires handler \"worker\""));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, tool) in self.tools().iter().enumerate() {
            if !seen.insert(tool.name.as_str()) {
                return Err(ProtocolError::new(
                    format!("tools[{i}].name"),
                    format!("duplicate tool {:?}", tool.name),
                ));
            }
            // The engine runs only the tools of MCP servers: what to call is in `mcp`.
            match (tool.handler == Some(ToolHandler::Server), &tool.mcp) {
                (true, None) => {
                    return Err(ProtocolError::new(
                        format!("tools[{i}].mcp"),
                        "handler \"server\" is for the tools of the agent's MCP servers: name the server and tool",
                    ));
                }
                (false, Some(_)) => {
                    return Err(ProtocolError::new(
                        format!("tools[{i}].handler"),
                        "must be \"server\" with mcp",
                    ));
                }
                _ => {}
            }
        }
        for (i, sub) in self.sub_agents().iter().enumerate() {
            if !seen.insert(sub.id.as_str()) {
                return Err(ProtocolError::new(
                    format!("sub_agents[{i}].id"),
                    format!("{:?} is already the name of a tool or sub-agent", sub.id),
                ));
            }
        }
        if let Some(retry) = &self.retry {
            retry.validate().map_err(|e| ProtocolError::new(format!("retry.{}", e.path), e.message))?;
        }
        Ok(())
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct AgentTool {
    /// The tool's name, as the model sees it.
    pub name: String,
    /// What the tool does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema for the arguments; absent: no arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// JSON Schema results must satisfy; a violating result settles as a terminal error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Who runs it (default worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<ToolHandler>,
    /// Whether its calls wait for a person's approval (default never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// For a tool the engine runs (`handler: "server"`): the MCP server and tool it calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpToolSource>,
}

impl AgentTool {
    /// Whether its calls wait for approval.
    pub fn needs_approval(&self) -> bool {
        self.approval == Some(Approval::Always)
    }
}

/// An agent the model may delegate to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct SubAgent {
    /// The agent to spawn, and the tool name the model sees.
    pub id: String,
    /// What the agent is for, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// How a call is bounded and retried.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct RetryPolicy {
    /// The bound on one attempt; null: no limit. Required on the wire, may be `null`.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Nullable<f64>"))]
    #[serde(deserialize_with = "super::parse::nullable", serialize_with = "super::number::compact_opt_f64")]
    pub timeout_secs: Option<f64>,
    /// How many attempts may follow the first.
    pub max_retries: u32,
    /// The wait before the first retry; doubles each retry.
    #[serde(serialize_with = "super::number::compact_f64")]
    pub backoff_base_secs: f64,
    /// The longest wait between attempts.
    #[serde(serialize_with = "super::number::compact_f64")]
    pub backoff_max_secs: f64,
}

impl RetryPolicy {
    /// One attempt, no timeout.
    pub const NONE: RetryPolicy =
        RetryPolicy { timeout_secs: None, max_retries: 0, backoff_base_secs: 0.0, backoff_max_secs: 0.0 };

    /// Checks the numbers make sense: non-negative, finite, base <= max.
    pub fn validate(&self) -> Result<(), super::ProtocolError> {
        use super::ProtocolError;
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if let Some(t) = self.timeout_secs
            && (!ok(t) || t == 0.0)
        {
            return Err(ProtocolError::new("timeout_secs", "must be a positive number of seconds or null"));
        }
        if !ok(self.backoff_base_secs) {
            return Err(ProtocolError::new("backoff_base_secs", "must be a non-negative number"));
        }
        if !ok(self.backoff_max_secs) || self.backoff_max_secs < self.backoff_base_secs {
            return Err(ProtocolError::new(
                "backoff_max_secs",
                "must be a number no smaller than backoff_base_secs",
            ));
        }
        Ok(())
    }

    /// The wait in milliseconds before retry `n` (1-based): `base * 2^(n-1)` capped at max.
    /// Jitter, when wanted, is added by the caller from its entropy.
    pub fn backoff_ms(&self, n: u32) -> u64 {
        let exp = 2f64.powi(n.saturating_sub(1).min(60) as i32);
        let secs = (self.backoff_base_secs * exp).min(self.backoff_max_secs);
        (secs * 1000.0).round() as u64
    }

    /// The bound on one attempt in milliseconds, if any.
    pub fn timeout_ms(&self) -> Option<u64> {
        self.timeout_secs.map(|t| (t * 1000.0).round() as u64)
    }
}

super::parse::objects_only!(AgentConfig, AgentTool, SubAgent, RetryPolicy);
