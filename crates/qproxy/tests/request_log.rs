//! Request logs: one line per request on stdout, rendered from the
//! operator's Go template, compared with what Knative's Go queue-proxy
//! v0.42.2 writes for the same requests.

mod common;

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use common::oracle::GoQueueProxy;
use common::*;
use http::{Response, StatusCode};
use http_body_util::BodyExt;

/// Everything a template can see that does not depend on timing or on
/// the client's port.
const TEMPLATE: &str = concat!(
    r#"RL {{.Request.Method}} {{js .Request.RequestURI}} {{.Request.ContentLength}} "#,
    r#"{{.Response.Code}} {{.Response.Size}} ua={{js .Request.UserAgent}} "#,
    r#"ref={{js .Request.Referer}} {{.Request.Proto}} {{.Request.ProtoMajor}}.{{.Request.ProtoMinor}} "#,
    r#"tid={{index .Request.Header "X-B3-Traceid"}} host={{.Request.Host}} "#,
    r#"te={{.Request.TransferEncoding}} close={{.Request.Close}} "#,
    r#"custom={{.Request.Header.Get "x-custom"}} nohost={{index .Request.Header "Host"}} "#,
    r#"path={{.Request.URL.Path}} q={{.Request.URL.RawQuery}} url={{.Request.URL}} "#,
    r#"{{.Revision}} {{printf "%T" .Response.Latency}} "#,
    r#"{{if lt .Response.Latency 5.0}}quick{{end}} "#,
    r#"ip={{with $a := .Request.RemoteAddr}}{{slice $a 0 10}}{{end}}"#,
);

async fn app() -> App {
    App::start(|req| async move {
        let path = req.uri().path().to_owned();
        let body = req.into_body().collect().await.map(|b| b.to_bytes());
        let mut res = Response::new(full(match (&*path, body) {
            ("/echo", Ok(b)) => b,
            _ => Bytes::from_static(b"answer"),
        }));
        if path == "/fail" {
            *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        }
        res
    })
    .await
}

fn env(app: &App, template: &str, probes: bool) -> Vec<(String, String)> {
    let mut env = knative_env(app.port());
    for (k, v) in [
        ("SERVING_ENABLE_REQUEST_LOG", "true"),
        ("SERVING_REQUEST_LOG_TEMPLATE", template),
        (
            "SERVING_ENABLE_PROBE_REQUEST_LOG",
            if probes { "true" } else { "false" },
        ),
    ] {
        env.retain(|(name, _)| name != k);
        env.push((k.to_owned(), v.to_owned()));
    }
    env
}

/// Requests of every shape the template shows a difference for, and
/// probes, which are logged only when probe logging is on.
async fn play(main: SocketAddr) {
    let traced = get(
        "/ok?x=1&y=%3C2%3E",
        &[
            ("User-Agent", "tester \"q\" <b>"),
            ("Referer", "http://ref/?a=b"),
            ("X-B3-TraceId", "abc"),
            ("X-Custom", "v1"),
        ],
    );
    h1(main, traced).await.collect().await.unwrap();
    let mut post = get("/echo", &[]);
    *post.method_mut() = http::Method::POST;
    *post.body_mut() = full("hello");
    h1(main, post).await.collect().await.unwrap();
    let mut head = get("/ok", &[]);
    *head.method_mut() = http::Method::HEAD;
    h1(main, head).await;
    h1(main, get("/fail", &[])).await.collect().await.unwrap();
    h2(main, get("/h2/a%20b?c", &[]))
        .await
        .collect()
        .await
        .unwrap();
    for raw in [
        &b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n"[..],
        b"GET /old HTTP/1.0\r\nHost: y\r\n\r\n",
        b"GET http://abs.example/abs?z=1 HTTP/1.1\r\nHost: abs.example\r\nConnection: close\r\n\r\n",
    ] {
        raw_exchange(main, raw).await;
    }
    for probe in [
        &[
            ("User-Agent", "kube-probe/1.30"),
            ("K-Network-Probe", "queue"),
        ][..],
        &[("K-Network-Probe", "probe"), ("K-Network-Hash", "h")],
    ] {
        h1(main, get("/", probe)).await.collect().await.unwrap();
    }
}

/// The lines starting with `prefix` among `lines`, sorted: each line is
/// written once its request is done, which may be after the client has
/// its response.
fn lines_with(prefix: &str, lines: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut lines: Vec<String> = lines
        .into_iter()
        .filter(|l| l.starts_with(prefix))
        .collect();
    lines.sort();
    lines
}

/// What qproxy wrote on stdout that is not a JSON log line.
fn raw_lines(qp: &QProxy) -> Vec<String> {
    qp.logs_on("stdout")
        .into_iter()
        .filter_map(|l| l["_raw"].as_str().map(str::to_owned))
        .collect()
}

