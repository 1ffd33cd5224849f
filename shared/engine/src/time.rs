//! Time as the engine sees it: milliseconds since the Unix epoch, handed in by the caller.

use serde::{Deserialize, Serialize};

/// A point in time, in milliseconds since the Unix epoch (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// `ms` milliseconds after this instant.
    pub fn plus_ms(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
    }

    /// This instant as RFC 3339 with milliseconds, e.g. `2026-11-30T01:02:03.456Z`.
    pub fn to_rfc3339(self) -> String {
        let nanos = i128::from(self.0) * 1_000_000;
        match time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            Ok(t) => format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second(),
                t.millisecond()
            ),
            // Out of the calendar's range: fall back to the raw number rather than fail.
            Err(_) => self.0.to_string(),
        }
    }

    /// Parses RFC 3339 (as produced by [`Timestamp::to_rfc3339`] or any offset).
    pub fn parse_rfc3339(text: &str) -> Option<Timestamp> {
        let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
        i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok().map(Timestamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        let t = Timestamp(1_796_000_523_456);
        let text = t.to_rfc3339();
        assert_eq!(text, "2026-11-30T01:02:03.456Z");
        assert_eq!(Timestamp::parse_rfc3339(&text), Some(t));
    }
}
