//! Bad input and broken apps: clear errors, the right status, nothing lost.

use http::Response;
use qproxy_test_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

#[tokio::test(flavor = "multi_thread")]
async fn app_down_is_502_with_the_cause_logged_once() {
    let port = closed_port();
    let mut qp = QProxy::start(port, &[]);

    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), 502);
    assert_eq!(res.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(
        text(res).await,
        format!("dial tcp 127.0.0.1:{port}: connect: connection refused\n")
    );
    let res = h2(qp.main, get("http://hello/", &[])).await;
    assert_eq!(res.status(), 502);

    let line = qp.wait_for_log("the proxy error", |l| l["severity"] == "ERROR");
    assert!(
        line["message"]
            .as_str()
            .unwrap()
            .starts_with("error reverse proxying request")
    );
    assert_eq!(
        line["error"],
        format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
    );
    assert!(line.get("stacktrace").is_none());
    let errors = qp
        .stop_and_collect_logs()
        .iter()
        .filter(|l| l["severity"] == "ERROR")
        .count();
    assert_eq!(errors, 2, "one error line per failed request");
}

/// A request that arrives while the app is down (crashed, and about to be
/// restarted by the kubelet) never reached it: it waits for the app to
/// listen again, for a while, rather than fail.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_waits_for_an_app_that_comes_back() {
    let port = closed_port();
    let mut qp = QProxy::start(port, &[("SERVING_LOGGING_LEVEL", "debug")]);
    let main = qp.main;
    let get_one = tokio::spawn(async move { h1(main, get("/back", &[])).await });
    let h2_one = tokio::spawn(async move { h2(main, get("http://hello/back", &[])).await });
    qp.wait_for_log("a refused dial", |l| {
        l["message"] == "the app refused a connection; dialing again"
    });
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let _app = App::serve(listener, |req| async move {
        Response::new(full(format!("answer to {}", req.uri().path())))
    })
    .await;
    for res in [get_one, h2_one] {
        let res = within("the answer", res).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(text(res).await, "answer to /back");
    }
    assert!(
        !qp.stop_and_collect_logs()
            .iter()
            .any(|l| l["severity"] == "ERROR"),
        "no request failed"
    );
}

/// An app that answers at once and echoes the request body as it comes;
/// the client's body breaks off (its write side shut) after five of ten
/// bytes. The app would wait for the rest forever: qproxy closes the
/// connection to it, and the client's connection ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_body_cut_while_the_app_streams_its_answer_ends_both() {
    let app = App::start(|req| async move {
        use http_body_util::BodyExt;
        Response::new(req.into_body().map_err(Into::into).boxed())
    })
    .await;
    let qp = QProxy::start(app.port(), &[]);
    let mut client = TcpStream::connect(qp.main).await.unwrap();
    client
        .write_all(b"POST /echo HTTP/1.1\r\nHost: hello\r\nContent-Length: 10\r\n\r\nhello")
        .await
        .unwrap();
    // The app's answer starts, echoing what it has.
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.windows(5).any(|w| w == b"hello") {
        let n = within("the echo", client.read(&mut buf)).await.unwrap();
        assert!(
            n > 0,
            "closed before the echo: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 200 OK\r\n"));
    client.shutdown().await.unwrap();
    // The connection ends: the response cannot.
    loop {
        match within("the connection's end", client.read(&mut buf)).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    assert!(qp_alive(&qp).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn app_resetting_the_connection_is_502() {
    let port = raw_app(|mut s| async move {
        read_request(&mut s).await;
        // Linger zero: closing sends a reset instead of a FIN.
        let _ = socket2::SockRef::from(&s).set_linger(Some(std::time::Duration::ZERO));
    })
    .await;
    let qp = QProxy::start(port, &[]);
    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), 502);
    let body = text(res).await;
    assert!(
        body.starts_with("read tcp 127.0.0.1:")
            && body.ends_with(&format!(
                "->127.0.0.1:{port}: read: connection reset by peer\n"
            )),
        "{body}"
    );
    // And the proxy keeps serving.
    assert!(qp_alive(&qp).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn app_closing_without_answer_is_502_eof() {
    let port = raw_app(|mut s| async move { read_request(&mut s).await }).await;
    let qp = QProxy::start(port, &[]);
    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), 502);
    assert_eq!(text(res).await, "EOF\n");
}

