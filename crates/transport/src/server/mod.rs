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
//! adapter. Here a served connection is one `Conn` (its read buffer, its
//! spare header map, its write buffer, its head clock), a response being
//! written one `Writing` (its write queue, its body and how it is framed,
//! the bytes its body spliced into the pipe it lent it: see
//! [`splice`](mod@crate::splice)),
//! and [`serve`] a loop over the connection's steps: the connection's task
//! reads a request head into a buffer the size of what came, parses it
//! with `httparse` (hyper's parser) into a request whose header values
//! share that buffer, calls the port's service, and writes the response
//! head and the first bytes of its body in one write (the head of a body of
//! known length waits for them, as Go's proxy sends it). A connection whose
//! next request has begun to come (pipelined, or sent while a response was
//! written) keeps what it wrote last (up to 16 KiB) and its last head's
//! memory (up to 2 KiB) for it, and so does one that waits for its next
//! request for as long as a busy client leaves between two (a second or
//! two). One that has waited longer holds nothing: [`serve`] returns
//! ([`Served::Idle`]), its state and buffers freed, and the connection's
//! task waits for the next bytes with no room for them until they come, as
//! nginx and HAProxy wait.
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

use std::any::Any;
use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Request, Response};
use http_body::{Body as HttpBody, Frame};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower_service::Service;

pub use body::{BodyRead, MakeBody, WholeBody};
pub use head::HeadClock;
pub use parse::MAX_BODY;

use crate::BoxError;
use crate::splice::{self, Lent, Pipe, SPLICE_MAX, SPLICE_MIN};
use crate::wire::chunked::{CHUNK_END, HexCase};
use crate::wire::framing::{Encoded, Encoder, Framing};
use crate::wire::read::{poll_read_at_most, poll_read_into};
use encode::{COPY_MAX, WriteQueue, encode_head};
use parse::{RequestParse, parse};

/// Most memory of its last head a connection keeps between requests, to
/// read the next one into.
const KEEP_READ: usize = 2048;
/// How long a connection waiting for its next request keeps its room (its
/// state, about 3 KiB with qproxy's stack, and its buffers) for it, before
/// it lets them go: a busy client's next request reuses them, an idle
/// connection holds none.
const IDLE_KEPT: Duration = Duration::from_secs(1);
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

/// How many connections a port has open, and past how many it is
/// crowded: a connection of a crowded port lets its room go as soon as it
/// waits for its next request, where one of a port with few keeps it for
/// a second or two (letting it go and taking it again costs about 15% more
/// instructions a request).
#[derive(Debug)]
pub struct Crowd {
    open: AtomicUsize,
    past: usize,
}

impl Crowd {
    /// No connection open yet, crowded past `past`.
    pub fn new(past: usize) -> Self {
        Self {
            open: AtomicUsize::new(0),
            past,
        }
    }

    /// Counts a connection open until the guard returned is dropped.
    pub fn enter(&self) -> Open<'_> {
        self.open.fetch_add(1, Ordering::Relaxed);
        Open(self)
    }

    /// Whether more connections than it takes are open.
    fn is_crowded(&self) -> bool {
        self.open.load(Ordering::Relaxed) > self.past
    }
}

/// A connection counted open in its port's [`Crowd`].
#[derive(Debug)]
pub struct Open<'a>(&'a Crowd);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a connection served here ended.
#[derive(Debug)]
pub enum Served {
    /// It is closed, or is to be.
    Closed,
    /// Its next request is hyper's, and so is the connection from now on:
    /// these bytes, read already, come first.
    HandOff(Bytes),
    /// It has waited a while for its next request, nothing of which has
    /// come: what it held is freed, and its next bytes, once they come, are
    /// served by [`serve`] again.
    Idle,
}

