//! `containerConcurrency`: the breaker between the client and the app.
//!
//! With `CONTAINER_CONCURRENCY > 0`, a [`qproxy_breaker::Breaker`] with that many
//! slots and a queue of ten times as many waiting requests; a request that
//! finds both full is answered `503` `pending request queue full` at once.
//! Kubelet probes never take a slot. With `0` there is no limit, unless
//! qproxy's `adaptive-concurrency` option was on at start: then the limit
//! is found from the app's latency ([`Breaker::adaptive`], with the rule's
//! defaults and windows of [`ADAPTIVE_WINDOW`]), with a queue of ten times
//! the highest limit.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use qproxy_breaker::{Breaker, BreakerLayer, Exempt, GradientSettings, QueueFull, Waited};

use crate::config::{LiveOptions, Opt};
use qproxy_core::body::ReplyBody;
use qproxy_core::facts::{HasFacts, facts};
use qproxy_core::reply::http_error;
use qproxy_observe::queue_wait::QueueWait;
use qproxy_observe::waits::{SlotWait, WaitNote};

/// The breaker layer of the main port, whose inner responses have bodies
/// of type `B`.
pub(crate) type ConcurrencyLayer<B> =
    BreakerLayer<fn(QueueFull) -> Response<B>, KubeletProbes, QueueWaits>;

/// The shortest window over which the adaptive limit measures the app
/// (Envoy's filter's default).
pub(crate) const ADAPTIVE_WINDOW: Duration = Duration::from_millis(100);

/// The breaker Knative's queue-proxy builds for `container_concurrency`, if
/// any: `container_concurrency` slots and ten times as many places in the
/// queue. Without a limit, and with `adaptive` on, an adaptive breaker.
pub(crate) fn breaker(container_concurrency: u32, adaptive: bool) -> Option<Breaker> {
    if container_concurrency == 0 {
        return adaptive.then(adaptive_breaker);
    }
    if adaptive {
        tracing::warn!(
            container_concurrency,
            "qproxy option adaptive-concurrency is ignored: the revision sets containerConcurrency"
        );
    }
    let depth = container_concurrency.saturating_mul(10);
    tracing::info!(
        "Queue container is starting with BreakerParams = queue.BreakerParams{{QueueDepth:{depth}, \
         MaxConcurrency:{container_concurrency}, InitialCapacity:{container_concurrency}}}"
    );
    Some(Breaker::new(container_concurrency, depth))
}

/// The breaker of the `adaptive-concurrency` option.
fn adaptive_breaker() -> Breaker {
    let settings = GradientSettings::default();
    let depth = settings.max_limit.saturating_mul(10);
    tracing::info!(
        probe_limit = settings.probe_limit,
        max_limit = settings.max_limit,
        queue_depth = depth,
        "the concurrency limit follows the app's latency (qproxy option adaptive-concurrency)"
    );
    Breaker::adaptive(settings, ADAPTIVE_WINDOW, depth)
}

/// Limits the requests reaching the app with `breaker`, their waits for a
/// slot counted in `waits` (and noted for the request log, and for
/// `Server-Timing` when `options` turn it on).
pub(crate) fn layer<B: From<ReplyBody>>(
    breaker: Option<Breaker>,
    waits: Option<Arc<QueueWait>>,
    options: LiveOptions,
) -> ConcurrencyLayer<B> {
    BreakerLayer::new(breaker, queue_full::<B> as fn(QueueFull) -> Response<B>)
        .exempt(KubeletProbes)
        .waited(QueueWaits { waits, options })
}

/// Counts each request's wait for a slot, when counted, and notes it on
/// the request for its log line ([`WaitNote`]) when that asks, and for
/// `Server-Timing` ([`SlotWait`]) when that option is on.
#[derive(Debug, Clone)]
pub(crate) struct QueueWaits {
    /// The count of waits, when counted.
    waits: Option<Arc<QueueWait>>,
    /// qproxy's options: whether `Server-Timing` is on.
    options: LiveOptions,
}

impl<B> Waited<B> for QueueWaits {
    fn waited(&self, req: &mut Request<B>, wait: Duration) {
        if let Some(waits) = &self.waits {
            waits.record(wait);
        }
        if let Some(note) = WaitNote::of(req) {
            note.note(wait);
        }
        if self.options.has(Opt::ServerTiming) {
            req.extensions_mut().insert(SlotWait(wait));
        }
    }
}

/// Kubelet probes pass the breaker without a slot, as Knative's handler
/// lets them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KubeletProbes;

impl<B: HasFacts> Exempt<B> for KubeletProbes {
    fn exempt(&self, req: &Request<B>) -> bool {
        facts(req).is_kubelet_probe()
    }
}

