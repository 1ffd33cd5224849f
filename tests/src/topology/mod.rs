//! The AWS stack as deployed, under AWS's rules, in the test's process: each function of
//! `infra/template.yaml` built as its `main.rs` builds it ([`turnstone_aws::Deployment`]),
//! each with its own IAM principal whose statements are that function's `Policies` read from
//! the template itself, its SDK calls going through the [`gate::Gate`], which refuses what its
//! role does not allow as IAM would, to a moto server that enforces authentication.
//!
//! - [`template`]: the template's functions, intrinsics resolved to the stand-in stack.
//! - [`policy`]: IAM's evaluation of a role's statements.
//! - [`gate`]: the proxy that authorizes and records every call.
//! - [`Deployed`]: one stack (a stage): its table, queue, configuration parameter and secret,
//!   its functions' principals, and the functions themselves, served as API Gateway and
//!   Lambda would ([`front`]): the api function behind the HTTP API's routes (buffered, 30 s),
//!   the stream function behind its Function URL (streamed, 900 s), each request handed over
//!   as Lambda's 2.0 event through `lambda_http`; the queue drained by an event source mapping
//!   that polls with the dispatch function's role and invokes its batch handler under the
//!   template's timeout; and the sweep on a schedule.
//!
//! The ahp function is behind the WebSocket API ([`websocket`]), whose Management API every
//! function reaches through the gate.
//!
//! Wake-ups beyond SQS's 15 minutes are EventBridge Scheduler schedules ([`scheduler`]): the
//! gate authorizes and checks each `CreateSchedule`, and a runner fires the due ones as the
//! template's scheduler role. The stack runs on its own clock, which [`Deployed::advance`]
//! moves on, so a day's wait passes in a moment.
//!
//! Faults: [`Deployed::kill_next_dispatch`], [`Deployed::throttle_next_dispatch`],
//! [`Deployed::set_dispatch_timeout`] and [`Deployed::duplicate_batches`].

pub mod front;
pub mod gate;
pub mod policy;
pub mod scheduler;
pub mod template;
pub mod websocket;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName};
use axum::body::Body;
use axum::http::Request as HttpRequest;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use turnstone_aws::deployment::{ConfigObject, Schedules};
use turnstone_aws::{
    AwsClients, AwsConfig, Deployment, DeploymentError, DynamoStore, QueueSettings, Settings, SqsQueue, moto,
};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::app::App;
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_runtime::config::Config;
use turnstone_runtime::dispatch::Dispatcher;
use turnstone_runtime::http::Anonymous;

use gate::{Call, Gate, Principal};
use template::{Physical, Stack, Template, TemplateError};

/// The stand-in account's id and region (moto's default account).
pub const ACCOUNT: &str = "123456789012";
pub const REGION: &str = "us-east-1";

/// The records of the SQS event Lambda's SQS event source builds for a batch of `messages`
/// received from the queue `queue_arn` (developer guide, "Using Lambda with Amazon SQS", the
/// example event): one record per message, in order.
pub fn sqs_records(messages: &[aws_sdk_sqs::types::Message], queue_arn: &str) -> Vec<serde_json::Value> {
    messages
        .iter()
        .map(|m| {
            let attributes: BTreeMap<&str, &str> =
                m.attributes().into_iter().flatten().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            json!({
                "messageId": m.message_id(),
                "receiptHandle": m.receipt_handle(),
                "body": m.body(),
                "attributes": attributes,
                "messageAttributes": {},
                "md5OfBody": m.md5_of_body(),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": REGION,
            })
        })
        .collect()
}

/// How often the sweep runs (the template's schedule is a minute; tests cannot wait that long).
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How many batches the event source mapping has in flight at once.
const POLLERS: usize = 4;

/// The stack's clock: the system's, moved on by [`Deployed::advance`].
#[derive(Debug, Default)]
struct StackClock {
    offset_ms: std::sync::atomic::AtomicI64,
}

impl Clock for StackClock {
    fn now(&self) -> Timestamp {
        Timestamp(SystemClock.now().0.saturating_add(self.offset_ms.load(Ordering::Relaxed)))
    }
}

/// The account: the enforcing moto server, its administrator, and the gate in front of it.
struct Account {
    moto: &'static str,
    admin: aws_sdk_iam::config::Credentials,
    gate: Arc<Gate>,
}

static ACCOUNT_ONCE: OnceLock<Account> = OnceLock::new();

