//! The small servers beside the main port: admin (8022), autoscaler stats
//! (9090) and user metrics (9091).
//!
//! Each answers like Go's `http.ServeMux` with one route: its path, any
//! method; anything else is `404 page not found`. The handlers behind the
//! routes are placeholders until the drain, stats and metrics pieces fill
//! them: `/wait-for-drain` and the stats `/metrics` answer `501`, the user
//! metrics `/metrics` an empty Prometheus exposition.

use std::convert::Infallible;

use http::header::{CONTENT_TYPE, HeaderValue};
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

/// Autoscaler stats server on 9090.
pub async fn stats(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    Ok(match req.uri().path() {
        METRICS => not_implemented(),
        _ => not_found(),
    })
}

/// User metrics server on 9091 (Prometheus text).
pub async fn metrics(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    Ok(match req.uri().path() {
        METRICS => {
            let mut res = Response::new(Body::empty());
            res.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
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
