//! What the layers, the reverse proxy and the small servers share: bodies
//! and their guards, the answers qproxy makes itself, the tunnels of
//! upgraded connections, Knative's header names and Go's formatting.
//!
//! Everything here sits below the rest of the crate and imports nothing
//! from it, so that no two modules above it need each other.

pub(crate) mod body;
pub(crate) mod go;
pub(crate) mod headers;
pub(crate) mod outcome;
pub(crate) mod reply;
pub(crate) mod tunnel;

use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;

use body::Body;

/// Largest request head accepted on HTTP/1: Go's `DefaultMaxHeaderBytes`
/// plus the slack Go's server allows. The servers size their buffers by
/// it, and the server rules refuse a head longer than it, as Go does.
pub(crate) const MAX_HEADER_BYTES: usize = (1 << 20) + 4096;

/// What one of the small servers (admin, stats, metrics, profiling) does
/// with each request.
pub(crate) trait Endpoint: Clone + Send + Sync + 'static {
    /// Answers `req`.
    fn respond(self, req: Request<Incoming>) -> impl Future<Output = Response<Body>> + Send;
}

/// The path of the stats and the metrics endpoints.
const METRICS_PATH: &str = "/metrics";

/// The answer of a server whose one route is `/metrics` (the stats and the
/// metrics servers), as Go's `http.ServeMux` gives it: there, whatever the
/// method, `body()` as `content_type`; anywhere else, `404 page not found`.
pub(crate) fn metrics_route<B>(
    req: &Request<B>,
    content_type: &'static str,
    body: impl FnOnce() -> Bytes,
) -> Response<Body> {
    if req.uri().path() != METRICS_PATH {
        return reply::not_found();
    }
    let mut res = Response::new(Body::full(body()));
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    res
}

/// What a server knows of one accepted connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Conn {
    /// The client's address (IPv4 clients of a dual-stack socket show as
    /// IPv4).
    pub(crate) remote: SocketAddr,
}
