//! Shared pieces of the integration tests: the real `qproxy` binary started
//! as a child process, real apps on loopback, and clients.
//!
//! Nothing waits by sleeping: every wait is on a condition with a deadline.

#![allow(dead_code)]

pub mod oracle;

use std::convert::Infallible;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// How long any single wait in a test may take before it fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Fails the test if `fut` does not finish within [`DEADLINE`].
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(DEADLINE, fut).await {
        Ok(out) => out,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// A running `qproxy` process, killed when dropped.
pub struct QProxy {
    child: Child,
    logs: Arc<(Mutex<Vec<Value>>, Condvar)>,
    /// Main port, on IPv4 loopback.
    pub main: SocketAddr,
    /// Whether the ports are bound dual-stack (`[::]`), not IPv4 only.
    pub dual_stack: bool,
    /// Admin port.
    pub admin: SocketAddr,
    /// Autoscaler stats port.
    pub stats: SocketAddr,
    /// User metrics port, when served.
    pub metrics: Option<SocketAddr>,
}

/// The environment a default Knative install gives a revision whose app
/// listens on `user_port`, with every qproxy port on "any free port" and
/// no drain quiet period (so that `SIGTERM` stops at once; the drain tests
/// set their own).
pub fn knative_env(user_port: u16) -> Vec<(String, String)> {
    let mut vars = qproxy::config::knative_defaults(user_port);
    for name in [
        "QUEUE_SERVING_PORT",
        "QPROXY_ADMIN_PORT",
        "QPROXY_STATS_PORT",
        "QPROXY_METRICS_PORT",
        "QPROXY_DRAIN_QUIET_SECONDS",
    ] {
        vars.set(name, "0");
    }
    vars.iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Runs `qproxy` with exactly `env` (nothing inherited) and waits for it to exit.
pub fn run_to_exit(env: &[(String, String)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_qproxy"))
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("qproxy runs")
}

impl QProxy {
    /// Starts qproxy in front of an app on `user_port`, with Knative's
    /// default environment changed by `overrides`.
    pub fn start(user_port: u16, overrides: &[(&str, &str)]) -> Self {
        let mut env = knative_env(user_port);
        for (k, v) in overrides {
            env.retain(|(name, _)| name != k);
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
        Self::start_env(&env)
    }

    /// Starts qproxy with exactly `env` and waits until its ports are bound.
    pub fn start_env(env: &[(String, String)]) -> Self {
        Self::start_command(Command::new(env!("CARGO_BIN_EXE_qproxy")), env)
    }

    /// Starts qproxy by `command` (another binary, or this one run through
    /// a wrapper such as `chroot`), with exactly `env`, and waits until its
    /// ports are bound.
    pub fn start_command(command: Command, env: &[(String, String)]) -> Self {
        let mut qp = Self::spawn_command(command, env);
        let vars = qproxy::config::Vars::from_pairs(env.iter().map(|(k, v)| (k, v)));
        let metrics_served =
            qproxy::Config::from_vars(&vars).is_ok_and(|c| c.observability.prometheus_metrics());
        qp.main = qp.listening("main");
        qp.dual_stack = qp.bound("main").is_ipv6();
        qp.admin = qp.listening("admin");
        qp.stats = qp.listening("stats");
        if metrics_served {
            qp.metrics = Some(qp.listening("metrics"));
        }
        qp
    }

    /// Starts qproxy with exactly `env`, without waiting for anything.
    pub fn spawn_env(env: &[(String, String)]) -> Self {
        Self::spawn_command(Command::new(env!("CARGO_BIN_EXE_qproxy")), env)
    }

    fn spawn_command(mut command: Command, env: &[(String, String)]) -> Self {
        let mut child = command
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qproxy starts");
        let logs = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        collect_lines(stdout, "stdout", logs.clone());
        collect_lines(stderr, "stderr", logs.clone());
        QProxy {
            child,
            logs,
            main: unspecified(),
            dual_stack: false,
            admin: unspecified(),
            stats: unspecified(),
            metrics: None,
        }
    }

    /// The log lines written to `stream` (`stdout` or `stderr`) so far.
    pub fn logs_on(&self, stream: &str) -> Vec<Value> {
        self.logs()
            .into_iter()
            .filter(|l| l["_stream"] == stream)
            .collect()
    }

    /// The loopback address of the named server, from its start-up log line.
    fn listening(&self, server: &str) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.bound(server).port()))
    }

    /// The address the named server reported binding.
    fn bound(&self, server: &str) -> SocketAddr {
        let line = self.wait_for_log(&format!("{server} server start"), |l| {
            l["message"] == "Starting http server" && l["server"] == server
        });
        line["address"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .expect("address field")
    }

    /// Waits for a log line matching `pred`.
    pub fn wait_for_log(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_for_logs(what, 1, pred)
    }

    /// Waits until `n` log lines match `pred`; returns the `n`th.
    pub fn wait_for_logs(&self, what: &str, n: usize, pred: impl Fn(&Value) -> bool) -> Value {
        let (lines, changed) = &*self.logs;
        let deadline = Instant::now() + DEADLINE;
        let mut guard = lines.lock().unwrap();
        loop {
            if let Some(l) = guard.iter().filter(|l| pred(l)).nth(n - 1) {
                return l.clone();
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("no log line for {what}; logs: {:#?}", *guard));
            guard = changed.wait_timeout(guard, left).unwrap().0;
        }
    }

    /// Every log line so far.
    pub fn logs(&self) -> Vec<Value> {
        self.logs.0.lock().unwrap().clone()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident memory so far, in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/PID/status")
    }

    /// Waits for the process to exit on its own and returns its status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "qproxy did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends a signal (`TERM`, `INT`, ...) to the process.
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// Stops the process with SIGTERM and returns every line it logged.
    /// It logs before it answers, so the lines of every answered request
    /// are there.
    pub fn stop_and_collect_logs(&mut self) -> Vec<Value> {
        self.signal("TERM");
        self.wait_for_log("the exit", |l| {
            l["message"] == "Shutdown complete, exiting..."
        });
        self.logs()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for QProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends a signal to a process.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{sig} {pid}");
}

/// Reads JSON log lines from one of the child's streams, tagging each with
/// `"_stream"`. Anything that is not a JSON object fails the test.
fn collect_lines(
    from: impl std::io::Read + Send + 'static,
    stream: &'static str,
    logs: Arc<(Mutex<Vec<Value>>, Condvar)>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            // Log lines are JSON; request log lines are what their
            // template makes them, kept whole under `_raw`.
            let mut value: Value = serde_json::from_str(&line)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| serde_json::json!({ "_raw": line }));
            value["_stream"] = stream.into();
            let (lines, changed) = &*logs;
            lines.lock().unwrap().push(value);
            changed.notify_all();
        }
    });
}

