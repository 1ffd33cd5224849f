//! A deployment on AWS as a Lambda function builds it at init: the settings the template puts
//! in its environment, the Turnstone configuration from an S3 object or an SSM parameter (or
//! the built-in demo configuration), read once per container, the secrets it names from one Secrets Manager secret, and the engine over
//! the DynamoDB table and the SQS queue, with the API and the dispatcher apart
//! (`Topology::Split`: each function is its own process).

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_config::SdkConfig;
use turnstone_runtime::assemble::{self, Engine, SetupError, Topology};
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_runtime::config::{Config, ConfigError};
use turnstone_runtime::http::{Anonymous, HttpConfig};

use turnstone_runtime::ahp::{Pusher, Pushes};

use crate::config::{AwsClients, AwsConfig};
use crate::connections::DynamoRegistry;
use crate::error::AwsError;
use crate::management::ManagementFrames;
use crate::queue::SqsQueue;
use crate::schedule::Scheduler;

/// The variables the template sets (DESIGN.md section 9).
pub const TABLE_VAR: &str = "TURNSTONE_TABLE";
pub const QUEUE_URL_VAR: &str = "TURNSTONE_QUEUE_URL";
pub const CONFIG_PARAMETER_VAR: &str = "TURNSTONE_CONFIG_PARAMETER";
/// The configuration as a file in S3 (instead of the parameter): its bucket, key, and the
/// object version to read (unset: the latest).
pub const CONFIG_BUCKET_VAR: &str = "TURNSTONE_CONFIG_BUCKET";
pub const CONFIG_KEY_VAR: &str = "TURNSTONE_CONFIG_KEY";
pub const CONFIG_VERSION_VAR: &str = "TURNSTONE_CONFIG_VERSION";
pub const SECRETS_ARN_VAR: &str = "TURNSTONE_SECRETS_ARN";
/// The AHP WebSocket API's Management endpoint (`https://{api}.execute-api.{region}.amazonaws.com/{stage}`):
/// set, the function pushes its commits to AHP subscribers.
pub const AHP_ENDPOINT_VAR: &str = "TURNSTONE_AHP_ENDPOINT";
/// The EventBridge Scheduler group, the role Scheduler sends with and the queue's ARN: set
/// (all three), wake-ups further away than SQS's 15 minutes are scheduled once there.
pub const SCHEDULE_GROUP_VAR: &str = "TURNSTONE_SCHEDULE_GROUP";
pub const SCHEDULER_ROLE_VAR: &str = "TURNSTONE_SCHEDULER_ROLE_ARN";
pub const QUEUE_ARN_VAR: &str = "TURNSTONE_QUEUE_ARN";

/// Where a deployment's parts are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The table and the queue.
    pub aws: AwsConfig,
    /// The SSM parameter holding the configuration (TOML); `None`: the object, or else the
    /// demo configuration.
    pub config_parameter: Option<String>,
    /// The S3 object holding the configuration (a file of any size); at most one of it and
    /// the parameter is set.
    pub config_object: Option<ConfigObject>,
    /// The Secrets Manager secret (a JSON object of variable name -> value) that the
    /// configuration's `*_env` settings are looked up in first; `None`: the process
    /// environment only.
    pub secrets_arn: Option<String>,
    /// The AHP WebSocket API's Management endpoint; `None`: no AHP on this deployment.
    pub ahp_endpoint: Option<String>,
    /// Where long wake-ups are scheduled; `None`: they are re-armed on SQS every 15 minutes.
    pub schedules: Option<Schedules>,
}

/// A configuration file in S3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigObject {
    pub bucket: String,
    pub key: String,
    /// The object version; `None`: the latest.
    pub version: Option<String>,
}

impl std::fmt::Display for ConfigObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)?;
        match &self.version {
            Some(version) => write!(f, "?versionId={version}"),
            None => Ok(()),
        }
    }
}

/// The EventBridge Scheduler side of a deployment (see `schedule.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedules {
    pub group: String,
    pub role_arn: String,
    pub queue_arn: String,
}