/// An app that drops the connection instead of answering the requests
/// `drop` picks, answers the others, and counts both.
async fn dropping_app(
    drop: impl Fn(&str, usize) -> bool + Send + Sync + 'static,
) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let drop = Arc::new(drop);
    let port = raw_app(move |mut s| {
        let log = log.clone();
        let drop = drop.clone();
        async move {
            while let Some(head) = read_head(&mut s).await {
                let line = head.lines().next().unwrap_or_default().to_owned();
                let n = {
                    let mut seen = log.lock().unwrap();
                    seen.push(line.clone());
                    seen.len()
                };
                if drop(&line, n) {
                    return;
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            }
        }
    })
    .await;
    (port, seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idempotent_request_dropped_on_a_reused_connection_is_sent_again() {
    // The first request is answered, so its connection goes back to the
    // pool; the second, sent on that connection, is dropped.
    let (port, seen) = dropping_app(|_, n| n == 2).await;
    let qp = QProxy::start(port, &[]);
    let res = h1(qp.main, get("/first", &[])).await;
    assert_eq!(text(res).await, "ok");
    let res = h1(qp.main, get("/again", &[])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(text(res).await, "ok");
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "GET /first HTTP/1.1",
            "GET /again HTTP/1.1",
            "GET /again HTTP/1.1"
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_dropped_on_a_fresh_connection_is_not_sent_again() {
    // As in Go's transport: the app has seen it on a connection dialled for
    // it, so it is not a stale pooled connection's doing.
    let (port, seen) = dropping_app(|_, n| n == 1).await;
    let qp = QProxy::start(port, &[]);
    let res = h1(qp.main, get("/once", &[])).await;
    assert_eq!(res.status(), 502);
    assert_eq!(text(res).await, "EOF\n");
    assert_eq!(*seen.lock().unwrap(), ["GET /once HTTP/1.1"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_request_with_a_body_is_not_sent_again() {
    let (port, seen) = dropping_app(|line, _| line.starts_with("POST")).await;
    let qp = QProxy::start(port, &[]);
    let req = http::Request::post("/once").body(full("payload")).unwrap();
    let res = h1(qp.main, req).await;
    // Closed with the body unread, the app's socket resets: a 502 either way.
    assert_eq!(res.status(), 502);
    assert_eq!(*seen.lock().unwrap(), ["POST /once HTTP/1.1"]);
}

async fn qp_alive(qp: &QProxy) -> bool {
    TcpStream::connect(qp.main).await.is_ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_request_is_400_and_others_are_served() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);

    let mut bad = TcpStream::connect(qp.main).await.unwrap();
    bad.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nthis is not a header\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    within("the 400", bad.read_to_end(&mut answer))
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );

    let mut huge = TcpStream::connect(qp.main).await.unwrap();
    let big_header = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(2 << 20)
    );
    let _ = huge.write_all(big_header.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = within("the 431", huge.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{answer}"
    );

    // The next request, on a new connection, is served.
    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        app.seen().len(),
        1,
        "malformed requests never reach the app"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn host_rules_of_go_servers() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);

    let answer = raw_exchange(qp.main, b"GET / HTTP/1.1\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request: missing required Host header\r\n"),
        "{answer}"
    );
    assert!(answer.contains("\r\nConnection: close\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n400 Bad Request: missing required Host header"));

    let answer = raw_exchange(qp.main, b"GET / HTTP/1.1\r\nHost: bad host\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request: malformed Host header\r\n"),
        "{answer}"
    );

    // HTTP/1.0 needs no Host.
    let answer = raw_exchange(qp.main, b"GET / HTTP/1.0\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
    assert_eq!(
        app.seen().len(),
        1,
        "only the HTTP/1.0 request reaches the app"
    );
    // As Go's transport writes it: the app's address stands in for the host.
    assert_eq!(
        app.only().headers["host"],
        format!("127.0.0.1:{}", app.port()).as_str()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn client_gone_cancels_the_upstream_request_quietly() {
    // The app takes the request and waits to see its connection closed.
    let app = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = app.local_addr().unwrap().port();
    let (got_tx, got_rx) = oneshot::channel();
    let (closed_tx, closed_rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = app.accept().await.unwrap();
        let mut buf = vec![0; 4096];
        let _ = s.read(&mut buf).await.unwrap();
        let _ = got_tx.send(());
        // Read until the proxy closes its side.
        while s.read(&mut buf).await.map(|n| n > 0).unwrap_or(false) {}
        let _ = closed_tx.send(());
    });
    let mut qp = QProxy::start(port, &[]);

    let mut client = TcpStream::connect(qp.main).await.unwrap();
    client
        .write_all(b"GET /slow HTTP/1.1\r\nHost: hello\r\n\r\n")
        .await
        .unwrap();
    within("the request to reach the app", got_rx)
        .await
        .unwrap();
    drop(client);
    within("the upstream connection to close", closed_rx)
        .await
        .unwrap();
    let logs = qp.stop_and_collect_logs();
    assert!(logs.iter().all(|l| l["severity"] != "ERROR"), "{logs:#?}");
}

#[test]
fn bad_environment_exits_1_naming_the_variable() {
    let mut env = knative_env(8080);
    env.retain(|(k, _)| k != "SERVING_POD");
    let out = run_to_exit(&env);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr, "qproxy: SERVING_POD is required but not set\n");

    for (name, value) in [
        ("CONTAINER_CONCURRENCY", "lots"),
        ("QUEUE_SERVING_PORT", "99999"),
        ("ENABLE_HTTP_FULL_DUPLEX", "maybe"),
        ("QPROXY_WORKERS", "0"),
        ("SERVING_READINESS_PROBE", "{\"httpGet\":"),
        (
            "OBSERVABILITY_CONFIG",
            "{\"tracing\":{\"protocol\":\"smoke-signals\"}}",
        ),
    ] {
        let mut env = knative_env(8080);
        env.retain(|(k, _)| k != name);
        env.push((name.to_owned(), value.to_owned()));
        let out = run_to_exit(&env);
        assert_eq!(out.status.code(), Some(1), "{name}={value}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!("qproxy: {name}={value:?} is invalid: ")),
            "{stderr}"
        );
        assert!(out.stdout.is_empty(), "nothing served, nothing logged");
    }
}

#[test]
fn port_in_use_is_a_clear_startup_error() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut env = knative_env(8080);
    env.retain(|(k, _)| k != "QPROXY_ADMIN_PORT");
    env.push(("QPROXY_ADMIN_PORT".to_owned(), port.clone()));
    let out = run_to_exit(&env);
    assert_eq!(out.status.code(), Some(1));
    // Logging is up by then: the failure is one error line in the log.
    let stderr = String::from_utf8(out.stderr).unwrap();
    let errors: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &serde_json::Value| l["severity"] == "ERROR")
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert_eq!(
        errors[0]["message"],
        "Failed to bring up queue-proxy, shutting down."
    );
    let error = errors[0]["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!(
            "cannot listen on port {port} for the admin server: "
        )),
        "{error}"
    );
    assert!(error.contains("in use"), "{error}");
}

