//! qproxy's options ([`crate::config::Options`]), as the layers see them.
//!
//! The options in force are [`LiveOptions`]: the image's defaults with the
//! revision's annotations applied, changed when the kubelet updates the
//! annotations file. A layer reads them as a request passes (one relaxed
//! atomic load), so a change applies to the requests that reach it after.
//! With no option on (the default) nothing else happens: a request carries
//! nothing more than it would without them.
//!
//! What an option needs to know of a request travels with it: a
//! [`WaitNote`], where the breaker notes the wait for the request log.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use http::Request;

use crate::config::{Opt, Options};

/// The options in force, shared by every connection of the main port.
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveOptions(Arc<AtomicU8>);

impl LiveOptions {
    /// Options starting as `options`.
    pub(crate) fn new(options: Options) -> Self {
        Self(Arc::new(AtomicU8::new(options.bits())))
    }

    /// The options in force.
    pub(crate) fn get(&self) -> Options {
        Options::from_bits(self.0.load(Ordering::Relaxed))
    }

    /// Whether `opt` is in force.
    pub(crate) fn has(&self, opt: Opt) -> bool {
        self.get().has(opt)
    }

    /// Puts `options` in force for the requests that arrive from now on.
    pub(crate) fn set(&self, options: Options) {
        self.0.store(options.bits(), Ordering::Relaxed);
    }
}

/// Where a request's wait for a slot is noted, for whoever reports it
/// once the request is done (its request log line). Put on the request by
/// that reporter; the breaker notes the wait in it.
#[derive(Debug, Default)]
pub(crate) struct WaitNote(AtomicU64);

impl WaitNote {
    /// A note on `req`, shared with the caller.
    pub(crate) fn attach<B>(req: &mut Request<B>) -> Arc<WaitNote> {
        let note = Arc::new(WaitNote::default());
        req.extensions_mut().insert(note.clone());
        note
    }

    /// The note on `req`, if any.
    pub(crate) fn of<B>(req: &Request<B>) -> Option<&Arc<WaitNote>> {
        req.extensions().get::<Arc<WaitNote>>()
    }

    /// Notes that the request waited `wait` for its slot.
    pub(crate) fn note(&self, wait: Duration) {
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.0.store(nanos, Ordering::Relaxed);
    }

    /// How long the request waited for its slot (zero with no breaker, or
    /// before it got one).
    pub(crate) fn wait(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_seen_by_the_next_reader() {
        let live = LiveOptions::new(Options::NONE);
        let copy = live.clone();
        assert!(!copy.has(Opt::RequestLogQueueWait));
        live.set(Options::NONE.with(Opt::RequestLogQueueWait, true));
        assert!(copy.has(Opt::RequestLogQueueWait));
        assert!(!copy.has(Opt::UpgradesOutliveTimeouts));
    }

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
