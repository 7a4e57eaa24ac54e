//! The small servers beside the main port: admin (8022), autoscaler stats
//! (9090) and user metrics (9091).
//!
//! Each answers like Go's `http.ServeMux` with one route: its path, any
//! method; anything else is `404 page not found`. `/wait-for-drain` drains
//! (see [`Admin`]); the stats `/metrics` serves the latest autoscaler
//! `Stat`; the user metrics `/metrics` serves the request metrics.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use autoscaler_client::Reporter;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::watch;

use crate::body::Body;
use crate::drain::Drainer;
use crate::observe::UserMetrics;
use crate::proxy::plain_text;

/// Path of the drain hook the user container's preStop calls.
pub const WAIT_FOR_DRAIN: &str = "/wait-for-drain";
/// Path of the stats and metrics endpoints.
pub const METRICS: &str = "/metrics";

/// What one of the small servers does with each request.
pub trait Endpoint: Clone + Send + Sync + 'static {
    /// Answers `req`.
    fn respond(self, req: Request<Incoming>) -> impl Future<Output = Response<Body>> + Send;
}

impl Endpoint for Admin {
    fn respond(self, req: Request<Incoming>) -> impl Future<Output = Response<Body>> + Send {
        self.answer(req)
    }
}

impl Endpoint for StatsEndpoint {
    fn respond(self, req: Request<Incoming>) -> impl Future<Output = Response<Body>> + Send {
        std::future::ready(self.answer(&req))
    }
}

impl Endpoint for crate::profiling::Profiling {
    fn respond(self, req: Request<Incoming>) -> impl Future<Output = Response<Body>> + Send {
        self.answer(req)
    }
}

/// The user metrics server on 9091: classic Knative's request metrics as
/// Prometheus text (an empty exposition where none are kept).
#[derive(Debug, Clone)]
pub struct MetricsEndpoint {
    /// The metrics, when kept.
    pub request_metrics: Option<UserMetrics>,
}

impl Endpoint for MetricsEndpoint {
    fn respond(self, req: Request<Incoming>) -> impl Future<Output = Response<Body>> + Send {
        std::future::ready(metrics(&req, self.request_metrics.as_ref()))
    }
}

/// How long `/wait-for-drain` waits for `SIGTERM` before calling its
/// drain off.
pub const TERM_GRACE: Duration = Duration::from_secs(1);

/// The admin server on 8022.
///
/// `/wait-for-drain` is the user container's preStop hook: it starts the
/// main port's drain (or joins the one under way) and answers an empty
/// `200` once the drain completes. A preStop hook also runs when the
/// kubelet restarts a user container that failed its liveness probe, and
/// then no `SIGTERM` follows: so if none arrives within [`TERM_GRACE`],
/// the drain is reset and the proxy serves on as before.
#[derive(Debug, Clone)]
pub struct Admin {
    /// The main port's drain.
    pub drainer: Drainer,
    /// Turns `true` once `SIGTERM` (or `SIGINT`) has arrived.
    pub terminating: watch::Receiver<bool>,
}

impl Admin {
    /// Answers `req`.
    pub async fn answer<B>(self, req: Request<B>) -> Response<Body> {
        if req.uri().path() != WAIT_FOR_DRAIN {
            return not_found();
        }
        tracing::info!("Attached drain handler from user-container");
        let Admin {
            drainer,
            mut terminating,
        } = self;
        let reset = drainer.clone();
        tokio::spawn(async move {
            let term = async {
                // A closed channel means the process is stopping anyway.
                let _ = terminating.wait_for(|t| *t).await;
            };
            if tokio::time::timeout(TERM_GRACE, term).await.is_err() {
                reset.reset();
            }
        });
        drainer.drain().await;
        Response::new(Body::empty())
    }
}

/// What the autoscaler stats server on 9090 serves.
#[derive(Debug, Clone)]
pub struct StatsEndpoint {
    /// The latest stat.
    pub reporter: Arc<Reporter>,
}

impl StatsEndpoint {
    /// Answers `req`: the latest `Stat` as protobuf, whatever the client
    /// accepts, as Knative's queue-proxy answers (its handler still reads
    /// "protobuf or prometheus, depending on the Accept header", but has
    /// served protobuf alone since the Prometheus reporter was removed).
    pub fn answer<B>(&self, req: &Request<B>) -> Response<Body> {
        if req.uri().path() != METRICS {
            return not_found();
        }
        let mut res = Response::new(Body::full(self.reporter.latest().protobuf.clone()));
        res.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
        res
    }
}

/// Knative's `ProtobufMIMEType`.
const PROTOBUF: &str = "application/protobuf";
/// The Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Answers a request to the user metrics server.
fn metrics<B>(req: &Request<B>, request_metrics: Option<&UserMetrics>) -> Response<Body> {
    if req.uri().path() != METRICS {
        return not_found();
    }
    let text = request_metrics.map(UserMetrics::render).unwrap_or_default();
    let mut res = Response::new(Body::full(text));
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_TEXT));
    res
}

/// Go's `http.NotFound`.
pub fn not_found() -> Response<Body> {
    plain_text(StatusCode::NOT_FOUND, "404 page not found\n")
}
