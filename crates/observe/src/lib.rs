//! What qproxy tells its operators: logs, request metrics, request logs and
//! traces, their settings ([`config`]), and the layers of the main port that
//! feed them ([`layers`]); with the start-up's spans ([`startup`]), a
//! request's wait for a slot on its way to its log line ([`waits`]) and
//! the one outcome guard request metrics and request logs share
//! ([`outcome`]).
//!
//! [`Observers::new`] reads which of them the configuration turns on, and
//! for which generation of Knative; the main port's layers report to them,
//! the user metrics port (9091) serves the metrics, the autoscaler's
//! view and the start-up's spans ([`MetricsEndpoint`]),
//! and [`Observers::flush`] sends what the exporters still hold at exit.

pub mod adaptive_limit;
pub mod autoscaler_view;
pub mod config;
pub mod export;
pub mod extra;
pub mod layers;
pub mod log;
pub mod opencensus_metrics;
pub mod otel_metrics;
pub mod otlp;
pub mod outcome;
pub mod prom_text;
pub mod queue_wait;
pub mod request_log;
pub mod semconv;
pub mod startup;
pub mod traces;
pub mod waits;
pub mod zipkin;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use http::{Request, Response};
use qproxy_core::body::RequestBody;
use tokio::task::JoinHandle;

use crate::config::{MetricsProtocol, Observability};
use qproxy_core::body::ReplyBody;
use qproxy_core::config::Revision;
use qproxy_core::{Endpoint, metrics_route};

use autoscaler_view::AutoscalerView;
pub use export::ExportError;
pub use extra::Extra;
use opencensus_metrics::OpenCensusMetrics;
use otel_metrics::OtelMetrics;
use request_log::{RequestLog, SharedRequestLog};
use traces::Traces;

/// The request metrics served on the user metrics port (9091), of
/// whichever generation started qproxy; cheap to clone.
#[derive(Debug, Clone)]
pub enum UserMetrics {
    /// Classic Knative's (`SERVING_REQUEST_METRICS_BACKEND=prometheus`).
    Classic(opencensus_metrics::OpenCensusMetrics),
    /// Current Knative's (`requestMetrics.protocol: prometheus`).
    Current(otel_metrics::OtelMetrics),
}

impl UserMetrics {
    /// The request metrics `config` asks for, if any: classic Knative's
    /// Prometheus series, or current Knative's instruments, served as
    /// Prometheus text or pushed over OTLP (with qproxy's own `extra`).
    fn new(
        observability: &Observability,
        revision: &Revision,
        user_port: u16,
        extra: &Extra,
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
    /// [`opencensus_metrics::UPKEEP_PERIOD`].
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

/// Every observer of requests the configuration turns on; cheap to clone.
#[derive(Debug, Clone)]
pub struct Observers {
    /// Request metrics, when kept.
    pub request_metrics: Option<UserMetrics>,
    /// The request log, when enabled.
    pub request_log: Option<SharedRequestLog>,
    /// Traces, when exported.
    pub traces: Option<Traces>,
}

impl Observers {
    /// The observers `observability` asks for, for `revision`'s app on
    /// `user_port`; qproxy's own `extra` metrics go with the request
    /// metrics where they are pushed.
    pub fn new(
        observability: &Observability,
        revision: &Revision,
        user_port: u16,
        extra: &Extra,
    ) -> Result<Self, ExportError> {
        let log = observability.request_log();
        // The configuration checked the template; one that failed here
        // would only mean no request log.
        let request_log = match log.template() {
            Some(Ok(template)) => Some(Arc::new(RequestLog::new(
                template,
                &log.template,
                log.probes,
                observability.generation(),
                revision.clone(),
            ))),
            _ => None,
        };
        let traces = Traces::new(
            observability,
            revision,
            SocketAddr::from((Ipv4Addr::LOCALHOST, user_port)),
        )?;
        Ok(Self {
            request_metrics: UserMetrics::new(observability, revision, user_port, extra)?,
            request_log,
            traces,
        })
    }

    /// Starts the upkeep of the request metrics, if any: their histograms
    /// folded every [`opencensus_metrics::UPKEEP_PERIOD`].
    pub fn spawn_upkeep(&self) -> Option<JoinHandle<()>> {
        let metrics = self.request_metrics.clone()?;
        Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(opencensus_metrics::UPKEEP_PERIOD);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticks.tick().await;
                metrics.run_upkeep();
            }
        }))
    }

    /// What the user metrics port serves: the request metrics, the
    /// autoscaler's view and the start-up's spans.
    pub fn metrics_endpoint(&self, autoscaler: AutoscalerView, extra: Extra) -> MetricsEndpoint {
        MetricsEndpoint {
            request_metrics: self.request_metrics.clone(),
            autoscaler,
            extra,
        }
    }

    /// Sends what the trace and metrics exporters still hold. Their
    /// shutdown blocks, so it runs off the runtime's threads.
    pub async fn flush(self) {
        let exports = tokio::task::spawn_blocking(move || {
            if let Some(traces) = self.traces {
                traces.shutdown();
            }
            if let Some(UserMetrics::Current(m)) = self.request_metrics {
                m.shutdown();
            }
        });
        let _ = exports.await;
    }
}

/// The Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The user metrics server on 9091: the request metrics as Prometheus text
/// (none where none are kept), then the autoscaler's view
/// ([`autoscaler_view`]) and the [`Extra`] metrics, with the same labels.
#[derive(Debug, Clone)]
pub struct MetricsEndpoint {
    request_metrics: Option<UserMetrics>,
    autoscaler: AutoscalerView,
    extra: Extra,
}

impl MetricsEndpoint {
    fn answer<B>(&self, req: &Request<B>) -> Response<ReplyBody> {
        metrics_route(req, PROMETHEUS_TEXT, || {
            let mut text = self
                .request_metrics
                .as_ref()
                .map(UserMetrics::render)
                .unwrap_or_default();
            self.autoscaler.render(&mut text);
            let labels = self.autoscaler.labels();
            self.extra.startup.render(labels, &mut text);
            if let Some(waits) = &self.extra.queue_wait {
                waits.render(labels, &mut text);
            }
            if let Some(limit) = &self.extra.adaptive {
                limit.render(labels, &mut text);
            }
            text.into()
        })
    }
}

impl Endpoint for MetricsEndpoint {
    fn respond(
        self,
        req: Request<RequestBody>,
    ) -> impl Future<Output = Response<ReplyBody>> + Send {
        std::future::ready(self.answer(&req))
    }
}