fn account() -> &'static Account {
    ACCOUNT_ONCE.get_or_init(|| {
        let moto = moto::enforcing_endpoint();
        // Its first requests are not authenticated: they make the administrator the rest of
        // the setup signs as. On a thread of its own: this may run inside a test's runtime.
        let admin = std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(administrator(moto))
        })
        .join()
        .expect("the administrator is made");
        Account { moto, admin, gate: Gate::start(moto, ACCOUNT, REGION) }
    })
}

async fn administrator(moto: &str) -> aws_sdk_iam::config::Credentials {
    let anyone = aws_sdk_iam::config::Credentials::new("bootstrap", "bootstrap", None, None, "topology");
    let iam = aws_sdk_iam::Client::new(&sdk(moto, anyone).await);
    iam.create_user().user_name("topology-admin").send().await.expect("CreateUser (unauthenticated)");
    iam.put_user_policy()
        .user_name("topology-admin")
        .policy_name("everything")
        .policy_document(allow_everything())
        .send()
        .await
        .expect("PutUserPolicy (unauthenticated)");
    let key = iam
        .create_access_key()
        .user_name("topology-admin")
        .send()
        .await
        .expect("CreateAccessKey (unauthenticated)");
    let key = key.access_key.expect("an access key");
    aws_sdk_iam::config::Credentials::new(
        key.access_key_id,
        key.secret_access_key,
        None,
        None,
        "topology-admin",
    )
}

/// A policy document that allows every action on every resource.
fn allow_everything() -> String {
    json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})
        .to_string()
}

/// An SDK configuration for `endpoint`, signing with `credentials`.
async fn sdk(endpoint: &str, credentials: aws_sdk_iam::config::Credentials) -> SdkConfig {
    AwsConfig {
        endpoint_url: Some(endpoint.to_owned()),
        region: Some(REGION.to_owned()),
        ..AwsConfig::default()
    }
    .loader()
    .credentials_provider(credentials)
    .load()
    .await
}

/// Why a stack did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// A function's initialization failed, as its `main` would.
    #[error("{function} cannot start: {error}")]
    Function { function: String, error: DeploymentError },
}

/// How the stack's configuration parameter and secret are encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encryption {
    /// Under AWS's own keys (aws/ssm, aws/secretsmanager): reading them is all it takes.
    AwsOwned,
    /// Under a customer managed key, named to the template as `ConfigKeyArn`: reading them
    /// also takes `kms:Decrypt` on it.
    CustomerKey,
}

/// Where the stack keeps its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigIn {
    /// An SSM parameter (`ConfigParameter`).
    Parameter,
    /// A file in a versioned S3 bucket (`ConfigBucket`, `ConfigObjectKey`, `ConfigObjectVersion`).
    Object,
}

/// Puts `config_toml` in a new versioned bucket of the stack, under a later version too (so
/// reading the pinned one is what counts); the object as the stack names it.
async fn put_config_object(admin: &SdkConfig, stage: &str, config_toml: &str) -> ConfigObject {
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(admin).force_path_style(true).build(),
    );
    let bucket = format!("turnstone-{stage}-config");
    s3.create_bucket().bucket(&bucket).send().await.expect("CreateBucket");
    let enabled = aws_sdk_s3::types::VersioningConfiguration::builder()
        .status(aws_sdk_s3::types::BucketVersioningStatus::Enabled)
        .build();
    s3.put_bucket_versioning()
        .bucket(&bucket)
        .versioning_configuration(enabled)
        .send()
        .await
        .expect("versioning");
    let put = |body: String| {
        s3.put_object().bucket(&bucket).key("turnstone.toml").body(body.into_bytes().into()).send()
    };
    let pinned = put(config_toml.to_owned()).await.expect("PutObject").version_id;
    put("this version is not the one the stack pins".to_owned()).await.expect("PutObject");
    ConfigObject { bucket, key: "turnstone.toml".to_owned(), version: pinned }
}

