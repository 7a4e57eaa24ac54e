//! Current Knative's request metrics over OTLP, received by a gRPC
//! collector run here: names, units, scopes, counts and the resource.

use http_body_util::BodyExt;
use opentelemetry_proto::tonic::common::v1::any_value;
use qproxy_test_support::collector::{latest_metrics, otlp_grpc};
use qproxy_test_support::*;

#[tokio::test(flavor = "multi_thread")]
async fn current_knative_exports_request_metrics_over_otlp() {
    let app = App::hello().await;
    let collector = otlp_grpc().await;
    let (addr, batches) = (collector.addr, collector.metrics);
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
    let got = until(
        "three invocations and the ready span exported",
        async || {
            let got = latest_metrics(&batches);
            let spans = got.contains_key(&key("qproxy", "qproxy.startup.app_ready", "s"));
            if got.get(&key(queue, "kn.serving.invocation.duration", "s")) == Some(&3.0) && spans {
                Ok(got)
            } else {
                Err(got)
            }
        },
    )
    .await;
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
    // The queue's waits, and the start-up's spans: qproxy's own, in a
    // scope of their own.
    assert_eq!(
        got.get(&key("qproxy", "qproxy.queue.wait", "s")),
        Some(&3.0),
        "{got:#?}"
    );
    for name in ["qproxy.startup.app_ready", "qproxy.startup.first_request"] {
        let took = got.get(&key("qproxy", name, "s"));
        assert!(took.is_some_and(|s| *s > 0.0), "{name}: {got:#?}");
    }
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
