//! Distributed traces, as each Knative generation makes them.
//!
//! Both generations trace a proxied request with four spans: a server span
//! for the request as it reached the queue-proxy, an internal span for the
//! proxying (classic `queue_proxy`, current `kn.queueproxy.proxy`), an
//! internal span for the wait for a `containerConcurrency` slot (classic
//! `queue_wait`, current `kn.queueproxy.wait`, only with a breaker), and a
//! client span for the request to the app, whose context goes to the app in
//! the request's headers.
//!
//! | | classic (`TRACING_CONFIG_*`) | current (`OBSERVABILITY_CONFIG.tracing`) |
//! |---|---|---|
//! | export | Zipkin v2 JSON to `TRACING_CONFIG_ZIPKIN_ENDPOINT`, local endpoint the pod (name and IP) | OTLP over gRPC or HTTP/protobuf to `endpoint` |
//! | server span | named after the path, OpenCensus' `http.*` attributes | named after the method, semantic-convention attributes |
//! | client span | named after the path, child of the proxy span | `HTTP <method>`, child of the wait span (if any) |
//! | accepted context | `traceparent`, else B3 (`X-B3-TraceId`, ...) | `traceparent` |
//! | sent to the app | `traceparent`, `tracestate`, `X-B3-TraceId`, `X-B3-SpanId`, `X-B3-Sampled` | `traceparent`, `tracestate` |
//! | sampling | a sampled parent, else the rate (`TRACING_CONFIG_DEBUG`: always) | parent-based with the rate; 1 or more: always; 0: never |
//!
//! Requests Knative counts as probes get no spans under current Knative;
//! kubelet probes get no proxy span under classic Knative. With tracing
//! off, none of this exists: the request path does not look at trace
//! headers, and those a client sent reach the app untouched.

pub mod layer;
pub mod zipkin;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, StatusCode};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, Sampler, SamplingDecision, SamplingResult, SdkTracer, SdkTracerProvider,
    ShouldSample,
};

use crate::config::{Observability, OtelEnv, TracingBackend, TracingProtocol};
use crate::export::{ExportError, Signal};
use crate::otlp::{Target, Transport};
use crate::semconv;
use crate::semconv::RouteTag;
use crate::traces::zipkin::ZipkinExporter;
use qproxy_core::config::{Generation, Revision};
use qproxy_core::headers::X_FORWARDED_FOR;

/// A span qproxy keeps until the request is done with.
pub type Span = opentelemetry_sdk::trace::Span;

/// The tracer of the main port; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Traces {
    provider: SdkTracerProvider,
    /// Knative's own spans (the proxy and the wait).
    tracer: SdkTracer,
    /// The server and client spans: under current Knative, otelhttp's.
    http_tracer: SdkTracer,
    generation: Generation,
    app: SocketAddr,
}

