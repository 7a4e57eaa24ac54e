//! Connections to the user container at `127.0.0.1:USER_PORT`.
//!
//! HTTP/1 requests go out as HTTP/1.1, spoken by qproxy's own client
//! ([`qproxy_http1::client`]), over keep-alive connections kept in one pool
//! ([`qproxy_http1::pool`]) whichever request they served: a request takes
//! the connection used last, or dials one; its response body hands the
//! connection back when the app's response has been read to its end, so
//! that the next request, from any client connection, reuses it. At most
//! `CONTAINER_CONCURRENCY` idle connections are kept (1000 when
//! unlimited), each for at most 90 s, as Knative's transport does, and
//! none past the idle time the app announced (`Keep-Alive: timeout=N`,
//! less a margin), which Go's transport does not heed.
//!
//! Sending again, by the rules of Go's transport and one more:
//! - a request none of whose bytes were written (the reused connection
//!   found closed, by the pool or by the first write) goes on another
//!   connection, whatever its method and body: its body has not been read
//!   from the client beyond what is held for it;
//! - a request without a body whose method is idempotent (or that carries
//!   an idempotency key) is sent once more, on a new connection, when the
//!   app drops a reused one under it before the first byte of an answer;
//! - nothing else: a request that went out on a connection dialled for
//!   it, or whose body was written, is not sent twice (the app may have
//!   acted on it).
//!
//! A dial the app refuses (nothing listens: the app has crashed, and the
//! kubelet restarts it within about a second) is tried again, with a
//! growing pause, for up to [`REFUSED_FOR`]: the request has not reached
//! the app, and need not fail while it comes back. Go's transport answers
//! `502` at once. An app that stays down gets the same `502`, that much
//! later.
//!
//! An upgrade the app accepts (`101`), and a `CONNECT` it accepts (`2xx`,
//! on a connection of its own), leaves the connection to the tunnel
//! ([`Answer::Switched`]).
//!
//! HTTP/2 requests go out as h2c (prior knowledge) over one shared,
//! multiplexed connection, made on first use and remade when it closes,
//! spoken by qproxy's own client ([`super::h2c`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

use super::error::UpstreamError;
use super::h2c;
use crate::proxy::body::ProxyBody;
use qproxy_core::body::{Content, RequestBody};
use qproxy_http1::client::{
    self, ExchangeError, Outgoing, Payload, ResponseBody, ResponseHead, UploadError, exchange,
};
use qproxy_http1::pool::Idle;
use qproxy_http1::rewind::Rewind;

/// TCP keep-alive on upstream connections (Knative's dialer).
const TCP_KEEPALIVE: Duration = Duration::from_secs(5);

/// How long dials the app refuses are tried again.
pub(crate) const REFUSED_FOR: Duration = Duration::from_secs(2);
/// The first pause after a refused dial; each next one doubles, up to
/// [`REFUSED_PAUSE_MAX`].
const REFUSED_PAUSE: Duration = Duration::from_millis(5);
const REFUSED_PAUSE_MAX: Duration = Duration::from_millis(100);

/// An upgraded connection to the app: its socket, and what the app sent
/// after its `101` (or `2xx`) head, read first.
pub(crate) type AppIo = Rewind<TcpStream>;

/// The user container, reachable over HTTP/1.1 and h2c.
#[derive(Debug)]
pub(crate) struct Upstream {
    addr: SocketAddr,
    authority: Authority,
    /// Idle HTTP/1.1 connections, for any request.
    idle: Arc<Idle<client::Conn>>,
    h2c: H2c,
}

/// What the app answered an HTTP/1.1 request with.
#[derive(Debug)]
pub(crate) enum Answer {
    /// A response, its body streamed from the app.
    Response(Response<ProxyBody>),
    /// `101 Switching Protocols` (or a `2xx` to `CONNECT`): the head, and
    /// the connection, now the tunnel's (boxed: rare).
    Switched(Box<(Response<()>, AppIo)>),
}

impl Upstream {
    /// Clients for the user container on `127.0.0.1:port`, keeping at most
    /// `max_idle` idle HTTP/1 connections.
    pub(crate) fn new(port: u16, max_idle: usize) -> Self {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        // `127.0.0.1:<u16>` is always a valid authority.
        let authority = Authority::try_from(addr.to_string())
            .unwrap_or_else(|_| Authority::from_static("127.0.0.1"));
        Self {
            addr,
            authority,
            idle: Idle::new(max_idle),
            h2c: H2c {
                addr,
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            },
        }
    }