fn unspecified() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
}

/// A body for test responses and requests.
pub type TestBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A complete body.
pub fn full(data: impl Into<Bytes>) -> TestBody {
    Full::new(data.into()).map_err(|e| match e {}).boxed()
}

/// An empty body.
pub fn empty() -> TestBody {
    Empty::new().map_err(|e| match e {}).boxed()
}

/// What an app saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method.
    pub method: Method,
    /// Request target as received.
    pub uri: Uri,
    /// Protocol version.
    pub version: Version,
    /// Headers as received.
    pub headers: HeaderMap,
}

/// A hyper app (HTTP/1.1 and h2c) on loopback that records what it sees.
pub struct App {
    /// Where it listens.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<Connections>,
}

/// Connections an app has accepted, and how many are still open.
#[derive(Default)]
struct Connections {
    /// (accepted, open)
    counts: Mutex<(usize, usize)>,
    changed: tokio::sync::Notify,
}

impl App {
    /// Starts an app answering every request with `handler`.
    pub async fn start<H, F>(handler: H) -> Self
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<TestBody>> + Send + 'static,
    {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        Self::serve(listener, handler).await
    }

    /// Starts an app on `listener`, answering every request with `handler`.
    pub async fn serve<H, F>(listener: TcpListener, handler: H) -> Self
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<TestBody>> + Send + 'static,
    {
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let connections = Arc::new(Connections::default());
        let conns = connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                {
                    let mut c = conns.counts.lock().unwrap();
                    c.0 += 1;
                    c.1 += 1;
                }
                let conns = conns.clone();
                let handler = handler.clone();
                let log = log.clone();
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    log.lock().unwrap().push(Seen {
                        method: req.method().clone(),
                        uri: req.uri().clone(),
                        version: req.version(),
                        headers: req.headers().clone(),
                    });
                    let fut = handler(req);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                    conns.counts.lock().unwrap().1 -= 1;
                    conns.changed.notify_waiters();
                });
            }
        });
        App {
            addr,
            seen,
            connections,
        }
    }

    /// How many connections the app has accepted so far.
    pub fn connections_accepted(&self) -> usize {
        self.connections.counts.lock().unwrap().0
    }

    /// Waits until exactly `n` of the app's connections are open.
    pub async fn wait_open_connections(&self, n: usize) {
        within(&format!("{n} open connections at the app"), async {
            loop {
                let changed = self.connections.changed.notified();
                if self.connections.counts.lock().unwrap().1 == n {
                    return;
                }
                changed.await;
            }
        })
        .await
    }

    /// An app that holds every request until the test releases it: each
    /// arrival sends the test a sender to release it with, and the app
    /// then answers `body`.
    pub async fn holding(
        body: &'static str,
    ) -> (
        Self,
        tokio::sync::mpsc::Receiver<tokio::sync::oneshot::Sender<()>>,
    ) {
        let (arrived_tx, arrived_rx) = tokio::sync::mpsc::channel(64);
        let app = App::start(move |_| {
            let arrived = arrived_tx.clone();
            async move {
                let (release_tx, release_rx) = tokio::sync::oneshot::channel();
                arrived.send(release_tx).await.unwrap();
                let _ = release_rx.await;
                Response::new(full(body))
            }
        })
        .await;
        (app, arrived_rx)
    }

    /// An app answering `Hello World!` to everything.
    pub async fn hello() -> Self {
        App::start(|_| async { Response::new(full("Hello World!\n")) }).await
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The only request seen.
    pub fn only(&self) -> Seen {
        let seen = self.seen();
        assert_eq!(seen.len(), 1, "expected one request, saw {seen:#?}");
        seen.into_iter().next().unwrap()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

/// An app speaking raw TCP, for misbehaviour hyper would not produce:
/// `handler` gets each accepted connection. Returns the port.
pub async fn raw_app<F, Fut>(handler: F) -> u16
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(handler(stream));
        }
    });
    port
}

