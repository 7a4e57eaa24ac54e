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
//! | drainer, health checks     | [`HealthLayer`]                 |
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
//! The layers that only follow a request (logs, spans, metrics, stats,
//! and the two rewrites) are [`Observe`](qproxy_observe::observing::Observe)rs:
//! those with no answering layer between them (the drainer, the timeouts,
//! the breaker) are served as one group, in the table's order, so that a
//! request is moved into one `call` per group rather than one per layer,
//! and its response is wrapped once per group.
//!
//! Layers that hold something for the life of a request (the breaker slot,
//! the timeouts) hold it in the response body, which the client's
//! connection drops once the response is written. A Go handler of an
//! upgraded (WebSocket) request returns only when the connection closes;
//! [`UpgradeHoldLayer`], outside all of them, keeps a `101`'s body until
//! then.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use qproxy_core::body::RequestBody;
use tower::{Service, ServiceBuilder};

use qproxy_autoscaler_client::{MonotonicClock, RequestStats};
use qproxy_breaker::{Breaker, PermitBody};

use crate::config::{Generation, LiveOptions, Timeouts};
use crate::drain::Drainer;
use crate::layers::RewriteLayer;
use crate::layers::concurrency;
use crate::layers::forwarded::ForwardedShim;
use crate::layers::health::HealthLayer;
use crate::layers::host_rewrite::HostRewrite;
use crate::layers::server_rules::ServerRulesLayer;
use crate::layers::timeout::{TimeoutBody, TimeoutLayer};
use crate::layers::upgrade::UpgradeHoldLayer;
use crate::proxy::Proxy;
use crate::proxy::body::ProxyBody;
use crate::readiness::Readiness;
use crate::tunnel_registry::Tunnels;
use qproxy_observe::autoscaler_stats::layer::StatsLayer;
use qproxy_observe::observing::{ObservedBody, observe};
use qproxy_observe::request_log::layer::{LoggedBody, RequestLogLayer};
use qproxy_observe::request_metrics::layer::MetricsLayer;
use qproxy_observe::traces::layer::TraceLayer;
use qproxy_observe::{Observers, OwnMetrics};
use qproxy_transport::connector::Connector;

/// The response body of the main port.
pub(crate) type MainBody = LoggedBody<
    ObservedBody<
        TimeoutBody<
            ObservedBody<PermitBody<ObservedBody<ProxyBody, AppObservers>>, ProxyObservers>,
        >,
        RevisionObservers,
    >,
>;

/// State shared by every connection of the main port.
#[derive(Debug, Clone)]
pub(crate) struct PortState {
    /// The user container.
    pub(crate) upstream: Arc<Connector>,
    /// `containerConcurrency`, when limited.
    pub(crate) breaker: Option<Breaker>,
    /// The revision's timeouts.
    pub(crate) timeouts: Timeouts,
    /// Which Knative started us, for the timeouts' rules.
    pub(crate) generation: Generation,
    /// The autoscaler's request statistics.
    pub(crate) stats: Arc<RequestStats>,
    /// The clock of those statistics.
    pub(crate) clock: MonotonicClock,
    /// The drain of the main port.
    pub(crate) drainer: Drainer,
    /// The user container's readiness, for health checks.
    pub(crate) readiness: Readiness,
    /// The upgraded connections open.
    pub(crate) tunnels: Tunnels,
    /// Request metrics, request logs and traces, as configured.
    pub(crate) observers: Observers,
    /// qproxy's own metrics: the start-up's spans (marked by health checks
    /// and the proxy) and the queue's waits (told by the breaker).
    pub(crate) own_metrics: OwnMetrics,
    /// qproxy's options in force, read by the layers as a request passes.
    pub(crate) options: LiveOptions,
}

/// The service handling the requests of one main-port connection.
pub(crate) fn main_service(
    port: &PortState,
    remote: SocketAddr,
) -> impl Service<
    Request<RequestBody>,
    Response = Response<MainBody>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ use<> {
    let observers = &port.observers;
    ServiceBuilder::new()
        .layer(ServerRulesLayer)
        .layer(UpgradeHoldLayer::new(port.tunnels.clone()))
        .layer(RequestLogLayer::new(
            observers.request_log.clone(),
            remote,
            port.options.clone(),
        ))
        .layer(HealthLayer::new(
            port.drainer.clone(),
            port.readiness.clone(),
            port.own_metrics.startup.clone(),
        ))
        .layer(observe(revision_observers(port, remote)))
        .layer(TimeoutLayer::new(
            port.timeouts,
            port.generation,
            port.options.clone(),
        ))
        .layer(observe(proxy_observers(port)))
        .layer(concurrency::layer(
            port.breaker.clone(),
            port.own_metrics.queue_wait.clone(),
            port.options.clone(),
        ))
        .layer(observe(app_observers(port)))
        .service(Proxy::new(
            port.upstream.clone(),
            remote.ip(),
            port.own_metrics.startup.clone(),
            port.options.clone(),
        ))
}

/// Between the drainer and the timeouts: the server span, then the
/// revision's request metrics.
type RevisionObservers = (TraceLayer, MetricsLayer);

fn revision_observers(port: &PortState, remote: SocketAddr) -> RevisionObservers {
    let observers = &port.observers;
    (
        TraceLayer::server(observers.traces.clone(), remote),
        MetricsLayer::revision(observers.request_metrics.clone()),
    )
}

/// Between the timeouts and the breaker: the `Forwarded` shim, the proxy
/// and wait spans, the autoscaler's stats, the `K-Original-Host` rewrite.
type ProxyObservers = (
    RewriteLayer<ForwardedShim>,
    TraceLayer,
    StatsLayer,
    RewriteLayer<HostRewrite>,
);

fn proxy_observers(port: &PortState) -> ProxyObservers {
    (
        RewriteLayer::new(ForwardedShim),
        TraceLayer::proxy(port.observers.traces.clone(), port.breaker.is_some()),
        StatsLayer::new(port.stats.clone(), port.clock),
        RewriteLayer::new(HostRewrite),
    )
}

/// Past the breaker: the client span, then the app's request metrics.
type AppObservers = (TraceLayer, MetricsLayer);

fn app_observers(port: &PortState) -> AppObservers {
    let observers = &port.observers;
    (
        TraceLayer::client(observers.traces.clone()),
        MetricsLayer::app(observers.request_metrics.clone(), port.breaker.clone()),
    )
}
