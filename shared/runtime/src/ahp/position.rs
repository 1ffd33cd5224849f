//! A chat action's position relative to the durable log (the scheme is in the module doc of
//! [`super`]): the `serverSeq` behind API Gateway, and what the local host's numbers map to.

/// Actions a slot (one durable event and what follows it before the next) may number.
pub(crate) const STRIDE: u64 = 1 << 20;

/// Where a chat channel stands: after event `event`, `count` actions of its slot sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Position {
    pub event: u64,
    pub count: u64,
}

impl Position {
    /// The `serverSeq` of the last action sent (or of the snapshot).
    pub fn server_seq(self) -> u64 {
        self.event.saturating_mul(STRIDE).saturating_add(self.count)
    }

    /// The position a client that last saw `server_seq` stands at.
    pub fn decode(server_seq: u64) -> Position {
        Position { event: server_seq / STRIDE, count: server_seq % STRIDE }
    }

    /// Durable event `seq` is applied: its slot starts.
    pub fn enter(&mut self, seq: u64) {
        *self = Position { event: seq, count: 0 };
    }

    /// Numbers the next action of the slot; `None` once the slot is full (only non-durable
    /// actions can fill it: the sender drops them, the log's next event brings the truth).
    pub fn next(&mut self) -> Option<u64> {
        if self.count + 1 >= STRIDE {
            return None;
        }
        self.count += 1;
        Some(self.server_seq())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_round_trips_and_grows() {
        let mut p = Position::default();
        p.enter(7);
        assert_eq!(p.next(), Some(7 * STRIDE + 1));
        assert_eq!(p.next(), Some(7 * STRIDE + 2));
        assert_eq!(Position::decode(p.server_seq()), Position { event: 7, count: 2 });
        let before = p.server_seq();
        p.enter(8);
        assert!(p.server_seq() > before, "a later event numbers past every action of the slot before");
        p.count = STRIDE - 1;
        assert_eq!(p.next(), None);
    }
}
