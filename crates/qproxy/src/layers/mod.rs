//! The request-handling layers of the main port, one concern each.
//!
//! They are assembled, outermost first, in [`crate::stack`]. Layers that
//! only change the request on its way in implement [`Rewrite`] and are
//! applied with [`RewriteLayer`].

pub(crate) mod answering;
pub(crate) mod concurrency;
pub(crate) mod forwarded;
pub(crate) mod health;
pub(crate) mod host_rewrite;
pub(crate) mod server_rules;
pub(crate) mod timeout;
pub(crate) mod upgrade;

use std::task::{Context, Poll};

use http::Request;
use tower::{Layer, Service};

use qproxy_core::facts::HasFacts;
use qproxy_observe::observing::{NoGuard, Observe};

/// A change made to every request before the inner service sees it.
pub(crate) trait Rewrite: Clone {
    /// Changes `req` in place.
    fn rewrite<B: HasFacts>(&self, req: &mut Request<B>);
}

/// A rewrite joins a group of observers ([`Observe`]), keeping nothing.
impl<R: Rewrite> Observe for RewriteLayer<R> {
    type Guard = NoGuard;

    fn enter<B: http_body::Body + HasFacts>(&self, req: &mut Request<B>) -> Option<Self::Guard> {
        self.rewrite.rewrite(req);
        None
    }
}

/// Applies a [`Rewrite`] to every request of the service it wraps.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RewriteLayer<R> {
    rewrite: R,
}

impl<R> RewriteLayer<R> {
    /// A layer applying `rewrite`.
    pub(crate) const fn new(rewrite: R) -> Self {
        Self { rewrite }
    }
}

impl<R: Clone, S> Layer<S> for RewriteLayer<R> {
    type Service = Rewritten<R, S>;

    fn layer(&self, inner: S) -> Rewritten<R, S> {
        Rewritten {
            rewrite: self.rewrite.clone(),
            inner,
        }
    }
}

/// A service whose requests are rewritten before the inner service sees them.
#[derive(Debug, Clone)]
pub(crate) struct Rewritten<R, S> {
    rewrite: R,
    inner: S,
}

impl<R, S, B> Service<Request<B>> for Rewritten<R, S>
where
    R: Rewrite,
    B: HasFacts,
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        self.rewrite.rewrite(&mut req);
        self.inner.call(req)
    }
}
