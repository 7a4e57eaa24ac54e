//! Request metrics of both generations: classic Knative's OpenCensus-era
//! series ([`opencensus`]) and current Knative's OpenTelemetry instruments
//! ([`otel`]), served as Prometheus text on 9091 or pushed over OTLP, and
//! the main port's [`layer`] that measures each request where Knative's
//! handlers do.

pub mod layer;
pub mod opencensus;
pub mod otel;

use qproxy_core::config::Revision;

use crate::config::{MetricsProtocol, Observability};
use crate::export::ExportError;
use crate::own_metrics::OwnMetrics;
use opencensus::OpenCensusMetrics;
use otel::OtelMetrics;

/// The request metrics served on the user metrics port (9091), of
/// whichever generation started qproxy; cheap to clone.
#[derive(Debug, Clone)]
pub enum UserMetrics {
    /// Classic Knative's (`SERVING_REQUEST_METRICS_BACKEND=prometheus`).
    Classic(opencensus::OpenCensusMetrics),
    /// Current Knative's (`requestMetrics.protocol: prometheus`).
    Current(otel::OtelMetrics),
}

impl UserMetrics {
    /// The request metrics `config` asks for, if any: classic Knative's
    /// Prometheus series, or current Knative's instruments, served as
    /// Prometheus text or pushed over OTLP (with qproxy's own `extra`).
    pub(crate) fn new(
        observability: &Observability,
        revision: &Revision,
        user_port: u16,
        extra: &OwnMetrics,
    ) -> Result<Option<Self>, ExportError> {
        Ok(match observability {
            o if o.classic_prometheus_metrics() => {
                Some(UserMetrics::Classic(OpenCensusMetrics::new(revision)))
            }
            Observability::Current(c) => match c.request_metrics.protocol {
                MetricsProtocol::Prometheus => Some(UserMetrics::Current(OtelMetrics::prometheus(
                    revision, &c.otel, user_port,
                ))),
                MetricsProtocol::Grpc | MetricsProtocol::HttpProtobuf => {
                    Some(UserMetrics::Current(OtelMetrics::otlp(
                        &c.request_metrics,
                        &c.otel,
                        revision,
                        user_port,
                        extra,
                    )?))
                }
                MetricsProtocol::None => None,
            },
            _ => None,
        })
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        match self {
            UserMetrics::Classic(m) => m.render(),
            UserMetrics::Current(m) => m.render(),
        }
    }

    /// Folds recorded histogram samples into their buckets; run every
    /// [`opencensus::UPKEEP_PERIOD`].
    pub fn run_upkeep(&self) {
        match self {
            UserMetrics::Classic(m) => m.run_upkeep(),
            UserMetrics::Current(m) => m.run_upkeep(),
        }
    }

    /// Sets the queue depth: the requests inside the breaker.
    pub fn set_queue_depth(&self, depth: u32) {
        match self {
            UserMetrics::Classic(m) => m.set_queue_depth(depth),
            UserMetrics::Current(m) => m.set_queue_depth(depth),
        }
    }
}