/// Serves requests on `io`, whose first bytes `first` have been read (of
/// its first head, or of a later one) and whose heads `clock` times, until
/// the connection ends, `owner` asks it to finish (`stopping`, made by
/// `owner` for the connection's life, resolves), a request is one for
/// hyper, or the connection has waited a while for a request nothing of
/// which has come (at once on a port `crowd` says is crowded).
pub async fn serve<IO, S, RB, B, L, St>(
    io: &mut IO,
    first: Bytes,
    clock: &HeadClock,
    owner: &L,
    mut stopping: Pin<&mut St>,
    crowd: &Crowd,
    mut service: S,
) -> Served
where
    IO: AsyncRead + AsyncWrite + Unpin + 'static,
    L: Lifecycle,
    St: Future<Output = ()>,
    RB: MakeBody,
    S: Service<Request<RB>, Response = Response<B>, Error = Infallible>,
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut conn = Conn::new(io, first, clock);
    // One timer for every wait between requests, set again only when it
    // fires after a request was answered (`served`): a request costs it
    // nothing, where a deadline moved at each wait read the clock each
    // time (about 230 instructions a request). So a connection lets its
    // room go between one and two `IDLE_KEPT`s after its last answer.
    let mut idle = pin!(tokio::time::sleep(IDLE_KEPT));
    let mut served = false;
    loop {
        let (req, keep_alive, body_read) = loop {
            let read = match conn.next_request() {
                Next::Request(req, keep_alive, body_read) => break (req, keep_alive, body_read),
                // More of the head, read here rather than in a method of
                // `Conn`: as a future of its own its poll was not inlined
                // into this loop's (about 90 instructions a request). A
                // graceful shutdown closes a connection between requests,
                // as hyper does, whatever part of a head it holds; bytes
                // already there are read first (a head that has come whole
                // is served, and its response closes the connection).
                Next::Head => {
                    // Nothing of the next request has come: the connection
                    // waits with its room for as long as a busy client
                    // leaves between requests (not at all on a crowded
                    // port), then lets it go and waits on with none; it is
                    // taken again, at some cost, once the request comes.
                    if conn.pending.is_empty() && !conn.arrived {
                        let crowded = crowd.is_crowded();
                        let read =
                            poll_fn(|cx| match poll_read_into(conn.io, &mut conn.pending, cx) {
                                Poll::Pending if crowded => Poll::Ready(None),
                                Poll::Pending => Poll::Pending,
                                Poll::Ready(got) => Poll::Ready(Some(got)),
                            });
                        let got = tokio::select! {
                            biased;
                            got = read => got,
                            () = stopping.as_mut() => return Served::Closed,
                            () = idle.as_mut(), if !crowded => {
                                if std::mem::take(&mut served) {
                                    idle.as_mut().reset(Instant::now() + IDLE_KEPT);
                                    continue;
                                }
                                None
                            }
                        };
                        match got {
                            None => return Served::Idle,
                            Some(Ok(n)) if n > 0 => {}
                            Some(_) => return Served::Closed,
                        }
                        conn.arrived = true;
                        continue;
                    }
                    let read = poll_fn(|cx| poll_read_into(conn.io, &mut conn.pending, cx));
                    let deadline = conn.started.map(|at| at + conn.clock.timeout());
                    let read = async {
                        match deadline {
                            Some(at) => tokio::time::timeout_at(at, read).await.unwrap_or(Ok(0)),
                            None => read.await,
                        }
                    };
                    let got = tokio::select! {
                        biased;
                        got = read => got,
                        () = stopping.as_mut() => return Served::Closed,
                    };
                    if !matches!(got, Ok(n) if n > 0) {
                        return Served::Closed;
                    }
                    conn.arrived = true;
                    Ok(())
                }
                Next::Body(whole) => conn.read_body(whole).await,
                Next::HandOff(raw) => return Served::HandOff(raw),
            };
            if let Err(served) = read {
                return served;
            }
        };
        let head = req.method() == Method::HEAD;
        let Ok(()) = poll_fn(|cx| service.poll_ready(cx)).await;
        let mut watch = Watch::new(&conn.pending, body_read.as_ref());
        // The stack's future is made in place here (the request moved into
        // it, not first into the exchange's), and dropped once it answers.
        let answered = {
            let answer = pin!(service.call(req));
            conn.exchange(answer, &mut watch).await
        };
        let Some(res) = answered else {
            return Served::Closed;
        };
        let keep_alive = keep_alive && !owner.is_stopping();
        let Ok(kept) = conn.respond(res, head, keep_alive, watch).await else {
            return Served::Closed;
        };
        match kept {
            Some(headers) if !owner.is_stopping() => {
                conn.spare = headers;
                served = true;
            }
            // The response was the connection's last: it closes cleanly.
            _ => return conn.shutdown().await,
        }
    }
}