/// Reads one message head (through the blank line), byte by byte so that
/// nothing after it is consumed. `None` if the peer closes first.
pub async fn read_head(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.ok()?;
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Reads a request head and ignores it.
pub async fn read_request(stream: &mut TcpStream) {
    let _ = read_head(stream).await;
}

/// An app answering every request with `response`, written as given.
pub async fn canned_app(response: &'static [u8]) -> u16 {
    raw_app(move |mut s| async move {
        read_request(&mut s).await;
        let _ = s.write_all(response).await;
    })
    .await
}

/// Sends raw bytes on a new connection and returns everything the server
/// writes back until it closes the connection or the whole response
/// (going by its `Content-Length`) has arrived.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut got = Vec::new();
    within("a raw response", async {
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head.lines().find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                });
                if length.is_some_and(|n| body.len() >= n) {
                    break;
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

/// A loopback port with nothing listening on it.
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    l.local_addr().unwrap().port()
}

/// Sends one HTTP/1.1 request on a new connection, as a browser or curl
/// would: origin-form, with a `Host` (from the URI, or `hello.example.com`).
pub async fn h1(addr: SocketAddr, mut req: Request<TestBody>) -> Response<Incoming> {
    if !req.headers().contains_key(http::header::HOST) {
        let host = req
            .uri()
            .authority()
            .map_or("hello.example.com", |a| a.as_str())
            .to_owned();
        req.headers_mut()
            .insert(http::header::HOST, host.parse().unwrap());
    }
    if let Some(path) = req.uri().path_and_query().cloned() {
        *req.uri_mut() = Uri::from(path);
    }
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    within("HTTP/1.1 response", sender.send_request(req))
        .await
        .unwrap()
}

/// Sends one HTTP/2 request (prior knowledge) on a new connection.
pub async fn h2(addr: SocketAddr, req: Request<TestBody>) -> Response<Incoming> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    within("HTTP/2 response", sender.send_request(req))
        .await
        .unwrap()
}

