//! The server role: a client's connection from its first byte
//! ([`conn::serve_connection`]; its head clock in `head.rs`), and
//! qproxy's own HTTP/1.1 server ([`serve`]), for the requests that make
//! most traffic:
//! HTTP/1.1 requests that ask for no upgrade, without a body or with a
//! small one (up to 64 KiB, its length given) sent with the head, as an
//! event or an API call is.
//!
//! hyper's HTTP/1.1 server keeps a dispatcher, a read buffer and a write
//! buffer for each connection, and takes each request through its service
//! adapter. Here the connection's task reads a request head into a buffer
//! the size of what came, parses it with `httparse` (hyper's parser) into
//! a request whose header values share that buffer, calls the port's
//! service, and writes the response head and the first bytes of its body
//! in one write (the head of a body of known length waits for them, as Go's
//! proxy sends it). Between requests a connection keeps only what it wrote
//! last (up to 16 KiB) and its last head's memory (up to 2 KiB), which the
//! next response and head reuse once nothing else holds them.
//!
//! The rules are hyper's, so that clients see what they saw before:
//! - a request is read as hyper reads it; `Connection: close` ends the
//!   connection after the response;
//! - the response head is written as hyper writes it: header names in
//!   title case, the standard reason phrase, `Content-Length` or chunks
//!   from the body's size, `Transfer-Encoding`, `Connection` and `Trailer`
//!   values joined on one line, `Content-Length: 0` for an empty body, a
//!   `Date` when the response has none, `Connection: close` when the
//!   connection is to close;
//! - while a request is served the client's side is watched (once its
//!   body, if any, has been taken by the proxy to send, or let go of, as
//!   Go's server starts watching when a body is read to its end): a
//!   client that closes its end abandons its request, which is dropped;
//! - a head's first bytes start its clock (the connection's one
//!   [`HeadClock`]), and a graceful shutdown closes an idle connection and
//!   lets one in flight finish, with `Connection: close`: the connection's
//!   owner says when to stop ([`Lifecycle`]).
//!
//! A body served here is read on after its head for as long as its bytes are
//! there already, into a buffer the request's size, and handed to the service
//! whole; hyper would stream the same bytes to it. A body that stops short (the
//! client sends the rest later) goes to hyper with what came of it. Such a
//! request holds its bytes until the proxy has written them to the app, where
//! hyper would leave most of them in the kernel's receive buffer until then:
//! the same memory, counted in the process instead. A body the service does not
//! read (an answer of qproxy's own) leaves the connection open for the next
//! request, as Go's server does (hyper's closes it if one more read does not
//! finish the body).
//!
//! Anything else (a chunked body, or one still on its way, larger or sent after
//! `Expect: 100-continue`; an upgrade, `CONNECT`, HTTP/1.0, a `TE` header, a
//! head this module does not take whole, one that is not HTTP) is handed to
//! hyper with the bytes read so far, and hyper serves the connection from then
//! on: its answers to bad requests (`400`, `414`, `431`) are the ones clients
//! have always had.

mod body;
pub mod conn;
mod encode;
mod head;
mod parse;

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Request, Response};
use http_body::Body as HttpBody;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tower_service::Service;

pub use body::{BodyRead, MakeBody, WholeBody};
pub use head::HeadClock;
pub use parse::MAX_BODY;

use crate::BoxError;
use crate::wire::framing::{Encoder, Framing};
use crate::wire::read::{poll_read_at_most, poll_read_into};
use encode::{COPY_MAX, WriteQueue, encode_head};
use parse::{RequestParse, parse};

/// Most memory of its last head a connection keeps between requests, to
/// read the next one into.
const KEEP_READ: usize = 2048;
/// Bytes queued before they are written, even if the body has more ready.
const WRITE_AT: usize = 64 * 1024;
/// The longest head of a length-framed response held for its body's first
/// bytes: Go's server's write buffer.
const HEAD_HELD_MAX: usize = 4096;

/// What a connection needs from its owner besides its [`HeadClock`]: when
/// to finish (a graceful shutdown).
pub trait Lifecycle {
    /// Whether the connection is asked to finish.
    fn is_stopping(&self) -> bool;
    /// Resolves once the connection is asked to finish; made once for the
    /// connection's life.
    fn stopping(&self) -> impl Future<Output = ()>;
}

