//! The soak: the real binary under mixed load for a long while, the app
//! behind it killed and restarted again and again.
//!
//! For `QPROXY_SOAK_SECONDS` (120 unless set), with `containerConcurrency`
//! 10, clients of every kind run at once: HTTP/1.1 keep-alive and h2c
//! requests (bodies of up to 64 KiB echoed), gRPC-framed streams over h2c
//! (length-prefixed messages echoed one by one, `grpc-status` trailers),
//! WebSockets, clients that send their head a line at a time, and clients
//! that vanish mid-request. Every two minutes (a quarter of the run, if
//! that is shorter; `QPROXY_SOAK_RESTART_SECONDS` sets it) the app, a
//! process of its own, is killed with `SIGKILL` and started again two
//! seconds later.
//!
//! Every answer is checked: a request is either served right, or it was
//! in flight while the app was down and got `502` (or was cut, if its
//! response had begun). Anything else is lost, and fails the test. The
//! sidecar's resident memory and open descriptors are sampled: after a
//! warm-up (the first fifth), their peak in the last third may not pass
//! their peak in the first third by more than 10%; and once the clients
//! and the app are gone, the descriptors come back to where they started.
//!
//! `scripts/test soak` runs it for ninety seconds; `benches/RESULTS.md` has
//! the figures of a thirty-minute run.

// A test fails by panicking, with what went wrong.
#![allow(clippy::unwrap_used, missing_docs)]

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use qproxy_test_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long the app stays down when killed.
const DOWN: Duration = Duration::from_secs(2);

/// Whether the app is up, and how many times it went down or up: a
/// request that saw the count change, or saw it odd, was in flight while
/// the app was down.
struct Epoch(AtomicU64);

