//! The IAM gate: a loopback HTTP proxy in front of moto through which every function's SDK
//! calls go. It reads who signed a request (the access key of SigV4's `Credential=`), which
//! IAM actions on which resources AWS authorizes the operation by, and evaluates them against
//! that principal's statements from the template ([`super::policy`]). A refused call is
//! answered as AWS answers it (400, `AccessDeniedException`), so the function's code meets
//! the real error; an allowed one goes to moto unchanged (its signature still verifies, moto
//! checking it with IAM enforcement on). Every call is recorded.
//!
//! Why not moto's own policy evaluation: moto 5 checks DynamoDB, SSM and Secrets Manager
//! actions against the resource `*` (only SQS, IAM and STS name a resource:
//! `moto/core/responses.py`, `call_action`), so a statement scoped to a table never matches
//! there, and it authorizes an operation by its wire name (`dynamodb:TransactWriteItems`,
//! `sqs:SendMessageBatch`), which are not the actions AWS checks.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Request as HttpRequest, Response, StatusCode};
use serde_json::{Value as Json, json};

use super::policy::{self, Decision, Request, Statement};

/// Who signs with one access key.
#[derive(Debug, Clone)]
pub struct Principal {
    /// The function (its logical id in the template).
    pub function: String,
    /// The stand-in stack it belongs to (a test host's stage).
    pub stage: String,
    /// Its IAM user's ARN, for the refusal's message.
    pub arn: String,
    pub statements: Vec<Statement>,
}

/// One SDK call through the gate.
#[derive(Debug, Clone)]
pub struct Call {
    pub function: String,
    pub stage: String,
    /// `service:Operation` as sent (`dynamodb:TransactWriteItems`).
    pub operation: String,
    /// What IAM was asked for it.
    pub requests: Vec<Request>,
    /// Why it was refused; `None`: it went to moto.
    pub refused: Option<String>,
}

#[derive(Default)]
struct Ledger {
    principals: BTreeMap<String, Principal>,
    /// Secret name -> ARN (a secret may be named either way).
    secrets: BTreeMap<String, String>,
    /// WebSocket API stage -> its API's id and the URL of its Management API.
    management: BTreeMap<String, (String, String)>,
    /// Parameter or secret ARN -> the customer managed KMS key it is encrypted under.
    keys: BTreeMap<String, String>,
    calls: Vec<Call>,
    /// The schedules created through the gate (moto stored them too): their group, name and
    /// `CreateSchedule` body, in order.
    schedules: Vec<(String, String, Json)>,
}

/// The gate's shared state.
pub struct Gate {
    url: String,
    moto: String,
    account: String,
    region: String,
    ledger: Mutex<Ledger>,
    http: reqwest::Client,
}