/// One deployed stack.
pub struct Deployed {
    pub stage: String,
    /// The api function's app (what HTTP does not show).
    pub app: Arc<App>,
    url: String,
    stream_url: String,
    ahp_url: String,
    source: Arc<EventSource>,
    /// The account's administrator on SQS (the test's own hand, not a function's).
    admin: aws_sdk_sqs::Client,
    /// The dead-letter queue's URL.
    dead_letters: String,
    /// The stack's clock, every function's.
    clock: Arc<StackClock>,
    /// EventBridge Scheduler's part.
    schedules: Arc<scheduler::Runner>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

/// A function built: its engine over its own principal's clients.
struct Built {
    deployment: Deployment,
    name: String,
    timeout: Duration,
    sdk: SdkConfig,
    routes: Vec<template::Route>,
    url: Option<template::FunctionUrl>,
}

impl Deployed {
    /// Deploys `template` with the configuration `config_toml` (its secrets from `env`, put in
    /// the stack's secret) and serves it on a loopback port.
    pub async fn start(
        config_toml: &str,
        env: impl Fn(&str) -> Option<String>,
        template: &Template,
    ) -> Result<Deployed, StartError> {
        Deployed::start_with(config_toml, env, template, Encryption::AwsOwned).await
    }

    /// [`Deployed::start`], the configuration and the secret encrypted as `encryption` says.
    pub async fn start_with(
        config_toml: &str,
        env: impl Fn(&str) -> Option<String>,
        template: &Template,
        encryption: Encryption,
    ) -> Result<Deployed, StartError> {
        Deployed::start_from(config_toml, env, template, encryption, ConfigIn::Parameter).await
    }

