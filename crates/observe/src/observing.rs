//! Layers that follow a request without answering it: what they share,
//! and how adjacent ones are served by one service.
//!
//! Request logs, traces, request metrics and the autoscaler's stats each
//! note a request as it comes in and keep a guard until its response body
//! is done with; a rewrite changes the request on its way in and keeps
//! nothing. Each is an [`Observe`]. Served one layer each, a request would
//! be moved into every one's `call`, and its response future and body
//! wrapped once per layer. Observers with no answering layer between them
//! (one that can answer a request itself, such as the timeouts or the
//! breaker) see the same answers, so a tuple of them is one [`Observe`]:
//! one service, one `call`, one wrap of the future and of the body, each
//! member still entered in the stack's order and told of the answer, the
//! body's frames and its end.

use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use qproxy_core::body::{Guarded, GuardedFuture, Settle};
use qproxy_core::facts::HasFacts;

/// Something that notes each request on its way in, and keeps a guard
/// (if any) until the request's response body is done with.
pub trait Observe: Clone {
    /// What follows the request to its end.
    type Guard: Settle;

    /// Notes `req` (and may change it); what follows it, if anything.
    fn enter<B: http_body::Body + HasFacts>(&self, req: &mut Request<B>) -> Option<Self::Guard>;
}

/// The guard of an observer that keeps none.
#[derive(Debug)]
pub enum NoGuard {}

impl Settle for NoGuard {}

/// The guards of two observers, the first outside the second: each is
/// told what the response does inner one first, as the layers each on its
/// own would tell them.
#[derive(Debug)]
pub struct Both<A, B> {
    outer: Option<A>,
    inner: Option<B>,
}

impl<A: Settle, B: Settle> Both<A, B> {
    fn of(outer: Option<A>, inner: Option<B>) -> Option<Self> {
        (outer.is_some() || inner.is_some()).then_some(Both { outer, inner })
    }
}

impl<A: Settle, B: Settle> Settle for Both<A, B> {
    fn answered(&mut self, status: StatusCode) {
        if let Some(inner) = &mut self.inner {
            inner.answered(status);
        }
        if let Some(outer) = &mut self.outer {
            outer.answered(status);
        }
    }

    fn data(&mut self, len: usize) {
        if let Some(inner) = &mut self.inner {
            inner.data(len);
        }
        if let Some(outer) = &mut self.outer {
            outer.data(len);
        }
    }

    fn settle(&mut self, complete: bool) {
        // Each guard is dropped as it settles, as its own body would drop it.
        if let Some(mut inner) = self.inner.take() {
            inner.settle(complete);
        }
        if let Some(mut outer) = self.outer.take() {
            outer.settle(complete);
        }
    }
}

/// Two observers, entered first to second.
impl<A: Observe, B: Observe> Observe for (A, B) {
    type Guard = Both<A::Guard, B::Guard>;

    fn enter<Bd: http_body::Body + HasFacts>(&self, req: &mut Request<Bd>) -> Option<Self::Guard> {
        let outer = self.0.enter(req);
        Both::of(outer, self.1.enter(req))
    }
}

/// Four observers, entered first to last.
impl<A: Observe, B: Observe, C: Observe, D: Observe> Observe for (A, B, C, D) {
    type Guard = Both<A::Guard, Both<B::Guard, Both<C::Guard, D::Guard>>>;

    fn enter<Bd: http_body::Body + HasFacts>(&self, req: &mut Request<Bd>) -> Option<Self::Guard> {
        let a = self.0.enter(req);
        let b = self.1.enter(req);
        let c = self.2.enter(req);
        let d = self.3.enter(req);
        Both::of(a, Both::of(b, Both::of(c, d)))
    }
}

/// The response body of an [`Observing`] service.
pub type ObservedBody<B, O> = Guarded<B, <O as Observe>::Guard>;

/// Serves `observer` in front of the service it wraps.
pub fn observe<O: Observe>(observer: O) -> ObserveLayer<O> {
    ObserveLayer { observer }
}

/// Adds [`Observing`] to a stack.
#[derive(Debug, Clone)]
pub struct ObserveLayer<O> {
    observer: O,
}

