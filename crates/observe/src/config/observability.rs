//! Metrics, tracing, request-log and profiling settings, in both of the
//! shapes Knative has used.
//!
//! *Classic* Knative (serving v0.42 and the releases around it) passes them
//! as separate variables (`SERVING_REQUEST_METRICS_BACKEND`,
//! `TRACING_CONFIG_BACKEND`, ...). *Current* Knative passes one JSON document
//! in `OBSERVABILITY_CONFIG` (knative.dev/serving `pkg/observability.Config`).
//! The generation is read off the environment: current when
//! `OBSERVABILITY_CONFIG` is set, classic otherwise. Behaviours that differ
//! between the two (metric names, timeout semantics) follow [`Generation`].

use std::time::Duration;

use serde::Deserialize;

use super::otel::OtelEnv;
use qproxy_core::config::Vars;
use qproxy_core::config::{ConfigError, Generation};

/// Knative's default request log template (identical in both generations).
pub const DEFAULT_REQUEST_LOG_TEMPLATE: &str = r#"{"httpRequest": {"requestMethod": "{{.Request.Method}}", "requestUrl": "{{js .Request.RequestURI}}", "requestSize": "{{.Request.ContentLength}}", "status": {{.Response.Code}}, "responseSize": "{{.Response.Size}}", "userAgent": "{{js .Request.UserAgent}}", "remoteIp": "{{js .Request.RemoteAddr}}", "serverIp": "{{.Revision.PodIP}}", "referer": "{{js .Request.Referer}}", "latency": "{{.Response.Latency}}s", "protocol": "{{.Request.Proto}}"}, "traceId": "{{.TraceID}}"}"#;

/// Observability settings of either generation.
#[derive(Debug, Clone, PartialEq)]
pub enum Observability {
    /// Separate classic variables.
    Classic(Classic),
    /// The current `OBSERVABILITY_CONFIG` document.
    Current(Current),
}

impl Observability {
    /// The generation these settings came from.
    pub fn generation(&self) -> Generation {
        match self {
            Observability::Classic(_) => Generation::Classic,
            Observability::Current(_) => Generation::Current,
        }
    }

    /// Request logging settings, whichever generation.
    pub fn request_log(&self) -> &RequestLogConfig {
        match self {
            Observability::Classic(c) => &c.request_log,
            Observability::Current(c) => &c.request_log,
        }
    }

    /// Whether user-facing request metrics are served as Prometheus text.
    pub fn prometheus_metrics(&self) -> bool {
        match self {
            Observability::Classic(c) => c.request_metrics_backend == MetricsBackend::Prometheus,
            Observability::Current(c) => c.request_metrics.protocol == MetricsProtocol::Prometheus,
        }
    }

    /// Whether classic Knative's request metrics are served as Prometheus
    /// text (current Knative's instruments are another set).
    pub fn classic_prometheus_metrics(&self) -> bool {
        matches!(self, Observability::Classic(c) if c.request_metrics_backend == MetricsBackend::Prometheus)
    }

    /// Whether CPU profiling is served.
    pub fn profiling(&self) -> bool {
        match self {
            Observability::Classic(c) => c.profiling,
            Observability::Current(c) => c.runtime.profiling,
        }
    }
}

/// Request log settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestLogConfig {
    /// Write one line per request.
    pub enabled: bool,
    /// Go `text/template` shaping each line.
    pub template: String,
    /// Log health-check probes too.
    pub probes: bool,
}

impl RequestLogConfig {
    /// The template to render, with the newline Knative adds when it lacks
    /// one; `None` when request logs are off (not enabled, or an empty
    /// template, which Knative takes as off).
    pub fn template(
        &self,
    ) -> Option<Result<qproxy_go_template::Template, qproxy_go_template::ParseError>> {
        if !self.enabled || self.template.is_empty() {
            return None;
        }
        let mut src = self.template.clone();
        if !src.ends_with('\n') {
            src.push('\n');
        }
        Some(qproxy_go_template::Template::parse(&src))
    }

