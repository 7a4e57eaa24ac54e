//! Current Knative's observability, side by side with its queue-proxy
//! (serving v0.50.0) for the same requests: the Prometheus exposition on
//! 9091, the OTLP metrics and traces a collector receives, and the request
//! log lines. What differs on purpose is listed in docs/differences.md and
//! set aside here by name; anything else that differs fails.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;

use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{Metric, metric};
use qproxy_test_support::collector::{MetricBatches, OtlpCollector, Span, otlp_grpc, trace_spans};
use qproxy_test_support::*;
use serde_json::json;

/// The Go families current Knative's exposition and export carry that
/// qproxy has no counterpart for (docs/differences.md, `metrics-current`).
fn go_only(name: &str) -> bool {
    ["go_", "process_", "promhttp_", "go."]
        .iter()
        .any(|p| name.starts_with(p))
}

/// qproxy's own additions (docs/options.md), which Go has no counterpart
/// for: left out of the comparison, as the conformance suite leaves out
/// the `qproxy_` families on 9091.
fn qproxy_only(name: &str) -> bool {
    name.starts_with("qproxy.")
}

/// The revision of these tests: current Knative's stock environment with
/// `containerConcurrency` 2 (so that the queue depth is recorded) and
/// `observability` patched in.
fn env(app: &App, observability: serde_json::Value) -> Vec<(String, String)> {
    let env = with_vars(
        current_knative_env(app.port()),
        &[("CONTAINER_CONCURRENCY", "2")],
    );
    with_observability(env, &observability)
}

/// Every `server_port` label or attribute of `port` reads `MAIN`: each
/// proxy listens on a port of its own.
fn main_port(text: &str, port: u16) -> String {
    text.replace(&format!("server_port=\"{port}\""), "server_port=\"MAIN\"")
}

/// The lines of an exposition that do not depend on how fast each proxy
/// is, nor on which one it is: HELP and TYPE, counts, every size bucket,
/// every duration bucket's series without its count (which bucket a
/// request falls into depends on the machine's load), gauges; without
/// qproxy's additions and the families only Go has, and `target_info`
/// (compared apart).
fn stable_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = without_additions(text)
        .lines()
        .filter(|l| !l.is_empty())
        .filter(|l| {
            let name = l
                .strip_prefix("# HELP ")
                .or_else(|| l.strip_prefix("# TYPE "))
                .unwrap_or(l);
            !go_only(name) && !name.starts_with("target_info")
        })
        .filter(|l| !l.contains("_sum{"))
        .map(|l| match l.rsplit_once(' ') {
            Some((series, _)) if l.contains("_seconds_bucket{") && !l.contains("le=\"+Inf\"") => {
                series.to_owned()
            }
            _ => l.to_owned(),
        })
        .collect();
    lines.sort();
    lines
}

