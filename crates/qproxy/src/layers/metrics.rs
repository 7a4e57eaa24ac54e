//! Request metrics, measured where Knative's handlers measure them: as a
//! request reaches the queue-proxy (outside the timeouts, so a timed-out
//! request counts as its `504`), and as it goes to the user container
//! (inside the breaker; the queue depth is taken as it enters).
//!
//! A request is measured from when it reaches the layer until its response
//! body has been sent (or the client went away); an upgraded connection,
//! until it closes. The status counted is the response's, with Go's
//! server's quirks: one that ends without a response from the layers below
//! (cancelled by the client or a timeout) counts as a `502`, as Knative's
//! proxy error handler answers it; a response whose body was cut off (the
//! app failed, the client left) counts as a `500`, as Knative's handlers
//! record the proxy's aborted handler; an upgrade counts as a `200`, since
//! Go's proxy writes the `101` past the handlers. Probes are not measured
//! (but the queue depth is taken as they pass, as Knative takes it), but
//! for one case: current Knative's HTTP client measures every request it
//! sends the app, a probe passed on (`K-Kubelet-Probe`) too, without a
//! route tag. Without request metrics, the layer passes everything through
//! untouched.
//!
//! The same two places feed classic Knative's series
//! ([`crate::observe::opencensus_metrics`]) or current Knative's instruments
//! ([`crate::observe::otel_metrics`]): the server's and the client's
//! HTTP instruments, and the invocation duration.

use std::borrow::Cow;
use std::task::{Context, Poll};

use breaker::Breaker;
use http::{Request, Response};
use tower::{Layer, Service};

use crate::common::body::{Guarded, GuardedFuture};
use crate::common::headers::is_probe;
use crate::common::outcome::{Ended, Observed, Record};
use crate::observe::UserMetrics;
use crate::observe::opencensus_metrics::{OpenCensusMetrics, Scope, route_tag_unless_probe};
use crate::observe::otel_metrics::{HttpAttributes, OtelMetrics};

/// Adds [`Metrics`] to a stack.
#[derive(Debug, Clone)]
pub(crate) struct MetricsLayer {
    metrics: Option<UserMetrics>,
    scope: Scope,
    breaker: Option<Breaker>,
}

impl MetricsLayer {
    /// Measures requests as they reach the queue-proxy.
    pub(crate) fn revision(metrics: Option<UserMetrics>) -> Self {
        Self {
            metrics,
            scope: Scope::Revision,
            breaker: None,
        }
    }

    /// Measures requests as they go to the user container, and the depth
    /// of `breaker`'s queue.
    pub(crate) fn app(metrics: Option<UserMetrics>, breaker: Option<Breaker>) -> Self {
        Self {
            metrics,
            scope: Scope::App,
            breaker,
        }
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = Metrics<S>;

    fn layer(&self, inner: S) -> Metrics<S> {
        Metrics {
            inner,
            layer: self.clone(),
        }
    }
}

/// Measures each request; see the [module docs](self).
#[derive(Debug, Clone)]
pub(crate) struct Metrics<S> {
    inner: S,
    layer: MetricsLayer,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Metrics<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: http_body::Body,
    ResBody: http_body::Body,
{
    type Response = Response<MetricsBody<ResBody>>;
    type Error = S::Error;
    type Future = GuardedFuture<S::Future, Observed<Measuring>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let layer = &self.layer;
        if let (Some(metrics), Some(breaker)) = (&layer.metrics, &layer.breaker) {
            // Taken for every request, probes too, as Knative takes it.
            metrics.set_queue_depth(breaker.in_flight());
        }
        // Probes are not measured, but for current Knative's HTTP client
        // (see `HttpAttributes`), which measures those the proxy passes on.
        let series = match &layer.metrics {
            Some(UserMetrics::Classic(m)) => {
                let tag = match layer.scope {
                    Scope::Revision => route_tag_unless_probe(req.headers()),
                    Scope::App => (!is_probe(req.headers())).then_some(Cow::Borrowed("")),
                };
                tag.map(|tag| MetricsTarget::Classic(m.clone(), tag))
            }
            Some(UserMetrics::Current(m)) => (layer.scope == Scope::App
                || !is_probe(req.headers()))
            .then(|| MetricsTarget::Current(m.clone(), Box::new(HttpAttributes::of(&req)))),
            None => None,
        };
        let measuring = series.map(|series| {
            Observed::new(
                req.method(),
                Measuring {
                    series,
                    scope: layer.scope,
                },
            )
        });
        GuardedFuture::new(self.inner.call(req), measuring)
    }
}

/// Where a request is recorded once it is over: its series, and which
/// of the two places measured it.
#[derive(Debug)]
pub(crate) struct Measuring {
    series: MetricsTarget,
    scope: Scope,
}

/// Where a request is recorded, and what chooses its series beyond its
/// status.
#[derive(Debug)]
enum MetricsTarget {
    /// Classic Knative's, by route tag (empty for the app's series).
    Classic(OpenCensusMetrics, Cow<'static, str>),
    /// Current Knative's, by the request's HTTP attributes.
    Current(OtelMetrics, Box<HttpAttributes>),
}

impl Record for Measuring {
    fn record(&mut self, ended: Ended) {
        // A body cut off counts as Go's aborted handler: 500.
        let status = ended.status.unwrap_or(500);
        match &self.series {
            MetricsTarget::Classic(m, tag) => {
                m.series(self.scope, status, tag).record(ended.elapsed)
            }
            MetricsTarget::Current(m, attributes) => match self.scope {
                Scope::Revision => m.record_server(attributes, status, ended.size, ended.elapsed),
                Scope::App => m.record_app(attributes, status, ended.elapsed),
            },
        }
    }
}

/// The response body of [`Metrics`].
pub(crate) type MetricsBody<B> = Guarded<B, Observed<Measuring>>;
