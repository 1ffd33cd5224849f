//! A Lambda function's start on moto: settings from its environment, the configuration from an
//! SSM parameter, the secrets it names from a Secrets Manager secret, and the engine on the
//! table and queue, running a turn end to end (submit, the wake-up on SQS, the dispatcher).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::config::Credentials;
use turnstone_aws::moto as support;
use turnstone_aws::{Deployment, DeploymentError, QueueSettings, Settings, SqsQueue};
use turnstone_engine::protocol::{ClientInput, ClientMessageInput, DraftMessage};
use turnstone_runtime::api::Placement;
use turnstone_runtime::auth::Caller;
use turnstone_runtime::queue::Consumer;

const CONFIG: &str = r#"
[llm.s]
type = "scripted"

[agent.helper]
model = "scripted"
llm = "s"

[auth]
api_keys_env = "TURNSTONE_API_KEYS"
"#;

async fn sdk() -> aws_config::SdkConfig {
    support::config("unused", "unused")
        .loader()
        .credentials_provider(Credentials::new("test", "test", None, None, "moto"))
        .load()
        .await
}

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> =
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    move |name| map.get(name).cloned()
}

#[tokio::test]
async fn a_function_starts_from_ssm_and_secrets_manager_and_runs_a_turn() {
    let sdk = sdk().await;
    let (store, clients) = support::store_and_clients().await;
    let queue_name = support::unique("tq");
    let queue_url =
        SqsQueue::create_queue(&clients.sqs, &queue_name, &QueueSettings::default()).await.unwrap();
    let parameter = format!("/{}/config", support::unique("turnstone"));
    aws_sdk_ssm::Client::new(&sdk)
        .put_parameter()
        .name(&parameter)
        .value(CONFIG)
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .unwrap();
    let secret = aws_sdk_secretsmanager::Client::new(&sdk)
        .create_secret()
        .name(support::unique("turnstone-secrets"))
        .secret_string(r#"{"TURNSTONE_API_KEYS": "alice:k3y-alice"}"#)
        .send()
        .await
        .unwrap();
    let settings = Settings::from_vars(vars(&[
        ("TURNSTONE_TABLE", store.table()),
        ("TURNSTONE_QUEUE_URL", &queue_url),
        ("TURNSTONE_CONFIG_PARAMETER", &parameter),
        ("TURNSTONE_SECRETS_ARN", secret.arn().unwrap()),
    ]))
    .unwrap();
    let settings = Settings { aws: support::config(store.table(), &queue_url), ..settings };
    let deployment = Deployment::open(&settings, &sdk).await.unwrap();
    let app = &deployment.engine.app;
    assert_eq!(app.agent_ids().collect::<Vec<_>>(), ["helper"], "the agents of the SSM configuration");
    let auth = deployment.http.auth.as_ref().expect("[auth] from the configuration");
    let alice = auth.authenticate(Some("Bearer k3y-alice")).unwrap();
    assert!(
        matches!(&alice, Caller::Client { identity, .. } if identity.id.as_deref() == Some("client:alice")),
        "{alice:?}"
    );

    // A turn: the API's submit sends the wake-up to SQS; the dispatcher runs it from there.
    let input = ClientInput::Message(ClientMessageInput {
        agent_id: "helper".into(),
        turn_id: Some("t1".into()),
        message: DraftMessage::user("hello from lambda"),
        stream: None,
        client: None,
    });
    app.submit("s1", input, Placement::Start, &alice).await.unwrap();
    let (_, queue) = support::config(store.table(), &queue_url).connect_with(&clients).await.unwrap();
    let deliveries = queue.receive(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(deliveries.len(), 1, "one wake-up for the submit");
    deployment.engine.dispatcher.run(&deliveries[0].wake_up).await.unwrap();
    queue.ack(&deliveries[0]).await.unwrap();
    let session = app.session("s1").await.unwrap();
    let reply =
        session.tree().active_path().last().unwrap().content.as_ref().map(|c| c.text()).unwrap_or_default();
    assert_eq!(reply, "You said: hello from lambda");
    assert!(queue.receive(10, Duration::from_secs(1)).await.unwrap().is_empty(), "nothing due later");
}

#[tokio::test]
async fn a_function_that_cannot_start_says_why() {
    let missing = Settings::from_vars(vars(&[("TURNSTONE_TABLE", "t")])).err().unwrap();
    assert!(matches!(missing, DeploymentError::MissingSetting("TURNSTONE_QUEUE_URL")), "{missing}");
    // A schedule group without the role to send with is named, not half-used.
    let half =
        vars(&[("TURNSTONE_TABLE", "t"), ("TURNSTONE_QUEUE_URL", "q"), ("TURNSTONE_SCHEDULE_GROUP", "g")]);
    let missing = Settings::from_vars(half).err().unwrap();
    assert!(matches!(missing, DeploymentError::MissingSetting("TURNSTONE_SCHEDULER_ROLE_ARN")), "{missing}");

    let sdk = sdk().await;
    let (store, clients) = support::store_and_clients().await;
    let queue_url = SqsQueue::create_queue(&clients.sqs, &support::unique("tq"), &QueueSettings::default())
        .await
        .unwrap();
    let base = Settings {
        aws: support::config(store.table(), &queue_url),
        config_parameter: Some("/turnstone/none-such".to_owned()),
        config_object: None,
        secrets_arn: None,
        ahp_endpoint: None,
        schedules: None,
    };
    let error = Deployment::open(&base, &sdk).await.err().unwrap().to_string();
    assert!(error.contains("SSM parameter /turnstone/none-such"), "{error}");

    // A secret that is not a JSON object: the error says where, never what.
    let secret = aws_sdk_secretsmanager::Client::new(&sdk)
        .create_secret()
        .name(support::unique("turnstone-bad"))
        .secret_string("TURNSTONE_API_KEYS=alice:hunter2")
        .send()
        .await
        .unwrap();
    let settings =
        Settings { config_parameter: None, secrets_arn: secret.arn().map(str::to_owned), ..base.clone() };
    let error = Deployment::open(&settings, &sdk).await.err().unwrap().to_string();
    assert!(error.contains("not a JSON object of strings"), "{error}");
    assert!(!error.contains("hunter2"), "the secret leaked into the error: {error}");

    // The demo configuration when no parameter is set; a missing table is named.
    let settings = Settings {
        aws: support::config("no-such-table", &queue_url),
        config_parameter: None,
        config_object: None,
        secrets_arn: None,
        ahp_endpoint: None,
        schedules: None,
    };
    let deployment = Deployment::open(&settings, &sdk).await.unwrap();
    assert!(deployment.engine.app.agent_ids().any(|a| a == "demo"));
    let error = deployment.engine.app.session("anything").await.err().unwrap().to_string();
    assert!(error.contains("no-such-table"), "{error}");
}

/// A configuration too large for any SSM parameter (here 40 KB) as a file in a versioned S3
/// bucket: a function pinned to a version reads that one, an unpinned one the latest; a
/// parameter and an object both named, or an object that is not there, are refused, naming it.
#[tokio::test]
async fn the_configuration_is_read_from_a_versioned_s3_object() {
    use turnstone_aws::deployment::ConfigObject;

    let sdk = sdk().await;
    let (store, clients) = support::store_and_clients().await;
    let queue_url = SqsQueue::create_queue(&clients.sqs, &support::unique("tq"), &QueueSettings::default())
        .await
        .unwrap();
    let s3 =
        aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build());
    let bucket = support::unique("config").to_lowercase();
    s3.create_bucket().bucket(&bucket).send().await.unwrap();
    let enabled = aws_sdk_s3::types::VersioningConfiguration::builder()
        .status(aws_sdk_s3::types::BucketVersioningStatus::Enabled)
        .build();
    s3.put_bucket_versioning().bucket(&bucket).versioning_configuration(enabled).send().await.unwrap();
    // 40 KB of comments: far past SSM's 8 KB.
    let padding: String = (0..500).map(|i| format!("# line {i:04} of a long configuration file\n")).collect();
    let put = |agent: &'static str| {
        // Without [auth], which would need its secret.
        let config = CONFIG.replace("[auth]\napi_keys_env = \"TURNSTONE_API_KEYS\"\n", "");
        let body = format!("{padding}{}", config.replace("helper", agent));
        s3.put_object().bucket(&bucket).key("turnstone.toml").body(body.into_bytes().into()).send()
    };
    let first = put("helper").await.unwrap().version_id.expect("a versioned bucket gives versions");
    put("newer").await.unwrap();
    let object = |version: Option<&str>| ConfigObject {
        bucket: bucket.clone(),
        key: "turnstone.toml".to_owned(),
        version: version.map(str::to_owned),
    };
    let settings = |object: ConfigObject| Settings {
        aws: support::config(store.table(), &queue_url),
        config_parameter: None,
        config_object: Some(object),
        secrets_arn: None,
        ahp_endpoint: None,
        schedules: None,
    };
    let agents =
        |deployment: &Deployment| deployment.engine.app.agent_ids().map(str::to_owned).collect::<Vec<_>>();
    let pinned = Deployment::open(&settings(object(Some(&first))), &sdk).await.unwrap();
    assert_eq!(agents(&pinned), ["helper"], "the pinned version");
    let latest = Deployment::open(&settings(object(None)), &sdk).await.unwrap();
    assert_eq!(agents(&latest), ["newer"], "the latest version");

    let missing = ConfigObject { key: "none-such.toml".to_owned(), ..object(None) };
    let error = Deployment::open(&settings(missing), &sdk).await.err().unwrap().to_string();
    assert!(error.contains(&format!("s3://{bucket}/none-such.toml")), "{error}");
    let both = Settings { config_parameter: Some("/turnstone/x".to_owned()), ..settings(object(None)) };
    assert!(matches!(Deployment::open(&both, &sdk).await, Err(DeploymentError::TwoConfigurations)));
    let both = Settings::from_vars(vars(&[
        ("TURNSTONE_TABLE", "t"),
        ("TURNSTONE_QUEUE_URL", "q"),
        ("TURNSTONE_CONFIG_PARAMETER", "/p"),
        ("TURNSTONE_CONFIG_BUCKET", "b"),
        ("TURNSTONE_CONFIG_KEY", "k"),
    ]));
    assert!(matches!(both, Err(DeploymentError::TwoConfigurations)), "{both:?}");
}