impl Gate {
    /// Starts a gate in front of `moto` on its own thread and runtime (it outlives any one
    /// test's runtime).
    pub fn start(moto: &str, account: &str, region: &str) -> Arc<Gate> {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the IAM gate");
        let url = format!("http://{}", listener.local_addr().expect("the gate's address"));
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client");
        let gate = Arc::new(Gate {
            url,
            moto: moto.trim_end_matches('/').to_owned(),
            account: account.to_owned(),
            region: region.to_owned(),
            ledger: Mutex::new(Ledger::default()),
            http,
        });
        let serving = Arc::clone(&gate);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the gate's runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("the gate's listener");
                let app = axum::Router::new().fallback(forward).with_state(serving);
                axum::serve(listener, app).await.expect("the IAM gate serves");
            });
        });
        gate
    }

    /// Where the functions send their SDK calls.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Signs as `principal` from now on.
    pub fn register(&self, access_key: &str, principal: Principal) {
        self.ledger().principals.insert(access_key.to_owned(), principal);
    }

    /// Secret `name`'s ARN, so a call naming the secret by name is authorized on its ARN.
    pub fn register_secret(&self, name: &str, arn: &str) {
        self.ledger().secrets.insert(name.to_owned(), arn.to_owned());
    }

    /// Stage `stage` of WebSocket API `api_id` answers its Management API at `url`: calls to
    /// `/{stage}/@connections/...` (service `execute-api`) go there once authorized.
    pub fn register_management(&self, stage: &str, api_id: &str, url: &str) {
        self.ledger()
            .management
            .insert(stage.to_owned(), (api_id.to_owned(), url.trim_end_matches('/').to_owned()));
    }

    /// The parameter or secret `arn` is encrypted under the customer managed key `key`: reading
    /// it also needs `kms:Decrypt` on the key, through that service (AWS Systems Manager user
    /// guide, "How Parameter Store uses AWS KMS"; Secrets Manager user guide, "Secret
    /// encryption and decryption").
    pub fn register_key(&self, arn: &str, key: &str) {
        self.ledger().keys.insert(arn.to_owned(), key.to_owned());
    }

    /// With the read of `arn` through `service`, the decrypt its key needs, if it has one.
    fn with_decrypt(&self, service: &str, arn: String, read: Request) -> Vec<Request> {
        let key = self.ledger().keys.get(&arn).cloned();
        let mut requests = vec![read];
        if let Some(key) = key {
            let mut decrypt = Request::new("kms:Decrypt", key);
            let via = format!("{service}.{}.amazonaws.com", self.region);
            decrypt.context.insert("kms:ViaService".to_owned(), vec![via]);
            requests.push(decrypt);
        }
        requests
    }

    /// The schedules created in `group` through the gate: (name, `CreateSchedule` body). Read
    /// here, not from moto, whose reads of a schedule group (a query string) fail its own
    /// signature check with IAM enforcement on.
    pub fn schedules(&self, group: &str) -> Vec<(String, Json)> {
        let ledger = self.ledger();
        ledger.schedules.iter().filter(|(g, ..)| g == group).map(|(_, n, b)| (n.clone(), b.clone())).collect()
    }

    /// The calls the functions of `stage` made, in order.
    pub fn calls(&self, stage: &str) -> Vec<Call> {
        self.ledger().calls.iter().filter(|c| c.stage == stage).cloned().collect()
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn table_arn(&self, table: &str) -> String {
        format!("arn:aws:dynamodb:{}:{}:table/{table}", self.region, self.account)
    }
}

/// The access key a SigV4 `Authorization` header names, and the service of its scope.
fn signer(headers: &HeaderMap) -> Option<(String, String)> {
    let auth = headers.get("authorization")?.to_str().ok()?;
    let scope = auth.split("Credential=").nth(1)?.split(',').next()?;
    let mut parts = scope.split('/');
    let key = parts.next()?.to_owned();
    let service = parts.nth(2)?.to_owned();
    Some((key, service))
}

