//! A tower layer putting a [`Breaker`] in front of an HTTP service (see
//! [`BreakerService`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::{Acquire, Breaker, Permit, QueueFull};

/// Which requests pass a [`BreakerService`] without a slot.
pub trait Exempt<B> {
    /// Whether `req` passes without a slot.
    fn exempt(&self, req: &Request<B>) -> bool;
}

/// Requests whose headers satisfy the function are exempt.
impl<B, F: Fn(&HeaderMap) -> bool> Exempt<B> for F {
    fn exempt(&self, req: &Request<B>) -> bool {
        self(req.headers())
    }
}

/// No request is exempt.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoneExempt;

impl<B> Exempt<B> for NoneExempt {
    fn exempt(&self, _: &Request<B>) -> bool {
        false
    }
}

/// Told how long each admitted request waited for its slot, as it goes on
/// to the inner service.
pub trait Waited<B> {
    /// `req` got its slot after `wait` (zero when one was free); the hook
    /// may note it on the request.
    fn waited(&self, req: &mut Request<B>, wait: Duration);
}

/// A function of the wait is told.
impl<B, F: Fn(Duration)> Waited<B> for F {
    fn waited(&self, _: &mut Request<B>, wait: Duration) {
        self(wait)
    }
}

/// Nobody is told.
#[derive(Debug, Clone, Copy, Default)]
pub struct Untold;

impl<B> Waited<B> for Untold {
    fn waited(&self, _: &mut Request<B>, _: Duration) {}
}

/// Builds [`BreakerService`]s.
#[derive(Debug, Clone)]
pub struct BreakerLayer<R, E = NoneExempt, W = Untold> {
    breaker: Option<Breaker>,
    reject: R,
    exempt: E,
    waited: W,
}

impl<R> BreakerLayer<R> {
    /// Limits requests with `breaker` (no limit when `None`) and answers
    /// the refused ones with `reject`.
    pub fn new(breaker: Option<Breaker>, reject: R) -> Self {
        BreakerLayer {
            breaker,
            reject,
            exempt: NoneExempt,
            waited: Untold,
        }
    }
}

impl<R, E, W> BreakerLayer<R, E, W> {
    /// Lets the requests `exempt` names through without a slot (a
    /// sidecar's own health checks, for instance): a function of the
    /// headers, or any [`Exempt`].
    pub fn exempt<X>(self, exempt: X) -> BreakerLayer<R, X, W> {
        BreakerLayer {
            breaker: self.breaker,
            reject: self.reject,
            exempt,
            waited: self.waited,
        }
    }

    /// Tells `waited` how long each request that takes a slot waited for
    /// it: zero when a slot was free, the time in the queue otherwise.
    /// Exempt and refused requests are not told of.
    pub fn waited<X>(self, waited: X) -> BreakerLayer<R, E, X> {
        BreakerLayer {
            breaker: self.breaker,
            reject: self.reject,
            exempt: self.exempt,
            waited,
        }
    }
}

impl<S, R: Clone, E: Clone, W: Clone> Layer<S> for BreakerLayer<R, E, W> {
    type Service = BreakerService<S, R, E, W>;

    fn layer(&self, inner: S) -> Self::Service {
        BreakerService {
            inner,
            breaker: self.breaker.clone(),
            reject: self.reject.clone(),
            exempt: self.exempt.clone(),
            waited: self.waited.clone(),
        }
    }
}

/// Runs each request through a [`Breaker`].
///
/// Each request is admitted or refused when the service is called; an
/// admitted one reaches the inner service once it has a slot, and keeps the
/// slot until its response body has ended (or is dropped), so the slot
/// covers the whole exchange, streamed bodies included. A refused request
/// gets the response the layer's `reject` function makes.
#[derive(Debug, Clone)]
pub struct BreakerService<S, R, E = NoneExempt, W = Untold> {
    inner: S,
    breaker: Option<Breaker>,
    reject: R,
    exempt: E,
    waited: W,
}

