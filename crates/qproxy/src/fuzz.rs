//! Entry points for the fuzz targets in `fuzz/`, over parts of the sidecar
//! that are otherwise private. Built only with the `fuzzing` feature,
//! which nothing but those targets turns on; none of it is part of the
//! sidecar's interface.
//!
//! The environment contract, the readiness probe and
//! `OBSERVABILITY_CONFIG` need nothing here: the targets go through
//! [`Config::from_vars`](crate::Config::from_vars), as the binary does, and
//! the header rules are public in [`headers`](crate::headers).

use std::net::SocketAddr;
use std::time::Duration;

use http::Request;

use crate::config::{Generation, Revision};
use qproxy_observe::request_log::RequestLog;

pub use crate::server::MainPort;

/// Parses `template` as a request-log template and, if it parses, renders
/// the line of `req` from `remote` answered with `status` after sending
/// `size` body bytes in `latency`, as the main port would.
///
/// Returns `None` when the template does not parse.
pub fn request_log_line<B: http_body::Body>(
    template: &str,
    generation: Generation,
    req: &Request<B>,
    remote: SocketAddr,
    status: u16,
    size: u64,
    latency: Duration,
) -> Option<Vec<u8>> {
    let parsed = qproxy_go_template::Template::parse(template).ok()?;
    let revision = Revision {
        namespace: "default".into(),
        service: "hello".into(),
        configuration: "hello".into(),
        name: "hello-00001".into(),
        pod: "hello-00001-deployment-6d8d4bd5b-x7k2p".into(),
        pod_ip: "10.0.0.7".into(),
    };
    let log = RequestLog::new(parsed, template, true, generation, revision);
    let arrived = log.arrived(req, remote);
    Some(log.render(&arrived, status, size, latency, None))
}
