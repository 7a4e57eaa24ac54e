//! A request's wait for a slot in the breaker's queue, carried with the
//! request to whoever reports it.
//!
//! The breaker learns the wait as it hands the request on; qproxy's
//! options report it further in, or once the request is done:
//!
//! - [`WaitNote`]: put on the request by the request log layer (the
//!   `request-log-queue-wait` option), which keeps a handle; the breaker
//!   notes the wait in it, and the log line reads it at the end;
//! - [`SlotWait`]: the wait itself, put on the request by the breaker when
//!   the `server-timing` option is on, for the proxy that writes the field.
//!
//! With neither option on, a request carries neither.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::Request;

/// Where a request's wait for a slot is noted, for whoever reports it
/// once the request is done.
#[derive(Debug, Default)]
pub struct WaitNote(AtomicU64);

impl WaitNote {
    /// A note on `req`, shared with the caller.
    pub fn attach<B>(req: &mut Request<B>) -> Arc<WaitNote> {
        let note = Arc::new(WaitNote::default());
        req.extensions_mut().insert(note.clone());
        note
    }

    /// The note on `req`, if any.
    pub fn of<B>(req: &Request<B>) -> Option<&Arc<WaitNote>> {
        req.extensions().get::<Arc<WaitNote>>()
    }

    /// Notes that the request waited `wait` for its slot.
    pub fn note(&self, wait: Duration) {
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.0.store(nanos, Ordering::Relaxed);
    }

    /// How long the request waited for its slot (zero with no breaker, or
    /// before it got one).
    pub fn wait(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

/// The wait for a slot, as the breaker put it on the request.
#[derive(Debug, Clone, Copy)]
pub struct SlotWait(pub Duration);

impl SlotWait {
    /// The wait on `req`: zero when none was put there (no breaker, or an
    /// exempt request).
    pub fn of<B>(req: &Request<B>) -> Duration {
        req.extensions()
            .get::<SlotWait>()
            .map_or(Duration::ZERO, |w| w.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_carries_the_wait_to_whoever_attached_it() {
        let mut req = Request::new(());
        assert!(WaitNote::of(&req).is_none());
        let note = WaitNote::attach(&mut req);
        assert_eq!(note.wait(), Duration::ZERO);
        WaitNote::of(&req).unwrap().note(Duration::from_millis(7));
        assert_eq!(note.wait(), Duration::from_millis(7));
    }
}
