//! Connections: how each accepted connection is set up and served.
//!
//! Each accepted connection gets `TCP_NODELAY` and keep-alive, then, on a
//! TLS port, its handshake (bounded as a request head is), then is told
//! HTTP/1.1 from HTTP/2 by its first bytes on the main port and the TLS
//! port (whatever ALPN said, as Knative's h2c wrapper does). From its
//! first byte, a connection is `qproxy-transport`'s
//! ([`serve_connection`]): HTTP/1.1 served by its own server until a
//! request needs hyper, which then serves the connection; HTTP/2 hyper's;
//! one clock for every head ([`HeadClock`]). The small servers speak
//! HTTP/1.1 only, through hyper, but for the admin port over TLS, which
//! speaks HTTP/2 too, as Go's TLS servers do.
//!
//! Every port bounds the time a request head may take, as Go's
//! `ReadHeaderTimeout` does on every Knative server ([`HEAD_TIMEOUT`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::graceful::{GracefulShutdown, Watcher};
use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::{Layer, Service, service_fn};

use super::Listener;
use super::listener::HEAD_TIMEOUT;
use crate::layers::server_rules::ServerRulesLayer;
use qproxy_core::Endpoint;
use qproxy_core::body::{BoxError, RequestBody};
use qproxy_transport::limits::{MAX_HEADER_BYTES, MAX_HEADER_FIELDS};
use qproxy_transport::rewind::Rewind;
use qproxy_transport::server::HeadClock;
use qproxy_transport::server::conn::{Ended, Protocols, serve_connection};

/// Largest header list accepted on HTTP/2 (Go's default).
const MAX_HEADER_LIST_SIZE: u32 = 1 << 20;
/// Concurrent streams per HTTP/2 connection (Go's default).
const MAX_CONCURRENT_STREAMS: u32 = 250;
/// TCP keep-alive on accepted connections (Go's default).
const ACCEPTED_KEEPALIVE: Duration = Duration::from_secs(15);

/// Connection settings for the main port: HTTP/1.1 and h2c.
pub(crate) fn main_builder() -> Protocols {
    let mut http1 = http1::Builder::new();
    http1
        // Go's `ReadHeaderTimeout`, counted by each connection's own
        // `HeadTimer` from the head's first bytes: idle keep-alive
        // connections stay open, as with Go's server.
        .header_read_timeout(HEAD_TIMEOUT)
        // Header names as Go writes them (`Content-Type`), for clients that
        // compare them case-sensitively.
        .title_case_headers(true)
        .max_buf_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADER_FIELDS);
    Protocols::new(true, http1, Some(go_http2()))
}

/// Connection settings for the admin, stats and metrics ports: HTTP/1.1.
pub(crate) fn admin_builder() -> Protocols {
    Protocols::new(false, admin_http1(), None)
}

/// Connection settings for the admin port over TLS: HTTP/1.1, and HTTP/2
/// when the client chose it.
fn admin_tls_builder() -> Protocols {
    Protocols::new(false, admin_http1(), Some(go_http2()))
}

/// The small servers' HTTP/1.1: Go's head timeout and header case.
fn admin_http1() -> http1::Builder {
    let mut http1 = http1::Builder::new();
    http1
        .header_read_timeout(HEAD_TIMEOUT)
        .title_case_headers(true);
    http1
}

/// HTTP/2 as Go's server has it: its stream and header-list limits.
fn go_http2() -> http2::Builder<TokioExecutor> {
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_SIZE);
    http2
}

/// What a server knows of one accepted connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Accepted {
    /// The client's address (IPv4 clients of a dual-stack socket show as
    /// IPv4).
    pub(crate) remote: SocketAddr,
}

