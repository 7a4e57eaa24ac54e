//! `containerConcurrency` through the real binary: the breaker's slots, its
//! queue, refusals, and what frees a slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::{Response, StatusCode};
use qproxy_test_support::*;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// An app that holds every request until the test releases it, counting how
/// many are inside at once. `/probe` answers at once.
struct Held {
    app: App,
    arrived: mpsc::Receiver<oneshot::Sender<()>>,
    inside: Arc<AtomicUsize>,
    most_inside: Arc<AtomicUsize>,
}

impl Held {
    async fn start() -> Self {
        let (arrived_tx, arrived) = mpsc::channel(64);
        let inside = Arc::new(AtomicUsize::new(0));
        let most_inside = Arc::new(AtomicUsize::new(0));
        let (count, most) = (inside.clone(), most_inside.clone());
        let app = App::start(move |req| {
            let arrived = arrived_tx.clone();
            let (count, most) = (count.clone(), most.clone());
            async move {
                if req.uri().path() == "/probe" {
                    return Response::new(full("probed"));
                }
                let now = count.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let (release_tx, release_rx) = oneshot::channel();
                let _ = arrived.send(release_tx).await;
                let _ = release_rx.await;
                count.fetch_sub(1, Ordering::SeqCst);
                Response::new(full("done"))
            }
        })
        .await;
        Held {
            app,
            arrived,
            inside,
            most_inside,
        }
    }

    /// Waits for the next request to reach the app.
    async fn next(&mut self) -> oneshot::Sender<()> {
        within("a request at the app", self.arrived.recv())
            .await
            .expect("app running")
    }
}

fn queued(n: u64) -> impl Fn(&Value) -> bool {
    move |l| l["message"] == "request queued for a slot" && l["waiting"] == n
}

fn debug_proxy(app: &App, cc: &str, extra: &[(&str, &str)]) -> QProxy {
    let mut env = vec![
        ("CONTAINER_CONCURRENCY", cc),
        ("SERVING_LOGGING_LEVEL", "debug"),
    ];
    env.extend_from_slice(extra);
    QProxy::start(app.port(), &env)
}

