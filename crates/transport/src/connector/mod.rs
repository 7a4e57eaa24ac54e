//! The app's side of the transport: one [`Connector`] that dials the app,
//! keeps its connections and sends each request on one, by the rules of
//! Go's transport.
//!
//! HTTP/1 requests go out as HTTP/1.1, spoken by the client role
//! ([`crate::client`]), over keep-alive connections kept in one pool
//! ([`crate::pool`]) whichever request they served: a request takes the
//! connection used last, or dials one; its response body hands the
//! connection back when the app's response has been read to its end, so
//! that the next request, from any client connection, reuses it. At most
//! the pool's size of idle connections are kept, each for at most 90 s, as
//! Knative's transport keeps them, and none past the idle time the app
//! announced (`Keep-Alive: timeout=N`, less a margin), which Go's
//! transport does not heed. A new connection has `TCP_NODELAY` and
//! Knative's TCP keep-alive, and a dial the app refuses is tried again for
//! a while ([`dial`]).
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
//! An upgrade the app accepts (`101`), and a `CONNECT` it accepts (`2xx`,
//! on a connection of its own), leaves the connection to the tunnel
//! ([`Answer::Switched`]).
//!
//! HTTP/2 requests go out as h2c (prior knowledge) over one shared,
//! multiplexed connection ([`h2c`]).
//!
//! What fails is said in the transport's words ([`SendError`]); the caller
//! words it for its clients.

pub mod dial;
mod error;
pub mod h2c;

pub use error::SendError;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

use crate::BoxError;
use crate::client::{self, Outgoing, Payload, ResponseBody, ResponseHead, exchange};
use crate::pool::Idle;
use crate::rewind::Rewind;
use h2c::H2cBody;

/// TCP keep-alive on the app's connections (Knative's dialer).
const TCP_KEEPALIVE: Duration = Duration::from_secs(5);

/// An upgraded connection to the app: its socket, and what the app sent
/// after its `101` (or `2xx`) head, read first.
pub type AppIo = Rewind<TcpStream>;

/// What the app answered an HTTP/1.1 request with.
#[derive(Debug)]
pub enum Answer<RB> {
    /// A response, its body streamed from the app (`RB` made from the
    /// client's [`ResponseBody`]).
    Response(Response<RB>),
    /// `101 Switching Protocols` (or a `2xx` to `CONNECT`): the head, and
    /// the connection, now the tunnel's (boxed: rare).
    Switched(Box<(Response<()>, AppIo)>),
}

/// The app at `127.0.0.1:port`, reached over HTTP/1.1 and h2c.
#[derive(Debug)]
pub struct Connector {
    addr: SocketAddr,
    authority: Authority,
    /// Idle HTTP/1.1 connections, for any request.
    idle: Arc<Idle<client::Conn>>,
    /// The one h2c connection.
    h2c: h2c::Shared,
}

impl Connector {
    /// The app on `127.0.0.1:port`, keeping at most `max_idle` idle
    /// HTTP/1.1 connections.
    pub fn new(port: u16, max_idle: usize) -> Self {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        // `127.0.0.1:<u16>` is always a valid authority.
        let authority = Authority::try_from(addr.to_string())
            .unwrap_or_else(|_| Authority::from_static("127.0.0.1"));
        Self {
            addr,
            authority,
            idle: Idle::new(max_idle),
            h2c: h2c::Shared::new(addr),
        }
    }

