//! Minting fresh ids deterministically from the entropy a command brings.

/// Mints ids from a seed: the same seed gives the same ids, so a command handled twice with
/// the same [`crate::session::Ctx`] yields identical events (the ids land in the events, so
/// replay never mints).
#[derive(Debug, Clone)]
pub struct IdMinter {
    state: u64,
}

impl IdMinter {
    /// A minter seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        IdMinter { state: seed }
    }

    /// The next 64 random-looking bits (splitmix64).
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A fresh id such as `call_3f9a0c1d2e4b5a69`.
    pub fn mint(&mut self, prefix: &str) -> String {
        format!("{prefix}_{:016x}", self.next_u64())
    }
}