/// A connection served here: what it holds from one request to the next,
/// as hyper's `Conn` holds a connection's buffers and state for its
/// dispatcher. [`serve`] is a loop over its steps: a request read, the
/// stack's answer awaited while the client is watched, the response
/// written.
struct Conn<'a, IO> {
    /// The client's connection.
    io: &'a mut IO,
    /// Bytes read and not yet served: the next head, or its start (a
    /// pipelined request, or bytes that came while a response was
    /// written).
    pending: BytesMut,
    /// The header map the next request's head is read into: hyper reuses
    /// the last response's header map for the next request.
    spare: HeaderMap,
    /// The write buffer, kept between requests while it is small.
    write_buf: Vec<u8>,
    /// The connection's first head is still to come: its clock is the
    /// connection's own, started when the connection was accepted.
    first_head: bool,
    /// The clock every head of the connection is timed by.
    clock: &'a HeadClock,
    /// When the first bytes of a later head came, which started its clock.
    started: Option<Instant>,
    /// Bytes of the next head have been read since the last response.
    arrived: bool,
}

/// What the connection is to do next, told by what its buffer holds.
// The request is moved once, straight out; boxing it would cost an
// allocation per request.
#[allow(clippy::large_enum_variant)]
enum Next<RB> {
    /// Serve this request, read whole here: whether the connection may
    /// serve another after it, and what tells when the stack has read its
    /// body, if it has one.
    Request(Request<RB>, bool, Option<BodyRead>),
    /// Read more of the head.
    Head,
    /// Read on the rest of the body of a request this many bytes long.
    Body(usize),
    /// Hand the connection to hyper, these bytes first.
    HandOff(Bytes),
}

impl<'a, IO> Conn<'a, IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + 'static,
{
    /// A connection on `io`, whose first bytes `first` have been read and
    /// whose heads `clock` times: its first head's, or (once the clock has
    /// seen that) a later one's, which came while it was idle.
    fn new(io: &'a mut IO, first: Bytes, clock: &'a HeadClock) -> Self {
        let first_head = !clock.first_done();
        Conn {
            io,
            pending: first
                .try_into_mut()
                .unwrap_or_else(|first| BytesMut::from(&first[..])),
            spare: HeaderMap::new(),
            write_buf: Vec::new(),
            first_head,
            clock,
            started: None,
            arrived: !first_head,
        }
    }