/// An app that records every byte each connection brings, answers a `GET`
/// at once and a chunked request once its last chunk has come.
async fn recording_app() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
    use std::sync::{Arc, Mutex};
    let conns = Arc::new(Mutex::new(Vec::new()));
    let log = conns.clone();
    let port = raw_app(move |mut s| {
        let log = log.clone();
        async move {
            let at = {
                let mut conns = log.lock().unwrap();
                conns.push(Vec::new());
                conns.len() - 1
            };
            let mut pending = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = s.read(&mut buf).await {
                log.lock().unwrap()[at].extend_from_slice(&buf[..n]);
                pending.extend_from_slice(&buf[..n]);
                let whole = pending.starts_with(b"GET ") && pending.ends_with(b"\r\n\r\n")
                    || pending.ends_with(b"\r\n0\r\n\r\n");
                if whole {
                    pending.clear();
                    let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                    if s.write_all(ok).await.is_err() {
                        return;
                    }
                }
            }
        }
    })
    .await;
    (port, conns)
}

/// A chunked request whose framing breaks before any of its data, sent
/// when a connection to the app waits in the pool: the app sees its head
/// at most, never a body's end, and the client gets Go's `502`, not the
/// app's answer to an empty body it was never sent. (The first write of
/// such a request fails with nothing written; a request whose body failed
/// must not go on to another connection as if unsent.)
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_chunked_body_never_reaches_a_pooled_connection_as_ended() {
    let (port, conns) = recording_app().await;
    let qp = QProxy::start(port, &[]);
    for size in ["zz", "ffffffffffffffffffff"] {
        // A request served first leaves its connection in the pool.
        let res = h1(qp.main, get("/warm", &[])).await;
        assert_eq!(text(res).await, "ok");
        let before = conns.lock().unwrap().iter().map(Vec::len).sum::<usize>();
        let request = format!(
            "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\nhello\r\n0\r\n\r\n"
        );
        let answer = raw_exchange(qp.main, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 502 "), "{size}: {answer}");
        // Where a next request would start is unknown: the connection ends.
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n"),
            "{size}: {answer}"
        );
        let seen = conns.lock().unwrap().concat();
        let after = String::from_utf8_lossy(&seen[before..]).into_owned();
        assert!(
            !after.contains("\r\n0\r\n\r\n"),
            "{size}: the app saw a body's end: {after:?}"
        );
    }
    assert!(qp_alive(&qp).await);
}

/// A transfer coding Go's server does not read (a list, or the field
/// twice) is refused as Go refuses it, `501`, and reaches the app not at
/// all: a front proxy that reads the head as Go does would not agree with
/// hyper's reading on where the request ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_transfer_coding_go_does_not_read_is_501_and_never_reaches_the_app() {
    let (port, conns) = recording_app().await;
    let qp = QProxy::start(port, &[]);
    for coding in [
        "Transfer-Encoding: identity, chunked",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
    ] {
        let request = format!(
            "POST /a HTTP/1.1\r\nHost: x\r\n{coding}\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
        );
        let answer = raw_exchange(qp.main, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 501 "), "{coding}: {answer}");
        assert!(
            answer.ends_with("Unsupported transfer encoding"),
            "{answer}"
        );
    }
    assert!(
        conns.lock().unwrap().concat().is_empty(),
        "the app saw nothing"
    );
}
