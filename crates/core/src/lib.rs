//! What every layer of qproxy shares, below all of them: request and
//! reply bodies and their guards, a request's facts (read once where it
//! comes in), the answers qproxy makes itself in Go's words, Knative's
//! header names, the TLS crypto provider, the small servers' [`Endpoint`]
//! and the parts of the environment every layer reads ([`config`]: the
//! revision, the generation, qproxy's options, the variables and their
//! errors).
//!
//! Of qproxy's crates it imports only `qproxy-transport` (the body types it
//! reads requests into: `MakeBody`, `WholeBody`, `BoxError`), so that no
//! two crates above it need each other; what only the sidecar uses lives
//! in the sidecar.

pub mod body;
pub mod config;
pub mod crypto;
pub mod facts;
pub mod headers;
pub mod reply;

use std::future::Future;

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