async fn forward(State(gate): State<Arc<Gate>>, request: HttpRequest<Body>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 64 << 20).await else {
        return plain(StatusCode::PAYLOAD_TOO_LARGE, "the gate takes bodies up to 64 MiB");
    };
    let target =
        parts.headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let Some((key, service)) = signer(&parts.headers) else {
        return plain(StatusCode::FORBIDDEN, "the gate takes SigV4-signed requests only");
    };
    let principal = gate.ledger().principals.get(&key).cloned();
    let Some(principal) = principal else {
        // No principal of the topology signs with this key: AWS's answer to an unknown key.
        return aws_error(
            &service,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        );
    };
    // Where an allowed call goes: moto, or a WebSocket API's Management API.
    let (operation, requests, upstream) = if service == "execute-api" {
        management(&gate, &parts)
    } else if service == "s3" {
        let (operation, requests) = s3(&parts);
        (operation, requests, gate.moto.clone())
    } else if service == "scheduler" {
        let path = parts.uri.path();
        match super::scheduler::authorization(&gate.region, &gate.account, parts.method.as_str(), path, &body)
        {
            Ok((operation, requests)) => (operation, Ok(requests), gate.moto.clone()),
            // Refused by the service itself (REST-JSON: the error type in a header).
            Err(super::scheduler::Invalid(message)) => {
                gate.ledger().calls.push(Call {
                    function: principal.function.clone(),
                    stage: principal.stage.clone(),
                    operation: format!("scheduler:{} {path}", parts.method),
                    requests: Vec::new(),
                    refused: Some(format!("ValidationException: {message}")),
                });
                let mut response = plain(StatusCode::BAD_REQUEST, &json!({ "message": message }).to_string());
                response
                    .headers_mut()
                    .insert("x-amzn-errortype", HeaderValue::from_static("ValidationException"));
                return response;
            }
        }
    } else {
        let operation = target.rsplit('.').next().unwrap_or_default().to_owned();
        (operation.clone(), authorization_requests(&gate, &service, &operation, &body), gate.moto.clone())
    };
    let requests = requests.unwrap_or_else(|unmodelled| {
        vec![Request::new(format!("{service}:{operation}"), format!("(not modelled: {unmodelled})"))]
    });
    let refused = refusal(&principal, &service, &operation, &requests);
    gate.ledger().calls.push(Call {
        function: principal.function.clone(),
        stage: principal.stage.clone(),
        operation: format!("{service}:{operation}"),
        requests,
        refused: refused.clone(),
    });
    if let Some(message) = refused {
        tracing::warn!(function = %principal.function, %message, "IAM gate refused a call");
        if matches!(service.as_str(), "execute-api" | "scheduler") {
            // A REST API's refusal (the Management API's, Scheduler's): 403, the error type in
            // its header.
            let mut response = plain(StatusCode::FORBIDDEN, &json!({ "message": message }).to_string());
            response
                .headers_mut()
                .insert("x-amzn-errortype", HeaderValue::from_static("AccessDeniedException"));
            return response;
        }
        if service == "s3" {
            // S3's refusal: 403 and an XML error (Amazon S3 API reference, "Error responses").
            let body = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code><Message>{message}</Message></Error>"
            );
            let mut response = plain(StatusCode::FORBIDDEN, &body);
            response.headers_mut().insert("content-type", HeaderValue::from_static("application/xml"));
            return response;
        }
        let code = if service == "sqs" { "AccessDenied" } else { "AccessDeniedException" };
        return aws_error(&service, code, &message);
    }
    let uri = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut outgoing = gate.http.request(parts.method.clone(), format!("{upstream}{uri}"));
    for (name, value) in &parts.headers {
        // The Host header stays as signed: moto verifies the signature over it.
        if !matches!(name.as_str(), "connection" | "transfer-encoding" | "keep-alive") {
            outgoing = outgoing.header(name, value);
        }
    }
    let created = (service == "scheduler" && operation == "CreateSchedule").then(|| {
        let name = parts.uri.path().rsplit('/').next().unwrap_or_default().to_owned();
        let input: Json = serde_json::from_slice(&body).unwrap_or_default();
        let group = input.get("GroupName").and_then(Json::as_str).unwrap_or("default").to_owned();
        (group, name, input)
    });
    match outgoing.body(body).send().await {
        Ok(answer) => {
            let status = answer.status();
            if let Some(created) = created.filter(|_| status.is_success()) {
                gate.ledger().schedules.push(created);
            }
            let headers = answer.headers().clone();
            let bytes = answer.bytes().await.unwrap_or_default();
            let mut response = Response::new(Body::from(bytes));
            *response.status_mut() = status;
            for (name, value) in &headers {
                if !matches!(name.as_str(), "connection" | "transfer-encoding" | "content-length") {
                    response.headers_mut().append(name, value.clone());
                }
            }
            response
        }
        Err(e) => plain(StatusCode::BAD_GATEWAY, &format!("{upstream} did not answer: {e}")),
    }
}

/// Why IAM refuses `requests` for `principal`, in IAM's words; `None`: all are allowed.
fn refusal(principal: &Principal, service: &str, operation: &str, requests: &[Request]) -> Option<String> {
    if requests.is_empty() {
        return Some(format!("the gate found nothing to authorize in {service}:{operation}"));
    }
    requests.iter().find_map(|request| {
        if request.resource.starts_with("(not modelled") {
            return Some(format!(
                "{service}:{operation} is not modelled by the topology's IAM gate {}",
                request.resource
            ));
        }
        let how = match policy::evaluate(&principal.statements, request) {
            Decision::Allowed(_) => return None,
            Decision::NotAllowed => "because no identity-based policy allows",
            Decision::Denied(_) => "with an explicit deny in an identity-based policy for",
        };
        // IAM's own wording (IAM User Guide, "Troubleshoot access denied error messages").
        Some(format!(
            "User: {} is not authorized to perform: {} on resource: {} {how} the {} action",
            principal.arn, request.action, request.resource, request.action
        ))
    })
}

fn plain(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(message.to_owned()));
    *response.status_mut() = status;
    response
}