impl<O: Clone, S> Layer<S> for ObserveLayer<O> {
    type Service = Observing<O, S>;

    fn layer(&self, inner: S) -> Observing<O, S> {
        Observing::new(self.observer.clone(), inner)
    }
}

/// A service whose requests an observer notes before the inner service
/// sees them, and whose responses carry the observer's guard.
#[derive(Debug, Clone)]
pub struct Observing<O, S> {
    observer: O,
    inner: S,
}

impl<O, S> Observing<O, S> {
    /// `inner`, observed by `observer`.
    pub fn new(observer: O, inner: S) -> Self {
        Self { observer, inner }
    }
}

impl<O, S, ReqBody, ResBody> Service<Request<ReqBody>> for Observing<O, S>
where
    O: Observe,
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: http_body::Body + HasFacts,
    ResBody: http_body::Body,
{
    type Response = Response<ObservedBody<ResBody, O>>;
    type Error = S::Error;
    type Future = GuardedFuture<S::Future, O::Guard>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let guard = self.observer.enter(&mut req);
        GuardedFuture::new(self.inner.call(req), guard)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty, Full};
    use tower::{ServiceExt, service_fn};

    use super::*;

    /// An observer that writes down, under its name, what it is told.
    #[derive(Debug, Clone)]
    struct Noting {
        name: &'static str,
        said: Arc<Mutex<Vec<String>>>,
    }

    impl Observe for Noting {
        type Guard = Self;

        fn enter<B: http_body::Body + HasFacts>(&self, req: &mut Request<B>) -> Option<Self> {
            self.note("entered");
            req.headers_mut()
                .append("x-seen", self.name.parse().expect("a value"));
            Some(self.clone())
        }
    }

    impl Noting {
        fn note(&self, what: &str) {
            let line = format!("{} {what}", self.name);
            self.said.lock().expect("not poisoned").push(line);
        }
    }

    impl Settle for Noting {
        fn answered(&mut self, status: StatusCode) {
            self.note(&format!("answered {}", status.as_u16()));
        }

        fn data(&mut self, len: usize) {
            self.note(&format!("data {len}"));
        }

        fn settle(&mut self, complete: bool) {
            self.note(&format!("settled {complete}"));
        }
    }

    #[tokio::test]
    async fn a_group_enters_in_order_and_tells_each_inner_first() {
        let said = Arc::new(Mutex::new(Vec::new()));
        let noting = |name| Noting {
            name,
            said: said.clone(),
        };
        let group = (noting("a"), noting("b"), noting("c"), noting("d"));
        let app = service_fn(|req: Request<Empty<Bytes>>| async move {
            let seen: Vec<_> = req.headers().get_all("x-seen").iter().cloned().collect();
            assert_eq!(
                seen,
                ["a", "b", "c", "d"],
                "each member changed the request in turn"
            );
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
        });
        let res = Observing::new(group, app)
            .oneshot(Request::new(Empty::new()))
            .await
            .expect("answered");
        let body = res.into_body().collect().await.expect("a body").to_bytes();
        assert_eq!(body, "hello");
        let said = said.lock().expect("not poisoned").clone();
        let expected: Vec<String> = ["entered"]
            .iter()
            .flat_map(|w| ["a", "b", "c", "d"].map(|n| format!("{n} {w}")))
            .chain(
                ["answered 200", "data 5", "settled true"]
                    .iter()
                    .flat_map(|w| ["d", "c", "b", "a"].map(|n| format!("{n} {w}"))),
            )
            .collect();
        assert_eq!(said, expected);
    }

    #[tokio::test]
    async fn a_body_dropped_early_settles_every_member_incomplete() {
        let said = Arc::new(Mutex::new(Vec::new()));
        let noting = |name| Noting {
            name,
            said: said.clone(),
        };
        let app = service_fn(|_: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
        });
        let res = Observing::new((noting("a"), noting("b")), app)
            .oneshot(Request::new(Empty::new()))
            .await
            .expect("answered");
        drop(res);
        let said = said.lock().expect("not poisoned").clone();
        assert_eq!(
            said,
            [
                "a entered",
                "b entered",
                "b answered 200",
                "a answered 200",
                "b settled false",
                "a settled false"
            ]
        );
    }
}
