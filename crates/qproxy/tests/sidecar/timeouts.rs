//! The revision's three timeouts through the real binary, over HTTP/1.1 and
//! h2c, before and after the response starts, in both Knative generations.

use bytes::Bytes;
use futures_util::{StreamExt, stream};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use qproxy_test_support::*;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

#[derive(Debug, Clone, Copy)]
enum Proto {
    H1,
    H2,
}

const BOTH: [Proto; 2] = [Proto::H1, Proto::H2];

/// What current Knative's environment adds to a classic one.
const CURRENT: (&str, &str) = ("OBSERVABILITY_CONFIG", "{}");

async fn send(proto: Proto, qp: &QProxy, path: &str) -> Response<Incoming> {
    match proto {
        Proto::H1 => h1(qp.main, get(path, &[])).await,
        Proto::H2 => {
            let uri = format!("http://hello.example.com{path}");
            h2(qp.main, get(&uri, &[])).await
        }
    }
}

/// Reads a body to its end; returns the bytes and whether it ended
/// properly (`false`: cut short, by a closed connection or a reset stream).
async fn read_all(res: Response<Incoming>) -> (String, bool) {
    let mut body = res.into_body();
    let mut data = Vec::new();
    let complete = within("body", async {
        loop {
            match body.frame().await {
                None => return true,
                Some(Err(_)) => return false,
                Some(Ok(frame)) => data.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d)),
            }
        }
    })
    .await;
    (String::from_utf8_lossy(&data).into_owned(), complete)
}

/// A response body sending `first`, then (once `then` is released, if
/// there is one) `rest`, or stalling forever when `then` is `None`. It
/// holds `guard` until it is finished or dropped.
fn streamed(
    first: &'static str,
    then: Option<oneshot::Receiver<()>>,
    rest: &'static str,
    guard: DropGuard,
) -> TestBody {
    let head = stream::once(async move { Ok(Frame::data(Bytes::from_static(first.as_bytes()))) });
    let tail = stream::once(async move {
        let _guard = guard;
        match then {
            Some(released) => {
                let _ = released.await;
            }
            None => std::future::pending().await,
        }
        Ok(Frame::data(Bytes::from_static(rest.as_bytes())))
    });
    BodyExt::boxed(StreamBody::new(head.chain(tail)))
}

/// The app of these tests, and what it tells them. `/never` never
/// answers; `/stall` and `/stall-length` send `hello` and stall (the
/// latter having promised 10 bytes); `/slow` sends `hello`, then `world`
/// once the test releases it. Each request reports its path on `gone`
/// when its handler or its body is dropped unfinished, i.e. cancelled by
/// qproxy.
struct TimeoutApp {
    app: App,
    gone: mpsc::UnboundedReceiver<String>,
    /// For each `/slow` request, as it arrives: what releases its `world`.
    slow: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
}

impl TimeoutApp {
    /// The release of the next `/slow` request to arrive.
    async fn slow_arrived(&mut self) -> oneshot::Sender<()> {
        within("a /slow request at the app", self.slow.recv())
            .await
            .unwrap()
    }
}

async fn timeout_app() -> TimeoutApp {
    let (gone_tx, gone) = mpsc::unbounded_channel();
    let (slow_tx, slow) = mpsc::unbounded_channel();
    let app = App::start(move |req| {
        let gone = gone_tx.clone();
        let slow = slow_tx.clone();
        async move {
            let path = req.uri().path().to_owned();
            let guard = DropGuard(Some(gone), path.clone());
            match path.as_str() {
                "/never" => {
                    let _guard = guard;
                    std::future::pending().await
                }
                "/stall" => Response::new(streamed("hello", None, "", guard)),
                "/stall-length" => Response::builder()
                    .header("content-length", "10")
                    .body(streamed("hello", None, "", guard))
                    .unwrap(),
                "/slow" => {
                    let (release, released) = oneshot::channel();
                    slow.send(release).unwrap();
                    Response::new(streamed("hello", Some(released), "world", guard.disarm()))
                }
                _ => Response::new(full("ok")),
            }
        }
    })
    .await;
    TimeoutApp { app, gone, slow }
}

/// Sends the path it guards on drop, unless disarmed.
struct DropGuard(Option<mpsc::UnboundedSender<String>>, String);

impl DropGuard {
    fn disarm(mut self) -> Self {
        self.0 = None;
        self
    }
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Some(gone) = &self.0 {
            let _ = gone.send(self.1.clone());
        }
    }
}

