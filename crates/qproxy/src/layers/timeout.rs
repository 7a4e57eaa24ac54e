//! The revision's three timeouts, as Knative's `timeoutHandler` applies them.
//!
//! All three start when the request reaches this layer, so time spent
//! waiting in the breaker's queue counts:
//!
//! - `REVISION_TIMEOUT_SECONDS`, the overall bound;
//! - `REVISION_RESPONSE_START_TIMEOUT_SECONDS`, until the response starts;
//! - `REVISION_IDLE_TIMEOUT_SECONDS`, the longest time without a write to
//!   the client (the response head counts as one).
//!
//! If any of them fires before the response has started, the request is
//! abandoned (its upstream exchange is cancelled, its breaker slot freed)
//! and the client gets `504` with the body `request timeout`.
//!
//! Once the response has started, the generations differ. Classic Knative
//! (serving v0.42) lets the overall timeout pass and the response go on;
//! only the idle timeout ends it. Current Knative ends it on either. The
//! response-start timeout no longer applies in both. The generation is
//! current when `OBSERVABILITY_CONFIG` is set.
//!
//! Ending a started response cuts it short so that the client can tell:
//! HTTP/1 closes the connection without the body's proper end, HTTP/2
//! resets the stream. (Knative's queue-proxy writes `request timeout` into
//! such a body and, unless it has a `Content-Length`, ends it as if it were
//! complete.)
//!
//! An upgraded connection (WebSocket) is not a response that writes: as in
//! Knative, it is closed when the earliest of the three timeouts, counted
//! from the request, expires. The layer tells the proxy when through the
//! [`TunnelDeadline`] extension of each request that asks to upgrade. A
//! `CONNECT`'s tunnel (HTTP/1.1 or HTTP/2) is bounded the same way.
//!
//! With qproxy's `upgrades-outlive-timeouts` option, a request that asks
//! to upgrade, or a `CONNECT`, is bounded by the timeouts only until its
//! answer (a `504` if the app does not answer in time, as without it);
//! the tunnel that follows has no deadline, and only the drain (or either
//! side) closes it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};
use tower::{Layer, Service};

use super::answering::FromReply;
use crate::config::{Generation, LiveOptions, Opt, Timeouts};
use crate::go::go_duration;
use crate::tunnel_registry::TunnelDeadline;
use qproxy_core::body::{BoxError, ReplyBody};
use qproxy_core::facts::{HasFacts, facts};
use qproxy_core::reply::text;

/// The body of the `504`.
const REQUEST_TIMEOUT: &str = "request timeout";

/// Adds [`Timeout`] to a stack.
#[derive(Debug, Clone)]
pub(crate) struct TimeoutLayer {
    timeouts: Timeouts,
    generation: Generation,
    options: LiveOptions,
}

impl TimeoutLayer {
    /// Applies `timeouts` the way the `generation` of Knative does, to
    /// tunnels too unless `options` say otherwise.
    pub(crate) fn new(timeouts: Timeouts, generation: Generation, options: LiveOptions) -> Self {
        Self {
            timeouts,
            generation,
            options,
        }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout {
            inner,
            timeouts: self.timeouts,
            generation: self.generation,
            options: self.options.clone(),
            spare: SpareTimers::default(),
        }
    }
}

/// Bounds each request by the revision's timeouts; see the [module
/// docs](self).
#[derive(Debug, Clone)]
pub(crate) struct Timeout<S> {
    inner: S,
    timeouts: Timeouts,
    generation: Generation,
    /// qproxy's options: whether tunnels outlive the timeouts.
    options: LiveOptions,
    /// The timers earlier requests left, shared by the clones of this
    /// service (one stack serves one connection).
    spare: SpareTimers,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Timeout<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>, Error = Infallible>,
    ReqBody: HasFacts,
    ResBody: http_body::Body + FromReply,
{
    type Response = Response<TimeoutBody<ResBody>>;
    type Error = Infallible;
    type Future = TimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let deadlines = Deadlines::start(self.timeouts, self.generation);
        let (deadline, _) = deadlines.before_start();
        // Only a request asking to upgrade, or a `CONNECT`, can open a
        // tunnel; the others are spared the allocation of an extensions map.
        if (req.method() == Method::CONNECT || facts(&req).has_upgrade())
            && !self.options.has(Opt::UpgradesOutliveTimeouts)
        {
            req.extensions_mut().insert(TunnelDeadline(deadline));
        }
        TimeoutFuture {
            inner: self.inner.call(req),
            timer: self.spare.take(deadline),
            deadlines,
        }
    }
}