impl Traces {
    /// Tracing as `observability` asks for it, sending spans for requests
    /// to the app at `app`; `None` when tracing is off.
    pub fn new(
        observability: &Observability,
        revision: &Revision,
        app: SocketAddr,
    ) -> Result<Option<Self>, ExportError> {
        let (exporter, sampler, resource, delay): (
            Exporter,
            Option<TraceSampler>,
            Resource,
            Option<Duration>,
        ) = match observability {
            Observability::Classic(c) => {
                if c.tracing_backend != TracingBackend::Zipkin {
                    return Ok(None);
                }
                let endpoint = c.zipkin_endpoint.clone().unwrap_or_default();
                let uri = endpoint.parse::<http::Uri>().ok().filter(|u| {
                    u.scheme() == Some(&http::uri::Scheme::HTTP) && u.authority().is_some()
                });
                let Some(uri) = uri else {
                    // Knative's Zipkin reporter fails at each send,
                    // not at start; the pod serves either way.
                    tracing::warn!(
                        endpoint,
                        "TRACING_CONFIG_ZIPKIN_ENDPOINT is not an http:// URL; traces are off"
                    );
                    return Ok(None);
                };
                let exporter =
                    ZipkinExporter::new(uri, &revision.pod, revision.pod_ip.parse().ok());
                let sampler = Some(TraceSampler::Classic(OpenCensusSampler {
                    always: c.tracing_debug,
                    rate: c.sample_rate,
                }));
                (
                    Exporter::Zipkin(exporter),
                    sampler,
                    Resource::builder_empty().build(),
                    // Zipkin's reporter sends every second.
                    Some(Duration::from_secs(1)),
                )
            }
            Observability::Current(c) => {
                let t = &c.tracing;
                let transport = match t.protocol {
                    TracingProtocol::None | TracingProtocol::Stdout => return Ok(None),
                    TracingProtocol::Grpc => Transport::Grpc,
                    TracingProtocol::HttpProtobuf => Transport::HttpProtobuf,
                };
                let endpoint = t.endpoint.as_deref().unwrap_or("");
                let target = Target::new(Signal::Traces, transport, endpoint, &c.otel)?;
                // `OTEL_TRACES_SAMPLER` replaces Knative's sampler; the
                // SDK reads it.
                let sampler = (!c.otel.traces_sampler_from_env).then(|| {
                    let arg = c.otel.sampler_arg().ok().flatten();
                    TraceSampler::Current(current_sampler(t.sampling_rate, arg))
                });
                (
                    Exporter::Otlp(target.span_exporter()?),
                    sampler,
                    current_resource(revision, &c.otel),
                    // The SDK's batch delay (5 s, or
                    // `OTEL_BSP_SCHEDULE_DELAY`), as Go's.
                    None,
                )
            }
        };
        let mut batch = BatchConfigBuilder::default();
        if let Some(delay) = delay {
            batch = batch.with_scheduled_delay(delay);
        }
        let batch = batch.build();
        let processor = match exporter {
            Exporter::Zipkin(e) => BatchSpanProcessor::builder(e, Tokio)
                .with_batch_config(batch)
                .build(),
            Exporter::Otlp(e) => BatchSpanProcessor::builder(e, Tokio)
                .with_batch_config(batch)
                .build(),
        };
        let mut provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource);
        if let Some(sampler) = sampler {
            provider = provider.with_sampler(sampler);
        }
        let provider = provider.build();
        let tracer = provider.tracer(semconv::QUEUE_SCOPE);
        let http_tracer = match observability.generation() {
            Generation::Classic => tracer.clone(),
            Generation::Current => provider.tracer_with_scope(
                InstrumentationScope::builder(semconv::OTELHTTP_SCOPE)
                    .with_version(semconv::OTELHTTP_VERSION)
                    .build(),
            ),
        };
        Ok(Some(Traces {
            provider,
            tracer,
            http_tracer,
            generation: observability.generation(),
            app,
        }))
    }

    /// Sends the spans still buffered and stops.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!(error = %e, "trace export did not shut down cleanly");
        }
    }

    /// Which Knative's spans these are.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The trace context a request came with.
    pub fn extract(&self, headers: &HeaderMap) -> Context {
        let w3c = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        if self.generation == Generation::Current || w3c.span().span_context().is_valid() {
            return w3c;
        }
        // Classic Knative falls back to B3's separate headers.
        match b3(headers) {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => w3c,
        }
    }

    /// The server span of a request, child of the context it came with.
    pub fn server_span<B>(&self, req: &Request<B>, parent: &Context, remote: SocketAddr) -> Span {
        let headers = req.headers();
        let user_agent = headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let host = semconv::host(req);
        let mut attributes = Vec::with_capacity(10);
        let name: Cow<'static, str> = match self.generation {
            Generation::Classic => {
                attributes.extend([
                    KeyValue::new("http.path", req.uri().path().to_owned()),
                    KeyValue::new(
                        "http.url",
                        semconv::request_target(req.uri(), req.version()).into_owned(),
                    ),
                    KeyValue::new("http.host", host.to_owned()),
                    KeyValue::new("http.method", req.method().to_string()),
                ]);
                if !user_agent.is_empty() {
                    attributes.push(KeyValue::new("http.user_agent", user_agent.to_owned()));
                }
                Cow::Owned(req.uri().path().to_owned())
            }
            Generation::Current => {
                let (address, port) = semconv::split_host(host);
                // otelhttp's client: the first `X-Forwarded-For`, else the peer.
                let client = headers
                    .get(X_FORWARDED_FOR)
                    .and_then(|v| v.to_str().ok())
                    .map(|xff| xff.split(',').next().unwrap_or(xff))
                    .filter(|c| !c.is_empty())
                    .map_or_else(|| remote.ip().to_string(), str::to_owned);
                attributes.extend([
                    KeyValue::new("http.request.method", semconv::method(req.method())),
                    KeyValue::new("url.scheme", "http"),
                    KeyValue::new("server.address", address.to_owned()),
                    KeyValue::new("network.peer.address", remote.ip().to_string()),
                    KeyValue::new("network.peer.port", i64::from(remote.port())),
                    KeyValue::new("client.address", client),
                    KeyValue::new("url.path", req.uri().path().to_owned()),
                    // Knative's route tag handler, inside otelhttp's.
                    KeyValue::new("kn.route.tag", RouteTag::of(headers).to_string()),
                    KeyValue::new(
                        "network.protocol.version",
                        semconv::protocol_version(req.version()),
                    ),
                ]);
                if let Some(port) = port.and_then(|p| p.parse::<i64>().ok()) {
                    attributes.push(KeyValue::new("server.port", port));
                }
                if !user_agent.is_empty() {
                    attributes.push(KeyValue::new("user_agent.original", user_agent.to_owned()));
                }
                Cow::Borrowed(semconv::span_name(req.method()))
            }
        };
        self.http_tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.http_tracer, parent)
    }

    /// An internal span, child of `parent`: the proxying (`wait` false) or
    /// the wait for a slot (`wait` true).
    pub fn internal_span(&self, wait: bool, parent: &Context) -> Span {
        let name = match (self.generation, wait) {
            (Generation::Classic, false) => "queue_proxy",
            (Generation::Classic, true) => "queue_wait",
            (Generation::Current, false) => "kn.queueproxy.proxy",
            (Generation::Current, true) => "kn.queueproxy.wait",
        };
        self.tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .start_with_context(&self.tracer, parent)
    }

    /// The client span of the request to the app, child of `parent`; its
    /// context is written into the request's headers.
    pub fn client_span<B>(&self, req: &mut Request<B>, parent: &Context) -> Span {
        let url = format!("http://{}{}", self.app, path_and_query(req));
        let (name, attributes): (Cow<'static, str>, Vec<KeyValue>) = match self.generation {
            Generation::Classic => {
                let mut attributes = vec![
                    KeyValue::new("http.path", req.uri().path().to_owned()),
                    KeyValue::new("http.url", url),
                    KeyValue::new("http.host", self.app.to_string()),
                    KeyValue::new("http.method", req.method().to_string()),
                ];
                if let Some(ua) = req
                    .headers()
                    .get(http::header::USER_AGENT)
                    .and_then(|v| v.to_str().ok())
                    .filter(|ua| !ua.is_empty())
                {
                    attributes.push(KeyValue::new("http.user_agent", ua.to_owned()));
                }
                (Cow::Owned(req.uri().path().to_owned()), attributes)
            }
            Generation::Current => (
                Cow::Owned(format!("HTTP {}", req.method())),
                vec![
                    KeyValue::new("http.request.method", semconv::method(req.method())),
                    KeyValue::new("url.full", url),
                    KeyValue::new("server.address", self.app.ip().to_string()),
                    KeyValue::new("server.port", i64::from(self.app.port())),
                    KeyValue::new(
                        "network.protocol.version",
                        semconv::protocol_version(req.version()),
                    ),
                ],
            ),
        };
        let span = self
            .http_tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&self.http_tracer, parent);
        self.inject(span.span_context(), req.headers_mut());
        span
    }

    /// Writes `cx` into the headers for the app, in the generation's
    /// formats.
    fn inject(&self, sc: &SpanContext, headers: &mut HeaderMap) {
        let cx = Context::new().with_remote_span_context(sc.clone());
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
        if self.generation == Generation::Classic {
            let trace_id = format!("{:032x}", sc.trace_id());
            let span_id = format!("{:016x}", sc.span_id());
            let sampled = if sc.is_sampled() { "1" } else { "0" };
            for (name, value) in [
                ("x-b3-traceid", trace_id.as_str()),
                ("x-b3-spanid", span_id.as_str()),
                ("x-b3-sampled", sampled),
            ] {
                if let Ok(value) = HeaderValue::from_str(value) {
                    headers.insert(name, value);
                }
            }
        }
    }

    /// Ends the server or client span of `cx` with the response's
    /// `status` (`None`: the request ended without one) and, for a server
    /// span of current Knative, the body sizes otelhttp counts: the
    /// request's (its declared length) and the response's (`written`).
    pub fn end_http(&self, cx: &Context, status: Option<StatusCode>, sizes: Option<Sizes>) {
        let span = cx.span();
        let client = sizes.is_none();
        if let (Generation::Current, Some(sizes)) = (self.generation, sizes) {
            if sizes.read > 0 {
                span.set_attribute(KeyValue::new("http.request.body.size", sizes.read as i64));
            }
            if sizes.written > 0 {
                span.set_attribute(KeyValue::new(
                    "http.response.body.size",
                    sizes.written as i64,
                ));
            }
        }
        let Some(status) = status else {
            span.set_status(Status::error("no response"));
            span.end();
            return;
        };
        let code = i64::from(status.as_u16());
        match self.generation {
            Generation::Classic => {
                span.set_attribute(KeyValue::new("http.status_code", code));
                if let Some(description) = opencensus_status(status) {
                    span.set_status(Status::error(description));
                }
            }
            Generation::Current => {
                span.set_attribute(KeyValue::new("http.response.status_code", code));
                let limit = if client { 400 } else { 500 };
                if status.as_u16() >= limit {
                    span.set_status(Status::error(""));
                }
            }
        }
        span.end();
    }
}

