//! Request metrics as current Knative makes them: the OpenTelemetry
//! instruments of its queue-proxy, served on the user metrics port (9091)
//! in the Prometheus text its OpenTelemetry exporter writes when
//! `OBSERVABILITY_CONFIG`'s `requestMetrics.protocol` is `prometheus`, or
//! exported over OTLP (`grpc`, `http/protobuf`) to `requestMetrics.endpoint`
//! every `exportInterval` (60 s by default), with Knative's resource.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `http_server_request_duration_seconds` | histogram | `http_request_method`, `http_response_status_code`, `kn_route_tag`, `network_protocol_name`, `network_protocol_version`, `server_address`, `server_port`, `url_scheme` |
//! | `http_server_request_body_size_bytes` | histogram | same |
//! | `http_server_response_body_size_bytes` | histogram | same |
//! | `http_client_request_duration_seconds` | histogram | same, for the request to the app |
//! | `http_client_request_body_size_bytes` | histogram | same |
//! | `kn_serving_invocation_duration_seconds` | histogram | `http_response_status_code` |
//! | `kn_serving_queue_depth` | gauge | |
//! | `target_info` | gauge | the resource: pod, namespace, Service, Configuration, revision |
//!
//! Every series also carries the instrumentation scope (`otel_scope_name`,
//! `otel_scope_version`, `otel_scope_schema_url`) Knative's does. The
//! `http_*` instruments measure a request as it reaches the queue-proxy
//! and as it goes to the app; `kn_serving_invocation_duration_seconds`
//! times the app's part, the queue depth is the breaker's requests as each
//! request passes. Probes are not measured.
//!
//! A response whose body is cut off (the app failed, the client left) is
//! counted as Knative's Go handlers count the proxy's aborted handler:
//! `kn_serving_invocation_duration_seconds` records it as a `500`, the
//! client instruments with the status of the app's head (its round trip
//! had ended), and the server instruments not at all (they record once a
//! handler returns, which an aborted one never does).
//!
//! As Go's OpenTelemetry SDK (`sdk/metric`) does by default, each
//! instrument keeps at most 2,000 attribute sets, the overflow set among
//! them: once 1,999 are kept, a measurement with a new set is counted in
//! the set whose only attribute is `otel.metric.overflow=true`. The HTTP
//! instruments' sets hold the request's host and route tag, so a client
//! cannot grow the exposition (or qproxy's memory) without bound.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use metrics::{Gauge, Key, KeyName, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use opentelemetry::metrics::{Histogram, Meter, MeterProvider as _, ObservableGauge};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader;
use opentelemetry_sdk::metrics::{Instrument, SdkMeterProvider, Stream};
use opentelemetry_sdk::runtime::Tokio;

use crate::config::{MetricsConfig, MetricsProtocol, OtelEnv};
use crate::export::{ExportError, Signal};
use crate::otlp::{Target, Transport};
use crate::own_metrics::OwnMetrics;
use crate::prom_text::label;
use crate::queue_wait;
use crate::request_metrics::opencensus::{read, write};
use crate::semconv;
use crate::semconv::RouteTag;
use crate::startup::{Span, Startup};
use crate::traces::current_resource;
use qproxy_core::config::Revision;
use qproxy_core::facts::Facts;

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

/// The HTTP instruments' scope (Go's otelhttp).
const HTTP_SCOPE: [(&str, &str); 3] = [
    ("otel_scope_name", semconv::OTELHTTP_SCOPE),
    ("otel_scope_schema_url", ""),
    ("otel_scope_version", semconv::OTELHTTP_VERSION),
];

/// Knative's own instruments' scope.
const QUEUE_SCOPE: [(&str, &str); 3] = [
    ("otel_scope_name", semconv::QUEUE_SCOPE),
    ("otel_scope_schema_url", ""),
    ("otel_scope_version", ""),
];

const SERVER_DURATION: &str = "http_server_request_duration_seconds";
const SERVER_REQUEST_SIZE: &str = "http_server_request_body_size_bytes";
const SERVER_RESPONSE_SIZE: &str = "http_server_response_body_size_bytes";
const CLIENT_DURATION: &str = "http_client_request_duration_seconds";
const CLIENT_REQUEST_SIZE: &str = "http_client_request_body_size_bytes";
const INVOCATION: &str = "kn_serving_invocation_duration_seconds";
const QUEUE_DEPTH: &str = "kn_serving_queue_depth";