    /// Parses what the buffer holds, and says what to do next: serve
    /// the request it holds, read more of its head or its body, or hand
    /// the connection to hyper.
    // Inlined into `serve`'s loop: called, it moved the request out
    // through `Next` and cost about 100 instructions a request more.
    #[inline(always)]
    fn next_request<RB: MakeBody>(&mut self) -> Next<RB> {
        if self.pending.is_empty() {
            return Next::Head;
        }
        // `pending` keeps the memory after the head's, and the head's own
        // once nothing holds it any more.
        let raw = self.pending.split().freeze();
        match parse(&raw, &mut self.spare) {
            RequestParse::Request {
                req,
                keep_alive,
                len,
                body_read,
            } => {
                if raw.len() > len {
                    self.pending = BytesMut::from(&raw[len..]);
                } else if raw.len() + self.pending.capacity() > KEEP_READ {
                    self.pending = BytesMut::new();
                }
                if self.first_head {
                    self.clock.first_read();
                    self.first_head = false;
                }
                self.started = None;
                self.arrived = false;
                return Next::Request(req, keep_alive, body_read);
            }
            RequestParse::Partial => {
                // `pending` lets go first, so that the head's memory is
                // `raw`'s alone and grows in place.
                drop(std::mem::take(&mut self.pending));
                self.pending = raw
                    .try_into_mut()
                    .unwrap_or_else(|raw| BytesMut::from(&raw[..]));
            }
            RequestParse::Short { whole } => {
                // The request's memory, its size exactly: the bytes the
                // kernel holds until they are read.
                drop(std::mem::take(&mut self.pending));
                self.pending = BytesMut::with_capacity(whole);
                self.pending.extend_from_slice(&raw);
                return Next::Body(whole);
            }
            RequestParse::Hyper => return Next::HandOff(raw),
        }
        // A later head's clock starts with its first bytes read (bytes
        // that came with the last request start none); the first head's is
        // the connection's own (`first_head`).
        if !self.first_head && self.arrived && self.started.is_none() {
            self.started = Some(Instant::now());
        }
        Next::Head
    }

    /// Reads on the rest of a request `whole` bytes long, whose head and
    /// start of body the buffer holds, while its bytes are there already;
    /// `Err` (a hand-off, with what came) when the rest is still on its
    /// way: hyper streams it, with what came of it.
    async fn read_body(&mut self, whole: usize) -> Result<(), Served> {
        while self.pending.len() < whole {
            let most = whole - self.pending.len();
            let now =
                poll_fn(|cx| Poll::Ready(poll_read_at_most(self.io, &mut self.pending, most, cx)));
            if !matches!(now.await, Poll::Ready(Ok(n)) if n > 0) {
                return Err(Served::HandOff(std::mem::take(&mut self.pending).freeze()));
            }
        }
        Ok(())
    }

