//! The small servers beside the main port: admin (8022), autoscaler stats
//! (9090) and user metrics (9091).
//!
//! Each answers like Go's `http.ServeMux` with one route: its path, any
//! method; anything else is `404 page not found`. The stats `/metrics`
//! serves the latest autoscaler `Stat`; the others are placeholders until
//! the drain and metrics pieces fill them: `/wait-for-drain` answers `501`,
//! the user metrics `/metrics` an empty Prometheus exposition.

use std::convert::Infallible;
use std::sync::Arc;

use autoscaler_client::Reporter;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::body::Body;
use crate::proxy::plain_text;

/// Path of the drain hook the user container's preStop calls.
pub const WAIT_FOR_DRAIN: &str = "/wait-for-drain";
/// Path of the stats and metrics endpoints.
pub const METRICS: &str = "/metrics";

/// Admin server on 8022.
pub async fn admin(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    Ok(match req.uri().path() {
        WAIT_FOR_DRAIN => not_implemented(),
        _ => not_found(),
    })
}

/// What the autoscaler stats server on 9090 serves.
#[derive(Debug, Clone)]
pub struct StatsEndpoint {
    /// The latest stat.
    pub reporter: Arc<Reporter>,
    /// Labels of the Prometheus rendering: the revision and the pod.
    pub labels: Arc<[(&'static str, String)]>,
}

impl StatsEndpoint {
    /// Answers `req`: the latest `Stat` as protobuf (what Knative's
    /// autoscaler asks for, and the default), or as Prometheus gauges when
    /// the client asks for `text/plain` and not for protobuf.
    pub fn answer<B>(&self, req: &Request<B>) -> Response<Body> {
        if req.uri().path() != METRICS {
            return not_found();
        }
        let asks_for = |media: &str| {
            req.headers()
                .get_all(ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|v| v.contains(media))
        };
        let text = asks_for("text/plain") && !asks_for(PROTOBUF);
        let (content_type, body) = if text {
            let labels: Vec<_> = self.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            (
                PROMETHEUS_TEXT,
                Body::full(self.reporter.prometheus_text(&labels)),
            )
        } else {
            (
                PROTOBUF,
                Body::full(self.reporter.latest().protobuf.clone()),
            )
        };
        let mut res = Response::new(body);
        res.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        res
    }
}

/// Knative's `ProtobufMIMEType`.
const PROTOBUF: &str = "application/protobuf";
/// The Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// User metrics server on 9091 (Prometheus text).
pub async fn metrics(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    Ok(match req.uri().path() {
        METRICS => {
            let mut res = Response::new(Body::empty());
            res.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_TEXT));
            res
        }
        _ => not_found(),
    })
}

/// Go's `http.NotFound`.
pub fn not_found() -> Response<Body> {
    plain_text(StatusCode::NOT_FOUND, "404 page not found\n")
}

fn not_implemented() -> Response<Body> {
    plain_text(StatusCode::NOT_IMPLEMENTED, "not implemented yet\n")
}
