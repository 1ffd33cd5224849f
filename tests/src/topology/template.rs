//! `infra/template.yaml` read as CloudFormation reads it, as far as the topology needs: each
//! function's timeout, its event sources and the IAM statements of its role, with the
//! intrinsic functions (`Ref`, `Fn::GetAtt`, `Fn::Sub`, `Fn::If` and the conditions) resolved
//! to the physical names of the test's stand-in stack.
//!
//! Anything the resolver does not know fails loudly, naming where it is: a policy this code
//! cannot read must not become a policy that allows nothing (or everything) by accident.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value as Json};
use serde_norway::Value as Yaml;

use super::policy::Statement;

/// The template as written.
#[derive(Debug, Clone)]
pub struct Template {
    root: Yaml,
}

/// What a name in the template stands for in the stand-in stack.
#[derive(Debug, Clone, Default)]
pub struct Physical {
    /// What `Ref` gives.
    pub reference: String,
    /// What `Fn::GetAtt` gives, by attribute (`Arn`, `QueueName`, ...).
    pub attributes: BTreeMap<String, String>,
}

/// The stand-in stack's names: its account and region, the template's parameters, and the
/// physical resources the policies name.
#[derive(Debug, Clone)]
pub struct Stack {
    pub account: String,
    pub region: String,
    pub parameters: BTreeMap<String, String>,
    pub resources: BTreeMap<String, Physical>,
}

/// One function of the template, resolved.
#[derive(Debug, Clone)]
pub struct Function {
    /// Its logical id (`ApiFunction`).
    pub logical_id: String,
    /// `Timeout` (the function's own, else the `Globals`'): the deadline of each invocation.
    pub timeout: Duration,
    /// Every statement of its execution role: its `Policies`, and what SAM adds for its event
    /// sources.
    pub statements: Vec<Statement>,
    /// The documents as the role holds them (one per `Policies` entry, and SAM's), for IAM.
    pub documents: Vec<(String, Json)>,
    /// Its `HttpApi` events: the HTTP API's routes to it.
    pub routes: Vec<Route>,
    /// Its `FunctionUrlConfig`, if it has a Function URL.
    pub url: Option<FunctionUrl>,
}

/// One route of the HTTP API (an `HttpApi` event): `ANY /{proxy+}`, `GET /`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// `ANY`, `GET`, ...
    pub method: String,
    /// The path as the template writes it; `{name+}` is a greedy path variable.
    pub path: String,
}

impl Route {
    /// The route key API Gateway names the route by (`ANY /{proxy+}`).
    pub fn key(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// A function's URL (`FunctionUrlConfig`).
#[derive(Debug, Clone)]
pub struct FunctionUrl {
    /// `BUFFERED` or `RESPONSE_STREAM`.
    pub invoke_mode: String,
    /// `NONE` or `AWS_IAM`.
    pub auth_type: String,
}

/// Why the template cannot be read as the topology needs it.
#[derive(Debug, thiserror::Error)]
#[error("infra/template.yaml, {at}: {message}")]
pub struct TemplateError {
    pub at: String,
    pub message: String,
}

fn error(at: &str, message: impl Into<String>) -> TemplateError {
    TemplateError { at: at.to_owned(), message: message.into() }
}

/// The path of the repository's template.
pub fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/template.yaml")
}

/// What SAM attaches to the role of a function with an `SQS` event: the AWS managed policy
/// `AWSLambdaSQSQueueExecutionRole` (AWS SAM developer guide, "SQS" event source type: "AWS SAM
/// ... adds the AWSLambdaSQSQueueExecutionRole managed policy"; the policy's document, AWS
/// managed policy reference). Lambda's event source mapping polls with that role.
fn sqs_queue_execution_role() -> Json {
    serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes",
                           "logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": "*"
            }
        ]
    })
}

impl Template {
    /// The repository's `infra/template.yaml`.
    pub fn load() -> Result<Template, TemplateError> {
        let path = path();
        let text =
            std::fs::read_to_string(&path).map_err(|e| error(&path.display().to_string(), e.to_string()))?;
        Template::parse(&text)
    }

