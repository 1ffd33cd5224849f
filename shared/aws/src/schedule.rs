//! Wake-ups further away than SQS can delay them (900 s), as EventBridge Scheduler one-time
//! schedules: a session waiting a day for a person costs one schedule and one dispatch
//! invocation when it is due, not a wake-up re-armed every 15 minutes (96 a day).
//!
//! A schedule is `at(<due time, UTC, rounded up to the second>)` in the deployment's schedule
//! group, its target the wake-up queue (Scheduler's templated SQS `SendMessage` target) with the
//! wake-up's body as its input, sent with the template's scheduler role, and
//! `ActionAfterCompletion: DELETE`: Scheduler deletes it once it has fired, so schedules do not
//! pile up. Its name is a digest of the session id and the due time: the same wake-up asked for
//! twice is one schedule (the second `CreateSchedule` meets `ConflictException`, which is
//! success), and a wake-up the session no longer needs fires once and finds nothing due.
//! Scheduler fires within a minute of the time; the dispatcher re-checks due times on arrival,
//! and a wake-up that comes early re-arms on SQS for the seconds left.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_scheduler::Client;
use aws_sdk_scheduler::types::{ActionAfterCompletion, FlexibleTimeWindow, FlexibleTimeWindowMode, Target};
use sha2::{Digest, Sha256};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_runtime::queue::WakeUp;

use crate::error::{AwsError, describe};

/// Where a deployment's long wake-ups are scheduled.
#[derive(Clone)]
pub struct Scheduler {
    client: Client,
    /// The schedule group the template creates (the functions may create schedules in it only).
    group: String,
    /// The role Scheduler sends to the queue with (passed with `iam:PassRole`).
    role_arn: String,
    /// The wake-up queue's ARN: the schedules' target.
    queue_arn: String,
    /// What "now" is for a delay (the function's clock).
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").field("group", &self.group).field("queue_arn", &self.queue_arn).finish()
    }
}

impl Scheduler {
    pub fn new(
        client: Client,
        group: impl Into<String>,
        role_arn: impl Into<String>,
        queue_arn: impl Into<String>,
    ) -> Self {
        Scheduler {
            client,
            group: group.into(),
            role_arn: role_arn.into(),
            queue_arn: queue_arn.into(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The same scheduler, its delays counted from `clock`'s now.
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Scheduler { clock, ..self }
    }

    /// The schedule group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Schedules `wake_up` for `delay` from now.
    pub async fn schedule(&self, wake_up: &WakeUp, delay: Duration) -> Result<(), AwsError> {
        let due = self.clock.now().plus_ms(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        // A client's departure is a wake-up of its own, not the session's (which a schedule
        // due the same second would otherwise be taken for, and dropped).
        let name = match &wake_up.departed {
            Some(departed) => schedule_name(&format!("{}\0{}", wake_up.session_id, departed.client_id), due),
            None => schedule_name(&wake_up.session_id, due),
        };
        let failed = |message: String| AwsError::Schedule { name: name.clone(), message };
        let window = FlexibleTimeWindow::builder()
            .mode(FlexibleTimeWindowMode::Off)
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let target = Target::builder()
            .arn(&self.queue_arn)
            .role_arn(&self.role_arn)
            .input(wake_up.to_body())
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let created = self
            .client
            .create_schedule()
            .name(&name)
            .group_name(&self.group)
            .schedule_expression(at_expression(due))
            .schedule_expression_timezone("UTC")
            .flexible_time_window(window)
            .target(target)
            .action_after_completion(ActionAfterCompletion::Delete)
            .send()
            .await;
        match created {
            Ok(_) => Ok(()),
            // The same session and due time: this wake-up is scheduled already.
            Err(err) if err.as_service_error().is_some_and(|e| e.is_conflict_exception()) => Ok(()),
            Err(err) => Err(failed(describe(&err))),
        }
    }
}

/// A schedule's name: 1 to 64 of `[0-9a-zA-Z-_.]` (Scheduler's `CreateSchedule` `Name`), so a
/// digest of the session id (which may hold other characters) and the due second.
pub fn schedule_name(session_id: &str, due: Timestamp) -> String {
    let digest = Sha256::digest(session_id.as_bytes());
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("wake-{hex}-{}", due_second(due))
}

/// The one-time schedule expression `at(yyyy-mm-ddThh:mm:ss)` for `due`, rounded up to the
/// second (never early).
pub fn at_expression(due: Timestamp) -> String {
    let secs = due_second(due);
    let days = secs.div_euclid(86_400);
    let rest = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!("at({year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02})", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Seconds since the epoch of `due`, rounded up.
fn due_second(due: Timestamp) -> i64 {
    due.0.div_euclid(1000) + i64::from(due.0.rem_euclid(1000) > 0)
}

/// The proleptic Gregorian date of day `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expression_is_the_due_second_in_utc_rounded_up() {
        let at = |ms: i64| at_expression(Timestamp(ms));
        assert_eq!(at(0), "at(1970-01-01T00:00:00)");
        assert_eq!(at(1), "at(1970-01-01T00:00:01)");
        // 2026-12-03T06:50:00Z, and a leap day.
        assert_eq!(at(1_796_280_600_000), "at(2026-12-03T06:50:00)");
        assert_eq!(at(951_782_400_000), "at(2000-02-29T00:00:00)");
        assert_eq!(at(4_107_542_399_000), "at(2100-02-28T23:59:59)");
    }

    #[test]
    fn names_are_what_scheduler_accepts_and_one_per_session_and_second() {
        let due = Timestamp(1_796_280_600_000);
        let name = schedule_name("s/with:odd chars", due);
        assert!(name.len() <= 64, "{name}");
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)), "{name}");
        assert_eq!(name, schedule_name("s/with:odd chars", Timestamp(1_796_280_599_001)));
        assert_ne!(name, schedule_name("s/with:odd chars", due.plus_ms(1)));
        assert_ne!(name, schedule_name("another", due));
    }
}
