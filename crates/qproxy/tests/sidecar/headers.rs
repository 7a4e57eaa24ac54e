//! The incumbent's header semantics, through the real binary to a real app.

use std::net::{Ipv6Addr, SocketAddr};

use http::header::{HOST, USER_AGENT};
use http::{Request, Version};
use qproxy_test_support::*;

/// Sends `req` over HTTP/1.1 through a fresh qproxy to a hello app and
/// returns what the app saw.
async fn seen_through(req: Request<TestBody>) -> Seen {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    let res = h1(qp.main, req).await;
    assert_eq!(res.status(), 200);
    app.only()
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_request_keeps_host_and_gains_forwarded_for() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);

    let res = h1(
        qp.main,
        get("/some/path?x=1", &[("host", "hello.default.example.com")]),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(text(res).await, "Hello World!\n");

    let seen = app.only();
    assert_eq!(seen.version, Version::HTTP_11);
    assert_eq!(seen.uri, "/some/path?x=1");
    assert_eq!(seen.headers[HOST], "hello.default.example.com");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert!(seen.headers.get("forwarded").is_none());
    // No User-Agent of our own when the client sent none.
    assert!(seen.headers.get(USER_AGENT).is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn original_host_becomes_host_and_is_removed() {
    let seen = seen_through(get(
        "/",
        &[
            ("host", "activator-service.knative-serving"),
            ("k-original-host", "hello.default.example.com"),
        ],
    ))
    .await;
    assert_eq!(seen.headers[HOST], "hello.default.example.com");
    assert!(seen.headers.get("k-original-host").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn original_host_over_h2c_sets_the_authority() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);

    let res = h2(
        qp.main,
        get(
            "http://activator-service/h2",
            &[("k-original-host", "hello.default.example.com")],
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    let seen = app.only();
    assert_eq!(seen.version, Version::HTTP_2);
    assert_eq!(
        seen.uri.authority().map(|a| a.as_str()),
        Some("hello.default.example.com")
    );
    assert_eq!(seen.uri.path(), "/h2");
    assert!(seen.headers.get("k-original-host").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn kubelet_probes_keep_their_host() {
    // K-Kubelet-Probe without the kube-probe user agent passes the health
    // checks and reaches the app, but its host is not rewritten.
    let seen = seen_through(get(
        "/",
        &[
            ("host", "original"),
            ("k-original-host", "rewritten"),
            ("k-kubelet-probe", "queue"),
        ],
    ))
    .await;
    assert_eq!(seen.headers[HOST], "original");
    assert_eq!(seen.headers["k-original-host"], "rewritten");
}

#[tokio::test(flavor = "multi_thread")]
async fn activator_routing_headers_are_removed() {
    let seen = seen_through(get(
        "/",
        &[
            ("knative-serving-revision", "hello-00001"),
            ("knative-serving-namespace", "default"),
            ("k-proxy-request", "activator"),
        ],
    ))
    .await;
    assert!(seen.headers.get("knative-serving-revision").is_none());
    assert!(seen.headers.get("knative-serving-namespace").is_none());
    // Everything else passes.
    assert_eq!(seen.headers["k-proxy-request"], "activator");
}

#[tokio::test(flavor = "multi_thread")]
async fn forwarded_for_is_appended_to_prior_hops() {
    let mut req = get("/", &[]);
    req.headers_mut()
        .append("x-forwarded-for", "203.0.113.7".parse().unwrap());
    req.headers_mut()
        .append("x-forwarded-for", "198.51.100.2, 10.0.0.9".parse().unwrap());
    let seen = seen_through(req).await;
    assert_eq!(
        seen.headers
            .get_all("x-forwarded-for")
            .iter()
            .collect::<Vec<_>>(),
        ["203.0.113.7, 198.51.100.2, 10.0.0.9, 127.0.0.1"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ipv6_clients_are_reached_and_named() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    if !qp.dual_stack {
        eprintln!("skipped: no IPv6 here, qproxy bound IPv4 only");
        return;
    }
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, qp.main.port()));
    let res = h1(v6, get("/", &[])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(app.only().headers["x-forwarded-for"], "::1");
}

#[tokio::test(flavor = "multi_thread")]
async fn forwarded_is_synthesised_from_x_forwarded() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);

    h1(
        qp.main,
        get(
            "/",
            &[
                ("x-forwarded-for", "203.0.113.7, 2001:db8:cafe::17"),
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "example.com"),
            ],
        ),
    )
    .await;
    h1(
        qp.main,
        get(
            "/",
            &[
                ("forwarded", "for=192.0.2.1"),
                ("x-forwarded-for", "203.0.113.7"),
            ],
        ),
    )
    .await;
    let seen = app.seen();
    assert_eq!(
        seen[0].headers["forwarded"],
        r#"for=203.0.113.7;host=example.com;proto=https, for="[2001:db8:cafe::17]""#
    );
    // The shim is built before qproxy appends its client to X-Forwarded-For.
    assert_eq!(
        seen[0].headers["x-forwarded-for"],
        "203.0.113.7, 2001:db8:cafe::17, 127.0.0.1"
    );
    // An existing Forwarded header is left as it is.
    assert_eq!(seen[1].headers["forwarded"], "for=192.0.2.1");
}

#[tokio::test(flavor = "multi_thread")]
async fn hop_by_hop_request_headers_are_dropped() {
    let req = Request::post("/")
        .header("connection", "keep-alive, x-drop-me")
        .header("x-drop-me", "1")
        .header("keep-alive", "timeout=5")
        .header("proxy-connection", "keep-alive")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("te", "trailers, deflate")
        .header("upgrade", "websocket")
        .header("x-kept", "yes")
        .body(full("body"))
        .unwrap();
    let seen = seen_through(req).await;
    for gone in [
        "x-drop-me",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "upgrade",
    ] {
        assert!(seen.headers.get(gone).is_none(), "{gone} reached the app");
    }
    assert_eq!(seen.headers["te"], "trailers");
    assert_eq!(seen.headers["x-kept"], "yes");
}

#[tokio::test(flavor = "multi_thread")]
async fn hop_by_hop_response_headers_are_dropped() {
    let port = canned_app(
        b"HTTP/1.1 200 OK\r\n\
          Connection: keep-alive, X-App-Hop\r\n\
          X-App-Hop: 1\r\n\
          Keep-Alive: timeout=5\r\n\
          Proxy-Connection: keep-alive\r\n\
          Proxy-Authenticate: Basic\r\n\
          X-Kept: yes\r\n\
          Content-Length: 2\r\n\r\nok",
    )
    .await;
    let qp = QProxy::start(port, &[]);
    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), 200);
    for gone in ["x-app-hop", "keep-alive", "proxy-connection"] {
        assert!(
            res.headers().get(gone).is_none(),
            "{gone} reached the client"
        );
    }
    assert_eq!(res.headers()["x-kept"], "yes");
    assert_eq!(text(res).await, "ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn options_star_is_answered_without_the_app() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    let answer = raw_exchange(qp.main, b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.contains("\r\nContent-Length: 0\r\n"), "{answer}");
    assert!(app.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn http1_header_names_are_canonical_both_ways() {
    // An app that shows the request head it received, byte for byte.
    let port = raw_app(|mut s| async move {
        use tokio::io::AsyncWriteExt;
        let Some(head) = read_head(&mut s).await else {
            return;
        };
        let reply = format!(
            "HTTP/1.1 200 OK\r\nx-app-header: 1\r\ncontent-length: {}\r\n\r\n",
            head.len()
        );
        let _ = s.write_all(reply.as_bytes()).await;
        let _ = s.write_all(head.as_bytes()).await;
    })
    .await;
    let qp = QProxy::start(port, &[]);
    let answer = raw_exchange(
        qp.main,
        b"GET / HTTP/1.1\r\nhost: h\r\nx-custom-thing: v\r\n\r\n",
    )
    .await;
    assert!(answer.contains("\r\nX-App-Header: 1\r\n"), "{answer}");
    assert!(answer.contains("\r\nContent-Length: "), "{answer}");
    let (_, seen) = answer.split_once("\r\n\r\n").unwrap();
    assert!(seen.contains("\r\nHost: h\r\n"), "{seen}");
    assert!(seen.contains("\r\nX-Custom-Thing: v\r\n"), "{seen}");
    assert!(
        seen.contains("\r\nX-Forwarded-For: 127.0.0.1\r\n"),
        "{seen}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_apps_reason_phrase_is_replaced_by_the_standard_one() {
    let port = canned_app(b"HTTP/1.1 200 Everything Is Fine\r\nContent-Length: 2\r\n\r\nok").await;
    let qp = QProxy::start(port, &[]);
    let answer = raw_exchange(qp.main, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn hop_by_hop_response_headers_are_dropped_over_h2c_too() {
    let app = App::start(|_| async {
        http::Response::builder()
            .header("proxy-authenticate", "Basic")
            .header("x-kept", "yes")
            .body(full("ok"))
            .unwrap()
    })
    .await;
    let qp = QProxy::start(app.port(), &[]);
    let res = h2(qp.main, get("http://hello.example.com/", &[])).await;
    assert!(res.headers().get("proxy-authenticate").is_none());
    assert_eq!(res.headers()["x-kept"], "yes");
}
