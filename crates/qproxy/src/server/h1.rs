//! qproxy's own HTTP/1.1 server, for the requests that make most traffic:
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
//! in one write. Between requests a connection keeps only what it wrote
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
//! - a head's first bytes start its clock ([`super::head`]); a graceful
//!   shutdown closes an idle connection and lets one in flight finish,
//!   with `Connection: close`.
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

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io::{self, IoSlice, Write};
use std::pin::{Pin, pin};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{
    CONNECTION, CONTENT_LENGTH, DATE, EXPECT, Entry, TE, TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use http_body::Body as HttpBody;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tower::Service;

use super::graceful::Watcher;
use super::head::HeadClock;
use crate::common::body::{BodyRead, RequestBody, WholeBody};
use qproxy_http1::wire::date::http_date;
use qproxy_http1::wire::length::digits;
use qproxy_http1::wire::read::{poll_read_at_most, poll_read_into};
use qproxy_http1::wire::title_case::{header_line, title_case};
use qproxy_http1::wire::token::{connection_has, ends_chunked};

/// Header lines a head served here may have; one with more goes to hyper.
const STACK_HEADERS: usize = 64;
/// Most memory of its last head a connection keeps between requests, to
/// read the next one into.
const KEEP_READ: usize = 2048;
/// Longest head served here; a longer one goes to hyper, in front of
/// which those over Go's limit are refused. None served here is that long.
const MAX_HEAD: usize = 16 * 1024;
const _: () = assert!(MAX_HEAD < qproxy_http1::limits::MAX_HEADER_BYTES);
/// Largest request body served here, read whole before the request is
/// served when it is all there already.
const MAX_BODY: usize = 64 * 1024;
/// hyper's longest request target: a longer one is hyper's `414`.
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;
/// Data frames up to this size are copied after the head; larger ones
/// are written from where they are.
const COPY_MAX: usize = 16 * 1024;
/// Bytes queued before they are written, even if the body has more ready.
const WRITE_AT: usize = 64 * 1024;

/// How a connection served here ended.
#[derive(Debug)]
pub(super) enum Served {
    /// It is closed, or is to be.
    Closed,
    /// Its next request is hyper's, and so is the connection from now on:
    /// these bytes, read already, come first.
    HandOff(Bytes),
}

/// Serves requests on `io`, whose first bytes `first` have been read,
/// until the connection ends or a request is one for hyper.
pub(super) async fn serve<IO, S, B>(
    io: &mut IO,
    first: Bytes,
    clock: &HeadClock,
    service: &mut S,
    watcher: &Watcher,
) -> Served
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>,
    B: HttpBody<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut pending = first
        .try_into_mut()
        .unwrap_or_else(|first| BytesMut::from(&first[..]));
    // hyper reuses the last response's header map for the next request.
    let mut spare = HeaderMap::new();
    let mut stopping = pin!(watcher.stopping());
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
                    Parsed::Request {
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
                    Parsed::Partial => {
                        // `pending` lets go first, so that the head's
                        // memory is `raw`'s alone and grows in place.
                        drop(std::mem::take(&mut pending));
                        pending = raw
                            .try_into_mut()
                            .unwrap_or_else(|raw| BytesMut::from(&raw[..]));
                    }
                    Parsed::Short { whole } => {
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
                    Parsed::Hyper => return Served::HandOff(raw),
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
        let keep_alive = keep_alive && !watcher.is_stopping();
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
            Some(headers) if !watcher.is_stopping() => spare = headers,
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
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut parts, body) = res.into_parts();
    let length = if body.is_end_stream() {
        None
    } else {
        Some(body.size_hint().exact())
    };
    let mut out = Outgoing {
        front: std::mem::take(write_buf),
        ..Outgoing::default()
    };
    // Room for the head as hyper reckons it, and a small body.
    let small = length.flatten().filter(|&n| n <= COPY_MAX as u64);
    let room = 64 + parts.headers.len() * 32 + small.map_or(0, |n| n as usize);
    out.front.reserve(room);
    let (mut framing, mut last) =
        encode_head(&mut parts, length, head, keep_alive, &mut out.front)?;
    // As with hyper, a body is dropped as soon as it has ended (its
    // guards settle then), before its last bytes are written.
    let mut body = pin!(Some(body));
    if length.is_none() || framing == Framing::Length(0) {
        body.set(None);
    }
    let mut watched = watch.armed;
    let written = poll_fn(|cx| {
        // Once the client's socket has been polled and had nothing, its
        // hang-up wakes the task: each wake-up polls it until then, not
        // before every frame. The exchange that has just ended may have
        // done so in this wake-up already.
        let mut armed = std::mem::take(&mut watched);
        loop {
            if !armed {
                if watch.poll_gone(io, pending, cx).is_ready() {
                    return Poll::Ready(Err(()));
                }
                armed = watch.armed;
            }
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
                    ready!(out.poll_write(io, cx)).map_err(|_| ())?;
                    ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(|_| ())?;
                    return Poll::Pending;
                }
            };
            let end = polled.is_end_stream();
            let (ended, with_data) = match frame.map(http_body::Frame::into_data) {
                Some(Ok(data)) if !data.is_empty() => {
                    out.data(&mut framing, data);
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
                if !out.end(&mut framing) {
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
    if matches!(framing, Framing::Close) {
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

/// What a connection's next bytes hold.
// The request is moved once, straight out; boxing it would cost an
// allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Parsed {
    /// A request served here, its head (and body) `len` bytes long.
    Request {
        req: Request<RequestBody>,
        keep_alive: bool,
        len: usize,
        /// Tells when the stack has read the body, if it has one.
        body_read: Option<BodyRead>,
    },
    /// Not a whole head yet.
    Partial,
    /// A whole head whose body, small enough to be served here, has not
    /// all come yet: the request is `whole` bytes long.
    Short { whole: usize },
    /// A request, or bytes, for hyper.
    Hyper,
}

/// Reads the request head at the start of `raw` (and its body, when it is
/// served here) into a request whose header values share `raw`, its
/// header map `spare` (empty), taken.
fn parse(raw: &Bytes, spare: &mut HeaderMap) -> Parsed {
    let mut lines = [httparse::EMPTY_HEADER; STACK_HEADERS];
    let mut parsed = httparse::Request::new(&mut lines);
    let mut len = match parsed.parse(raw) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if raw.len() < MAX_HEAD => return Parsed::Partial,
        _ => return Parsed::Hyper,
    };
    if len > MAX_HEAD || parsed.version != Some(1) {
        return Parsed::Hyper;
    }
    let (Some(method), Some(path)) = (parsed.method, parsed.path) else {
        return Parsed::Hyper;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Hyper;
    };
    if method == Method::CONNECT || path.len() > MAX_URI_LEN {
        return Parsed::Hyper;
    }
    let Ok(uri) = Uri::from_maybe_shared(raw.slice_ref(path.as_bytes())) else {
        return Parsed::Hyper;
    };
    let mut headers = std::mem::take(spare);
    headers.reserve(parsed.headers.len());
    let mut keep_alive = true;
    let mut length = None;
    let mut expect = false;
    for line in parsed.headers.iter() {
        let Ok(name) = HeaderName::from_bytes(line.name.as_bytes()) else {
            return Parsed::Hyper;
        };
        let Ok(value) = HeaderValue::from_maybe_shared(raw.slice_ref(line.value)) else {
            return Parsed::Hyper;
        };
        match name {
            // A length said once, in digits, is a body this module may take.
            CONTENT_LENGTH if length.is_none() => match digits(value.as_bytes()) {
                Some(n) => length = Some(n),
                None => return Parsed::Hyper,
            },
            CONTENT_LENGTH | TRANSFER_ENCODING | UPGRADE | TE => return Parsed::Hyper,
            CONNECTION if keep_alive => keep_alive = !connection_has(&value, "close"),
            EXPECT => expect = true,
            _ => {}
        }
        headers.append(name, value);
    }
    let mut body_read = None;
    let body = match length {
        None | Some(0) => RequestBody::Empty,
        // hyper answers `Expect: 100-continue` as the body is first read.
        Some(_) if expect => return Parsed::Hyper,
        // A body small enough to be served here, whole.
        Some(n) if n <= MAX_BODY as u64 => {
            let end = len + n as usize;
            if raw.len() < end {
                // Parsed again once the body is here: the map is kept.
                headers.clear();
                *spare = headers;
                return Parsed::Short { whole: end };
            }
            let (body, read) = WholeBody::new(raw.slice(len..end));
            len = end;
            body_read = Some(read);
            RequestBody::Full(body)
        }
        // hyper streams a larger one to the app as it comes.
        Some(_) => return Parsed::Hyper,
    };
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Parsed::Request {
        req,
        keep_alive,
        len,
        body_read,
    }
}

/// How a response body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `Content-Length`: the bytes still owed.
    Length(u64),
    /// Chunked.
    Chunked,
    /// To the connection's close.
    Close,
}

/// The bytes of a response on their way out: `front`, then `data` (a
/// large data frame, written from where it is), then `back`.
#[derive(Debug, Default)]
struct Outgoing {
    front: Vec<u8>,
    data: Bytes,
    back: Vec<u8>,
}

impl Outgoing {
    /// The buffer with the most room, emptied, to keep for the next
    /// response.
    fn keep(self) -> Vec<u8> {
        let mut kept = if self.front.capacity() >= self.back.capacity() {
            self.front
        } else {
            self.back
        };
        kept.clear();
        kept
    }

    fn queued(&self) -> usize {
        self.front.len() + self.data.len() + self.back.len()
    }

    /// Where small writes go: after `data`, once there is one.
    fn tail(&mut self) -> &mut Vec<u8> {
        if self.data.is_empty() {
            &mut self.front
        } else {
            &mut self.back
        }
    }

    /// Queues a data frame, framed as `framing` says.
    fn data(&mut self, framing: &mut Framing, mut data: Bytes) {
        match framing {
            Framing::Length(owed) => {
                // More than is owed: what is owed, as hyper writes it.
                if let Ok(owed) = usize::try_from(*owed)
                    && data.len() > owed
                {
                    data.truncate(owed);
                }
                *owed -= data.len() as u64;
            }
            Framing::Chunked => {
                let _ = write!(self.tail(), "{:X}\r\n", data.len());
            }
            Framing::Close => {}
        }
        if data.len() <= COPY_MAX || !self.data.is_empty() {
            self.tail().extend_from_slice(&data);
        } else {
            self.data = data;
        }
        if *framing == Framing::Chunked {
            self.tail().extend_from_slice(b"\r\n");
        }
    }

    /// Queues the body's end; false when the body ended short of its
    /// `Content-Length`, which leaves the connection to close at once.
    fn end(&mut self, framing: &mut Framing) -> bool {
        match framing {
            Framing::Length(0) | Framing::Close => true,
            Framing::Length(_) => false,
            Framing::Chunked => {
                self.tail().extend_from_slice(b"0\r\n\r\n");
                *framing = Framing::Length(0);
                true
            }
        }
    }

    /// Writes everything queued.
    fn poll_write<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.queued() > 0 {
            let n = if self.data.is_empty() && self.back.is_empty() {
                ready!(Pin::new(&mut *io).poll_write(cx, &self.front))?
            } else {
                let bufs = [
                    IoSlice::new(&self.front),
                    IoSlice::new(&self.data),
                    IoSlice::new(&self.back),
                ];
                ready!(Pin::new(&mut *io).poll_write_vectored(cx, &bufs))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.advance(n);
        }
        Poll::Ready(Ok(()))
    }

    fn advance(&mut self, mut n: usize) {
        let front = n.min(self.front.len());
        self.front.drain(..front);
        n -= front;
        let data = n.min(self.data.len());
        self.data.advance(data);
        if self.data.is_empty() {
            // Written: its memory goes back now (an emptied `Bytes` still
            // holds it), so that the body it came from can read into it
            // again.
            self.data = Bytes::new();
        }
        n -= data;
        self.back.drain(..n.min(self.back.len()));
        if self.data.is_empty() && self.front.is_empty() {
            std::mem::swap(&mut self.front, &mut self.back);
        }
    }
}

/// Writes the head of a response to a request (`head`: a `HEAD`) as
/// hyper's server writes it, and says how its body is framed and whether
/// the connection closes after it. `length` is the body's size as hyper
/// takes it: `None` for no body, `Some(None)` for a size unknown.
/// `Err` when hyper would write nothing and close: a `Content-Length` or
/// `Transfer-Encoding` it cannot write.
fn encode_head(
    parts: &mut http::response::Parts,
    length: Option<Option<u64>>,
    head: bool,
    keep_alive: bool,
    dst: &mut Vec<u8>,
) -> Result<(Framing, bool), ()> {
    if !keep_alive {
        match parts.headers.entry(CONNECTION) {
            Entry::Occupied(mut entry) => {
                if !entry.iter().any(|v| connection_has(v, "close")) {
                    entry.append(HeaderValue::from_static("close"));
                }
            }
            Entry::Vacant(entry) => {
                entry.insert(HeaderValue::from_static("close"));
            }
        }
    }
    let status = parts.status;
    let mut last = !keep_alive;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        last = true;
    } else if status.is_informational() {
        // hyper answers no final response with a `1xx`: it writes `500`
        // and closes.
        dst.extend_from_slice(b"HTTP/1.1 500 Internal Server Error\r\n");
        if !head {
            dst.extend_from_slice(b"Content-Length: 0\r\n");
        }
        finish_head(dst, false);
        return Ok((Framing::Length(0), true));
    }
    let reason = parts.extensions.get::<hyper::ext::ReasonPhrase>();
    let http10 = parts.version == Version::HTTP_10;
    if !http10 && status == StatusCode::OK && reason.is_none() {
        dst.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        dst.extend_from_slice(if http10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
        dst.extend_from_slice(status.as_str().as_bytes());
        dst.push(b' ');
        match reason {
            Some(reason) => dst.extend_from_slice(reason.as_bytes()),
            None => dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
        }
        dst.extend_from_slice(b"\r\n");
    }

    let no_content = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let can_chunk = !head && !no_content;
    let can_length = !no_content;

    let mut framing = Framing::Length(0);
    let mut wrote_len = false;
    // A `Content-Length`, `Transfer-Encoding`, `Connection` or `Trailer`
    // line is open: further values of the same name join it.
    let mut open = false;
    let mut must_chunk = false;
    let mut first_len = None;
    let mut wrote_date = false;
    let mut current: Option<&HeaderName> = None;
    for (name, value) in parts.headers.iter() {
        if !current.is_some_and(|c| std::ptr::eq(c, name)) {
            close_line(dst, &mut open, must_chunk);
            current = Some(name);
        }
        match *name {
            CONTENT_LENGTH => {
                if wrote_len && !open {
                    return Err(());
                }
                match length {
                    Some(Some(known)) => {
                        if !open {
                            framing = Framing::Length(known);
                            open_line(dst, name, value);
                            wrote_len = true;
                            open = true;
                        }
                        continue;
                    }
                    Some(None) => {
                        let Some(len) = digits(value.as_bytes()) else {
                            return Err(());
                        };
                        if let Some(first) = first_len {
                            if first != len {
                                return Err(());
                            }
                            continue;
                        }
                        framing = Framing::Length(len);
                        open_line(dst, name, value);
                        wrote_len = true;
                        open = true;
                        first_len = Some(len);
                        continue;
                    }
                    None if !head => continue,
                    None => wrote_len = true,
                }
            }
            TRANSFER_ENCODING => {
                if wrote_len && !open {
                    return Err(());
                }
                if http10 || !can_chunk {
                    continue;
                }
                wrote_len = true;
                must_chunk = !ends_chunked(value);
                if !open {
                    framing = Framing::Chunked;
                }
                add_to_line(dst, &mut open, name, value);
                continue;
            }
            CONNECTION => {
                last = last || connection_has(value, "close");
                add_to_line(dst, &mut open, name, value);
                continue;
            }
            DATE => wrote_date = true,
            TRAILER => {
                if http10 || !can_chunk {
                    continue;
                }
                add_to_line(dst, &mut open, name, value);
                continue;
            }
            _ => {}
        }
        header_line(dst, name, value);
    }
    close_line(dst, &mut open, must_chunk);

    if !wrote_len {
        framing = match length {
            Some(None) if http10 || !can_chunk => Framing::Close,
            Some(None) => {
                dst.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
                Framing::Chunked
            }
            None | Some(Some(0)) => {
                if can_length && !head {
                    dst.extend_from_slice(b"Content-Length: 0\r\n");
                }
                Framing::Length(0)
            }
            Some(Some(len)) if can_length => {
                dst.extend_from_slice(b"Content-Length: ");
                let _ = write!(dst, "{len}\r\n");
                Framing::Length(len)
            }
            Some(Some(_)) => Framing::Length(0),
        };
    }
    if head || no_content {
        framing = Framing::Length(0);
    }
    finish_head(dst, wrote_date);
    if framing == Framing::Close {
        last = true;
    }
    Ok((framing, last))
}

/// Starts a header line that later values of its name may join.
fn open_line(dst: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    title_case(dst, name.as_str());
    dst.extend_from_slice(b": ");
    dst.extend_from_slice(value.as_bytes());
}

/// Adds a value to the open line, or opens one with it.
fn add_to_line(dst: &mut Vec<u8>, open: &mut bool, name: &HeaderName, value: &HeaderValue) {
    if *open {
        dst.extend_from_slice(b", ");
        dst.extend_from_slice(value.as_bytes());
    } else {
        open_line(dst, name, value);
        *open = true;
    }
}

/// Ends the open line, if one is; a `Transfer-Encoding` whose last coding
/// is not `chunked` gets it (hyper adds it to whichever line it ends).
fn close_line(dst: &mut Vec<u8>, open: &mut bool, must_chunk: bool) {
    if *open {
        if must_chunk {
            dst.extend_from_slice(b", chunked\r\n");
        } else {
            dst.extend_from_slice(b"\r\n");
        }
        *open = false;
    }
}

/// Adds the `Date` (unless the response has one) and the head's end.
fn finish_head(dst: &mut Vec<u8>, wrote_date: bool) {
    if !wrote_date {
        dst.extend_from_slice(b"Date: ");
        http_date(dst);
        dst.extend_from_slice(b"\r\n");
    }
    dst.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    //! qproxy's server against hyper's: the same bytes sent to a port
    //! served each way must reach the service as the same requests and
    //! come back as the same bytes (but for the `Date`).

    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use http_body::Frame;
    use http_body_util::combinators::BoxBody;
    use http_body_util::{BodyExt, Empty, Full, StreamBody};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::service_fn;

    use super::super::conn::{connection, main_builder};
    use super::super::graceful::GracefulShutdown;
    use super::super::head::{HEAD_TIMEOUT, HeadClock};
    use super::*;
    use crate::common::Accepted;

    type TestBody = BoxBody<Bytes, Infallible>;
    type Answer = fn() -> Response<TestBody>;

    /// What the service saw of a request.
    #[derive(Debug, PartialEq)]
    struct Seen {
        method: Method,
        uri: Uri,
        version: Version,
        headers: Vec<(HeaderName, HeaderValue)>,
        /// The body's length as the service was told it.
        length: Option<u64>,
        body: Bytes,
    }

    /// Serves `server` as a main-port connection, `builder`'s protocols
    /// and `service` behind it, from accept.
    fn spawn_connection<S, B>(
        server: tokio::io::DuplexStream,
        builder: super::super::conn::Protocols,
        service: S,
        graceful: &GracefulShutdown,
    ) -> tokio::task::JoinHandle<()>
    where
        S: Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let remote = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 1);
        tokio::spawn(connection(
            server,
            HeadClock::new(HEAD_TIMEOUT),
            builder,
            service,
            graceful.watcher(),
            Accepted { remote },
        ))
    }

    /// How the test service treats a request's body.
    #[derive(Debug, Clone, Copy)]
    enum Reading {
        /// Reads it whole, then answers.
        First,
        /// Reads it whole, then waits half a second (paused time) to answer.
        ThenWait,
        /// Waits half a second, then answers without reading it.
        Never,
    }

    /// Sends `sent` to a main-port connection served by qproxy's server
    /// (`own`) or by hyper alone, whose service answers every request
    /// with `answer`, treating bodies as `reading` says; closes the
    /// client's end after it when `hang_up`.
    /// Returns what came back until the connection closed or went quiet,
    /// with each `Date` masked, and the requests the service saw.
    async fn run_with(
        own: bool,
        sent: &[u8],
        answer: Answer,
        hang_up: bool,
        reading: Reading,
    ) -> (String, Vec<Seen>) {
        let (mut client, server) = tokio::io::duplex(1 << 18);
        let graceful = GracefulShutdown::new();
        let builder = if own {
            main_builder()
        } else {
            main_builder().hyper_only()
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let service = service_fn(move |req: Request<RequestBody>| {
            let record = record.clone();
            async move {
                let (parts, body) = req.into_parts();
                let length = body.size_hint().exact();
                let body = match reading {
                    Reading::Never => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        Bytes::new()
                    }
                    Reading::First | Reading::ThenWait => body
                        .collect()
                        .await
                        .map(|c| c.to_bytes())
                        .unwrap_or_default(),
                };
                if let Reading::ThenWait = reading {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                record.lock().unwrap().push(Seen {
                    method: parts.method,
                    uri: parts.uri,
                    version: parts.version,
                    headers: parts
                        .headers
                        .iter()
                        .map(|(n, v)| (n.clone(), v.clone()))
                        .collect(),
                    length,
                    body,
                });
                Ok::<_, Infallible>(answer())
            }
        });
        spawn_connection(server, builder, service, &graceful);
        client.write_all(sent).await.unwrap();
        if hang_up {
            client.shutdown().await.unwrap();
        }
        let mut got = Vec::new();
        let mut buf = [0; 4096];
        // Time is paused: the timeout fires once nothing else can happen.
        while let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_secs(1), client.read(&mut buf)).await
            && n > 0
        {
            got.extend_from_slice(&buf[..n]);
        }
        let got = String::from_utf8_lossy(&got)
            .split("\r\n")
            .map(|line| {
                if line.starts_with("Date: ") {
                    "Date: *"
                } else {
                    line
                }
            })
            .collect::<Vec<_>>()
            .join("\r\n");
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        (got, seen)
    }

    /// Runs `sent` both ways and checks that they agree; returns what
    /// came back.
    async fn same(sent: &[u8], answer: Answer, hang_up: bool) -> String {
        same_with(sent, answer, hang_up, Reading::First).await
    }

    /// [`same`], the service treating bodies as `reading` says.
    async fn same_with(sent: &[u8], answer: Answer, hang_up: bool, reading: Reading) -> String {
        let (ours, ours_seen) = run_with(true, sent, answer, hang_up, reading).await;
        let (hyper, hyper_seen) = run_with(false, sent, answer, hang_up, reading).await;
        assert_eq!(
            ours,
            hyper,
            "answers to {:?}",
            String::from_utf8_lossy(sent)
        );
        assert_eq!(
            ours_seen,
            hyper_seen,
            "requests of {:?}",
            String::from_utf8_lossy(sent)
        );
        ours
    }

    fn body(b: impl Into<Full<Bytes>>) -> TestBody {
        b.into().boxed()
    }

    /// A body of unknown length: these frames.
    fn streamed(frames: Vec<Frame<Bytes>>) -> TestBody {
        StreamBody::new(futures_util::stream::iter(frames.into_iter().map(Ok))).boxed()
    }

    fn with(
        status: u16,
        headers: &[(&'static str, &'static str)],
        b: TestBody,
    ) -> Response<TestBody> {
        let mut res = Response::new(b);
        *res.status_mut() = StatusCode::from_u16(status).unwrap();
        for (name, value) in headers {
            res.headers_mut()
                .append(*name, HeaderValue::from_static(value));
        }
        res
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";

    const ANSWERS: &[(&str, Answer)] = &[
        ("empty", || Response::new(Empty::new().boxed())),
        ("sized", || {
            with(200, &[("content-type", "text/plain")], body("hello"))
        }),
        ("sized, with its length", || {
            with(200, &[("content-length", "5")], body("hello"))
        }),
        ("not found", || with(404, &[], body("nope"))),
        ("no content, with a length", || {
            with(204, &[("content-length", "0")], Empty::new().boxed())
        }),
        ("not modified, with a body", || with(304, &[], body("x"))),
        ("streamed", || {
            with(
                200,
                &[],
                streamed(vec![Frame::data("he".into()), Frame::data("llo".into())]),
            )
        }),
        ("streamed, with a length", || {
            with(
                200,
                &[("content-length", "5")],
                streamed(vec![Frame::data("hello".into())]),
            )
        }),
        ("streamed, short of its length", || {
            with(
                200,
                &[("content-length", "9")],
                streamed(vec![Frame::data("hello".into())]),
            )
        }),
        ("closing", || {
            with(200, &[("connection", "close")], body("bye"))
        }),
        ("coded", || {
            with(
                200,
                &[("transfer-encoding", "gzip")],
                streamed(vec![Frame::data("z".into())]),
            )
        }),
        ("trailers", || {
            let mut trailers = HeaderMap::new();
            trailers.insert("x-t", HeaderValue::from_static("1"));
            with(
                200,
                &[("trailer", "x-t")],
                streamed(vec![Frame::data("a".into()), Frame::trailers(trailers)]),
            )
        }),
        ("a reason of its own", || {
            let mut res = with(200, &[], body("a"));
            res.extensions_mut()
                .insert(hyper::ext::ReasonPhrase::from_static(b"Fine"));
            res
        }),
        ("no standard reason", || with(299, &[], body("a"))),
        ("HTTP/1.0", || {
            let mut res = with(200, &[], body("a"));
            *res.version_mut() = Version::HTTP_10;
            res
        }),
        ("repeated fields", || {
            with(
                200,
                &[
                    ("set-cookie", "a=1"),
                    ("x-a", "1"),
                    ("set-cookie", "b=2"),
                    ("connection", "keep-alive"),
                    ("connection", "x-a"),
                ],
                body("a"),
            )
        }),
        ("dated", || {
            with(200, &[("date", "Tue, 01 Jan 2030 00:00:00 GMT")], body("a"))
        }),
        ("informational", || with(100, &[], Empty::new().boxed())),
    ];

    #[tokio::test(start_paused = true)]
    async fn every_response_is_written_as_hyper_writes_it() {
        for (name, answer) in ANSWERS {
            for request in [
                GET,
                b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            ] {
                let got = same(request, *answer, false).await;
                // A body short of its length: hyper closes, writing nothing.
                let short = name.contains("short") && !request.starts_with(b"HEAD");
                assert_eq!(got.starts_with("HTTP/1."), !short, "{name}: {got:?}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_request_reaches_the_service_as_hyper_reads_it() {
        let requests: &[&[u8]] = &[
            b"GET /a?b=c HTTP/1.1\r\nHost: a\r\nX-M: 1\r\nX-M: 2\r\nAccept: */*\r\n\r\n",
            b"GET http://example.com/x HTTP/1.1\r\nHost: a\r\n\r\n",
            b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\nHost: a\n\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: \xe9t\xe9\r\nX-Empty:\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            // Pipelined: served here, then by hyper from the request with
            // a body on.
            b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\nPOST /3 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhiGET /4 HTTP/1.1\r\nHost: a\r\n\r\n",
            // A head split across the pipelined bytes.
            b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHo",
            // Bodies that came whole, served here, then what follows.
            b"POST /e HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
            b"POST /1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhiPUT /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nyouGET /3 HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nConnection: close\r\n\r\nxGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 00003\r\n\r\nabc",
            // Bodies for hyper: still coming, a length said twice or not
            // in digits, `Expect`, one over the size served here.
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\nhello",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +2\r\n\r\nhi",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 2\r\n\r\nhi",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\nhi",
            b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        ];
        for request in requests {
            same(request, ANSWERS[1].1, false).await;
        }
    }

    /// Bodies larger than one read, and than the size served here, reach
    /// the service as with hyper.
    #[tokio::test(start_paused = true)]
    async fn larger_bodies_reach_the_service_as_hyper_reads_them() {
        for size in [3_000, 5_000, MAX_BODY, MAX_BODY + 1] {
            let mut sent = format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n")
                .into_bytes();
            sent.resize(sent.len() + size, b'b');
            sent.extend_from_slice(GET);
            same(&sent, ANSWERS[1].1, false).await;
        }
    }

    /// Which requests with a body are served here: those whose length is
    /// said once, in digits, no larger than [`MAX_BODY`], that do not wait
    /// on `Expect`; read on when the body has not all come yet.
    #[test]
    fn a_small_body_is_served_here() {
        let head = |extra: &str, length: usize| {
            format!("POST / HTTP/1.1\r\nHost: a\r\n{extra}Content-Length: {length}\r\n\r\n")
        };
        let parsed = |sent: Vec<u8>| match parse(&Bytes::from(sent), &mut HeaderMap::new()) {
            Parsed::Request { req, len, .. } => match req.into_body() {
                RequestBody::Full(mut body) => format!("whole {} of {len}", body.take().len()),
                other => panic!("not a whole body: {other:?}"),
            },
            Parsed::Short { whole } => format!("short of {whole}"),
            Parsed::Partial => "partial".into(),
            Parsed::Hyper => "hyper".into(),
        };
        let mut sent = head("", 5).into_bytes();
        let len = sent.len();
        sent.extend_from_slice(b"helloGET");
        assert_eq!(parsed(sent), format!("whole 5 of {}", len + 5));

        let mut largest = head("", MAX_BODY).into_bytes();
        let len = largest.len();
        largest.resize(len + MAX_BODY, b'x');
        assert_eq!(
            parsed(largest.clone()),
            format!("whole {MAX_BODY} of {}", len + MAX_BODY)
        );
        largest.truncate(len + 10);
        assert_eq!(parsed(largest), format!("short of {}", len + MAX_BODY));

        let mut over = head("", MAX_BODY + 1).into_bytes();
        over.resize(over.len() + MAX_BODY + 1, b'x');
        assert_eq!(parsed(over), "hyper");
        let expect = head("Expect: 100-continue\r\n", 5) + "hello";
        assert_eq!(parsed(expect.into_bytes()), "hyper");
        let twice = head("Content-Length: 5\r\n", 5) + "hello";
        assert_eq!(parsed(twice.into_bytes()), "hyper");
    }

    /// A body larger than one read, sent at once, is read whole and
    /// served here; a larger one than [`MAX_BODY`] is streamed by hyper.
    #[tokio::test]
    async fn a_body_sent_at_once_is_read_whole() {
        for (size, whole) in [(20_000, true), (MAX_BODY, true), (MAX_BODY + 1, false)] {
            let (mut client, server) = tokio::io::duplex(4 * MAX_BODY);
            let graceful = GracefulShutdown::new();
            let service = service_fn(move |req: Request<RequestBody>| async move {
                let served = matches!(req.body(), RequestBody::Full(_));
                let got = req.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(got.len(), size);
                assert_eq!(served, whole, "a body of {size} bytes served here");
                Ok::<_, Infallible>(with(200, &[], body("ok")))
            });
            let served = spawn_connection(server, main_builder(), service, &graceful);
            let mut sent = format!(
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
            )
            .into_bytes();
            sent.resize(sent.len() + size, b'b');
            client.write_all(&sent).await.unwrap();
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            assert!(
                got.ends_with(b"\r\n\r\nok"),
                "{}",
                String::from_utf8_lossy(&got)
            );
            served.await.unwrap();
        }
    }

    /// A client that hangs up after its body abandons its request once the body
    /// has been read (or let go of), as with Go's server, whose watch for a
    /// hang-up starts when a body is read to its end: not while the request
    /// waits (as in the breaker's queue) with its body unread. (hyper's server
    /// watches once it has read a body that fits one read itself, whoever reads
    /// it.)
    #[tokio::test(start_paused = true)]
    async fn a_hang_up_after_a_body_counts_once_the_body_is_read() {
        let sent = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
        // The service ran to its end: the request was not abandoned while
        // its body waited unread (its answer then finds the client gone).
        let (_, seen) = run_with(true, sent, ANSWERS[1].1, true, Reading::Never).await;
        assert_eq!(seen.len(), 1);
        let abandoned = same_with(sent, ANSWERS[1].1, true, Reading::ThenWait).await;
        assert_eq!(abandoned, "");
    }

    /// A body the service never reads leaves the connection open for the
    /// next request, as Go's server leaves it (it reads up to 256 KiB of
    /// an unread body to keep the connection); hyper's closes when one
    /// more read does not finish the body.
    #[tokio::test(start_paused = true)]
    async fn a_body_left_unread_keeps_the_connection_as_go_does() {
        let mut sent = format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {MAX_BODY}\r\n\r\n")
            .into_bytes();
        sent.resize(sent.len() + MAX_BODY, b'b');
        sent.extend_from_slice(GET);
        let (got, seen) = run_with(true, &sent, ANSWERS[1].1, false, Reading::Never).await;
        assert_eq!(got.matches("HTTP/1.1 200 OK").count(), 2, "{got:?}");
        assert_eq!(seen.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_hangs_up_abandons_its_request_as_with_hyper() {
        let got = same(GET, ANSWERS[1].1, true).await;
        assert_eq!(got, "");
    }

    /// A service that reads the request's body and answers in the same
    /// wake-up, with a body that sends a frame and then waits: a client
    /// that hangs up then is noticed, and the body let go of.
    #[tokio::test(start_paused = true)]
    async fn a_hang_up_while_a_streamed_answer_waits_ends_it() {
        use futures_util::StreamExt;
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let graceful = GracefulShutdown::new();
        let (held, mut released) = tokio::sync::oneshot::channel::<()>();
        let held = Arc::new(Mutex::new(Some(held)));
        let service = service_fn(move |req: Request<RequestBody>| {
            let held = held.lock().unwrap().take();
            async move {
                let _ = req.into_body().collect().await;
                let waits = futures_util::stream::poll_fn(move |_| {
                    let _held = &held;
                    Poll::<Option<Result<Frame<Bytes>, Infallible>>>::Pending
                });
                let frames = futures_util::stream::iter([Ok(Frame::data(Bytes::from("a")))]);
                Ok::<_, Infallible>(with(
                    200,
                    &[],
                    BodyExt::boxed(StreamBody::new(frames.chain(waits))),
                ))
            }
        });
        spawn_connection(server, main_builder(), service, &graceful);
        client
            .write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0; 1024];
        while !got.ends_with(b"\r\n1\r\na\r\n") {
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        assert!(released.try_recv().is_err(), "the body is still held");
        client.shutdown().await.unwrap();
        // Time is paused: the hour passes at once if nothing else can happen.
        let noticed = tokio::time::timeout(Duration::from_secs(3600), released).await;
        assert!(noticed.is_ok(), "the hang-up went unnoticed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_streamed_body_arrives_whole() {
        fn large() -> Response<TestBody> {
            let frames = (0..8u8)
                .map(|i| Frame::data(Bytes::from(vec![b'a' + i; 40_000])))
                .collect();
            with(200, &[], streamed(frames))
        }
        let got = same(GET, large, false).await;
        assert!(got.ends_with("\r\n0\r\n\r\n"));
    }

    /// Heads read one after another into the memory a connection keeps
    /// (a head its own size, then smaller, larger, over the limit kept)
    /// reach the service whole, whether it lets go of each request or
    /// holds on to all of them.
    #[tokio::test(start_paused = true)]
    async fn heads_read_into_kept_memory_arrive_whole() {
        for hold in [false, true] {
            let (mut client, server) = tokio::io::duplex(1 << 16);
            let graceful = GracefulShutdown::new();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let held = Arc::new(Mutex::new(Vec::new()));
            let (record, keep) = (seen.clone(), held.clone());
            let service = service_fn(move |req: Request<RequestBody>| {
                let mut line = format!("{} {}", req.method(), req.uri());
                for (name, value) in req.headers() {
                    line += &format!(" {name}={}", value.to_str().unwrap_or("?"));
                }
                record.lock().unwrap().push(line);
                if hold {
                    keep.lock().unwrap().push(req);
                }
                async { Ok::<_, Infallible>(with(200, &[], body("ok"))) }
            });
            spawn_connection(server, main_builder(), service, &graceful);
            let mut expected = Vec::new();
            for (i, pad) in [10, 300, 40, 1_500, 3_000, 20, 900].into_iter().enumerate() {
                let value = char::from(b'a' + i as u8).to_string().repeat(pad);
                client
                    .write_all(
                        format!("GET /{i} HTTP/1.1\r\nHost: h{i}\r\nX-Pad: {value}\r\n\r\n")
                            .as_bytes(),
                    )
                    .await
                    .unwrap();
                expected.push(format!("GET /{i} host=h{i} x-pad={value}"));
                // The whole response, before the next request.
                let mut got = Vec::new();
                let mut buf = [0; 1024];
                while !got.ends_with(b"\r\n\r\nok") {
                    let n = client.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the connection closed");
                    got.extend_from_slice(&buf[..n]);
                }
            }
            assert_eq!(*seen.lock().unwrap(), expected, "holding requests: {hold}");
            for (req, line) in held.lock().unwrap().iter().zip(&expected) {
                assert!(line.starts_with(&format!("GET {}", req.uri())));
            }
        }
    }

    /// A data frame, once written, lets go of its memory, so that the
    /// body it came from reads into the same buffer again instead of a
    /// new one for every read.
    #[tokio::test]
    async fn a_written_frame_lets_go_of_the_body_buffer() {
        let size = 2 * COPY_MAX;
        let mut read = BytesMut::with_capacity(2 * size);
        read.resize(size, b'x');
        let frame = read.split_to(size).freeze();
        let mut framing = Framing::Length(size as u64);
        let mut out = Outgoing::default();
        out.data(&mut framing, frame);
        let mut written = Vec::new();
        poll_fn(|cx| out.poll_write(&mut written, cx))
            .await
            .unwrap();
        assert_eq!(written.len(), size);
        assert!(
            read.try_reclaim(2 * size),
            "the written frame still holds the body's buffer"
        );
    }
}
