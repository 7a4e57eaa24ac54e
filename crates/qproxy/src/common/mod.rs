//! What the layers, the reverse proxy and the small servers share: bodies
//! and their guards, the answers qproxy makes itself, the tunnels of
//! upgraded connections, qproxy's own HTTP/1.1 client, Knative's header
//! names, Go's formatting, the start-up's spans, and the TLS crypto
//! provider.
//!
//! Everything here sits below the rest of the crate and imports nothing
//! from it, so that no two modules above it need each other.

pub(crate) mod body;
pub(crate) mod crypto;
pub(crate) mod dir_events;
pub(crate) mod facts;
pub(crate) mod go;
pub(crate) mod headers;
pub(crate) mod outcome;
pub(crate) mod reply;
pub(crate) mod startup;
pub(crate) mod tunnel_registry;
pub(crate) mod waits;

use std::future::Future;
use std::net::SocketAddr;

use body::RequestBody;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response};

use body::ReplyBody;

/// What one of the small servers (admin, stats, metrics, profiling) does
/// with each request.
pub(crate) trait Endpoint: Clone + Send + Sync + 'static {
    /// Answers `req`.
    fn respond(self, req: Request<RequestBody>)
    -> impl Future<Output = Response<ReplyBody>> + Send;
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
) -> Response<ReplyBody> {
    if req.uri().path() != METRICS_PATH {
        return reply::not_found();
    }
    let mut res = Response::new(ReplyBody::full(body()));
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    res
}

/// What a server knows of one accepted connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Accepted {
    /// The client's address (IPv4 clients of a dual-stack socket show as
    /// IPv4).
    pub(crate) remote: SocketAddr,
}