    /// [`Deployed::start_with`], the configuration kept where `config_in` says.
    pub async fn start_from(
        config_toml: &str,
        env: impl Fn(&str) -> Option<String>,
        template: &Template,
        encryption: Encryption,
        config_in: ConfigIn,
    ) -> Result<Deployed, StartError> {
        let account = account();
        let stage = moto::unique("t").to_lowercase();
        let admin = sdk(account.moto, account.admin.clone()).await;
        let table = format!("turnstone-{stage}-sessions");
        let queue = format!("turnstone-{stage}-wakeups");
        let clients = AwsClients::new(&admin);
        DynamoStore::new(clients.dynamodb.clone(), &table).create_table().await.expect("CreateTable");
        // The template's visibility timeout and redrive limit, to its dead-letter queue.
        let visibility_timeout = template.visibility_timeout("WakeUpQueue")?;
        let max_receive_count = Some(template.max_receive_count("WakeUpQueue")?);
        let settings = QueueSettings { visibility_timeout, max_receive_count, ..QueueSettings::default() };
        let queue_url = SqsQueue::create_queue(&clients.sqs, &queue, &settings).await.expect("CreateQueue");
        let queue_arn = format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{queue}");

        // The configuration in its parameter, the secrets it names in the stack's secret.
        let parameter = format!("/turnstone/{stage}/config");
        let key = match encryption {
            Encryption::AwsOwned => None,
            Encryption::CustomerKey => {
                Some(format!("arn:aws:kms:{REGION}:{ACCOUNT}:key/{}", moto::unique("key")))
            }
        };
        // The configuration where the stack keeps it: the parameter, or a file in a versioned
        // bucket, read at the version the stack pins.
        let object = match config_in {
            ConfigIn::Parameter => {
                aws_sdk_ssm::Client::new(&admin)
                    .put_parameter()
                    .name(&parameter)
                    .value(config_toml)
                    .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
                    .set_key_id(key.clone())
                    .send()
                    .await
                    .expect("PutParameter");
                None
            }
            ConfigIn::Object => Some(put_config_object(&admin, &stage, config_toml).await),
        };
        let config =
            Config::parse(config_toml, "topology.toml").unwrap_or_else(|e| panic!("bad test config: {e}"));
        let named = Mutex::new(BTreeMap::new());
        config
            .resolve_secrets(|name| {
                let value = env(name);
                if let Some(v) = &value {
                    named.lock().unwrap().insert(name.to_owned(), v.clone());
                }
                value
            })
            .unwrap_or_else(|e| panic!("test secrets: {e}"));
        let secret_name = format!("turnstone/{stage}/secrets");
        let secret = aws_sdk_secretsmanager::Client::new(&admin)
            .create_secret()
            .name(&secret_name)
            .secret_string(serde_json::to_string(&named.into_inner().unwrap()).unwrap())
            .set_kms_key_id(key.clone())
            .send()
            .await
            .expect("CreateSecret");
        let secret_arn = secret.arn.expect("the secret's ARN");
        account.gate.register_secret(&secret_name, &secret_arn);
        if let Some(key) = &key {
            let parameter_arn = format!("arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{parameter}");
            account.gate.register_key(&parameter_arn, key);
            account.gate.register_key(&secret_arn, key);
        }

        // The schedule group and the role Scheduler sends with.
        let schedule_group = format!("turnstone-{stage}-wakeups");
        aws_sdk_scheduler::Client::new(&admin)
            .create_schedule_group()
            .name(&schedule_group)
            .send()
            .await
            .expect("CreateScheduleGroup");
        let scheduler_role = format!("turnstone-{stage}-scheduler");
        let scheduler_role_arn = format!("arn:aws:iam::{ACCOUNT}:role/{scheduler_role}");
        let clock = Arc::new(StackClock::default());

        let ahp_api = format!("ahp{}", stage.replace('-', ""));
        let stack = Stack {
            account: ACCOUNT.to_owned(),
            region: REGION.to_owned(),
            parameters: BTreeMap::from([
                ("Stage".to_owned(), stage.clone()),
                (
                    "ConfigParameter".to_owned(),
                    if object.is_some() { String::new() } else { parameter.clone() },
                ),
                ("ConfigBucket".to_owned(), object.as_ref().map(|o| o.bucket.clone()).unwrap_or_default()),
                ("ConfigObjectKey".to_owned(), object.as_ref().map(|o| o.key.clone()).unwrap_or_default()),
                (
                    "ConfigObjectVersion".to_owned(),
                    object.as_ref().and_then(|o| o.version.clone()).unwrap_or_default(),
                ),
                ("SecretsArn".to_owned(), secret_arn.clone()),
                ("ConfigKeyArn".to_owned(), key.clone().unwrap_or_default()),
            ]),
            resources: BTreeMap::from([
                physical(
                    "SessionsTable",
                    &table,
                    &[("Arn", &format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}"))],
                ),
                physical("WakeUpQueue", &queue_url, &[("Arn", &queue_arn), ("QueueName", &queue)]),
                physical("AhpApi", &ahp_api, &[]),
                physical(
                    "WakeUpSchedules",
                    &schedule_group,
                    &[(
                        "Arn",
                        &format!("arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule-group/{schedule_group}"),
                    )],
                ),
                physical("WakeUpSchedulerRole", &scheduler_role, &[("Arn", &scheduler_role_arn)]),
            ]),
        };
        let schedules = scheduler::Runner::new(
            Arc::clone(&account.gate),
            &admin,
            &schedule_group,
            template.role_statements("WakeUpSchedulerRole", &stack)?,
            Arc::clone(&clock) as Arc<dyn Clock>,
        );
        let functions = template.functions(&stack)?;
        let iam = aws_sdk_iam::Client::new(&admin);
        let mut built = BTreeMap::new();
        for function in functions {
            let user = format!("{stage}-{}", function.logical_id);
            let made = iam.create_user().user_name(&user).send().await.expect("CreateUser");
            let arn = made.user.map(|u| u.arn).unwrap_or_default();
            // Each document of the role as an IAM policy: moto validates its grammar as IAM
            // does. Authorization is the gate's (see `gate`); moto, asked only to authenticate,
            // gets a policy that allows what the gate let through.
            for (name, document) in &function.documents {
                iam.create_policy()
                    .policy_name(format!("{user}-{name}"))
                    .policy_document(document.to_string())
                    .send()
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "{}: IAM refuses the policy {name}: {}",
                            function.logical_id,
                            aws_sdk_iam::error::DisplayErrorContext(e)
                        )
                    });
            }
            iam.put_user_policy()
                .user_name(&user)
                .policy_name("authorized-by-the-gate")
                .policy_document(allow_everything())
                .send()
                .await
                .expect("PutUserPolicy");
            let key = iam.create_access_key().user_name(&user).send().await.expect("CreateAccessKey");
            let key = key.access_key.expect("an access key");
            account.gate.register(
                &key.access_key_id,
                Principal {
                    function: function.logical_id.clone(),
                    stage: stage.clone(),
                    arn,
                    statements: function.statements.clone(),
                },
            );
            let credentials = aws_sdk_iam::config::Credentials::new(
                key.access_key_id,
                key.secret_access_key,
                None,
                None,
                "function",
            );
            let sdk = sdk(account.gate.url(), credentials).await;
            let settings = Settings {
                aws: AwsConfig {
                    endpoint_url: Some(account.gate.url().to_owned()),
                    region: Some(REGION.to_owned()),
                    table: table.clone(),
                    queue: queue_url.clone(),
                },
                config_parameter: object.is_none().then(|| parameter.clone()),
                config_object: object.clone(),
                secrets_arn: Some(secret_arn.clone()),
                ahp_endpoint: Some(format!("{}/{stage}", account.gate.url())),
                schedules: Some(Schedules {
                    group: schedule_group.clone(),
                    role_arn: scheduler_role_arn.clone(),
                    queue_arn: queue_arn.clone(),
                }),
            };
            let deployment = Deployment::open_at(&settings, &sdk, Arc::clone(&clock) as Arc<dyn Clock>)
                .await
                .map_err(|error| StartError::Function { function: function.logical_id.clone(), error })?;
            let name = format!(
                "turnstone-{stage}-{}",
                function.logical_id.trim_end_matches("Function").to_lowercase()
            );
            built.insert(
                function.logical_id.clone(),
                Built {
                    deployment,
                    name,
                    timeout: function.timeout,
                    sdk,
                    routes: function.routes,
                    url: function.url,
                },
            );
        }
        let mut take = |id: &str| built.remove(id).unwrap_or_else(|| panic!("the template has no {id}"));
        let (api, stream, dispatch, sweep, ahp) = (
            take("ApiFunction"),
            take("StreamFunction"),
            take("DispatchFunction"),
            take("SweepFunction"),
            take("AhpFunction"),
        );
        let anonymous = config.auth.is_none();
        let app = Arc::clone(&api.deployment.engine.app);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the HTTP API");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let stream_listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the Function URL");
        let stream_url = format!("http://{}", stream_listener.local_addr().expect("an address"));
        let ws_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the WebSocket API");
        let ws_url = format!("http://{}", ws_listener.local_addr().expect("an address"));
        let ahp_url = format!("{}/{stage}", ws_url.replacen("http://", "ws://", 1));
        account.gate.register_management(&stage, &ahp_api, &ws_url);
        let (shutdown, stopped) = oneshot::channel::<()>();
        let source = Arc::new(EventSource {
            sqs: aws_sdk_sqs::Client::new(&dispatch.sdk),
            queue_url,
            queue_arn,
            timeout: Mutex::new(dispatch.timeout),
            template_timeout: dispatch.timeout,
            dispatcher: Arc::clone(&dispatch.deployment.engine.dispatcher),
            queue: dispatch.deployment.queue.clone(),
            ahp: dispatch.deployment.ahp.clone(),
            kills: Mutex::new(VecDeque::new()),
            throttles: Mutex::new(VecDeque::new()),
            last_fault: Mutex::new(None),
            duplicates: AtomicBool::new(false),
            largest_batch: AtomicUsize::new(0),
            invocations: AtomicUsize::new(0),
            timeouts: AtomicUsize::new(0),
            clock: Arc::clone(&clock),
        });
        let fronts = Fronts::new(&stage, &ahp_api, api, stream, ahp, anonymous)?;
        let listeners = [listener, stream_listener, ws_listener];
        let task = tokio::spawn(serve(fronts, Arc::clone(&source), sweep, listeners, stopped));
        let dead_letters = format!("{}-dlq", source.queue_url);
        schedules.spawn();
        let admin = aws_sdk_sqs::Client::new(&admin);
        Ok(Deployed {
            stage,
            app,
            url,
            stream_url,
            ahp_url,
            source,
            admin,
            dead_letters,
            clock,
            schedules,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    /// Moves the stack's clock (every function's, and Scheduler's) on by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.clock.offset_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// The stack's clock now.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The names of the wake-up schedules waiting to fire.
    pub fn schedules_waiting(&self) -> Vec<String> {
        self.schedules.waiting()
    }

    /// The wake-up schedules that fired: (name, the wake-up they sent).
    pub fn schedules_fired(&self) -> Vec<(String, String)> {
        self.schedules.fired()
    }

    /// A fault: the next dispatch invocation is killed `after` it starts (its future dropped,
    /// as Lambda ends an invocation that times out or a process that crashes: nothing of it
    /// runs on, nothing of its batch is deleted).
    pub fn kill_next_dispatch(&self, after: Duration) {
        self.source.kills.lock().unwrap().push_back(after);
    }

    /// A fault: the next dispatch invocation is throttled for `for_` (Lambda's event source
    /// mapping holds the batch it received, its messages in flight, and retries the
    /// invocation until concurrency frees up).
    pub fn throttle_next_dispatch(&self, for_: Duration) {
        self.source.throttles.lock().unwrap().push_back(for_);
    }

    /// A fault from now on: dispatch invocations time out after `timeout` instead of the
    /// template's (the handler is told that deadline, and a run past it is killed); `None`:
    /// the template's again.
    pub fn set_dispatch_timeout(&self, timeout: Option<Duration>) {
        *self.source.timeout.lock().unwrap() = timeout.unwrap_or(self.source.template_timeout);
    }

    /// Kills and throttles queued that have not struck yet.
    pub fn faults_pending(&self) -> usize {
        self.source.kills.lock().unwrap().len() + self.source.throttles.lock().unwrap().len()
    }

    /// When the last fault struck (a kill, a throttle, a timeout), if one has.
    pub fn last_fault(&self) -> Option<tokio::time::Instant> {
        *self.source.last_fault.lock().unwrap()
    }

    /// A fault from now on: each dispatch batch carries every record twice, reordered.
    pub fn duplicate_batches(&self) {
        self.source.duplicates.store(true, Ordering::Relaxed);
    }

    /// The most records one dispatch invocation was handed.
    pub fn largest_batch(&self) -> usize {
        self.source.largest_batch.load(Ordering::Relaxed)
    }

    /// How many dispatch invocations there were, and how many of them ran into their timeout
    /// (and were killed there).
    pub fn dispatch_invocations(&self) -> (usize, usize) {
        (self.source.invocations.load(Ordering::Relaxed), self.source.timeouts.load(Ordering::Relaxed))
    }

    /// `http://127.0.0.1:<port>`: the HTTP API's `$default` stage (the stack's `ApiUrl`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `http://127.0.0.1:<port>`: the stream function's URL (the stack's `StreamUrl`).
    pub fn stream_url(&self) -> &str {
        &self.stream_url
    }

    /// `ws://127.0.0.1:<port>/<stage>`: the WebSocket API's stage (the stack's `AhpUrl`).
    pub fn ahp_url(&self) -> &str {
        &self.ahp_url
    }

    /// Sends `body` to the wake-up queue as someone other than the functions would (a message
    /// that is not a wake-up, say).
    pub async fn send_to_wake_ups(&self, body: &str) {
        self.admin
            .send_message()
            .queue_url(&self.source.queue_url)
            .message_body(body)
            .send()
            .await
            .expect("SendMessage");
    }

    /// The bodies in the dead-letter queue now (received and made visible again at once).
    pub async fn dead_letters(&self) -> Vec<String> {
        let out = self
            .admin
            .receive_message()
            .queue_url(&self.dead_letters)
            .max_number_of_messages(10)
            .visibility_timeout(0)
            .send()
            .await
            .expect("ReceiveMessage from the dead-letter queue");
        out.messages.unwrap_or_default().into_iter().filter_map(|m| m.body).collect()
    }

    /// Every AWS call this stack's functions made.
    pub fn calls(&self) -> Vec<Call> {
        account().gate.calls(&self.stage)
    }

    /// The calls IAM refused.
    pub fn refused(&self) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.refused.is_some()).collect()
    }

    /// Stops serving; the handle of the serving task, to await.
    pub fn stop(&mut self) -> Option<JoinHandle<std::io::Result<()>>> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.take()
    }
}

