//! The drain, under load: no accepted request is lost, health checks fail at
//! once, the process exits 0 once the quiet period has passed; the same
//! through `/wait-for-drain`, whose drain is called off when no `SIGTERM`
//! follows; upgraded connections outlive the listeners, within a bound.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::Response;
use hyper_util::rt::TokioIo;
use qproxy_test_support::*;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

/// How long the app takes over `/slow`: longer than the quiet period, so
/// that slow requests are in flight when the listeners close.
const SLOW: Duration = Duration::from_secs(3);

/// An app answering `/slow` after [`SLOW`] and anything else at once, each
/// with a body naming the path.
async fn app() -> App {
    App::start(|req| async move {
        let path = req.uri().path().to_owned();
        if path == "/slow" {
            tokio::time::sleep(SLOW).await;
        }
        Response::new(full(format!("answer to {path}")))
    })
    .await
}

/// Waits until health checks answer `503 shutting down`.
async fn wait_health_failing(main: SocketAddr) {
    let body = until("health checks to fail", async || {
        match kubelet_health(main).await {
            (503, body) => Some(body),
            (200, _) => None,
            other => panic!("unexpected health answer {other:?}"),
        }
    })
    .await;
    assert_eq!(body, "shutting down\n");
}

/// Clients sending requests back to back on keep-alive connections until
/// stopped, checking every answer.
struct Load {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    workers: Vec<tokio::task::JoinHandle<Result<usize, String>>>,
}

impl Load {
    /// `fast` clients asking for `/fast/<n>`, `slow` ones for `/slow`.
    fn start(main: SocketAddr, fast: usize, slow: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let workers = (0..fast + slow)
            .map(|i| {
                let (stop, answered) = (stop.clone(), answered.clone());
                let slow = i >= fast;
                tokio::spawn(async move { client(main, slow, stop, answered).await })
            })
            .collect();
        Load {
            stop,
            answered,
            workers,
        }
    }

    fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    async fn wait_answered(&self, n: usize) {
        until(&format!("{n} answers"), async || {
            let answered = self.answered();
            if answered >= n { Ok(()) } else { Err(answered) }
        })
        .await;
    }

    /// Stops the clients after their current request; returns how many
    /// answers they got, failing on any wrong answer or error.
    async fn finish(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        let mut total = 0;
        for w in self.workers {
            match w.await.unwrap() {
                Ok(n) => total += n,
                Err(e) => panic!("a client saw {e}"),
            }
        }
        total
    }
}

/// One client: requests back to back on a kept-alive connection, dialing
/// again when an answer closes it, as a pooling client does.
async fn client(
    main: SocketAddr,
    slow: bool,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
) -> Result<usize, String> {
    let mut n = 0;
    let mut sender = None;
    while !stop.load(Ordering::SeqCst) {
        let conn = match sender.as_mut() {
            Some(conn) => conn,
            None => sender.insert(dial(main).await?),
        };
        let path = if slow {
            "/slow".to_owned()
        } else {
            format!("/fast/{n}")
        };
        let req = get(&path, &[("Host", "hello.example.com")]);
        conn.ready().await.map_err(|e| format!("{path}: {e}"))?;
        let res = conn
            .send_request(req)
            .await
            .map_err(|e| format!("{path}: {e}"))?;
        if closes(&res) {
            sender = None;
        }
        let status = res.status();
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await
            .map_err(|e| format!("{path}: body: {e}"))?
            .to_bytes();
        let want = format!("answer to {path}");
        if status != 200 || body != want.as_bytes() {
            return Err(format!("{path}: {status} {body:?}"));
        }
        n += 1;
        answered.fetch_add(1, Ordering::SeqCst);
    }
    Ok(n)
}

type Sender = hyper::client::conn::http1::SendRequest<TestBody>;

/// A kept-alive HTTP/1.1 connection to `main`.
async fn dial(main: SocketAddr) -> Result<Sender, String> {
    Ok(dial_watched(main).await?.0)
}

/// A kept-alive HTTP/1.1 connection to `main`, and its task, which ends
/// when the connection does.
async fn dial_watched(
    main: SocketAddr,
) -> Result<(Sender, tokio::task::JoinHandle<Result<(), hyper::Error>>), String> {
    let stream = TcpStream::connect(main).await.map_err(|e| e.to_string())?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    Ok((sender, tokio::spawn(conn)))
}