    /// `127.0.0.1:port`, the authority of the requests sent.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Sends an HTTP/1.1 request over a pooled connection (or a new one),
    /// sending it again by the rules above. A `CONNECT` goes on a
    /// connection of its own, its authority-form target as the client
    /// wrote it; a `2xx` answer leaves that connection to the tunnel, and
    /// no other answer's connection is reused.
    pub async fn send<B, RB>(&self, mut req: Http1Request<B>) -> Result<Answer<RB>, SendError>
    where
        B: Body<Data = Bytes> + Unpin + Send + std::fmt::Debug + 'static,
        B::Error: Into<BoxError>,
        RB: From<ResponseBody>,
    {
        if req.connect {
            let conn = self.dial().await?;
            return self.exchange_on(conn, &mut req).await;
        }
        // Once sent again after the app dropped it: on a new connection.
        let mut fresh = false;
        loop {
            let (conn, idle_since) = match (!fresh).then(|| self.idle.take()).flatten() {
                Some((conn, since)) => (conn, Some(since)),
                None => (self.dial().await?, None),
            };
            let err = match self.exchange_on(conn, &mut req).await {
                Ok(answer) => return Ok(answer),
                Err(err) => err,
            };
            let Some(since) = idle_since else {
                return Err(err);
            };
            let Http1Request {
                out,
                headers,
                replayable,
                ..
            } = &mut req;
            if !out.was_heard() && err.is_dropped_connection() {
                // The app closed a connection that had idled this long.
                self.idle.closed_after(since.elapsed());
            }
            if out.is_unsent() {
                tracing::debug!(error = %err, "an idle connection to the app was closed before the request was written; sending on another");
                continue;
            }
            if *replayable
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

    /// Sends `req` on `conn` and answers with the app's response (in the
    /// request's header map), whose body reads the rest and hands the
    /// connection back (not for `CONNECT`), or with the switched
    /// connection.
    async fn exchange_on<B, RB>(
        &self,
        mut conn: client::Conn,
        req: &mut Http1Request<B>,
    ) -> Result<Answer<RB>, SendError>
    where
        B: Body<Data = Bytes> + Unpin + Send + std::fmt::Debug + 'static,
        B::Error: Into<BoxError>,
        RB: From<ResponseBody>,
    {
        let connect = req.connect;
        let head = match exchange(&mut conn, &mut req.out, &mut req.headers).await {
            Ok(head) => head,
            Err(source) => {
                return Err(SendError::Exchange {
                    local: conn.local(),
                    remote: self.addr,
                    source,
                });
            }
        };
        if head.status == StatusCode::SWITCHING_PROTOCOLS || connect && head.status.is_success() {
            let (tcp, ahead) = conn.into_io();
            let res = response(head, ());
            return Ok(Answer::Switched(Box::new((res, Rewind::new(tcp, ahead)))));
        }
        let idle = (!connect).then(|| self.idle.clone());
        let body = ResponseBody::new(conn, &head, idle, req.splice);
        Ok(Answer::Response(response(head, RB::from(body))))
    }

    /// A new HTTP/1.1 connection to the app, with Knative's TCP keep-alive.
    async fn dial(&self) -> Result<client::Conn, SendError> {
        let (tcp, local) = dial::dial(self.addr).await?;
        let keepalive = TcpKeepalive::new().with_time(TCP_KEEPALIVE);
        SockRef::from(&tcp)
            .set_tcp_keepalive(&keepalive)
            .map_err(|source| SendError::Dial {
                addr: self.addr,
                source,
            })?;
        Ok(client::Conn::new(tcp, local))
    }

    /// Sends an HTTP/2 request over h2c; its URI carries the `:authority`
    /// the app should see.
    pub async fn send_h2c<B>(&self, req: Request<B>) -> Result<Response<H2cBody>, SendError>
    where
        B: Body<Data = Bytes> + Unpin + Send + 'static,
        B::Error: std::error::Error + 'static,
    {
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

/// An HTTP/1.1 request made ready for [`Connector::send`]: its head written
/// out, its header map emptied for the response's.
#[derive(Debug)]
pub struct Http1Request<B> {
    out: Outgoing<B>,
    headers: HeaderMap,
    /// It may be sent again after it was written, by Go's rule.
    replayable: bool,
    /// A `CONNECT`, sent on a connection of its own.
    connect: bool,
    /// The response's body may be spliced to the client.
    splice: bool,
}

impl<B> Http1Request<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// The request `parts` (HTTP/1.1, its target in origin form, or in
    /// authority form for `CONNECT`, `Host` set), with `payload`.
    pub fn new(mut parts: http::request::Parts, payload: Payload<B>) -> Self {
        let replayable = replayable(&parts, &payload);
        let connect = parts.method == Method::CONNECT;
        let out = Outgoing::new(&mut parts, payload);
        parts.headers.clear();
        Self {
            out,
            headers: parts.headers,
            replayable,
            connect,
            splice: false,
        }
    }

    /// This request, its response's body spliced from the app's socket to
    /// the client's where both are plain TCP (when `on`), rather than
    /// read and written again ([`splice`](crate::splice)).
    #[must_use]
    pub fn spliced(mut self, on: bool) -> Self {
        self.splice = on;
        self
    }
}

/// Whether a request may be sent twice, by Go's rule (`isReplayable`): no
/// body, and an idempotent method or an idempotency key.
fn replayable<B>(parts: &http::request::Parts, payload: &Payload<B>) -> bool {
    matches!(payload, Payload::None)
        && (matches!(
            parts.method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        ) || parts.headers.contains_key("idempotency-key")
            || parts.headers.contains_key("x-idempotency-key"))
}

#[cfg(test)]
mod tests;
