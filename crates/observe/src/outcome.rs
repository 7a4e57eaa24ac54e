//! How a request ended, as Knative's handlers see it: what the observers
//! that write one entry per request (request metrics, request logs) record.
//!
//! Both follow a request the same way, each from its own place in the
//! stack: from its arrival until its response body is done with (sent
//! whole, cut off, or dropped by a client that went away), counting the
//! body bytes sent. [`Observed`] does that once for both; each observer
//! only says what to do with the result ([`Record`]).

use std::time::Duration;

use http::{Method, StatusCode};
use tokio::time::Instant;

use qproxy_core::body::Settle;

/// What an observer does with a request once it is over.
pub trait Record {
    /// Records the request that `ended` so.
    fn record(&mut self, ended: Ended);
}

/// How a request ended.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    /// The status Knative's handlers saw, or `None` for a body cut off
    /// (the app failed, the client left), which Go's proxy aborts.
    pub status: Option<u16>,
    /// The status of the response's head, as Knative's handlers saw it,
    /// whether or not its body was then cut off (the `502` of Knative's
    /// proxy error handler for a request that got none).
    pub answered: u16,
    /// Body bytes sent.
    pub size: u64,
    /// From the request's arrival at the observer to its end.
    pub elapsed: Duration,
}

/// A request followed to its end, recorded once by `R` when the guard is
/// dropped: with its response body, or, dropped before any response, as
/// the `502` Knative's proxy error handler gives a request that ends
/// without one.
#[derive(Debug)]
pub struct Observed<R: Record> {
    record: R,
    start: Instant,
    outcome: Outcome,
    size: u64,
}

impl<R: Record> Observed<R> {
    /// Starts following a request with `method`, to be recorded by `record`.
    pub fn new(method: &Method, record: R) -> Self {
        Self {
            record,
            start: Instant::now(),
            outcome: Outcome::new(method),
            size: 0,
        }
    }
}

impl<R: Record> Settle for Observed<R> {
    fn answered(&mut self, status: StatusCode) {
        self.outcome.answered(status);
    }

    fn data(&mut self, len: usize) {
        self.size += len as u64;
    }

    fn settle(&mut self, complete: bool) {
        self.outcome.settle(complete);
    }
}

impl<R: Record> Drop for Observed<R> {
    fn drop(&mut self) {
        self.record.record(Ended {
            status: self.outcome.status(),
            answered: self.outcome.status,
            size: self.size,
            elapsed: self.start.elapsed(),
        });
    }
}

/// The status of a request so far, with Go's quirks.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    /// A `HEAD` request: its body is never sent, which is no abort.
    head: bool,
    status: u16,
    /// Whether the body (if any) was sent whole.
    complete: bool,
}

impl Outcome {
    /// A request with `method`, not answered yet: until a response comes,
    /// the outcome is the `502` Knative's proxy error handler gives a
    /// request that ends without one.
    fn new(method: &Method) -> Self {
        Self {
            head: method == Method::HEAD,
            status: 502,
            complete: true,
        }
    }

    /// The request was answered with `status`.
    fn answered(&mut self, status: StatusCode) {
        // Go's proxy writes a 101 past the handlers, which see a 200.
        self.status = match status.as_u16() {
            101 => 200,
            s => s,
        };
        self.complete = self.head;
    }

    /// The body was done with; `complete` if it was sent whole.
    fn settle(&mut self, complete: bool) {
        self.complete |= complete;
    }

    /// The status recorded, or `None` for a body cut off, which Go's proxy
    /// aborts and Knative's handlers record as a `500`.
    fn status(&self) -> Option<u16> {
        self.complete.then_some(self.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};

    /// A status and a size, as recorded.
    type Entry = (Option<u16>, u64);

    #[derive(Debug, Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<Entry>>>);

    impl Record for Recorded {
        fn record(&mut self, ended: Ended) {
            if let Ok(mut seen) = self.0.lock() {
                seen.push((ended.status, ended.size));
            }
        }
    }

    fn ended(method: Method, steps: impl FnOnce(&mut Observed<Recorded>)) -> Entry {
        let seen = Recorded::default();
        let mut observed = Observed::new(&method, seen.clone());
        steps(&mut observed);
        drop(observed);
        let seen = seen.0.lock().unwrap();
        assert_eq!(seen.len(), 1, "recorded once");
        seen[0]
    }

    #[tokio::test]
    async fn records_once_with_go_s_statuses() {
        // Dropped before any response: Knative's error handler's 502.
        assert_eq!(ended(Method::GET, |_| {}), (Some(502), 0));
        // A body sent whole.
        let whole = ended(Method::GET, |o| {
            o.answered(StatusCode::CREATED);
            o.data(5);
            o.settle(true);
        });
        assert_eq!(whole, (Some(201), 5));
        // A body cut off: no status, Go's aborted handler.
        let cut = ended(Method::GET, |o| {
            o.answered(StatusCode::OK);
            o.data(3);
            o.settle(false);
        });
        assert_eq!(cut, (None, 3));
        // A HEAD's body is never sent, which is no abort.
        let head = ended(Method::HEAD, |o| {
            o.answered(StatusCode::OK);
            o.settle(false);
        });
        assert_eq!(head, (Some(200), 0));
        // An upgrade is the 200 Go's handlers see.
        let upgrade = ended(Method::GET, |o| {
            o.answered(StatusCode::SWITCHING_PROTOCOLS);
            o.settle(true);
        });
        assert_eq!(upgrade, (Some(200), 0));
    }
}