/// The sum of the `http_server_request_duration_seconds_count` samples:
/// the requests measured so far.
fn measured(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("http_server_request_duration_seconds_count{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The requests of the metrics mix.
const MIX: usize = 7;

/// Scrapes `metrics` until `requests` requests are measured and two
/// scrapes in a row read the same: a request's instruments are recorded
/// one after another, and a scrape can fall between them.
async fn scrape_measured(metrics: SocketAddr, requests: usize) -> String {
    let what = format!("{requests} requests measured, two scrapes alike");
    let mut before = Vec::new();
    until(&what, async || {
        let text = scrape(metrics).await;
        let now = stable_lines(&text);
        let settled = measured(&text) >= requests as f64 && now == before;
        before = now;
        if settled { Ok(text) } else { Err(text) }
    })
    .await
}

/// Lines in one list and not the other, for a readable failure.
fn diff(got: &[String], want: &[String]) -> String {
    let (got, want): (BTreeSet<_>, BTreeSet<_>) = (got.iter().collect(), want.iter().collect());
    let only_go: Vec<_> = want.difference(&got).collect();
    let only_qproxy: Vec<_> = got.difference(&want).collect();
    format!("only Go's: {only_go:#?}\nonly qproxy's: {only_qproxy:#?}")
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn the_exposition_matches_the_go_queue_proxy() {
    let [want, got] = expositions(play_metrics_mix, MIX).await;
    let (got, want) = (stable_lines(&got), stable_lines(&want));
    assert!(got == want, "{}", diff(&got, &want));
}

/// The Prometheus expositions of Knative's Go queue-proxy, then of
/// qproxy, once the `requests` that `play` sends through each are
/// measured, each with its main port read as `MAIN`.
async fn expositions<F: Future<Output = ()>>(
    play: impl Fn(SocketAddr) -> F,
    requests: usize,
) -> [String; 2] {
    let app = App::varied().await;
    let env = env(&app, json!({"requestMetrics": {"protocol": "prometheus"}}));
    let go = GoQueueProxy::start(&env).await;
    play(go.main).await;
    let want = scrape_measured(SocketAddr::from(([127, 0, 0, 1], 9091)), requests).await;
    let want = main_port(&want, go.main.port());
    drop(go);

    let qp = QProxy::start_env(&env);
    play(qp.main).await;
    let got = scrape_measured(qp.metrics.expect("the metrics port"), requests).await;
    [want, main_port(&got, qp.main.port())]
}

/// Requests with this many hosts: more than the 2,000 attribute sets Go's
/// OpenTelemetry SDK keeps for an instrument.
const HOSTS: usize = 2050;

/// One request to `main` for each of [`HOSTS`] hosts.
async fn play_hosts(main: SocketAddr) {
    for i in 0..HOSTS {
        let host = format!("h{i}.example.com");
        let res = h1(main, get("/ok", &[("Host", host.as_str())])).await;
        assert_eq!(res.status(), 200, "{host}");
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn hosts_past_go_s_cardinality_limit_share_its_overflow_series() {
    let [want, got] = expositions(play_hosts, HOSTS).await;
    let overflow = format!(
        "http_server_request_duration_seconds_count{{otel_metric_overflow=\"true\",{}}} {}",
        "otel_scope_name=\"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp\",\
         otel_scope_schema_url=\"\",otel_scope_version=\"0.69.0\"",
        HOSTS - 1999
    );
    assert!(
        got.lines().any(|l| l == overflow),
        "no {overflow} in qproxy's exposition"
    );
    let (got, want) = (stable_lines(&got), stable_lines(&want));
    assert!(got == want, "{}", diff(&got, &want));
}

/// What the comparison of OTLP metrics looks at in one export: per metric
/// (scope, name), its description, unit and kind, its buckets, and per
/// point its attributes and count (or value).
fn metric_shape(batches: &MetricBatches, main: u16) -> BTreeMap<String, String> {
    let guard = batches.lock().unwrap();
    guard
        .last()
        .map_or_else(BTreeMap::new, |batch| export_shape(batch, main))
}

/// [`metric_shape`] of one export.
fn export_shape(batch: &ExportMetricsServiceRequest, main: u16) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for rm in &batch.resource_metrics {
        for sm in &rm.scope_metrics {
            let scope = sm
                .scope
                .as_ref()
                .map_or(String::new(), |s| format!("{}@{}", s.name, s.version));
            for m in &sm.metrics {
                if go_only(&m.name) || qproxy_only(&m.name) {
                    continue;
                }
                let key = format!("{scope} {}", m.name);
                out.insert(
                    format!("{key} about"),
                    format!("{:?} {:?} {}", m.description, m.unit, kind(m)),
                );
                for (attributes, value) in points(m) {
                    let attributes =
                        attributes.replace(&format!("server.port={main}"), "server.port=MAIN");
                    out.insert(format!("{key} {{{attributes}}}"), value);
                }
            }
        }
    }
    out
}

fn kind(m: &Metric) -> String {
    match &m.data {
        Some(metric::Data::Histogram(h)) => format!(
            "histogram {:?} bounds {:?}",
            h.aggregation_temporality,
            h.data_points.first().map(|p| p.explicit_bounds.clone())
        ),
        Some(metric::Data::Gauge(_)) => "gauge".to_owned(),
        Some(metric::Data::Sum(s)) => {
            format!("sum {:?} {}", s.aggregation_temporality, s.is_monotonic)
        }
        other => format!("{other:?}"),
    }
}

fn text_of(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> String {
    let mut kvs: Vec<String> = kvs
        .iter()
        .map(|kv| format!("{}={}", kv.key, text_of(&kv.value)))
        .collect();
    kvs.sort();
    kvs.join(",")
}

/// Each point of `m`: its attributes, and its count (histograms) or value.
fn points(m: &Metric) -> Vec<(String, String)> {
    match &m.data {
        Some(metric::Data::Histogram(h)) => h
            .data_points
            .iter()
            .map(|p| (attributes(&p.attributes), format!("count {}", p.count)))
            .collect(),
        Some(metric::Data::Gauge(g)) => g
            .data_points
            .iter()
            .map(|p| (attributes(&p.attributes), format!("{:?}", p.value)))
            .collect(),
        Some(metric::Data::Sum(s)) => s
            .data_points
            .iter()
            .map(|p| (attributes(&p.attributes), format!("{:?}", p.value)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The attributes of the resource of the latest export.
fn metrics_resource(batches: &MetricBatches) -> BTreeMap<String, String> {
    let guard = batches.lock().unwrap();
    guard
        .last()
        .into_iter()
        .flat_map(|b| &b.resource_metrics)
        .flat_map(|rm| rm.resource.iter().flat_map(|r| &r.attributes))
        .map(|kv| (kv.key.clone(), text_of(&kv.value)))
        .collect()
}

/// Waits until `collector` has an export in which `requests` requests
/// are measured and which is the same as the export before it.
///
/// A request's instruments are recorded one after another, so an export
/// can fall between them: its server duration already counts the last
/// request while its body sizes do not yet. Two equal exports in a row
/// mean every instrument has caught up.
async fn exported(collector: &OtlpCollector, requests: usize) {
    let what = format!("{requests} requests exported, two exports alike");
    until(&what, async || {
        let guard = collector.metrics.lock().unwrap();
        let measured: u64 = guard
            .last()
            .into_iter()
            .flat_map(|b| &b.resource_metrics)
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .filter(|m| m.name == "http.server.request.duration")
            .map(|m| match &m.data {
                Some(metric::Data::Histogram(h)) => h.data_points.iter().map(|p| p.count).sum(),
                _ => 0,
            })
            .sum();
        // Only then are the exports compared: the shapes are large.
        measured >= requests as u64
            && match guard.as_slice() {
                [.., before, last] => export_shape(before, 0) == export_shape(last, 0),
                _ => false,
            }
    })
    .await;
}

/// The resource attributes that differ on purpose (docs/differences.md,
/// `metrics-current`): the SDK's, the version, and the pod, which Knative
/// leaves empty.
const RESOURCE_DIFFERENCES: [&str; 6] = [
    "telemetry.sdk.language",
    "telemetry.sdk.name",
    "telemetry.sdk.version",
    "service.version",
    "k8s.pod.name",
    "service.instance.id",
];

/// The revision of these tests, its request metrics exported over OTLP
/// (gRPC) to `collector` every 200 ms.
fn otlp_env(app: &App, collector: &OtlpCollector) -> Vec<(String, String)> {
    env(
        app,
        json!({"requestMetrics": {
            "protocol": "grpc",
            "endpoint": format!("http://{}", collector.addr),
            "exportInterval": 200_000_000u64,
        }}),
    )
}

/// A metric shape and a resource, as [`metric_shape`] and
/// [`metrics_resource`] read an export.
type Export = (BTreeMap<String, String>, BTreeMap<String, String>);

/// The OTLP metrics exports of Knative's Go queue-proxy, then of qproxy,
/// once the `requests` that `play` sends through each are measured.
async fn otlp_exports<F: Future<Output = ()>>(
    play: impl Fn(SocketAddr) -> F,
    requests: usize,
) -> [Export; 2] {
    let app = App::varied().await;
    let go_collector = otlp_grpc().await;
    let go = GoQueueProxy::start(&otlp_env(&app, &go_collector)).await;
    play(go.main).await;
    exported(&go_collector, requests).await;
    let want = (
        metric_shape(&go_collector.metrics, go.main.port()),
        metrics_resource(&go_collector.metrics),
    );
    drop(go);

    let qp_collector = otlp_grpc().await;
    let qp = QProxy::start_env(&otlp_env(&app, &qp_collector));
    play(qp.main).await;
    exported(&qp_collector, requests).await;
    let got = (
        metric_shape(&qp_collector.metrics, qp.main.port()),
        metrics_resource(&qp_collector.metrics),
    );
    [want, got]
}

/// A metric shape as lines, for a readable difference.
fn shape_lines(shape: &BTreeMap<String, String>) -> Vec<String> {
    shape.iter().map(|(k, v)| format!("{k} = {v}")).collect()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn otlp_metrics_match_the_go_queue_proxy() {
    let [(want, want_resource), (got, got_resource)] = otlp_exports(play_metrics_mix, MIX).await;
    assert!(
        got == want,
        "{}",
        diff(&shape_lines(&got), &shape_lines(&want))
    );
    let keep = |r: &BTreeMap<String, String>| -> Vec<String> {
        r.iter()
            .filter(|(k, _)| !RESOURCE_DIFFERENCES.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    };
    assert_eq!(keep(&got_resource), keep(&want_resource));
    // The keys set aside are there in both.
    for key in RESOURCE_DIFFERENCES {
        assert!(got_resource.contains_key(key), "{key}: {got_resource:#?}");
        assert!(want_resource.contains_key(key), "{key}: {want_resource:#?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn otlp_hosts_past_go_s_cardinality_limit_share_its_overflow_point() {
    let [(want, _), (got, _)] = otlp_exports(play_hosts, HOSTS).await;
    assert!(
        got.keys().any(|k| k.contains("otel.metric.overflow")),
        "no overflow point in qproxy's export"
    );
    assert!(
        got == want,
        "{}",
        diff(&shape_lines(&got), &shape_lines(&want))
    );
}

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// One traced request through `main`, with `collector` receiving the
/// spans: each span by name, with its parent's name, kind, scope and
/// attributes, and the resource.
async fn traced(
    collector: &OtlpCollector,
    main: SocketAddr,
    app: u16,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let traceparent = format!("00-{TRACE}-b7ad6b7169203331-01");
    let res = h1(main, get("/path?q=1", &[("traceparent", &traceparent)])).await;
    res.collect().await.unwrap();
    let spans = trace_spans(&collector.spans, TRACE, 4).await;
    // A probe passed on to the app: no server span, but Knative's HTTP
    // client traces it, as a root.
    let res = h1(main, get("/probe", &[("K-Kubelet-Probe", "1")])).await;
    res.collect().await.unwrap();
    let probe = until("a span for the probe", async || {
        collector
            .spans
            .lock()
            .unwrap()
            .iter()
            .find(|s| {
                s.attributes
                    .get("url.full")
                    .is_some_and(|u| u.ends_with("/probe"))
            })
            .cloned()
    })
    .await;
    let spans: BTreeMap<String, Span> = spans
        .into_iter()
        .chain([("probe".to_owned(), probe)])
        .collect();
    let name_of = |id: &str| {
        spans
            .values()
            .find(|s| s.id == id)
            .map_or("(the client's)".to_owned(), |s| s.name.clone())
    };
    let mut shape = BTreeMap::new();
    let mut resource = BTreeMap::new();
    for span in spans.values() {
        let mut attributes: Vec<String> = span
            .attributes
            .iter()
            .map(|(k, v)| {
                let v = v
                    .replace(&main.port().to_string(), "MAIN")
                    .replace(&app.to_string(), "APP");
                // The client's own port differs from run to run.
                if k == "network.peer.port" || k == "client.port" {
                    format!("{k}=(a port)")
                } else {
                    format!("{k}={v}")
                }
            })
            .collect();
        attributes.sort();
        let name = if span.parent.is_empty() && span.kind == "Client" {
            format!("{} (a probe's)", span.name)
        } else {
            span.name.clone()
        };
        shape.insert(
            name,
            format!(
                "{} under {} in {}: {}",
                span.kind,
                name_of(&span.parent),
                span.scope,
                attributes.join(", ")
            ),
        );
        resource.extend(span.resource.clone());
    }
    (shape, resource)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn otlp_traces_match_the_go_queue_proxy() {
    let app = App::hello().await;
    // With the OpenTelemetry variables Knative's setup honours for the
    // resource: its own attributes win over the environment's.
    let tracing = |collector: &OtlpCollector| {
        let env = env(
            &app,
            json!({"tracing": {
                "protocol": "grpc",
                "endpoint": format!("http://{}", collector.addr),
                "samplingRate": 1.0,
            }}),
        );
        with_vars(
            env,
            &[
                ("OTEL_SERVICE_NAME", "from-env"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=test,k8s.namespace.name=other",
                ),
            ],
        )
    };
    let go_collector = otlp_grpc().await;
    let go = GoQueueProxy::start(&tracing(&go_collector)).await;
    let (want, want_resource) = traced(&go_collector, go.main, app.port()).await;
    drop(go);

    let qp_collector = otlp_grpc().await;
    let qp = QProxy::start_env(&tracing(&qp_collector));
    let (got, got_resource) = traced(&qp_collector, qp.main, app.port()).await;

    let lines = |m: &BTreeMap<String, String>| -> Vec<String> {
        m.iter().map(|(k, v)| format!("{k}: {v}")).collect()
    };
    assert!(got == want, "{}", diff(&lines(&got), &lines(&want)));
    let keep = |r: &BTreeMap<String, String>| -> Vec<String> {
        r.iter()
            .filter(|(k, _)| !RESOURCE_DIFFERENCES.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    };
    assert_eq!(keep(&got_resource), keep(&want_resource));
    assert_eq!(got_resource["service.name"], "from-env");
}