/// Whether `res` is the last answer on its connection.
fn closes<B>(res: &Response<B>) -> bool {
    res.headers()
        .get_all(http::header::CONNECTION)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_without_losing_a_request() {
    let app = app().await;
    let mut qp = QProxy::start(app.port(), &[("QPROXY_DRAIN_QUIET_SECONDS", "1")]);
    let load = Load::start(qp.main, 4, 2);
    load.wait_answered(50).await;

    qp.signal("TERM");
    wait_health_failing(qp.main).await;
    // Requests go on being served while health checks fail.
    let at_term = load.answered();
    load.wait_answered(at_term + 200).await;
    assert!(
        qp.is_running(),
        "still serving: requests keep the drain open"
    );

    // Traffic stops, as once the endpoints have been updated. One last
    // slow request is at the app when it does: it outlasts the quiet
    // period and the listeners.
    let slow_seen = || {
        app.seen()
            .iter()
            .filter(|s| s.uri.path() == "/slow")
            .count()
    };
    let before = slow_seen();
    let main = qp.main;
    let last = tokio::spawn(async move { text(h1(main, get("/slow", &[])).await).await });
    until("the last request at the app", async || {
        slow_seen() != before
    })
    .await;
    let total = load.finish().await;
    assert!(total >= at_term + 200);
    assert_eq!(
        within("the last request", last).await.unwrap(),
        "answer to /slow"
    );
    assert!(
        qp.logs()
            .iter()
            .any(|l| { l["message"] == "Stopped accepting connections" && l["server"] == "main" }),
        "the last request was still in flight when the listener closed"
    );
    let status = qp.wait_exit();
    assert_eq!(status.code(), Some(0), "exit status");
    let logs = qp.logs();
    let position = |message: &str| {
        logs.iter()
            .position(|l| l["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} in {logs:#?}"))
    };
    assert!(
        position("Received TERM signal, attempting to gracefully shutdown servers.")
            < position("Shutdown complete, exiting...")
    );
    assert!(
        logs.iter()
            .any(|l| { l["message"] == "Sleeping 1s to allow K8s propagation of non-ready state" })
    );
    assert!(
        TcpStream::connect(qp.main).await.is_err(),
        "listener closed"
    );
}

/// A client still sending on a connection it opened before the drain (one
/// a Service's cluster IP pinned to this pod, whose endpoints have long
/// changed) keeps the drain open; once the drain has lasted a quiet
/// period, the connection's next answer closes it, so that the client
/// dials again, which elsewhere reaches a pod that stays.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_still_sending_once_the_drain_settles_is_closed_after_its_answer() {
    let app = app().await;
    let mut qp = QProxy::start(app.port(), &[("QPROXY_DRAIN_QUIET_SECONDS", "1")]);
    let (mut sender, conn) = dial_watched(qp.main).await.unwrap();
    let mut n = 0;
    let mut ask = async |sender: &mut Sender| {
        n += 1;
        sender
            .ready()
            .await
            .unwrap_or_else(|e| panic!("before /fast/{n}: {e}"));
        let res = sender
            .send_request(get(&format!("/fast/{n}"), &[("Host", "hello.example.com")]))
            .await
            .unwrap_or_else(|e| panic!("/fast/{n}: {e}"));
        let closes = closes(&res);
        assert_eq!(text(res).await, format!("answer to /fast/{n}"));
        closes
    };
    assert!(!ask(&mut sender).await, "kept alive before the drain");

    qp.signal("TERM");
    wait_health_failing(qp.main).await;
    until("the drain to close the connection", async || {
        ask(&mut sender).await
    })
    .await;
    // The answer was the connection's last: qproxy closes it.
    within("the connection's end", conn).await.unwrap().unwrap();
    assert!(qp.is_running(), "requests kept the drain open");

    // A client dialing again is still served, until it stops.
    let (mut sender, _conn) = dial_watched(qp.main).await.unwrap();
    assert!(
        ask(&mut sender).await,
        "still settled: the next answer closes too"
    );
    assert_eq!(qp.wait_exit().code(), Some(0));
}

