//! IAM's evaluation of identity-based policies, for the statements of one role: an explicit
//! `Deny` wins, else an `Allow` whose `Action`, `Resource` and `Condition` all match allows,
//! else the request is refused (IAM User Guide, "Policy evaluation logic" and "IAM JSON policy
//! elements reference"). Only identity-based policies: the template attaches no resource
//! policies, boundaries or session policies to the functions' roles.

use std::collections::BTreeMap;

use serde_json::Value as Json;

/// One statement of a policy document.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    pub sid: Option<String>,
    pub allow: bool,
    actions: Matcher,
    resources: Matcher,
    /// Operator (`ForAllValues:StringEquals`) -> condition key -> values.
    conditions: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

/// `Action` or `NotAction` (likewise `Resource`/`NotResource`): patterns, or their complement.
#[derive(Debug, Clone, PartialEq)]
struct Matcher {
    patterns: Vec<String>,
    negated: bool,
}

/// What one request asks IAM: an action on a resource, with the request's condition keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub action: String,
    pub resource: String,
    /// Condition key -> the request's values for it (absent: the request has no such key).
    pub context: BTreeMap<String, Vec<String>>,
}

impl Request {
    pub fn new(action: impl Into<String>, resource: impl Into<String>) -> Self {
        Request { action: action.into(), resource: resource.into(), context: BTreeMap::new() }
    }
}

/// IAM's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// An `Allow` matched (its `Sid`, when it has one).
    Allowed(Option<String>),
    /// No statement allows it.
    NotAllowed,
    /// A `Deny` matched.
    Denied(Option<String>),
}

fn strings(value: &Json, what: &str) -> Result<Vec<String>, String> {
    match value {
        Json::String(s) => Ok(vec![s.clone()]),
        Json::Array(list) => list
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| format!("{what}: {v} is not a string")))
            .collect(),
        // Condition values may be written as numbers or booleans; IAM compares their text.
        Json::Bool(b) => Ok(vec![b.to_string()]),
        Json::Number(n) => Ok(vec![n.to_string()]),
        other => Err(format!("{what}: {other} is neither a string nor a list of strings")),
    }
}

impl Matcher {
    fn of(statement: &serde_json::Map<String, Json>, element: &str) -> Result<Matcher, String> {
        let not = format!("Not{element}");
        match (statement.get(element), statement.get(&not)) {
            (Some(v), None) => Ok(Matcher { patterns: strings(v, element)?, negated: false }),
            (None, Some(v)) => Ok(Matcher { patterns: strings(v, &not)?, negated: true }),
            (Some(_), Some(_)) => Err(format!("both {element} and {not}")),
            (None, None) => Err(format!("neither {element} nor {not}")),
        }
    }

    fn matches(&self, value: &str, ignore_case: bool) -> bool {
        self.patterns.iter().any(|p| glob(p, value, ignore_case)) != self.negated
    }
}

impl Statement {
    /// The statements of a policy document (`Statement` is one statement or a list).
    pub fn of_document(document: &Json) -> Result<Vec<Statement>, String> {
        match document.get("Statement") {
            Some(Json::Array(list)) => list.iter().map(Statement::parse).collect(),
            Some(one @ Json::Object(_)) => Ok(vec![Statement::parse(one)?]),
            _ => Err("a policy document without Statement".to_owned()),
        }
    }

    fn parse(value: &Json) -> Result<Statement, String> {
        let map = value.as_object().ok_or_else(|| format!("a statement that is not an object: {value}"))?;
        let sid = map.get("Sid").and_then(Json::as_str).map(str::to_owned);
        let allow = match map.get("Effect").and_then(Json::as_str) {
            Some("Allow") => true,
            Some("Deny") => false,
            other => return Err(format!("Effect must be Allow or Deny, not {other:?}")),
        };
        let mut conditions = BTreeMap::new();
        if let Some(condition) = map.get("Condition") {
            let operators = condition.as_object().ok_or("Condition is not an object")?;
            for (operator, keys) in operators {
                let keys =
                    keys.as_object().ok_or_else(|| format!("Condition.{operator} is not an object"))?;
                let mut by_key = BTreeMap::new();
                for (key, values) in keys {
                    by_key.insert(key.clone(), strings(values, &format!("Condition.{operator}.{key}"))?);
                }
                // An operator this evaluator does not know must not be passed over.
                operator_of(operator)?;
                conditions.insert(operator.clone(), by_key);
            }
        }
        Ok(Statement {
            sid,
            allow,
            actions: Matcher::of(map, "Action")?,
            resources: Matcher::of(map, "Resource")?,
            conditions,
        })
    }

