//! qproxy's own h2c client to the app, on the `h2` crate.
//!
//! hyper's HTTP/2 client runs a dispatch task per connection that takes
//! each request through a channel, and spawns a task per request to wait
//! for the response and another to send the request's body. Here the
//! request's own task opens the stream on the shared connection
//! ([`Shared`], made on first use and remade when it closes), sends a body
//! that is already whole (a unary gRPC call's) before it waits, and awaits
//! the response itself; only a body still streaming gets a task of its own
//! (`Pipe`), which resets the stream if the request is dropped before its
//! answer. The response body ([`H2cBody`]) reads h2's stream and gives its
//! flow-control capacity back as it goes. The rules are hyper's, so the app
//! sees what it saw before: hyper's connection settings, `Content-Length`
//! set from a body of known size, a stream reset with `NO_ERROR` ending the
//! body early rather than failing it. Connection-specific headers need no
//! removing here: an HTTP/2 client cannot send them (`h2`'s server refuses
//! such a request), and the caller's hop-by-hop rules have removed the
//! rest.

use std::error::Error as StdError;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker, ready};

use bytes::Bytes;
use h2::client::{Builder, SendRequest};
use h2::{Reason, RecvStream, SendStream};
use http::header::{CONTENT_LENGTH, HeaderValue};
use http::{Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

use super::dial::dial;
use super::error::SendError;
use crate::wire::length::content_length;

/// The connection settings of hyper's HTTP/2 client, which the app saw
/// before: 2 MiB stream and 5 MiB connection windows, 16 KiB frames and
/// header lists, at most 1 MiB buffered to send per stream, no push.
fn builder() -> Builder {
    let mut builder = Builder::new();
    builder
        .initial_max_send_streams(100)
        .initial_window_size(2 << 20)
        .initial_connection_window_size(5 << 20)
        .max_frame_size(16 << 10)
        .max_header_list_size(16 << 10)
        .max_send_buffer_size(1 << 20)
        .max_local_error_reset_streams(Some(1024))
        .enable_push(false);
    builder
}

/// The app's h2c connection, shared by every HTTP/2 request: made on first
/// use (concurrent first requests wait for one), remade once it has
/// closed.
#[derive(Debug)]
pub struct Shared {
    addr: SocketAddr,
    conn: Mutex<Option<Live>>,
    /// Held while connecting, so concurrent first requests share one
    /// connection.
    connecting: tokio::sync::Mutex<()>,
}

/// The connection in use.
#[derive(Debug, Clone)]
struct Live {
    sender: SendRequest<Bytes>,
    /// Set when the connection's task ends.
    closed: Arc<AtomicBool>,
}

impl Shared {
    /// The h2c connection to `addr`, not made yet.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// Sends `req` (its URI absolute: it carries the `:authority` the app
    /// sees) and waits for the response head.
    pub async fn send<B>(&self, req: Request<B>) -> Result<Response<H2cBody>, SendError>
    where
        B: Body<Data = Bytes> + Unpin + Send + 'static,
        B::Error: StdError + 'static,
    {
        let live = self.live().await?;
        send(live.sender, req).await.map_err(SendError::Http2)
    }

    /// The connection, if it is still open.
    fn current(&self) -> Option<Live> {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.as_ref()
            .filter(|c| !c.closed.load(Ordering::Acquire))
            .cloned()
    }

    /// The open connection, made if there is none.
    async fn live(&self) -> Result<Live, SendError> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let live = self.connect().await?;
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(live.clone());
        Ok(live)
    }

    /// A new connection, its task spawned.
    async fn connect(&self) -> Result<Live, SendError> {
        let (tcp, _local) = dial(self.addr).await?;
        let (sender, conn) = builder().handshake(tcp).await.map_err(SendError::Http2)?;
        let closed = Arc::new(AtomicBool::new(false));
        let ended = closed.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "h2c connection to the user container ended");
            }
            ended.store(true, Ordering::Release);
        });
        Ok(Live { sender, closed })
    }
}

/// Sends `req` (its URI absolute) on the connection `sender` belongs to
/// and waits for the response head.
async fn send<B>(
    sender: SendRequest<Bytes>,
    req: Request<B>,
) -> Result<Response<H2cBody>, h2::Error>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: StdError + 'static,
{
    let (mut parts, body) = req.into_parts();
    if let Some(len) = body.size_hint().exact()
        && (len != 0 || has_payload_semantics(&parts.method))
        && !parts.headers.contains_key(CONTENT_LENGTH)
    {
        parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
    }
    let connect = parts.method == Method::CONNECT;
    let end = !connect && body.is_end_stream();

    let mut sender = sender.ready().await?;
    let (response, stream) = sender.send_request(Request::from_parts(parts, ()), end)?;
    let mut cancel = if end {
        None
    } else {
        Pipe::new(body, stream).start()
    };
    let res = response.await?;
    if let Some(cancel) = &mut cancel {
        cancel.answered();
    }
    // h2 has refused a response whose `Content-Length` is not one length.
    let remaining = content_length(res.headers()).ok().flatten();
    Ok(res.map(|recv| H2cBody {
        recv,
        remaining,
        data_done: false,
    }))
}

/// Whether a method gives a request body a meaning, so that an empty one
/// is announced with `Content-Length: 0` (hyper's rule).
fn has_payload_semantics(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::CONNECT
    )
}

/// A response body from the app, read from its HTTP/2 stream.
#[derive(Debug)]
pub struct H2cBody {
    recv: RecvStream,
    /// What `Content-Length` said is left, when it said.
    remaining: Option<u64>,
    /// The data has ended; trailers may follow.
    data_done: bool,
}