impl Epoch {
    fn new() -> Self {
        Epoch(AtomicU64::new(0))
    }

    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn bump(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// What the clients of one kind saw.
#[derive(Debug, Default, Clone)]
struct Tally {
    served: u64,
    /// In flight while the app was down, and answered 502 or cut.
    app_dropped: u64,
    /// Anything else; the first few, described.
    lost: u64,
    lost_examples: Vec<String>,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.served += other.served;
        self.app_dropped += other.app_dropped;
        self.lost += other.lost;
        self.lost_examples
            .extend(other.lost_examples.iter().take(5).cloned());
    }

    /// Counts one outcome: `Ok` is served. A failure is the app's doing if
    /// the app went down while it was in flight and it is what Knative
    /// gives then: a `502` or `503`, or a connection or stream cut (a
    /// response cut after its head included: the app was killed while
    /// answering). A failure that begins with a digit is an answer (a
    /// status, or a wrong body after one); anything else is a cut. What is
    /// not the app's doing is lost.
    fn count(&mut self, epoch: &Epoch, began: (u64, Instant), outcome: Result<(), String>) {
        let (began, started) = began;
        let down = began % 2 == 1 || epoch.now() != began;
        match outcome {
            Ok(()) => self.served += 1,
            Err(e)
                if down
                    && (e.starts_with("502")
                        || e.starts_with("503")
                        || !e.starts_with(|c: char| c.is_ascii_digit())) =>
            {
                self.app_dropped += 1
            }
            Err(e) => {
                self.lost += 1;
                if self.lost_examples.len() < 5 {
                    self.lost_examples.push(format!(
                        "{e} (began with the app {}, which went down or up {} times in the {:?} it took)",
                        if began % 2 == 0 { "up" } else { "down" },
                        epoch.now() - began,
                        started.elapsed()
                    ));
                }
            }
        }
    }
}

/// The app: HTTP/1.1 and h2c (`/`, `/echo`, `/slow`, `/grpc`) and a
/// WebSocket echo on `/ws`, on a port it keeps across restarts. It is a
/// process of its own (this test binary, running [`soak_app`]), so that
/// killing it is what a container's end is: `SIGKILL`, every socket closed
/// by the kernel at once.
struct SoakApp {
    port: u16,
    child: std::process::Child,
}

/// Where [`soak_app`] learns its port.
const APP_PORT: &str = "QPROXY_SOAK_APP_PORT";

impl SoakApp {
    async fn start(port: u16) -> Self {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "soak_app",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(APP_PORT, port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        within("the app listening", async {
            while TcpStream::connect((Ipv4Addr::LOCALHOST, port))
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        SoakApp { port, child }
    }

    /// Kills the app, as the kubelet kills a container.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SoakApp {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The app's process: serves on `QPROXY_SOAK_APP_PORT` until killed; does
/// nothing when that is not set (as when the test binary is run for its
/// tests).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "the soak's app, run by the soak in a process of its own"]
async fn soak_app() {
    let Some(port) = std::env::var(APP_PORT)
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
    else {
        return;
    };
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .await
        .unwrap();
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(serve_app_connection(stream));
    }
}

async fn serve_app_connection(stream: TcpStream) {
    let service =
        hyper::service::service_fn(|req| async move { Ok::<_, Infallible>(answer(req).await) });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection_with_upgrades(TokioIo::new(stream), service)
        .await;
}

async fn answer(req: Request<Incoming>) -> Response<TestBody> {
    match req.uri().path() {
        "/ws" => websocket_echo_upgrade(req),
        "/echo" => Response::new(req.into_body().map_err(Into::into).boxed()),
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Response::new(full("slow"))
        }
        "/grpc" => {
            // Each message back as it comes, then grpc-status 0.
            let mut body = req.into_body();
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
            tokio::spawn(async move {
                loop {
                    let frame = match body.frame().await {
                        // An empty DATA frame that does not end the stream
                        // is legal, but h2 (qproxy's client and servers)
                        // closes a connection that carries more than 100:
                        // a gRPC server does not send them.
                        Some(Ok(f)) => match f.into_data() {
                            Ok(data) if !data.is_empty() => Ok(Frame::data(data)),
                            _ => continue,
                        },
                        Some(Err(e)) => Err(e.into()),
                        None => {
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                            let _ = tx.send(Ok(Frame::trailers(trailers))).await;
                            return;
                        }
                    };
                    if tx.send(frame).await.is_err() {
                        return;
                    }
                }
            });
            let frames = tokio_stream::wrappers::ReceiverStream::new(rx);
            let mut res = Response::new(BodyExt::boxed(StreamBody::new(frames)));
            res.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            res
        }
        _ => Response::new(full("hello")),
    }
}

/// A body of `len` bytes that tells where it came from.
fn payload(seed: u64, len: usize) -> Bytes {
    (0..len).map(|i| (seed as usize + i) as u8).collect()
}

/// One request on `sender`, checked.
async fn exchange<S>(send: S, expected: Bytes) -> Result<(), String>
where
    S: std::future::Future<Output = hyper::Result<Response<Incoming>>>,
{
    let res = send.await.map_err(|e| format!("request failed: {e}"))?;
    let status = res.status();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body cut after a {status} head: {e:?}"))?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(format!("{status}: {:?}", String::from_utf8_lossy(&body)));
    }
    if body != expected {
        return Err(format!("200 with a wrong body of {} bytes", body.len()));
    }
    Ok(())
}

/// A request the clients make: `GET /` or a `POST /echo` of a body.
fn request(n: u64, authority: bool) -> (Request<TestBody>, Bytes) {
    let prefix = if authority { "http://a" } else { "" };
    if n.is_multiple_of(3) {
        let body = payload(n, (n as usize * 7919) % (64 << 10));
        let req = Request::post(format!("{prefix}/echo"))
            .header("host", "a")
            .body(full(body.clone()))
            .unwrap();
        (req, body)
    } else {
        let req = Request::get(format!("{prefix}/"))
            .header("host", "a")
            .body(empty())
            .unwrap();
        (req, Bytes::from_static(b"hello"))
    }
}

/// HTTP/1.1 keep-alive requests one after another, reconnecting when the
/// connection is lost.
async fn http1_client(addr: SocketAddr, epoch: Arc<Epoch>, until: Instant) -> Tally {
    let mut tally = Tally::default();
    let mut n = 0;
    while Instant::now() < until {
        let Ok(stream) = TcpStream::connect(addr).await else {
            continue;
        };
        let Ok((mut sender, conn)) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
        else {
            continue;
        };
        tokio::spawn(conn);
        while Instant::now() < until && sender.ready().await.is_ok() {
            n += 1;
            let began = (epoch.now(), Instant::now());
            let (req, expected) = request(n, false);
            let outcome = exchange(sender.send_request(req), expected).await;
            let failed = outcome.is_err();
            tally.count(&epoch, began, outcome);
            if failed {
                break;
            }
        }
    }
    tally
}

/// h2c requests, four at a time on one connection.
async fn h2c_client(addr: SocketAddr, epoch: Arc<Epoch>, until: Instant) -> Tally {
    let mut tally = Tally::default();
    let mut n = 0;
    while Instant::now() < until {
        let Ok(stream) = TcpStream::connect(addr).await else {
            continue;
        };
        let Ok((sender, conn)) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await
        else {
            continue;
        };
        let conn = tokio::spawn(conn);
        while Instant::now() < until && !conn.is_finished() {
            let mut batch = Vec::new();
            for _ in 0..4 {
                n += 1;
                let began = (epoch.now(), Instant::now());
                let (req, expected) = request(n, true);
                let mut sender = sender.clone();
                batch.push(tokio::spawn(async move {
                    let outcome = exchange(sender.send_request(req), expected).await;
                    (began, outcome)
                }));
            }
            for task in batch {
                let (began, outcome) = task.await.unwrap();
                tally.count(&epoch, began, outcome);
            }
        }
    }
    tally
}

/// gRPC-framed streams over h2c: twenty length-prefixed messages sent one
/// at a time, each echoed before the next, then `grpc-status: 0`.
async fn grpc_client(addr: SocketAddr, epoch: Arc<Epoch>, until: Instant) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < until {
        let began = (epoch.now(), Instant::now());
        let outcome = grpc_stream(addr).await;
        tally.count(&epoch, began, outcome);
    }
    tally
}

async fn grpc_stream(addr: SocketAddr) -> Result<(), String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
    let body = BodyExt::boxed(StreamBody::new(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ));
    let req = Request::post("http://a/grpc")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    let res = sender
        .send_request(req)
        .await
        .map_err(|e| format!("stream refused: {e}"))?;
    if res.status() != StatusCode::OK {
        return Err(format!("{}: the stream's answer", res.status()));
    }
    let mut body = res.into_body();
    let mut buf = BytesMut::new();
    for i in 0..20u32 {
        let message = payload(u64::from(i), 100 + i as usize * 50);
        let mut framed = BytesMut::with_capacity(5 + message.len());
        framed.put_u8(0);
        framed.put_u32(message.len() as u32);
        framed.put_slice(&message);
        tx.send(Ok(Frame::data(framed.freeze())))
            .await
            .map_err(|_| format!("message {i} not sent"))?;
        // Read until the whole echoed message is in.
        while buf.len() < 5 + message.len() {
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        buf.put(data);
                    }
                }
                Some(Err(e)) => return Err(format!("message {i}: stream cut: {e}")),
                None => return Err(format!("message {i}: stream ended early")),
            }
        }
        let mut echoed = buf.split_to(5 + message.len());
        echoed.advance(5);
        if echoed.freeze() != message {
            return Err(format!("200: message {i} echoed wrong"));
        }
    }
    drop(tx);
    let mut status = None;
    while let Some(f) = body.frame().await {
        let f = f.map_err(|e| format!("trailers cut: {e}"))?;
        if let Ok(trailers) = f.into_trailers() {
            status = trailers.get("grpc-status").cloned();
        }
    }
    match status {
        Some(s) if s == "0" => Ok(()),
        other => Err(format!("grpc-status {other:?}")),
    }
}

