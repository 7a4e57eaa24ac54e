//! Connections to the user container at `127.0.0.1:USER_PORT`.
//!
//! HTTP/1 requests go out as HTTP/1.1 over keep-alive connections that
//! qproxy keeps itself ([`qproxy_http1::pool`]): a request takes the
//! connection used last, or dials one; its response body hands the
//! connection back when the app's response has been read to its end, so
//! that the next request, from any client connection, reuses it. Requests
//! without a body, or with one read whole already, are spoken by qproxy's
//! own client ([`qproxy_http1::client`]); those with a body still streaming
//! by hyper's; each kind keeps its own idle connections. At most
//! `CONTAINER_CONCURRENCY` idle connections of each kind are kept (1000
//! when unlimited), each for at most 90 s, as Knative's transport does. A
//! request that an idle connection turns out to be closed for is sent on
//! another before anything of it is written. A request without a body
//! whose method is idempotent (or that carries an idempotency key) is sent
//! once more on a new connection when the app drops a reused one under it
//! before answering, as Go's transport retries it; one that went out on a
//! connection dialled for it is not (the app has seen it on a connection
//! that was fresh, and Go does not retry then either). HTTP/2 requests go
//! out as h2c (prior knowledge) over one shared, multiplexed connection,
//! made on first use and remade when it closes, spoken by qproxy's own
//! client ([`super::h2c`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use http::{HeaderMap, Method, Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

use super::error::UpstreamError;
use super::h2c;
use crate::common::body::{Content, RequestBody};
use qproxy_http1::client::{self as own, ClientConn, ExchangeError, ResponseBody};
use qproxy_http1::pool::{Checkin, Idle};

use super::hyper_conn::HyperConn;
use crate::proxy::body::ProxyBody;
use qproxy_http1::limits::{MAX_HEADER_FIELDS, MAX_RESPONSE_HEADER_BYTES};

/// TCP keep-alive on upstream connections (Knative's dialer).
const TCP_KEEPALIVE: Duration = Duration::from_secs(5);

/// The user container, reachable over HTTP/1.1 and h2c.
#[derive(Debug)]
pub(crate) struct Upstream {
    addr: SocketAddr,
    authority: Authority,
    /// Idle connections spoken by hyper: requests whose body streams.
    idle: Arc<Idle<HyperConn>>,
    /// Idle connections spoken by qproxy: requests without a body, or with
    /// one whole.
    idle_own: Arc<Idle<ClientConn>>,
    h2c: H2c,
}

