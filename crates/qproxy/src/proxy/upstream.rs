//! Connections to the user container at `127.0.0.1:USER_PORT`.
//!
//! HTTP/1 requests go out as HTTP/1.1 over a keep-alive pool that keeps at
//! most `CONTAINER_CONCURRENCY` idle connections (1000 when unlimited), as
//! Knative's transport does. A request without a body whose method is
//! idempotent (or that carries an idempotency key) is sent once more on a
//! new connection when the app drops a pooled one under it before
//! answering, as Go's transport retries it; one that went out on a
//! connection dialled for it is not (the app has seen it on a connection
//! that was fresh, and Go does not retry then either). HTTP/2 requests go out as h2c
//! (prior knowledge)
//! over one shared, multiplexed connection, made on first use and remade
//! when it closes.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::Authority;
use http::{Method, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::error::UpstreamError;
use crate::common::body::RequestBody;
use crate::common::{MAX_HEADER_FIELDS, MAX_RESPONSE_HEADER_BYTES};

/// How long an idle pooled connection is kept (Go's transport default).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// TCP keep-alive on upstream connections (Knative's dialer).
const TCP_KEEPALIVE: Duration = Duration::from_secs(5);

/// The user container, reachable over HTTP/1.1 and h2c.
#[derive(Debug)]
pub(crate) struct Upstream {
    addr: SocketAddr,
    authority: Authority,
    http1: Client<Dialer, RequestBody>,
    /// Connections `http1` has dialled so far.
    dialled: Arc<AtomicU64>,
    h2c: H2c,
}

/// The HTTP/1 connector, counting the connections it dials: a request that
/// failed while none was dialled went out on a pooled one.
#[derive(Debug, Clone)]
struct Dialer {
    inner: HttpConnector,
    dialled: Arc<AtomicU64>,
}

impl tower::Service<Uri> for Dialer {
    type Response = <HttpConnector as tower::Service<Uri>>::Response;
    type Error = <HttpConnector as tower::Service<Uri>>::Error;
    type Future = <HttpConnector as tower::Service<Uri>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        self.dialled.fetch_add(1, Ordering::Relaxed);
        self.inner.call(uri)
    }
}

impl Upstream {
    /// Clients for the user container on `127.0.0.1:port`, keeping at most
    /// `max_idle` idle HTTP/1 connections.
    pub(crate) fn new(port: u16, max_idle: usize) -> Self {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let dialled = Arc::new(AtomicU64::new(0));
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_keepalive(Some(TCP_KEEPALIVE));
        let http1 = Client::builder(TokioExecutor::new())
            // Header names as Go's transport writes them (`X-Forwarded-For`).
            .http1_title_case_headers(true)
            .http1_max_headers(MAX_HEADER_FIELDS)
            .http1_max_buf_size(MAX_RESPONSE_HEADER_BYTES)
            .pool_max_idle_per_host(max_idle)
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .build(Dialer {
                inner: connector,
                dialled: dialled.clone(),
            });
        // `127.0.0.1:<u16>` is always a valid authority.
        let authority = Authority::try_from(addr.to_string())
            .unwrap_or_else(|_| Authority::from_static("127.0.0.1"));
        Self {
            addr,
            authority,
            http1,
            dialled,
            h2c: H2c {
                addr,
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            },
        }
    }

    /// `127.0.0.1:USER_PORT`, the authority of HTTP/1 upstream URIs.
    pub(crate) fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Sends an HTTP/1.1 request; its URI must be absolute
    /// (`http://127.0.0.1:PORT/...`).
    pub(crate) async fn send_http1(
        &self,
        req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let again = replayable(&req).then(|| copy_bodyless(&req));
        let dialled = self.dialled.load(Ordering::Relaxed);
        let err = match self.http1.request(req).await {
            Ok(res) => return Ok(res),
            Err(e) => UpstreamError::from_http1(e, self.addr),
        };
        // Whether the request went out on a pooled connection: no dial
        // happened meanwhile (under concurrent dials, it is not retried).
        let pooled = self.dialled.load(Ordering::Relaxed) == dialled;
        match again {
            Some(req) if pooled && err.is_dropped_connection() => {
                tracing::debug!(error = %err, "the app dropped the connection; sending again");
                self.http1
                    .request(req)
                    .await
                    .map_err(|e| UpstreamError::from_http1(e, self.addr))
            }
            _ => Err(err),
        }
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
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .title_case_headers(true)
            .max_headers(MAX_HEADER_FIELDS)
            .max_buf_size(MAX_RESPONSE_HEADER_BYTES)
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
    ) -> Result<Response<Incoming>, UpstreamError> {
        self.h2c.send(req).await
    }
}

/// Whether a request may be sent twice, by Go's rule (`isReplayable`): no
/// body, and an idempotent method or an idempotency key.
fn replayable(req: &Request<RequestBody>) -> bool {
    matches!(req.body(), RequestBody::Empty)
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
    let mut copy = Request::new(RequestBody::Empty);
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
    sender: http2::SendRequest<RequestBody>,
    local: SocketAddr,
}

impl H2c {
    async fn send(&self, req: Request<RequestBody>) -> Result<Response<Incoming>, UpstreamError> {
        let mut live = self.live().await?;
        live.sender
            .ready()
            .await
            .map_err(|e| UpstreamError::from_hyper(&e, Some(live.local), self.addr))?;
        live.sender
            .send_request(req)
            .await
            .map_err(|e| UpstreamError::from_hyper(&e, Some(live.local), self.addr))
    }

    fn current(&self) -> Option<Live> {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.as_ref().filter(|c| !c.sender.is_closed()).cloned()
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
        let (tcp, local) = dial(self.addr).await?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| UpstreamError::from_hyper(&e, Some(local), self.addr))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "h2c connection to the user container ended");
            }
        });
        Ok(Live { sender, local })
    }
}
