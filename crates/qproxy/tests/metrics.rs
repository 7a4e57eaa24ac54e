//! Classic Knative's request metrics on the user metrics port (9091): a
//! known mix of requests, scraped, checked for counts, labels and bucket
//! placement, and compared with what Knative's Go queue-proxy v0.42.2
//! serves for the same traffic.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::oracle::GoQueueProxy;
use common::*;
use http::{Response, StatusCode};

/// How long `/slow` takes: past the 250 ms bucket.
const SLOW: Duration = Duration::from_millis(300);

async fn app() -> App {
    App::start(|req| async move {
        let mut res = Response::new(full("answer"));
        match req.uri().path() {
            "/fail" => *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR,
            "/slow" => tokio::time::sleep(SLOW).await,
            _ => {}
        }
        res
    })
    .await
}

/// The mix: four 200s (one slow), two 500s, one 200 with a route tag, and
/// probes of every kind, none of which counts.
async fn play(main: SocketAddr) {
    for path in ["/ok", "/ok", "/ok", "/slow", "/fail", "/fail"] {
        h1(main, get(path, &[])).await;
    }
    h1(main, get("/ok", &[("Knative-Serving-Tag", "blue")])).await;
    for probe in [
        &[
            ("User-Agent", "kube-probe/1.29"),
            ("K-Network-Probe", "queue"),
        ][..],
        &[("K-Network-Probe", "probe"), ("K-Network-Hash", "h")],
        &[("K-Kubelet-Probe", "1")],
    ] {
        h1(main, get("/ok", probe)).await;
    }
}

async fn scrape(metrics: SocketAddr) -> String {
    text(h1(metrics, get("/metrics", &[])).await).await
}

/// Scrapes until `line` (a series and its value) shows.
async fn scrape_until(metrics: SocketAddr, line: &str) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let text = scrape(metrics).await;
        if text.lines().any(|l| l == line) {
            return text;
        }
        assert!(Instant::now() < deadline, "no {line:?} in {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const REVISION: &str = "configuration_name=\"hello\",container_name=\"queue-proxy\",namespace_name=\"default\",pod_name=\"hello-00001-deployment-6d8d4bd5b-x7k2p\"";

fn series(name: &str, code: u16, tag: Option<&str>, extra: &str) -> String {
    let tag = tag.map_or(String::new(), |t| format!(",route_tag=\"{t}\""));
    format!(
        "{name}{{{REVISION},response_code=\"{code}\",response_code_class=\"{}xx\",revision_name=\"hello-00001\"{tag},service_name=\"hello\"{extra}}}",
        code / 100
    )
}

fn env(app: &App) -> Vec<(String, String)> {
    let mut env = knative_env(app.port());
    env.retain(|(k, _)| k != "CONTAINER_CONCURRENCY");
    env.push(("CONTAINER_CONCURRENCY".to_owned(), "2".to_owned()));
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn counts_labels_and_buckets_of_a_known_mix() {
    let app = app().await;
    let qp = QProxy::start_env(&env(&app));
    let port = qp.metrics.expect("the metrics port");
    assert_eq!(scrape(port).await, "", "nothing before the first request");
    play(qp.main).await;
    let text = scrape_until(
        port,
        &format!(
            "{} 1",
            series("revision_request_count", 200, Some("blue"), "")
        ),
    )
    .await;
    let has = |line: String| assert!(text.lines().any(|l| l == line), "no {line} in {text}");
    has(format!(
        "{} 4",
        series("revision_request_count", 200, Some("DISABLED"), "")
    ));
    has(format!(
        "{} 2",
        series("revision_request_count", 500, Some("DISABLED"), "")
    ));
    has(format!(
        "{} 5",
        series("revision_app_request_count", 200, None, "")
    ));
    has(format!(
        "{} 2",
        series("revision_app_request_count", 500, None, "")
    ));
    // The three fast 200s are under 250 ms, the slow one is not.
    let bucket = |le: &str| {
        series(
            "revision_request_latencies_bucket",
            200,
            Some("DISABLED"),
            &format!(",le=\"{le}\""),
        )
    };
    has(format!("{} 3", bucket("250")));
    has(format!("{} 4", bucket("+Inf")));
    has(format!(
        "{} 4",
        series(
            "revision_request_latencies_count",
            200,
            Some("DISABLED"),
            ""
        )
    ));
    // Last taken by the `K-Kubelet-Probe` request, which skips the breaker.
    has(format!(
        "revision_queue_depth{{{REVISION},response_code=\"\",response_code_class=\"\",revision_name=\"hello-00001\",service_name=\"hello\"}} 0"
    ));
    let sum: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(&series(
                "revision_request_latencies_sum",
                200,
                Some("DISABLED"),
                "",
            ))
        })
        .and_then(|v| v.trim().parse().ok())
        .expect("a latency sum");
    assert!(sum >= SLOW.as_millis() as f64, "sum {sum}");
    assert!(!text.contains("probe"), "probes are not measured");
}

