//! A client's connection from its first byte to its last: the first head
//! read ahead, the protocol told by it, requests served by this crate's
//! server ([`serve`]) until one is hyper's, then hyper's HTTP/1.1 (or, for
//! h2c, hyper's HTTP/2 from the start), one [`HeadClock`] timing every
//! head, and a graceful shutdown when the owner asks ([`Lifecycle`]).
//!
//! The connection's owner accepts it (and does its TLS handshake), makes
//! its clock and its service, and hands both here: the way a request takes
//! from the socket to the service is this module's alone.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::marker::PhantomData;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_TYPE, HeaderValue, TRANSFER_ENCODING};
use http::{HeaderMap, Request, Response, StatusCode, Version};
use http_body::Body as HttpBody;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use hyper::rt::{Read, Write};
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tower_service::Service;

use super::head::{H2_PREFACE, HeadClock, HeadTimer, Watched, first_head, read_first_head};
use super::{Crowd, Lifecycle, MakeBody, Served, serve};
use crate::BoxError;
use crate::limits::MAX_HEADER_BYTES;
use crate::wire::read::poll_read_into;

/// How a port speaks HTTP: whether this crate's server takes the requests
/// it can, hyper's HTTP/1.1 settings for the rest, and HTTP/2's when the
/// port speaks that too. A connection's task holds only the server it
/// speaks.
#[derive(Clone, Debug)]
pub struct Protocols {
    own: bool,
    http1: http1::Builder,
    http2: Option<http2::Builder<TokioExecutor>>,
    /// ALPN chose HTTP/2: the connection speaks nothing else.
    h2_only: bool,
    /// The port's connections open, shared by these settings' clones.
    crowd: Arc<Crowd>,
}

impl Protocols {
    /// HTTP/1.1 with `http1`'s settings, served by this crate's server
    /// where it can (`own`), and HTTP/2 with `http2`'s, if given, for a
    /// connection whose first bytes are the h2c preface.
    pub fn new(
        own: bool,
        http1: http1::Builder,
        http2: Option<http2::Builder<TokioExecutor>>,
    ) -> Self {
        Self {
            own,
            http1,
            http2,
            h2_only: false,
            crowd: Arc::new(Crowd::new(CROWDED)),
        }
    }

    /// These settings, the port counted crowded once it has more than
    /// `open` connections open (a connection of a crowded port lets its
    /// room go as soon as it waits for its next request).
    #[must_use]
    pub fn crowded_past(mut self, open: usize) -> Self {
        self.crowd = Arc::new(Crowd::new(open));
        self
    }

    /// These settings, for a connection that ALPN put on HTTP/2: it
    /// speaks nothing else, whatever its first bytes.
    #[must_use]
    pub fn h2_only(mut self) -> Self {
        self.h2_only = self.http2.is_some();
        self
    }

    /// These settings, with hyper's HTTP/1.1 serving every request.
    #[must_use]
    pub fn hyper_only(mut self) -> Self {
        self.own = false;
        self
    }
}

/// Connections open on a port past which it is crowded: each of them
/// holds its room (about 5 KiB with qproxy's stack) for a second or two
/// after each request, so this many hold at most a few MiB.
const CROWDED: usize = 256;

/// How a connection [`serve_connection`] served ended.
#[derive(Debug)]
pub enum Ended {
    /// It closed, or was closed after its last answer.
    Closed,
    /// hyper ended it with this error.
    Failed(hyper::Error),
    /// Its first request head did not come within the clock's timeout.
    NoFirstHead,
}

