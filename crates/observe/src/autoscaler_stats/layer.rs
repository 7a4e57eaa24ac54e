//! The autoscaler's request statistics, recorded where Knative's
//! `ProxyHandler` records them.
//!
//! Every request but a kubelet probe is counted in when it reaches this
//! layer (as *proxied* when `K-Proxy-Request: activator` says the activator
//! sent it) and out exactly once: when its response body has been sent,
//! when it is cancelled (the client went away, a timeout fired), or, for
//! an upgraded connection, when the tunnel closes.

use std::sync::Arc;

use http::Request;
use qproxy_autoscaler_client::{Clock, Event, MonotonicClock, RequestStats};
use tower::Layer;

use crate::observing::{Observe, Observing};
use qproxy_core::body::Settle;
use qproxy_core::facts::{HasFacts, facts};

/// Records each request's in and out events; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct StatsLayer {
    stats: Arc<RequestStats>,
    clock: MonotonicClock,
}

impl StatsLayer {
    /// Records into `stats`, with times from `clock`.
    pub fn new(stats: Arc<RequestStats>, clock: MonotonicClock) -> Self {
        Self { stats, clock }
    }
}

impl<S> Layer<S> for StatsLayer {
    type Service = Observing<StatsLayer, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observing::new(self.clone(), inner)
    }
}

impl Observe for StatsLayer {
    type Guard = InFlight;

    fn enter<B: http_body::Body + HasFacts>(&self, req: &mut Request<B>) -> Option<InFlight> {
        let facts = facts(req);
        (!facts.is_kubelet_probe())
            .then(|| InFlight::enter(self.stats.clone(), self.clock, facts.activator_proxied()))
    }
}

/// A request counted in; dropping it counts it out.
#[derive(Debug)]
pub struct InFlight {
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