/// The body sizes a server span records as it ends.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sizes {
    /// The request body's declared length.
    pub read: u64,
    /// The response body bytes written.
    pub written: u64,
}

/// The exporters qproxy builds.
enum Exporter {
    Zipkin(ZipkinExporter),
    Otlp(opentelemetry_otlp::SpanExporter),
}

/// Current Knative's `service.name`: the first of `OTEL_SERVICE_NAME`, the
/// Service, the Configuration, the revision and the pod that is set.
pub fn service_name<'a>(revision: &'a Revision, otel: &'a OtelEnv) -> &'a str {
    [
        otel.service_name.as_deref().unwrap_or(""),
        revision.service.as_str(),
        revision.configuration.as_str(),
        revision.name.as_str(),
        revision.pod.as_str(),
    ]
    .into_iter()
    .find(|s| !s.is_empty())
    .unwrap_or_default()
}

/// Current Knative's resource: the queue-proxy container of the pod, over
/// what `OTEL_RESOURCE_ATTRIBUTES` says (the SDK reads it, as Go's
/// `resource.Default` does).
pub fn current_resource(revision: &Revision, otel: &OtelEnv) -> Resource {
    let service_name = service_name(revision, otel).to_owned();
    let mut attributes = vec![
        KeyValue::new("container.name", "queue-proxy"),
        KeyValue::new("k8s.namespace.name", revision.namespace.clone()),
        KeyValue::new("k8s.pod.name", revision.pod.clone()),
        KeyValue::new("service.instance.id", revision.pod.clone()),
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    ];
    for (key, value) in [
        ("kn.service.name", &revision.service),
        ("kn.configuration.name", &revision.configuration),
        ("kn.revision.name", &revision.name),
    ] {
        if !value.is_empty() {
            attributes.push(KeyValue::new(key, value.clone()));
        }
    }
    Resource::builder()
        .with_service_name(service_name)
        .with_attributes(attributes)
        .build()
}

