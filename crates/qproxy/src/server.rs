//! Listeners and connections.
//!
//! Every port is bound the way Go's `net.Listen(":port")` binds it: one
//! dual-stack socket on `[::]` (so both the pod IP and loopback, IPv4 and
//! IPv6, reach it), or `0.0.0.0` where the kernel has no IPv6. Each accepted
//! connection gets `TCP_NODELAY` and keep-alive, then is served by hyper,
//! which tells HTTP/1.1 from h2c (prior knowledge) by its first bytes.

use std::convert::Infallible;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use socket2::{Domain, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::Service;

/// Largest request head accepted on HTTP/1 (Go's `DefaultMaxHeaderBytes`
/// plus the slack Go's server allows).
pub(crate) const MAX_HEADER_BYTES: usize = (1 << 20) + 4096;
/// Largest header list accepted on HTTP/2 (Go's default).
const MAX_HEADER_LIST_SIZE: u32 = 1 << 20;
/// Concurrent streams per HTTP/2 connection (Go's default).
const MAX_CONCURRENT_STREAMS: u32 = 250;
/// TCP keep-alive on accepted connections (Go's default).
const ACCEPTED_KEEPALIVE: Duration = Duration::from_secs(15);
/// Bound on reading a request head on the small admin-style servers.
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(60);

/// A port could not be listened on.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on port {port} for the {name} server: {source}")]
pub struct BindError {
    /// Which server.
    pub name: &'static str,
    /// The port asked for.
    pub port: u16,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// A bound, listening port.
#[derive(Debug)]
pub struct Listener {
    name: &'static str,
    tcp: TcpListener,
    addr: SocketAddr,
}

impl Listener {
    /// Binds `port` on all addresses, IPv4 and IPv6. Must be called within
    /// a Tokio runtime.
    pub fn bind(name: &'static str, port: u16) -> Result<Self, BindError> {
        let err = |source| BindError { name, port, source };
        let socket = match dual_stack(port) {
            Ok(s) => s,
            // No IPv6 in this kernel or namespace: IPv4 only, as Go falls back.
            Err(e) if ipv6_unavailable(&e) => ipv4_only(port).map_err(err)?,
            Err(e) => return Err(err(e)),
        };
        let std: std::net::TcpListener = socket.into();
        let addr = std.local_addr().map_err(err)?;
        let tcp = TcpListener::from_std(std).map_err(err)?;
        Ok(Self { name, tcp, addr })
    }

    /// The server's name (`main`, `admin`, ...).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The bound address (`[::]:8012` or `0.0.0.0:8012`).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

fn dual_stack(port: u16) -> io::Result<Socket> {
    let socket = Socket::new(Domain::IPV6, Type::STREAM.nonblocking(), None)?;
    socket.set_only_v6(false)?;
    listen(socket, SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
}

fn ipv4_only(port: u16) -> io::Result<Socket> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM.nonblocking(), None)?;
    listen(socket, SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
}

fn listen(socket: Socket, addr: SocketAddr) -> io::Result<Socket> {
    // Go sets SO_REUSEADDR too: a restart must not wait for TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog())?;
    Ok(socket)
}

fn ipv6_unavailable(e: &io::Error) -> bool {
    const EAFNOSUPPORT: i32 = 97;
    const EADDRNOTAVAIL: i32 = 99;
    matches!(e.raw_os_error(), Some(EAFNOSUPPORT | EADDRNOTAVAIL))
}

/// The listen backlog Go uses: the kernel's `somaxconn`.
fn backlog() -> i32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}

/// Connection settings for the main port: HTTP/1.1 and h2c.
pub fn main_builder() -> auto::Builder<TokioExecutor> {
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
pub fn admin_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(ADMIN_HEADER_TIMEOUT)
        .title_case_headers(true);
    builder
}

/// What a server knows of one accepted connection.
#[derive(Debug, Clone, Copy)]
pub struct Conn {
    /// The client's address (IPv4 clients of a dual-stack socket show as IPv4).
    pub remote: SocketAddr,
}

/// Serves connections accepted on `listener` until `stop` turns true.
///
/// `make` builds the service for each connection. Connections are tracked
/// by `graceful`, whose shutdown (once every accept loop has returned and
/// dropped its handle) lets in-flight requests finish.
pub async fn serve<M, S, B>(
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

    #[tokio::test]
    async fn binds_dual_stack_and_reports_busy_ports() {
        let first = Listener::bind("main", 0).unwrap();
        let port = first.local_addr().port();
        assert_ne!(port, 0);
        let v4 = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await;
        assert!(v4.is_ok(), "IPv4 loopback reaches the listener");
        if first.local_addr().is_ipv6() {
            let v6 = TcpStream::connect((Ipv6Addr::LOCALHOST, port)).await;
            assert!(v6.is_ok(), "IPv6 loopback reaches the listener");
        }
        // The pod IP: the address of the interface the default route uses,
        // when this machine has one (a UDP "connect" sends nothing).
        let probe = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        if probe.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).is_ok() {
            let ip = probe.local_addr().unwrap().ip();
            if !ip.is_loopback() && !ip.is_unspecified() {
                let pod = TcpStream::connect((ip, port)).await;
                assert!(pod.is_ok(), "the pod IP {ip} reaches the listener");
            }
        }
        let err = Listener::bind("admin", port).unwrap_err();
        assert_eq!(err.port, port);
        assert_eq!(err.source.kind(), io::ErrorKind::AddrInUse);
        assert!(err.to_string().starts_with(&format!(
            "cannot listen on port {port} for the admin server: "
        )));
    }

    #[test]
    fn backoff_doubles_to_a_second() {
        let mut b = Backoff::default();
        let steps: Vec<_> = (0..10).map(|_| b.next().as_millis()).collect();
        assert_eq!(steps, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(5));
    }
}