    /// `127.0.0.1:USER_PORT`, the authority of upstream requests.
    pub(crate) fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Sends an HTTP/1.1 request over a pooled connection (or a new one),
    /// sending it again by the rules above. A `CONNECT` goes on a
    /// connection of its own, its authority-form target as the client
    /// wrote it; a `2xx` answer leaves that connection to the tunnel, and
    /// no other answer's connection is reused.
    pub(crate) async fn send(&self, req: Http1Request) -> Result<Answer, UpstreamError> {
        let Http1Request {
            mut out,
            mut headers,
            replayable,
            connect,
        } = req;
        if connect {
            let conn = self.dial().await?;
            return self.exchange_on(conn, &mut out, &mut headers, true).await;
        }
        // Once sent again after the app dropped it: on a new connection.
        let mut fresh = false;
        loop {
            let (conn, idle_since) = match (!fresh).then(|| self.idle.take()).flatten() {
                Some((conn, since)) => (conn, Some(since)),
                None => (self.dial().await?, None),
            };
            let err = match self.exchange_on(conn, &mut out, &mut headers, false).await {
                Ok(answer) => return Ok(answer),
                Err(err) => err,
            };
            let Some(since) = idle_since else {
                return Err(err);
            };
            if !out.was_heard() && err.is_dropped_connection() {
                // The app closed a connection that had idled this long.
                self.idle.closed_after(since.elapsed());
            }
            if out.is_unsent() {
                tracing::debug!(error = %err, "an idle connection to the app was closed before the request was written; sending on another");
                continue;
            }
            if replayable
                && !fresh
                && !out.was_heard()
                && err.is_dropped_connection()
                && out.rearm()
            {
                tracing::debug!(error = %err, "the app dropped the connection; sending again");
                headers.clear();
                fresh = true;
                continue;
            }
            return Err(err);
        }
    }

    /// Sends `out` on `conn` and answers with the app's response (its
    /// header map `headers`), whose body reads the rest and hands the
    /// connection back (not for `CONNECT`), or with the switched
    /// connection.
    async fn exchange_on(
        &self,
        mut conn: client::Conn,
        out: &mut Outgoing<RequestBody>,
        headers: &mut HeaderMap,
        connect: bool,
    ) -> Result<Answer, UpstreamError> {
        let head = match exchange(&mut conn, out, headers).await {
            Ok(head) => head,
            Err(err) => return Err(self.exchange_error(err, &conn)),
        };
        if head.status == StatusCode::SWITCHING_PROTOCOLS || connect && head.status.is_success() {
            let (tcp, ahead) = conn.into_io();
            let res = response(head, ());
            return Ok(Answer::Switched(Box::new((res, Rewind::new(tcp, ahead)))));
        }
        let idle = (!connect).then(|| self.idle.clone());
        let body = ResponseBody::new(conn, &head, idle);
        Ok(Answer::Response(response(head, ProxyBody::App(body))))
    }

    /// What failed on `conn`, in Go's transport's words.
    fn exchange_error(&self, err: ExchangeError, conn: &client::Conn) -> UpstreamError {
        match err {
            ExchangeError::Io(source) => UpstreamError::Io {
                local: Some(conn.local()),
                remote: self.addr,
                source,
            },
            ExchangeError::Closed => UpstreamError::Closed,
            ExchangeError::Malformed(_) => UpstreamError::Protocol(err.to_string()),
            // The client's body broke off: the client's doing.
            ExchangeError::Upload(
                UploadError::Body(_) | UploadError::Length | UploadError::Failed,
            ) => UpstreamError::ClientGone,
            ExchangeError::Upload(UploadError::Io(source)) => UpstreamError::Io {
                local: Some(conn.local()),
                remote: self.addr,
                source,
            },
        }
    }

    /// A new connection to the app, with Knative's TCP keep-alive.
    async fn dial(&self) -> Result<client::Conn, UpstreamError> {
        let (tcp, local) = dial(self.addr).await?;
        let keepalive = TcpKeepalive::new().with_time(TCP_KEEPALIVE);
        SockRef::from(&tcp)
            .set_tcp_keepalive(&keepalive)
            .map_err(|source| UpstreamError::Connect {
                addr: self.addr,
                source,
            })?;
        Ok(client::Conn::new(tcp, local))
    }

