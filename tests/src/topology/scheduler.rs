//! EventBridge Scheduler in the stand-in stack: what the gate asks IAM for a `CreateSchedule`
//! and refuses as invalid before moto sees it (moto stores any schedule), and the runner that
//! does what Scheduler does with a due one-time schedule: sends its input to its target queue
//! as its role (authorized against that role's policy in the template), then deletes it.
//!
//! The rules, from the EventBridge Scheduler API Reference (`CreateSchedule`, `Target`,
//! `FlexibleTimeWindow`) and the user guide ("Schedule types": one-time schedules are
//! `at(yyyy-mm-ddThh:mm:ss)`; "Using identity-based policies": `CreateSchedule` is
//! `scheduler:CreateSchedule` on the schedule's ARN and `iam:PassRole` on the target's role).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_config::SdkConfig;
use serde_json::Value as Json;
use turnstone_runtime::clock::Clock;

use super::gate::Gate;
use super::policy::{self, Decision, Request, Statement};

/// A request the service refuses as invalid: `ValidationException` and why.
#[derive(Debug)]
pub struct Invalid(pub String);

/// The operation a Scheduler REST request is, and the IAM requests AWS authorizes it by.
pub fn authorization(
    region: &str,
    account: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(String, Vec<Request>), Invalid> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        ("POST", ["schedules", name]) => {
            let input: Json =
                serde_json::from_slice(body).map_err(|e| Invalid(format!("the body is not JSON: {e}")))?;
            let group = check_create(name, &input)?;
            let schedule = format!("arn:aws:scheduler:{region}:{account}:schedule/{group}/{name}");
            let role = input.pointer("/Target/RoleArn").and_then(Json::as_str).unwrap_or_default();
            let mut pass = Request::new("iam:PassRole", role);
            pass.context.insert("iam:PassedToService".to_owned(), vec!["scheduler.amazonaws.com".to_owned()]);
            Ok(("CreateSchedule".to_owned(), vec![Request::new("scheduler:CreateSchedule", schedule), pass]))
        }
        (method, segments) => Err(Invalid(format!("{method} /{} is not modelled here", segments.join("/")))),
    }
}

/// `CreateSchedule`'s constraints as the API reference states them; the group it names.
fn check_create<'a>(name: &str, input: &'a Json) -> Result<&'a str, Invalid> {
    let named = |what: &str, value: &str| {
        // Name, GroupName: 1 to 64 of [0-9a-zA-Z-_.].
        let fits = (1..=64).contains(&value.len())
            && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if fits {
            Ok(())
        } else {
            Err(Invalid(format!("{what} {value:?} must be 1 to 64 of [0-9a-zA-Z-_.]")))
        }
    };
    named("Name", name)?;
    let group = input.get("GroupName").and_then(Json::as_str).unwrap_or("default");
    named("GroupName", group)?;
    let text = |field: &str| input.pointer(field).and_then(Json::as_str);
    let expression =
        text("/ScheduleExpression").ok_or_else(|| Invalid("ScheduleExpression is required".into()))?;
    if !is_at_expression(expression) {
        return Err(Invalid(format!(
            "ScheduleExpression {expression:?}: this stack schedules one-time at(yyyy-mm-ddThh:mm:ss) only"
        )));
    }
    match text("/FlexibleTimeWindow/Mode") {
        Some("OFF") => {}
        Some("FLEXIBLE") if input.pointer("/FlexibleTimeWindow/MaximumWindowInMinutes").is_some() => {}
        Some("FLEXIBLE") => return Err(Invalid("FLEXIBLE needs MaximumWindowInMinutes".into())),
        other => {
            return Err(Invalid(format!(
                "FlexibleTimeWindow.Mode is required (OFF or FLEXIBLE), not {other:?}"
            )));
        }
    }
    let arn = |field: &str| {
        text(field)
            .filter(|a| a.starts_with("arn:") && a.len() <= 1600)
            .ok_or_else(|| Invalid(format!("{field} must be an ARN")))
    };
    arn("/Target/Arn")?;
    let role = arn("/Target/RoleArn")?;
    if !role.contains(":iam::") || !role.contains(":role/") {
        return Err(Invalid(format!("Target.RoleArn {role:?} is not a role's ARN")));
    }
    if let Some(input) = text("/Target/Input")
        && !(1..=8192).contains(&input.len())
    {
        return Err(Invalid(format!("Target.Input is {} characters, 1 to 8192 allowed", input.len())));
    }
    match text("/ActionAfterCompletion") {
        None | Some("NONE" | "DELETE") => {}
        Some(other) => {
            return Err(Invalid(format!("ActionAfterCompletion {other:?} is neither NONE nor DELETE")));
        }
    }
    Ok(group)
}

/// `at(yyyy-mm-ddThh:mm:ss)`.
fn is_at_expression(expression: &str) -> bool {
    let Some(inner) = expression.strip_prefix("at(").and_then(|e| e.strip_suffix(')')) else { return false };
    parse_at(inner).is_some()
}

