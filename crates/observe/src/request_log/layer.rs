//! Request logs, taken where Knative's `RequestLogHandler` takes them:
//! outside the drainer, so that health checks are seen (and logged when
//! probe logging is on).
//!
//! A line is written when the response is done with: its body sent (or
//! cut off, or abandoned by the client), an upgraded connection closed, or
//! the request given up before any response. The status logged is the one
//! Go's handlers see: `500` with no size for a body cut off (Go's proxy
//! aborts the handler), `200` for an upgrade (Go's proxy writes the `101`
//! past them), `502` for a request dropped before its response (Knative's
//! proxy error handler answers a cancelled request so). Without a request
//! log, the layer passes everything through untouched.
//!
//! With the `request-log-queue-wait` option, a line's template may also
//! read the request's wait for a slot (`.Response.QueueWait`): the layer
//! puts a [`WaitNote`] on the request, and the breaker notes the wait in
//! it.

use std::net::SocketAddr;
use std::sync::Arc;

use http::Request;
use tower::Layer;

use crate::observing::{Observe, Observing};
use crate::outcome::{Ended, Observed, Record};
use crate::request_log::{Arrived, SharedRequestLog};
use crate::waits::WaitNote;
use qproxy_core::body::Guarded;
use qproxy_core::config::{LiveOptions, Opt};
use qproxy_core::facts::{HasFacts, facts};

/// Logs each request; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct RequestLogLayer {
    log: Option<SharedRequestLog>,
    remote: SocketAddr,
    options: LiveOptions,
}

impl RequestLogLayer {
    /// Logs the requests of a connection from `remote` to `log`, if any,
    /// with the queue's wait when `options` ask.
    pub fn new(log: Option<SharedRequestLog>, remote: SocketAddr, options: LiveOptions) -> Self {
        Self {
            log,
            remote,
            options,
        }
    }
}

impl<S> Layer<S> for RequestLogLayer {
    type Service = Observing<RequestLogLayer, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observing::new(self.clone(), inner)
    }
}

impl Observe for RequestLogLayer {
    type Guard = Box<Observed<Entry>>;

    fn enter<B: http_body::Body + HasFacts>(
        &self,
        req: &mut Request<B>,
    ) -> Option<Box<Observed<Entry>>> {
        match &self.log {
            Some(log) if log.logs_probes() || !facts(req).is_probe() => {
                let wait = self
                    .options
                    .has(Opt::RequestLogQueueWait)
                    .then(|| WaitNote::attach(req));
                Some(Box::new(Observed::new(
                    req.method(),
                    Entry {
                        arrived: log.arrived(req, self.remote),
                        log: log.clone(),
                        wait,
                    },
                )))
            }
            _ => None,
        }
    }
}

/// The response body of a [`RequestLogLayer`].
pub type LoggedBody<B> = Guarded<B, Box<Observed<Entry>>>;

/// A request whose line is yet to be written.
#[derive(Debug)]
pub struct Entry {
    log: SharedRequestLog,
    arrived: Arrived,
    /// With the `request-log-queue-wait` option: where the wait is noted.
    wait: Option<Arc<WaitNote>>,
}

impl Record for Entry {
    fn record(&mut self, ended: Ended) {
        // A body cut off is logged as Go's aborted handler: 500, no size.
        let (status, size) = match ended.status {
            Some(status) => (status, ended.size),
            None => (500, 0),
        };
        let queue_wait = self.wait.as_ref().map(|note| note.wait());
        self.log
            .write(&self.arrived, status, size, ended.elapsed, queue_wait);
    }
}
