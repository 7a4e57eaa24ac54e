//! Current Knative's request metrics over OTLP, received by a gRPC
//! collector run here: names, units, scopes, counts and the resource.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::metric;
use qproxy_test_support::*;
use tokio::net::TcpListener;

type Batches = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

struct Collector(Batches);

#[tonic::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// (scope, metric name, unit) → the histogram count or gauge value of
/// the latest batch, summed over its points.
fn latest(batches: &Batches) -> HashMap<(String, String, String), f64> {
    let mut out = HashMap::new();
    if let Some(batch) = batches.lock().unwrap().last() {
        for rm in &batch.resource_metrics {
            for sm in &rm.scope_metrics {
                let scope = sm
                    .scope
                    .as_ref()
                    .map(|s| s.name.clone())
                    .unwrap_or_default();
                for m in &sm.metrics {
                    let value = match &m.data {
                        Some(metric::Data::Histogram(h)) => {
                            h.data_points.iter().map(|p| p.count as f64).sum()
                        }
                        Some(metric::Data::Gauge(g)) => g
                            .data_points
                            .iter()
                            .map(|p| match p.value {
                                Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(i)) => i as f64,
                                Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(d)) => d,
                                None => 0.0,
                            })
                            .sum(),
                        _ => 0.0,
                    };
                    out.insert((scope.clone(), m.name.clone(), m.unit.clone()), value);
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn current_knative_exports_request_metrics_over_otlp() {
    let app = App::hello().await;
    let batches = Batches::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(Collector(batches.clone())))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut env = knative_env(app.port());
    env.retain(|(k, _)| k != "CONTAINER_CONCURRENCY");
    env.push(("CONTAINER_CONCURRENCY".to_owned(), "1".to_owned()));
    let observability = serde_json::json!({
        "requestMetrics": {
            "protocol": "grpc",
            "endpoint": format!("http://{addr}"),
            "exportInterval": 200_000_000u64,
        },
    });
    env.push(("OBSERVABILITY_CONFIG".to_owned(), observability.to_string()));
    let qp = QProxy::start_env(&env);
    for _ in 0..3 {
        h1(qp.main, get("/", &[])).await.collect().await.unwrap();
    }
    kubelet_health(qp.main).await;

    let http = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp";
    let queue = "knative.dev/serving/pkg/queue";
    let key =
        |scope: &str, name: &str, unit: &str| (scope.to_owned(), name.to_owned(), unit.to_owned());
    let deadline = Instant::now() + DEADLINE;
    let got = loop {
        let got = latest(&batches);
        if got.get(&key(queue, "kn.serving.invocation.duration", "s")) == Some(&3.0) {
            break got;
        }
        assert!(Instant::now() < deadline, "{got:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for (scope, name, unit) in [
        (http, "http.server.request.duration", "s"),
        (http, "http.server.request.body.size", "By"),
        (http, "http.server.response.body.size", "By"),
        (http, "http.client.request.duration", "s"),
        (http, "http.client.request.body.size", "By"),
    ] {
        assert_eq!(
            got.get(&key(scope, name, unit)),
            Some(&3.0),
            "{name}: {got:#?}"
        );
    }
    assert_eq!(
        got.get(&key(queue, "kn.serving.queue.depth", "{request}")),
        Some(&1.0)
    );
    let batch = batches.lock().unwrap().last().cloned().unwrap();
    let service = batch.resource_metrics[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .find(|a| a.key == "service.name")
        .and_then(|a| a.value.clone())
        .and_then(|v| v.value);
    assert_eq!(
        service,
        Some(any_value::Value::StringValue("hello".to_owned()))
    );
}
