//! What the layers, the reverse proxy and the small servers share: bodies
//! and their guards, the answers qproxy makes itself, the tunnels of
//! upgraded connections, the app connections kept alive, qproxy's own
//! HTTP/1.1 client, Knative's header names, Go's formatting, and the TLS
//! crypto provider.
//!
//! Everything here sits below the rest of the crate and imports nothing
//! from it, so that no two modules above it need each other.

pub(crate) mod body;
pub(crate) mod crypto;
pub(crate) mod go;
pub(crate) mod h1;
pub(crate) mod headers;
pub(crate) mod keep_alive;
pub(crate) mod outcome;
pub(crate) mod reply;
pub(crate) mod tunnel_registry;

use std::future::Future;
use std::net::SocketAddr;

use body::RequestBody;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response};

use body::ReplyBody;

/// Largest request head accepted on HTTP/1: Go's `DefaultMaxHeaderBytes`
/// plus the slack Go's server allows. The servers size their buffers by
/// it, and the server rules refuse a head longer than it, as Go does.
pub(crate) const MAX_HEADER_BYTES: usize = (1 << 20) + 4096;

/// Most header fields in an HTTP/1 request or response head. Go counts
/// none, only bytes; hyper needs a number, and makes room for that many
/// fields each time it parses a head. Measured over 5,000 keep-alive
/// connections, 24,576 fields (the most an `http::HeaderMap` can hold
/// without panicking) cost 5.5 KiB more resident memory per connection,
/// 4,096 cost 2 KiB, and 1,024 nothing measurable; Knative's ingresses
/// (Envoy) pass at most 100 by default.
pub(crate) const MAX_HEADER_FIELDS: usize = 1_024;

/// Largest response head taken from the app: 2 MiB, where Go's transport
/// takes 10 (`MaxResponseHeaderBytes`). hyper's read buffer is bounded by
/// the same setting and grows towards it while a fast app streams a body:
/// at 10 MiB, a streamed response held up to 8 MiB of buffer per
/// connection; at 2 MiB, 2.
pub(crate) const MAX_RESPONSE_HEADER_BYTES: usize = 2 << 20;

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
