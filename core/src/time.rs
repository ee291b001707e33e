//! Time as a value. The core never reads a clock: every input carries `now`.

use serde::{Deserialize, Serialize};

/// A point in time in milliseconds on the embedder's monotonic clock.
///
/// The origin is the embedder's choice (process start, simulated zero); only differences
/// matter. Arithmetic saturates, so a fuzzer or a clock jump can pass any value.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The earliest time.
    pub const ZERO: Timestamp = Timestamp(0);
    /// The latest representable time; a deadline here never fires.
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// A timestamp `ms` milliseconds after the origin.
    pub const fn from_millis(ms: u64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the origin.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// `self + ms`, saturating at [`Timestamp::MAX`].
    #[must_use]
    pub const fn plus_millis(self, ms: u64) -> Self {
        Timestamp(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub const fn millis_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