/// A GET of `path` with the given headers.
pub fn get(path: &str, headers: &[(&str, &str)]) -> Request<TestBody> {
    let mut b = Request::get(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(empty()).unwrap()
}

/// A kubelet health check (`K-Network-Probe: queue`): status and body.
pub async fn kubelet_health(main: SocketAddr) -> (u16, String) {
    let res = h1(
        main,
        get(
            "/",
            &[
                ("User-Agent", "kube-probe/1.29"),
                ("K-Network-Probe", "queue"),
            ],
        ),
    )
    .await;
    let status = res.status().as_u16();
    (status, text(res).await)
}

/// Collects a response body.
pub async fn text(res: Response<Incoming>) -> String {
    let bytes = within("response body", res.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Opens a WebSocket to `/ws` through `addr`, checks the `101`, and that
/// a `ping` comes back.
pub async fn websocket(addr: SocketAddr) -> WebSocketStream<TcpStream> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut ws, res) = within(
        "websocket handshake",
        tokio_tungstenite::client_async("ws://hello.example.com/ws", stream),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 101);
    ws.send(Message::text("ping")).await.unwrap();
    let echoed = within("echo", ws.next()).await.unwrap().unwrap();
    assert_eq!(echoed, Message::text("ping"));
    ws
}

/// A WebSocket app on loopback echoing every message until the client
/// closes. Returns its port.
pub async fn websocket_echo_app() -> u16 {
    raw_app(|stream| async move {
        let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
            return;
        };
        while let Some(Ok(msg)) = ws.next().await {
            if msg.is_close() || ws.send(msg).await.is_err() {
                break;
            }
        }
    })
    .await
}

/// An app that upgrades `/ws` to an echoing WebSocket and cuts every other
/// response short: its head promises 100 bytes, 5 come, then the
/// connection closes.
pub async fn upgrade_and_abort_app() -> u16 {
    raw_app(|mut stream| async move {
        let mut peek = [0u8; 8];
        let Ok(n) = stream.peek(&mut peek).await else {
            return;
        };
        if peek[..n].starts_with(b"GET /ws ") {
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                return;
            };
            while let Some(Ok(msg)) = ws.next().await {
                if msg.is_close() || ws.send(msg).await.is_err() {
                    break;
                }
            }
        } else {
            read_request(&mut stream).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
                .await;
        }
    })
    .await
}

/// A WebSocket opened and closed, then a response cut short.
pub async fn play_upgrade_and_abort(main: SocketAddr) {
    let mut ws = websocket(main).await;
    ws.close(None).await.unwrap();
    while within("the close", ws.next()).await.is_some() {}
    drop(ws);
    // The client gets no complete answer: Go drops the connection before
    // its buffered head goes out; qproxy sends the head, then cuts the body.
    let stream = tokio::net::TcpStream::connect(main).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let sent = within(
        "the cut response",
        sender.send_request(get("/cut", &[("Host", "hello.example.com")])),
    )
    .await;
    let complete = match sent {
        Ok(res) => res.into_body().collect().await.is_ok(),
        Err(_) => false,
    };
    assert!(!complete, "the response is cut short");
}