/// Sends a GET on its own connection, in its own task.
fn spawn_get(qp: &QProxy, path: &'static str) -> tokio::task::JoinHandle<(StatusCode, String)> {
    let addr = qp.main;
    tokio::spawn(async move {
        let res = h1(addr, get(path, &[])).await;
        let status = res.status();
        (status, text(res).await)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn slots_then_queue_then_immediate_refusal() {
    let mut held = Held::start().await;
    let qp = debug_proxy(&held.app, "2", &[]);
    qp.wait_for_log("breaker parameters", |l| {
        l["message"]
            == "Queue container is starting with BreakerParams = queue.BreakerParams{QueueDepth:20, \
                MaxConcurrency:2, InitialCapacity:2}"
    });

    let mut clients: Vec<_> = (0..22).map(|_| spawn_get(&qp, "/")).collect();
    let mut releases = vec![held.next().await, held.next().await];
    qp.wait_for_log("20 requests queued", queued(20));
    assert_eq!(held.inside.load(Ordering::SeqCst), 2);

    // The 23rd finds 2 running and 20 waiting: refused at once.
    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(res.headers()["x-content-type-options"], "nosniff");
    assert_eq!(text(res).await, "pending request queue full\n");

    // A kubelet probe never takes a slot: it reaches the app beside the 2.
    let res = h1(qp.main, get("/probe", &[("k-kubelet-probe", "queue")])).await;
    assert_eq!(text(res).await, "probed");

    // Releasing lets every queued request through, two at a time.
    for _ in 0..20 {
        releases.remove(0).send(()).expect("request waiting");
        releases.push(held.next().await);
    }
    for release in releases {
        release.send(()).expect("request waiting");
    }
    for client in clients.drain(..) {
        let (status, body) = within("queued request", client).await.expect("client");
        assert_eq!((status, body.as_str()), (StatusCode::OK, "done"));
    }
    assert_eq!(held.most_inside.load(Ordering::SeqCst), 2);
    assert_eq!(held.app.seen().len(), 23);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_leaving_the_queue_frees_its_place() {
    let mut held = Held::start().await;
    let qp = debug_proxy(&held.app, "1", &[]);
    let _running = spawn_get(&qp, "/");
    let release = held.next().await;
    let mut waiting: Vec<_> = (0..10).map(|_| spawn_get(&qp, "/")).collect();
    qp.wait_for_log("10 requests queued", queued(10));
    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);

    // One client hangs up: its place is free again.
    waiting.pop().expect("a client").abort();
    qp.wait_for_log("a queued request gave up", |l| {
        l["message"] == "queued request gave up" && l["waiting"] == 9
    });
    waiting.push(spawn_get(&qp, "/"));
    qp.wait_for_logs("the newcomer queued", 2, queued(10));
    let refusals = qp
        .logs()
        .iter()
        .filter(|l| l["message"] == "pending request queue full")
        .count();
    assert_eq!(refusals, 1);

    release.send(()).expect("request waiting");
    tokio::spawn(async move {
        while let Some(release) = held.arrived.recv().await {
            let _ = release.send(());
        }
    });
    for client in waiting {
        let (status, _) = within("queued request", client).await.expect("client");
        assert_eq!(status, StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_request_gives_its_slot_back() {
    // `/stuck` never answers.
    let app = App::start(|req| async move {
        if req.uri().path() == "/stuck" {
            std::future::pending::<()>().await;
        }
        Response::new(full("ok"))
    })
    .await;
    let qp = debug_proxy(&app, "1", &[("REVISION_TIMEOUT_SECONDS", "1")]);
    // Both time out: the one holding the slot and the one queued behind it.
    let first = spawn_get(&qp, "/stuck");
    let second = spawn_get(&qp, "/stuck");
    for client in [first, second] {
        let (status, body) = within("timed-out request", client).await.expect("client");
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::GATEWAY_TIMEOUT, "request timeout")
        );
    }
    // The app never answered either, yet the slot is free.
    let (status, body) = within("third request", spawn_get(&qp, "/ok"))
        .await
        .expect("client");
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
}

/// An app echoing WebSocket messages on `/ws` and answering `plain`
/// anywhere else.
async fn websocket_app() -> App {
    App::start(|req| async move {
        if req.uri().path() != "/ws" {
            return Response::new(full("plain"));
        }
        websocket_echo_upgrade(req)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgraded_connection_holds_its_slot_until_it_closes() {
    let app = websocket_app().await;
    let qp = debug_proxy(&app, "1", &[]);
    let ws = websocket(qp.main).await;

    let plain = spawn_get(&qp, "/");
    qp.wait_for_log("a request queued behind the tunnel", queued(1));
    // Hanging up closes the tunnel both ways, and frees the slot.
    drop(ws);
    let (status, body) = within("request after the tunnel", plain)
        .await
        .expect("client");
    assert_eq!((status, body.as_str()), (StatusCode::OK, "plain"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_the_client_abandons_gives_its_slot_back() {
    use tokio::io::AsyncWriteExt;
    let app = websocket_app().await;
    let qp = debug_proxy(&app, "1", &[]);
    for _ in 0..3 {
        // Ask for a WebSocket and hang up without waiting for the answer.
        let mut stream = TcpStream::connect(qp.main).await.unwrap();
        stream
            .write_all(
                b"GET /ws HTTP/1.1\r\nHost: hello.example.com\r\nConnection: Upgrade\r\n\
                  Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                  Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            )
            .await
            .unwrap();
        drop(stream);
    }
    // Whatever point each was abandoned at, the one slot is free again.
    let (status, body) = within("a request after them", spawn_get(&qp, "/"))
        .await
        .expect("client");
    assert_eq!((status, body.as_str()), (StatusCode::OK, "plain"));
}
