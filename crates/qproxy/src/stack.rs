//! The main port's request handling, assembled in one place.
//!
//! Knative's queue-proxy wraps its reverse proxy in handlers; qproxy does the
//! same with tower layers, one concern per module, in the same order. Read
//! the list top to bottom as the path of a request:
//!
//! | Knative handler            | qproxy                          |
//! |----------------------------|---------------------------------|
//! | Go's `net/http` server     | [`ServerRulesLayer`]            |
//! | (handler lifetimes)        | [`UpgradeHoldLayer`]            |
//! | request log                | [`RequestLogLayer`]             |
//! | drainer, health checks     | [`DrainLayer`]                  |
//! | hijack tracker             | [`UpgradeHoldLayer`]'s [`Tunnels`] |
//! | tracing                    | [`TraceLayer::server`]          |
//! | request metrics            | [`MetricsLayer::revision`]      |
//! | route tag                  | [`MetricsLayer::revision`]      |
//! | timeouts                   | [`TimeoutLayer`]                |
//! | forwarded shim             | [`ForwardedShim`]               |
//! | proxy and wait spans       | [`TraceLayer::proxy`]           |
//! | stats                      | [`StatsLayer`]                  |
//! | `K-Original-Host` rewrite  | [`HostRewrite`]                 |
//! | breaker                    | [`concurrency::layer`]          |
//! | client span, trace headers | [`TraceLayer::client`]          |
//! | app request metrics        | [`MetricsLayer::app`]           |
//! | reverse proxy              | [`Proxy`]                       |
//!
//! The order is classic Knative's (serving v0.42), where the request
//! metrics and the server span sit inside the drainer; current Knative
//! measures and traces from outside it, which differs only for the
//! health checks the drainer answers, and those are not measured or traced
//! in either.
//!
//! Layers that hold something for the life of a request (the breaker slot,
//! the timeouts) hold it in the response body, which the client's
//! connection drops once the response is written. A Go handler of an
//! upgraded (WebSocket) request returns only when the connection closes;
//! [`UpgradeHoldLayer`], outside all of them, keeps a `101`'s body until
//! then.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::{Service, ServiceBuilder};

use autoscaler_client::{MonotonicClock, RequestStats};
use breaker::{Breaker, PermitBody};

use crate::body::Body;
use crate::config::Generation;
use crate::config::Timeouts;
use crate::drain::Drainer;
use crate::layers::RewriteLayer;
use crate::layers::concurrency;
use crate::layers::drain::DrainLayer;
use crate::layers::forwarded::ForwardedShim;
use crate::layers::host_rewrite::HostRewrite;
use crate::layers::metrics::{MetricsBody, MetricsLayer};
use crate::layers::request_log::{LoggedBody, RequestLogLayer};
use crate::layers::server_rules::ServerRulesLayer;
use crate::layers::stats::{StatsBody, StatsLayer};
use crate::layers::timeout::{TimeoutBody, TimeoutLayer};
use crate::layers::trace::{TraceLayer, TracedBody};
use crate::layers::upgrade::{Tunnels, UpgradeHoldLayer};
use crate::observe::UserMetrics;
use crate::observe::request_log::SharedRequestLog;
use crate::observe::traces::Traces;
use crate::proxy::{Proxy, Upstream};
use crate::readiness::Readiness;
use crate::server::Conn;

/// The response body of the main port.
pub type MainBody = LoggedBody<
    TracedBody<
        MetricsBody<TimeoutBody<TracedBody<StatsBody<PermitBody<TracedBody<MetricsBody<Body>>>>>>>,
    >,
>;

/// State shared by every connection of the main port.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The user container.
    pub upstream: Arc<Upstream>,
    /// `containerConcurrency`, when limited.
    pub breaker: Option<Breaker>,
    /// The revision's timeouts.
    pub timeouts: Timeouts,
    /// Which Knative started us, for the timeouts' rules.
    pub generation: Generation,
    /// The autoscaler's request statistics.
    pub stats: Arc<RequestStats>,
    /// The clock of those statistics.
    pub clock: MonotonicClock,
    /// The drain of the main port.
    pub drainer: Drainer,
    /// The user container's readiness, for health checks.
    pub readiness: Readiness,
    /// The upgraded connections open.
    pub tunnels: Tunnels,
    /// Request metrics, when served.
    pub request_metrics: Option<UserMetrics>,
    /// The request log, when enabled.
    pub request_log: Option<SharedRequestLog>,
    /// Traces, when exported.
    pub traces: Option<Traces>,
}

/// The service handling the requests of one main-port connection.
pub fn main_service(
    shared: &Shared,
    conn: Conn,
) -> impl Service<
    Request<Incoming>,
    Response = Response<MainBody>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ use<> {
    ServiceBuilder::new()
        .layer(ServerRulesLayer)
        .layer(UpgradeHoldLayer::new(shared.tunnels.clone()))
        .layer(RequestLogLayer::new(
            shared.request_log.clone(),
            conn.remote,
        ))
        .layer(DrainLayer::new(
            shared.drainer.clone(),
            shared.readiness.clone(),
        ))
        .layer(TraceLayer::server(shared.traces.clone(), conn.remote))
        .layer(MetricsLayer::revision(shared.request_metrics.clone()))
        .layer(TimeoutLayer::new(shared.timeouts, shared.generation))
        .layer(RewriteLayer::new(ForwardedShim))
        .layer(TraceLayer::proxy(
            shared.traces.clone(),
            shared.breaker.is_some(),
        ))
        .layer(StatsLayer::new(shared.stats.clone(), shared.clock))
        .layer(RewriteLayer::new(HostRewrite))
        .layer(concurrency::layer(shared.breaker.clone()))
        .layer(TraceLayer::client(shared.traces.clone()))
        .layer(MetricsLayer::app(
            shared.request_metrics.clone(),
            shared.breaker.clone(),
        ))
        .service(Proxy::new(shared.upstream.clone(), conn.remote.ip()))
}