/// Seconds since the epoch of `yyyy-mm-ddThh:mm:ss` (UTC).
fn parse_at(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let n = |from: usize, to: usize| text.get(from..to)?.parse::<i64>().ok();
    let (y, m, d, hh, mm, ss) = (n(0, 4)?, n(5, 7)?, n(8, 10)?, n(11, 13)?, n(14, 16)?, n(17, 19)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 59 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's `days_from_civil`).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// Does Scheduler's part for one schedule group: fires each one-time schedule whose time has
/// come by the stack's clock, as its role, once. The schedules are those the gate saw created
/// (moto keeps them too, but its reads of them fail its own signature check); one whose
/// `ActionAfterCompletion` is `DELETE` is gone once fired, as Scheduler deletes it.
pub struct Runner {
    gate: Arc<Gate>,
    sqs: aws_sdk_sqs::Client,
    group: String,
    /// The scheduler role's statements (from the template).
    role: Vec<Statement>,
    clock: Arc<dyn Clock>,
    /// What fired: (schedule name, the input it sent).
    fired: Mutex<Vec<(String, String)>>,
}

impl Runner {
    pub fn new(
        gate: Arc<Gate>,
        admin: &SdkConfig,
        group: &str,
        role: Vec<Statement>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Runner> {
        Arc::new(Runner {
            gate,
            sqs: aws_sdk_sqs::Client::new(admin),
            group: group.to_owned(),
            role,
            clock,
            fired: Mutex::new(Vec::new()),
        })
    }

    /// Fires what is due, every 200 ms, until the runtime ends.
    pub fn spawn(self: &Arc<Self>) {
        let runner = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                if let Err(e) = runner.fire_due().await {
                    tracing::warn!(error = %e, "the scheduler stand-in could not fire a schedule");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// The schedules fired so far: (name, input).
    pub fn fired(&self) -> Vec<(String, String)> {
        self.fired.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The names of the schedules waiting to fire (created, and not fired and deleted).
    pub fn waiting(&self) -> Vec<String> {
        let fired: Vec<String> = self.fired().into_iter().map(|(name, _)| name).collect();
        self.gate
            .schedules(&self.group)
            .into_iter()
            .filter(|(name, body)| {
                let deletes = body.get("ActionAfterCompletion").and_then(Json::as_str) == Some("DELETE");
                !(deletes && fired.contains(name))
            })
            .map(|(name, _)| name)
            .collect()
    }

    async fn fire_due(&self) -> Result<(), String> {
        let now = self.clock.now().0.div_euclid(1000);
        let fired: Vec<String> = self.fired().into_iter().map(|(name, _)| name).collect();
        for (name, body) in self.gate.schedules(&self.group) {
            if fired.contains(&name) {
                continue;
            }
            let expression = body.get("ScheduleExpression").and_then(Json::as_str).unwrap_or_default();
            let at = expression.strip_prefix("at(").and_then(|e| e.strip_suffix(')')).and_then(parse_at);
            if at.is_none_or(|at| at > now) {
                continue;
            }
            let arn = body.pointer("/Target/Arn").and_then(Json::as_str).unwrap_or_default();
            let input = body.pointer("/Target/Input").and_then(Json::as_str).unwrap_or_default().to_owned();
            // Scheduler sends as the schedule's role: the role's policy must allow it.
            let send = Request::new("sqs:SendMessage", arn);
            if !matches!(policy::evaluate(&self.role, &send), Decision::Allowed(_)) {
                return Err(format!("the scheduler role may not send to {arn}"));
            }
            let queue_name = arn.rsplit(':').next().unwrap_or_default();
            let url =
                self.sqs.get_queue_url().queue_name(queue_name).send().await.map_err(|e| e.to_string())?;
            self.sqs
                .send_message()
                .queue_url(url.queue_url().unwrap_or_default())
                .message_body(&input)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            self.fired.lock().unwrap_or_else(|p| p.into_inner()).push((name, input));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_times_read_back_as_written() {
        assert_eq!(parse_at("1970-01-01T00:00:00"), Some(0));
        assert_eq!(parse_at("2026-12-03T06:50:00"), Some(1_796_280_600));
        assert_eq!(parse_at("2000-02-29T00:00:00"), Some(951_782_400));
        assert_eq!(parse_at("2026-12-03T06:50:00Z"), None);
        assert_eq!(parse_at("2026-13-03T06:50:00"), None);
        assert!(is_at_expression("at(2026-12-03T06:50:00)"));
        assert!(!is_at_expression("rate(5 minutes)"));
    }

    #[test]
    fn a_create_schedule_is_authorized_by_its_schedule_and_its_role() {
        let body = serde_json::json!({
            "GroupName": "g", "ScheduleExpression": "at(2026-12-03T06:50:00)",
            "FlexibleTimeWindow": {"Mode": "OFF"}, "ActionAfterCompletion": "DELETE",
            "Target": {"Arn": "arn:aws:sqs:us-east-1:1:q", "RoleArn": "arn:aws:iam::1:role/r", "Input": "{}"}
        });
        let (operation, requests) =
            authorization("us-east-1", "1", "POST", "/schedules/wake-1", body.to_string().as_bytes())
                .unwrap();
        assert_eq!(operation, "CreateSchedule");
        assert_eq!(requests[0].resource, "arn:aws:scheduler:us-east-1:1:schedule/g/wake-1");
        assert_eq!(
            (requests[1].action.as_str(), requests[1].resource.as_str()),
            ("iam:PassRole", "arn:aws:iam::1:role/r")
        );
        let mut bad = body.clone();
        bad["ScheduleExpression"] = "at(2026-12-03T06:50:00Z)".into();
        assert!(
            authorization("us-east-1", "1", "POST", "/schedules/wake-1", bad.to_string().as_bytes()).is_err()
        );
        assert!(
            authorization("us-east-1", "1", "POST", "/schedules/no:colons", body.to_string().as_bytes())
                .is_err()
        );
    }
}
