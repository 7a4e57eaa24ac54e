//! Current Knative's exporters as its setup configures them: collectors
//! reached over TLS (verified with a CA file, with a client certificate),
//! endpoints without a scheme, and the `OTEL_*` variables Knative honours
//! (endpoints, headers, service name, resource attributes, sampler,
//! intervals).

use http_body_util::BodyExt;
use qproxy_test_support::collector::{
    MetricBatches, OtlpCollector, latest_metrics, otlp_grpc, otlp_grpc_tls, otlp_http_tls,
    trace_spans,
};
use qproxy_test_support::tls::TestCa;
use qproxy_test_support::*;
use serde_json::json;

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// Current Knative's environment for `app`, tracing everything to
/// `endpoint` over `protocol`, spans sent every 100 ms
/// (`OTEL_BSP_SCHEDULE_DELAY`, which the SDK honours as Go's does), and
/// `extra` variables.
fn tracing_env(
    app: &App,
    protocol: &str,
    endpoint: &str,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let env = with_observability(
        current_knative_env(app.port()),
        &json!({"tracing": {"protocol": protocol, "endpoint": endpoint, "samplingRate": 1.0}}),
    );
    let env = with_vars(env, &[("OTEL_BSP_SCHEDULE_DELAY", "100")]);
    with_vars(env, extra)
}

/// One request with a sampled `TRACE` parent.
async fn traced(qp: &QProxy) {
    let parent = format!("00-{TRACE}-b7ad6b7169203331-01");
    let res = h1(qp.main, get("/", &[("traceparent", &parent)])).await;
    res.collect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn traces_reach_a_grpc_collector_over_tls_verified_with_the_ca_file() {
    let ca = TestCa::new("grpc");
    let collector = otlp_grpc_tls(&ca, false).await;
    let app = App::hello().await;
    let ca_file = ca.file("ca.pem");
    // `localhost:PORT`: no scheme, so https, as Knative reads it.
    let endpoint = format!("localhost:{}", collector.addr.port());
    let qp = QProxy::start_env(&tracing_env(
        &app,
        "grpc",
        &endpoint,
        &[("OTEL_EXPORTER_OTLP_CERTIFICATE", ca_file.to_str().unwrap())],
    ));
    traced(&qp).await;
    let spans = trace_spans(&collector.spans, TRACE, 3).await;
    assert!(spans.contains_key("SERVER GET"), "{spans:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn traces_reach_an_http_collector_over_mutual_tls() {
    let ca = TestCa::new("mtls");
    let (addr, spans) = otlp_http_tls(&ca, true).await;
    let app = App::hello().await;
    let files = ["ca.pem", "client.pem", "client.key"].map(|f| ca.file(f));
    let [ca_file, cert, key] = files.each_ref().map(|f| f.to_str().unwrap());
    let qp = QProxy::start_env(&tracing_env(
        &app,
        "http/protobuf",
        &format!("https://127.0.0.1:{}", addr.port()),
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", ca_file),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", cert),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", key),
        ],
    ));
    traced(&qp).await;
    trace_spans(&spans, TRACE, 3).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_environment_s_endpoint_headers_name_and_attributes_win() {
    let collector = otlp_grpc().await;
    let app = App::hello().await;
    let qp = QProxy::start_env(&tracing_env(
        &app,
        "grpc",
        // Nothing listens there: the environment names the collector.
        &format!("http://127.0.0.1:{}", closed_port()),
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                &format!("http://{}", collector.addr),
            ),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=secret"),
            ("OTEL_SERVICE_NAME", "from-env"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=test,k8s.namespace.name=other",
            ),
        ],
    ));
    traced(&qp).await;
    let spans = trace_spans(&collector.spans, TRACE, 3).await;
    let resource = &spans["SERVER GET"].resource;
    assert_eq!(resource["service.name"], "from-env");
    assert_eq!(resource["deployment.environment"], "test");
    // Knative's own attributes win over the environment's.
    assert_eq!(resource["k8s.namespace.name"], "default");
    let headers = collector.headers.lock().unwrap();
    assert!(
        headers.iter().all(|h| h["x-api-key"] == "secret"),
        "{headers:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sampler_argument_of_one_samples_everything_as_knative_s_does() {
    let collector = otlp_grpc().await;
    let app = App::hello().await;
    let env = with_observability(
        current_knative_env(app.port()),
        &json!({"tracing": {
            "protocol": "grpc",
            "endpoint": format!("http://{}", collector.addr),
            "samplingRate": 0.5,
        }}),
    );
    let env = with_vars(
        env,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_TRACES_SAMPLER_ARG", "1"),
        ],
    );
    let qp = QProxy::start_env(&env);
    // A parent that was not sampled: the argument samples it all the same.
    let parent = format!("00-{TRACE}-b7ad6b7169203331-00");
    let res = h1(qp.main, get("/", &[("traceparent", &parent)])).await;
    res.collect().await.unwrap();
    trace_spans(&collector.spans, TRACE, 3).await;

    // One that is not a number stops the start, naming the variable.
    let env = with_vars(env, &[("OTEL_TRACES_SAMPLER_ARG", "half")]);
    let out = run_to_exit(&env);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("qproxy: OTEL_TRACES_SAMPLER_ARG=\"half\" is invalid"),
        "{stderr}"
    );
}

/// Waits until `batches` holds an export with `name` measured.
async fn exported(batches: &MetricBatches, name: &str) {
    until(&format!("{name} exported"), async || {
        latest_metrics(batches).keys().any(|(_, n, _)| n == name)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_environment_s_export_interval_replaces_the_configuration_s() {
    let collector: OtlpCollector = otlp_grpc().await;
    let app = App::hello().await;
    let env = with_observability(
        current_knative_env(app.port()),
        &json!({"requestMetrics": {
            "protocol": "grpc",
            "endpoint": format!("http://{}", collector.addr),
            // A minute: longer than any wait here.
            "exportInterval": 60_000_000_000u64,
        }}),
    );
    let qp = QProxy::start_env(&with_vars(env, &[("OTEL_METRIC_EXPORT_INTERVAL", "100")]));
    h1(qp.main, get("/", &[])).await.collect().await.unwrap();
    exported(&collector.metrics, "http.server.request.duration").await;
}
