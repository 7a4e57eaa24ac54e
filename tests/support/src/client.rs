//! Clients: one request over HTTP/1.1 or h2c, raw bytes, WebSockets.

use std::net::SocketAddr;

use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

use crate::{TestBody, empty, within};

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
    let res = h1(main, get("/", &[KUBELET, QUEUE])).await;
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

/// A scrape of a metrics port: the body of `GET /metrics`.
pub async fn scrape(metrics: SocketAddr) -> String {
    text(h1(metrics, get("/metrics", &[])).await).await
}

/// Scrapes until `line` (a series and its value) shows; returns the whole
/// exposition.
pub async fn scrape_until(metrics: SocketAddr, line: &str) -> String {
    crate::until(&format!("{line:?} in a scrape"), async || {
        let text = scrape(metrics).await;
        if text.lines().any(|l| l == line) {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await
}

/// A metrics exposition without qproxy's own additions (the `qproxy_`
/// families, the autoscaler's view): what Knative's own exposition is
/// compared with.
pub fn without_additions(exposition: &str) -> String {
    exposition
        .lines()
        .filter(|l| {
            let name = l
                .strip_prefix("# HELP ")
                .or_else(|| l.strip_prefix("# TYPE "))
                .unwrap_or(l);
            !name.starts_with("qproxy_")
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The labels classic Knative gives every request metric of the default
/// revision ([`crate::knative_env`]).
pub const REVISION_LABELS: &str = "configuration_name=\"hello\",container_name=\"queue-proxy\",namespace_name=\"default\",pod_name=\"hello-00001-deployment-6d8d4bd5b-x7k2p\"";

/// One series of classic Knative's request metrics, as its Prometheus
/// exposition writes it: `name`, the response code, the route tag if any,
/// and `extra` labels (`,le="250"`) at the end.
pub fn classic_series(name: &str, code: u16, tag: Option<&str>, extra: &str) -> String {
    let tag = tag.map_or(String::new(), |t| format!(",route_tag=\"{t}\""));
    format!(
        "{name}{{{REVISION_LABELS},response_code=\"{code}\",response_code_class=\"{}xx\",revision_name=\"hello-00001\"{tag},service_name=\"hello\"{extra}}}",
        code / 100
    )
}

/// A known mix of requests to [`crate::App::varied`] through `main`, for
/// request metrics: four 200s (one slow), two 500s, one 200 with a route
/// tag, and probes of every kind, none of which counts.
pub async fn play_metrics_mix(main: SocketAddr) {
    for path in ["/ok", "/ok", "/ok", "/slow", "/fail", "/fail"] {
        h1(main, get(path, &[])).await;
    }
    h1(main, get("/ok", &[("Knative-Serving-Tag", "blue")])).await;
    for probe in [
        &[KUBELET, QUEUE][..],
        &[PROBE, ("K-Network-Hash", "h")],
        &[("K-Kubelet-Probe", "1")],
    ] {
        h1(main, get("/ok", probe)).await;
    }
}

/// The kubelet's user agent.
pub const KUBELET: (&str, &str) = ("User-Agent", "kube-probe/1.29");
/// The activator's health check user agent.
pub const ACTIVATOR: (&str, &str) = ("User-Agent", "Knative-Activator-Probe");
/// The autoscaler's health check user agent.
pub const AUTOSCALER: (&str, &str) = ("User-Agent", "Knative-Autoscaling-Probe");
/// The probe header of health checks.
pub const QUEUE: (&str, &str) = ("K-Network-Probe", "queue");
/// The probe header of network probes.
pub const PROBE: (&str, &str) = ("K-Network-Probe", "probe");

/// Every kind of health check and probe header, by name; the cases whose
/// name ends in `is proxied` are not health checks and reach the app.
pub const HEALTH_CHECKS: &[(&str, &[(&str, &str)])] = &[
    ("kubelet health check", &[KUBELET, QUEUE]),
    ("activator health check", &[ACTIVATOR, QUEUE]),
    ("autoscaler health check", &[AUTOSCALER, QUEUE]),
    ("kubelet without probe header", &[KUBELET]),
    (
        "kubelet with another probe header",
        &[KUBELET, ("K-Network-Probe", "bogus")],
    ),
    ("kubelet with a network probe header", &[KUBELET, PROBE]),
    (
        "activator with an empty probe header",
        &[ACTIVATOR, ("K-Network-Probe", "")],
    ),
    ("network probe", &[PROBE, ("K-Network-Hash", "5a3c0e1b9d")]),
    ("network probe without hash", &[PROBE]),
    (
        "network probe with an empty hash",
        &[PROBE, ("K-Network-Hash", "")],
    ),
    (
        "K-Kubelet-Probe alone is proxied",
        &[("K-Kubelet-Probe", "1"), QUEUE],
    ),
    ("queue header alone is proxied", &[QUEUE]),
];

/// What a client sees of a health check's answer, minus what differs by
/// design (`Date`).
#[derive(Debug, PartialEq, Eq)]
pub struct HealthAnswer {
    /// The status code.
    pub status: u16,
    /// The body, as text.
    pub body: String,
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// `Content-Length`.
    pub content_length: Option<String>,
    /// `X-Content-Type-Options`.
    pub nosniff: Option<String>,
    /// `K-Network-Hash`, echoed to a network probe.
    pub hash: Option<String>,
}

/// Sends a health check (or probe) with `headers` to `addr`.
pub async fn health_check(addr: SocketAddr, headers: &[(&str, &str)]) -> HealthAnswer {
    let res = h1(addr, get("/healthz", headers)).await;
    let header = |res: &Response<_>, name: &str| {
        res.headers()
            .get(name)
            .map(|v: &http::HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    HealthAnswer {
        status: res.status().as_u16(),
        content_type: header(&res, "content-type"),
        content_length: header(&res, "content-length"),
        nosniff: header(&res, "x-content-type-options"),
        hash: header(&res, "k-network-hash"),
        body: text(res).await,
    }
}