    /// Sends an HTTP/2 request over h2c; its URI carries the `:authority`
    /// the app should see.
    pub(crate) async fn send_h2c(
        &self,
        req: Request<RequestBody>,
    ) -> Result<Response<ProxyBody>, UpstreamError> {
        self.h2c.send(req).await
    }
}

/// The response of `head`, with `body`.
fn response<B>(head: ResponseHead, body: B) -> Response<B> {
    let mut res = Response::new(body);
    *res.status_mut() = head.status;
    *res.version_mut() = head.version;
    *res.headers_mut() = head.headers;
    res
}

/// An HTTP/1.1 request made ready for [`Upstream::send`]: its head written
/// out, its header map emptied for the response's.
#[derive(Debug)]
pub(crate) struct Http1Request {
    out: Outgoing<RequestBody>,
    headers: HeaderMap,
    /// It may be sent again after it was written, by Go's rule.
    replayable: bool,
    /// A `CONNECT`, sent on a connection of its own.
    connect: bool,
}

impl Http1Request {
    /// `req`, its URI in origin form (authority form for `CONNECT`) and
    /// its `Host` set.
    pub(crate) fn new(req: Request<RequestBody>) -> Self {
        let replayable = replayable(&req);
        let connect = req.method() == Method::CONNECT;
        let (mut parts, body) = req.into_parts();
        let payload = match body.content {
            Content::Empty => Payload::None,
            // Written from where it is, after the head and in the same
            // write, as hyper's client writes a body it has whole.
            Content::Full(mut whole) => Payload::Whole(whole.take()),
            content => Payload::Stream(RequestBody::new(content, body.facts)),
        };
        let out = Outgoing::new(&mut parts, payload);
        parts.headers.clear();
        Self {
            out,
            headers: parts.headers,
            replayable,
            connect,
        }
    }
}

/// Whether a request may be sent twice, by Go's rule (`isReplayable`): no
/// body, and an idempotent method or an idempotency key.
fn replayable(req: &Request<RequestBody>) -> bool {
    matches!(req.body().content, Content::Empty)
        && (matches!(
            *req.method(),
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        ) || req.headers().contains_key("idempotency-key")
            || req.headers().contains_key("x-idempotency-key"))
}

/// A connection of its own to the app (no delay), and its local address.
async fn dial(addr: SocketAddr) -> Result<(TcpStream, SocketAddr), UpstreamError> {
    let mut refused = None;
    let mut pause = REFUSED_PAUSE;
    loop {
        let err = match dial_once(addr).await {
            Ok(dialed) => return Ok(dialed),
            Err(err) => err,
        };
        let UpstreamError::Connect { source, .. } = &err else {
            return Err(err);
        };
        if source.kind() != std::io::ErrorKind::ConnectionRefused {
            return Err(err);
        }
        let now = tokio::time::Instant::now();
        let until = *refused.get_or_insert_with(|| {
            tracing::debug!(error = %err, "the app refused a connection; dialing again");
            now + REFUSED_FOR
        });
        if now >= until {
            return Err(err);
        }
        tokio::time::sleep_until((now + pause).min(until)).await;
        pause = (pause * 2).min(REFUSED_PAUSE_MAX);
    }
}

/// One dial of `addr`, `TCP_NODELAY` set.
async fn dial_once(addr: SocketAddr) -> Result<(TcpStream, SocketAddr), UpstreamError> {
    let connect_error = |source| UpstreamError::Connect { addr, source };
    let tcp = TcpStream::connect(addr).await.map_err(connect_error)?;
    tcp.set_nodelay(true).map_err(connect_error)?;
    let local = tcp.local_addr().map_err(connect_error)?;
    Ok((tcp, local))
}

/// The shared h2c connection.
#[derive(Debug)]
struct H2c {
    addr: SocketAddr,
    conn: Mutex<Option<Live>>,
    /// Held while connecting, so concurrent first requests share one connection.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Debug, Clone)]
struct Live {
    sender: h2::client::SendRequest<Bytes>,
    /// Set when the connection's task ends.
    closed: Arc<AtomicBool>,
}

impl H2c {
    async fn send(&self, req: Request<RequestBody>) -> Result<Response<ProxyBody>, UpstreamError> {
        let live = self.live().await?;
        let res = h2c::send(live.sender, req)
            .await
            .map_err(UpstreamError::Http2)?;
        Ok(res.map(ProxyBody::H2c))
    }