const HELP: [(&str, &str); 7] = [
    (SERVER_DURATION, "Duration of HTTP server requests."),
    (SERVER_REQUEST_SIZE, "Size of HTTP server request bodies."),
    (SERVER_RESPONSE_SIZE, "Size of HTTP server response bodies."),
    (CLIENT_DURATION, "Duration of HTTP client requests."),
    (CLIENT_REQUEST_SIZE, "Size of HTTP client request bodies."),
    (INVOCATION, "The duration of task execution"),
    (QUEUE_DEPTH, "Number of current requests in the queue"),
];

/// Duration buckets, in seconds (Knative's and the HTTP instruments').
const DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// Body size buckets, in bytes.
const SIZE_BUCKETS: [f64; 15] = [
    0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0, 7500.0,
    10000.0,
];

/// What the HTTP instruments label a request with, taken as it arrives.
#[derive(Debug, Clone)]
pub struct HttpAttributes {
    method: &'static str,
    version: &'static str,
    host: String,
    port: Option<String>,
    route_tag: RouteTag,
    request_size: u64,
    /// A probe the proxy passes to the app (`K-Kubelet-Probe`): Knative's
    /// HTTP client measures it, without a route tag, which only the
    /// server's handlers, which skip probes, would have set.
    probe: bool,
}

impl HttpAttributes {
    /// The attributes of `req`.
    pub fn of<B: http_body::Body>(req: &http::Request<B>, facts: Facts) -> Self {
        let (host, port) = semconv::split_host(semconv::host(req));
        let route_tag = if facts.names_route() {
            RouteTag::of(req.headers())
        } else {
            RouteTag::DISABLED
        };
        Self {
            method: semconv::method(req.method()),
            version: semconv::protocol_version(req.version()),
            host: host.to_owned(),
            port: port.map(str::to_owned),
            route_tag,
            request_size: req.body().size_hint().exact().unwrap_or(0),
            probe: facts.is_probe(),
        }
    }

    fn tag(&self) -> String {
        self.route_tag.to_string()
    }
}

/// Current Knative's request metrics; cheap to clone.
#[derive(Clone)]
pub struct OtelMetrics {
    inner: Arc<OtelMetricsState>,
}

impl std::fmt::Debug for OtelMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtelMetrics").finish_non_exhaustive()
    }
}

struct OtelMetricsState {
    user_port: u16,
    backend: Backend,
}

enum Backend {
    /// Served as Prometheus text.
    Prometheus {
        recorder: PrometheusRecorder,
        handle: PrometheusHandle,
        /// Registered when a breaker first records it: without one, Knative
        /// never records the gauge, and its exposition has no such line.
        queue_depth: OnceLock<Gauge>,
        target_info: String,
        /// The attribute sets of the server's instruments, which record
        /// each request together, and of the client's.
        server_sets: AttributeSets,
        client_sets: AttributeSets,
    },
    /// Exported over OTLP.
    Otlp(Box<Otlp>),
}

/// The OpenTelemetry instruments, exported over OTLP.
struct Otlp {
    provider: SdkMeterProvider,
    server_duration: Histogram<f64>,
    server_request_size: Histogram<u64>,
    server_response_size: Histogram<u64>,
    client_duration: Histogram<f64>,
    client_request_size: Histogram<u64>,
    invocation: Histogram<f64>,
    queue_depth: opentelemetry::metrics::Gauge<i64>,
    /// The start-up's spans, observed at each export once known.
    _startup: [ObservableGauge<f64>; 2],
    /// The adaptive limit, where there is one.
    _adaptive: Option<(ObservableGauge<u64>, ObservableGauge<f64>)>,
}

/// The Go SDK's export interval, when the configuration sets none.
const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_secs(60);

