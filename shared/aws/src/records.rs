//! The records of an SQS event as a Lambda function receives it, turned into wake-ups.
//!
//! The `dispatch` function gets a batch of records; it handles the wake-ups and answers with
//! `batchItemFailures` naming the message ids to deliver again, so one bad record does not
//! send the whole batch back. A record whose body is not a wake-up is reported by its message
//! id (after `maxReceiveCount` receives the redrive policy moves it to the dead-letter queue).
//! This takes plain strings, so it needs none of the Lambda crates.

use turnstone_runtime::queue::WakeUp;

/// A record's wake-up, with the message id to report if handling it fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordWakeUp {
    pub message_id: String,
    pub wake_up: WakeUp,
}

/// A record whose body is not a wake-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedRecord {
    pub message_id: String,
    /// Why it could not be read.
    pub error: String,
}

/// An SQS event's records, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Records {
    /// The wake-ups, in the records' order.
    pub wake_ups: Vec<RecordWakeUp>,
    /// The records that are not wake-ups.
    pub malformed: Vec<MalformedRecord>,
}

impl Records {
    /// The message ids of the malformed records, for `batchItemFailures`.
    pub fn malformed_ids(&self) -> impl Iterator<Item = &str> {
        self.malformed.iter().map(|m| m.message_id.as_str())
    }
}

/// Reads `(message id, body)` records into wake-ups, setting aside those that are not.
pub fn wake_ups_from_records<'a>(records: impl IntoIterator<Item = (&'a str, &'a str)>) -> Records {
    let mut out = Records::default();
    for (message_id, body) in records {
        match parse_body(body) {
            Ok(wake_up) => out.wake_ups.push(RecordWakeUp { message_id: message_id.to_owned(), wake_up }),
            Err(error) => {
                tracing::warn!(message_id, %error, "an SQS record that is not a wake-up");
                out.malformed.push(MalformedRecord { message_id: message_id.to_owned(), error });
            }
        }
    }
    out
}

/// A message body as a wake-up: the JSON [`WakeUp`], naming a session.
pub(crate) fn parse_body(body: &str) -> Result<WakeUp, String> {
    let wake_up: WakeUp = serde_json::from_str(body).map_err(|e| format!("not a wake-up: {e}"))?;
    if wake_up.session_id.is_empty() {
        return Err("not a wake-up: session_id is empty".to_owned());
    }
    Ok(wake_up)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_and_bad_records_are_told_apart_by_message_id() {
        let records = [
            ("m-1", r#"{"session_id":"s-1","reason":"input"}"#),
            ("m-2", "not json"),
            ("m-3", r#"{"session_id":"","reason":"timer"}"#),
            ("m-4", r#"{"reason":"timer"}"#),
            ("m-5", r#"{"session_id":"s-2","reason":"timer"}"#),
        ];
        let read = wake_ups_from_records(records);
        let ids: Vec<&str> = read.wake_ups.iter().map(|w| w.message_id.as_str()).collect();
        assert_eq!(ids, ["m-1", "m-5"]);
        assert_eq!(read.wake_ups[0].wake_up, WakeUp { session_id: "s-1".into(), reason: "input".into() });
        assert_eq!(read.malformed_ids().collect::<Vec<_>>(), ["m-2", "m-3", "m-4"]);
        assert!(read.malformed.iter().all(|m| m.error.starts_with("not a wake-up")));
    }
}