    /// Waits for the stack's `answer` to a request, watching the client
    /// with `watch` as hyper does (once the request's body, if any, has
    /// been read): a client that closes its end (or fails) abandons the
    /// request, and `None` is returned. The watch goes on to the
    /// response's writing: it knows whether it polled the client in the
    /// wake-up that got the response.
    async fn exchange<F, B>(
        &mut self,
        mut answer: Pin<&mut F>,
        watch: &mut Watch<'_>,
    ) -> Option<Response<B>>
    where
        F: Future<Output = Result<Response<B>, Infallible>>,
    {
        poll_fn(|cx| {
            if watch.poll_gone(self.io, &mut self.pending, cx).is_ready() {
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
            if unread
                && !watch.waits_for_body()
                && watch.poll_gone(self.io, &mut self.pending, cx).is_ready()
            {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await
    }

    /// Writes a response: its head, then its body. `Ok(Some(map))` when
    /// the connection may serve another request (with the response's
    /// header map, emptied, for it), `Ok(None)` when it is to close after
    /// it, `Err` when it is to close at once. `watch` watches the client,
    /// as it did for the exchange.
    async fn respond<B>(
        &mut self,
        res: Response<B>,
        head: bool,
        keep_alive: bool,
        watch: Watch<'_>,
    ) -> Result<Option<HeaderMap>, ()>
    where
        B: HttpBody<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let (mut parts, body) = res.into_parts();
        let length = if body.is_end_stream() {
            None
        } else {
            Some(body.size_hint().exact())
        };
        let mut body = pin!(Some(body));
        let mut writing = Writing::new(std::mem::take(&mut self.write_buf), body.as_mut(), watch);
        // Room for the head as hyper reckons it, and a small body.
        let small = length.flatten().filter(|&n| n <= COPY_MAX as u64);
        let room = 64 + parts.headers.len() * 32 + small.map_or(0, |n| n as usize);
        let front = &mut writing.out.front;
        front.reserve(room);
        let (framing, last) = encode_head(&mut parts, length, head, keep_alive, front)?;
        writing.frame(framing, length.is_some(), last);
        writing.spliced.lends = tcp(self.io).is_some() && splices(framing);
        let written = poll_fn(|cx| writing.poll_write(self, cx)).await;
        if writing.spliced.lends {
            tracing::debug!(
                spliced = writing.spliced.total,
                "response body written, lent a pipe"
            );
        }
        let (kept, last) = writing.finish();
        written?;
        if kept.capacity() <= COPY_MAX {
            self.write_buf = kept;
        }
        if last {
            return Ok(None);
        }
        parts.headers.clear();
        Ok(Some(parts.headers))
    }

    /// Closes the connection cleanly, after its last response.
    async fn shutdown(&mut self) -> Served {
        let _ = poll_fn(|cx| Pin::new(&mut *self.io).poll_shutdown(cx)).await;
        Served::Closed
    }
}

/// A response being written, once its head is queued: what frames its
/// body, what is left of the body, and whether the connection ends after
/// it, as hyper's `Conn` keeps its writing state.
struct Writing<'w, B> {
    /// The bytes on their way out: the head, then the body's, framed.
    out: WriteQueue,
    /// Frames the body's data and its end.
    encoder: Encoder,
    /// The body, until it has ended: as with hyper, a body is dropped as
    /// soon as it has ended (its guards settle then), before its last
    /// bytes are written.
    body: Pin<&'w mut Option<B>>,
    /// The head waits for the body's first bytes. Go's proxy (its
    /// `FlushInterval` 0 for a body of known length) sends such a
    /// response's head with the body's first bytes, its server's 4 KiB
    /// buffer flushing no sooner: the head waits for them here too (unless
    /// it fills that buffer alone), so that a client that reads the head
    /// and leaves has seen what it does with Go, and is counted so.
    head_held: bool,
    /// The connection closes after the response.
    last: bool,
    /// The client, watched while the body waits.
    watch: Watch<'w>,
    /// The client's socket was polled in the wake-up that got the
    /// response, by the exchange: the first wake-up here need not poll it
    /// again.
    watched: bool,
    /// The body's bytes spliced into a pipe lent to it, on their way out.
    spliced: Spliced,
}

/// A response's bytes in a pipe, spliced there by its body (see
/// [`splice`]), written after what is queued before them.
#[derive(Debug, Default)]
struct Spliced {
    /// The body is lent a pipe when it is polled: the client's connection
    /// is plain TCP and the body large enough, or chunked.
    lends: bool,
    /// The pipe, while it holds bytes.
    pipe: Option<Pipe>,
    /// How many bytes it holds.
    held: usize,
    /// A chunk's end is written after them.
    chunk_end: bool,
    /// The body ended with them: its end is written after them.
    ended: bool,
    /// Bytes spliced so far.
    total: u64,
}

/// The client's connection, when it is a plain TCP one: the one a body's
/// bytes may be spliced into.
fn tcp<IO: 'static>(io: &IO) -> Option<&TcpStream> {
    (io as &dyn Any).downcast_ref::<TcpStream>()
}

/// Whether a body framed as `framing` is lent a pipe: one whose length is
/// from [`SPLICE_MIN`] to [`SPLICE_MAX`], or a chunked one (whose chunks
/// are spliced when they are that large, up to `SPLICE_MAX` of them).
fn splices(framing: Framing) -> bool {
    match framing {
        Framing::Length(n) => (SPLICE_MIN as u64..=SPLICE_MAX).contains(&n),
        Framing::Chunked(()) => true,
        Framing::Close => false,
    }
}

impl<'w, B> Writing<'w, B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    /// A response to be written after what `front` holds (a buffer kept
    /// from the last response, emptied), with `body`, watching the client
    /// with `watch` as the exchange did. Its head is written into
    /// `out.front`, then [`frame`](Self::frame) says how its body goes.
    fn new(front: Vec<u8>, body: Pin<&'w mut Option<B>>, watch: Watch<'w>) -> Self {
        Writing {
            out: WriteQueue {
                front,
                ..WriteQueue::default()
            },
            encoder: Encoder::new(Framing::Length(0)),
            body,
            head_held: false,
            last: false,
            watched: watch.armed,
            watch,
            spliced: Spliced::default(),
        }
    }

