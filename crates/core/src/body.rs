//! The bodies every layer shares: the ones qproxy makes itself, the
//! request's on its way to the app, and the guard that keeps a request's
//! accounting alive until its response body ends.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::{HeaderMap, Request};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use qproxy_transport::server::{MakeBody, WholeBody};
use tokio::sync::mpsc;

use crate::facts::{Facts, HasFacts};

/// A type-erased error, as hyper takes from bodies.
pub use qproxy_transport::BoxError;

/// A body qproxy makes itself (error texts, probe answers, its own
/// ports' pages): whole, and sent in one frame.
#[derive(Debug, Default)]
pub struct ReplyBody(Option<Bytes>);

impl ReplyBody {
    /// An empty body.
    pub fn empty() -> Self {
        ReplyBody(None)
    }

    /// A body holding `data`.
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data = data.into();
        ReplyBody((!data.is_empty()).then_some(data))
    }
}

impl http_body::Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().0.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// A request body on its way to the user container, and its request's
/// [`Facts`], found where the head was read.
#[derive(Debug)]
pub struct RequestBody {
    /// The bytes, as they come.
    pub content: Content,
    /// What was read of the request where its head was.
    pub facts: Facts,
}

/// What a [`RequestBody`] holds.
#[derive(Debug)]
pub enum Content {
    /// Streamed from the client.
    Client(Incoming),
    /// No body. A request without one can be sent again.
    Empty,
    /// A body read whole with its head; taken by its first read.
    Full(WholeBody),
    /// What the client sends into the tunnel of an HTTP/2 `CONNECT`, to
    /// its end (the tunnel's task feeds it).
    Tunnel(mpsc::Receiver<Bytes>),
}

impl RequestBody {
    /// `content`, of a request with `facts`.
    pub fn new(content: Content, facts: Facts) -> Self {
        Self { content, facts }
    }
}

impl MakeBody for RequestBody {
    fn empty(headers: &HeaderMap) -> Self {
        RequestBody::new(Content::Empty, Facts::of(headers))
    }

    fn whole(body: WholeBody, headers: &HeaderMap) -> Self {
        RequestBody::new(Content::Full(body), Facts::of(headers))
    }

    fn streamed(body: Incoming, headers: &HeaderMap) -> Self {
        let content = if http_body::Body::is_end_stream(&body) {
            Content::Empty
        } else {
            Content::Client(body)
        };
        RequestBody::new(content, Facts::of(headers))
    }
}