    /// A template from its text.
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let root: Yaml = serde_norway::from_str(text).map_err(|e| error("(parse)", e.to_string()))?;
        Ok(Template { root })
    }

    /// Entry `name` of top-level section `section` (`Resources`, `Parameters`, `Conditions`).
    fn entry(&self, section: &str, name: &str) -> Option<&Yaml> {
        self.root.get(section)?.get(name)
    }

    fn resource_mut(&mut self, logical_id: &str) -> Option<&mut Yaml> {
        self.root.get_mut("Resources")?.get_mut(logical_id)
    }

    /// A copy without action `action` in the statement `sid` of function `function`'s
    /// `Policies` (a test of what that action is for).
    pub fn without_action(&self, function: &str, sid: &str, action: &str) -> Result<Template, TemplateError> {
        let mut copy = self.clone();
        let at = format!("{function}.Policies.{sid}");
        let statement = copy
            .policies_mut(function)?
            .iter_mut()
            .filter_map(|policy| policy.get_mut("Statement")?.as_sequence_mut())
            .flatten()
            .find(|s| s.get("Sid").and_then(Yaml::as_str) == Some(sid))
            .ok_or_else(|| error(&at, "no such statement"))?;
        let actions = statement.get_mut("Action").ok_or_else(|| error(&at, "no Action"))?;
        match actions {
            Yaml::Sequence(list) => {
                let before = list.len();
                list.retain(|a| a.as_str() != Some(action));
                if list.len() == before {
                    return Err(error(&at, format!("{action} is not one of its actions")));
                }
            }
            Yaml::String(only) if only == action => {
                return Err(error(&at, format!("{action} is its only action: remove the statement")));
            }
            _ => return Err(error(&at, format!("{action} is not one of its actions"))),
        }
        Ok(copy)
    }

    /// A copy without the statement `sid` of function `function`'s `Policies`.
    pub fn without_statement(&self, function: &str, sid: &str) -> Result<Template, TemplateError> {
        let mut copy = self.clone();
        let mut found = false;
        for policy in copy.policies_mut(function)? {
            if let Some(statements) = policy.get_mut("Statement").and_then(Yaml::as_sequence_mut) {
                let before = statements.len();
                statements.retain(|s| s.get("Sid").and_then(Yaml::as_str) != Some(sid));
                found |= statements.len() != before;
            }
        }
        if !found {
            return Err(error(&format!("{function}.Policies.{sid}"), "no such statement"));
        }
        Ok(copy)
    }

    /// A copy without statement `index` (from 0) of managed policy resource `policy`.
    pub fn without_statement_of_policy(&self, policy: &str, index: usize) -> Result<Template, TemplateError> {
        let mut copy = self.clone();
        let at = format!("{policy}.Properties.PolicyDocument.Statement");
        let statements = copy
            .resource_mut(policy)
            .and_then(|r| r.get_mut("Properties"))
            .and_then(|p| p.get_mut("PolicyDocument"))
            .and_then(|d| d.get_mut("Statement"))
            .and_then(Yaml::as_sequence_mut)
            .ok_or_else(|| error(&at, "no statement list"))?;
        if index >= statements.len() {
            return Err(error(&at, format!("no statement {index} (it has {})", statements.len())));
        }
        statements.remove(index);
        Ok(copy)
    }

    /// A copy without the `Policies` entry of `function` that refers to resource `policy`
    /// (a managed policy such as `ConfigReadPolicy`).
    pub fn without_policy(&self, function: &str, policy: &str) -> Result<Template, TemplateError> {
        let mut copy = self.clone();
        let policies = copy.policies_mut(function)?;
        let before = policies.len();
        policies.retain(|p| !mentions_ref(p, policy));
        if policies.len() == before {
            return Err(error(&format!("{function}.Policies"), format!("no entry refers to {policy}")));
        }
        Ok(copy)
    }

    fn policies_mut(&mut self, function: &str) -> Result<&mut Vec<Yaml>, TemplateError> {
        self.resource_mut(function)
            .and_then(|r| r.get_mut("Properties"))
            .and_then(|p| p.get_mut("Policies"))
            .and_then(Yaml::as_sequence_mut)
            .ok_or_else(|| error(function, "no Properties.Policies list"))
    }

    /// The `VisibilityTimeout` of queue resource `queue`.
    pub fn visibility_timeout(&self, queue: &str) -> Result<Duration, TemplateError> {
        self.entry("Resources", queue)
            .and_then(|q| q.get("Properties"))
            .and_then(|p| p.get("VisibilityTimeout"))
            .and_then(Yaml::as_u64)
            .map(Duration::from_secs)
            .ok_or_else(|| error(&format!("{queue}.Properties.VisibilityTimeout"), "not a number"))
    }

    /// The `RedrivePolicy.maxReceiveCount` of queue resource `queue`.
    pub fn max_receive_count(&self, queue: &str) -> Result<u32, TemplateError> {
        self.entry("Resources", queue)
            .and_then(|q| q.get("Properties"))
            .and_then(|p| p.get("RedrivePolicy"))
            .and_then(|r| r.get("maxReceiveCount"))
            .and_then(Yaml::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                error(&format!("{queue}.Properties.RedrivePolicy.maxReceiveCount"), "not a number")
            })
    }

    /// The statements of the inline `Policies` of `AWS::IAM::Role` resource `role`, resolved
    /// against `stack`.
    pub fn role_statements(&self, role: &str, stack: &Stack) -> Result<Vec<Statement>, TemplateError> {
        let resolver = Resolver { template: self, stack };
        let policies = self
            .entry("Resources", role)
            .filter(|r| r.get("Type").and_then(Yaml::as_str) == Some("AWS::IAM::Role"))
            .and_then(|r| r.get("Properties"))
            .and_then(|p| p.get("Policies"))
            .and_then(Yaml::as_sequence)
            .ok_or_else(|| error(role, "no AWS::IAM::Role with Properties.Policies"))?;
        let mut statements = Vec::new();
        for (i, policy) in policies.iter().enumerate() {
            let at = format!("{role}.Policies[{i}].PolicyDocument");
            let document = policy.get("PolicyDocument").ok_or_else(|| error(&at, "missing"))?;
            let document =
                resolver.resolve(document, &at)?.ok_or_else(|| error(&at, "resolves to nothing"))?;
            statements.extend(Statement::of_document(&document).map_err(|e| error(&at, e))?);
        }
        Ok(statements)
    }

    /// Every `AWS::Serverless::Function`, resolved against `stack`.
    pub fn functions(&self, stack: &Stack) -> Result<Vec<Function>, TemplateError> {
        let resolver = Resolver { template: self, stack };
        let resources = self
            .root
            .get("Resources")
            .and_then(Yaml::as_mapping)
            .ok_or_else(|| error("Resources", "missing"))?;
        let global_timeout =
            self.root.get("Globals").and_then(|g| g.get("Function")).and_then(|f| f.get("Timeout"));
        let mut functions = Vec::new();
        for (id, resource) in resources {
            let Some(id) = id.as_str() else { continue };
            if resource.get("Type").and_then(Yaml::as_str) != Some("AWS::Serverless::Function") {
                continue;
            }
            let properties = resource.get("Properties").ok_or_else(|| error(id, "no Properties"))?;
            let timeout =
                properties.get("Timeout").or(global_timeout).and_then(Yaml::as_u64).ok_or_else(|| {
                    error(&format!("{id}.Timeout"), "neither the function nor Globals sets a number")
                })?;
            let mut documents = Vec::new();
            for (i, policy) in
                properties.get("Policies").and_then(Yaml::as_sequence).into_iter().flatten().enumerate()
            {
                let at = format!("{id}.Policies[{i}]");
                match resolver.resolve(policy, &at)? {
                    None => {}
                    Some(Json::Object(document)) if document.contains_key("Statement") => {
                        documents.push((format!("{id}-inline-{i}"), Json::Object(document)));
                    }
                    Some(Json::String(reference)) => match reference.strip_prefix(MANAGED) {
                        Some(logical) => {
                            documents.push((logical.to_owned(), resolver.managed_policy(logical, &at)?))
                        }
                        None => {
                            return Err(error(
                                &at,
                                format!("an AWS managed policy ({reference}) is not modelled here"),
                            ));
                        }
                    },
                    Some(other) => {
                        return Err(error(
                            &at,
                            format!(
                                "not a policy document or a managed policy (a SAM policy template?): {other}"
                            ),
                        ));
                    }
                }
            }
            let events = properties.get("Events").and_then(Yaml::as_mapping).into_iter().flatten();
            if events.into_iter().any(|(_, e)| e.get("Type").and_then(Yaml::as_str) == Some("SQS")) {
                documents.push(("AWSLambdaSQSQueueExecutionRole".to_owned(), sqs_queue_execution_role()));
            }
            let mut routes = Vec::new();
            for (name, event) in properties.get("Events").and_then(Yaml::as_mapping).into_iter().flatten() {
                if event.get("Type").and_then(Yaml::as_str) != Some("HttpApi") {
                    continue;
                }
                let at = format!("{id}.Events.{}", name.as_str().unwrap_or("?"));
                let field = |f: &str| {
                    event
                        .get("Properties")
                        .and_then(|p| p.get(f))
                        .and_then(Yaml::as_str)
                        .map(|v| v.to_owned())
                        .ok_or_else(|| error(&at, format!("no Properties.{f}")))
                };
                routes.push(Route { method: field("Method")?.to_uppercase(), path: field("Path")? });
            }
            let url = properties.get("FunctionUrlConfig").map(|config| {
                let field = |f: &str, default: &str| {
                    config.get(f).and_then(Yaml::as_str).unwrap_or(default).to_owned()
                };
                FunctionUrl {
                    invoke_mode: field("InvokeMode", "BUFFERED"),
                    auth_type: field("AuthType", "AWS_IAM"),
                }
            });
            let mut statements = Vec::new();
            for (name, document) in &documents {
                statements.extend(
                    Statement::of_document(document).map_err(|e| error(&format!("{id}: {name}"), e))?,
                );
            }
            functions.push(Function {
                logical_id: id.to_owned(),
                timeout: Duration::from_secs(timeout),
                statements,
                documents,
                routes,
                url,
            });
        }
        Ok(functions)
    }
}

