//! Request metrics on the user metrics port (9091), both generations: a
//! known mix of requests, scraped, checked for counts, labels and bucket
//! placement. (`tests/e2e` compares the exposition with what Knative's Go
//! queue-proxy serves for the same traffic.)

use qproxy_test_support::*;

/// The revision of these tests: `containerConcurrency` 2, so that the
/// breaker's queue depth is measured.
fn env(app: &App) -> Vec<(String, String)> {
    with_vars(knative_env(app.port()), &[("CONTAINER_CONCURRENCY", "2")])
}

#[tokio::test(flavor = "multi_thread")]
async fn counts_labels_and_buckets_of_a_known_mix() {
    let app = App::varied().await;
    let qp = QProxy::start_env(&env(&app));
    let port = qp.metrics.expect("the metrics port");
    assert_eq!(
        without_additions(&scrape(port).await),
        "",
        "no request metrics before the first request"
    );
    play_metrics_mix(qp.main).await;
    let text = scrape_until(
        port,
        &format!(
            "{} 1",
            classic_series("revision_request_count", 200, Some("blue"), "")
        ),
    )
    .await;
    let has = |line: String| assert!(text.lines().any(|l| l == line), "no {line} in {text}");
    has(format!(
        "{} 4",
        classic_series("revision_request_count", 200, Some("DISABLED"), "")
    ));
    has(format!(
        "{} 2",
        classic_series("revision_request_count", 500, Some("DISABLED"), "")
    ));
    has(format!(
        "{} 5",
        classic_series("revision_app_request_count", 200, None, "")
    ));
    has(format!(
        "{} 2",
        classic_series("revision_app_request_count", 500, None, "")
    ));
    // The three fast 200s are under 250 ms, the slow one is not.
    let bucket = |le: &str| {
        classic_series(
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
        classic_series(
            "revision_request_latencies_count",
            200,
            Some("DISABLED"),
            ""
        )
    ));
    // Last taken by the `K-Kubelet-Probe` request, which skips the breaker.
    has(format!(
        "revision_queue_depth{{{REVISION_LABELS},response_code=\"\",response_code_class=\"\",revision_name=\"hello-00001\",service_name=\"hello\"}} 0"
    ));
    let sum: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(&classic_series(
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
        "revision_queue_depth{{{REVISION_LABELS},response_code=\"\",response_code_class=\"\",revision_name=\"hello-00001\",service_name=\"hello\"}} 2"
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
            classic_series("revision_request_count", 504, Some("DISABLED"), "")
        ),
    )
    .await;
    let app_side = format!(
        "{} 1",
        classic_series("revision_app_request_count", 502, None, "")
    );
    assert!(
        text.lines().any(|l| l == app_side),
        "no {app_side} in {text}"
    );
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
    let app = App::varied().await;
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
    let knative = without_additions(&text);
    let mut help: Vec<&str> = knative.lines().filter(|l| l.starts_with("# ")).collect();
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

#[tokio::test(flavor = "multi_thread")]
async fn without_a_breaker_current_knative_shows_no_queue_depth() {
    // Knative records the gauge only as requests pass a breaker: with
    // `containerConcurrency` 0 its exposition has no such line at all.
    let app = App::varied().await;
    let env = with_vars(
        knative_env(app.port()),
        &[(
            "OBSERVABILITY_CONFIG",
            r#"{"requestMetrics":{"protocol":"prometheus"}}"#,
        )],
    );
    let qp = QProxy::start_env(&env);
    h1(qp.main, get("/ok", &[])).await;
    let port = qp.metrics.expect("the metrics port");
    let text = scrape_until(
        port,
        &format!(
            "kn_serving_invocation_duration_seconds_count{{http_response_status_code=\"200\",{QUEUE_SCOPE}}} 1"
        ),
    )
    .await;
    assert!(!text.contains("kn_serving_queue_depth"), "{text}");
}

/// The value of the sample `name{labels}` in `exposition`, if any.
fn sample(exposition: &str, name: &str) -> Option<f64> {
    exposition.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('{')?;
        let (_, value) = rest.split_once("} ")?;
        value.parse().ok()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_autoscaler_s_view_is_served_beside_the_request_metrics_in_both_generations() {
    for current in [false, true] {
        let (app, mut arrived) = App::holding("held").await;
        let env = generation_env(current, &app, &[]);
        let qp = QProxy::start_env(&env);
        let main = qp.main;
        // Two requests held in the app, one of them through the activator.
        let held: Vec<_> = [&[][..], &[("K-Proxy-Request", "activator")][..]]
            .into_iter()
            .map(|headers| {
                let req = get("/", headers);
                tokio::spawn(async move { text(h1(main, req).await).await })
            })
            .collect();
        let mut releases = Vec::new();
        for _ in 0..2 {
            releases.push(within("a held request", arrived.recv()).await.unwrap());
        }
        // A whole reporting window with both in flight: the autoscaler
        // reads 2, one of them proxied, as the stats port says too.
        let port = qp.metrics.expect("the metrics port");
        let text = until("concurrencies of 2 and 1", async || {
            let text = scrape(port).await;
            let both = sample(&text, "qproxy_autoscaler_average_concurrency") == Some(2.0);
            let one = sample(&text, "qproxy_autoscaler_average_proxied_concurrency") == Some(1.0);
            if both && one { Ok(text) } else { Err(text) }
        })
        .await;
        let labels =
            format!("{{{REVISION_LABELS},revision_name=\"hello-00001\",service_name=\"hello\"}}");
        for name in [
            "qproxy_autoscaler_average_concurrency",
            "qproxy_autoscaler_average_proxied_concurrency",
            "qproxy_autoscaler_requests_per_second",
            "qproxy_autoscaler_proxied_requests_per_second",
        ] {
            assert!(text.contains(&format!("# TYPE {name} gauge\n")), "{text}");
            assert!(text.contains(&format!("{name}{labels} ")), "{name}: {text}");
        }
        for release in releases {
            release.send(()).unwrap();
        }
        for h in held {
            assert_eq!(h.await.unwrap(), "held");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_start_up_s_spans_are_served_once_they_happen_in_both_generations() {
    for current in [false, true] {
        let app = App::hello().await;
        let env = generation_env(current, &app, &[]);
        let qp = QProxy::start_env(&env);
        let port = qp.metrics.expect("the metrics port");
        let ready = "qproxy_startup_app_ready_seconds";
        let first = "qproxy_startup_first_request_seconds";
        let before = scrape(port).await;
        assert_eq!(sample(&before, ready), None, "{before}");
        assert_eq!(sample(&before, first), None, "{before}");

        // The kubelet's health check passes: the app is ready, and has
        // answered nothing yet.
        until("the app ready", async || {
            health_check(qp.main, &[KUBELET, QUEUE]).await.status == 200
        })
        .await;
        let exposition = scrape(port).await;
        let app_ready = sample(&exposition, ready).expect("the ready span");
        assert!(
            exposition.contains(&format!("# TYPE {ready} gauge\n")),
            "{exposition}"
        );
        assert_eq!(sample(&exposition, first), None, "{exposition}");
        let logged = qp.wait_for_log("the ready span's line", |l| {
            l["message"] == "The user container passed its first readiness check"
        });
        assert_eq!(logged["seconds"].as_f64(), Some(app_ready));

        // A probe the app answers is not the first request.
        let probe = h1(qp.main, get("/", &[("K-Kubelet-Probe", "queue")])).await;
        assert_eq!(probe.status(), 200);
        assert_eq!(sample(&scrape(port).await, first), None);
        // The first request answered comes after, and the ready span
        // keeps its first value.
        assert_eq!(
            text(h1(qp.main, get("/", &[])).await).await,
            "Hello World!\n"
        );
        health_check(qp.main, &[KUBELET, QUEUE]).await;
        let after = scrape(port).await;
        let labels =
            format!("{{{REVISION_LABELS},revision_name=\"hello-00001\",service_name=\"hello\"}}");
        assert!(after.contains(&format!("{first}{labels} ")), "{after}");
        assert_eq!(sample(&after, ready), Some(app_ready));
        assert!(sample(&after, first).expect("the first request's span") >= app_ready);
        qp.wait_for_log("the first request's line", |l| {
            l["message"] == "The user container answered its first request"
        });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_queue_s_waits_are_a_histogram_where_there_is_a_queue_in_both_generations() {
    for current in [false, true] {
        let (app, mut arrived) = App::holding("held").await;
        // Debug logs tell when a request is queued.
        let env = generation_env(
            current,
            &app,
            &[
                ("CONTAINER_CONCURRENCY", "1"),
                ("SERVING_LOGGING_LEVEL", "debug"),
            ],
        );
        let qp = QProxy::start_env(&env);
        let main = qp.main;
        let port = qp.metrics.expect("the metrics port");
        let name = "qproxy_queue_wait_seconds";
        // The first takes the one slot; the second waits behind it.
        let first = tokio::spawn(async move { text(h1(main, get("/", &[])).await).await });
        let release = within("the first request", arrived.recv()).await.unwrap();
        scrape_until(port, &format!("{name}_count{{{}}} 1", labels())).await;
        let second = tokio::spawn(async move { text(h1(main, get("/", &[])).await).await });
        qp.wait_for_log("the second queued", |l| {
            l["message"] == "request queued for a slot"
        });
        release.send(()).unwrap();
        within("the second request", arrived.recv())
            .await
            .unwrap()
            .send(())
            .unwrap();
        assert_eq!(first.await.unwrap(), "held");
        assert_eq!(second.await.unwrap(), "held");
        let text = scrape_until(port, &format!("{name}_count{{{}}} 2", labels())).await;
        assert!(
            text.contains(&format!("# TYPE {name} histogram\n")),
            "{text}"
        );
        let bucket = format!("{name}_bucket{{{},le=\"+Inf\"}} 2", labels());
        assert!(text.contains(&bucket), "{text}");
        let sum = sample(&text, &format!("{name}_sum")).expect("the sum");
        assert!(sum > 0.0, "the second waited: {text}");
    }
    // No limit, no queue: no histogram.
    let app = App::hello().await;
    let qp = QProxy::start_env(&knative_env(app.port()));
    h1(qp.main, get("/", &[])).await;
    let text = scrape(qp.metrics.expect("the metrics port")).await;
    assert!(!text.contains("qproxy_queue_wait"), "{text}");
}

/// Knative's environment for `app` with `extra`, in the classic generation
/// or, when `current`, the current one with request metrics as Prometheus
/// text.
fn generation_env(current: bool, app: &App, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let env = with_vars(knative_env(app.port()), extra);
    if !current {
        return env;
    }
    with_vars(
        env,
        &[(
            "OBSERVABILITY_CONFIG",
            r#"{"requestMetrics":{"protocol":"prometheus"}}"#,
        )],
    )
}

/// The revision's labels of qproxy's own series.
fn labels() -> String {
    format!("{REVISION_LABELS},revision_name=\"hello-00001\",service_name=\"hello\"")
}

/// An app that writes a response's head, and its body (of known length) a
/// moment later, as a separate write: the head reaches the client with the
/// body's first bytes, as Go's proxy sends it, so that a client that reads
/// what first comes and leaves has the whole response, and is counted as
/// the app's `200`, not as a body cut off.
#[tokio::test(flavor = "multi_thread")]
async fn a_length_framed_head_waits_for_its_body_and_a_client_leaving_after_it_counts_200() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = raw_app(|mut s| async move {
        while read_head(&mut s).await.is_some() {
            let head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
            if s.write_all(head).await.is_err() {
                return;
            }
            // The app's own pace: its body comes in a write of its own.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            if s.write_all(b"hello").await.is_err() {
                return;
            }
        }
    })
    .await;
    let qp = QProxy::start(port, &[]);
    let mut client = tokio::net::TcpStream::connect(qp.main).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: hello\r\n\r\n")
        .await
        .unwrap();
    let mut first = vec![0u8; 4096];
    let n = within("the answer", client.read(&mut first)).await.unwrap();
    let first = String::from_utf8_lossy(&first[..n]).into_owned();
    assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{first}");
    assert!(
        first.ends_with("\r\n\r\nhello"),
        "the head came alone: {first:?}"
    );
    drop(client);
    let metrics = qp.metrics.expect("the metrics port");
    scrape_until(
        metrics,
        &format!(
            "{} 1",
            classic_series("revision_request_count", 200, Some("DISABLED"), "")
        ),
    )
    .await;
}