impl Body for H2cBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = &mut *self;
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // The stream and the connection may take this much more.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    if let Some(left) = &mut this.remaining {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                // A reset with `NO_ERROR` is an early end (RFC 9113 §8.1).
                Some(Err(e)) if e.reason() == Some(Reason::NO_ERROR) => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.data_done = true,
            }
        }
        match ready!(this.recv.poll_trailers(cx)) {
            Ok(trailers) => Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t)))),
            Err(e) if e.reason() == Some(Reason::NO_ERROR) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.remaining
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// Sends a request's body on its stream, minding the app's flow control.
struct Pipe<B> {
    body: B,
    tx: SendStream<Bytes>,
    /// A data frame read from the body that waits for send capacity, and
    /// whether it is the last.
    waiting: Option<(Bytes, bool)>,
}

impl<B> Pipe<B>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: StdError + 'static,
{
    fn new(body: B, tx: SendStream<Bytes>) -> Self {
        Self {
            body,
            tx,
            waiting: None,
        }
    }

    /// Sends what the body already has; if it is not all there, the rest
    /// goes from a task of its own, which resets the stream when the
    /// returned sender is dropped before the response came.
    fn start(mut self) -> Option<Cancel> {
        let mut cx = Context::from_waker(Waker::noop());
        if Pin::new(&mut self).poll(&mut cx).is_ready() {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        tokio::spawn(Piping {
            pipe: self,
            cancel: Some(rx),
        });
        Some(Cancel(Some(tx)))
    }

    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
        loop {
            // A reset from the app ends the body.
            if let Poll::Ready(reason) = self.tx.poll_reset(cx)? {
                return Poll::Ready(Err(reason.into()));
            }
            if let Some((data, last)) = self.waiting.take() {
                if self.tx.capacity() == 0 {
                    match self.tx.poll_capacity(cx) {
                        Poll::Ready(Some(Ok(n))) if n > 0 => {}
                        Poll::Ready(Some(Ok(_))) => {
                            self.waiting = Some((data, last));
                            continue;
                        }
                        Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                        Poll::Ready(None) => return Poll::Ready(Err(Reason::STREAM_CLOSED.into())),
                        Poll::Pending => {
                            self.waiting = Some((data, last));
                            return Poll::Pending;
                        }
                    }
                }
                // h2 sends past the capacity it granted as the window opens.
                self.tx.send_data(data, last)?;
                if last {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let last = self.body.is_end_stream();
                        if data.is_empty() || last {
                            // Nothing is read after the last frame, so it
                            // needs no capacity first: h2 holds it until the
                            // app's window lets it go. A new stream has none
                            // until its head is written, so a body already
                            // whole (a unary call's) goes at once.
                            self.tx.send_data(data, last)?;
                            if last {
                                return Poll::Ready(Ok(()));
                            }
                        } else {
                            // One byte claimed, not the whole frame: a claim
                            // pins connection window others may need.
                            self.tx.reserve_capacity(1);
                            self.waiting = Some((data, last));
                        }
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.tx.reserve_capacity(0);
                            self.tx.send_trailers(trailers)?;
                            return Poll::Ready(Ok(()));
                        }
                    }
                },
                Some(Err(e)) => {
                    // The client's body failed: the app is told why.
                    self.tx.send_reset(client_reason(&e));
                    return Poll::Ready(Ok(()));
                }
                None => {
                    self.tx.send_data(Bytes::new(), true)?;
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }
}

impl<B> Future for Pipe<B>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: StdError + 'static,
{
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        ready!(self.poll_send(cx)).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "request body to the user container failed");
        });
        Poll::Ready(())
    }
}

/// The reason a client's body failure is passed on with: the client's own
/// stream error's, or `INTERNAL_ERROR`.
fn client_reason(err: &(dyn StdError + 'static)) -> Reason {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(reason) = e.downcast_ref::<h2::Error>().and_then(h2::Error::reason) {
            return reason;
        }
        source = e.source();
    }
    Reason::INTERNAL_ERROR
}

/// A [`Pipe`] in a task of its own, told to reset its stream if the
/// request is dropped before its response.
struct Piping<B> {
    pipe: Pipe<B>,
    cancel: Option<oneshot::Receiver<()>>,
}

impl<B> Future for Piping<B>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: StdError + 'static,
{
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(cancel) = &mut self.cancel {
            match Pin::new(cancel).poll(cx) {
                Poll::Ready(Ok(())) => {
                    self.pipe.tx.send_reset(Reason::CANCEL);
                    return Poll::Ready(());
                }
                // The response came: the body goes on to its end.
                Poll::Ready(Err(_)) => self.cancel = None,
                Poll::Pending => {}
            }
        }
        Pin::new(&mut self.pipe).poll(cx)
    }
}

/// Resets a piped stream when dropped, unless [`Cancel::answered`].
struct Cancel(Option<oneshot::Sender<()>>);

impl Cancel {
    /// The response came: the body goes on to its end.
    fn answered(&mut self) {
        drop(self.0.take());
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_body_is_announced_where_the_method_gives_it_meaning() {
        assert!(has_payload_semantics(&Method::POST));
        assert!(has_payload_semantics(&Method::PUT));
        assert!(!has_payload_semantics(&Method::GET));
        assert!(!has_payload_semantics(&Method::HEAD));
        assert!(!has_payload_semantics(&Method::DELETE));
    }
}