/// Serves `io`, a connection accepted when `clock` was made, with a
/// service `make_service` makes, until it ends, its first request head
/// does not come in time, or `owner` asks it to finish (once its requests
/// in flight are answered).
///
/// The first bytes tell HTTP/2 (the h2c preface, or `protocols` say ALPN
/// chose it) from HTTP/1.1. HTTP/1.1 requests are served by [`serve`]
/// until one is hyper's; hyper's HTTP/1.1 then serves the connection,
/// with the bytes read so far first. A head longer than Go reads, which
/// only hyper reads, is answered `431`, and a transfer coding Go does not
/// read `501`, the connection closed, as Go's server answers them.
///
/// What the connection's task holds while it waits is this future alone
/// (760 bytes with qproxy's stack): the states of this crate's
/// server and of hyper's are boxed once they are needed, each with a
/// service made for it, and this crate's server's is freed again, its
/// service with it, once the connection has been idle for a second or two
/// ([`Served::Idle`]); serving on makes the service again. Not an `async
/// fn`, which would keep its arguments twice.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its future"
)]
pub fn serve_connection<IO, M, S, RB, B, L>(
    mut io: IO,
    clock: Arc<HeadClock>,
    protocols: Arc<Protocols>,
    make_service: M,
    owner: L,
) -> impl Future<Output = Ended>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    M: Fn() -> S + Send + 'static,
    S: Service<Request<RB>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    RB: MakeBody + Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    L: Lifecycle,
{
    async move {
        let _open = protocols.crowd.enter();
        let served = async {
            // Moved in, not borrowed: a maker held by reference across the
            // waits would have to be `Sync`.
            let make = make_service;
            let Ok(mut ahead) = read_first_head(&mut io).await else {
                return Ended::Closed;
            };
            let h2 = match &protocols.http2 {
                Some(http2) if protocols.h2_only || ahead.starts_with(H2_PREFACE) => Some(http2),
                _ => None,
            };
            if h2.is_none() && protocols.own {
                // Made once for the connection's life: it registers once.
                let mut stopping = pin!(owner.stopping());
                loop {
                    // Boxed while requests come: a connection idle for a
                    // while carries no request's room, and no buffer (this
                    // crate's server returns then, its buffers freed).
                    let served = Box::pin(serve(
                        &mut io,
                        ahead,
                        &clock,
                        &owner,
                        stopping.as_mut(),
                        &protocols.crowd,
                        make(),
                    ));
                    match served.await {
                        Served::Closed => return Ended::Closed,
                        Served::HandOff(rest) => {
                            ahead = rest;
                            break;
                        }
                        Served::Idle => {}
                    }
                    // The next request's first bytes, read into room taken
                    // when they come; a graceful shutdown closes the idle
                    // connection.
                    let mut next = BytesMut::new();
                    let read = poll_fn(|cx| poll_read_into(&mut io, &mut next, cx));
                    tokio::select! {
                        biased;
                        () = stopping.as_mut() => return Ended::Closed,
                        got = read => if !matches!(got, Ok(n) if n > 0) {
                            return Ended::Closed;
                        },
                    }
                    ahead = next.freeze();
                }
            }
            // hyper's connection state is large, and serves only what this
            // crate's server hands it (and HTTP/2): boxed, so that every
            // connection's task does not carry its room.
            let io = TokioIo::new(Watched::new(io, clock.clone(), ahead));
            let hyper = match h2 {
                Some(http2) => Hyper::H2(http2),
                None => {
                    let mut http1 = protocols.http1.clone();
                    http1.timer(HeadTimer(clock.clone()));
                    Hyper::H1(http1)
                }
            };
            // Boxed in a statement of its own, so that the future before it
            // was boxed is not kept across the wait.
            let served = Box::pin(serve_with_hyper(io, make(), hyper, &owner));
            served.await
        };
        tokio::select! {
            biased;
            ended = served => ended,
            () = first_head(&clock) => Ended::NoFirstHead,
        }
    }
}

/// Which of hyper's servers a connection is handed to.
enum Hyper<'a> {
    /// HTTP/1.1, with these settings.
    H1(http1::Builder),
    /// HTTP/2, with these.
    H2(&'a http2::Builder<TokioExecutor>),
}

/// Serves `io` with `service` by hyper's server `hyper` to its end,
/// gracefully once `owner` asks.
async fn serve_with_hyper<IO, S, RB, B, L>(
    io: TokioIo<Watched<IO>>,
    service: S,
    hyper: Hyper<'_>,
    owner: &L,
) -> Ended
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    S: Service<Request<RB>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    RB: MakeBody + Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    L: Lifecycle,
{
    let service = TowerToHyperService::new(Handed {
        inner: service,
        body: PhantomData,
    });
    let served = match hyper {
        Hyper::H2(http2) => gracefully(http2.serve_connection(io, service), owner).await,
        Hyper::H1(http1) => {
            let conn = http1.serve_connection(io, service).with_upgrades();
            gracefully(conn, owner).await
        }
    };
    match served {
        Ok(()) => Ended::Closed,
        Err(e) => Ended::Failed(e),
    }
}