    /// Whether this statement applies to `request` (its effect aside).
    fn applies(&self, request: &Request) -> bool {
        // Action names are case-insensitive, ARNs are not (IAM JSON policy elements: Action,
        // Resource).
        self.actions.matches(&request.action, true)
            && self.resources.matches(&request.resource, false)
            && self.conditions.iter().all(|(operator, keys)| {
                let Ok(operator) = operator_of(operator) else { return false };
                keys.iter().all(|(key, values)| operator.holds(request.context.get(key), values))
            })
    }
}

/// What IAM decides for `request` under `statements`.
pub fn evaluate(statements: &[Statement], request: &Request) -> Decision {
    if let Some(deny) = statements.iter().find(|s| !s.allow && s.applies(request)) {
        return Decision::Denied(deny.sid.clone());
    }
    match statements.iter().find(|s| s.allow && s.applies(request)) {
        Some(allow) => Decision::Allowed(allow.sid.clone()),
        None => Decision::NotAllowed,
    }
}

/// A condition operator: how a request's values compare with the statement's (IAM JSON policy
/// elements: Condition operators; "Single-valued vs. multivalued context keys").
#[derive(Debug, Clone, Copy)]
struct Operator {
    set: SetOperator,
    compare: Compare,
    negated: bool,
    if_exists: bool,
}

#[derive(Debug, Clone, Copy)]
enum SetOperator {
    /// A single-valued key: a value of the request matches one of the statement's.
    Single,
    /// `ForAllValues:`: every value of the request matches; true for a missing key.
    ForAll,
    /// `ForAnyValue:`: some value of the request matches; false for a missing key.
    ForAny,
}

#[derive(Debug, Clone, Copy)]
enum Compare {
    Equals { ignore_case: bool },
    Like,
    Bool,
}

fn operator_of(name: &str) -> Result<Operator, String> {
    let (set, rest) = match name.split_once(':') {
        Some(("ForAllValues", rest)) => (SetOperator::ForAll, rest),
        Some(("ForAnyValue", rest)) => (SetOperator::ForAny, rest),
        Some((other, _)) => return Err(format!("unknown condition set operator {other}")),
        None => (SetOperator::Single, name),
    };
    let (rest, if_exists) = match rest.strip_suffix("IfExists") {
        Some(base) => (base, true),
        None => (rest, false),
    };
    let (compare, negated) = match rest {
        "StringEquals" | "ArnEquals" => (Compare::Equals { ignore_case: false }, false),
        "StringNotEquals" | "ArnNotEquals" => (Compare::Equals { ignore_case: false }, true),
        "StringEqualsIgnoreCase" => (Compare::Equals { ignore_case: true }, false),
        "StringNotEqualsIgnoreCase" => (Compare::Equals { ignore_case: true }, true),
        "StringLike" | "ArnLike" => (Compare::Like, false),
        "StringNotLike" | "ArnNotLike" => (Compare::Like, true),
        "Bool" => (Compare::Bool, false),
        other => return Err(format!("condition operator {other} is not modelled here")),
    };
    Ok(Operator { set, compare, negated, if_exists })
}

impl Operator {
    fn one(&self, actual: &str, expected: &[String]) -> bool {
        let hit = expected.iter().any(|e| match self.compare {
            Compare::Equals { ignore_case: false } => actual == e,
            Compare::Equals { ignore_case: true } => actual.eq_ignore_ascii_case(e),
            Compare::Like => glob(e, actual, false),
            Compare::Bool => actual.eq_ignore_ascii_case(e),
        });
        hit != self.negated
    }