/// Current Knative's sampler (knative.dev/pkg's `sampleFor`): everything
/// at a rate of 1 or more (`OTEL_TRACES_SAMPLER_ARG`, when set, decides
/// that, and only that), nothing at 0, else the parent's decision or the
/// configured rate by trace ID.
fn current_sampler(rate: f64, arg: Option<f64>) -> Sampler {
    if arg.unwrap_or(rate) >= 1.0 {
        Sampler::AlwaysOn
    } else if rate <= 0.0 {
        Sampler::AlwaysOff
    } else {
        Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(rate)))
    }
}

/// OpenCensus' `ProbabilitySampler`, as classic Knative samples: a sampled
/// parent is followed; otherwise the rate decides, by the trace ID's first
/// eight bytes (`TRACING_CONFIG_DEBUG` samples everything). Spans with a
/// parent in this process share its decision.
#[derive(Debug, Clone)]
struct OpenCensusSampler {
    always: bool,
    rate: f64,
}

impl ShouldSample for OpenCensusSampler {
    fn should_sample(
        &self,
        parent: Option<&Context>,
        trace_id: TraceId,
        _name: &str,
        _kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[opentelemetry::trace::Link],
    ) -> SamplingResult {
        let parent = parent
            .map(|cx| cx.span().span_context().clone())
            .filter(SpanContext::is_valid);
        let sample = match &parent {
            Some(p) if !p.is_remote() => p.is_sampled(),
            Some(p) if p.is_sampled() => true,
            _ => {
                self.always || {
                    let high =
                        u64::from_be_bytes(trace_id.to_bytes()[..8].try_into().unwrap_or_default())
                            >> 1;
                    (high as f64) < self.rate * (1u64 << 63) as f64
                }
            }
        };
        SamplingResult {
            decision: if sample {
                SamplingDecision::RecordAndSample
            } else {
                SamplingDecision::Drop
            },
            attributes: Vec::new(),
            trace_state: parent.map(|p| p.trace_state().clone()).unwrap_or_default(),
        }
    }
}

