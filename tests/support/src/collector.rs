//! Collectors of what qproxy (and Knative's queue-proxy) export, run on
//! loopback and keeping what they receive: OTLP over gRPC (traces and
//! metrics), OTLP traces over HTTP, and Zipkin spans.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::metric;
use prost::Message;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::tls::TestCa;
use crate::{empty, until};

/// A span as received, whatever the format.
#[derive(Debug, Clone)]
pub struct Span {
    /// Trace ID, hex.
    pub trace: String,
    /// Span ID, hex.
    pub id: String,
    /// Parent span ID, hex (empty for a root).
    pub parent: String,
    /// Name.
    pub name: String,
    /// Kind (`SERVER`, `Client`, ...: as the format writes it).
    pub kind: String,
    /// Attributes (tags), as text.
    pub attributes: HashMap<String, String>,
    /// The service: Zipkin's `serviceName@ipv4`, OTLP's `service.name`.
    pub service: String,
    /// OTLP: the resource's attributes, as text.
    pub resource: HashMap<String, String>,
    /// OTLP: the instrumentation scope, `name@version`.
    pub scope: String,
}

/// The spans a collector has received.
pub type Spans = Arc<Mutex<Vec<Span>>>;

/// The metric exports a collector has received, whole.
pub type MetricBatches = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

async fn serve_http(
    tls: Option<Arc<rustls::ServerConfig>>,
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
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let handler = handler.clone();
                    async move {
                        handler(req).await;
                        Ok::<_, std::convert::Infallible>(Response::new(empty()))
                    }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match tls {
                    Some(tls) => {
                        let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await
                        else {
                            return;
                        };
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                }
            });
        }
    });
    addr
}

/// A Zipkin collector: `POST /api/v2/spans` with a JSON array.
pub async fn zipkin() -> (SocketAddr, Spans) {
    let spans = Spans::default();
    let sink = spans.clone();
    let addr = serve_http(None, move |req| {
        let sink = sink.clone();
        Box::pin(async move {
            assert_eq!(req.uri().path(), "/api/v2/spans");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let batch: Vec<Value> = serde_json::from_slice(&body).unwrap();
            let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
            sink.lock().unwrap().extend(batch.iter().map(|s| {
                Span {
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
                    resource: HashMap::new(),
                    scope: String::new(),
                }
            }));
        })
    })
    .await;
    (addr, spans)
}

/// The spans of one OTLP export.
fn otlp_spans(req: ExportTraceServiceRequest) -> Vec<Span> {
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
        let resource: HashMap<String, String> = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .map(|a| (a.key.clone(), value(&a.value)))
            .collect();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for ss in rs.scope_spans {
            let scope = ss
                .scope
                .as_ref()
                .map(|s| s.name.clone())
                .unwrap_or_default();
            for s in ss.spans {
                out.push(Span {
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
                    resource: resource.clone(),
                    scope: scope.clone(),
                });
            }
        }
    }
    out
}

/// An OTLP collector over gRPC, for traces and metrics.
#[derive(Debug, Clone)]
pub struct OtlpCollector {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The spans received.
    pub spans: Spans,
    /// The metric exports received.
    pub metrics: MetricBatches,
    /// The metadata (headers) of every export received.
    pub headers: Headers,
}

/// The headers of the exports a collector received.
pub type Headers = Arc<Mutex<Vec<http::HeaderMap>>>;

struct Traces(Spans, Headers);

#[tonic::async_trait]
impl TraceService for Traces {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.1
            .lock()
            .unwrap()
            .push(request.metadata().clone().into_headers());
        self.0
            .lock()
            .unwrap()
            .extend(otlp_spans(request.into_inner()));
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

struct Metrics(MetricBatches, Headers);

#[tonic::async_trait]
impl MetricsService for Metrics {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.1
            .lock()
            .unwrap()
            .push(request.metadata().clone().into_headers());
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// Starts an OTLP collector over gRPC, for traces and metrics.
pub async fn otlp_grpc() -> OtlpCollector {
    start_grpc(None).await
}

/// The same over TLS, with `ca`'s server certificate; with `client_auth`,
/// the client must present a certificate `ca` signed.
pub async fn otlp_grpc_tls(ca: &TestCa, client_auth: bool) -> OtlpCollector {
    let mut tls = tonic::transport::ServerTlsConfig::new().identity(
        tonic::transport::Identity::from_pem(&ca.server_cert_pem, &ca.server_key_pem),
    );
    if client_auth {
        tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(&ca.ca_pem));
    }
    start_grpc(Some(tls)).await
}

async fn start_grpc(tls: Option<tonic::transport::ServerTlsConfig>) -> OtlpCollector {
    // tonic's TLS takes rustls's process default, which two providers
    // linked in (ring, and aws-lc-rs for qproxy's TLS port) leave unset.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = OtlpCollector {
        addr: listener.local_addr().unwrap(),
        spans: Spans::default(),
        metrics: MetricBatches::default(),
        headers: Headers::default(),
    };
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls).unwrap();
    }
    tokio::spawn(
        server
            .add_service(TraceServiceServer::new(Traces(
                collector.spans.clone(),
                collector.headers.clone(),
            )))
            .add_service(MetricsServiceServer::new(Metrics(
                collector.metrics.clone(),
                collector.headers.clone(),
            )))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    collector
}

/// An OTLP collector over HTTP/protobuf: `POST /v1/traces`.
pub async fn otlp_http() -> (SocketAddr, Spans) {
    otlp_http_over(None).await
}

/// The same over TLS, with `ca`'s server certificate; with `client_auth`,
/// the client must present a certificate `ca` signed.
pub async fn otlp_http_tls(ca: &TestCa, client_auth: bool) -> (SocketAddr, Spans) {
    otlp_http_over(Some(ca.server_config(client_auth))).await
}

async fn otlp_http_over(tls: Option<Arc<rustls::ServerConfig>>) -> (SocketAddr, Spans) {
    let spans = Spans::default();
    let sink = spans.clone();
    let addr = serve_http(tls, move |req| {
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
pub async fn trace_spans(spans: &Spans, trace: &str, n: usize) -> HashMap<String, Span> {
    let got = until(&format!("{n} spans of {trace}"), async || {
        let got: Vec<Span> = spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace == trace)
            .cloned()
            .collect();
        if got.len() >= n {
            Ok(got)
        } else {
            Err(spans.lock().unwrap().clone())
        }
    })
    .await;
    assert_eq!(got.len(), n, "{got:#?}");
    got.into_iter()
        .map(|s| match s.kind.to_ascii_uppercase().as_str() {
            kind @ ("SERVER" | "CLIENT") => (format!("{kind} {}", s.name), s),
            _ => (s.name.clone(), s),
        })
        .collect()
}

/// (scope, metric name, unit) → the histogram count or gauge value of
/// the latest batch, summed over its points.
pub fn latest_metrics(batches: &MetricBatches) -> HashMap<(String, String, String), f64> {
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