    /// Rejects a template that does not parse, naming `variable`. Knative
    /// logs the error and serves without request logs; a broken template
    /// is a configuration mistake better caught at start.
    fn check(self, variable: &'static str) -> Result<Self, ConfigError> {
        match self.template() {
            Some(Err(e)) => Err(ConfigError::invalid(
                variable,
                &self.template,
                format!("the request log template does not parse: {e}"),
            )),
            _ => Ok(self),
        }
    }
}

/// Classic (serving v0.42) settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Classic {
    /// `SERVING_ENABLE_REQUEST_LOG`, `SERVING_REQUEST_LOG_TEMPLATE`,
    /// `SERVING_ENABLE_PROBE_REQUEST_LOG`.
    pub request_log: RequestLogConfig,
    /// `SERVING_REQUEST_METRICS_BACKEND`.
    pub request_metrics_backend: MetricsBackend,
    /// `SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS` (`None` when 0).
    pub request_metrics_reporting_period: Option<Duration>,
    /// `METRICS_COLLECTOR_ADDRESS` (OpenCensus backend).
    pub metrics_collector_address: Option<String>,
    /// `METRICS_DOMAIN`.
    pub metrics_domain: Option<String>,
    /// `TRACING_CONFIG_BACKEND`.
    pub tracing_backend: TracingBackend,
    /// `TRACING_CONFIG_ZIPKIN_ENDPOINT`.
    pub zipkin_endpoint: Option<String>,
    /// `TRACING_CONFIG_SAMPLE_RATE`.
    pub sample_rate: f64,
    /// `TRACING_CONFIG_DEBUG`: sample everything.
    pub tracing_debug: bool,
    /// `ENABLE_PROFILING`.
    pub profiling: bool,
}

/// Classic request metrics backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsBackend {
    /// Empty or `none`: no request metrics.
    None,
    /// Prometheus text on port 9091.
    Prometheus,
    /// Pushed to an OpenCensus collector.
    OpenCensus,
}

/// Classic tracing backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TracingBackend {
    /// Empty or `none`: no tracing.
    None,
    /// Spans sent to a Zipkin endpoint.
    Zipkin,
}

impl Classic {
    /// Reads the classic variables. An unknown metrics or tracing backend
    /// is not fatal, as in Knative: that feature is off and a warning says so.
    pub fn from_vars(vars: &Vars, warnings: &mut Vec<String>) -> Result<Self, ConfigError> {
        const BACKEND: &str = "SERVING_REQUEST_METRICS_BACKEND";
        let backend = vars.raw(BACKEND)?.unwrap_or("");
        let request_metrics_backend = match backend.to_ascii_lowercase().as_str() {
            "" | "none" => MetricsBackend::None,
            "prometheus" => MetricsBackend::Prometheus,
            "opencensus" => MetricsBackend::OpenCensus,
            _ => {
                warnings.push(format!(
                    "{BACKEND}={backend:?} is not a supported metrics backend \
                     (prometheus, opencensus, none); request metrics are off"
                ));
                MetricsBackend::None
            }
        };
        const TRACING: &str = "TRACING_CONFIG_BACKEND";
        let tracing = vars.raw(TRACING)?.unwrap_or("");
        let tracing_backend = match tracing {
            "" | "none" => TracingBackend::None,
            "zipkin" => TracingBackend::Zipkin,
            _ => {
                warnings.push(format!(
                    "{TRACING}={tracing:?} is not a supported tracing backend \
                     (zipkin, none); tracing is off"
                ));
                TracingBackend::None
            }
        };
        let sample_rate = vars.float("TRACING_CONFIG_SAMPLE_RATE")?;
        check_rate("TRACING_CONFIG_SAMPLE_RATE", sample_rate)?;
        Ok(Self {
            request_log: RequestLogConfig {
                enabled: vars.bool("SERVING_ENABLE_REQUEST_LOG")?,
                template: vars
                    .raw("SERVING_REQUEST_LOG_TEMPLATE")?
                    .unwrap_or_default()
                    .to_owned(),
                probes: vars.bool("SERVING_ENABLE_PROBE_REQUEST_LOG")?,
            }
            .check("SERVING_REQUEST_LOG_TEMPLATE")?,
            request_metrics_backend,
            request_metrics_reporting_period: vars
                .seconds("SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS")?,
            metrics_collector_address: owned(vars.non_empty("METRICS_COLLECTOR_ADDRESS")?),
            metrics_domain: owned(vars.non_empty("METRICS_DOMAIN")?),
            tracing_backend,
            zipkin_endpoint: owned(vars.non_empty("TRACING_CONFIG_ZIPKIN_ENDPOINT")?),
            sample_rate,
            tracing_debug: vars.bool("TRACING_CONFIG_DEBUG")?,
            profiling: vars.bool("ENABLE_PROFILING")?,
        })
    }
}