impl Settings {
    /// The settings from `var` (the process environment in a function): the table and queue
    /// are required, an empty optional setting counts as unset.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Settings, DeploymentError> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let required = |name: &'static str| set(name).ok_or(DeploymentError::MissingSetting(name));
        Ok(Settings {
            aws: AwsConfig {
                table: required(TABLE_VAR)?,
                queue: required(QUEUE_URL_VAR)?,
                ..AwsConfig::default()
            },
            config_parameter: set(CONFIG_PARAMETER_VAR),
            config_object: match set(CONFIG_BUCKET_VAR) {
                Some(_) if set(CONFIG_PARAMETER_VAR).is_some() => {
                    return Err(DeploymentError::TwoConfigurations);
                }
                Some(bucket) => Some(ConfigObject {
                    bucket,
                    key: required(CONFIG_KEY_VAR)?,
                    version: set(CONFIG_VERSION_VAR),
                }),
                None => None,
            },
            secrets_arn: set(SECRETS_ARN_VAR),
            ahp_endpoint: set(AHP_ENDPOINT_VAR),
            schedules: match set(SCHEDULE_GROUP_VAR) {
                Some(group) => Some(Schedules {
                    group,
                    role_arn: required(SCHEDULER_ROLE_VAR)?,
                    queue_arn: required(QUEUE_ARN_VAR)?,
                }),
                None => None,
            },
        })
    }
}

/// What a function runs: the engine and the HTTP API's settings.
pub struct Deployment {
    pub engine: Engine,
    pub http: HttpConfig,
    /// With an AHP endpoint: the recorded AHP connections, which the engine's commits push to.
    pub ahp: Option<Arc<Pushes>>,
    /// The wake-up queue (the dispatch function holds the messages of its runs with it).
    pub queue: SqsQueue,
}

impl Deployment {
    /// The deployment a function's environment describes, with SDK clients from the usual AWS
    /// environment (the function's role).
    pub async fn from_env() -> Result<Deployment, DeploymentError> {
        let settings = Settings::from_vars(|name| std::env::var(name).ok())?;
        let sdk = settings.aws.loader().load().await;
        Deployment::open(&settings, &sdk).await
    }

    /// The deployment `settings` describe, through `sdk`.
    pub async fn open(settings: &Settings, sdk: &SdkConfig) -> Result<Deployment, DeploymentError> {
        Deployment::open_at(settings, sdk, Arc::new(SystemClock)).await
    }

    /// [`Deployment::open`] on `clock` (a test's).
    pub async fn open_at(
        settings: &Settings,
        sdk: &SdkConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Deployment, DeploymentError> {
        let config = match (&settings.config_parameter, &settings.config_object) {
            (Some(_), Some(_)) => return Err(DeploymentError::TwoConfigurations),
            (Some(name), None) => {
                let text = read_parameter(sdk, name).await?;
                Config::parse(&text, &format!("ssm:{name}"))?
            }
            (None, Some(object)) => {
                let text = read_object(sdk, object).await?;
                Config::parse(&text, &object.to_string())?
            }
            (None, None) => Config::demo()?,
        };
        config.check_for_functions()?;
        let stored = match &settings.secrets_arn {
            Some(arn) => read_secrets(sdk, arn).await?,
            None => BTreeMap::new(),
        };
        let secrets =
            config.resolve_secrets(|name| stored.get(name).cloned().or_else(|| std::env::var(name).ok()))?;
        let clients = AwsClients::new(sdk);
        let (store, queue) = settings.aws.connect_with(&clients).await?;
        let store =
            store.with_cache_bytes(turnstone_runtime::memo::session_budget(config.limits.session_cache_mb));
        let queue = match &settings.schedules {
            Some(s) => queue.scheduling(
                Scheduler::new(aws_sdk_scheduler::Client::new(sdk), &s.group, &s.role_arn, &s.queue_arn)
                    .with_clock(Arc::clone(&clock)),
            ),
            None => queue,
        };
        let agents = assemble::agents(&config, &secrets)?;
        let ahp = settings.ahp_endpoint.as_deref().map(|endpoint| {
            let registry = DynamoRegistry::new(clients.dynamodb.clone(), settings.aws.table.clone());
            Pushes::new(Arc::new(registry), Arc::new(ManagementFrames::new(sdk, endpoint)))
        });
        let pushes = ahp.clone();
        let engine = assemble::engine_at(
            &config,
            agents,
            Arc::new(store),
            Arc::new(queue.clone()),
            Topology::Split,
            move |notifier| match pushes {
                Some(pushes) => Arc::new(Pusher::new(notifier, pushes)),
                None => notifier,
            },
            clock,
        )
        .map_err(|e| DeploymentError::HttpClient(e.to_string()))?;
        if let Some(pushes) = &ahp {
            pushes.attach(&engine.app);
        }
        // Reached from the internet: without `[auth]`, nobody is served unless the
        // configuration says anyone may be.
        let anonymous = config.auth.is_none();
        if anonymous && config.server.allow_anonymous {
            tracing::warn!(
                "no [auth] and [server] allow_anonymous = true: anyone who reaches this deployment may read and drive every session"
            );
        } else if anonymous {
            tracing::warn!(
                "no [auth]: every request but /healthz is refused (503 auth_not_configured) until the configuration has one"
            );
        }
        let http = HttpConfig {
            anonymous: if config.server.allow_anonymous { Anonymous::Everyone } else { Anonymous::Nobody },
            ..assemble::http(&config, &secrets)
        };
        Ok(Deployment { engine, http, ahp, queue })
    }
}

/// The configuration text in SSM parameter `name` (decrypted if a SecureString).
async fn read_parameter(sdk: &SdkConfig, name: &str) -> Result<String, DeploymentError> {
    let failed = |message: String| DeploymentError::ConfigParameter { name: name.to_owned(), message };
    let answer = aws_sdk_ssm::Client::new(sdk)
        .get_parameter()
        .name(name)
        .with_decryption(true)
        .send()
        .await
        .map_err(|e| failed(aws_sdk_ssm::error::DisplayErrorContext(e).to_string()))?;
    answer.parameter.and_then(|p| p.value).ok_or_else(|| failed("the parameter has no value".to_owned()))
}

/// The configuration text in S3 object `object` (that version, or the latest).
async fn read_object(sdk: &SdkConfig, object: &ConfigObject) -> Result<String, DeploymentError> {
    let failed = |message: String| DeploymentError::ConfigObject { object: object.to_string(), message };
    // A stand-in on one endpoint (moto) serves buckets by path, not by host name.
    let s3 = aws_sdk_s3::config::Builder::from(sdk).force_path_style(sdk.endpoint_url().is_some()).build();
    let answer = aws_sdk_s3::Client::from_conf(s3)
        .get_object()
        .bucket(&object.bucket)
        .key(&object.key)
        .set_version_id(object.version.clone())
        .send()
        .await
        .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(e).to_string()))?;
    let bytes =
        answer.body.collect().await.map_err(|e| failed(format!("reading the body: {e}")))?.into_bytes();
    String::from_utf8(bytes.to_vec()).map_err(|e| failed(format!("not UTF-8 text: {e}")))
}