impl OtelMetrics {
    /// The metrics of `revision`'s pod, whose app listens on `user_port`,
    /// served as Prometheus text.
    pub fn prometheus(revision: &Revision, otel: &OtelEnv, user_port: u16) -> Self {
        let mut builder = PrometheusBuilder::new();
        for (name, buckets) in [
            (SERVER_DURATION, &DURATION_BUCKETS[..]),
            (CLIENT_DURATION, &DURATION_BUCKETS[..]),
            (INVOCATION, &DURATION_BUCKETS[..]),
            (SERVER_REQUEST_SIZE, &SIZE_BUCKETS[..]),
            (SERVER_RESPONSE_SIZE, &SIZE_BUCKETS[..]),
            (CLIENT_REQUEST_SIZE, &SIZE_BUCKETS[..]),
        ] {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
                .unwrap_or_else(|_| unreachable!("the buckets are not empty"));
        }
        let recorder = builder.build_recorder();
        for (name, help) in HELP {
            let key = KeyName::from_const_str(name);
            if name == QUEUE_DEPTH {
                recorder.describe_gauge(key, None, help.into());
            } else {
                recorder.describe_histogram(key, None, help.into());
            }
        }
        Self {
            inner: Arc::new(OtelMetricsState {
                user_port,
                backend: Backend::Prometheus {
                    handle: recorder.handle(),
                    recorder,
                    queue_depth: OnceLock::new(),
                    target_info: target_info(revision, otel),
                    server_sets: AttributeSets::default(),
                    client_sets: AttributeSets::default(),
                },
            }),
        }
    }