/// How a connection served here ended.
#[derive(Debug)]
pub enum Served {
    /// It is closed, or is to be.
    Closed,
    /// Its next request is hyper's, and so is the connection from now on:
    /// these bytes, read already, come first.
    HandOff(Bytes),
}

/// Serves requests on `io`, whose first bytes `first` have been read and
/// whose heads `clock` times, until the connection ends or a request is
/// one for hyper.
pub async fn serve<IO, S, RB, B, L>(
    io: &mut IO,
    first: Bytes,
    clock: &HeadClock,
    conn: &L,
    service: &mut S,
) -> Served
where
    IO: AsyncRead + AsyncWrite + Unpin,
    L: Lifecycle,
    RB: MakeBody,
    S: Service<Request<RB>, Response = Response<B>, Error = Infallible>,
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut pending = first
        .try_into_mut()
        .unwrap_or_else(|first| BytesMut::from(&first[..]));
    // hyper reuses the last response's header map for the next request.
    let mut spare = HeaderMap::new();
    let mut stopping = pin!(conn.stopping());
    // The write buffer, kept between requests while it is small.
    let mut write_buf = Vec::new();
    let mut first_head = true;
    loop {
        let mut started: Option<Instant> = None;
        // Bytes of this head have been read since the last response.
        let mut arrived = false;
        let (req, keep_alive, body_read) = loop {
            if !pending.is_empty() {
                // `pending` keeps the memory after the head's, and the
                // head's own once nothing holds it any more.
                let raw = pending.split().freeze();
                match parse(&raw, &mut spare) {
                    RequestParse::Request {
                        req,
                        keep_alive,
                        len,
                        body_read,
                    } => {
                        if raw.len() > len {
                            pending = BytesMut::from(&raw[len..]);
                        } else if raw.len() + pending.capacity() > KEEP_READ {
                            pending = BytesMut::new();
                        }
                        break (req, keep_alive, body_read);
                    }
                    RequestParse::Partial => {
                        // `pending` lets go first, so that the head's
                        // memory is `raw`'s alone and grows in place.
                        drop(std::mem::take(&mut pending));
                        pending = raw
                            .try_into_mut()
                            .unwrap_or_else(|raw| BytesMut::from(&raw[..]));
                    }
                    RequestParse::Short { whole } => {
                        // The request's memory, its size exactly: the
                        // bytes the kernel holds until they are read.
                        drop(std::mem::take(&mut pending));
                        pending = BytesMut::with_capacity(whole);
                        pending.extend_from_slice(&raw);
                        drop(raw);
                        // The rest of the body is read on while it is
                        // there already; one that is still on its way is
                        // streamed by hyper, with what came of it.
                        while pending.len() < whole {
                            let most = whole - pending.len();
                            let now = poll_fn(|cx| {
                                Poll::Ready(poll_read_at_most(io, &mut pending, most, cx))
                            });
                            if !matches!(now.await, Poll::Ready(Ok(n)) if n > 0) {
                                return Served::HandOff(pending.freeze());
                            }
                        }
                        continue;
                    }
                    RequestParse::Hyper => return Served::HandOff(raw),
                }
                // A later head's clock starts with its first bytes read
                // (bytes that came with the last request start none); the
                // first head's is the connection's own (`first_head`).
                if !first_head && arrived && started.is_none() {
                    started = Some(Instant::now());
                }
            }
            let read = poll_fn(|cx| poll_read_into(io, &mut pending, cx));
            let read = async {
                match started {
                    Some(at) => tokio::time::timeout_at(at + clock.timeout(), read)
                        .await
                        .unwrap_or(Ok(0)),
                    None => read.await,
                }
            };
            // A graceful shutdown closes a connection between requests, as
            // hyper does, whatever part of a head it holds. Bytes already
            // there are read first: a head that has come whole is served,
            // and its response closes the connection.
            let got = tokio::select! {
                biased;
                got = read => got,
                () = &mut stopping => return Served::Closed,
            };
            if !matches!(got, Ok(n) if n > 0) {
                return Served::Closed;
            }
            arrived = true;
        };
        if first_head {
            clock.first_read();
            first_head = false;
        }

        let head = req.method() == Method::HEAD;
        match poll_fn(|cx| service.poll_ready(cx)).await {
            Ok(()) => {}
            Err(never) => match never {},
        }
        let mut watch = Watch::new(&pending, body_read.as_ref());
        // The stack's future is made in place here (the request moved into
        // it, not first into the exchange's), and dropped once it answers.
        let answered = {
            let answer = pin!(service.call(req));
            exchange(io, &mut pending, answer, &mut watch).await
        };
        let Some(res) = answered else {
            return Served::Closed;
        };
        let keep_alive = keep_alive && !conn.is_stopping();
        let responded = respond(
            io,
            &mut pending,
            &mut write_buf,
            res,
            head,
            keep_alive,
            watch,
        );
        let Ok(kept) = responded.await else {
            return Served::Closed;
        };
        match kept {
            Some(headers) if !conn.is_stopping() => spare = headers,
            // The response was the connection's last: it closes cleanly.
            _ => {
                let _ = poll_fn(|cx| Pin::new(&mut *io).poll_shutdown(cx)).await;
                return Served::Closed;
            }
        }
    }
}