/// An error as the service's JSON protocol writes it (`__type` names the code; SQS's JSON
/// protocol also names it in `x-amzn-query-error`).
fn aws_error(service: &str, code: &str, message: &str) -> Response<Body> {
    let body = json!({ "__type": format!("com.amazon.coral.service#{code}"), "message": message, "Message": message });
    let mut response = Response::new(Body::from(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::BAD_REQUEST;
    let content_type = if matches!(service, "dynamodb" | "sqs") {
        "application/x-amz-json-1.0"
    } else {
        "application/x-amz-json-1.1"
    };
    response.headers_mut().insert("content-type", HeaderValue::from_static(content_type));
    if service == "sqs"
        && let Ok(value) = HeaderValue::from_str(&format!("{code};Sender"))
    {
        response.headers_mut().insert("x-amzn-query-error", value);
    }
    response
}

/// The IAM requests AWS authorizes `service`'s `operation` by; `Err`: the gate does not know.
fn authorization_requests(
    gate: &Gate,
    service: &str,
    operation: &str,
    body: &[u8],
) -> Result<Vec<Request>, String> {
    let input: Json = serde_json::from_slice(body).map_err(|_| "a body that is not JSON".to_owned())?;
    match service {
        "dynamodb" => dynamodb(gate, operation, &input),
        "sqs" => sqs(gate, operation, &input),
        "ssm" => {
            let arn = |name: &str| {
                format!(
                    "arn:aws:ssm:{}:{}:parameter/{}",
                    gate.region,
                    gate.account,
                    name.trim_start_matches('/')
                )
            };
            match operation {
                "GetParameter" => {
                    let arn = arn(str_field(&input, "Name")?);
                    let read = Request::new("ssm:GetParameter", arn.clone());
                    Ok(gate.with_decrypt("ssm", arn, read))
                }
                "PutParameter" | "DeleteParameter" => {
                    let name = str_field(&input, "Name")?;
                    Ok(vec![Request::new(format!("ssm:{operation}"), arn(name))])
                }
                "GetParameters" => {
                    let names =
                        input.get("Names").and_then(Json::as_array).ok_or("GetParameters without Names")?;
                    Ok(names
                        .iter()
                        .filter_map(Json::as_str)
                        .map(|n| Request::new("ssm:GetParameters", arn(n)))
                        .collect())
                }
                other => Err(format!("ssm:{other}")),
            }
        }
        "secretsmanager" => match operation {
            "GetSecretValue" | "DescribeSecret" => {
                let id = str_field(&input, "SecretId")?;
                let arn = if id.starts_with("arn:") {
                    id.to_owned()
                } else {
                    gate.ledger()
                        .secrets
                        .get(id)
                        .cloned()
                        .ok_or_else(|| format!("secret {id} is not registered"))?
                };
                let read = Request::new(format!("secretsmanager:{operation}"), arn.clone());
                Ok(match operation {
                    "GetSecretValue" => gate.with_decrypt("secretsmanager", arn, read),
                    _ => vec![read],
                })
            }
            other => Err(format!("secretsmanager:{other}")),
        },
        other => Err(format!("service {other}")),
    }
}

/// S3's REST API, path-style (`/{bucket}/{key}`, as the functions address a stand-in): reading
/// an object is `s3:GetObject` on `arn:aws:s3:::{bucket}/{key}`, and reading one version of it
/// (`versionId`) `s3:GetObjectVersion` (Amazon S3 user guide, "Policy actions for Amazon S3").
/// The functions only read.
fn s3(parts: &axum::http::request::Parts) -> (String, Result<Vec<Request>, String>) {
    let path = parts.uri.path().trim_start_matches('/');
    let versioned = parts.uri.query().is_some_and(|q| q.split('&').any(|p| p.starts_with("versionId=")));
    match (parts.method.as_str(), path.split_once('/')) {
        ("GET", Some((bucket, key))) if !key.is_empty() => {
            let action = if versioned { "s3:GetObjectVersion" } else { "s3:GetObject" };
            let operation = if versioned { "GetObjectVersion" } else { "GetObject" };
            (operation.to_owned(), Ok(vec![Request::new(action, format!("arn:aws:s3:::{bucket}/{key}"))]))
        }
        (method, _) => (format!("{method} /{path}"), Err(format!("s3 {method} /{path}"))),
    }
}

/// API Gateway's Management API: `POST|GET|DELETE /{stage}/@connections/{id}` is
/// `execute-api:ManageConnections` on `arn:aws:execute-api:{region}:{account}:{api
/// id}/{stage}/{method}/@connections/{id}` (API Gateway developer guide, "Control access to
/// a WebSocket API with IAM authorization": the `@connections` resource). The operation, the
/// requests, and the Management API's URL.
fn management(
    gate: &Gate,
    parts: &axum::http::request::Parts,
) -> (String, Result<Vec<Request>, String>, String) {
    let path = parts.uri.path();
    let method = parts.method.as_str();
    let operation = match method {
        "POST" => "PostToConnection",
        "GET" => "GetConnection",
        "DELETE" => "DeleteConnection",
        other => other,
    }
    .to_owned();
    let mut steps = path.trim_start_matches('/').splitn(3, '/');
    let (Some(stage), Some("@connections"), Some(id)) = (steps.next(), steps.next(), steps.next()) else {
        return (operation, Err(format!("execute-api {method} {path}")), String::new());
    };
    let Some((api_id, url)) = gate.ledger().management.get(stage).cloned() else {
        return (operation, Err(format!("no WebSocket API has stage {stage}")), String::new());
    };
    let resource = format!(
        "arn:aws:execute-api:{}:{}:{api_id}/{stage}/{method}/@connections/{id}",
        gate.region, gate.account
    );
    (operation, Ok(vec![Request::new("execute-api:ManageConnections", resource)]), url)
}

fn str_field<'a>(input: &'a Json, name: &str) -> Result<&'a str, String> {
    input.get(name).and_then(Json::as_str).ok_or_else(|| format!("no {name}"))
}