impl Upstream {
    /// Clients for the user container on `127.0.0.1:port`, keeping at most
    /// `max_idle` idle HTTP/1 connections.
    pub(crate) fn new(port: u16, max_idle: usize) -> Self {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let idle = Idle::new(max_idle);
        let idle_own = Idle::new(max_idle);
        // `127.0.0.1:<u16>` is always a valid authority.
        let authority = Authority::try_from(addr.to_string())
            .unwrap_or_else(|_| Authority::from_static("127.0.0.1"));
        Self {
            addr,
            authority,
            idle,
            idle_own,
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

    /// Sends an HTTP/1.1 request (its URI in origin form, its `Host` set);
    /// the [`Checkin`] hands the connection back once the response body
    /// has been read.
    pub(crate) async fn send_http1(
        &self,
        mut req: Request<RequestBody>,
    ) -> Result<(Response<Incoming>, Checkin<HyperConn>), UpstreamError> {
        while let Some(mut conn) = self.idle.take() {
            if conn.sender.ready().await.is_err() {
                continue;
            }
            let again = replayable(&req).then(|| copy_bodyless(&req));
            match conn.sender.try_send_request(req).await {
                Ok(res) => return Ok((res, self.checkin(conn))),
                Err(mut e) => {
                    if let Some(unsent) = e.take_message() {
                        // Nothing of it was written: another connection.
                        req = unsent;
                        continue;
                    }
                    let err = UpstreamError::from_hyper(e.error(), Some(conn.local), self.addr);
                    match again {
                        Some(copy) if err.is_dropped_connection() => {
                            tracing::debug!(error = %err, "the app dropped the connection; sending again");
                            req = copy;
                            break;
                        }
                        _ => return Err(err),
                    }
                }
            }
        }
        let mut conn = self.dial_http1().await?;
        match conn.sender.send_request(req).await {
            Ok(res) => Ok((res, self.checkin(conn))),
            Err(e) => Err(UpstreamError::from_hyper(&e, Some(conn.local), self.addr)),
        }
    }

    /// Sends a request asking for no upgrade, whose body (if any) is whole,
    /// with qproxy's own client; the response body hands the connection back
    /// once read. The rules for idle connections and for sending again are
    /// those of [`Upstream::send_http1`].
    pub(crate) async fn send_whole(
        &self,
        req: WholeRequest,
    ) -> Result<http::Response<ProxyBody>, UpstreamError> {
        let WholeRequest {
            head,
            mut body,
            method,
            mut headers,
            again,
        } = req;
        // `take` passes over the idle connections the app has closed.
        if let Some(conn) = self.idle_own.take() {
            // Only a request without a body is sent again: the body goes
            // with the first try.
            match self
                .exchange_on(
                    conn,
                    &head,
                    std::mem::take(&mut body),
                    &method,
                    &mut headers,
                )
                .await
            {
                Err(err) if again && err.is_dropped_connection() => {
                    tracing::debug!(error = %err, "the app dropped the connection; sending again");
                    headers.clear();
                }
                answered => return answered,
            }
        }
        let (tcp, local) = self.dial_keepalive().await?;
        self.exchange_on(
            ClientConn::new(tcp, local),
            &head,
            body,
            &method,
            &mut headers,
        )
        .await
    }

    /// Sends `head` and `body` on `conn` and answers with the app's response
    /// (its header map `headers`), whose body reads the rest and hands the
    /// connection back.
    async fn exchange_on(
        &self,
        mut conn: ClientConn,
        head: &[u8],
        body: Bytes,
        method: &Method,
        headers: &mut HeaderMap,
    ) -> Result<Response<ProxyBody>, UpstreamError> {
        let parsed = match own::exchange(&mut conn, head, body, method, headers).await {
            Ok(parsed) => parsed,
            Err(err) => return Err(self.exchange_error(err, &conn)),
        };
        let body = ResponseBody::new(conn, &parsed, self.idle_own.clone());
        let mut res = Response::new(ProxyBody::App(body));
        *res.status_mut() = parsed.status;
        *res.version_mut() = parsed.version;
        *res.headers_mut() = parsed.headers;
        Ok(res)
    }

    /// What failed on `conn`, in Go's transport's words.
    fn exchange_error(&self, err: ExchangeError, conn: &ClientConn) -> UpstreamError {
        match err {
            ExchangeError::Io(source) => UpstreamError::Io {
                local: Some(conn.local()),
                remote: self.addr,
                source,
            },
            ExchangeError::Closed => UpstreamError::Closed,
            ExchangeError::Malformed(_) => UpstreamError::Protocol(err.to_string()),
        }
    }

    /// A new connection to the app, with Knative's TCP keep-alive.
    async fn dial_keepalive(&self) -> Result<(TcpStream, SocketAddr), UpstreamError> {
        let (tcp, local) = dial(self.addr).await?;
        let keepalive = TcpKeepalive::new().with_time(TCP_KEEPALIVE);
        SockRef::from(&tcp)
            .set_tcp_keepalive(&keepalive)
            .map_err(|source| UpstreamError::Connect {
                addr: self.addr,
                source,
            })?;
        Ok((tcp, local))
    }

    fn checkin(&self, conn: HyperConn) -> Checkin<HyperConn> {
        Checkin::new(self.idle.clone(), conn)
    }

    /// A new HTTP/1.1 connection, driven by a task of its own.
    async fn dial_http1(&self) -> Result<HyperConn, UpstreamError> {
        let (tcp, local) = self.dial_keepalive().await?;
        let (sender, conn) = http1_builder()
            .handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| UpstreamError::from_hyper(&e, Some(local), self.addr))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "HTTP/1.1 connection to the user container ended");
            }
        });
        Ok(HyperConn { sender, local })
    }

    /// Sends a `CONNECT` on a connection of its own, its authority-form
    /// target as the client wrote it (the pool would put the app's address
    /// there). A `2xx` answer leaves that connection to the tunnel.
    pub(crate) async fn send_connect(
        &self,
        req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let (tcp, local) = dial(self.addr).await?;
        let hyper_error = |e: hyper::Error| UpstreamError::from_hyper(&e, Some(local), self.addr);
        let (mut sender, conn) = http1_builder()
            .handshake(TokioIo::new(tcp))
            .await
            .map_err(hyper_error)?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "CONNECT connection to the user container ended");
            }
        });
        sender.send_request(req).await.map_err(hyper_error)
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