impl Drop for Deployed {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn physical(id: &str, reference: &str, attributes: &[(&str, &str)]) -> (String, Physical) {
    let attributes = attributes.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    (id.to_owned(), Physical { reference: reference.to_owned(), attributes })
}

/// The HTTP API, the Function URL and the WebSocket API, with their functions.
struct Fronts {
    api: front::HttpApi,
    stream: front::StreamingUrl,
    websocket: websocket::WebSocketApi,
}

impl Fronts {
    /// The api function behind the template's `HttpApi` routes, the stream function behind its
    /// `FunctionUrlConfig`, the ahp function behind WebSocket API `ahp_api`. Without `[auth]`
    /// the test stands for a deployment whose configuration says `[server] allow_anonymous =
    /// true`.
    fn new(
        stage: &str,
        ahp_api: &str,
        api: Built,
        stream: Built,
        ahp: Built,
        anonymous: bool,
    ) -> Result<Fronts, TemplateError> {
        let http = |built: &Built| {
            let mut http = built.deployment.http.clone();
            if anonymous {
                http.anonymous = Anonymous::Everyone;
            }
            http
        };
        let api_router =
            turnstone_lambda::http::api_router(Arc::clone(&api.deployment.engine.app), http(&api));
        let stream_router =
            turnstone_lambda::http::stream_router(Arc::clone(&stream.deployment.engine.app), http(&stream));
        if api.routes.is_empty() {
            return Err(TemplateError {
                at: "ApiFunction.Events".into(),
                message: "no HttpApi route".into(),
            });
        }
        match &stream.url {
            Some(url) if url.invoke_mode == "RESPONSE_STREAM" && url.auth_type == "NONE" => {}
            other => {
                return Err(TemplateError {
                    at: "StreamFunction.FunctionUrlConfig".into(),
                    message: format!(
                        "the topology serves a RESPONSE_STREAM URL with AuthType NONE, not {other:?}"
                    ),
                });
            }
        }
        let function = |built: &Built, router| front::Function {
            name: built.name.clone(),
            timeout: built.timeout,
            router,
        };
        let api_function = function(&api, api_router);
        let Some(pushes) = ahp.deployment.ahp.clone() else {
            return Err(TemplateError {
                at: "AhpFunction".into(),
                message: "no TURNSTONE_AHP_ENDPOINT".into(),
            });
        };
        let gateway = Arc::new(turnstone_runtime::ahp::Gateway::new(pushes, &http(&ahp)));
        let websocket = websocket::WebSocketApi::new(
            ahp_api.to_owned(),
            stage.to_owned(),
            Arc::clone(&ahp.deployment.engine.app),
            gateway,
            ahp.timeout,
        );
        Ok(Fronts {
            websocket,
            api: front::HttpApi {
                api_id: format!("api{}", stage.replace('-', "")),
                routes: api.routes.iter().map(|r| (r.clone(), api_function.clone())).collect(),
            },
            stream: front::StreamingUrl {
                url_id: format!("url{}", stage.replace('-', "")),
                function: function(&stream, stream_router),
            },
        })
    }
}

/// The functions at work until `stopped`: the fronts (the HTTP API, the Function URL and the
/// WebSocket API on their listeners), the event source mapping's pollers, the sweep's
/// schedule.
async fn serve(
    fronts: Fronts,
    source: Arc<EventSource>,
    sweep: Built,
    listeners: [tokio::net::TcpListener; 3],
    stopped: oneshot::Receiver<()>,
) -> std::io::Result<()> {
    let Fronts { api, stream, websocket } = fronts;
    let (api, stream) = (Arc::new(api), Arc::new(stream));
    let api = axum::Router::new().fallback(move |request: HttpRequest<Body>| {
        let api = Arc::clone(&api);
        async move { api.invoke(request).await }
    });
    let stream = axum::Router::new().fallback(move |request: HttpRequest<Body>| {
        let stream = Arc::clone(&stream);
        async move { stream.invoke(request).await }
    });
    let pollers: Vec<_> = (0..POLLERS).map(|_| tokio::spawn(Arc::clone(&source).poll())).collect();
    let dispatcher = Arc::clone(&sweep.deployment.engine.dispatcher);
    let schedule = tokio::spawn(async move {
        loop {
            if let Err(e) = turnstone_lambda::schedule::handle_schedule(&dispatcher).await {
                tracing::warn!(error = %e, "the sweep failed");
            }
            tokio::time::sleep(SWEEP_EVERY).await;
        }
    });
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let servers: Vec<_> = listeners
        .into_iter()
        .zip([api, stream, Arc::new(websocket).router()])
        .map(|(listener, router)| {
            let mut stopping = stopping.clone();
            tokio::spawn(
                axum::serve(listener, router.into_make_service())
                    .with_graceful_shutdown(async move {
                        let _ = stopping.wait_for(|stop| *stop).await;
                    })
                    .into_future(),
            )
        })
        .collect();
    let _ = stopped.await;
    let _ = stop.send(true);
    let mut result = Ok(());
    for server in servers {
        let served = server.await.unwrap_or_else(|e| Err(std::io::Error::other(e)));
        result = result.and(served);
    }
    schedule.abort();
    for poller in pollers {
        poller.abort();
    }
    result
}

/// Lambda's event source mapping for the wake-up queue: batches of up to 10, each invoking
/// the dispatch function's handler with an SQS event, the invocation's deadline the
/// function's timeout, a run past it killed (its future dropped: nothing of the batch is
/// deleted, and it comes back when its visibility lapses); a batch item failure stays on the
/// queue, the rest is deleted (AWS Lambda developer guide, "Using Lambda with Amazon SQS" and
/// "Implementing partial batch responses").
struct EventSource {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    queue_arn: String,
    /// The function's timeout (the template's, unless a fault shortens it).
    timeout: Mutex<Duration>,
    template_timeout: Duration,
    dispatcher: Arc<Dispatcher>,
    /// The dispatch function's queue, which leases the batch's messages.
    queue: SqsQueue,
    /// The dispatch function's pushes to AHP connections (which its departures go through).
    ahp: Option<Arc<turnstone_runtime::ahp::Pushes>>,
    /// Faults to come: each kills one invocation that long after it starts.
    kills: Mutex<VecDeque<Duration>>,
    /// Faults to come: each throttles one invocation that long.
    throttles: Mutex<VecDeque<Duration>>,
    /// When the last fault struck.
    last_fault: Mutex<Option<tokio::time::Instant>>,
    /// A fault: every batch carries each record twice, in reverse order.
    duplicates: AtomicBool,
    /// The most records one invocation was handed.
    largest_batch: AtomicUsize,
    /// Invocations, and those that ran into their timeout.
    invocations: AtomicUsize,
    timeouts: AtomicUsize,
    /// The stack's clock, which Lambda's deadlines are told in.
    clock: Arc<StackClock>,
}

/// A batch as at-least-once delivery may hand it over: each record twice (the copy under its
/// own message id, as a second delivery of a wake-up sent twice), the order reversed.
fn duplicated(records: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let copies: Vec<_> = records
        .iter()
        .map(|r| {
            let mut copy = r.clone();
            copy["messageId"] = json!(format!("{}-again", r["messageId"].as_str().unwrap_or_default()));
            copy
        })
        .collect();
    records.into_iter().chain(copies).rev().collect()
}

impl EventSource {
    fn fault(&self) {
        *self.last_fault.lock().unwrap() = Some(tokio::time::Instant::now());
    }

