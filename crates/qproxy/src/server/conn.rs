//! Connections: how each accepted connection is set up and served.
//!
//! Each accepted connection gets `TCP_NODELAY` and keep-alive, then is
//! served by hyper, which tells HTTP/1.1 from h2c (prior knowledge) by its
//! first bytes on the main port; the small servers speak HTTP/1.1 only.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tower::{Layer, Service, service_fn};

use super::Listener;
use crate::common::{Conn, Endpoint, MAX_HEADER_BYTES};
use crate::layers::server_rules::ServerRulesLayer;

/// Largest header list accepted on HTTP/2 (Go's default).
const MAX_HEADER_LIST_SIZE: u32 = 1 << 20;
/// Concurrent streams per HTTP/2 connection (Go's default).
const MAX_CONCURRENT_STREAMS: u32 = 250;
/// TCP keep-alive on accepted connections (Go's default).
const ACCEPTED_KEEPALIVE: Duration = Duration::from_secs(15);
/// Bound on reading a request head on the small admin-style servers.
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(60);

/// Connection settings for the main port: HTTP/1.1 and h2c.
pub(crate) fn main_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // Idle keep-alive connections stay open, as with Go's server: the
        // activator pools them and a timer here would race its reuse.
        .header_read_timeout(None)
        // Header names as Go writes them (`Content-Type`), for clients that
        // compare them case-sensitively.
        .title_case_headers(true)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_SIZE);
    builder
}

/// Connection settings for the admin, stats and metrics ports: HTTP/1.1.
pub(crate) fn admin_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(ADMIN_HEADER_TIMEOUT)
        .title_case_headers(true);
    builder
}

/// Serves connections accepted on `listener` until `stop` turns true.
///
/// `make` builds the service for each connection. Connections are tracked
/// by `graceful`, whose shutdown (once every accept loop has returned and
/// dropped its handle) lets in-flight requests finish.
pub(crate) async fn serve<M, S, B>(
    listener: Listener,
    builder: auto::Builder<TokioExecutor>,
    make: M,
    graceful: Arc<GracefulShutdown>,
    mut stop: watch::Receiver<bool>,
) where
    M: Fn(Conn) -> S,
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tracing::info!(
        server = listener.name,
        address = %listener.addr,
        "Starting http server"
    );
    let mut backoff = Backoff::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.tcp.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let (stream, remote) = match accepted {
            Ok(a) => {
                backoff.reset();
                a
            }
            Err(e) => {
                // Out of file descriptors and the like: wait, as Go's server does.
                let delay = backoff.next();
                tracing::warn!(server = listener.name, error = %e, ?delay, "accept failed");
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        tune(&stream);
        let conn = Conn {
            remote: SocketAddr::new(remote.ip().to_canonical(), remote.port()),
        };
        let service = TowerToHyperService::new(make(conn));
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let watched = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = watched.await {
                tracing::debug!(error = %e, client = %conn.remote, "connection ended with an error");
            }
        });
    }
    tracing::info!(server = listener.name, "Stopped accepting connections");
}

/// Serves one of the small servers (admin, stats, metrics, profiling) on
/// `listener`: every request answered by `endpoint`, behind Go's server
/// rules.
pub(crate) fn small_server<E: Endpoint>(
    listener: Listener,
    endpoint: E,
    graceful: &Arc<GracefulShutdown>,
    stopped: &watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send + use<E> {
    serve(
        listener,
        admin_builder(),
        move |_| {
            let endpoint = endpoint.clone();
            ServerRulesLayer.layer(service_fn(move |req| {
                let answer = endpoint.clone().respond(req);
                async move { Ok::<_, Infallible>(answer.await) }
            }))
        },
        graceful.clone(),
        stopped.clone(),
    )
}

fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let keepalive = TcpKeepalive::new()
        .with_time(ACCEPTED_KEEPALIVE)
        .with_interval(ACCEPTED_KEEPALIVE);
    let _ = SockRef::from(stream).set_tcp_keepalive(&keepalive);
}

/// Go's accept back-off: 5 ms doubling to 1 s.
#[derive(Debug, Default)]
struct Backoff {
    current: Option<Duration>,
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let next = match self.current {
            None => Duration::from_millis(5),
            Some(d) => (d * 2).min(Duration::from_secs(1)),
        };
        self.current = Some(next);
        next
    }

    fn reset(&mut self) {
        self.current = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_second() {
        let mut b = Backoff::default();
        let steps: Vec<_> = (0..10).map(|_| b.next().as_millis()).collect();
        assert_eq!(steps, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(5));
    }
}
