//! Request logs: one line per request on stdout, rendered from the
//! operator's Go template, in both generations. (`tests/e2e` compares the
//! lines with what Knative's Go queue-proxy writes for the same requests.)

use http_body_util::BodyExt;
use qproxy_test_support::*;

/// Waits until `lines` has `n` request log lines (`RL ...`).
async fn wait_lines(what: &str, n: usize, lines: impl Fn() -> Vec<String>) -> Vec<String> {
    wait_lines_with(what, n, "RL ", lines).await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_template_writes_json_knative_can_parse() {
    let app = App::varied().await;
    let template = qproxy::config::DEFAULT_REQUEST_LOG_TEMPLATE.replace(
        r#""{{.TraceID}}""#,
        r#""{{index .Request.Header "X-B3-Traceid"}}""#,
    );
    let qp = QProxy::start_env(&with_request_log(knative_env(app.port()), &template, false));
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
    let app = App::varied().await;
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
    assert!(!qp.raw_lines().iter().any(|l| l.starts_with("RL ")));

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
    let got = wait_lines("current", 3, || qp.raw_lines()).await;
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
    let env = with_request_log(
        knative_env(App::hello().await.port()),
        "{{.Request.Method",
        false,
    );
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