/// The timers kept for a connection's later requests: as many as the
/// requests it has served at once (HTTP/2 streams), up to this many.
const SPARE_TIMERS: usize = 8;

/// A connection's timers, kept from one request to the next. Armed again
/// for a later deadline, a timer registered with the runtime only has its
/// expiry moved (an atomic store; the runtime re-files it when the old one
/// comes); a new one is filed in the timer wheel on its first poll and
/// taken out again when dropped, under the wheel's lock both times.
#[derive(Debug, Clone, Default)]
struct SpareTimers(Arc<Mutex<Vec<Pin<Box<Sleep>>>>>);

impl SpareTimers {
    /// A timer for `deadline`: a spare one if there is one.
    fn take(&self, deadline: Instant) -> Timer {
        let spare = self.0.lock().ok().and_then(|mut spare| spare.pop());
        let sleep = match spare {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => Box::pin(sleep_until(deadline)),
        };
        Timer {
            sleep: Some(sleep),
            home: self.clone(),
        }
    }
}

/// A request's timer, given back to its connection's [`SpareTimers`] when
/// the request is answered. Left there, it may still fire once, waking the
/// task that last polled it for nothing, and it keeps that task's waker
/// until a later request polls it: for HTTP/1 the connection's own task,
/// for HTTP/2 a stream's, whose memory stays until then once it has ended.
#[derive(Debug)]
struct Timer {
    sleep: Option<Pin<Box<Sleep>>>,
    home: SpareTimers,
}

impl Timer {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let (Some(sleep), Ok(mut spare)) = (self.sleep.take(), self.home.0.lock())
            && spare.len() < SPARE_TIMERS
        {
            spare.push(sleep);
        }
    }
}

/// Which timeout fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fired {
    Overall,
    ResponseStart,
    Idle,
}

/// The deadlines of one request.
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    started: Instant,
    timeouts: Timeouts,
    generation: Generation,
}

impl Deadlines {
    fn start(timeouts: Timeouts, generation: Generation) -> Self {
        Self {
            started: Instant::now(),
            timeouts,
            generation,
        }
    }

    /// The earliest deadline before the response starts, and its timeout.
    /// With nothing written yet, the idle timeout counts from the start.
    fn before_start(&self) -> (Instant, Fired) {
        let t = &self.timeouts;
        [
            Some((t.revision, Fired::Overall)),
            t.response_start.map(|d| (d, Fired::ResponseStart)),
            t.idle.map(|d| (d, Fired::Idle)),
        ]
        .into_iter()
        .flatten()
        .min_by_key(|(d, _)| *d)
        .map_or((self.started, Fired::Overall), |(d, fired)| {
            (self.started + d, fired)
        })
    }

    /// The overall deadline, if it still applies once the response started.
    fn overall_after_start(&self) -> Option<Instant> {
        match self.generation {
            Generation::Classic => None,
            Generation::Current => Some(self.started + self.timeouts.revision),
        }
    }

    /// Logs the timeout as current Knative does (classic logs nothing).
    fn log(&self, fired: Fired) {
        if self.generation == Generation::Classic {
            return;
        }
        let t = &self.timeouts;
        match fired {
            Fired::Overall => tracing::warn!("Request timeout: {}", go_duration(t.revision)),
            Fired::ResponseStart => tracing::warn!(
                "Response start timeout: {}",
                go_duration(t.response_start.unwrap_or_default())
            ),
            Fired::Idle => {
                tracing::warn!("Idle timeout: {}", go_duration(t.idle.unwrap_or_default()))
            }
        }
    }
}

pin_project! {
    /// The response of [`Timeout`]: the inner one, or `504` if a timeout
    /// fires first.
    pub(crate) struct TimeoutFuture<F> {
        #[pin]
        inner: F,
        timer: Timer,
        deadlines: Deadlines,
    }
}

impl<F, B> Future for TimeoutFuture<F>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
    B: http_body::Body + FromReply,
{
    type Output = Result<Response<TimeoutBody<B>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(Ok(res)) = this.inner.poll(cx) {
            let deadlines = *this.deadlines;
            return Poll::Ready(Ok(res.map(|body| TimeoutBody::started(body, deadlines))));
        }
        if this.timer.poll(cx).is_pending() {
            return Poll::Pending;
        }
        let (_, fired) = this.deadlines.before_start();
        this.deadlines.log(fired);
        // Go's handler writes the status and the text, no more: the type is
        // sniffed, and there is no `X-Content-Type-Options`.
        let res = text(StatusCode::GATEWAY_TIMEOUT, REQUEST_TIMEOUT);
        Poll::Ready(Ok(res.map(|body| TimeoutBody::plain(B::from_reply(body)))))
    }
}