/// Each generation's sampling.
#[derive(Debug, Clone)]
enum TraceSampler {
    Classic(OpenCensusSampler),
    Current(Sampler),
}

impl ShouldSample for TraceSampler {
    fn should_sample(
        &self,
        parent: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[opentelemetry::trace::Link],
    ) -> SamplingResult {
        match self {
            TraceSampler::Classic(s) => {
                s.should_sample(parent, trace_id, name, kind, attributes, links)
            }
            TraceSampler::Current(s) => {
                s.should_sample(parent, trace_id, name, kind, attributes, links)
            }
        }
    }
}

/// The span context of OpenCensus' B3 format: `X-B3-TraceId` (16 or 32
/// hex digits), `X-B3-SpanId` and `X-B3-Sampled` (`1` or `true`).
fn b3(headers: &HeaderMap) -> Option<SpanContext> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let trace = get("x-b3-traceid")?;
    let trace = match trace.len() {
        16 => format!("{trace:0>32}"),
        32 => trace.to_owned(),
        _ => return None,
    };
    let trace_id = TraceId::from_hex(&trace)
        .ok()
        .filter(|t| *t != TraceId::INVALID)?;
    let span = get("x-b3-spanid").filter(|s| s.len() == 16)?;
    let span_id = SpanId::from_hex(span)
        .ok()
        .filter(|s| *s != SpanId::INVALID)?;
    let sampled = matches!(get("x-b3-sampled"), Some("1" | "true"));
    Some(SpanContext::new(
        trace_id,
        span_id,
        if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        },
        true,
        TraceState::default(),
    ))
}

/// OpenCensus' status of an HTTP response, `None` for OK.
fn opencensus_status(status: StatusCode) -> Option<&'static str> {
    Some(match status.as_u16() {
        200..=399 => return None,
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "UNKNOWN",
    })
}

fn path_and_query<B>(req: &Request<B>) -> &str {
    req.uri().path_and_query().map_or("/", |pq| pq.as_str())
}
