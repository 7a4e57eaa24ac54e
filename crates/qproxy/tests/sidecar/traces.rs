//! Traces: the spans each Knative generation makes for a proxied request,
//! received by collectors run here (Zipkin for classic Knative, OTLP over
//! gRPC and HTTP for current Knative), their parent/child relations, and
//! the trace context the app receives.

use http_body_util::BodyExt;
use qproxy_test_support::collector::{otlp_grpc, otlp_http, trace_spans, zipkin};
use qproxy_test_support::*;

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT: &str = "b7ad6b7169203331";

fn header(seen: &Seen, name: &str) -> String {
    seen.headers
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

fn traceparent(trace: &str, span: &str, flags: &str) -> String {
    format!("00-{trace}-{span}-{flags}")
}

#[tokio::test(flavor = "multi_thread")]
async fn classic_knative_sends_zipkin_spans_and_both_header_formats() {
    let app = App::hello().await;
    let (collector, spans) = zipkin().await;
    let endpoint = format!("http://{collector}/api/v2/spans");
    let qp = QProxy::start(
        app.port(),
        &[
            ("TRACING_CONFIG_BACKEND", "zipkin"),
            ("TRACING_CONFIG_ZIPKIN_ENDPOINT", &endpoint),
            ("TRACING_CONFIG_SAMPLE_RATE", "1"),
            ("CONTAINER_CONCURRENCY", "1"),
        ],
    );
    let incoming = traceparent(TRACE, PARENT, "01");
    let res = h1(qp.main, get("/path?q=1", &[("traceparent", &incoming)])).await;
    assert_eq!(res.status(), 200);
    res.collect().await.unwrap();

    let by_name = trace_spans(&spans, TRACE, 4).await;
    let server = &by_name["SERVER /path"];
    let proxy = &by_name["queue_proxy"];
    let wait = &by_name["queue_wait"];
    let client = &by_name["CLIENT /path"];
    assert_eq!(server.parent, PARENT);
    assert_eq!(proxy.parent, server.id);
    assert_eq!(wait.parent, proxy.id);
    assert_eq!(client.parent, proxy.id);
    assert_eq!(server.attributes["http.method"], "GET");
    assert_eq!(server.attributes["http.path"], "/path");
    assert_eq!(server.attributes["http.url"], "/path?q=1");
    assert_eq!(server.attributes["http.status_code"], "200");
    assert_eq!(
        client.attributes["http.url"],
        format!("http://127.0.0.1:{}/path?q=1", app.port())
    );
    let pod = "hello-00001-deployment-6d8d4bd5b-x7k2p@127.0.0.1";
    assert!(by_name.values().all(|s| s.service == pod), "{by_name:#?}");

    // The app gets the client span's context, in W3C and B3 form.
    let seen = app.only();
    assert_eq!(
        header(&seen, "traceparent"),
        traceparent(TRACE, &client.id, "01")
    );
    assert_eq!(header(&seen, "x-b3-traceid"), TRACE);
    assert_eq!(header(&seen, "x-b3-spanid"), client.id);
    assert_eq!(header(&seen, "x-b3-sampled"), "1");

    // B3 alone is accepted too (a 64-bit trace ID is widened).
    let res = h1(
        qp.main,
        get(
            "/b3",
            &[
                ("X-B3-TraceId", "463ac35c9f6413ad"),
                ("X-B3-SpanId", "a2fb4a1d1a96d312"),
                ("X-B3-Sampled", "1"),
            ],
        ),
    )
    .await;
    res.collect().await.unwrap();
    let by_name = trace_spans(&spans, "0000000000000000463ac35c9f6413ad", 4).await;
    assert_eq!(by_name["SERVER /b3"].parent, "a2fb4a1d1a96d312");

    // What is buffered is sent at shutdown, which still ends cleanly.
    let mut qp = qp;
    qp.signal("TERM");
    assert!(qp.wait_exit().success());
}

fn current_env(app: &App, protocol: &str, endpoint: &str, rate: f64) -> Vec<(String, String)> {
    let mut env = knative_env(app.port());
    env.retain(|(k, _)| k != "CONTAINER_CONCURRENCY");
    env.push(("CONTAINER_CONCURRENCY".to_owned(), "1".to_owned()));
    let observability = serde_json::json!({
        "tracing": { "protocol": protocol, "endpoint": endpoint, "samplingRate": rate },
    });
    env.push(("OBSERVABILITY_CONFIG".to_owned(), observability.to_string()));
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn current_knative_sends_otlp_spans_over_grpc() {
    let app = App::hello().await;
    let collector = otlp_grpc().await;
    let spans = collector.spans;
    let qp = QProxy::start_env(&current_env(
        &app,
        "grpc",
        &format!("http://{}", collector.addr),
        1.0,
    ));
    let incoming = traceparent(TRACE, PARENT, "01");
    let res = h1(qp.main, get("/path", &[("traceparent", &incoming)])).await;
    res.collect().await.unwrap();
    // Probes make no spans.
    kubelet_health(qp.main).await;

    let by_name = trace_spans(&spans, TRACE, 4).await;
    let server = &by_name["SERVER GET"];
    let proxy = &by_name["kn.queueproxy.proxy"];
    let wait = &by_name["kn.queueproxy.wait"];
    let client = &by_name["CLIENT HTTP GET"];
    assert_eq!(server.parent, PARENT);
    assert_eq!(proxy.parent, server.id);
    assert_eq!(wait.parent, proxy.id);
    assert_eq!(client.parent, wait.id);
    assert_eq!(server.attributes["http.response.status_code"], "200");
    assert_eq!(server.attributes["url.path"], "/path");
    assert_eq!(
        client.attributes["url.full"],
        format!("http://127.0.0.1:{}/path", app.port())
    );
    assert!(
        by_name.values().all(|s| s.service == "hello"),
        "{by_name:#?}"
    );

    // W3C only: current Knative sends no B3.
    let seen = app.only();
    assert_eq!(
        header(&seen, "traceparent"),
        traceparent(TRACE, &client.id, "01")
    );
    assert_eq!(header(&seen, "x-b3-traceid"), "");
}

#[tokio::test(flavor = "multi_thread")]
async fn current_knative_over_http_honours_the_parent_s_sampling_decision() {
    let app = App::hello().await;
    let (collector, spans) = otlp_http().await;
    let qp = QProxy::start_env(&current_env(
        &app,
        "http/protobuf",
        &format!("http://{collector}"),
        0.5,
    ));
    let unsampled = "11111111111111111111111111111111";
    for (trace, flags) in [(unsampled, "00"), (TRACE, "01")] {
        let incoming = traceparent(trace, PARENT, flags);
        let res = h1(qp.main, get("/", &[("traceparent", &incoming)])).await;
        res.collect().await.unwrap();
    }
    trace_spans(&spans, TRACE, 4).await;
    // Spans go out in the order they end: the unsampled request's would
    // have come first.
    assert!(spans.lock().unwrap().iter().all(|s| s.trace != unsampled));
    // Its context still reaches the app, unsampled.
    let first = &app.seen()[0];
    let tp = header(first, "traceparent");
    assert!(
        tp.starts_with(&format!("00-{unsampled}-")) && tp.ends_with("-00"),
        "{tp}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_tracing_the_app_gets_the_client_s_headers_untouched() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    let incoming = traceparent(TRACE, PARENT, "01");
    h1(
        qp.main,
        get(
            "/",
            &[
                ("traceparent", &incoming),
                ("X-B3-SpanId", "a2fb4a1d1a96d312"),
            ],
        ),
    )
    .await
    .collect()
    .await
    .unwrap();
    let seen = app.only();
    assert_eq!(header(&seen, "traceparent"), incoming);
    assert_eq!(header(&seen, "x-b3-spanid"), "a2fb4a1d1a96d312");
    assert_eq!(header(&seen, "x-b3-traceid"), "");
}