    /// The same instruments, exported over OTLP as `config` says.
    pub fn otlp(
        config: &MetricsConfig,
        otel: &OtelEnv,
        revision: &Revision,
        user_port: u16,
        extra: &OwnMetrics,
    ) -> Result<Self, ExportError> {
        let transport = match config.protocol {
            MetricsProtocol::Grpc => Transport::Grpc,
            _ => Transport::HttpProtobuf,
        };
        let endpoint = config.endpoint.as_deref().unwrap_or("");
        let target = Target::new(Signal::Metrics, transport, endpoint, otel)?;
        let mut reader = PeriodicReader::builder(target.metric_exporter()?, Tokio);
        // `OTEL_METRIC_EXPORT_INTERVAL` replaces the configuration's; the
        // SDK reads it.
        if !otel.metric_interval_from_env {
            reader =
                reader.with_interval(config.export_interval.unwrap_or(DEFAULT_EXPORT_INTERVAL));
        }
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.build())
            .with_resource(current_resource(revision, otel))
            // Go's SDK keeps 1,999 sets and the overflow's; this SDK keeps
            // as many as its limit says, and the overflow's besides.
            .with_view(|_: &Instrument| {
                Stream::builder()
                    .with_cardinality_limit(CARDINALITY_LIMIT - 1)
                    .build()
                    .ok()
            })
            .build();
        let http = provider.meter_with_scope(
            InstrumentationScope::builder(HTTP_SCOPE[0].1)
                .with_version(HTTP_SCOPE[2].1)
                .build(),
        );
        let queue = provider.meter(QUEUE_SCOPE[0].1);
        let own = provider.meter(QPROXY_SCOPE);
        if let Some(waits) = &extra.queue_wait {
            waits.export_to(
                own.f64_histogram("qproxy.queue.wait")
                    .with_description(queue_wait::HELP)
                    .with_unit("s")
                    .with_boundaries(queue_wait::BUCKETS.to_vec())
                    .build(),
            );
        }
        let seconds = |meter: &opentelemetry::metrics::Meter, name: &'static str, help| {
            meter
                .f64_histogram(name)
                .with_description(help)
                .with_unit("s")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build()
        };
        let bytes = |name: &'static str, help| {
            http.u64_histogram(name)
                .with_description(help)
                .with_unit("By")
                .with_boundaries(SIZE_BUCKETS.to_vec())
                .build()
        };
        let otlp = Otlp {
            server_duration: seconds(
                &http,
                "http.server.request.duration",
                "Duration of HTTP server requests.",
            ),
            server_request_size: bytes(
                "http.server.request.body.size",
                "Size of HTTP server request bodies.",
            ),
            server_response_size: bytes(
                "http.server.response.body.size",
                "Size of HTTP server response bodies.",
            ),
            client_duration: seconds(
                &http,
                "http.client.request.duration",
                "Duration of HTTP client requests.",
            ),
            client_request_size: bytes(
                "http.client.request.body.size",
                "Size of HTTP client request bodies.",
            ),
            invocation: seconds(
                &queue,
                "kn.serving.invocation.duration",
                "The duration of task execution",
            ),
            queue_depth: queue
                .i64_gauge("kn.serving.queue.depth")
                .with_description("Number of current requests in the queue")
                .with_unit("{request}")
                .build(),
            _startup: startup_gauges(&own, &extra.startup),
            _adaptive: extra.adaptive.as_ref().map(|limit| limit.gauges(&own)),
            provider,
        };
        Ok(Self {
            inner: Arc::new(OtelMetricsState {
                user_port,
                backend: Backend::Otlp(Box::new(otlp)),
            }),
        })
    }

    /// Records a request as it reached the queue-proxy.
    pub fn record_server(
        &self,
        attributes: &HttpAttributes,
        status: u16,
        response_size: u64,
        duration: Duration,
    ) {
        let port = attributes.port.as_deref();
        let attrs = http_attributes(attributes, status, &attributes.host, port);
        match &self.inner.backend {
            Backend::Prometheus {
                recorder,
                server_sets,
                ..
            } => {
                let labels = server_sets.admit(&attrs);
                let histogram = |name: &'static str| {
                    recorder.register_histogram(&Key::from_parts(name, labels.clone()), &METADATA)
                };
                histogram(SERVER_DURATION).record(duration.as_secs_f64());
                histogram(SERVER_REQUEST_SIZE).record(attributes.request_size as f64);
                histogram(SERVER_RESPONSE_SIZE).record(response_size as f64);
            }
            Backend::Otlp(o) => {
                let kv = otlp_attributes(&attrs);
                o.server_duration.record(duration.as_secs_f64(), &kv);
                o.server_request_size.record(attributes.request_size, &kv);
                o.server_response_size.record(response_size, &kv);
            }
        }
    }

    /// Records a request as the app handled it: the invocation, with
    /// `status` (a `500` for a body cut off), and the request to the app,
    /// with the status of the app's head (`answered`).
    pub fn record_app(
        &self,
        attributes: &HttpAttributes,
        status: u16,
        answered: u16,
        duration: Duration,
    ) {
        let port = self.inner.user_port.to_string();
        let attrs = http_attributes(attributes, answered, "127.0.0.1", Some(&port));
        let seconds = duration.as_secs_f64();
        match &self.inner.backend {
            Backend::Prometheus {
                recorder,
                client_sets,
                ..
            } => {
                if !attributes.probe {
                    let invocation = labels(
                        &QUEUE_SCOPE,
                        [("http_response_status_code", status.to_string())],
                    );
                    recorder
                        .register_histogram(&Key::from_parts(INVOCATION, invocation), &METADATA)
                        .record(seconds);
                }
                let labels = client_sets.admit(&attrs);
                recorder
                    .register_histogram(
                        &Key::from_parts(CLIENT_DURATION, labels.clone()),
                        &METADATA,
                    )
                    .record(seconds);
                recorder
                    .register_histogram(&Key::from_parts(CLIENT_REQUEST_SIZE, labels), &METADATA)
                    .record(attributes.request_size as f64);
            }
            Backend::Otlp(o) => {
                if !attributes.probe {
                    let status = KeyValue::new("http.response.status_code", i64::from(status));
                    o.invocation.record(seconds, &[status]);
                }
                let kv = otlp_attributes(&attrs);
                o.client_duration.record(seconds, &kv);
                o.client_request_size.record(attributes.request_size, &kv);
            }
        }
    }

    /// Sets the queue depth: the requests inside the breaker.
    pub fn set_queue_depth(&self, depth: u32) {
        match &self.inner.backend {
            Backend::Prometheus {
                recorder,
                queue_depth,
                ..
            } => queue_depth
                .get_or_init(|| {
                    recorder.register_gauge(
                        &Key::from_parts(QUEUE_DEPTH, labels(&QUEUE_SCOPE, [])),
                        &METADATA,
                    )
                })
                .set(f64::from(depth)),
            Backend::Otlp(o) => o.queue_depth.record(i64::from(depth), &[]),
        }
    }

    /// The Prometheus text exposition (empty when exported over OTLP).
    pub fn render(&self) -> String {
        match &self.inner.backend {
            Backend::Prometheus {
                handle,
                target_info,
                ..
            } => {
                let mut text = handle.render();
                text.push_str(target_info);
                text
            }
            Backend::Otlp(_) => String::new(),
        }
    }

    /// Folds recorded histogram samples into their buckets.
    pub fn run_upkeep(&self) {
        if let Backend::Prometheus { handle, .. } = &self.inner.backend {
            handle.run_upkeep();
        }
    }

    /// Exports what is recorded and stops exporting (OTLP).
    pub fn shutdown(&self) {
        if let Backend::Otlp(o) = &self.inner.backend
            && let Err(e) = o.provider.shutdown()
        {
            tracing::debug!(error = %e, "metrics export did not shut down cleanly");
        }
    }
}