/// Serves connections accepted on `listener` until `stop` turns true,
/// over TLS when `tls` is given.
///
/// `make` builds, for each connection, the maker of its services (a
/// connection makes one while it serves, and lets it go while it waits
/// long for a request). Connections are tracked
/// by `graceful`, whose shutdown (once every accept loop has returned and
/// dropped its handle) lets in-flight requests finish.
pub(crate) async fn serve<M, N, S, B>(
    listener: Listener,
    builder: Protocols,
    tls: Option<TlsAcceptor>,
    make: M,
    graceful: Arc<GracefulShutdown>,
    mut stop: watch::Receiver<bool>,
) where
    M: Fn(Accepted) -> N,
    N: Fn() -> S + Send + 'static,
    S: Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    tracing::info!(
        server = listener.name,
        address = %listener.addr,
        "Starting http server"
    );
    // Shared by the connections, each holding a pointer to it; ALPN's
    // HTTP/2 the other settings, made once.
    let h2 = Arc::new(builder.clone().h2_only());
    let plain = Arc::new(builder);
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
        let conn = Accepted {
            remote: SocketAddr::new(remote.ip().to_canonical(), remote.port()),
        };
        let services = make(conn);
        let watcher = graceful.watcher();
        let head_timeout = listener.head_timeout;
        match &tls {
            None => {
                let clock = HeadClock::new(head_timeout);
                tokio::spawn(connection(
                    stream,
                    clock,
                    plain.clone(),
                    services,
                    watcher,
                    conn,
                ));
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let (plain, h2_only) = (plain.clone(), h2.clone());
                tokio::spawn(async move {
                    if let Some(tls) = handshake(stream, &acceptor, head_timeout, conn).await {
                        let builder = if tls.h2 { h2_only } else { plain };
                        connection(tls.stream, tls.clock, builder, services, watcher, conn).await;
                    }
                });
            }
        }
    }
    tracing::info!(server = listener.name, "Stopped accepting connections");
}

/// A TLS record header's length: the first bytes of a TLS port read
/// before the handshake, to tell plain HTTP from TLS.
const RECORD_HEADER: usize = 5;
/// The first read on a TLS port, as Go's (a record header and 512 bytes
/// more): what comes with a plain HTTP request is read before the
/// connection is closed, so that it closes cleanly.
const FIRST_READ: usize = RECORD_HEADER + 512;

/// What Go's server writes, then closes, when a TLS port's first bytes
/// are those of an HTTP request.
const HTTP_ON_TLS: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// Whether a connection's first five bytes, read as a TLS record header,
/// are those of a request with one of the common methods (Go's
/// `tlsRecordHeaderLooksLikeHTTP`).
fn looks_like_http(first: &[u8]) -> bool {
    matches!(first, b"GET /" | b"HEAD " | b"POST " | b"PUT /" | b"OPTIO")
}

/// A TLS connection that [`handshake`] completed.
pub(super) struct Handshaken<IO> {
    pub(super) stream: tokio_rustls::server::TlsStream<Rewind<IO>>,
    /// The first request head's clock, started at the handshake's end.
    pub(super) clock: Arc<HeadClock>,
    /// ALPN chose HTTP/2: the connection speaks nothing else, as with
    /// Go's server.
    pub(super) h2: bool,
}

/// The TLS handshake of a connection just accepted: it has `limit`, a
/// head's time, as with Go's server (whose `tlsHandshakeTimeout` is its
/// `ReadHeaderTimeout`), and the first request head then has a clock of
/// its own. A client that speaks plain HTTP gets Go's `400`. `None` when
/// the handshake fails or does not finish in time.
pub(super) async fn handshake<IO>(
    mut io: IO,
    acceptor: &TlsAcceptor,
    limit: Duration,
    conn: Accepted,
) -> Option<Handshaken<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let handshake = async {
        // What Go's first read would take: at least a record header.
        let mut first = bytes::BytesMut::with_capacity(FIRST_READ);
        while first.len() < RECORD_HEADER {
            if io.read_buf(&mut first).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        if looks_like_http(&first[..RECORD_HEADER]) {
            io.write_all(HTTP_ON_TLS).await?;
            return Err(std::io::Error::other("an HTTP request on a TLS port"));
        }
        acceptor.accept(Rewind::new(io, first.freeze())).await
    };
    match tokio::time::timeout(limit, handshake).await {
        Ok(Ok(stream)) => {
            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
            let clock = HeadClock::new(limit);
            Some(Handshaken { stream, clock, h2 })
        }
        Ok(Err(e)) => {
            tracing::debug!(client = %conn.remote, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(client = %conn.remote, ?limit, "closed: no TLS handshake in time");
            None
        }
    }
}

/// Serves one accepted connection, accepted when `clock` was made, with
/// the services `services` makes, until it ends, its first request head
/// does not come in time, or a graceful shutdown ends it.
///
/// Not an `async fn`: one would keep its arguments beside the
/// connection's future they are moved into, twice the room in every
/// connection's task.
pub(super) fn connection<IO, N, S, B>(
    io: IO,
    clock: Arc<HeadClock>,
    builder: Arc<Protocols>,
    services: N,
    watcher: Watcher,
    conn: Accepted,
) -> impl Future<Output = ()> + Send
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    N: Fn() -> S + Send + 'static,
    S: Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    // Mapped, not awaited in an `async` block, which would move the
    // future into a second place of its own.
    serve_connection(io, clock, builder, services, watcher).map(move |ended| match ended {
        Ended::Closed => {}
        Ended::Failed(e) => {
            tracing::debug!(error = %e, client = %conn.remote, "connection ended with an error");
        }
        Ended::NoFirstHead => {
            tracing::debug!(client = %conn.remote, "closed: no request head within a minute");
        }
    })
}