/// An HTTP/1.1 request that asks for no upgrade and whose body, if any, is
/// all here, made ready for [`Upstream::send_whole`]: its head written
/// out, its header map emptied for the response's.
#[derive(Debug)]
pub(crate) struct WholeRequest {
    head: Vec<u8>,
    /// The body, whole (empty for none).
    body: Bytes,
    method: Method,
    headers: HeaderMap,
    /// It may be sent again, by Go's rule.
    again: bool,
}

impl WholeRequest {
    /// `req`, its URI in origin form and its `Host` set.
    pub(crate) fn new(req: Request<RequestBody>) -> Self {
        let mut head = Vec::with_capacity(256);
        own::encode(&req, &mut head);
        let again = replayable(&req);
        let (
            http::request::Parts {
                method,
                mut headers,
                ..
            },
            body,
        ) = req.into_parts();
        // Written from where it is, after the head and in the same write,
        // as hyper's client writes a body it has whole.
        let body = match body.content {
            Content::Full(mut body) => body.take(),
            _ => Bytes::new(),
        };
        headers.clear();
        Self {
            head,
            body,
            method,
            headers,
            again,
        }
    }
}

/// How HTTP/1.1 connections to the app are spoken: header names as Go's
/// transport writes them (`X-Forwarded-For`), and the response head
/// limits.
fn http1_builder() -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .title_case_headers(true)
        .max_headers(MAX_HEADER_FIELDS)
        .max_buf_size(MAX_RESPONSE_HEADER_BYTES);
    builder
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
    let connect_error = |source| UpstreamError::Connect { addr, source };
    let tcp = TcpStream::connect(addr).await.map_err(connect_error)?;
    tcp.set_nodelay(true).map_err(connect_error)?;
    let local = tcp.local_addr().map_err(connect_error)?;
    Ok((tcp, local))
}

/// A copy of a request that has no body.
fn copy_bodyless(req: &Request<RequestBody>) -> Request<RequestBody> {
    let mut copy = Request::new(RequestBody::new(Content::Empty, req.body().facts));
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    copy
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
    use crate::common::facts::Facts;
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
            let res = upstream.send_whole(WholeRequest::new(req)).await.unwrap();
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

    /// The bytes of one request as the app receives them, sent by `send`
    /// to a listener that answers `204` and closes.
    async fn received<F, Fut>(send: F) -> Vec<u8>
    where
        F: FnOnce(u16) -> Fut,
        Fut: Future<Output = ()>,
    {
        let app = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = app.local_addr().unwrap().port();
        let read = tokio::spawn(async move {
            let (mut tcp, _) = app.accept().await.unwrap();
            let mut got = Vec::new();
            // The head, then the body its `Content-Length` says.
            loop {
                if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .map_or(0, |n| n.parse::<usize>().unwrap());
                    if got.len() >= end + 4 + length {
                        break;
                    }
                }
                let mut buf = [0; 4096];
                let n = tcp.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                got.extend_from_slice(&buf[..n]);
            }
            tcp.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            got
        });
        send(port).await;
        read.await.unwrap()
    }

    /// A request whose body is whole goes out as hyper's client writes
    /// it (and writes a body streamed from a client): the head, then the
    /// body. It is not sent again if the app drops the connection, as Go
    /// sends no request with a body again.
    #[tokio::test]
    async fn a_whole_body_goes_out_as_hyper_writes_it() {
        let parts = || {
            Request::put("/e?x=1")
                .header(http::header::HOST, "app")
                .header("idempotency-key", "k")
                .header(http::header::CONTENT_LENGTH, "11")
                .header("ce-type", "dev.knative.example")
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        let body = Bytes::from_static(b"{\"a\":\"b c\"}");
        let ours = received(|port| {
            let req = Request::from_parts(
                parts(),
                RequestBody::new(
                    Content::Full(WholeBody::new(body.clone()).0),
                    Facts::default(),
                ),
            );
            let whole = WholeRequest::new(req);
            assert!(!whole.again, "a request with a body is never sent again");
            async move {
                let res = Upstream::new(port, 1).send_whole(whole).await.unwrap();
                assert_eq!(res.status(), 204);
            }
        })
        .await;
        let sent = body.clone();
        let hyper = received(|port| async move {
            let tcp = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
                .await
                .unwrap();
            let (mut sender, conn) = http1_builder().handshake(TokioIo::new(tcp)).await.unwrap();
            tokio::spawn(conn);
            let req = Request::from_parts(parts(), http_body_util::Full::new(sent));
            let res = sender.send_request(req).await.unwrap();
            assert_eq!(res.status(), 204);
        })
        .await;
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&hyper)
        );
        assert!(ours.ends_with(&body));
    }
}