/// WebSockets: twenty messages echoed, then a close.
async fn websocket_client(addr: SocketAddr, epoch: Arc<Epoch>, until: Instant) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < until {
        let began = (epoch.now(), Instant::now());
        let outcome = websocket_session(addr).await;
        tally.count(&epoch, began, outcome);
    }
    tally
}

async fn websocket_session(addr: SocketAddr) -> Result<(), String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut ws, _) = tokio_tungstenite::client_async("ws://a/ws", stream)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    for i in 0..20 {
        let msg = Message::text(format!("message {i}"));
        ws.send(msg.clone())
            .await
            .map_err(|e| format!("send {i}: {e}"))?;
        match ws.next().await {
            Some(Ok(echoed)) if echoed == msg => {}
            Some(Ok(other)) => return Err(format!("200: echo {i} came back as {other:?}")),
            other => return Err(format!("echo {i}: {other:?}")),
        }
    }
    let _ = ws.close(None).await;
    Ok(())
}

/// Clients that send their request head a line every 50 ms.
async fn slow_client(addr: SocketAddr, epoch: Arc<Epoch>, until: Instant) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < until {
        let began = (epoch.now(), Instant::now());
        let outcome = async {
            let mut stream = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            for line in [
                "GET / HTTP/1.1\r\n",
                "Host: a\r\n",
                "X-Slow: 1\r\n",
                "X-Slow: 2\r\n",
                "Connection: close\r\n",
                "\r\n",
            ] {
                stream
                    .write_all(line.as_bytes())
                    .await
                    .map_err(|e| format!("write: {e}"))?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let mut answer = String::new();
            stream
                .read_to_string(&mut answer)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello") {
                Ok(())
            } else {
                let status = answer.get(9..12).unwrap_or("???");
                Err(format!("{status}: the slow head's answer: {answer:?}"))
            }
        }
        .await;
        tally.count(&epoch, began, outcome);
    }
    tally
}