    fn current(&self) -> Option<Live> {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.as_ref()
            .filter(|c| !c.closed.load(Ordering::Acquire))
            .cloned()
    }

    async fn live(&self) -> Result<Live, UpstreamError> {
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

    async fn connect(&self) -> Result<Live, UpstreamError> {
        let (tcp, _local) = dial(self.addr).await?;
        let (sender, conn) = h2c::builder()
            .handshake(tcp)
            .await
            .map_err(UpstreamError::Http2)?;
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

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use qproxy_core::facts::Facts;
    use qproxy_http1::server::WholeBody;

    /// Responses read one after another over one kept connection (into
    /// the memory it keeps, when nothing holds it) stay whole: those
    /// whose headers and bodies are held while the next is read, and
    /// those let go. Sizes go up and down, and past one read.
    #[tokio::test]
    async fn responses_read_into_kept_memory_stay_whole() {
        let app = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = app.local_addr().unwrap().port();
        let sizes = [5, 300, 20, 3_000, 6_000, 10, 900, 1];
        tokio::spawn(async move {
            // One connection serves every request.
            let (mut tcp, _) = app.accept().await.unwrap();
            let mut got = Vec::new();
            for (i, size) in sizes.into_iter().enumerate() {
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let mut buf = [0; 1024];
                    let n = tcp.read(&mut buf).await.unwrap();
                    assert!(n > 0);
                    got.extend_from_slice(&buf[..n]);
                }
                let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                got.drain(..end);
                let body = char::from(b'a' + i as u8).to_string().repeat(size);
                let res = format!(
                    "HTTP/1.1 200 OK\r\nX-N: {i}-{size}\r\nContent-Length: {size}\r\n\r\n{body}"
                );
                tcp.write_all(res.as_bytes()).await.unwrap();
            }
        });
        let upstream = Upstream::new(port, 4);
        let mut held = Vec::new();
        for (i, size) in sizes.into_iter().enumerate() {
            let req = Request::get("/")
                .header(http::header::HOST, "app")
                .body(RequestBody::new(Content::Empty, Facts::default()))
                .unwrap();
            let Answer::Response(res) = upstream.send(Http1Request::new(req)).await.unwrap() else {
                panic!("switched");
            };
            let (parts, body) = res.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let expected = char::from(b'a' + i as u8).to_string().repeat(size);
            assert_eq!(parts.headers["x-n"], format!("{i}-{size}").as_str());
            assert_eq!(body, expected.as_bytes());
            if i % 2 == 0 {
                held.push((parts.headers, body, i, size));
            }
        }
        for (headers, body, i, size) in held {
            assert_eq!(headers["x-n"], format!("{i}-{size}").as_str());
            assert_eq!(
                body,
                char::from(b'a' + i as u8)
                    .to_string()
                    .repeat(size)
                    .as_bytes()
            );
        }
    }

    /// What a scripted app does with a request.
    #[derive(Debug, Clone, Copy)]
    enum Then {
        /// Answers `200` and keeps the connection.
        Answer,
        /// Answers `200`, announcing `Keep-Alive: timeout=2`.
        AnswerAnnouncing,
        /// Answers `200`, then closes the connection.
        AnswerAndClose,
        /// Closes the connection without answering.
        Close,
    }

    /// An app on loopback that reads each request whole (its
    /// `Content-Length`) and does what `script` says for the `n`th request
    /// on each connection (the last entry after that); the requests it
    /// read, as (connection, request line), come from the receiver.
    async fn scripted(
        script: Vec<Then>,
    ) -> (u16, tokio::sync::mpsc::UnboundedReceiver<(usize, String)>) {
        let app = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = app.local_addr().unwrap().port();
        let (seen, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            for conn in 0.. {
                let (mut tcp, _) = app.accept().await.unwrap();
                let (seen, script) = (seen.clone(), script.clone());
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    for n in 0.. {
                        let end = loop {
                            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                                let head =
                                    String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                                let length = head
                                    .lines()
                                    .find_map(|l| l.strip_prefix("content-length: "))
                                    .map_or(0, |n| n.parse::<usize>().unwrap());
                                if got.len() >= end + 4 + length {
                                    break end + 4 + length;
                                }
                            }
                            let mut buf = [0; 4096];
                            match tcp.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => got.extend_from_slice(&buf[..n]),
                            }
                        };
                        let line = String::from_utf8_lossy(&got[..end])
                            .lines()
                            .next()
                            .unwrap()
                            .to_owned();
                        got.drain(..end);
                        seen.send((conn, line)).unwrap();
                        let then = script[n.min(script.len() - 1)];
                        let answer: &[u8] = match then {
                            Then::Close => return,
                            Then::AnswerAnnouncing => b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=2\r\nContent-Length: 2\r\n\r\nok",
                            _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                        };
                        tcp.write_all(answer).await.unwrap();
                        if let Then::AnswerAndClose = then {
                            return;
                        }
                    }
                });
            }
        });
        (port, rx)
    }

    fn get() -> Request<RequestBody> {
        Request::get("/get")
            .header(http::header::HOST, "app")
            .body(RequestBody::new(Content::Empty, Facts::default()))
            .unwrap()
    }

    fn post() -> Request<RequestBody> {
        Request::post("/post")
            .header(http::header::HOST, "app")
            .header(http::header::CONTENT_LENGTH, "4")
            .body(RequestBody::new(
                Content::Full(WholeBody::new(Bytes::from_static(b"data")).0),
                Facts::default(),
            ))
            .unwrap()
    }

    /// Sends `req`, and reads the answer's body to its end (so that its
    /// connection goes back to the pool): its status, or the error's text.
    async fn status_of(upstream: &Upstream, req: Request<RequestBody>) -> String {
        match upstream.send(Http1Request::new(req)).await {
            Ok(Answer::Response(res)) => {
                let status = res.status();
                res.into_body().collect().await.unwrap();
                status.as_str().to_owned()
            }
            Ok(Answer::Switched(_)) => "switched".to_owned(),
            Err(err) => err.to_string(),
        }
    }

    fn drain(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, String)>,
    ) -> Vec<(usize, String)> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    /// A kept connection the app closed while it was idle is passed over
    /// before anything is written to it: a request with a body goes on a
    /// new connection, and reaches the app once.
    #[tokio::test]
    async fn a_connection_closed_while_idle_is_not_written_to() {
        let (port, mut seen) = scripted(vec![Then::AnswerAndClose]).await;
        let upstream = Upstream::new(port, 4);
        assert_eq!(status_of(&upstream, get()).await, "200");
        // The app has closed its end once it has answered.
        assert_eq!(status_of(&upstream, post()).await, "200");
        assert_eq!(
            drain(&mut seen),
            [
                (0, "GET /get HTTP/1.1".to_owned()),
                (1, "POST /post HTTP/1.1".to_owned())
            ]
        );
    }

    /// The app reads a request on a kept connection and closes it without
    /// answering: a `GET` is sent again on a new connection, as Go sends
    /// it; a `POST` with a body is not (the app has it), and fails with
    /// Go's text.
    #[tokio::test]
    async fn only_a_replayable_request_is_sent_again_after_the_app_had_it() {
        let (port, mut seen) = scripted(vec![Then::Answer, Then::Close]).await;
        let upstream = Upstream::new(port, 4);
        assert_eq!(status_of(&upstream, get()).await, "200");
        assert_eq!(status_of(&upstream, get()).await, "200");
        assert_eq!(
            drain(&mut seen),
            [
                (0, "GET /get HTTP/1.1".to_owned()),
                (0, "GET /get HTTP/1.1".to_owned()),
                (1, "GET /get HTTP/1.1".to_owned()),
            ]
        );
        assert_eq!(status_of(&upstream, post()).await, "EOF");
        assert_eq!(drain(&mut seen), [(1, "POST /post HTTP/1.1".to_owned())]);
    }

    /// A connection is not reused past the idle time its app announced
    /// (`timeout=2`, kept 1.5 s): within it, it is.
    #[tokio::test]
    async fn a_connection_is_not_reused_past_the_idle_time_its_app_announced() {
        let (port, mut seen) = scripted(vec![Then::AnswerAnnouncing]).await;
        let upstream = Upstream::new(port, 4);
        assert_eq!(status_of(&upstream, get()).await, "200");
        // Idle times around the limit are what is under test.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(status_of(&upstream, get()).await, "200");
        tokio::time::sleep(Duration::from_millis(1600)).await;
        assert_eq!(status_of(&upstream, get()).await, "200");
        let conns: Vec<usize> = drain(&mut seen).into_iter().map(|(c, _)| c).collect();
        assert_eq!(conns, [0, 0, 1]);
    }
}
