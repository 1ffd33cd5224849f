//! The worker webhook client.