    async fn poll(self: Arc<Self>) {
        loop {
            let received = self
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await;
            let messages = match received {
                Ok(out) => out.messages.unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(e), "the event source could not receive");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            if messages.is_empty() {
                continue;
            }
            let records = sqs_records(&messages, &self.queue_arn);
            let records = if self.duplicates.load(Ordering::Relaxed) { duplicated(records) } else { records };
            self.largest_batch.fetch_max(records.len(), Ordering::Relaxed);
            let event = serde_json::from_value(json!({ "Records": records })).expect("an SQS event");
            let throttled = self.throttles.lock().unwrap().pop_front();
            if let Some(throttled) = throttled {
                self.fault();
                tracing::warn!(?throttled, "a dispatch invocation is throttled (a fault)");
                tokio::time::sleep(throttled).await;
            }
            let timeout = *self.timeout.lock().unwrap();
            let deadline = self.clock.now().0 + i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
            let run = turnstone_lambda::sqs::handle_batch(
                &self.dispatcher,
                event,
                Some(Timestamp(deadline)),
                Some(&self.queue),
                self.ahp.as_deref(),
            );
            let kill = self.kills.lock().unwrap().pop_front();
            self.invocations.fetch_add(1, Ordering::Relaxed);
            let Ok(response) = tokio::time::timeout(kill.unwrap_or(timeout).min(timeout), run).await else {
                self.fault();
                match kill {
                    Some(after) if after < timeout => {
                        tracing::warn!(?after, "a dispatch invocation was killed (a fault)");
                    }
                    _ => {
                        self.timeouts.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("a dispatch invocation ran past its timeout and was killed");
                    }
                }
                continue;
            };
            let failed: Vec<String> =
                response.batch_item_failures.into_iter().map(|f| f.item_identifier).collect();
            let done: Vec<_> = messages
                .iter()
                .enumerate()
                .filter(|(_, m)| !m.message_id().is_some_and(|id| failed.iter().any(|f| f == id)))
                .filter_map(|(i, m)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(m.receipt_handle()?)
                        .build()
                        .ok()
                })
                .collect();
            if done.is_empty() {
                continue;
            }
            if let Err(e) = self
                .sqs
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(done))
                .send()
                .await
            {
                tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(e), "the event source could not delete a batch");
            }
        }
    }
}