fn owned(v: Option<&str>) -> Option<String> {
    v.map(str::to_owned)
}

fn check_rate(name: &'static str, rate: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&rate) {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            name,
            &rate.to_string(),
            "sampling rate must be between 0 and 1",
        ))
    }
}

/// Current settings, decoded from `OBSERVABILITY_CONFIG`.
#[derive(Debug, Clone, PartialEq)]
pub struct Current {
    /// `tracing`.
    pub tracing: TracingConfig,
    /// `metrics` (the process-wide exporter; the queue-proxy exports its
    /// request metrics through `requestMetrics`).
    pub metrics: MetricsConfig,
    /// `requestMetrics`: where request metrics go.
    pub request_metrics: MetricsConfig,
    /// `runtime`.
    pub runtime: RuntimeConfig,
    /// `enableRequestLog`, `requestLogTemplate`, `enableProbeRequestLog`.
    pub request_log: RequestLogConfig,
    /// The `OTEL_*` variables Knative's setup honours (boxed: most
    /// configurations have none).
    pub otel: Box<OtelEnv>,
}

/// An OpenTelemetry metrics exporter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// `protocol`.
    pub protocol: MetricsProtocol,
    /// `endpoint`: OTLP URL, or for Prometheus the listen address.
    pub endpoint: Option<String>,
    /// `exportInterval`; `None` leaves the exporter's default.
    pub export_interval: Option<Duration>,
}

/// `metrics.protocol` / `requestMetrics.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsProtocol {
    /// `none`.
    None,
    /// `prometheus`: scraped from us.
    Prometheus,
    /// `grpc`: OTLP over gRPC.
    Grpc,
    /// `http/protobuf`: OTLP over HTTP.
    HttpProtobuf,
}

/// An OpenTelemetry trace exporter.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// `protocol`.
    pub protocol: TracingProtocol,
    /// `endpoint`: OTLP URL.
    pub endpoint: Option<String>,
    /// `samplingRate` in `[0, 1]`.
    pub sampling_rate: f64,
}

/// `tracing.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TracingProtocol {
    /// `none`.
    None,
    /// `grpc`: OTLP over gRPC.
    Grpc,
    /// `http/protobuf`: OTLP over HTTP.
    HttpProtobuf,
    /// `stdout`: spans written to standard output.
    Stdout,
}

/// `runtime`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// `profiling: enabled`.
    pub profiling: bool,
}