/// The variables in Secrets Manager secret `arn`: a JSON object of strings.
async fn read_secrets(sdk: &SdkConfig, arn: &str) -> Result<BTreeMap<String, String>, DeploymentError> {
    let failed = |message: String| DeploymentError::Secrets { arn: arn.to_owned(), message };
    let answer = aws_sdk_secretsmanager::Client::new(sdk)
        .get_secret_value()
        .secret_id(arn)
        .send()
        .await
        .map_err(|e| failed(aws_sdk_secretsmanager::error::DisplayErrorContext(e).to_string()))?;
    let text = answer.secret_string.ok_or_else(|| failed("the secret has no string value".to_owned()))?;
    // Never echo the secret's text in the error: only where it is wrong.
    serde_json::from_str(&text).map_err(|e| {
        failed(format!(
            "the secret is not a JSON object of strings (line {}, column {}); write it as {{\"NAME\": \"value\", ...}}",
            e.line(),
            e.column()
        ))
    })
}

/// Why a function cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DeploymentError {
    /// A setting the template provides is missing from the environment.
    #[error("{0} is not set (the template sets it; set it to run a function elsewhere)")]
    MissingSetting(&'static str),
    /// The configuration parameter could not be read.
    #[error("cannot read the configuration from SSM parameter {name}: {message}")]
    ConfigParameter { name: String, message: String },
    /// The configuration object could not be read.
    #[error("cannot read the configuration from {object}: {message}")]
    ConfigObject { object: String, message: String },
    /// Both a parameter and an object are named: which one runs would be a guess.
    #[error(
        "both TURNSTONE_CONFIG_PARAMETER and TURNSTONE_CONFIG_BUCKET are set: set one (the template's ConfigParameter or ConfigBucket)"
    )]
    TwoConfigurations,
    /// The secrets could not be read.
    #[error("cannot read the secrets from {arn}: {message}")]
    Secrets { arn: String, message: String },
    /// The configuration is invalid, or a secret it names is missing.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An agent's model provider cannot be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The table or the queue cannot be reached.
    #[error(transparent)]
    Aws(#[from] AwsError),
    /// The worker webhook's HTTP client cannot be built.
    #[error("cannot build the worker HTTP client: {0}")]
    HttpClient(String),
}