    /// Sets how the body is framed, once the head is written: as
    /// `framing` says, with nothing to write of it unless it has one
    /// (`has_body`) and the head gave it some length; the connection
    /// closes after the response when `last`.
    fn frame(&mut self, framing: Framing, has_body: bool, last: bool) {
        self.encoder = Encoder::new(framing);
        if !has_body || framing == Framing::Length(0) {
            self.body.set(None);
        }
        self.head_held = matches!(framing, Framing::Length(n) if n > 0);
        self.last = last;
    }

    /// Writes the response on `conn`: the body's frames queued behind the
    /// head as they come, written once many are queued, when the body
    /// waits, and at its end. `Ready(Ok)` once all of it is written and
    /// flushed, `Ready(Err)` when the connection is to close at once.
    fn poll_write<IO>(
        &mut self,
        conn: &mut Conn<'_, IO>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ()>>
    where
        IO: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        // The client is watched while the body waits, not before what the
        // body has ready: a body that ends in the wake-up that finds the
        // client gone has ended whole, as in Go, whose server takes the
        // body's last bytes into its buffer before any write can fail.
        // Once the client's socket has been polled and had nothing, its
        // hang-up wakes the task: each wake-up polls it until then, not at
        // every wait. The exchange that has just ended may have done so in
        // this wake-up already.
        let armed = std::mem::take(&mut self.watched);
        loop {
            if self.spliced.held > 0 {
                ready!(self.poll_drain(conn, cx))?;
            }
            let Some(mut polled) = self.body.as_mut().as_pin_mut() else {
                ready!(self.out.poll_write(conn.io, cx)).map_err(|_| ())?;
                return Pin::new(&mut *conn.io).poll_flush(cx).map_err(|_| ());
            };
            if self.out.queued() >= WRITE_AT {
                ready!(self.out.poll_write(conn.io, cx)).map_err(|_| ())?;
            }
            let polled_frame = if self.spliced.lends {
                let (polled_frame, lent) = Lent::around(|| polled.as_mut().poll_frame(cx));
                if let Some((pipe, held)) = lent {
                    self.spliced.pipe = Some(pipe);
                    self.spliced.held = held;
                    // Bytes in the pipe come back only with their frame.
                    if !matches!(&polled_frame, Poll::Ready(Some(Ok(frame)))
                        if frame.data_ref().is_some_and(|d| d.len() == held && splice::is_in_pipe(d)))
                    {
                        return Poll::Ready(Err(()));
                    }
                }
                polled_frame
            } else {
                polled.as_mut().poll_frame(cx)
            };
            let frame = match polled_frame {
                Poll::Ready(Some(Ok(frame))) => Some(frame),
                Poll::Ready(None) => None,
                Poll::Ready(Some(Err(e))) => {
                    let e: Box<dyn std::error::Error + Send + Sync> = e.into();
                    tracing::debug!(error = %e, "response body failed");
                    return Poll::Ready(Err(()));
                }
                Poll::Pending => return self.poll_waiting(conn, armed, cx),
            };
            let end = polled.is_end_stream();
            if self.queue(frame, end).is_err() {
                return Poll::Ready(Err(()));
            }
        }
    }

    /// The body waits: the client is watched (unless `armed`, polled in
    /// this wake-up already), and what is queued is written and flushed,
    /// unless it is a head held for the body's first bytes. Never
    /// `Ready(Ok)`.
    fn poll_waiting<IO>(
        &mut self,
        conn: &mut Conn<'_, IO>,
        armed: bool,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ()>>
    where
        IO: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        if !armed
            && self
                .watch
                .poll_gone(conn.io, &mut conn.pending, cx)
                .is_ready()
        {
            return Poll::Ready(Err(()));
        }
        if self.head_held && self.out.queued() < HEAD_HELD_MAX {
            return Poll::Pending;
        }
        ready!(self.out.poll_write(conn.io, cx)).map_err(|_| ())?;
        ready!(Pin::new(&mut *conn.io).poll_flush(cx)).map_err(|_| ())?;
        Poll::Pending
    }