/// DynamoDB: each operation is its own action on the table (or the index it reads), but a
/// transaction is authorized item by item, by the action of each item's kind (DynamoDB
/// developer guide, "Using IAM with DynamoDB transactions"); `dynamodb:Attributes` and
/// `dynamodb:ReturnValues` are the condition keys a write carries ("Using IAM policy
/// conditions for fine-grained access control").
fn dynamodb(gate: &Gate, operation: &str, input: &Json) -> Result<Vec<Request>, String> {
    let on_table = |action: &str, item: &Json| -> Result<Request, String> {
        let table = str_field(item, "TableName")?;
        let resource = match item.get("IndexName").and_then(Json::as_str) {
            Some(index) => format!("{}/index/{index}", gate.table_arn(table)),
            None => gate.table_arn(table),
        };
        let mut request = Request::new(format!("dynamodb:{action}"), resource);
        if let Some(attributes) = attributes(item) {
            request.context.insert("dynamodb:Attributes".to_owned(), attributes);
        }
        if let Some(returns) = item.get("ReturnValues").and_then(Json::as_str) {
            request.context.insert("dynamodb:ReturnValues".to_owned(), vec![returns.to_owned()]);
        }
        Ok(request)
    };
    match operation {
        "TransactWriteItems" | "TransactGetItems" => {
            let items = input.get("TransactItems").and_then(Json::as_array).ok_or("no TransactItems")?;
            items
                .iter()
                .map(|item| {
                    let (kind, body) =
                        item.as_object().and_then(|o| o.iter().next()).ok_or("an empty transaction item")?;
                    let action = match kind.as_str() {
                        "Put" => "PutItem",
                        "Update" => "UpdateItem",
                        "Delete" => "DeleteItem",
                        "ConditionCheck" => "ConditionCheckItem",
                        "Get" => "GetItem",
                        other => return Err(format!("a transaction item of kind {other}")),
                    };
                    on_table(action, body)
                })
                .collect()
        }
        "BatchGetItem" | "BatchWriteItem" => {
            let tables = input.get("RequestItems").and_then(Json::as_object).ok_or("no RequestItems")?;
            Ok(tables
                .keys()
                .map(|t| Request::new(format!("dynamodb:{operation}"), gate.table_arn(t)))
                .collect())
        }
        "GetItem" | "PutItem" | "UpdateItem" | "DeleteItem" | "Query" | "Scan" | "DescribeTable"
        | "CreateTable" | "DeleteTable" | "UpdateTimeToLive" | "DescribeTimeToLive" => {
            Ok(vec![on_table(operation, input)?])
        }
        other => Err(format!("dynamodb:{other}")),
    }
}

