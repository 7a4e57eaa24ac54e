//! Upgraded requests last as long as their tunnel.
//!
//! Knative's handlers see an upgraded (WebSocket) request as running until
//! its connection closes: it keeps its breaker slot, and counts as in
//! flight, all that time. Here the layers hold such things in the response
//! body, which for a `101` is finished as soon as the head is written; so
//! this layer, outside every layer that holds something, hands the `101`'s
//! body to the response's [`Tunnel`], which drops it when the connection
//! closes.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::body::Body;
use crate::proxy::Tunnel;

/// Adds [`UpgradeHold`] to a stack.
#[derive(Debug, Clone, Copy, Default)]
pub struct UpgradeHoldLayer;

impl<S> Layer<S> for UpgradeHoldLayer {
    type Service = UpgradeHold<S>;

    fn layer(&self, inner: S) -> UpgradeHold<S> {
        UpgradeHold { inner }
    }
}

/// Keeps the body of each `101` response until its tunnel closes.
#[derive(Debug, Clone)]
pub struct UpgradeHold<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for UpgradeHold<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Body> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = HoldFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        HoldFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project! {
    /// The response of [`UpgradeHold`].
    pub struct HoldFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, B, E> Future for HoldFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: From<Body> + Send + 'static,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut res = std::task::ready!(self.project().inner.poll(cx))?;
        if let Some(tunnel) = res.extensions_mut().remove::<Tunnel>() {
            let body = std::mem::replace(res.body_mut(), B::from(Body::empty()));
            tunnel.keep(body);
        }
        Poll::Ready(Ok(res))
    }
}
