//! `Server-Timing` on the app's answers (the `server-timing` option).
//!
//! With the option on, each answer the proxy gives carries where its time
//! went, in milliseconds:
//!
//! ```text
//! Server-Timing: qproxy-queue;dur=12.031, app;dur=3.402
//! ```
//!
//! `qproxy-queue` is the wait for a slot in the breaker's queue (zero when
//! one was free, or with no limit); `app` runs from when the proxy got the
//! request to the answer's head: the app's own time and the trip to it. A
//! gRPC answer, whose head comes before the call's work is done, also gets
//! the field in its trailers, with `app` running to the trailers. A field
//! the app sent itself is kept; qproxy's comes after it.
//!
//! The proxy writes it because the proxy sees the app's time best. A
//! request that does not ask costs one look at the options: the timed
//! answer is a future of its own around the proxy's, so the common one
//! carries nothing more.

use std::time::{Duration, Instant};

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Request};

use qproxy_observe::waits::SlotWait;

/// The field (W3C Server Timing).
pub(crate) const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// A request whose answer gets `Server-Timing`: its wait for a slot, and
/// when the proxy got it.
#[derive(Debug)]
pub(crate) struct Timing {
    queue: Duration,
    since: Instant,
}

impl Timing {
    /// The timing of `req`, from now.
    pub(crate) fn start<B>(req: &Request<B>) -> Self {
        Timing {
            queue: SlotWait::of(req),
            since: Instant::now(),
        }
    }

    /// The field's value, with the app's time until now.
    fn value(&self) -> HeaderValue {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let text = format!(
            "qproxy-queue;dur={:.3}, app;dur={:.3}",
            ms(self.queue),
            ms(self.since.elapsed())
        );
        // Digits, letters and punctuation only.
        HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// Adds the field to `headers`.
    pub(crate) fn add_to(&self, headers: &mut HeaderMap) {
        headers.append(SERVER_TIMING, self.value());
    }
}

/// Whether an answer with these headers is a gRPC call's, whose head
/// comes before its work is done.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(headers: &HeaderMap) -> Vec<String> {
        headers
            .get_all(SERVER_TIMING)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_field_says_the_wait_and_the_app_s_time_after_the_app_s_own() {
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(SlotWait(Duration::from_micros(12_345)));
        let timing = Timing::start(&req);
        let mut headers = HeaderMap::new();
        headers.insert(SERVER_TIMING, HeaderValue::from_static("db;dur=1"));
        timing.add_to(&mut headers);
        let got = fields(&headers);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], "db;dur=1", "the app's own is kept, first");
        assert!(
            got[1].starts_with("qproxy-queue;dur=12.345, app;dur="),
            "{got:?}"
        );
    }

    #[test]
    fn without_a_wait_on_the_request_the_queue_is_zero() {
        let mut headers = HeaderMap::new();
        Timing::start(&Request::new(())).add_to(&mut headers);
        assert!(fields(&headers)[0].starts_with("qproxy-queue;dur=0.000, app;dur="));
    }

    #[test]
    fn grpc_answers_are_told_by_their_content_type() {
        let mut headers = HeaderMap::new();
        assert!(!is_grpc(&headers));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&headers));
    }
}
