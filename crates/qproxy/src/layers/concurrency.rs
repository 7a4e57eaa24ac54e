//! `containerConcurrency`: the breaker between the client and the app.
//!
//! With `CONTAINER_CONCURRENCY > 0`, a [`breaker::Breaker`] with that many
//! slots and a queue of ten times as many waiting requests; a request that
//! finds both full is answered `503` `pending request queue full` at once.
//! Kubelet probes never take a slot. With `0` there is no limit.

use breaker::{Breaker, BreakerLayer, PermitBody, QueueFull};
use http::{Response, StatusCode};

use crate::common::body::ReplyBody;
use crate::common::headers::is_kubelet_probe;
use crate::common::reply::http_error;

/// The breaker layer of the main port, whose inner responses have bodies
/// of type `B`.
pub(crate) type ConcurrencyLayer<B> = BreakerLayer<fn(QueueFull) -> Response<B>>;

/// The breaker Knative's queue-proxy builds for `container_concurrency`, if
/// any: `container_concurrency` slots and ten times as many places in the
/// queue.
pub(crate) fn breaker(container_concurrency: u32) -> Option<Breaker> {
    if container_concurrency == 0 {
        return None;
    }
    let depth = container_concurrency.saturating_mul(10);
    tracing::info!(
        "Queue container is starting with BreakerParams = queue.BreakerParams{{QueueDepth:{depth}, \
         MaxConcurrency:{container_concurrency}, InitialCapacity:{container_concurrency}}}"
    );
    Some(Breaker::new(container_concurrency, depth))
}

/// Limits the requests reaching the app with `breaker`.
pub(crate) fn layer<B: From<ReplyBody>>(breaker: Option<Breaker>) -> ConcurrencyLayer<B> {
    BreakerLayer::new(breaker, queue_full::<B> as fn(QueueFull) -> Response<B>)
        .exempt(is_kubelet_probe)
}

/// Go's `http.Error(w, err.Error(), 503)`.
fn queue_full<B: From<ReplyBody>>(err: QueueFull) -> Response<B> {
    http_error(StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")).map(B::from)
}

impl<B: From<ReplyBody>> From<ReplyBody> for PermitBody<B> {
    fn from(body: ReplyBody) -> Self {
        PermitBody::new(B::from(body))
    }
}