impl HasFacts for RequestBody {
    fn facts(req: &Request<Self>) -> Facts {
        req.body().facts
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match &mut self.get_mut().content {
            Content::Client(b) => Pin::new(b).poll_frame(cx),
            Content::Empty => Poll::Ready(None),
            Content::Full(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            Content::Tunnel(rx) => rx
                .poll_recv(cx)
                .map(|data| data.map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.content {
            Content::Client(b) => b.is_end_stream(),
            Content::Empty => true,
            Content::Full(body) => body.is_end_stream(),
            Content::Tunnel(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.content {
            Content::Client(b) => b.size_hint(),
            Content::Empty => SizeHint::with_exact(0),
            Content::Full(body) => body.size_hint(),
            Content::Tunnel(_) => SizeHint::default(),
        }
    }
}

/// What a [`Guarded`] body's guard is told when the body is done with:
/// whether it was sent whole.
pub trait Settle {
    /// The request was answered with `status`; the body is yet to be sent.
    fn answered(&mut self, status: http::StatusCode) {
        let _ = status;
    }

    /// A data frame of `len` bytes is passing to the client.
    fn data(&mut self, len: usize) {
        let _ = len;
    }

    /// Called once, just before the guard is dropped: `complete` is true
    /// when the body reached its end, false when it failed or was dropped
    /// (the client went away) before that.
    fn settle(&mut self, complete: bool) {
        let _ = complete;
    }
}

/// A guard kept on the heap: for a layer whose guard is large and often
/// absent (traces, request logs are off by default), so that the bodies
/// and futures every request moves through the stack stay small.
impl<G: Settle + ?Sized> Settle for Box<G> {
    fn answered(&mut self, status: http::StatusCode) {
        (**self).answered(status);
    }

    fn data(&mut self, len: usize) {
        (**self).data(len);
    }

    fn settle(&mut self, complete: bool) {
        (**self).settle(complete);
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps a guard until the body ends (or fails),
    /// or is dropped, whichever comes first: what a layer holds for the
    /// life of its request (a count in flight, a measurement) lives here.
    #[derive(Debug)]
    pub struct Guarded<B, G>
    where
        B: http_body::Body,
        G: Settle,
    {
        #[pin]
        body: B,
        guard: Option<G>,
    }

    impl<B, G> PinnedDrop for Guarded<B, G>
    where
        B: http_body::Body,
        G: Settle,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(mut guard) = this.guard.take() {
                // hyper stops polling a body that says it has ended.
                guard.settle(this.body.is_end_stream());
            }
        }
    }
}

impl<B: http_body::Body, G: Settle> Guarded<B, G> {
    /// `body`, keeping `guard` until it ends.
    pub fn new(body: B, guard: Option<G>) -> Self {
        Self { body, guard }
    }
}

impl<B: http_body::Body + From<ReplyBody>, G: Settle> From<ReplyBody> for Guarded<B, G> {
    fn from(body: ReplyBody) -> Self {
        Self::new(B::from(body), None)
    }
}

impl<B: http_body::Body, G: Settle> http_body::Body for Guarded<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let polled = this.body.poll_frame(cx);
        let complete = match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(guard), Some(data)) = (this.guard.as_mut(), frame.data_ref()) {
                    guard.data(data.remaining());
                }
                None
            }
            Poll::Ready(None) => Some(true),
            Poll::Ready(Some(Err(_))) => Some(false),
            _ => None,
        };
        if let Some(complete) = complete
            && let Some(mut guard) = this.guard.take()
        {
            guard.settle(complete);
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

pin_project_lite::pin_project! {
    /// A response future whose guard learns the status and then goes with
    /// the body: what a layer that follows a request to its end returns.
    pub struct GuardedFuture<F, G> {
        #[pin]
        inner: F,
        guard: Option<G>,
    }
}

impl<F, G> GuardedFuture<F, G> {
    /// `inner`, with `guard` (if any) to follow its response.
    pub fn new(inner: F, guard: Option<G>) -> Self {
        Self { inner, guard }
    }
}

impl<F, B, E, G> std::future::Future for GuardedFuture<F, G>
where
    F: std::future::Future<Output = Result<http::Response<B>, E>>,
    B: http_body::Body,
    G: Settle,
{
    type Output = Result<http::Response<Guarded<B, G>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = std::task::ready!(this.inner.poll(cx))?;
        let mut guard = this.guard.take();
        if let Some(g) = &mut guard {
            g.answered(res.status());
        }
        Poll::Ready(Ok(res.map(|body| Guarded::new(body, guard))))
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future as _;

    use http_body::Body as _;
    use std::sync::{Arc, Mutex};

    use http::{Response, StatusCode};
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    /// A guard that writes down what it is told.
    #[derive(Debug, Clone, Default)]
    struct Told(Arc<Mutex<Vec<String>>>);

    impl Told {
        fn said(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    impl Settle for Told {
        fn answered(&mut self, status: StatusCode) {
            self.0
                .lock()
                .unwrap()
                .push(format!("answered {}", status.as_u16()));
        }

        fn data(&mut self, len: usize) {
            self.0.lock().unwrap().push(format!("data {len}"));
        }

        fn settle(&mut self, complete: bool) {
            self.0.lock().unwrap().push(format!("settle {complete}"));
        }
    }

    type FrameStream = StreamBody<
        futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, &'static str>>>,
    >;

    /// A body of these frames, then, if `fails`, an error.
    fn frames(data: &[&'static str], fails: bool) -> FrameStream {
        let mut frames: Vec<Result<Frame<Bytes>, &'static str>> = data
            .iter()
            .map(|d| Ok(Frame::data(Bytes::from_static(d.as_bytes()))))
            .collect();
        if fails {
            frames.push(Err("the app failed"));
        }
        StreamBody::new(futures_util::stream::iter(frames))
    }

    /// The response of a guarded future answering with `body`.
    async fn answered(told: &Told, body: FrameStream) -> Response<Guarded<FrameStream, Told>> {
        let answer = async move {
            let mut res = Response::new(body);
            *res.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(res)
        };
        let Ok(res) = GuardedFuture::new(answer, Some(told.clone())).await;
        res
    }

    #[tokio::test]
    async fn a_guard_learns_the_status_each_frame_and_a_complete_end_once() {
        let told = Told::default();
        let res = answered(&told, frames(&["ab", "cde"], false)).await;
        assert_eq!(told.said(), ["answered 201"]);
        let collected = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(collected, "abcde");
        assert_eq!(
            told.said(),
            ["answered 201", "data 2", "data 3", "settle true"]
        );
    }

    #[tokio::test]
    async fn a_body_dropped_early_settles_incomplete_once() {
        let told = Told::default();
        let mut body = answered(&told, frames(&["ab", "cde"], false))
            .await
            .into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "ab");
        drop(body);
        assert_eq!(told.said(), ["answered 201", "data 2", "settle false"]);
    }

    #[tokio::test]
    async fn a_body_that_fails_settles_incomplete_once_and_no_more_after() {
        let told = Told::default();
        let mut body = answered(&told, frames(&["ab"], true)).await.into_body();
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.frame().await.unwrap().is_err());
        drop(body);
        assert_eq!(told.said(), ["answered 201", "data 2", "settle false"]);
    }

    #[tokio::test]
    async fn a_future_dropped_before_its_answer_tells_its_guard_nothing() {
        let told = Told::default();
        let never = std::future::pending::<Result<Response<FrameStream>, Infallible>>();
        let mut future = Box::pin(GuardedFuture::new(never, Some(told.clone())));
        let waker = std::task::Waker::noop();
        assert!(
            future
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_pending()
        );
        drop(future);
        assert!(told.said().is_empty(), "{:?}", told.said());
    }

    #[test]
    fn a_whole_request_body_is_one_frame_and_replayable_when_empty() {
        let mut waker_cx = Context::from_waker(std::task::Waker::noop());
        let (whole, read) = WholeBody::new(Bytes::from_static(b"hello"));
        let mut body = RequestBody::whole(whole, &HeaderMap::new());
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!read.is_read());
        let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut waker_cx) else {
            panic!("no frame");
        };
        assert_eq!(frame.into_data().unwrap(), "hello");
        assert!(read.is_read(), "the server learns the body was read");
        assert!(body.is_end_stream());
        assert!(RequestBody::empty(&HeaderMap::new()).is_end_stream());
    }
}
