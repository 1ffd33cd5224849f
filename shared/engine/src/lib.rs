//! Turnstone's pure core: the decision protocol's types and the event-sourced session.
//!
//! Nothing here does I/O, spawns tasks or reads a clock: time and fresh ids come in through
//! [`session::Ctx`], so replaying a session's events rebuilds the identical state.

pub mod ids;
pub mod llm_format;
pub mod protocol;
#[cfg(feature = "schema")]
pub mod schema;
pub mod session;
pub mod time;

/// The length of `value` as JSON, counted as it is written (nothing is allocated for it): how
/// caches weigh what they hold. A value that cannot be written counts nothing.
pub fn json_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => 0,
    }
}

#[cfg(feature = "testing")]
pub mod testing;