/// The lines that do not depend on how fast each proxy is: HELP and TYPE,
/// counts, the buckets every request of the mix falls into alike, gauges.
fn stable_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.is_empty())
        .filter(|l| !l.contains("_sum{"))
        .filter(|l| {
            !l.contains("_bucket{") || l.contains("le=\"250\"") || l.contains("le=\"+Inf\"")
        })
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

#[tokio::test(flavor = "multi_thread")]
async fn the_exposition_matches_the_go_queue_proxy() {
    let app = app().await;
    let env = env(&app);
    let go = GoQueueProxy::start(&env).await;
    play(go.main).await;
    let last = format!(
        "{} 1",
        series("revision_request_count", 200, Some("blue"), "")
    );
    let go_metrics = SocketAddr::from(([127, 0, 0, 1], 9091));
    let want = scrape_until(go_metrics, &last).await;
    drop(go);

    let qp = QProxy::start_env(&env);
    play(qp.main).await;
    let got = scrape_until(qp.metrics.expect("the metrics port"), &last).await;
    assert_eq!(stable_lines(&got), stable_lines(&want));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_queue_depth_counts_the_requests_in_the_breaker() {
    let (app, mut arrived) = App::holding("held").await;
    let qp = QProxy::start_env(&env(&app));
    let main = qp.main;
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { text(h1(main, get("/", &[])).await).await }))
        .collect();
    let mut releases = vec![
        within("the first request", arrived.recv()).await.unwrap(),
        within("the second request", arrived.recv()).await.unwrap(),
    ];
    // Each request takes the depth as it passes, so the two above may
    // leave 1 (the first, passing last). A kubelet probe skips the breaker
    // and takes it with both in.
    let probe =
        tokio::spawn(
            async move { text(h1(main, get("/", &[("K-Kubelet-Probe", "1")])).await).await },
        );
    releases.push(within("the probe", arrived.recv()).await.unwrap());
    let depth = format!(
        "revision_queue_depth{{{REVISION},response_code=\"\",response_code_class=\"\",revision_name=\"hello-00001\",service_name=\"hello\"}} 2"
    );
    scrape_until(qp.metrics.expect("the metrics port"), &depth).await;
    for release in releases {
        release.send(()).unwrap();
    }
    for h in held.into_iter().chain([probe]) {
        assert_eq!(h.await.unwrap(), "held");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_request_counts_as_its_504_and_the_app_side_as_502() {
    let (app, mut arrived) = App::holding("late").await;
    let mut env = env(&app);
    env.retain(|(k, _)| k != "REVISION_TIMEOUT_SECONDS");
    env.push(("REVISION_TIMEOUT_SECONDS".to_owned(), "1".to_owned()));
    let qp = QProxy::start_env(&env);
    let main = qp.main;
    let request = tokio::spawn(async move { h1(main, get("/", &[])).await.status() });
    let _release = within("the request", arrived.recv()).await.unwrap();
    assert_eq!(within("the timeout", request).await.unwrap(), 504);
    let port = qp.metrics.expect("the metrics port");
    let text = scrape_until(
        port,
        &format!(
            "{} 1",
            series("revision_request_count", 504, Some("DISABLED"), "")
        ),
    )
    .await;
    let app_side = format!("{} 1", series("revision_app_request_count", 502, None, ""));
    assert!(
        text.lines().any(|l| l == app_side),
        "no {app_side} in {text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrades_and_cut_responses_count_as_go_counts_them() {
    let port = upgrade_and_abort_app().await;
    let mut env = knative_env(port);
    env.retain(|(k, _)| k != "CONTAINER_CONCURRENCY");
    env.push(("CONTAINER_CONCURRENCY".to_owned(), "2".to_owned()));
    // The upgrade counts as 200, the cut response as 500, at both levels.
    let last = format!(
        "{} 1",
        series("revision_request_count", 500, Some("DISABLED"), "")
    );
    let go = GoQueueProxy::start(&env).await;
    play_upgrade_and_abort(go.main).await;
    let want = scrape_until(SocketAddr::from(([127, 0, 0, 1], 9091)), &last).await;
    drop(go);

    let qp = QProxy::start_env(&env);
    play_upgrade_and_abort(qp.main).await;
    let got = scrape_until(qp.metrics.expect("the metrics port"), &last).await;
    // The depth the cut request takes depends on whether the tunnel's
    // slot was given back yet, in either proxy.
    let without_depth = |text: &str| {
        let mut lines = stable_lines(text);
        lines.retain(|l| !l.starts_with("revision_queue_depth{"));
        lines
    };
    assert_eq!(without_depth(&got), without_depth(&want));
    let upgrade = format!("{} 1", series("revision_app_request_count", 200, None, ""));
    assert!(got.lines().any(|l| l == upgrade), "no {upgrade} in {got}");
}

/// Current Knative's exposition for a request to `qproxy`'s app: the HTTP
/// instruments' labels for `host`, `method`, `status` and `tag`.
fn http_labels(method: &str, status: u16, tag: &str, address: &str, port: u16) -> String {
    format!(
        "http_request_method=\"{method}\",http_response_status_code=\"{status}\",kn_route_tag=\"{tag}\",network_protocol_name=\"http\",network_protocol_version=\"1.1\",otel_scope_name=\"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp\",otel_scope_schema_url=\"\",otel_scope_version=\"0.69.0\",server_address=\"{address}\",server_port=\"{port}\",url_scheme=\"http\""
    )
}

const QUEUE_SCOPE: &str = "otel_scope_name=\"knative.dev/serving/pkg/queue\",otel_scope_schema_url=\"\",otel_scope_version=\"\"";

#[tokio::test(flavor = "multi_thread")]
async fn current_knative_s_instruments_in_prometheus_text() {
    let app = app().await;
    let mut env = env(&app);
    env.push((
        "OBSERVABILITY_CONFIG".to_owned(),
        r#"{"requestMetrics":{"protocol":"prometheus"}}"#.to_owned(),
    ));
    let qp = QProxy::start_env(&env);
    let host = [("Host", "hello.example.com:8080")];
    for path in ["/ok", "/ok", "/fail"] {
        h1(qp.main, get(path, &host)).await;
    }
    h1(
        qp.main,
        get("/ok", &[host[0], ("Knative-Serving-Tag", "blue")]),
    )
    .await;
    kubelet_health(qp.main).await;
    let mut post = get("/ok", &host);
    *post.method_mut() = http::Method::POST;
    *post.body_mut() = full("twelve bytes");
    h1(qp.main, post).await;

    let port = qp.metrics.expect("the metrics port");
    let invocations = format!(
        "kn_serving_invocation_duration_seconds_count{{http_response_status_code=\"200\",{QUEUE_SCOPE}}} 4"
    );
    let text = scrape_until(port, &invocations).await;
    let has = |line: String| assert!(text.lines().any(|l| l == line), "no {line} in {text}");
    let server = |method, status, tag| http_labels(method, status, tag, "hello.example.com", 8080);
    let user_port = app.port();
    let client = |method, status, tag| http_labels(method, status, tag, "127.0.0.1", user_port);
    has(format!(
        "http_server_request_duration_seconds_count{{{}}} 2",
        server("GET", 200, "kn:disabled")
    ));
    has(format!(
        "http_server_request_duration_seconds_count{{{}}} 1",
        server("GET", 500, "kn:disabled")
    ));
    has(format!(
        "http_server_request_duration_seconds_count{{{}}} 1",
        server("GET", 200, "blue")
    ));
    has(format!(
        "http_server_response_body_size_bytes_sum{{{}}} 12",
        server("GET", 200, "kn:disabled")
    ));
    has(format!(
        "http_server_request_body_size_bytes_sum{{{}}} 12",
        server("POST", 200, "kn:disabled")
    ));
    has(format!(
        "http_client_request_duration_seconds_count{{{}}} 2",
        client("GET", 200, "kn:disabled")
    ));
    has(format!(
        "http_server_request_duration_seconds_bucket{{{},le=\"10\"}} 2",
        server("GET", 200, "kn:disabled")
    ));
    has(format!(
        "http_server_response_body_size_bytes_bucket{{{},le=\"10\"}} 2",
        server("GET", 200, "kn:disabled")
    ));
    has(format!(
        "kn_serving_invocation_duration_seconds_count{{http_response_status_code=\"500\",{QUEUE_SCOPE}}} 1"
    ));
    // Taken by the last request as it passed the breaker, itself inside.
    has(format!("kn_serving_queue_depth{{{QUEUE_SCOPE}}} 1"));
    // The families and their help, as Knative's OpenTelemetry exporter
    // writes them (its Go runtime and process collectors aside).
    let mut help: Vec<&str> = text.lines().filter(|l| l.starts_with("# ")).collect();
    help.sort();
    assert_eq!(
        help,
        [
            "# HELP http_client_request_body_size_bytes Size of HTTP client request bodies.",
            "# HELP http_client_request_duration_seconds Duration of HTTP client requests.",
            "# HELP http_server_request_body_size_bytes Size of HTTP server request bodies.",
            "# HELP http_server_request_duration_seconds Duration of HTTP server requests.",
            "# HELP http_server_response_body_size_bytes Size of HTTP server response bodies.",
            "# HELP kn_serving_invocation_duration_seconds The duration of task execution",
            "# HELP kn_serving_queue_depth Number of current requests in the queue",
            "# HELP target_info Target metadata",
            "# TYPE http_client_request_body_size_bytes histogram",
            "# TYPE http_client_request_duration_seconds histogram",
            "# TYPE http_server_request_body_size_bytes histogram",
            "# TYPE http_server_request_duration_seconds histogram",
            "# TYPE http_server_response_body_size_bytes histogram",
            "# TYPE kn_serving_invocation_duration_seconds histogram",
            "# TYPE kn_serving_queue_depth gauge",
            "# TYPE target_info gauge",
        ]
    );
    let target = text
        .lines()
        .find(|l| l.starts_with("target_info{"))
        .unwrap();
    for label in [
        "container_name=\"queue-proxy\"",
        "k8s_namespace_name=\"default\"",
        "kn_revision_name=\"hello-00001\"",
        "kn_service_name=\"hello\"",
        "service_name=\"hello\"",
    ] {
        assert!(target.contains(label), "{target}");
    }
    assert!(!text.contains("kube-probe"), "probes are not measured");
}
