//! The main port's request handling, assembled in one place.
//!
//! Knative's queue-proxy wraps its reverse proxy in handlers; qproxy does the
//! same with tower layers, one concern per module, in the same order. Read
//! the list top to bottom as the path of a request:
//!
//! | Knative handler            | qproxy                          |
//! |----------------------------|---------------------------------|
//! | Go's `net/http` server     | [`ServerRulesLayer`]            |
//! | tracing / request metrics  | *(observability)*               |
//! | request log                | *(observability)*               |
//! | drainer, health checks     | *(probes and drain)*            |
//! | hijack tracker             | *(probes and drain)*            |
//! | route tag                  | *(observability)*               |
//! | timeouts                   | *(breaker and timeouts)*        |
//! | forwarded shim             | [`ForwardedShim`]               |
//! | stats                      | *(autoscaler stats)*            |
//! | `K-Original-Host` rewrite  | [`HostRewrite`]                 |
//! | breaker                    | *(breaker and timeouts)*        |
//! | app request metrics        | *(observability)*               |
//! | reverse proxy              | [`Proxy`]                       |
//!
//! Rows in italics are the seams the later pieces plug into.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::{Service, ServiceBuilder};

use crate::body::Body;
use crate::layers::RewriteLayer;
use crate::layers::forwarded::ForwardedShim;
use crate::layers::host_rewrite::HostRewrite;
use crate::layers::server_rules::ServerRulesLayer;
use crate::proxy::{Proxy, Upstream};
use crate::server::Conn;

/// State shared by every connection of the main port.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The user container.
    pub upstream: Arc<Upstream>,
}

/// The service handling the requests of one main-port connection.
pub fn main_service(
    shared: &Shared,
    conn: Conn,
) -> impl Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ use<> {
    ServiceBuilder::new()
        .layer(ServerRulesLayer)
        .layer(RewriteLayer::new(ForwardedShim))
        .layer(RewriteLayer::new(HostRewrite))
        .service(Proxy::new(shared.upstream.clone(), conn.remote.ip()))
}
