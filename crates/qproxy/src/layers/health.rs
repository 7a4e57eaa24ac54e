//! Health checks and network probes, answered where Knative's `Drainer`
//! handler answers them, which also tells the drain of every other request.
//!
//! - A *health check* is a request whose `User-Agent` starts with
//!   `kube-probe/` (the kubelet), `Knative-Activator-Probe` or
//!   `Knative-Autoscaling-Probe`, whatever its method or path. While the
//!   pod drains it gets `503 shutting down`. Otherwise it must carry
//!   `K-Network-Probe: queue` (else `400 unexpected probe header value:
//!   <value>`), and the user container's readiness decides: `200 queue` or
//!   an empty `503`.
//! - A *network probe* (`K-Network-Probe: probe`, from the ingress) gets an
//!   empty `200` echoing `K-Network-Hash` (`400` without one), or
//!   `503 shutting down` while draining.
//! - Every other request restarts the drain's quiet period and goes on.
//!   Once a drain has lasted a whole quiet period, an HTTP/1 request's
//!   answer closes its connection (`Connection: close`): whoever still
//!   sends here then holds a connection opened before the endpoints
//!   changed (one a Service's cluster IP pinned to this pod, say), and
//!   dials again, reaching a pod that stays. Go's queue-proxy keeps such
//!   a connection, and the pod, until the kubelet kills it.
//!
//! Neither kind reaches the user container or the autoscaler's stats. A
//! request that carries only `K-Kubelet-Probe` is not a health check here
//! (Knative decides by user agent alone); it is proxied, and the stats and
//! the breaker let it pass uncounted.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, Request, Response, StatusCode, Version};
use tower::{Layer, Service};

use super::answering::{Answering, FromReply};
use crate::drain::Drainer;
use crate::readiness::Readiness;
use qproxy_core::body::ReplyBody;
use qproxy_core::facts::{HasFacts, HealthKind, facts};
use qproxy_core::headers::{K_NETWORK_HASH, K_NETWORK_PROBE};
use qproxy_core::reply::{http_error, text};
use qproxy_observe::startup::Startup;

/// `K-Network-Probe` value of health checks.
const QUEUE: &[u8] = b"queue";

/// Adds [`Health`] to a stack.
#[derive(Debug, Clone)]
pub(crate) struct HealthLayer {
    drainer: Drainer,
    readiness: Readiness,
    startup: Arc<Startup>,
}

impl HealthLayer {
    /// Health checks answered from `readiness`, the first passing one
    /// marked in `startup`; requests noted by `drainer`.
    pub(crate) fn new(drainer: Drainer, readiness: Readiness, startup: Arc<Startup>) -> Self {
        Self {
            drainer,
            readiness,
            startup,
        }
    }
}

impl<S> Layer<S> for HealthLayer {
    type Service = Health<S>;

    fn layer(&self, inner: S) -> Health<S> {
        Health {
            inner,
            drainer: self.drainer.clone(),
            readiness: self.readiness.clone(),
            startup: self.startup.clone(),
        }
    }
}

/// Answers health checks and network probes; see the [module docs](self).
#[derive(Debug, Clone)]
pub(crate) struct Health<S> {
    inner: S,
    drainer: Drainer,
    readiness: Readiness,
    startup: Arc<Startup>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Health<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: HasFacts,
    ResBody: FromReply,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Answering<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        match facts(&req).health() {
            HealthKind::Other => {
                self.drainer.request_arrived();
                if self.drainer.is_draining()
                    && req.version() < Version::HTTP_2
                    && self.drainer.has_settled()
                {
                    return Answering::last(self.inner.call(req));
                }
                Answering::inner(self.inner.call(req))
            }
            _ if self.drainer.is_draining() => Answering::now(http_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting down\n",
            )),
            HealthKind::NetworkProbe => Answering::now(network_probe(req.headers())),
            HealthKind::HealthCheck => health_check(req.headers(), &self.readiness, &self.startup),
        }
    }
}

/// `200` echoing `K-Network-Hash`, or `400` without one.
fn network_probe(headers: &HeaderMap) -> Response<ReplyBody> {
    match headers.get(K_NETWORK_HASH).filter(|h| !h.is_empty()) {
        Some(hash) => {
            let mut res = Response::new(ReplyBody::empty());
            res.headers_mut().insert(K_NETWORK_HASH, hash.clone());
            res
        }
        None => http_error(
            StatusCode::BAD_REQUEST,
            "a probe request must contain a non-empty \"K-Network-Hash\" header\n",
        ),
    }
}

/// Knative's probe handler.
fn health_check<F>(
    headers: &HeaderMap,
    readiness: &Readiness,
    startup: &Arc<Startup>,
) -> Answering<F> {
    let probe = headers
        .get(K_NETWORK_PROBE)
        .map_or(&b""[..], |v| v.as_bytes());
    if probe != QUEUE {
        let mut text = BytesMut::from(&b"unexpected probe header value: "[..]);
        text.put_slice(probe);
        text.put_u8(b'\n');
        return Answering::now(http_error(StatusCode::BAD_REQUEST, text.freeze()));
    }
    if !readiness.is_configured() {
        startup.app_ready();
        return Answering::now(ready());
    }
    let (readiness, startup) = (readiness.clone(), startup.clone());
    Answering::later(async move {
        if readiness.check().await {
            startup.app_ready();
            ready()
        } else {
            not_ready()
        }
    })
}

/// `200 queue`, as Go writes it (sniffed content type, no `nosniff`).
fn ready() -> Response<ReplyBody> {
    text(StatusCode::OK, Bytes::from_static(QUEUE))
}

/// An empty `503`: the user container is not ready.
fn not_ready() -> Response<ReplyBody> {
    let mut res = Response::new(ReplyBody::empty());
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    res
}
