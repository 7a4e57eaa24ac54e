//! Health checks, network probes and the drain, where Knative's `Drainer`
//! handles them.
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
//!
//! Neither kind reaches the user container or the autoscaler's stats. A
//! request that carries only `K-Kubelet-Probe` is not a health check here
//! (Knative decides by user agent alone); it is proxied, and the stats and
//! the breaker let it pass uncounted.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, HeaderValue, USER_AGENT};
use http::{HeaderMap, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::body::Body;
use crate::drain::Drainer;
use crate::headers::{K_NETWORK_HASH, K_NETWORK_PROBE, KUBE_PROBE_UA_PREFIX};
use crate::proxy::plain_text;
use crate::readiness::Readiness;

/// User agents whose requests are health checks, besides the kubelet's.
const HEALTH_CHECK_UA_PREFIXES: [&[u8]; 3] = [
    KUBE_PROBE_UA_PREFIX,
    b"Knative-Activator-Probe",
    b"Knative-Autoscaling-Probe",
];
/// `K-Network-Probe` value of health checks.
const QUEUE: &[u8] = b"queue";
/// `K-Network-Probe` value of network probes.
const PROBE: &[u8] = b"probe";

/// Adds [`Drain`] to a stack.
#[derive(Debug, Clone)]
pub struct DrainLayer {
    drainer: Drainer,
    readiness: Readiness,
}

impl DrainLayer {
    /// Health checks answered from `readiness`; requests noted by `drainer`.
    pub fn new(drainer: Drainer, readiness: Readiness) -> Self {
        Self { drainer, readiness }
    }
}

impl<S> Layer<S> for DrainLayer {
    type Service = Drain<S>;

    fn layer(&self, inner: S) -> Drain<S> {
        Drain {
            inner,
            drainer: self.drainer.clone(),
            readiness: self.readiness.clone(),
        }
    }
}

/// Answers health checks and network probes; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Drain<S> {
    inner: S,
    drainer: Drainer,
    readiness: Readiness,
}

/// What kind of request this is to the drainer.
enum Kind {
    HealthCheck,
    NetworkProbe,
    Other,
}

fn kind(headers: &HeaderMap) -> Kind {
    let ua = headers.get(USER_AGENT).map_or(&b""[..], |v| v.as_bytes());
    if HEALTH_CHECK_UA_PREFIXES.iter().any(|p| ua.starts_with(p)) {
        Kind::HealthCheck
    } else if headers
        .get(K_NETWORK_PROBE)
        .is_some_and(|v| v.as_bytes() == PROBE)
    {
        Kind::NetworkProbe
    } else {
        Kind::Other
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Drain<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Body>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = DrainFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let answer = match kind(req.headers()) {
            Kind::Other => {
                self.drainer.request_arrived();
                return DrainFuture::Inner {
                    inner: self.inner.call(req),
                };
            }
            _ if self.drainer.is_draining() => Answer::Now(plain_text(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting down\n",
            )),
            Kind::NetworkProbe => Answer::Now(network_probe(req.headers())),
            Kind::HealthCheck => health_check(req.headers(), &self.readiness),
        };
        match answer {
            Answer::Now(res) => DrainFuture::Now { res: Some(res) },
            Answer::Probe(check) => DrainFuture::Probe { check },
        }
    }
}

/// An answer made here.
enum Answer {
    Now(Response<Body>),
    Probe(ReadinessCheck),
}

type ReadinessCheck = Pin<Box<dyn Future<Output = bool> + Send>>;

/// `200` echoing `K-Network-Hash`, or `400` without one.
fn network_probe(headers: &HeaderMap) -> Response<Body> {
    match headers.get(K_NETWORK_HASH).filter(|h| !h.is_empty()) {
        Some(hash) => {
            let mut res = Response::new(Body::empty());
            res.headers_mut().insert(K_NETWORK_HASH, hash.clone());
            res
        }
        None => plain_text(
            StatusCode::BAD_REQUEST,
            "a probe request must contain a non-empty \"K-Network-Hash\" header\n",
        ),
    }
}

/// Knative's probe handler.
fn health_check(headers: &HeaderMap, readiness: &Readiness) -> Answer {
    let probe = headers
        .get(K_NETWORK_PROBE)
        .map_or(&b""[..], |v| v.as_bytes());
    if probe != QUEUE {
        let mut text = BytesMut::from(&b"unexpected probe header value: "[..]);
        text.put_slice(probe);
        text.put_u8(b'\n');
        return Answer::Now(plain_text(StatusCode::BAD_REQUEST, text.freeze()));
    }
    if !readiness.is_configured() {
        return Answer::Now(ready());
    }
    let readiness = readiness.clone();
    Answer::Probe(Box::pin(async move { readiness.check().await }))
}

/// `200 queue`, as Go writes it (sniffed content type, no `nosniff`).
fn ready() -> Response<Body> {
    let mut res = Response::new(Body::full(Bytes::from_static(QUEUE)));
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

/// An empty `503`: the user container is not ready.
fn not_ready() -> Response<Body> {
    let mut res = Response::new(Body::empty());
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    res
}

pin_project! {
    /// The response of [`Drain`].
    #[project = DrainProj]
    pub enum DrainFuture<F> {
        /// The request goes on.
        Inner { #[pin] inner: F },
        /// Answered here at once.
        Now { res: Option<Response<Body>> },
        /// Answered once the readiness check is done.
        Probe { check: ReadinessCheck },
    }
}

impl<F, B, E> Future for DrainFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: From<Body>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let res = match self.project() {
            DrainProj::Inner { inner } => return inner.poll(cx),
            DrainProj::Now { res } => res.take().unwrap_or_else(not_ready),
            DrainProj::Probe { check } => {
                if std::task::ready!(check.as_mut().poll(cx)) {
                    ready()
                } else {
                    not_ready()
                }
            }
        };
        Poll::Ready(Ok(res.map(B::from)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::headers::header_map as headers;

    #[test]
    fn tells_health_checks_by_user_agent_alone() {
        for ua in [
            "kube-probe/1.29",
            "Knative-Activator-Probe",
            "Knative-Autoscaling-Probe/1",
        ] {
            assert!(matches!(
                kind(&headers(&[("user-agent", ua)])),
                Kind::HealthCheck
            ));
        }
        for other in [
            headers(&[("user-agent", "curl/8"), ("k-kubelet-probe", "1")]),
            headers(&[("user-agent", "Kube-Probe/1.29")]),
            headers(&[("k-network-probe", "queue")]),
        ] {
            assert!(matches!(kind(&other), Kind::Other));
        }
        assert!(matches!(
            kind(&headers(&[("k-network-probe", "probe")])),
            Kind::NetworkProbe
        ));
        // A health check's user agent wins over a network probe header.
        assert!(matches!(
            kind(&headers(&[
                ("user-agent", "kube-probe/1"),
                ("k-network-probe", "probe")
            ])),
            Kind::HealthCheck
        ));
    }
}
