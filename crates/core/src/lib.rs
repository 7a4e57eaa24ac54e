//! What every layer of qproxy shares, below all of them: request and
//! reply bodies and their guards, a request's facts (read once where it
//! comes in), the answers qproxy makes itself in Go's words, the tunnels
//! of upgraded connections, Knative's header names, Go's formatting, the
//! TLS crypto provider, the events of a directory the kubelet mounts, and
//! the parts of the environment every layer reads ([`config`]: the
//! revision, the generation, qproxy's options, the variables and their
//! errors).
//!
//! It imports nothing of qproxy's but `qproxy-http1`, so that no two
//! crates above it need each other.

pub mod body;
pub mod config;
pub mod crypto;
pub mod dir_events;
pub mod facts;
pub mod go;
pub mod headers;
pub mod reply;
pub mod tunnel_registry;

use std::future::Future;
use std::net::SocketAddr;

use body::RequestBody;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response};

use body::ReplyBody;

/// What one of the small servers (admin, stats, metrics, profiling) does
/// with each request.
pub trait Endpoint: Clone + Send + Sync + 'static {
    /// Answers `req`.
    fn respond(self, req: Request<RequestBody>)
    -> impl Future<Output = Response<ReplyBody>> + Send;
}

/// The path of the stats and the metrics endpoints.
const METRICS_PATH: &str = "/metrics";

/// The answer of a server whose one route is `/metrics` (the stats and the
/// metrics servers), as Go's `http.ServeMux` gives it: there, whatever the
/// method, `body()` as `content_type`; anywhere else, `404 page not found`.
pub fn metrics_route<B>(
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
pub struct Accepted {
    /// The client's address (IPv4 clients of a dual-stack socket show as
    /// IPv4).
    pub remote: SocketAddr,
}