/// A response ended by a timeout.
#[derive(Debug, thiserror::Error)]
#[error("request timeout")]
pub(crate) struct TimedOut;

pin_project! {
    /// A response body under the timeouts that still apply once the
    /// response has started.
    #[project = TimeoutBodyProj]
    pub(crate) struct TimeoutBody<B> {
        #[pin]
        body: B,
        // Armed for the earliest deadline once the body first waits; `None`
        // before, and when none applies.
        sleep: Option<Pin<Box<Sleep>>>,
        // `None` when no timeout applies (qproxy's own answers, or classic
        // Knative without an idle timeout).
        running: Option<ResponseTimer>,
        // Set once a timeout fired.
        timed_out: bool,
    }
}

/// What a started response is timed by.
#[derive(Debug, Clone, Copy)]
struct ResponseTimer {
    deadlines: Deadlines,
    last_write: Instant,
}

impl ResponseTimer {
    fn overall(&self) -> Option<Instant> {
        self.deadlines.overall_after_start()
    }

    fn idle_deadline(&self) -> Option<Instant> {
        self.deadlines.timeouts.idle.map(|d| self.last_write + d)
    }

    /// The earliest deadline that applies.
    fn next(&self) -> Option<Instant> {
        [self.overall(), self.idle_deadline()]
            .into_iter()
            .flatten()
            .min()
    }
}

impl<B> TimeoutBody<B> {
    /// A body no timeout applies to (qproxy's own answers).
    pub(crate) fn plain(body: B) -> Self {
        TimeoutBody {
            body,
            sleep: None,
            running: None,
            timed_out: false,
        }
    }

    fn started(body: B, deadlines: Deadlines) -> Self {
        // The clock is read only if the idle timeout needs the time of this
        // first write.
        let last_write = if deadlines.timeouts.idle.is_some() {
            Instant::now()
        } else {
            deadlines.started
        };
        let running = ResponseTimer {
            deadlines,
            last_write,
        };
        TimeoutBody {
            body,
            sleep: None,
            // The timer itself is armed only if the body waits.
            running: running.next().map(|_| running),
            timed_out: false,
        }
    }
}

impl<B> TimeoutBodyProj<'_, B> {
    /// Ends the body: logs the timeout and fails every later poll.
    fn fire<T>(&mut self, fired: Fired) -> Poll<Option<Result<T, BoxError>>> {
        if let Some(running) = self.running {
            running.deadlines.log(fired);
        }
        tracing::debug!(?fired, "response cut short by a timeout");
        *self.timed_out = true;
        Poll::Ready(Some(Err(TimedOut.into())))
    }
}

impl<B: FromReply> FromReply for TimeoutBody<B> {
    fn from_reply(body: ReplyBody) -> Self {
        TimeoutBody::plain(B::from_reply(body))
    }
}