/// Waits until `lines` has `n` request log lines (`RL ...`).
async fn wait_lines(what: &str, n: usize, lines: impl Fn() -> Vec<String>) -> Vec<String> {
    wait_prefixed(what, n, "RL ", lines).await
}

/// Waits until `lines` has `n` lines starting with `prefix`; returns them
/// sorted.
async fn wait_prefixed(
    what: &str,
    n: usize,
    prefix: &str,
    lines: impl Fn() -> Vec<String>,
) -> Vec<String> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let got = lines_with(prefix, lines());
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {n} lines: {got:#?}",
            got.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lines_match_the_go_queue_proxy() {
    let app = app().await;
    for probes in [false, true] {
        let env = env(&app, TEMPLATE, probes);
        let expected = play_count(probes);

        let go = GoQueueProxy::start(&env).await;
        play(go.main).await;
        let want = wait_lines("Go", expected, || go.output()).await;
        drop(go);

        let qp = QProxy::start_env(&env);
        play(qp.main).await;
        let got = wait_lines("qproxy", expected, || raw_lines(&qp)).await;
        assert_eq!(got, want, "probe logging {probes}");
        assert_eq!(got.len(), expected);
    }
}

fn play_count(probes: bool) -> usize {
    // Eight requests, and two probes when they are logged.
    if probes { 10 } else { 8 }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_template_writes_json_knative_can_parse() {
    let app = app().await;
    let template = qproxy::config::DEFAULT_REQUEST_LOG_TEMPLATE.replace(
        r#""{{.TraceID}}""#,
        r#""{{index .Request.Header "X-B3-Traceid"}}""#,
    );
    let qp = QProxy::start_env(&env(&app, &template, false));
    h1(
        qp.main,
        get(
            "/ok?a=%3Cb%3E",
            &[("User-Agent", "ua"), ("X-B3-TraceId", "t1")],
        ),
    )
    .await
    .collect()
    .await
    .unwrap();
    let line = qp.wait_for_log("the request log line", |l| l.get("httpRequest").is_some());
    let r = &line["httpRequest"];
    assert_eq!(r["requestMethod"], "GET");
    assert_eq!(r["requestUrl"], "/ok?a=%3Cb%3E");
    assert_eq!(r["status"], 200);
    assert_eq!(r["responseSize"], "6");
    assert_eq!(r["userAgent"], "ua");
    assert_eq!(
        r["remoteIp"].as_str().map(|a| a.starts_with("127.0.0.1:")),
        Some(true)
    );
    assert_eq!(r["protocol"], "HTTP/1.1");
    assert_eq!(line["traceId"], "[t1]");
    let latency = r["latency"].as_str().unwrap();
    let seconds: f64 = latency.strip_suffix('s').unwrap().parse().unwrap();
    assert!(seconds > 0.0 && seconds < 5.0, "{latency}");
}

#[tokio::test(flavor = "multi_thread")]
async fn current_knative_gives_the_trace_id_and_a_failing_template_its_error_line() {
    let app = app().await;
    let observability = serde_json::json!({
        "enableRequestLog": true,
        "requestLogTemplate": "RL {{.TraceID}} {{.Response.Code}}{{if .Request.Nope}}x{{end}}",
    });
    let mut env = knative_env(app.port());
    env.push(("OBSERVABILITY_CONFIG".to_owned(), observability.to_string()));
    let qp = QProxy::start_env(&env);
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    h1(qp.main, get("/ok", &[("traceparent", traceparent)]))
        .await
        .collect()
        .await
        .unwrap();
    let line = qp.wait_for_log("the error line", |l| {
        l["_raw"].as_str().is_some_and(|l| l.starts_with("Invalid"))
    });
    let line = line["_raw"].as_str().unwrap();
    assert!(
        line.starts_with(
            "Invalid request log template: method: GET, response code: 200, latency: "
        ),
        "{line}"
    );
    assert!(line.ends_with(", url: /ok"), "{line}");
    // Current Knative writes only the error line, not what came before.
    assert!(!raw_lines(&qp).iter().any(|l| l.starts_with("RL ")));

    let observability = serde_json::json!({
        "enableRequestLog": true,
        "requestLogTemplate": "RL {{.TraceID}}|{{.Response.Code}}",
    });
    let mut env = knative_env(app.port());
    env.push(("OBSERVABILITY_CONFIG".to_owned(), observability.to_string()));
    let qp = QProxy::start_env(&env);
    h1(qp.main, get("/ok", &[("traceparent", traceparent)]))
        .await
        .collect()
        .await
        .unwrap();
    h1(qp.main, get("/ok", &[("X-B3-TraceId", "b3id")]))
        .await
        .collect()
        .await
        .unwrap();
    h1(qp.main, get("/ok", &[])).await.collect().await.unwrap();
    let got = wait_lines("current", 3, || raw_lines(&qp)).await;
    assert_eq!(
        got,
        [
            "RL 0af7651916cd43dd8448eb211c80319c|200",
            "RL b3id|200",
            "RL |200"
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_that_does_not_parse_stops_the_start_naming_the_variable() {
    let env = env(&App::hello().await, "{{.Request.Method", false);
    let out = run_to_exit(&env);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr
            .starts_with("qproxy: SERVING_REQUEST_LOG_TEMPLATE=\"{{.Request.Method\" is invalid: "),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrades_and_cut_responses_are_logged_as_go_logs_them() {
    let env = env(
        &App::hello().await,
        "RL {{.Request.Method}} {{.Request.RequestURI}} {{.Response.Code}} {{.Response.Size}}",
        false,
    );
    let mut env = env;
    let port = upgrade_and_abort_app().await;
    env.retain(|(k, _)| k != "USER_PORT");
    env.push(("USER_PORT".to_owned(), port.to_string()));

    let go = GoQueueProxy::start(&env).await;
    play_upgrade_and_abort(go.main).await;
    let want = wait_lines("Go", 2, || go.output()).await;
    drop(go);

    let qp = QProxy::start_env(&env);
    play_upgrade_and_abort(qp.main).await;
    let got = wait_lines("qproxy", 2, || raw_lines(&qp)).await;
    // The upgrade is a 200 with nothing written through the handlers, the
    // cut response a 500 with no size, as Go's aborted handler records it.
    assert_eq!(got, ["RL GET /cut 500 0", "RL GET /ws 200 0"]);
    assert_eq!(got, want);
}

/// A line of Knative's default template with what depends on timing or on
/// the client's port set aside: `latency` checked to be seconds, `remoteIp`
/// cut to its address.
fn comparable(line: &str) -> serde_json::Value {
    let mut v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let r = &mut v["httpRequest"];
    let latency = r["latency"].as_str().unwrap_or_default().to_owned();
    let seconds: f64 = latency
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1.0);
    assert!((0.0..5.0).contains(&seconds), "latency {latency:?}");
    r["latency"] = "…s".into();
    let remote = r["remoteIp"].as_str().unwrap_or_default().to_owned();
    r["remoteIp"] = remote
        .rsplit_once(':')
        .map_or(remote.clone(), |(ip, _)| ip.to_owned())
        .into();
    v
}

/// Waits until `lines` gives `n` lines of the default template; returns
/// them comparable and in a fixed order.
async fn default_lines(
    what: &str,
    n: usize,
    lines: impl Fn() -> Vec<String>,
) -> Vec<serde_json::Value> {
    let got = wait_prefixed(what, n, "{\"httpRequest\"", lines).await;
    let mut got: Vec<_> = got.iter().map(|l| comparable(l)).collect();
    got.sort_by_key(|v| v["httpRequest"]["requestUrl"].to_string());
    got
}

#[tokio::test(flavor = "multi_thread")]
async fn knative_s_default_template_matches_the_go_queue_proxy() {
    let app = app().await;
    // Classic Knative's default, as its config-observability carries it.
    let template = qproxy::config::DEFAULT_REQUEST_LOG_TEMPLATE.replace(
        r#""{{.TraceID}}""#,
        r#""{{index .Request.Header "X-B3-Traceid"}}""#,
    );
    let env = env(&app, &template, false);
    async fn play(main: SocketAddr) {
        let traced = get(
            "/ok?q=%3Cx%3E&r=1",
            &[
                ("User-Agent", "curl/8 \"quoted\""),
                ("Referer", "https://example.com/?a=b&c=d"),
                ("X-B3-TraceId", "463ac35c9f6413ad"),
            ],
        );
        h1(main, traced).await.collect().await.unwrap();
        let mut post = get("/echo", &[]);
        *post.method_mut() = http::Method::POST;
        *post.body_mut() = full("some body");
        h1(main, post).await.collect().await.unwrap();
        h2(main, get("/fail", &[])).await.collect().await.unwrap();
    }

    let go = GoQueueProxy::start(&env).await;
    play(go.main).await;
    let want = default_lines("Go", 3, || go.output()).await;
    drop(go);

    let qp = QProxy::start_env(&env);
    play(qp.main).await;
    // qproxy's lines are JSON, which the test's log reader takes apart.
    let got = default_lines("qproxy", 3, || {
        qp.logs_on("stdout")
            .into_iter()
            .filter(|l| l.get("httpRequest").is_some())
            .map(|mut l| {
                if let Some(o) = l.as_object_mut() {
                    o.remove("_stream");
                }
                l.to_string()
            })
            .collect()
    })
    .await;
    assert_eq!(got, want);
}