fn assert_gateway_timeout(res: &Response<Incoming>) {
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(res.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(res.headers()["content-length"], "15");
    assert!(!res.headers().contains_key("x-content-type-options"));
}

#[tokio::test(flavor = "multi_thread")]
async fn each_timeout_answers_504_before_the_response_starts() {
    for timeouts in [
        [("REVISION_TIMEOUT_SECONDS", "1"), CURRENT],
        [("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "1"), CURRENT],
        [
            ("REVISION_IDLE_TIMEOUT_SECONDS", "1"),
            ("SERVING_LOGGING_LEVEL", "info"),
        ],
    ] {
        let mut app = timeout_app().await;
        let qp = QProxy::start(app.app.port(), &timeouts);
        for proto in BOTH {
            let res = send(proto, &qp, "/never").await;
            assert_gateway_timeout(&res);
            assert_eq!(text(res).await, "request timeout", "{timeouts:?} {proto:?}");
            // The request to the app was abandoned.
            let cancelled = within("the app's request cancelled", app.gone.recv()).await;
            assert_eq!(cancelled.as_deref(), Some("/never"));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn current_knative_logs_which_timeout_fired() {
    let app = timeout_app().await;
    let qp = QProxy::start(
        app.app.port(),
        &[CURRENT, ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "1")],
    );
    let res = send(Proto::H1, &qp, "/never").await;
    assert_gateway_timeout(&res);
    let line = qp.wait_for_log("the timeout warning", |l| {
        l["message"] == "Response start timeout: 1s"
    });
    assert_eq!(line["severity"], "WARNING");

    // Classic Knative logs nothing.
    let app = timeout_app().await;
    let mut qp = QProxy::start(app.app.port(), &[("REVISION_TIMEOUT_SECONDS", "1")]);
    assert_gateway_timeout(&send(Proto::H1, &qp, "/never").await);
    let logs = qp.stop_and_collect_logs();
    assert!(
        !logs.iter().any(|l| l["severity"] == "WARNING"),
        "{logs:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_timeout_cuts_a_started_response_short() {
    for generation in [None, Some(CURRENT)] {
        let mut app = timeout_app().await;
        let mut env = vec![("REVISION_IDLE_TIMEOUT_SECONDS", "1")];
        env.extend(generation);
        let qp = QProxy::start(app.app.port(), &env);
        for proto in BOTH {
            let (chunked, length) = tokio::join!(
                async { read_all(send(proto, &qp, "/stall").await).await },
                async { read_all(send(proto, &qp, "/stall-length").await).await },
            );
            let cut = ("hello".to_owned(), false);
            assert_eq!(chunked, cut, "{generation:?} {proto:?}");
            assert_eq!(length, cut, "{generation:?} {proto:?}");
            let mut cancelled = vec![
                within("cancelled", app.gone.recv()).await.unwrap(),
                within("cancelled", app.gone.recv()).await.unwrap(),
            ];
            cancelled.sort();
            assert_eq!(cancelled, ["/stall", "/stall-length"]);
        }
    }
}

/// Sends `/slow` through `qp`; once its response has started, waits for
/// `qp`'s timeout to fire on a `/never` sent after it (so that the
/// `/slow` request's own timeout has passed too), then lets the app end
/// the response; what the client got of it.
async fn slow_past_the_timeout(app: &mut TimeoutApp, proto: Proto, qp: &QProxy) -> (String, bool) {
    let res = send(proto, qp, "/slow").await;
    assert_eq!(res.status(), StatusCode::OK);
    let release = app.slow_arrived().await;
    assert_gateway_timeout(&send(proto, qp, "/never").await);
    let _ = release.send(());
    read_all(res).await
}

#[tokio::test(flavor = "multi_thread")]
async fn overall_timeout_after_the_response_started_depends_on_the_generation() {
    let mut app = timeout_app().await;
    let classic = QProxy::start(app.app.port(), &[("REVISION_TIMEOUT_SECONDS", "1")]);
    let current = QProxy::start(
        app.app.port(),
        &[("REVISION_TIMEOUT_SECONDS", "1"), CURRENT],
    );
    for proto in BOTH {
        // Classic lets the response run past the timeout.
        assert_eq!(
            slow_past_the_timeout(&mut app, proto, &classic).await,
            ("helloworld".to_owned(), true),
            "{proto:?}"
        );
        // Current ends it, with `world` never released.
        let res = send(proto, &current, "/slow").await;
        assert_eq!(res.status(), StatusCode::OK);
        let _held = app.slow_arrived().await;
        assert_eq!(read_all(res).await, ("hello".to_owned(), false));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn response_start_timeout_no_longer_applies_once_started() {
    let mut app = timeout_app().await;
    for generation in [None, Some(CURRENT)] {
        let mut env = vec![("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "1")];
        env.extend(generation);
        let qp = QProxy::start(app.app.port(), &env);
        for proto in BOTH {
            assert_eq!(
                slow_past_the_timeout(&mut app, proto, &qp).await,
                ("helloworld".to_owned(), true),
                "{generation:?} {proto:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgraded_connection_closes_at_the_timeout() {
    let port = websocket_echo_app().await;
    let qp = QProxy::start(
        port,
        &[
            ("REVISION_TIMEOUT_SECONDS", "1"),
            ("SERVING_LOGGING_LEVEL", "debug"),
        ],
    );
    let mut ws = websocket(qp.main).await;
    // Nothing more is sent; the connection ends when the timeout fires.
    let end = within("the tunnel closed", ws.next()).await;
    assert!(
        !matches!(end, Some(Ok(Message::Text(_) | Message::Binary(_)))),
        "{end:?}"
    );
    qp.wait_for_log("the tunnel closed by the timeout", |l| {
        l["message"] == "upgraded connection closed by the request timeout"
    });
}