/// `GET /wait-for-drain` on the admin port, answered once the drain ends.
fn wait_for_drain(admin: SocketAddr) -> tokio::task::JoinHandle<(u16, String)> {
    tokio::spawn(async move {
        let res = h1(admin, get("/wait-for-drain", &[])).await;
        let status = res.status().as_u16();
        (status, text(res).await)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_for_drain_then_sigterm_drains_and_exits() {
    let app = app().await;
    let mut qp = QProxy::start(app.port(), &[("QPROXY_DRAIN_QUIET_SECONDS", "1")]);
    let load = Load::start(qp.main, 2, 1);
    load.wait_answered(20).await;

    let hook = wait_for_drain(qp.admin);
    wait_health_failing(qp.main).await;
    qp.signal("TERM");
    let at_term = load.answered();
    load.wait_answered(at_term + 100).await;
    assert!(!hook.is_finished(), "the hook waits while requests arrive");
    load.finish().await;

    assert_eq!(
        within("the hook", hook).await.unwrap(),
        (200, String::new())
    );
    assert_eq!(qp.wait_exit().code(), Some(0));
    qp.wait_for_log("the hook", |l| {
        l["message"] == "Attached drain handler from user-container"
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_for_drain_without_sigterm_is_called_off() {
    let app = app().await;
    // Knative's quiet period: only the reset can end this drain quickly.
    let mut qp = QProxy::start(app.port(), &[("QPROXY_DRAIN_QUIET_SECONDS", "30")]);
    let hook = wait_for_drain(qp.admin);
    wait_health_failing(qp.main).await;
    let res = h1(qp.main, get("/during", &[])).await;
    assert_eq!(text(res).await, "answer to /during");

    assert_eq!(
        within("the hook", hook).await.unwrap(),
        (200, String::new())
    );
    assert_eq!(
        kubelet_health(qp.main).await,
        (200, "queue".to_owned()),
        "back to normal"
    );
    let res = h1(qp.main, get("/after", &[])).await;
    assert_eq!(text(res).await, "answer to /after");
    assert!(qp.is_running());

    // A second hook drains again, and is called off again.
    let hook = wait_for_drain(qp.admin);
    wait_health_failing(qp.main).await;
    assert_eq!(within("the hook", hook).await.unwrap().0, 200);
    assert_eq!(kubelet_health(qp.main).await.0, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_websocket_outlives_the_listeners() {
    let ws_app = websocket_echo_app().await;
    let mut qp = QProxy::start(ws_app, &[]);
    let mut ws = websocket(qp.main).await;

    // SIGINT drains as SIGTERM does; there is no quiet period here.
    qp.signal("INT");
    qp.wait_for_log("the listener closing", |l| {
        l["message"] == "Stopped accepting connections" && l["server"] == "main"
    });
    qp.wait_for_log("the wait for upgraded connections", |l| {
        l["message"] == "Waiting for upgraded connections to close"
    });
    ws.send(Message::text("still here")).await.unwrap();
    let echoed = within("echo", ws.next()).await.unwrap().unwrap();
    assert_eq!(echoed, Message::text("still here"));
    assert!(qp.is_running());

    // The client closes: the close handshake, then the TCP connection.
    ws.close(None).await.unwrap();
    while within("the close", ws.next()).await.is_some() {}
    drop(ws);
    assert_eq!(qp.wait_exit().code(), Some(0));
    assert!(
        !qp.logs()
            .iter()
            .any(|l| l["message"].as_str().unwrap_or("").starts_with("Hijack")),
        "closed within the bound"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn websockets_get_a_bounded_grace() {
    let ws_app = websocket_echo_app().await;
    let mut qp = QProxy::start(ws_app, &[("QPROXY_DRAIN_UPGRADED_SECONDS", "1")]);
    let mut ws = websocket(qp.main).await;
    qp.signal("TERM");
    assert_eq!(qp.wait_exit().code(), Some(0));
    qp.wait_for_log("the bound", |l| {
        l["message"] == "Hijack connection drain failed: context deadline exceeded"
            && l["open"] == 1
    });
    // The process is gone, and the connection with it.
    let end = within("the connection's end", ws.next()).await;
    assert!(!matches!(end, Some(Ok(Message::Text(_)))), "{end:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_signal_exits_at_once() {
    let app = app().await;
    let mut qp = QProxy::start(app.port(), &[("QPROXY_DRAIN_QUIET_SECONDS", "30")]);
    qp.signal("TERM");
    wait_health_failing(qp.main).await;
    qp.signal("TERM");
    assert_eq!(qp.wait_exit().code(), Some(1));
}