/// The scope of qproxy's own instruments.
const QPROXY_SCOPE: &str = "qproxy";

/// The start-up's spans as gauges (`qproxy.startup.*`, in seconds), each
/// observed once it is known.
fn startup_gauges(meter: &Meter, startup: &Arc<Startup>) -> [ObservableGauge<f64>; 2] {
    Span::ALL.map(|span| {
        let startup = startup.clone();
        meter
            .f64_observable_gauge(span.otel_name())
            .with_description(span.help())
            .with_unit("s")
            .with_callback(move |observer| {
                if let Some(took) = startup.span(span) {
                    observer.observe(took.as_secs_f64(), &[]);
                }
            })
            .build()
    })
}

/// The attribute sets Go's SDK keeps for an instrument, the overflow set
/// among them (`sdk/metric`'s default cardinality limit).
const CARDINALITY_LIMIT: usize = 2000;

/// The attribute sets (as labels) an HTTP instrument has recorded, capped
/// as Go's SDK caps them.
#[derive(Default)]
struct AttributeSets {
    kept: RwLock<HashSet<Vec<Label>>>,
}

impl AttributeSets {
    /// The labels to record a measurement with `attrs` under: theirs if
    /// their set is kept or there is room for it, else the overflow set's
    /// (at once for a value over [`MAX_VALUE_LEN`]). Looking up a set in
    /// use takes a read lock.
    fn admit(&self, attrs: &[Attribute]) -> Vec<Label> {
        if oversized(attrs) {
            return overflow_labels();
        }
        let set = prometheus_labels(attrs);
        if read(&self.kept).contains(&set) {
            return set;
        }
        let mut kept = write(&self.kept);
        // Room for this set and, later, the overflow's (Go's `limiter`).
        if kept.contains(&set) || kept.len() + 1 < CARDINALITY_LIMIT {
            kept.insert(set.clone());
            set
        } else {
            overflow_labels()
        }
    }
}

/// The longest attribute value kept: a longer host or route tag (neither
/// can be one, as DNS names and Kubernetes names go) is counted in the
/// overflow set. Go's SDK keeps any length; here each kept set is held in
/// several copies (the registry's keys, each histogram's label set), so
/// without this a client could hold megabytes per request.
const MAX_VALUE_LEN: usize = 255;

/// Whether an attribute value of `attrs` is longer than [`MAX_VALUE_LEN`].
fn oversized(attrs: &[Attribute]) -> bool {
    attrs
        .iter()
        .any(|(_, v)| matches!(v, AttributeValue::Str(s) if s.len() > MAX_VALUE_LEN))
}

/// The overflow set's labels.
fn overflow_labels() -> Vec<Label> {
    labels(&HTTP_SCOPE, [("otel_metric_overflow", "true".to_owned())])
}

/// The OTLP attributes to record a measurement with: `attrs`, or the
/// overflow set's when a value is longer than [`MAX_VALUE_LEN`].
fn otlp_attributes(attrs: &[Attribute]) -> Vec<KeyValue> {
    if oversized(attrs) {
        return vec![KeyValue::new("otel.metric.overflow", true)];
    }
    key_values(attrs)
}

