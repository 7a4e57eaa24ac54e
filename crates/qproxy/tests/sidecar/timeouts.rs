//! The revision's three timeouts through the real binary, over HTTP/1.1 and
//! h2c, before and after the response starts, in both Knative generations.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt, stream};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use qproxy_test_support::*;
use tokio::sync::mpsc;
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

/// A response body sending `first`, then (after `then`, if any) `rest`,
/// or stalling forever when `then` is `None`. It holds `guard` until it is
/// finished or dropped.
fn streamed(
    first: &'static str,
    then: Option<Duration>,
    rest: &'static str,
    guard: DropGuard,
) -> TestBody {
    let head = stream::once(async move { Ok(Frame::data(Bytes::from_static(first.as_bytes()))) });
    let tail = stream::once(async move {
        let _guard = guard;
        match then {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
        Ok(Frame::data(Bytes::from_static(rest.as_bytes())))
    });
    BodyExt::boxed(StreamBody::new(head.chain(tail)))
}

/// The app of these tests. `/never` never answers; `/stall` and
/// `/stall-length` send `hello` and stall (the latter having promised 10
/// bytes); `/slow` sends `hello`, then `world` two seconds later. Each
/// request reports its path on `gone` when its handler or its body is
/// dropped unfinished, i.e. cancelled by qproxy.
async fn timeout_app() -> (App, mpsc::UnboundedReceiver<String>) {
    let (gone_tx, gone) = mpsc::unbounded_channel();
    let app = App::start(move |req| {
        let gone = gone_tx.clone();
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
                    let later = Some(Duration::from_secs(2));
                    Response::new(streamed("hello", later, "world", guard.disarm()))
                }
                _ => Response::new(full("ok")),
            }
        }
    })
    .await;
    (app, gone)
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
        let (app, mut gone) = timeout_app().await;
        let qp = QProxy::start(app.port(), &timeouts);
        for proto in BOTH {
            let res = send(proto, &qp, "/never").await;
            assert_gateway_timeout(&res);
            assert_eq!(text(res).await, "request timeout", "{timeouts:?} {proto:?}");
            // The request to the app was abandoned.
            let cancelled = within("the app's request cancelled", gone.recv()).await;
            assert_eq!(cancelled.as_deref(), Some("/never"));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn current_knative_logs_which_timeout_fired() {
    let (app, _gone) = timeout_app().await;
    let qp = QProxy::start(
        app.port(),
        &[CURRENT, ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "1")],
    );
    let res = send(Proto::H1, &qp, "/never").await;
    assert_gateway_timeout(&res);
    let line = qp.wait_for_log("the timeout warning", |l| {
        l["message"] == "Response start timeout: 1s"
    });
    assert_eq!(line["severity"], "WARNING");

    // Classic Knative logs nothing.
    let (app, _gone) = timeout_app().await;
    let mut qp = QProxy::start(app.port(), &[("REVISION_TIMEOUT_SECONDS", "1")]);
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
        let (app, mut gone) = timeout_app().await;
        let mut env = vec![("REVISION_IDLE_TIMEOUT_SECONDS", "1")];
        env.extend(generation);
        let qp = QProxy::start(app.port(), &env);
        for proto in BOTH {
            let (chunked, length) = tokio::join!(
                async { read_all(send(proto, &qp, "/stall").await).await },
                async { read_all(send(proto, &qp, "/stall-length").await).await },
            );
            let cut = ("hello".to_owned(), false);
            assert_eq!(chunked, cut, "{generation:?} {proto:?}");
            assert_eq!(length, cut, "{generation:?} {proto:?}");
            let mut cancelled = vec![
                within("cancelled", gone.recv()).await.unwrap(),
                within("cancelled", gone.recv()).await.unwrap(),
            ];
            cancelled.sort();
            assert_eq!(cancelled, ["/stall", "/stall-length"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn overall_timeout_after_the_response_started_depends_on_the_generation() {
    let (app, _gone) = timeout_app().await;
    let classic = QProxy::start(app.port(), &[("REVISION_TIMEOUT_SECONDS", "1")]);
    let current = QProxy::start(app.port(), &[("REVISION_TIMEOUT_SECONDS", "1"), CURRENT]);
    for proto in BOTH {
        // Classic lets the response run past the timeout.
        let res = send(proto, &classic, "/slow").await;
        assert_eq!(read_all(res).await, ("helloworld".to_owned(), true));
        // Current ends it.
        let res = send(proto, &current, "/slow").await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(read_all(res).await, ("hello".to_owned(), false));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn response_start_timeout_no_longer_applies_once_started() {
    let (app, _gone) = timeout_app().await;
    for generation in [None, Some(CURRENT)] {
        let mut env = vec![("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "1")];
        env.extend(generation);
        let qp = QProxy::start(app.port(), &env);
        for proto in BOTH {
            let res = send(proto, &qp, "/slow").await;
            assert_eq!(
                read_all(res).await,
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
