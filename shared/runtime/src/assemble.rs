//! Building the runtime's agents from the configuration: one model provider per `[llm.X]`
//! block, shared by the agents that use it, and each agent's worker endpoint with its secret.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::app::AgentRuntime;
use crate::config::{Config, Secrets};
use crate::llm::pricing::{ModelPrices, Priced};
use crate::llm::{ModelProvider, ProviderSetupError, provider_for};
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
            Some(format) if !llm.prices.is_empty() => {
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
                Arc::new(Priced::new(provider, format, prices)) as Arc<dyn ModelProvider>
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
            });
            let provider = def.llm_for(config).and_then(|llm| providers.get(llm).cloned());
            let agent = AgentRuntime {
                id: id.clone(),
                declared: def.config.clone(),
                worker,
                provider,
                budget: def.budget,
            };
            (id.clone(), agent)
        })
        .collect())
}
