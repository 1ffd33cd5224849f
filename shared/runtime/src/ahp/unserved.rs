//! The requests of AHP that this host answers without serving their feature, so that a client
//! which sends them (VS Code's newest, docs/vscode-ahp-client.md §13) goes on: session
//! configuration and completions are answered empty (Turnstone's agents take no per-session
//! configuration and offer no completions), and what the host does not have (files, terminals,
//! changesets, automations, chats apart from their sessions) is refused with the protocol's error for it, naming
//! what is not there. A method AHP does not define stays -32601.

use ahp_types::commands::{
    CompletionsResult, ResolveSessionConfigParams, ResolveSessionConfigResult,
    SessionConfigCompletionsParams, SessionConfigCompletionsResult,
};
use ahp_types::errors::{ahp_error_codes, json_rpc_error_codes};
use ahp_types::state::SessionConfigSchema;
use serde_json::Value;

use super::AhpHost;
use super::rpc::{self, RpcError};

/// The answer to `method` if it is one of AHP's that this host does not serve; `None` for a
/// method AHP does not define (or one the host serves).
pub(crate) fn answer(host: &AhpHost, method: &str, params: Value) -> Option<Result<Value, RpcError>> {
    let answer = match method {
        "resolveSessionConfig" => resolve_config(host, params),
        "sessionConfigCompletions" => rpc::params::<SessionConfigCompletionsParams>(params)
            .and_then(|p| known_provider(host, p.provider.as_deref()))
            .and_then(|()| rpc::to_value(&SessionConfigCompletionsResult { items: Vec::new() })),
        "completions" => rpc::to_value(&CompletionsResult { items: Vec::new() }),
        "resourceRead" | "resourceList" | "resourceResolve" => Err(no_files(&params)),
        "resourceWrite"
        | "resourceDelete"
        | "resourceMove"
        | "resourceCopy"
        | "resourceMkdir"
        | "resourceRequest"
        | "createResourceWatch" => Err(RpcError::new(
            ahp_error_codes::PERMISSION_DENIED,
            format!("{method}: this host serves no files"),
        )),
        "createTerminal" | "disposeTerminal" => Err(absent(method, "runs no terminals")),
        "invokeChangesetOperation" => Err(absent(method, "keeps no changesets")),
        "listAutomationTriggerDefinitions" | "runAutomation" | "fetchAutomationRuns" => {
            Err(absent(method, "runs no automations"))
        }
        "moveChat" | "disposeChat" => {
            Err(absent(method, "keeps each chat with its session: a chat goes only with it (disposeSession)"))
        }
        _ => return None,
    };
    Some(answer)
}

/// `resolveSessionConfig`: no properties and no values, for any agent of this host.
fn resolve_config(host: &AhpHost, params: Value) -> Result<Value, RpcError> {
    let params: ResolveSessionConfigParams = rpc::params(params)?;
    known_provider(host, params.provider.as_deref())?;
    let schema =
        SessionConfigSchema { r#type: "object".to_owned(), properties: Default::default(), required: None };
    rpc::to_value(&ResolveSessionConfigResult { schema, values: Default::default() })
}

/// -32002 for a provider that is none of the host's agents.
fn known_provider(host: &AhpHost, provider: Option<&str>) -> Result<(), RpcError> {
    match provider {
        Some(provider) if host.app.agent(provider).is_none() => {
            Err(RpcError::new(ahp_error_codes::PROVIDER_NOT_FOUND, format!("no agent {provider:?}")))
        }
        _ => Ok(()),
    }
}

/// -32008 for a resource read: the host has no files to show.
fn no_files(params: &Value) -> RpcError {
    let uri = params.get("uri").and_then(Value::as_str).unwrap_or("the resource");
    RpcError::new(ahp_error_codes::NOT_FOUND, format!("no resource {uri}: this host serves no files"))
}

/// -32601 for a method of AHP this host does not serve, saying why.
fn absent(method: &str, why: &str) -> RpcError {
    RpcError::new(json_rpc_error_codes::METHOD_NOT_FOUND, format!("{method} is not served: this host {why}"))
}
