//! What qproxy tells its operators: logs ([`log`]), request metrics
//! ([`request_metrics`]), request logs ([`request_log`]), traces
//! ([`traces`]) and the autoscaler's statistics ([`autoscaler_stats`]), each
//! with the main port's layer that feeds it (its `layer` module, as tower
//! names them), and their settings ([`config`]). The layers are
//! [`observing::Observe`]rs: they follow a request without answering it,
//! and adjacent ones are served as one. Beside them: qproxy's own metrics
//! ([`own_metrics`]: the start-up's spans, [`startup`]; the queue's waits,
//! [`queue_wait`], told by [`waits`]; the adaptive limit), and the one
//! outcome guard request metrics and request logs share ([`outcome`]).
//!
//! [`Observers::new`] reads which of them the configuration turns on, and
//! for which generation of Knative; the main port's layers report to them,
//! the user metrics port (9091) serves the metrics, the autoscaler's
//! view and the start-up's spans ([`MetricsEndpoint`]),
//! and [`Observers::flush`] sends what the exporters still hold at exit.

pub mod adaptive_limit;
pub mod autoscaler_stats;
pub mod config;
pub mod export;
pub mod log;
pub mod observing;
pub mod otlp;
pub mod outcome;
pub mod own_metrics;
pub mod prom_text;
pub mod queue_wait;
pub mod request_log;
pub mod request_metrics;
pub mod semconv;
pub mod startup;
pub mod traces;
pub mod waits;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use http::{Request, Response};
use qproxy_core::body::RequestBody;
use tokio::task::JoinHandle;

use crate::config::Observability;
use qproxy_core::body::ReplyBody;
use qproxy_core::config::Revision;
use qproxy_core::{Endpoint, metrics_route};

use autoscaler_stats::view::AutoscalerView;
pub use export::ExportError;
pub use own_metrics::OwnMetrics;
use request_log::{RequestLog, SharedRequestLog};
use request_metrics::UserMetrics;
use traces::Traces;

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
    /// `user_port`; qproxy's `own_metrics` go with the request
    /// metrics where they are pushed.
    pub fn new(
        observability: &Observability,
        revision: &Revision,
        user_port: u16,
        own_metrics: &OwnMetrics,
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
            request_metrics: UserMetrics::new(observability, revision, user_port, own_metrics)?,
            request_log,
            traces,
        })
    }

    /// Starts the upkeep of the request metrics, if any: their histograms
    /// folded every [`request_metrics::opencensus::UPKEEP_PERIOD`].
    pub fn spawn_upkeep(&self) -> Option<JoinHandle<()>> {
        let metrics = self.request_metrics.clone()?;
        Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(request_metrics::opencensus::UPKEEP_PERIOD);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticks.tick().await;
                metrics.run_upkeep();
            }
        }))
    }

    /// What the user metrics port serves: the request metrics, the
    /// autoscaler's view and the start-up's spans.
    pub fn metrics_endpoint(
        &self,
        autoscaler: AutoscalerView,
        own_metrics: OwnMetrics,
    ) -> MetricsEndpoint {
        MetricsEndpoint {
            request_metrics: self.request_metrics.clone(),
            autoscaler,
            own_metrics,
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
/// ([`autoscaler_stats::view`]) and [`OwnMetrics`], with the same labels.
#[derive(Debug, Clone)]
pub struct MetricsEndpoint {
    request_metrics: Option<UserMetrics>,
    autoscaler: AutoscalerView,
    own_metrics: OwnMetrics,
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
            self.own_metrics.startup.render(labels, &mut text);
            if let Some(waits) = &self.own_metrics.queue_wait {
                waits.render(labels, &mut text);
            }
            if let Some(limit) = &self.own_metrics.adaptive {
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
