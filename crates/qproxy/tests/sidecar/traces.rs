//! Traces: the spans each Knative generation makes for a proxied request,
//! received by collectors run here (Zipkin for classic Knative, OTLP over
//! gRPC and HTTP for current Knative), their parent/child relations, and
//! the trace context the app receives.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use qproxy_test_support::*;
use serde_json::Value;
use tokio::net::TcpListener;

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT: &str = "b7ad6b7169203331";

/// A span as received, whatever the format.
#[derive(Debug, Clone)]
struct Got {
    trace: String,
    id: String,
    parent: String,
    name: String,
    kind: String,
    attributes: HashMap<String, String>,
    service: String,
}

type Spans = Arc<Mutex<Vec<Got>>>;

async fn serve_http(
    handler: impl Fn(
        Request<Incoming>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
    + Clone
    + Send
    + Sync
    + 'static,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let handler = handler.clone();
                    async move {
                        handler(req).await;
                        Ok::<_, std::convert::Infallible>(Response::new(empty()))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// A Zipkin collector: `POST /api/v2/spans` with a JSON array.
async fn zipkin() -> (SocketAddr, Spans) {
    let spans = Spans::default();
    let sink = spans.clone();
    let addr = serve_http(move |req| {
        let sink = sink.clone();
        Box::pin(async move {
            assert_eq!(req.uri().path(), "/api/v2/spans");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let batch: Vec<Value> = serde_json::from_slice(&body).unwrap();
            let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
            sink.lock().unwrap().extend(batch.iter().map(|s| {
                Got {
                    trace: text(&s["traceId"]),
                    id: text(&s["id"]),
                    parent: text(&s["parentId"]),
                    name: text(&s["name"]),
                    kind: text(&s["kind"]),
                    attributes: s["tags"]
                        .as_object()
                        .map(|t| t.iter().map(|(k, v)| (k.clone(), text(v))).collect())
                        .unwrap_or_default(),
                    service: format!(
                        "{}@{}",
                        text(&s["localEndpoint"]["serviceName"]),
                        text(&s["localEndpoint"]["ipv4"])
                    ),
                }
            }));
        })
    })
    .await;
    (addr, spans)
}

fn otlp_spans(req: ExportTraceServiceRequest) -> Vec<Got> {
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let value = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
        .as_ref()
        .and_then(|v| v.value.clone())
    {
        Some(any_value::Value::StringValue(s)) => s,
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    };
    let mut out = Vec::new();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .map(|a| value(&a.value))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Got {
                    trace: hex(&s.trace_id),
                    id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    name: s.name.clone(),
                    kind: format!("{:?}", s.kind()),
                    attributes: s
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), value(&a.value)))
                        .collect(),
                    service: service.clone(),
                });
            }
        }
    }
    out
}

struct Collector(Spans);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .unwrap()
            .extend(otlp_spans(request.into_inner()));
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP collector over gRPC.
async fn otlp_grpc() -> (SocketAddr, Spans) {
    let spans = Spans::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = TraceServiceServer::new(Collector(spans.clone()));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, spans)
}

/// An OTLP collector over HTTP/protobuf: `POST /v1/traces`.
async fn otlp_http() -> (SocketAddr, Spans) {
    let spans = Spans::default();
    let sink = spans.clone();
    let addr = serve_http(move |req| {
        let sink = sink.clone();
        Box::pin(async move {
            assert_eq!(req.uri().path(), "/v1/traces");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let request = ExportTraceServiceRequest::decode(body).unwrap();
            sink.lock().unwrap().extend(otlp_spans(request));
        })
    })
    .await;
    (addr, spans)
}

/// Waits until `n` spans of `trace` have arrived; returns them by name
/// (and kind, for the HTTP ones: classic Knative names both after the
/// path).
async fn trace_spans(spans: &Spans, trace: &str, n: usize) -> HashMap<String, Got> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let got: Vec<Got> = spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace == trace)
            .cloned()
            .collect();
        if got.len() >= n {
            assert_eq!(got.len(), n, "{got:#?}");
            return got
                .into_iter()
                .map(|s| match s.kind.to_ascii_uppercase().as_str() {
                    kind @ ("SERVER" | "CLIENT") => (format!("{kind} {}", s.name), s),
                    _ => (s.name.clone(), s),
                })
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} spans of {trace}: {:#?}",
            got.len(),
            spans.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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
    let (collector, spans) = otlp_grpc().await;
    let qp = QProxy::start_env(&current_env(
        &app,
        "grpc",
        &format!("http://{collector}"),
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
