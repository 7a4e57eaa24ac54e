//! The observability settings of the environment contract: logging
//! (`SERVING_LOGGING_CONFIG`, `SERVING_LOGGING_LEVEL`), metrics, tracing
//! and request logs in both of the shapes Knative has used, and the
//! OpenTelemetry variables of current Knative. The `qproxy` crate's
//! `config` module reads them as part of its `Config` and re-exports them.

mod logging;
mod observability;
mod otel;

pub use logging::{Level, LevelStyle, LogOutput, LogSampling, Logging, TimeStyle};
pub use observability::{
    Classic, Current, DEFAULT_REQUEST_LOG_TEMPLATE, MetricsBackend, MetricsConfig, MetricsProtocol,
    Observability, RequestLogConfig, RuntimeConfig, TracingBackend, TracingConfig, TracingProtocol,
    from_vars as observability_from_vars,
};
pub use otel::{OtelEnv, TlsFiles};