impl<S, R, E, W, ReqBody, ResBody> Service<Request<ReqBody>> for BreakerService<S, R, E, W>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    R: Fn(QueueFull) -> Response<ResBody>,
    E: Exempt<ReqBody>,
    W: Waited<ReqBody> + Clone,
{
    type Response = Response<PermitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<ReqBody>, W>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let breaker = match &self.breaker {
            Some(breaker) if !self.exempt.exempt(&req) => breaker,
            _ => return ResponseFuture::called(self.inner.call(req), None),
        };
        let mut acquire = match breaker.acquire() {
            Ok(acquire) => acquire,
            Err(full) => {
                tracing::debug!(
                    in_flight = breaker.in_flight(),
                    "pending request queue full"
                );
                return ResponseFuture::rejected((self.reject)(full));
            }
        };
        if let Some(permit) = acquire.now() {
            self.waited.waited(&mut req, Duration::ZERO);
            return ResponseFuture::called(self.inner.call(req), Some(permit));
        }
        // The wait is timed from before it is logged, so that whoever reads
        // the line knows the wait had begun.
        let since = Instant::now();
        tracing::debug!(waiting = breaker.waiting(), "request queued for a slot");
        // The inner service was readied for this call: take it along, and
        // leave a fresh clone for the next one.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::waiting(
            acquire,
            Queued {
                inner,
                req,
                since,
                waited: self.waited.clone(),
            },
        )
    }
}

/// What a queued request holds until its slot comes.
struct Queued<S, Req, W> {
    inner: S,
    req: Req,
    since: Instant,
    waited: W,
}

pin_project! {
    /// The response of a [`BreakerService`].
    pub struct ResponseFuture<S, Req, W = Untold>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req, W>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, W>
    where
        S: Service<Req>,
    {
        // Refused at admission. Boxed, as is what a waiting request holds:
        // both are rare, and every layer outside moves this future whole.
        Rejected { res: Option<Box<S::Response>> },
        // Admitted, waiting for a slot.
        Waiting { acquire: Acquire, next: Option<Box<Queued<S, Req, W>>> },
        // Holding a slot (or exempt), waiting for the inner service.
        Called { #[pin] fut: S::Future, permit: Option<Permit> },
    }
}

impl<S: Service<Req>, Req, W> ResponseFuture<S, Req, W> {
    fn rejected(res: S::Response) -> Self {
        let res = Some(Box::new(res));
        ResponseFuture {
            state: State::Rejected { res },
        }
    }

    fn waiting(acquire: Acquire, queued: Queued<S, Req, W>) -> Self {
        let next = Some(Box::new(queued));
        ResponseFuture {
            state: State::Waiting { acquire, next },
        }
    }

    fn called(fut: S::Future, permit: Option<Permit>) -> Self {
        ResponseFuture {
            state: State::Called { fut, permit },
        }
    }
}

impl<S, ReqBody, W, ResBody> Future for ResponseFuture<S, Request<ReqBody>, W>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    W: Waited<ReqBody>,
{
    type Output = Result<Response<PermitBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project().state.project() {
                StateProj::Rejected { res } => {
                    return match res.take() {
                        Some(res) => Poll::Ready(Ok((*res).map(PermitBody::new))),
                        None => Poll::Pending,
                    };
                }
                StateProj::Waiting { acquire, next } => {
                    let permit = std::task::ready!(Pin::new(acquire).poll(cx));
                    let Some(next) = next.take() else {
                        return Poll::Pending;
                    };
                    let Queued {
                        mut inner,
                        mut req,
                        since,
                        waited,
                    } = *next;
                    waited.waited(&mut req, since.elapsed());
                    let fut = inner.call(req);
                    self.set(ResponseFuture::called(fut, Some(permit)));
                }
                StateProj::Called { fut, permit } => {
                    let res = std::task::ready!(fut.poll(cx))?;
                    let permit = permit.take();
                    return Poll::Ready(Ok(res.map(|body| PermitBody { body, permit })));
                }
            }
        }
    }
}

pin_project! {
    /// A response body holding its request's slot until it ends or is
    /// dropped.
    #[derive(Debug)]
    pub struct PermitBody<B> {
        #[pin]
        body: B,
        permit: Option<Permit>,
    }
}

impl<B> PermitBody<B> {
    /// `body`, holding no slot.
    pub fn new(body: B) -> Self {
        PermitBody { body, permit: None }
    }
}

impl<B: Body> Body for PermitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let polled = this.body.poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            this.permit.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