/// Go's `http.Error(w, err.Error(), 503)`.
fn queue_full<B: From<ReplyBody>>(err: QueueFull) -> Response<B> {
    http_error(StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")).map(B::from)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http::Request;
    use http_body::{Body as _, Frame};
    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt, service_fn};

    use super::*;

    /// An app's response body: these frames, or a reply of qproxy's own.
    #[derive(Debug)]
    struct QueuedFrames(VecDeque<Bytes>);

    impl From<ReplyBody> for QueuedFrames {
        fn from(body: ReplyBody) -> Self {
            let mut frames = VecDeque::new();
            let mut body = body;
            let mut cx = Context::from_waker(std::task::Waker::noop());
            while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
                if let Ok(data) = frame.into_data() {
                    frames.push_back(data);
                }
            }
            QueuedFrames(frames)
        }
    }

    impl http_body::Body for QueuedFrames {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(|d| Ok(Frame::data(d))))
        }

        fn is_end_stream(&self) -> bool {
            self.0.is_empty()
        }
    }

    /// The app: answers with two frames.
    async fn answer(_req: Request<()>) -> Result<Response<QueuedFrames>, Infallible> {
        Ok(Response::new(QueuedFrames(
            [Bytes::from_static(b"a"), Bytes::from_static(b"b")].into(),
        )))
    }

    #[tokio::test]
    async fn a_slot_is_held_until_the_body_ends() {
        let breaker = breaker(1, false).unwrap();
        let service = layer::<QueuedFrames>(Some(breaker.clone()), None, LiveOptions::default())
            .layer(service_fn(answer));
        let res = service.oneshot(Request::new(())).await.unwrap();
        assert_eq!(breaker.in_flight(), 1, "answered, the body not yet sent");
        let mut body = res.into_body();
        body.frame().await.unwrap().unwrap();
        assert_eq!(breaker.in_flight(), 1, "half the body sent");
        body.frame().await.unwrap().unwrap();
        assert!(body.frame().await.is_none());
        assert_eq!(breaker.in_flight(), 0, "the body's end frees the slot");
    }

    #[tokio::test]
    async fn a_slot_is_freed_when_the_body_is_dropped_early() {
        let breaker = breaker(1, false).unwrap();
        let service = layer::<QueuedFrames>(Some(breaker.clone()), None, LiveOptions::default())
            .layer(service_fn(answer));
        let mut body = service.oneshot(Request::new(())).await.unwrap().into_body();
        body.frame().await.unwrap().unwrap();
        assert_eq!(breaker.in_flight(), 1);
        drop(body);
        assert_eq!(breaker.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_kubelet_probe_takes_no_slot_and_a_full_queue_is_503() {
        let breaker = breaker(1, false).unwrap();
        let service = layer::<QueuedFrames>(Some(breaker.clone()), None, LiveOptions::default())
            .layer(service_fn(answer));
        let held = service.clone().oneshot(Request::new(())).await.unwrap();
        // One slot, ten places: the queue fills with ten waiting requests.
        let mut waiting = Vec::new();
        for _ in 0..10 {
            let mut call = Box::pin(service.clone().oneshot(Request::new(())));
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(call.as_mut().poll(&mut cx).is_pending());
            waiting.push(call);
        }
        assert_eq!(breaker.waiting(), 10);
        let probe = Request::builder()
            .header("K-Kubelet-Probe", "queue")
            .body(())
            .unwrap();
        let probed = service.clone().oneshot(probe).await.unwrap();
        assert_eq!(
            probed.status(),
            StatusCode::OK,
            "a probe passes a full breaker"
        );
        let refused = service.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        let text = refused.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(text, "pending request queue full\n");
        drop((held, waiting));
        assert_eq!(breaker.in_flight(), 0);
    }

    #[tokio::test]
    async fn each_admitted_request_s_wait_is_counted_once_probes_not() {
        let breaker = breaker(1, false).unwrap();
        let waits = Arc::new(QueueWait::default());
        let service = layer::<QueuedFrames>(
            Some(breaker.clone()),
            Some(waits.clone()),
            LiveOptions::default(),
        )
        .layer(service_fn(answer));
        let held = service.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(waits.count(), 1, "a free slot: a wait of zero");
        let mut queued = Box::pin(service.clone().oneshot(Request::new(())));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(queued.as_mut().poll(&mut cx).is_pending());
        assert_eq!(waits.count(), 1, "still waiting");
        let probe = Request::builder()
            .header("K-Kubelet-Probe", "queue")
            .body(())
            .unwrap();
        service.clone().oneshot(probe).await.unwrap();
        assert_eq!(waits.count(), 1, "a probe takes no slot and waits for none");
        drop(held);
        queued.await.unwrap();
        assert_eq!(waits.count(), 2, "counted once its slot came");
    }
}
