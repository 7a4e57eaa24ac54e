//! Request logs, compared line for line with what Knative's Go
//! queue-proxy writes for the same requests.

use std::net::SocketAddr;

use http_body_util::BodyExt;
use qproxy::config::Generation;
use qproxy_test_support::*;

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

/// Both generations of Knative.
const GENERATIONS: [Generation; 2] = [Generation::Classic, Generation::Current];

/// Waits until `lines` has `n` request log lines (`RL ...`).
async fn wait_lines(what: &str, n: usize, lines: impl Fn() -> Vec<String>) -> Vec<String> {
    wait_lines_with(what, n, "RL ", lines).await
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn lines_match_the_go_queue_proxy_in_both_generations() {
    let app = App::varied().await;
    for (generation, probes) in GENERATIONS
        .into_iter()
        .flat_map(|g| [(g, false), (g, true)])
    {
        let env = request_log_env(generation, app.port(), TEMPLATE, probes);
        let expected = play_count(probes);

        let go = GoQueueProxy::start(&env).await;
        play(go.main).await;
        let want = wait_lines("Go", expected, || go.output()).await;
        drop(go);

        let qp = QProxy::start_env(&env);
        play(qp.main).await;
        let got = wait_lines("qproxy", expected, || qp.raw_lines()).await;
        assert_eq!(got, want, "{generation:?}, probe logging {probes}");
        assert_eq!(got.len(), expected);
    }
}

fn play_count(probes: bool) -> usize {
    // Eight requests, and two probes when they are logged.
    if probes { 10 } else { 8 }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn upgrades_and_cut_responses_are_logged_as_go_logs_them() {
    let port = upgrade_and_abort_app().await;
    for generation in GENERATIONS {
        let env = request_log_env(
            generation,
            port,
            "RL {{.Request.Method}} {{.Request.RequestURI}} {{.Response.Code}} {{.Response.Size}}",
            false,
        );

        let go = GoQueueProxy::start(&env).await;
        play_upgrade_and_abort(go.main).await;
        let want = wait_lines("Go", 2, || go.output()).await;
        drop(go);

        let qp = QProxy::start_env(&env);
        play_upgrade_and_abort(qp.main).await;
        let got = wait_lines("qproxy", 2, || qp.raw_lines()).await;
        // The upgrade is a 200 with nothing written through the handlers,
        // the cut response a 500 with no size, as Go's aborted handler
        // records it.
        assert_eq!(
            got,
            ["RL GET /cut 500 0", "RL GET /ws 200 0"],
            "{generation:?}"
        );
        assert_eq!(got, want, "{generation:?}");
    }
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
    let got = wait_lines_with(what, n, "{\"httpRequest\"", lines).await;
    let mut got: Vec<_> = got.iter().map(|l| comparable(l)).collect();
    got.sort_by_key(|v| v["httpRequest"]["requestUrl"].to_string());
    got
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn knative_s_default_template_matches_the_go_queue_proxy_in_both_generations() {
    for generation in GENERATIONS {
        default_template_matches(generation).await;
    }
}

async fn default_template_matches(generation: Generation) {
    let app = App::varied().await;
    let template = match generation {
        // Classic Knative's default, as its config-observability carries
        // it (the trace ID of an OpenCensus span is not a template field).
        Generation::Classic => qproxy::config::DEFAULT_REQUEST_LOG_TEMPLATE.replace(
            r#""{{.TraceID}}""#,
            r#""{{index .Request.Header "X-B3-Traceid"}}""#,
        ),
        Generation::Current => qproxy::config::DEFAULT_REQUEST_LOG_TEMPLATE.to_owned(),
    };
    let env = request_log_env(generation, app.port(), &template, false);
    async fn play(main: SocketAddr) {
        let traced = get(
            "/ok?q=%3Cx%3E&r=1",
            &[
                ("User-Agent", "curl/8 \"quoted\""),
                ("Referer", "https://example.com/?a=b&c=d"),
                ("X-B3-TraceId", "463ac35c9f6413ad"),
                (
                    "traceparent",
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                ),
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
    assert_eq!(got, want, "{generation:?}");
}