/// Waits for the stack's `answer` to a request, watching the client with
/// `watch` as hyper does (once the request's body, if any, has been read):
/// a client that closes its end (or fails) abandons the request, and
/// `None` is returned. The watch goes on to the response's writing: it
/// knows whether it polled the client in the wake-up that got the response.
async fn exchange<IO, F, B>(
    io: &mut IO,
    pending: &mut BytesMut,
    mut answer: Pin<&mut F>,
    watch: &mut Watch<'_>,
) -> Option<Response<B>>
where
    IO: AsyncRead + Unpin,
    F: Future<Output = Result<Response<B>, Infallible>>,
{
    poll_fn(|cx| {
        if watch.poll_gone(io, pending, cx).is_ready() {
            return Poll::Ready(None);
        }
        let unread = watch.waits_for_body();
        if let Poll::Ready(res) = answer.as_mut().poll(cx) {
            return Poll::Ready(match res {
                Ok(res) => Some(res),
                Err(never) => match never {},
            });
        }
        // The body has just been read: the watch starts now.
        if unread && !watch.waits_for_body() && watch.poll_gone(io, pending, cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// Writes a response: its head, then its body. `Ok(Some(map))` when the
/// connection may serve another request (with the response's header map,
/// emptied, for it), `Ok(None)` when it is to close after it, `Err` when
/// it is to close at once. `watch` watches the client, as it did for the
/// exchange.
async fn respond<IO, B>(
    io: &mut IO,
    pending: &mut BytesMut,
    write_buf: &mut Vec<u8>,
    res: Response<B>,
    head: bool,
    keep_alive: bool,
    mut watch: Watch<'_>,
) -> Result<Option<HeaderMap>, ()>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = res.into_parts();
    let length = if body.is_end_stream() {
        None
    } else {
        Some(body.size_hint().exact())
    };
    let mut out = WriteQueue {
        front: std::mem::take(write_buf),
        ..WriteQueue::default()
    };
    // Room for the head as hyper reckons it, and a small body.
    let small = length.flatten().filter(|&n| n <= COPY_MAX as u64);
    let room = 64 + parts.headers.len() * 32 + small.map_or(0, |n| n as usize);
    out.front.reserve(room);
    let (framing, mut last) = encode_head(&mut parts, length, head, keep_alive, &mut out.front)?;
    let mut encoder = Encoder::new(framing);
    // As with hyper, a body is dropped as soon as it has ended (its
    // guards settle then), before its last bytes are written.
    let mut body = pin!(Some(body));
    if length.is_none() || framing == Framing::Length(0) {
        body.set(None);
    }
    let mut watched = watch.armed;
    // Go's proxy (its `FlushInterval` 0 for a body of known length) sends
    // such a response's head with the body's first bytes, its server's
    // 4 KiB buffer flushing no sooner: the head waits for them here too
    // (unless it fills that buffer alone), so that a client that reads the
    // head and leaves has seen what it does with Go, and is counted so.
    let mut head_held = matches!(framing, Framing::Length(n) if n > 0);
    let written = poll_fn(|cx| {
        // The client is watched while the body waits, not before what the
        // body has ready: a body that ends in the wake-up that finds the
        // client gone has ended whole, as in Go, whose server takes the
        // body's last bytes into its buffer before any write can fail.
        // Once the client's socket has been polled and had nothing, its
        // hang-up wakes the task: each wake-up polls it until then, not at
        // every wait. The exchange that has just ended may have done so in
        // this wake-up already.
        let mut armed = std::mem::take(&mut watched);
        loop {
            let Some(mut polled) = body.as_mut().as_pin_mut() else {
                ready!(out.poll_write(io, cx)).map_err(|_| ())?;
                return Pin::new(&mut *io).poll_flush(cx).map_err(|_| ());
            };
            if out.queued() >= WRITE_AT {
                ready!(out.poll_write(io, cx)).map_err(|_| ())?;
            }
            let frame = match polled.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Some(frame),
                Poll::Ready(None) => None,
                Poll::Ready(Some(Err(e))) => {
                    let e: Box<dyn std::error::Error + Send + Sync> = e.into();
                    tracing::debug!(error = %e, "response body failed");
                    return Poll::Ready(Err(()));
                }
                Poll::Pending => {
                    if !armed {
                        if watch.poll_gone(io, pending, cx).is_ready() {
                            return Poll::Ready(Err(()));
                        }
                        armed = watch.armed;
                    }
                    if head_held && out.queued() < HEAD_HELD_MAX {
                        return Poll::Pending;
                    }
                    ready!(out.poll_write(io, cx)).map_err(|_| ())?;
                    ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(|_| ())?;
                    return Poll::Pending;
                }
            };
            let end = polled.is_end_stream();
            let (ended, with_data) = match frame.map(http_body::Frame::into_data) {
                Some(Ok(data)) if !data.is_empty() => {
                    out.data(&mut encoder, data);
                    head_held = false;
                    (end, true)
                }
                Some(Ok(_)) => (end, false),
                // Trailers go only to a client that asked for them (`TE:
                // trailers`), and such requests are hyper's: they end the
                // body.
                Some(Err(frame)) => (end || frame.is_trailers(), false),
                None => (true, false),
            };
            if ended {
                body.set(None);
                if !out.end(&mut encoder) {
                    if !with_data {
                        // Short of its length, and nothing more to write:
                        // hyper closes at once.
                        return Poll::Ready(Err(()));
                    }
                    // Its last bytes are written, then the connection closes.
                    last = true;
                }
            }
        }
    })
    .await;
    let kept = out.keep();
    written?;
    if kept.capacity() <= COPY_MAX {
        *write_buf = kept;
    }
    if framing == Framing::Close {
        last = true;
    }
    if last {
        return Ok(None);
    }
    parts.headers.clear();
    Ok(Some(parts.headers))
}

/// The client's side of a connection while a request is served: hyper
/// reads it, when nothing of the next request has come yet and the
/// request's body has been read, to notice a client that has gone.
struct Watch<'a> {
    watching: bool,
    /// The client's socket was polled in the last check and had nothing:
    /// its next bytes, or its hang-up, wake the task.
    armed: bool,
    /// The request's body, read whole here: until the stack has read it,
    /// the client is not watched, as Go does not watch it before a body is
    /// read to its end. (The body is read in the connection's own task,
    /// which polls the watch again after it: a body read in another task
    /// would start the watch only at the next wake-up.)
    body: Option<&'a BodyRead>,
}

impl<'a> Watch<'a> {
    fn new(pending: &BytesMut, body: Option<&'a BodyRead>) -> Self {
        Self {
            watching: pending.is_empty(),
            armed: false,
            body,
        }
    }

    /// Whether the watch waits for the stack to read the body.
    fn waits_for_body(&self) -> bool {
        self.body.is_some_and(|b| !b.is_read())
    }

    /// Ready when the client has closed its end or the connection failed;
    /// bytes that come (a pipelined request) are kept, and end the watch.
    fn poll_gone<IO: AsyncRead + Unpin>(
        &mut self,
        io: &mut IO,
        pending: &mut BytesMut,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        self.armed = false;
        if !self.watching || self.waits_for_body() {
            return Poll::Pending;
        }
        match poll_read_into(io, pending, cx) {
            Poll::Ready(Ok(0) | Err(_)) => Poll::Ready(()),
            Poll::Ready(Ok(_)) => {
                self.watching = false;
                Poll::Pending
            }
            Poll::Pending => {
                self.armed = true;
                Poll::Pending
            }
        }
    }
}
