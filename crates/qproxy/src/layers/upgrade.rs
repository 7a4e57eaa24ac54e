//! Upgraded requests last as long as their tunnel.
//!
//! Knative's handlers see an upgraded (WebSocket) request as running until
//! its connection closes: it keeps its breaker slot, and counts as in
//! flight, all that time. Here the layers hold such things in the response
//! body, which for a `101` is finished as soon as the head is written; so
//! this layer, outside every layer that holds something, hands the `101`'s
//! body to the response's [`Tunnel`], which drops it when the connection
//! closes.
//!
//! It also counts the open tunnels in [`Tunnels`], as Knative's hijack
//! tracker does: a server shutting down waits for them (within a bound),
//! since they are no longer connections the HTTP server knows of.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::answering::FromReply;
use crate::tunnel_registry::{Tunnel, Tunnels};
use qproxy_core::body::ReplyBody;

/// Adds [`UpgradeHold`] to a stack.
#[derive(Debug, Clone, Default)]
pub(crate) struct UpgradeHoldLayer {
    tunnels: Tunnels,
}

impl UpgradeHoldLayer {
    /// Counts the tunnels of the stack in `tunnels`.
    pub(crate) fn new(tunnels: Tunnels) -> Self {
        Self { tunnels }
    }
}

impl<S> Layer<S> for UpgradeHoldLayer {
    type Service = UpgradeHold<S>;

    fn layer(&self, inner: S) -> UpgradeHold<S> {
        UpgradeHold {
            inner,
            tunnels: self.tunnels.clone(),
        }
    }
}

/// Keeps the body of each `101` response until its tunnel closes.
#[derive(Debug, Clone)]
pub(crate) struct UpgradeHold<S> {
    inner: S,
    tunnels: Tunnels,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for UpgradeHold<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: FromReply + Send + 'static,
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
            tunnels: self.tunnels.clone(),
        }
    }
}

pin_project! {
    /// The response of [`UpgradeHold`].
    pub(crate) struct HoldFuture<F> {
        #[pin]
        inner: F,
        tunnels: Tunnels,
    }
}

impl<F, B, E> Future for HoldFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: FromReply + Send + 'static,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = std::task::ready!(this.inner.poll(cx))?;
        if let Some(tunnel) = res.extensions_mut().remove::<Tunnel>() {
            let body = std::mem::replace(res.body_mut(), B::from_reply(ReplyBody::empty()));
            tunnel.keep(body);
            tunnel.keep(this.tunnels.opened());
        }
        Poll::Ready(Ok(res))
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use http::StatusCode;
    use tower::{ServiceExt, service_fn};

    use super::*;
    use crate::config::LiveOptions;
    use crate::layers::concurrency;

    /// An app that accepts every upgrade; each tunnel it opens goes into
    /// `opened`, as the proxy keeps the tunnels it runs.
    fn app(
        opened: Arc<Mutex<Vec<Tunnel>>>,
    ) -> impl Service<
        Request<()>,
        Response = Response<ReplyBody>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<ReplyBody>, Infallible>> + Send,
    > + Clone {
        service_fn(move |_req: Request<()>| {
            let opened = opened.clone();
            async move {
                let tunnel = Tunnel::open();
                opened.lock().unwrap().push(tunnel.clone());
                let mut res = Response::new(ReplyBody::empty());
                *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                res.extensions_mut().insert(tunnel);
                Ok(res)
            }
        })
    }

    #[tokio::test]
    async fn a_tunnel_holds_its_requests_slot_and_count_until_it_closes() {
        let opened = Arc::new(Mutex::new(Vec::new()));
        let breaker = concurrency::breaker(1, false).unwrap();
        let tunnels = Tunnels::default();
        let service = UpgradeHoldLayer::new(tunnels.clone()).layer(
            concurrency::layer::<ReplyBody>(Some(breaker.clone()), None, LiveOptions::default())
                .layer(app(opened.clone())),
        );
        let res = service.oneshot(Request::new(())).await.unwrap();
        assert_eq!(res.status(), StatusCode::SWITCHING_PROTOCOLS);
        // The `101`'s body is sent and gone; the tunnel holds what it held.
        drop(res);
        assert_eq!(
            breaker.in_flight(),
            1,
            "the slot is held while the tunnel is open"
        );
        assert_eq!(tunnels.open(), 1);
        let tunnel = opened.lock().unwrap().pop().unwrap();
        tunnel.close();
        assert_eq!(breaker.in_flight(), 0, "closing the tunnel frees the slot");
        assert_eq!(tunnels.open(), 0);
        // What is kept after the close is let go of at once.
        tunnel.keep(tunnels.opened());
        assert_eq!(tunnels.open(), 0);
    }

    #[tokio::test]
    async fn a_response_without_a_tunnel_passes_untouched() {
        let tunnels = Tunnels::default();
        let service =
            UpgradeHoldLayer::new(tunnels.clone()).layer(service_fn(|_req: Request<()>| async {
                Ok::<_, Infallible>(Response::new(ReplyBody::full("hello")))
            }));
        let res = service.oneshot(Request::new(())).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(tunnels.open(), 0);
    }
}
