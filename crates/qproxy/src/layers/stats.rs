//! The autoscaler's request statistics, recorded where Knative's
//! `ProxyHandler` records them.
//!
//! Every request but a kubelet probe is counted in when it reaches this
//! layer (as *proxied* when `K-Proxy-Request: activator` says the activator
//! sent it) and out exactly once: when its response body has been sent,
//! when it is cancelled (the client went away, a timeout fired), or, for
//! an upgraded connection, when the tunnel closes.

use std::sync::Arc;
use std::task::{Context, Poll};

use autoscaler_client::{Clock, Event, MonotonicClock, RequestStats};
use http::{Request, Response};
use tower::{Layer, Service};

use crate::common::body::{Guarded, GuardedFuture, Settle};
use crate::common::facts::{HasFacts, facts};

/// Adds [`Stats`] to a stack.
#[derive(Debug, Clone)]
pub(crate) struct StatsLayer {
    stats: Arc<RequestStats>,
    clock: MonotonicClock,
}

impl StatsLayer {
    /// Records into `stats`, with times from `clock`.
    pub(crate) fn new(stats: Arc<RequestStats>, clock: MonotonicClock) -> Self {
        Self { stats, clock }
    }
}

impl<S> Layer<S> for StatsLayer {
    type Service = Stats<S>;

    fn layer(&self, inner: S) -> Stats<S> {
        Stats {
            inner,
            stats: self.stats.clone(),
            clock: self.clock,
        }
    }
}

/// Records each request's in and out events; see the [module docs](self).
#[derive(Debug, Clone)]
pub(crate) struct Stats<S> {
    inner: S,
    stats: Arc<RequestStats>,
    clock: MonotonicClock,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Stats<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: HasFacts,
    ResBody: http_body::Body,
{
    type Response = Response<StatsBody<ResBody>>;
    type Error = S::Error;
    type Future = GuardedFuture<S::Future, InFlight>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let facts = facts(&req);
        let guard = (!facts.is_kubelet_probe())
            .then(|| InFlight::enter(self.stats.clone(), self.clock, facts.activator_proxied()));
        GuardedFuture::new(self.inner.call(req), guard)
    }
}

/// A request counted in; dropping it counts it out.
#[derive(Debug)]
pub(crate) struct InFlight {
    stats: Arc<RequestStats>,
    clock: MonotonicClock,
    proxied: bool,
}

impl InFlight {
    fn enter(stats: Arc<RequestStats>, clock: MonotonicClock, proxied: bool) -> Self {
        let event = if proxied { Event::ProxiedIn } else { Event::In };
        stats.record(event, clock.now());
        InFlight {
            stats,
            clock,
            proxied,
        }
    }
}

impl Settle for InFlight {}

impl Drop for InFlight {
    fn drop(&mut self) {
        let event = if self.proxied {
            Event::ProxiedOut
        } else {
            Event::Out
        };
        self.stats.record(event, self.clock.now());
    }
}

/// A response body that counts its request out when it ends, fails or is
/// dropped.
pub(crate) type StatsBody<B> = Guarded<B, InFlight>;