    /// Queues `frame`, a frame of the body (`None`: the body has ended),
    /// and the body's end after it when it has ended (`end`: the body says
    /// so). `Err` when it ended short of its length with nothing more to
    /// write: hyper closes at once.
    fn queue(&mut self, frame: Option<Frame<Bytes>>, end: bool) -> Result<(), ()> {
        let (ended, with_data) = match frame.map(Frame::into_data) {
            Some(Ok(data)) if splice::is_in_pipe(&data) => {
                self.queue_in_pipe(data)?;
                (end, true)
            }
            Some(Ok(data)) if !data.is_empty() => {
                self.out.data(&mut self.encoder, data);
                self.head_held = false;
                (end, true)
            }
            Some(Ok(_)) => (end, false),
            // Trailers go only to a client that asked for them (`TE:
            // trailers`), and such requests are hyper's: they end the body.
            Some(Err(frame)) => (end || frame.is_trailers(), false),
            None => (true, false),
        };
        if ended {
            self.body.set(None);
            if self.spliced.held > 0 {
                // Its end follows the bytes in the pipe.
                self.spliced.ended = true;
                return Ok(());
            }
            return self.queue_end(with_data);
        }
        Ok(())
    }

    /// Queues the body's end, after its last frame (`with_data`: one with
    /// data). `Err` when it ended short of its length with nothing more
    /// to write: hyper closes at once.
    fn queue_end(&mut self, with_data: bool) -> Result<(), ()> {
        if !self.out.end(&mut self.encoder) {
            if !with_data {
                // Short of its length, and nothing more to write:
                // hyper closes at once.
                return Err(());
            }
            // Its last bytes are written, then the connection closes.
            self.last = true;
        }
        Ok(())
    }

    /// Takes `data`, a frame standing for the bytes the body spliced into
    /// the lent pipe, as framed by the encoder: a chunk's size line is
    /// queued before them, its end after. `Err` when they go past what a
    /// length still owes (spliced bytes are not cut).
    fn queue_in_pipe(&mut self, data: Bytes) -> Result<(), ()> {
        if data.len() != self.spliced.held {
            return Err(());
        }
        self.spliced.total += data.len() as u64;
        self.head_held = false;
        match self.encoder.encode_exact(data, HexCase::Upper) {
            Ok(Encoded::Data(_)) => Ok(()),
            Ok(Encoded::Chunk { size, .. }) => {
                self.out.tail().extend_from_slice(size.rest());
                self.spliced.chunk_end = true;
                Ok(())
            }
            Err(_) => Err(()),
        }
    }

    /// Writes what is queued, then the bytes in the pipe, and queues what
    /// follows them (a chunk's end, the body's end); the pipe goes back
    /// to the thread's once empty. `Ready(Err)` when the connection is to
    /// close at once.
    fn poll_drain<IO>(
        &mut self,
        conn: &mut Conn<'_, IO>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ()>>
    where
        IO: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        ready!(self.out.poll_write(conn.io, cx)).map_err(|_| ())?;
        let (Some(to), Some(pipe)) = (tcp(conn.io), &self.spliced.pipe) else {
            return Poll::Ready(Err(()));
        };
        ready!(splice::poll_drain(pipe, &mut self.spliced.held, to, cx)).map_err(|_| ())?;
        if let Some(pipe) = self.spliced.pipe.take() {
            pipe.give_back();
        }
        if std::mem::take(&mut self.spliced.chunk_end) {
            self.out.tail().extend_from_slice(CHUNK_END);
        }
        if std::mem::take(&mut self.spliced.ended) {
            self.queue_end(true)?;
        }
        Poll::Ready(Ok(()))
    }

    /// The write buffer, emptied, to keep for the next response, and
    /// whether the connection closes after this one.
    fn finish(self) -> (Vec<u8>, bool) {
        (self.out.keep(), self.last)
    }
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