/// The client's TCP connection under an upgrade hyper's server made on a
/// plain connection, and the bytes hyper and the head read had read of it
/// already, in their order; the upgrade as it was for any other (a TLS
/// connection, one of HTTP/2).
pub fn upgraded_tcp(upgraded: Upgraded) -> Result<(TcpStream, Bytes), Upgraded> {
    let parts = upgraded.downcast::<TokioIo<Watched<TcpStream>>>()?;
    let (tcp, ahead) = parts.io.into_inner().into_parts();
    let read = if parts.read_buf.is_empty() {
        ahead
    } else if ahead.is_empty() {
        parts.read_buf
    } else {
        let mut both = BytesMut::with_capacity(parts.read_buf.len() + ahead.len());
        both.extend_from_slice(&parts.read_buf);
        both.extend_from_slice(&ahead);
        both.freeze()
    };
    Ok((tcp, read))
}

/// Serves `conn` to its end, shutting it down gracefully (HTTP/1.1: the
/// request in flight answered, then closed; HTTP/2: a `GOAWAY`, then the
/// streams open) once `owner` asks.
async fn gracefully<C: Graceful, L: Lifecycle>(conn: C, owner: &L) -> C::Output {
    let mut conn = pin!(conn);
    tokio::select! {
        biased;
        served = conn.as_mut() => return served,
        () = owner.stopping() => {}
    }
    conn.as_mut().graceful_shutdown();
    conn.await
}

/// A hyper connection that can be asked to finish what it has and close.
trait Graceful: Future {
    /// Starts the graceful shutdown.
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, B> Graceful for http1::UpgradeableConnection<I, S>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    I: Read + Write + Unpin + Send + 'static,
    B: HttpBody + 'static,
    B::Error: Into<BoxError>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http1::UpgradeableConnection::graceful_shutdown(self);
    }
}

impl<I, S, B, E> Graceful for http2::Connection<I, S, E>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    I: Read + Write + Unpin + 'static,
    B: HttpBody + 'static,
    B::Error: Into<BoxError>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http2::Connection::graceful_shutdown(self);
    }
}

/// The owner's service as hyper calls it (through hyper-util's
/// `TowerToHyperService`, which clones it, waits until it is ready and
/// calls it): each request's body made the owner's ([`MakeBody::streamed`]),
/// and what Go's server refuses refused first ([`refused`]): a head longer
/// than Go reads (hyper's own limit is the same, but it checks it only as
/// its buffer grows, so a head a little over it can get through; this
/// crate's server hands longer heads to hyper, so only hyper reads them),
/// and a transfer coding Go does not read (this crate's server hands every
/// request with one to hyper).
#[derive(Debug)]
struct Handed<S, RB> {
    inner: S,
    /// The owner's request body, made from hyper's.
    body: PhantomData<fn() -> RB>,
}

impl<S: Clone, RB> Clone for Handed<S, RB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            body: PhantomData,
        }
    }
}

impl<S, RB, B> Service<Request<Incoming>> for Handed<S, RB>
where
    S: Service<Request<RB>, Response = Response<B>, Error = Infallible>,
    RB: MakeBody,
{
    type Response = Response<Either<B, Full<Bytes>>>;
    type Error = Infallible;
    type Future = Handing<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        if let Some(res) = refused(&req) {
            return Handing::Refused { res: Some(res) };
        }
        let (parts, body) = req.into_parts();
        let body = RB::streamed(body, &parts.headers);
        Handing::Called {
            answer: self.inner.call(Request::from_parts(parts, body)),
        }
    }
}

pin_project! {
    /// The response of [`Handed`]: the owner's service's, or the refusal.
    #[project = HandingProj]
    enum Handing<F> {
        /// Called.
        Called { #[pin] answer: F },
        /// Refused; taken once polled.
        Refused { res: Option<Response<Full<Bytes>>> },
    }
}

impl<F, B> Future for Handing<F>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
{
    type Output = Result<Response<Either<B, Full<Bytes>>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            HandingProj::Called { answer } => answer.poll(cx).map_ok(|res| res.map(Either::Left)),
            // Polled again after it completed: it never completes again.
            HandingProj::Refused { res } => match res.take() {
                Some(res) => Poll::Ready(Ok(res.map(Either::Right))),
                None => Poll::Pending,
            },
        }
    }
}

/// A request head's length as Go counts it against its limit: the request
/// line and every field line, with their line ends.
fn head_len<B>(req: &Request<B>) -> usize {
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().to_string().len(), |p| p.as_str().len());
    let line = req.method().as_str().len() + target + "  HTTP/1.1\r\n".len();
    let fields: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + ": \r\n".len())
        .sum();
    fields + line + "\r\n".len()
}