/// What `Ref` to a managed policy resolves to while its document is looked up.
const MANAGED: &str = "managed-policy:";

fn mentions_ref(value: &Yaml, name: &str) -> bool {
    match value {
        Yaml::Tagged(tagged) if tagged.tag == "Ref" => tagged.value.as_str() == Some(name),
        Yaml::Tagged(tagged) => mentions_ref(&tagged.value, name),
        Yaml::Sequence(list) => list.iter().any(|v| mentions_ref(v, name)),
        Yaml::Mapping(map) => map
            .iter()
            .any(|(k, v)| (k.as_str() == Some("Ref") && v.as_str() == Some(name)) || mentions_ref(v, name)),
        _ => false,
    }
}

struct Resolver<'a> {
    template: &'a Template,
    stack: &'a Stack,
}

impl Resolver<'_> {
    /// `value` with every intrinsic function evaluated; `None` for `AWS::NoValue`.
    fn resolve(&self, value: &Yaml, at: &str) -> Result<Option<Json>, TemplateError> {
        Ok(match value {
            Yaml::Null => Some(Json::Null),
            Yaml::Bool(b) => Some(Json::Bool(*b)),
            Yaml::Number(n) => Some(serde_json::to_value(n).map_err(|e| error(at, e.to_string()))?),
            Yaml::String(s) => Some(Json::String(s.clone())),
            Yaml::Sequence(list) => {
                let mut out = Vec::new();
                for (i, item) in list.iter().enumerate() {
                    if let Some(v) = self.resolve(item, &format!("{at}[{i}]"))? {
                        out.push(v);
                    }
                }
                Some(Json::Array(out))
            }
            Yaml::Mapping(map) => {
                // The long forms: `{"Ref": ...}`, `{"Fn::Sub": ...}`.
                if map.len() == 1
                    && let Some((Yaml::String(key), arg)) = map.iter().next()
                    && (key == "Ref" || key.starts_with("Fn::") || key == "Condition")
                {
                    let function = key.strip_prefix("Fn::").unwrap_or(key);
                    return self.intrinsic(function, arg, at);
                }
                let mut out = Map::new();
                for (k, v) in map {
                    let key = k.as_str().ok_or_else(|| error(at, "a key that is not a string"))?;
                    if let Some(v) = self.resolve(v, &format!("{at}.{key}"))? {
                        out.insert(key.to_owned(), v);
                    }
                }
                Some(Json::Object(out))
            }
            Yaml::Tagged(tagged) => {
                let tag = tagged.tag.to_string();
                return self.intrinsic(tag.trim_start_matches('!'), &tagged.value, at);
            }
        })
    }

    fn intrinsic(&self, function: &str, arg: &Yaml, at: &str) -> Result<Option<Json>, TemplateError> {
        let at = &format!("{at} ({function})");
        match function {
            "Ref" => {
                let name = arg.as_str().ok_or_else(|| error(at, "Ref of something that is not a name"))?;
                if name == "AWS::NoValue" {
                    return Ok(None);
                }
                self.reference(name, at).map(|s| Some(Json::String(s)))
            }
            "GetAtt" => {
                let (resource, attribute) = match arg {
                    Yaml::String(dotted) => {
                        dotted.split_once('.').ok_or_else(|| error(at, "GetAtt without .attribute"))?
                    }
                    Yaml::Sequence(pair) if pair.len() == 2 => (
                        pair[0].as_str().ok_or_else(|| error(at, "a resource name"))?,
                        pair[1].as_str().ok_or_else(|| error(at, "an attribute name"))?,
                    ),
                    _ => {
                        return Err(error(
                            at,
                            "GetAtt of neither \"Resource.Attribute\" nor [Resource, Attribute]",
                        ));
                    }
                };
                self.attribute(resource, attribute, at).map(|s| Some(Json::String(s)))
            }
            "Sub" => {
                let (text, own) = match arg {
                    Yaml::String(text) => (text.as_str(), BTreeMap::new()),
                    Yaml::Sequence(pair) if pair.len() == 2 => {
                        let text = pair[0]
                            .as_str()
                            .ok_or_else(|| error(at, "Sub's first element is not a string"))?;
                        let mut own = BTreeMap::new();
                        for (k, v) in pair[1].as_mapping().into_iter().flatten() {
                            let k = k.as_str().ok_or_else(|| error(at, "a Sub variable name"))?;
                            match self.resolve(v, at)? {
                                Some(Json::String(s)) => own.insert(k.to_owned(), s),
                                other => {
                                    return Err(error(
                                        at,
                                        format!("Sub variable {k} is not a string: {other:?}"),
                                    ));
                                }
                            };
                        }
                        (text, own)
                    }
                    _ => return Err(error(at, "Sub of neither a string nor [string, variables]")),
                };
                self.substitute(text, &own, at).map(|s| Some(Json::String(s)))
            }
            "If" => {
                let list = arg
                    .as_sequence()
                    .filter(|l| l.len() == 3)
                    .ok_or_else(|| error(at, "If takes [condition, then, else]"))?;
                let condition = list[0].as_str().ok_or_else(|| error(at, "If's condition is not a name"))?;
                let chosen = if self.condition(condition, at)? { &list[1] } else { &list[2] };
                self.resolve(chosen, at)
            }
            "Equals" | "Not" | "And" | "Or" | "Condition" => {
                self.evaluate(function, arg, at).map(|b| Some(Json::Bool(b)))
            }
            other => Err(error(at, format!("the intrinsic function {other} is not modelled here"))),
        }
    }

    fn reference(&self, name: &str, at: &str) -> Result<String, TemplateError> {
        let stack = self.stack;
        let pseudo = match name {
            "AWS::Region" => Some(stack.region.clone()),
            "AWS::AccountId" => Some(stack.account.clone()),
            "AWS::Partition" => Some("aws".to_owned()),
            "AWS::URLSuffix" => Some("amazonaws.com".to_owned()),
            "AWS::StackName" => stack.parameters.get("Stage").map(|s| format!("turnstone-{s}")),
            _ => None,
        };
        if let Some(value) = pseudo {
            return Ok(value);
        }
        if let Some(value) = stack.parameters.get(name) {
            return Ok(value.clone());
        }
        if let Some(default) = self.template.entry("Parameters", name).and_then(|p| p.get("Default")) {
            return Ok(match default {
                Yaml::String(s) => s.clone(),
                Yaml::Number(n) => n.to_string(),
                other => {
                    return Err(error(at, format!("parameter {name}'s default is not a scalar: {other:?}")));
                }
            });
        }
        let resource = self.template.entry("Resources", name);
        if resource.and_then(|r| r.get("Type")).and_then(Yaml::as_str) == Some("AWS::IAM::ManagedPolicy") {
            return Ok(format!("{MANAGED}{name}"));
        }
        match stack.resources.get(name) {
            Some(physical) => Ok(physical.reference.clone()),
            None if resource.is_some() => {
                Err(error(at, format!("resource {name} has no physical name in the test's stack")))
            }
            None => Err(error(at, format!("{name} is neither a parameter nor a resource"))),
        }
    }

    fn attribute(&self, resource: &str, attribute: &str, at: &str) -> Result<String, TemplateError> {
        self.stack
            .resources
            .get(resource)
            .and_then(|p| p.attributes.get(attribute))
            .cloned()
            .ok_or_else(|| error(at, format!("{resource}.{attribute} has no value in the test's stack")))
    }

    fn substitute(
        &self,
        text: &str,
        own: &BTreeMap<String, String>,
        at: &str,
    ) -> Result<String, TemplateError> {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            // `${!Literal}` writes `${Literal}`.
            if let Some(literal) = after.strip_prefix('!') {
                out.push_str("${");
                rest = literal;
                continue;
            }
            let end = after.find('}').ok_or_else(|| error(at, format!("unclosed ${{ in {text:?}")))?;
            let name = &after[..end];
            let value = match own.get(name) {
                Some(v) => v.clone(),
                None => match name.split_once('.') {
                    Some((resource, attribute)) if !name.starts_with("AWS::") => {
                        self.attribute(resource, attribute, at)?
                    }
                    _ => self.reference(name, at)?,
                },
            };
            out.push_str(&value);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    fn condition(&self, name: &str, at: &str) -> Result<bool, TemplateError> {
        let definition = self
            .template
            .entry("Conditions", name)
            .ok_or_else(|| error(at, format!("no condition {name}")))?;
        self.truth(definition, &format!("Conditions.{name}"))
    }

    fn truth(&self, value: &Yaml, at: &str) -> Result<bool, TemplateError> {
        match self.resolve(value, at)? {
            Some(Json::Bool(b)) => Ok(b),
            other => Err(error(at, format!("a condition that is not true or false: {other:?}"))),
        }
    }

    fn evaluate(&self, function: &str, arg: &Yaml, at: &str) -> Result<bool, TemplateError> {
        let list = arg.as_sequence();
        match (function, list) {
            ("Condition", _) => {
                self.condition(arg.as_str().ok_or_else(|| error(at, "a condition name"))?, at)
            }
            ("Equals", Some(pair)) if pair.len() == 2 => {
                let scalar = |v: Option<Json>| match v {
                    Some(Json::Number(n)) => Json::String(n.to_string()),
                    Some(other) => other,
                    None => Json::Null,
                };
                Ok(scalar(self.resolve(&pair[0], at)?) == scalar(self.resolve(&pair[1], at)?))
            }
            ("Not", Some(one)) if one.len() == 1 => Ok(!self.truth(&one[0], at)?),
            ("And", Some(all)) => all.iter().try_fold(true, |acc, c| Ok(acc && self.truth(c, at)?)),
            ("Or", Some(any)) => any.iter().try_fold(false, |acc, c| Ok(acc || self.truth(c, at)?)),
            _ => Err(error(at, format!("malformed Fn::{function}"))),
        }
    }

    /// The document of managed policy resource `logical`, which must exist under its condition.
    fn managed_policy(&self, logical: &str, at: &str) -> Result<Json, TemplateError> {
        let resource = self
            .template
            .entry("Resources", logical)
            .ok_or_else(|| error(at, format!("no resource {logical}")))?;
        if let Some(condition) = resource.get("Condition").and_then(Yaml::as_str)
            && !self.condition(condition, at)?
        {
            return Err(error(at, format!("{logical} is attached but its condition {condition} is false")));
        }
        let document = resource
            .get("Properties")
            .and_then(|p| p.get("PolicyDocument"))
            .ok_or_else(|| error(at, format!("{logical} has no PolicyDocument")))?;
        self.resolve(document, &format!("{logical}.PolicyDocument"))?
            .ok_or_else(|| error(at, format!("{logical}'s PolicyDocument resolves to nothing")))
    }
}