/// Clients that vanish mid-request: a `/slow` request or half a body,
/// then the connection closed. Nothing to check but that nothing else
/// suffers.
async fn vanishing_client(addr: SocketAddr, until: Instant) {
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            continue;
        };
        let request: &[u8] = if n.is_multiple_of(2) {
            b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n"
        } else {
            b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\nonly this much"
        };
        let _ = stream.write_all(request).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(stream);
    }
}

/// Samples of the sidecar's resident memory (KiB) and open descriptors.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    rss_kib: u64,
    fds: usize,
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a soak of minutes: scripts/test soak runs it (QPROXY_SOAK_SECONDS)"]
async fn soak_mixed_load_with_the_app_restarted_loses_nothing_and_holds_steady() {
    let run = seconds_from_env("QPROXY_SOAK_SECONDS", 120);
    let restart_every = std::env::var("QPROXY_SOAK_RESTART_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or((run / 4).min(Duration::from_secs(120)), Duration::from_secs);

    let port = closed_port();
    let mut app = SoakApp::start(port).await;
    assert_eq!(app.port, port);
    let qp = QProxy::start(port, &[("CONTAINER_CONCURRENCY", "10")]);
    let addr = qp.main;
    let pid = qp.pid();
    let fds_at_start = open_fds(pid);
    let epoch = Arc::new(Epoch::new());
    let start = Instant::now();
    let until = start + run;

    let mut clients = tokio::task::JoinSet::new();
    let kinds: [(&str, usize); 6] = [
        ("http/1.1", 4),
        ("h2c", 2),
        ("grpc stream", 2),
        ("websocket", 2),
        ("slow head", 2),
        ("vanishing", 2),
    ];
    for (kind, count) in kinds {
        for _ in 0..count {
            let epoch = epoch.clone();
            clients.spawn(async move {
                let tally = match kind {
                    "http/1.1" => http1_client(addr, epoch, until).await,
                    "h2c" => h2c_client(addr, epoch, until).await,
                    "grpc stream" => grpc_client(addr, epoch, until).await,
                    "websocket" => websocket_client(addr, epoch, until).await,
                    "slow head" => slow_client(addr, epoch, until).await,
                    _ => {
                        vanishing_client(addr, until).await;
                        Tally::default()
                    }
                };
                (kind, tally)
            });
        }
    }

    // The app killed and restarted; the sidecar sampled.
    let mut samples = Vec::new();
    let mut next_restart = start + restart_every;
    let mut restarts = 0;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(Sample {
            at: start.elapsed(),
            rss_kib: rss_kib(pid),
            fds: open_fds(pid),
        });
        if Instant::now() >= next_restart && Instant::now() + DOWN < until {
            epoch.bump();
            app.kill();
            tokio::time::sleep(DOWN).await;
            app = SoakApp::start(port).await;
            epoch.bump();
            restarts += 1;
            next_restart += restart_every;
        }
    }

    let mut by_kind: Vec<(&str, Tally)> = Vec::new();
    while let Some(done) = clients.join_next().await {
        let (kind, tally) = done.unwrap();
        match by_kind.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, t)) => t.add(&tally),
            None => by_kind.push((kind, tally)),
        }
    }
    let mut total = Tally::default();
    eprintln!(
        "soak: {} s, the app restarted {restarts} times",
        run.as_secs()
    );
    for (kind, tally) in &by_kind {
        eprintln!(
            "  {kind:12} served {:7}  app dropped {:5}  lost {}",
            tally.served, tally.app_dropped, tally.lost
        );
        total.add(tally);
    }

    // Steady: the last third's peaks against the first third's (after the
    // warm-up, the first fifth).
    let warm = run / 5;
    let after: Vec<&Sample> = samples.iter().filter(|s| s.at >= warm).collect();
    let third = after.len() / 3;
    let (first, last) = (&after[..third], &after[after.len() - third..]);
    let peak = |w: &[&Sample], f: fn(&Sample) -> u64| w.iter().map(|s| f(s)).max().unwrap();
    let rss = (peak(first, |s| s.rss_kib), peak(last, |s| s.rss_kib));
    let fds = (peak(first, |s| s.fds as u64), peak(last, |s| s.fds as u64));
    eprintln!(
        "  resident memory peak {} KiB then {} KiB; open descriptors peak {} then {} (at start {fds_at_start})",
        rss.0, rss.1, fds.0, fds.1
    );

    // Once the clients are gone, so are their connections; and once the
    // app is, so are the idle connections kept to it for reuse.
    app.kill();
    // Every connection closed; the empty pipes the threads keep for the
    // next splice (two ends each) stay.
    let kept = 2 * qproxy_transport::splice::KEPT_PIPES * threads(pid);
    let settled = eventually(deadline(), || {
        let pipe_ends = open_pipe_ends(pid);
        pipe_ends <= kept && open_fds(pid).saturating_sub(pipe_ends) <= fds_at_start
    })
    .await;
    let fds_after = open_fds(pid);
    eprintln!("  open descriptors once the clients left: {fds_after}");

    assert_eq!(total.lost, 0, "lost: {:?}", total.lost_examples);
    for (kind, tally) in &by_kind {
        assert!(
            tally.served > 0 || *kind == "vanishing",
            "{kind}: nothing served"
        );
    }
    assert!(restarts >= 1, "the app was never restarted");
    assert!(
        rss.1 * 10 <= rss.0 * 11,
        "resident memory grew: peak {} KiB, then {} KiB",
        rss.0,
        rss.1
    );
    assert!(
        fds.1 * 10 <= fds.0 * 11 + 20,
        "open descriptors grew: peak {}, then {}",
        fds.0,
        fds.1
    );
    assert!(
        settled,
        "descriptors left open: {fds_after}, {fds_at_start} at start"
    );
}