/// Serves one of the small servers (admin, stats, metrics, profiling) on
/// `listener`, over TLS when `tls` is given: every request answered by
/// `endpoint`, behind Go's server rules.
pub(crate) fn small_server<E: Endpoint>(
    listener: Listener,
    endpoint: E,
    tls: Option<TlsAcceptor>,
    graceful: &Arc<GracefulShutdown>,
    stopped: &watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send + use<E> {
    let builder = if tls.is_some() {
        admin_tls_builder()
    } else {
        admin_builder()
    };
    serve(
        listener,
        builder,
        tls,
        move |_| {
            let endpoint = endpoint.clone();
            move || {
                let endpoint = endpoint.clone();
                ServerRulesLayer.layer(service_fn(move |req| {
                    let answer = endpoint.clone().respond(req);
                    async move { Ok::<_, Infallible>(answer.await) }
                }))
            }
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

    use http_body_util::Empty;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::time::{Instant, sleep, timeout};

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const H2_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

    /// The client end of the tests' connections.
    const CLIENT: Accepted = Accepted {
        remote: SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 1),
    };

    /// An app that answers 200 to everything.
    async fn ok(_: Request<RequestBody>) -> Result<Response<Empty<bytes::Bytes>>, Infallible> {
        Ok(Response::new(Empty::new()))
    }

    /// A connection served as `serve` serves it, with an app that answers
    /// 200 to everything, over an in-memory stream; and the graceful
    /// shutdown it is tracked by.
    fn connect(builder: Protocols) -> (DuplexStream, GracefulShutdown) {
        let (client, server) = tokio::io::duplex(1 << 16);
        let graceful = GracefulShutdown::new();
        tokio::spawn(connection(
            server,
            HeadClock::new(HEAD_TIMEOUT),
            Arc::new(builder),
            || service_fn(ok),
            graceful.watcher(),
            CLIENT,
        ));
        (client, graceful)
    }

    /// As [`connect`], on a TLS port with a test CA's server pair; and a
    /// client configuration that trusts the CA.
    fn connect_tls() -> (DuplexStream, GracefulShutdown, Arc<rustls::ClientConfig>) {
        let ca = qproxy_test_support::tls::TestCa::new("conn");
        let acceptor = TlsAcceptor::from(ca.server_config(false));
        let (client, server) = tokio::io::duplex(1 << 16);
        let graceful = GracefulShutdown::new();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            if let Some(tls) = handshake(server, &acceptor, HEAD_TIMEOUT, CLIENT).await {
                connection(
                    tls.stream,
                    tls.clock,
                    Arc::new(main_builder()),
                    || service_fn(ok),
                    watcher,
                    CLIENT,
                )
                .await;
            }
        });
        let config = ca.client_config(&[b"http/1.1"], &[&rustls::version::TLS13]);
        (client, graceful, config)
    }

    /// Reads (and drops) whatever comes until the server closes the
    /// stream, and says when that was; gives up after two hours.
    async fn closed_at(client: &mut DuplexStream) -> Instant {
        let mut buf = [0; 4096];
        let closed = async { while client.read(&mut buf).await.is_ok_and(|n| n > 0) {} };
        let _ = timeout(Duration::from_secs(7200), closed).await;
        Instant::now()
    }

    /// Reads one whole `200` answer without a body.
    async fn answered(client: &mut (impl AsyncRead + Unpin)) {
        let mut got = Vec::new();
        let mut buf = [0; 1024];
        while !got.ends_with(b"\r\n\r\n") {
            let n = client.read(&mut buf).await.unwrap();
            assert_ne!(n, 0, "closed before answering");
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n"), "{got:?}");
    }

    /// Writes `head` a line a second, then more header lines, until the
    /// server closes the stream or ten minutes have passed.
    async fn dribble(client: &mut DuplexStream, head: &[u8]) -> Instant {
        let (mut read, mut write) = tokio::io::split(client);
        let lines = async {
            let more = std::iter::repeat_n(&b"X-A: b\r\n"[..], 600);
            for line in head.split_inclusive(|b| *b == b'\n').chain(more) {
                if write.write_all(line).await.is_err() {
                    break;
                }
                sleep(Duration::from_secs(1)).await;
            }
        };
        let closed = async {
            let mut buf = [0; 4096];
            while read.read(&mut buf).await.is_ok_and(|n| n > 0) {}
            Instant::now()
        };
        tokio::select! {
            at = closed => at,
            () = lines => Instant::now(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sends_nothing_is_closed_a_minute_after_accept() {
        for builder in [main_builder(), admin_builder()] {
            let start = Instant::now();
            let (mut client, _graceful) = connect(builder);
            assert_eq!(closed_at(&mut client).await - start, HEAD_TIMEOUT);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_head_sent_a_line_a_second_is_cut_a_minute_after_accept() {
        for builder in [main_builder(), admin_builder()] {
            let start = Instant::now();
            let (mut client, _graceful) = connect(builder);
            assert_eq!(
                dribble(&mut client, b"GET / HTTP/1.1\r\n").await - start,
                HEAD_TIMEOUT
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn idle_keep_alive_connections_stay_open() {
        for builder in [main_builder(), admin_builder()] {
            let (mut client, _graceful) = connect(builder);
            for _ in 0..3 {
                client.write_all(GET).await.unwrap();
                answered(&mut client).await;
                sleep(Duration::from_secs(600)).await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_head_has_a_minute_from_its_first_byte() {
        for builder in [main_builder(), admin_builder()] {
            let (mut client, _graceful) = connect(builder);
            client.write_all(GET).await.unwrap();
            answered(&mut client).await;
            sleep(Duration::from_secs(300)).await;
            let start = Instant::now();
            assert_eq!(
                dribble(&mut client, b"GET / HTTP/1.1\r\n").await - start,
                HEAD_TIMEOUT
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn part_of_a_head_that_came_with_the_last_request_starts_no_clock() {
        for builder in [main_builder(), main_builder().hyper_only()] {
            let (mut client, _graceful) = connect(builder);
            client
                .write_all(&[GET, &b"GET / HTTP/1.1\r\n"[..]].concat())
                .await
                .unwrap();
            answered(&mut client).await;
            let start = Instant::now();
            assert_eq!(
                closed_at(&mut client).await - start,
                Duration::from_secs(7200),
                "the connection was closed"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_in_time_is_answered_however_slowly_it_came() {
        let (mut client, _graceful) = connect(main_builder());
        for line in GET.split_inclusive(|b| *b == b'\n') {
            client.write_all(line).await.unwrap();
            sleep(Duration::from_secs(19)).await;
        }
        answered(&mut client).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_h2c_preface_without_settings_is_closed_a_minute_after_accept() {
        let start = Instant::now();
        let (mut client, _graceful) = connect(main_builder());
        client.write_all(H2_PREFACE).await.unwrap();
        assert_eq!(closed_at(&mut client).await - start, HEAD_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn an_h2c_connection_past_its_settings_may_idle() {
        let (mut client, _graceful) = connect(main_builder());
        client.write_all(H2_PREFACE).await.unwrap();
        client.write_all(H2_SETTINGS).await.unwrap();
        let start = Instant::now();
        let closed = closed_at(&mut client).await;
        assert_eq!(
            closed - start,
            Duration::from_secs(7200),
            "an idle h2c connection was closed"
        );
    }

    #[test]
    fn backoff_doubles_to_a_second() {
        let mut b = Backoff::default();
        let steps: Vec<_> = (0..10).map(|_| b.next().as_millis()).collect();
        assert_eq!(steps, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tls_handshake_not_finished_is_closed_a_minute_after_accept() {
        // Nothing at all; a TLS record header promising a ClientHello.
        for sent in [&b""[..], &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01][..]] {
            let start = Instant::now();
            let (mut client, _graceful, _) = connect_tls();
            client.write_all(sent).await.unwrap();
            assert_eq!(closed_at(&mut client).await - start, HEAD_TIMEOUT);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_after_a_slow_tls_handshake_has_a_minute_of_its_own() {
        let (client, _graceful, config) = connect_tls();
        let almost = HEAD_TIMEOUT - Duration::from_secs(5);
        sleep(almost).await;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, client)
            .await
            .unwrap();
        sleep(almost).await;
        tls.write_all(GET).await.unwrap();
        answered(&mut tls).await;
    }

    #[tokio::test]
    async fn plain_http_on_a_tls_port_gets_go_s_400() {
        let (mut client, _graceful, _) = connect_tls();
        client.write_all(GET).await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, HTTP_ON_TLS);
    }
}