/// The top-level attribute names a write names: its key or item, and every name in its
/// expressions (a `#placeholder` by its value). `None` for a request that names none.
fn attributes(item: &Json) -> Option<Vec<String>> {
    if !["Key", "Item", "UpdateExpression"].iter().any(|k| item.get(k).is_some()) {
        return None;
    }
    let mut names: Vec<String> = Vec::new();
    for field in ["Key", "Item"] {
        names.extend(item.get(field).and_then(Json::as_object).into_iter().flat_map(|o| o.keys().cloned()));
    }
    let placeholders = item.get("ExpressionAttributeNames").and_then(Json::as_object);
    for field in ["UpdateExpression", "ConditionExpression", "ProjectionExpression"] {
        let Some(expression) = item.get(field).and_then(Json::as_str) else { continue };
        for name in expression_names(expression) {
            let name = match name.strip_prefix('#') {
                Some(_) => match placeholders.and_then(|p| p.get(&name)).and_then(Json::as_str) {
                    Some(value) => value.to_owned(),
                    None => name,
                },
                None => name,
            };
            names.push(name);
        }
    }
    names.sort();
    names.dedup();
    Some(names)
}

/// The top-level attribute names in an expression: identifiers that are not keywords,
/// functions, values (`:v`) or path steps after a `.`.
fn expression_names(expression: &str) -> Vec<String> {
    const KEYWORDS: [&str; 9] = ["SET", "REMOVE", "ADD", "DELETE", "AND", "OR", "NOT", "BETWEEN", "IN"];
    let chars: Vec<char> = expression.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' || c == '#' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '#' || chars[i] == ':')
            {
                i += 1;
            }
            let token: String = chars[start..i].iter().collect();
            let before = chars[..start].iter().rev().find(|c| !c.is_whitespace());
            let after = chars[i..].iter().find(|c| !c.is_whitespace());
            let is_name = !token.starts_with(':')
                && !token.chars().all(|c| c.is_ascii_digit())
                && before != Some(&'.')
                && after != Some(&'(')
                && !KEYWORDS.iter().any(|k| k.eq_ignore_ascii_case(&token));
            if is_name {
                out.push(token);
            }
        } else {
            i += 1;
        }
    }
    out
}

/// SQS: an operation is its own action on the queue, but the batch operations are authorized
/// as their single forms (Amazon SQS developer guide, "Amazon SQS API permissions: Actions and
/// resource reference": SendMessageBatch, DeleteMessageBatch and ChangeMessageVisibilityBatch
/// take the permission of SendMessage, DeleteMessage and ChangeMessageVisibility).
fn sqs(gate: &Gate, operation: &str, input: &Json) -> Result<Vec<Request>, String> {
    let action = match operation {
        "SendMessageBatch" => "SendMessage",
        "DeleteMessageBatch" => "DeleteMessage",
        "ChangeMessageVisibilityBatch" => "ChangeMessageVisibility",
        "SendMessage"
        | "DeleteMessage"
        | "ChangeMessageVisibility"
        | "ReceiveMessage"
        | "GetQueueAttributes"
        | "GetQueueUrl"
        | "CreateQueue"
        | "SetQueueAttributes"
        | "PurgeQueue" => operation,
        other => return Err(format!("sqs:{other}")),
    };
    let arn =
        match (input.get("QueueUrl").and_then(Json::as_str), input.get("QueueName").and_then(Json::as_str)) {
            (Some(url), _) => {
                let mut path = url.trim_end_matches('/').rsplit('/');
                let (Some(name), Some(account)) = (path.next(), path.next()) else {
                    return Err(format!("a QueueUrl without /account/name: {url}"));
                };
                format!("arn:aws:sqs:{}:{account}:{name}", gate.region)
            }
            (None, Some(name)) => format!("arn:aws:sqs:{}:{}:{name}", gate.region, gate.account),
            (None, None) => return Err(format!("sqs:{operation} names no queue")),
        };
    Ok(vec![Request::new(format!("sqs:{action}"), arn)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expression_names_are_the_top_level_attributes() {
        assert_eq!(expression_names("REMOVE #s, #w, #a"), ["#s", "#w", "#a"]);
        assert_eq!(expression_names("attribute_exists(#pk) AND size(tags) > :n"), ["#pk", "tags"]);
        assert_eq!(expression_names("SET head.seq = :s, counts[0] = :c"), ["head", "counts"]);
    }
}