/// Go's server's answer to an HTTP/1 request it refuses before its
/// handlers see it: a head longer than it reads (HTTP/2 heads are bounded
/// by the header list's size instead), or an HTTP/1.1 request whose
/// transfer coding is not one `Transfer-Encoding: chunked`, which Go
/// answers `501` (it understands no other coding, and no list: being
/// lenient about framing is how request smuggling starts). hyper refuses a
/// request whose last coding is not `chunked` itself (`400`), before this
/// is asked; what it would read as chunked and Go does not (a list that
/// ends in `chunked`, the field twice) is refused here, as Go refuses it.
fn refused<B>(req: &Request<B>) -> Option<Response<Full<Bytes>>> {
    if req.version() >= Version::HTTP_2 {
        return None;
    }
    if head_len(req) > MAX_HEADER_BYTES {
        return Some(go_refusal(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            b"431 Request Header Fields Too Large",
        ));
    }
    (req.version() == Version::HTTP_11 && !go_reads_coding(req.headers())).then(|| {
        go_refusal(
            StatusCode::NOT_IMPLEMENTED,
            b"Unsupported transfer encoding",
        )
    })
}

/// Whether Go's server reads a request with these fields: no
/// `Transfer-Encoding`, or one whose value is `chunked` (any case, the
/// spaces around it aside).
fn go_reads_coding(headers: &HeaderMap) -> bool {
    let mut codings = headers.get_all(TRANSFER_ENCODING).iter();
    match (codings.next(), codings.next()) {
        (None, _) => true,
        (Some(one), None) => one.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked"),
        (Some(_), Some(_)) => false,
    }
}

/// Go's server's refusal of a request: `status` with `body` (its reason, or
/// Go's words), and the connection closed.
fn go_refusal(status: StatusCode, body: &'static [u8]) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from_static(body)));
    *res.status_mut() = status;
    let headers = res.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    if let Some(reason) = status.canonical_reason() {
        res.extensions_mut()
            .insert(ReasonPhrase::from_static(reason.as_bytes()));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_counted_as_go_counts_it() {
        let req = Request::get("/a?b").header("host", "x").body(()).unwrap();
        // "GET /a?b HTTP/1.1\r\n" + "host: x\r\n" + "\r\n"
        assert_eq!(head_len(&req), 19 + 9 + 2);
    }

    #[test]
    fn a_head_longer_than_go_reads_is_431_and_closes() {
        let with = |value: &str| {
            Request::builder()
                .uri("/")
                .header("host", "h")
                .header("x-big", value)
                .body(())
                .unwrap()
        };
        assert!(refused(&with(&"a".repeat(MAX_HEADER_BYTES - 100))).is_none());
        let res = refused(&with(&"a".repeat(MAX_HEADER_BYTES))).expect("refused");
        assert_eq!(res.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        assert_eq!(res.headers()[CONNECTION], "close");
        assert_eq!(
            res.extensions().get::<ReasonPhrase>().map(|r| r.as_bytes()),
            Some(&b"Request Header Fields Too Large"[..])
        );
        // HTTP/2 heads are bounded by the header list's size instead.
        let mut h2 = with(&"a".repeat(MAX_HEADER_BYTES));
        *h2.version_mut() = Version::HTTP_2;
        assert!(refused(&h2).is_none());
    }

    #[test]
    fn a_transfer_coding_go_does_not_read_is_501_and_closes() {
        let with = |version: Version, codings: &[&str]| {
            let mut req = Request::post("/").header("host", "h");
            for coding in codings {
                req = req.header("transfer-encoding", *coding);
            }
            req.version(version).body(()).unwrap()
        };
        let http11 = |codings: &[&str]| refused(&with(Version::HTTP_11, codings));
        for read in [
            &[][..],
            &["chunked"],
            &["Chunked"],
            &["CHUNKED"],
            &[" chunked "],
        ] {
            assert!(http11(read).is_none(), "{read:?}");
        }
        // What hyper reads as chunked and Go does not (hyper answers a
        // last coding that is not `chunked` with its own `400`).
        for unread in [
            &["identity, chunked"][..],
            &["gzip, chunked"],
            &["chunked", "chunked"],
            &["identity", "chunked"],
        ] {
            let res = http11(unread).expect("refused");
            assert_eq!(res.status(), StatusCode::NOT_IMPLEMENTED, "{unread:?}");
            assert_eq!(res.headers()[CONNECTION], "close");
        }
        // Go ignores the transfer coding of an HTTP/1.0 request, and hyper
        // refuses such a request itself (`400`): nothing to refuse here.
        assert!(refused(&with(Version::HTTP_10, &["identity, chunked"])).is_none());
    }
}