/// One HTTP attribute: its OpenTelemetry key and value.
type Attribute = (&'static str, AttributeValue);

enum AttributeValue {
    Str(String),
    Int(i64),
}

fn http_attributes(
    a: &HttpAttributes,
    status: u16,
    address: &str,
    port: Option<&str>,
) -> Vec<Attribute> {
    use AttributeValue::{Int, Str};
    let mut attrs = vec![
        ("http.request.method", Str(a.method.to_owned())),
        ("http.response.status_code", Int(i64::from(status))),
    ];
    if !a.probe {
        attrs.push(("kn.route.tag", Str(a.tag())));
    }
    attrs.extend([
        ("network.protocol.name", Str("http".to_owned())),
        ("network.protocol.version", Str(a.version.to_owned())),
        ("server.address", Str(address.to_owned())),
        ("url.scheme", Str("http".to_owned())),
    ]);
    if let Some(port) = port.and_then(|p| p.parse().ok()) {
        attrs.push(("server.port", Int(port)));
    }
    attrs
}

fn prometheus_labels(attrs: &[Attribute]) -> Vec<Label> {
    let extra = attrs.iter().map(|(k, v)| {
        let name = match *k {
            "http.request.method" => "http_request_method",
            "http.response.status_code" => "http_response_status_code",
            "kn.route.tag" => "kn_route_tag",
            "network.protocol.name" => "network_protocol_name",
            "network.protocol.version" => "network_protocol_version",
            "server.address" => "server_address",
            "url.scheme" => "url_scheme",
            _ => "server_port",
        };
        let value = match v {
            AttributeValue::Str(s) => s.clone(),
            AttributeValue::Int(i) => i.to_string(),
        };
        (name, value)
    });
    labels(&HTTP_SCOPE, extra)
}

fn key_values(attrs: &[Attribute]) -> Vec<KeyValue> {
    attrs
        .iter()
        .map(|(k, v)| match v {
            AttributeValue::Str(s) => KeyValue::new(*k, s.clone()),
            AttributeValue::Int(i) => KeyValue::new(*k, *i),
        })
        .collect()
}

/// `scope` and `extra`, sorted by name as the exposition sorts them.
fn labels(
    scope: &[(&'static str, &'static str)],
    extra: impl IntoIterator<Item = (&'static str, String)>,
) -> Vec<Label> {
    let mut all: Vec<(&'static str, String)> = scope
        .iter()
        .map(|(k, v)| (*k, (*v).to_owned()))
        .chain(extra)
        .collect();
    all.sort_by_key(|(k, _)| *k);
    all.into_iter().map(|(k, v)| Label::new(k, v)).collect()
}

/// The `target_info` family: the resource current Knative describes the
/// queue-proxy with, as OTLP exports carry it ([`current_resource`]) and
/// the OpenTelemetry Prometheus exporter writes it, with `_` for `.`.
fn target_info(revision: &Revision, otel: &OtelEnv) -> String {
    let resource = current_resource(revision, otel);
    let mut labels: Vec<String> = resource
        .iter()
        .map(|(k, v)| {
            let value = v.to_string();
            label(&k.as_str().replace('.', "_"), &value)
        })
        .collect();
    labels.sort();
    format!(
        "# HELP target_info Target metadata\n# TYPE target_info gauge\ntarget_info{{{}}} 1\n",
        labels.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(host: &str) -> Vec<Attribute> {
        vec![("server.address", AttributeValue::Str(host.to_owned()))]
    }

    #[test]
    fn sets_past_go_s_limit_are_counted_in_the_overflow_set() {
        let sets = AttributeSets::default();
        for i in 0..CARDINALITY_LIMIT - 1 {
            let kept = set(&format!("h{i}"));
            assert_eq!(sets.admit(&kept), prometheus_labels(&kept));
        }
        let overflow = labels(&HTTP_SCOPE, [("otel_metric_overflow", "true".to_owned())]);
        assert_eq!(sets.admit(&set("new")), overflow);
        assert_eq!(sets.admit(&set("another")), overflow);
        assert_eq!(
            sets.admit(&set("h7")),
            prometheus_labels(&set("h7")),
            "a kept set stays"
        );
        assert_eq!(read(&sets.kept).len(), CARDINALITY_LIMIT - 1);
    }

    #[test]
    fn an_overlong_value_is_counted_in_the_overflow_set_and_not_kept() {
        let sets = AttributeSets::default();
        let overflow = labels(&HTTP_SCOPE, [("otel_metric_overflow", "true".to_owned())]);
        let long = set(&"h".repeat(MAX_VALUE_LEN + 1));
        assert_eq!(sets.admit(&long), overflow);
        assert!(read(&sets.kept).is_empty());
        let longest = set(&"h".repeat(MAX_VALUE_LEN));
        assert_eq!(sets.admit(&longest), prometheus_labels(&longest));
        assert_eq!(
            otlp_attributes(&long),
            [KeyValue::new("otel.metric.overflow", true)]
        );
    }
}
