//! Where the statistics get their time from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::stats::Nanos;

/// A monotonic source of [`Nanos`].
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's origin.
    fn now(&self) -> Nanos;
}

/// The system's monotonic clock, counted from when this value was made.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told, for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock at `now`.
    pub fn at(now: Nanos) -> Self {
        ManualClock {
            now: AtomicU64::new(now),
        }
    }

    /// Moves the clock forward by `by` nanoseconds.
    pub fn advance(&self, by: Nanos) {
        self.now.fetch_add(by, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Relaxed)
    }
}