impl<B> http_body::Body for TimeoutBody<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if *this.timed_out {
            return Poll::Ready(Some(Err(TimedOut.into())));
        }
        let polled = this.body.as_mut().poll_frame(cx).map_err(Into::into);
        let Some(running) = this.running.as_mut() else {
            return polled;
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let now = Instant::now();
                // A body that is always ready never lets the timer run:
                // past the overall deadline, the write fails as in Go.
                if running.overall().is_some_and(|d| now >= d) {
                    return this.fire(Fired::Overall);
                }
                if frame.data_ref().is_some_and(|d| !d.is_empty()) {
                    running.last_write = now;
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(other) => return Poll::Ready(other),
            Poll::Pending => {}
        }
        let sleep = match this.sleep {
            Some(sleep) => sleep,
            None => match running.next() {
                Some(next) => this.sleep.insert(Box::pin(sleep_until(next))),
                None => return Poll::Pending,
            },
        };
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The timer only says "maybe": the idle deadline moves with
            // every write, and the timer is re-armed lazily, as Go does.
            let now = Instant::now();
            let (overall, idle) = (running.overall(), running.idle_deadline());
            let fired = if overall.is_some_and(|d| now >= d) {
                Fired::Overall
            } else if idle.is_some_and(|d| now >= d) {
                Fired::Idle
            } else {
                match [overall, idle].into_iter().flatten().min() {
                    Some(next) => {
                        sleep.as_mut().reset(next);
                        continue;
                    }
                    None => return Poll::Pending,
                }
            };
            return this.fire(fired);
        }
    }

    fn is_end_stream(&self) -> bool {
        !self.timed_out && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.timed_out {
            SizeHint::default()
        } else {
            self.body.size_hint()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    fn timeouts(revision: u64, start: Option<u64>, idle: Option<u64>) -> Timeouts {
        Timeouts {
            revision: Duration::from_secs(revision),
            response_start: start.map(Duration::from_secs),
            idle: idle.map(Duration::from_secs),
        }
    }

    #[tokio::test]
    async fn earliest_timeout_bounds_the_wait_for_the_response() {
        let deadlines = Deadlines::start(timeouts(300, Some(10), Some(20)), Generation::Classic);
        assert_eq!(
            deadlines.before_start(),
            (
                deadlines.started + Duration::from_secs(10),
                Fired::ResponseStart
            )
        );
        let deadlines = Deadlines::start(timeouts(5, Some(10), Some(2)), Generation::Classic);
        assert_eq!(
            deadlines.before_start(),
            (deadlines.started + Duration::from_secs(2), Fired::Idle)
        );
        let deadlines = Deadlines::start(timeouts(5, None, None), Generation::Current);
        assert_eq!(
            deadlines.before_start(),
            (deadlines.started + Duration::from_secs(5), Fired::Overall)
        );
    }

    #[tokio::test]
    async fn overall_timeout_outlives_the_response_start_only_in_current() {
        let t = timeouts(300, None, None);
        assert_eq!(
            Deadlines::start(t, Generation::Classic).overall_after_start(),
            None
        );
        let current = Deadlines::start(t, Generation::Current);
        assert_eq!(
            current.overall_after_start(),
            Some(current.started + Duration::from_secs(300))
        );
        // Classic with no idle timeout: nothing left to time.
        let body =
            TimeoutBody::started(ReplyBody::empty(), Deadlines::start(t, Generation::Classic));
        assert!(body.sleep.is_none() && body.running.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_always_ready_still_ends_at_the_overall_timeout() {
        use http_body_util::{BodyExt, StreamBody};
        let endless = StreamBody::new(futures_util::stream::repeat_with(|| {
            Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"x")))
        }));
        let deadlines = Deadlines::start(timeouts(1, None, None), Generation::Current);
        let mut body = std::pin::pin!(TimeoutBody::started(endless, deadlines));
        assert!(body.frame().await.is_some_and(|f| f.is_ok()));
        tokio::time::advance(Duration::from_secs(2)).await;
        let cut = body.frame().await.expect("a frame");
        assert!(cut.is_err_and(|e| e.is::<TimedOut>()));
        assert!(body.frame().await.is_some_and(|f| f.is_err()));
    }

    /// [`Timeout`] over an app that answers `/` at once and `/never` never.
    fn timed(
        t: Timeouts,
    ) -> Timeout<
        impl Service<Request<()>, Response = Response<ReplyBody>, Error = Infallible, Future: Send>
        + Clone,
    > {
        let app = tower::service_fn(|req: Request<()>| async move {
            if req.uri() == "/never" {
                std::future::pending::<()>().await;
            }
            Ok::<_, Infallible>(Response::new(ReplyBody::empty()))
        });
        TimeoutLayer::new(t, Generation::Classic, LiveOptions::default()).layer(app)
    }

    fn get(path: &str) -> Request<()> {
        Request::get(path).body(()).expect("a request")
    }

    fn spare(svc: &Timeout<impl Sized>) -> usize {
        svc.spare.0.lock().map_or(0, |spare| spare.len())
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_request_is_timed_from_its_own_start_on_the_timer_the_last_left() {
        let mut svc = timed(timeouts(10, None, None));
        let res = svc.call(get("/")).await.expect("infallible");
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(spare(&svc), 1, "the answered request left its timer");

        tokio::time::advance(Duration::from_secs(5)).await;
        let start = Instant::now();
        let mut waiting = std::pin::pin!(svc.call(get("/never")));
        assert_eq!(spare(&svc), 0, "the next request took it");
        // The timer was armed for the first request's deadline, five
        // seconds from now: it must not fire then.
        let early = tokio::time::timeout(Duration::from_millis(9_999), waiting.as_mut()).await;
        assert!(early.is_err(), "timed out before its own deadline");
        let res = waiting.await.expect("infallible");
        assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn requests_at_once_each_have_a_timer_and_some_are_kept() {
        let svc = timed(timeouts(10, None, None));
        let at_once = (0..SPARE_TIMERS + 2).map(|_| svc.clone().call(get("/never")));
        for res in futures_util::future::join_all(at_once).await {
            assert_eq!(
                res.expect("infallible").status(),
                StatusCode::GATEWAY_TIMEOUT
            );
        }
        assert_eq!(spare(&svc), SPARE_TIMERS);
        let res = svc.clone().call(get("/")).await.expect("infallible");
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(spare(&svc), SPARE_TIMERS);
    }
}