    fn holds(&self, actual: Option<&Vec<String>>, expected: &[String]) -> bool {
        match self.set {
            SetOperator::ForAll => actual.is_none_or(|values| values.iter().all(|v| self.one(v, expected))),
            SetOperator::ForAny => actual.is_some_and(|values| values.iter().any(|v| self.one(v, expected))),
            // A missing key fails a condition, but for `...IfExists` and the negated
            // operators, which it passes (IAM JSON policy elements: Condition operators).
            SetOperator::Single => match actual.filter(|v| !v.is_empty()) {
                None => self.if_exists || self.negated,
                Some(values) => values.iter().any(|v| self.one(v, expected)),
            },
        }
    }
}

/// IAM's wildcards: `*` any run of characters, `?` one character.
pub fn glob(pattern: &str, value: &str, ignore_case: bool) -> bool {
    let fold = |s: &str| if ignore_case { s.to_ascii_lowercase() } else { s.to_owned() };
    let (p, v): (Vec<char>, Vec<char>) = (fold(pattern).chars().collect(), fold(value).chars().collect());
    let (mut pi, mut vi) = (0, 0);
    let mut back: Option<(usize, usize)> = None;
    while vi < v.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == v[vi]) {
            pi += 1;
            vi += 1;
        } else if pi < p.len() && p[pi] == '*' {
            back = Some((pi, vi));
            pi += 1;
        } else if let Some((star, at)) = back {
            pi = star + 1;
            vi = at + 1;
            back = Some((star, at + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn statements(document: Json) -> Vec<Statement> {
        Statement::of_document(&document).unwrap()
    }

    #[test]
    fn wildcards_match_as_iam_says() {
        assert!(glob(
            "arn:aws:dynamodb:*:*:table/t/index/*",
            "arn:aws:dynamodb:r:1:table/t/index/due",
            false
        ));
        assert!(!glob("arn:aws:dynamodb:*:*:table/t", "arn:aws:dynamodb:r:1:table/t/index/due", false));
        assert!(glob("dynamodb:Get*", "DynamoDB:GetItem", true));
        assert!(!glob("dynamodb:Get*", "DynamoDB:GetItem", false));
        assert!(glob("a?c", "abc", false) && !glob("a?c", "ac", false));
    }

    #[test]
    fn deny_wins_and_nothing_allowed_is_refused() {
        let s = statements(json!({"Statement": [
            {"Sid": "All", "Effect": "Allow", "Action": "sqs:*", "Resource": "*"},
            {"Sid": "NotThis", "Effect": "Deny", "Action": "sqs:DeleteQueue", "Resource": "*"}
        ]}));
        assert_eq!(
            evaluate(&s, &Request::new("sqs:SendMessage", "q")),
            Decision::Allowed(Some("All".into()))
        );
        assert_eq!(
            evaluate(&s, &Request::new("sqs:DeleteQueue", "q")),
            Decision::Denied(Some("NotThis".into()))
        );
        assert_eq!(evaluate(&s, &Request::new("dynamodb:GetItem", "t")), Decision::NotAllowed);
    }

    #[test]
    fn for_all_values_allows_a_subset_and_a_missing_key() {
        let s = statements(json!({"Statement": {
            "Effect": "Allow", "Action": "dynamodb:UpdateItem", "Resource": "t",
            "Condition": {"ForAllValues:StringEquals": {"dynamodb:Attributes": ["PK", "SK", "due"]}}
        }}));
        let mut request = Request::new("dynamodb:UpdateItem", "t");
        assert!(matches!(evaluate(&s, &request), Decision::Allowed(_)), "a missing key");
        request.context.insert("dynamodb:Attributes".into(), vec!["PK".into(), "due".into()]);
        assert!(matches!(evaluate(&s, &request), Decision::Allowed(_)));
        request.context.insert("dynamodb:Attributes".into(), vec!["PK".into(), "head".into()]);
        assert_eq!(evaluate(&s, &request), Decision::NotAllowed);
    }

    #[test]
    fn an_unknown_condition_operator_is_an_error_not_a_pass() {
        let err = Statement::of_document(&json!({"Statement": {
            "Effect": "Allow", "Action": "*", "Resource": "*",
            "Condition": {"DateGreaterThan": {"aws:CurrentTime": "2020-01-01T00:00:00Z"}}
        }}))
        .unwrap_err();
        assert!(err.contains("DateGreaterThan"), "{err}");
    }
}