/// The JSON as Knative writes it; Go's zero values where a key is absent.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawCurrent {
    tracing: RawTracing,
    metrics: RawMetrics,
    request_metrics: RawMetrics,
    runtime: RawRuntime,
    enable_request_log: bool,
    request_log_template: Option<String>,
    enable_probe_request_log: bool,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawTracing {
    protocol: Option<String>,
    endpoint: String,
    sampling_rate: f64,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawMetrics {
    protocol: Option<String>,
    endpoint: String,
    /// Go `time.Duration`: integer nanoseconds.
    export_interval: i64,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawRuntime {
    profiling: Option<String>,
    /// Go `time.Duration`: integer nanoseconds.
    export_interval: i64,
}

const OBSERVABILITY_CONFIG: &str = "OBSERVABILITY_CONFIG";

impl Current {
    /// Parses `OBSERVABILITY_CONFIG`'s document; the OpenTelemetry
    /// variables are read apart.
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        let invalid = |reason: String| ConfigError::invalid(OBSERVABILITY_CONFIG, json, reason);
        let raw: RawCurrent = qproxy_core::config::json::from_json_object(json)
            .map_err(|e| invalid(e.to_string()))?;

        let tracing = TracingConfig {
            protocol: match raw.tracing.protocol.as_deref().unwrap_or("none") {
                "none" => TracingProtocol::None,
                "grpc" => TracingProtocol::Grpc,
                "http/protobuf" => TracingProtocol::HttpProtobuf,
                "stdout" => TracingProtocol::Stdout,
                other => return Err(invalid(format!("unsupported tracing protocol {other:?}"))),
            },
            endpoint: non_empty(raw.tracing.endpoint),
            sampling_rate: raw.tracing.sampling_rate,
        };
        if !(0.0..=1.0).contains(&tracing.sampling_rate) {
            return Err(invalid(format!(
                "tracing sampling rate {} must be between 0 and 1",
                tracing.sampling_rate
            )));
        }

        let runtime = RuntimeConfig {
            profiling: match raw.runtime.profiling.as_deref().unwrap_or("disabled") {
                "enabled" => true,
                "disabled" => false,
                other => return Err(invalid(format!("unsupported profiling setting {other:?}"))),
            },
        };
        interval(raw.runtime.export_interval).map_err(|e| invalid(format!("runtime {e}")))?;

        Ok(Self {
            tracing,
            metrics: metrics(raw.metrics).map_err(|e| invalid(format!("metrics {e}")))?,
            request_metrics: metrics(raw.request_metrics)
                .map_err(|e| invalid(format!("requestMetrics {e}")))?,
            runtime,
            request_log: RequestLogConfig {
                enabled: raw.enable_request_log,
                template: raw
                    .request_log_template
                    .unwrap_or_else(|| DEFAULT_REQUEST_LOG_TEMPLATE.to_owned()),
                probes: raw.enable_probe_request_log,
            }
            .check(OBSERVABILITY_CONFIG)?,
            otel: Box::default(),
        })
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn metrics(raw: RawMetrics) -> Result<MetricsConfig, String> {
    let protocol = match raw.protocol.as_deref().unwrap_or("none") {
        "none" => MetricsProtocol::None,
        "prometheus" => MetricsProtocol::Prometheus,
        "grpc" => MetricsProtocol::Grpc,
        "http/protobuf" => MetricsProtocol::HttpProtobuf,
        other => return Err(format!("protocol {other:?} is not supported")),
    };
    Ok(MetricsConfig {
        protocol,
        endpoint: non_empty(raw.endpoint),
        export_interval: interval(raw.export_interval)?,
    })
}

fn interval(nanos: i64) -> Result<Option<Duration>, String> {
    match u64::try_from(nanos) {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(Duration::from_nanos(n))),
        Err(_) => Err(format!("exportInterval {nanos} must not be negative")),
    }
}

/// Reads the observability settings of whichever generation `vars` come
/// from; a classic setting accepted but not honoured as given is added to
/// `warnings`.
pub fn from_vars(vars: &Vars, warnings: &mut Vec<String>) -> Result<Observability, ConfigError> {
    match vars.non_empty(OBSERVABILITY_CONFIG)? {
        Some(json) => {
            let mut current = Current::from_json(json)?;
            current.otel = Box::new(OtelEnv::from_vars(vars)?);
            if current.tracing.protocol != TracingProtocol::None {
                current.otel.sampler_arg()?;
            }
            Ok(Observability::Current(current))
        }
        None => Classic::from_vars(vars, warnings).map(Observability::Classic),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classic(pairs: &[(&str, &str)]) -> Result<Observability, ConfigError> {
        from_vars(&Vars::from_pairs(pairs.iter().copied()), &mut Vec::new())
    }

    /// What serving v0.42's reconciler sets with a default config-observability.
    const CLASSIC_DEFAULTS: &[(&str, &str)] = &[
        ("SERVING_REQUEST_LOG_TEMPLATE", DEFAULT_REQUEST_LOG_TEMPLATE),
        ("SERVING_ENABLE_REQUEST_LOG", "false"),
        ("SERVING_REQUEST_METRICS_BACKEND", "prometheus"),
        ("SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS", "5"),
        ("TRACING_CONFIG_BACKEND", "none"),
        ("TRACING_CONFIG_ZIPKIN_ENDPOINT", ""),
        ("TRACING_CONFIG_DEBUG", "false"),
        ("TRACING_CONFIG_SAMPLE_RATE", "0.1"),
        ("ENABLE_PROFILING", "false"),
        ("SERVING_ENABLE_PROBE_REQUEST_LOG", "false"),
        ("METRICS_COLLECTOR_ADDRESS", ""),
    ];

    #[test]
    fn classic_defaults() {
        let Observability::Classic(c) = classic(CLASSIC_DEFAULTS).unwrap() else {
            panic!("expected classic");
        };
        assert_eq!(c.request_metrics_backend, MetricsBackend::Prometheus);
        assert_eq!(
            c.request_metrics_reporting_period,
            Some(Duration::from_secs(5))
        );
        assert_eq!(c.tracing_backend, TracingBackend::None);
        assert_eq!(c.sample_rate, 0.1);
        assert_eq!(c.zipkin_endpoint, None);
        assert!(!c.request_log.enabled);
        assert_eq!(c.request_log.template, DEFAULT_REQUEST_LOG_TEMPLATE);
    }

    #[test]
    fn a_request_log_template_that_does_not_parse_is_rejected_when_enabled() {
        let bad = "{{.Request.Method";
        let e = classic(&[
            ("SERVING_ENABLE_REQUEST_LOG", "true"),
            ("SERVING_REQUEST_LOG_TEMPLATE", bad),
        ])
        .unwrap_err();
        assert_eq!(e.variable(), "SERVING_REQUEST_LOG_TEMPLATE");
        assert!(e.to_string().contains("does not parse"), "{e}");
        // Off, it is never used, as in Knative.
        assert!(classic(&[("SERVING_REQUEST_LOG_TEMPLATE", bad)]).is_ok());
        let json = r#"{"enableRequestLog":true,"requestLogTemplate":"{{nofunc}}"}"#;
        let e = classic(&[("OBSERVABILITY_CONFIG", json)]).unwrap_err();
        assert_eq!(e.variable(), "OBSERVABILITY_CONFIG");
    }

    #[test]
    fn classic_without_any_variable_is_all_off() {
        let o = classic(&[]).unwrap();
        assert_eq!(o.generation(), Generation::Classic);
        assert!(!o.prometheus_metrics());
        assert!(!o.profiling());
        assert!(!o.request_log().enabled);
    }

    #[test]
    fn classic_backends_are_lenient_like_knative() {
        let mut warnings = Vec::new();
        let vars = Vars::from_pairs([
            ("SERVING_REQUEST_METRICS_BACKEND", "stackdriver"),
            ("TRACING_CONFIG_BACKEND", "jaeger"),
        ]);
        let Observability::Classic(c) = from_vars(&vars, &mut warnings).unwrap() else {
            panic!("expected classic");
        };
        assert_eq!(c.request_metrics_backend, MetricsBackend::None);
        assert_eq!(c.tracing_backend, TracingBackend::None);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with(r#"SERVING_REQUEST_METRICS_BACKEND="stackdriver""#));

        // Knative lower-cases the metrics backend.
        let o = classic(&[("SERVING_REQUEST_METRICS_BACKEND", "Prometheus")]).unwrap();
        assert!(o.prometheus_metrics());
    }

    #[test]
    fn classic_rejects_bad_values() {
        assert!(classic(&[("TRACING_CONFIG_SAMPLE_RATE", "lots")]).is_err());
        assert!(classic(&[("TRACING_CONFIG_SAMPLE_RATE", "1.5")]).is_err());
        assert!(classic(&[("SERVING_ENABLE_REQUEST_LOG", "yes")]).is_err());
        assert!(classic(&[("ENABLE_PROFILING", "")]).is_err());
        assert!(classic(&[("SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS", "x")]).is_err());
    }

    #[test]
    fn current_is_chosen_when_observability_config_is_set() {
        // Classic variables are not read (and so not validated) then.
        let json = r#"{"tracing":{"protocol":"grpc","endpoint":"http://otel:4317","samplingRate":0.5},"metrics":{},"runtime":{"profiling":"enabled","exportInterval":15000000000},"requestMetrics":{"protocol":"prometheus","exportInterval":30000000000},"enableRequestLog":true}"#;
        let o = classic(&[
            ("OBSERVABILITY_CONFIG", json),
            ("SERVING_REQUEST_METRICS_BACKEND", "bogus"),
        ])
        .unwrap();
        assert_eq!(o.generation(), Generation::Current);
        let Observability::Current(c) = &o else {
            panic!("expected current")
        };
        assert_eq!(c.tracing.protocol, TracingProtocol::Grpc);
        assert_eq!(c.tracing.endpoint.as_deref(), Some("http://otel:4317"));
        assert_eq!(c.tracing.sampling_rate, 0.5);
        assert_eq!(c.metrics.protocol, MetricsProtocol::None);
        assert_eq!(c.request_metrics.protocol, MetricsProtocol::Prometheus);
        assert_eq!(
            c.request_metrics.export_interval,
            Some(Duration::from_secs(30))
        );
        assert!(o.prometheus_metrics());
        assert!(o.profiling());
        assert!(c.request_log.enabled);
        assert_eq!(c.request_log.template, DEFAULT_REQUEST_LOG_TEMPLATE);
    }

    #[test]
    fn current_empty_document_takes_knative_defaults() {
        let Observability::Current(c) = classic(&[("OBSERVABILITY_CONFIG", "{}")]).unwrap() else {
            panic!("expected current")
        };
        assert_eq!(c.tracing.protocol, TracingProtocol::None);
        assert_eq!(c.request_metrics.protocol, MetricsProtocol::None);
        assert!(!c.runtime.profiling);
        assert!(!c.request_log.enabled);
    }

    #[test]
    fn current_ignores_unknown_keys() {
        let json = r#"{"somethingNew":{"a":1},"tracing":{"protocol":"none","future":true}}"#;
        assert!(classic(&[("OBSERVABILITY_CONFIG", json)]).is_ok());
    }

    #[test]
    fn current_rejects_bad_documents() {
        for bad in [
            "{",
            "[]",
            r#"{"metrics":{"protocol":"carrier-pigeon"}}"#,
            r#"{"requestMetrics":{"protocol":""}}"#,
            r#"{"tracing":{"protocol":"zipkin"}}"#,
            r#"{"tracing":{"samplingRate":2}}"#,
            r#"{"runtime":{"profiling":"on"}}"#,
            r#"{"metrics":{"exportInterval":"10s"}}"#,
            r#"{"metrics":{"exportInterval":-1}}"#,
            r#"{"enableRequestLog":"true"}"#,
        ] {
            let err = classic(&[("OBSERVABILITY_CONFIG", bad)]).unwrap_err();
            assert!(
                err.to_string().starts_with("OBSERVABILITY_CONFIG="),
                "{bad}: {err}"
            );
        }
    }
}
