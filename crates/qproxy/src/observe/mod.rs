//! What qproxy tells its operators: logs, request metrics, request logs and
//! traces.

pub mod current_metrics;
pub mod log;
pub mod request_log;
pub mod request_metrics;
pub mod semconv;
pub mod traces;
pub mod zipkin;

/// The request metrics served on the user metrics port (9091), of
/// whichever generation started qproxy; cheap to clone.
#[derive(Debug, Clone)]
pub enum UserMetrics {
    /// Classic Knative's (`SERVING_REQUEST_METRICS_BACKEND=prometheus`).
    Classic(request_metrics::RequestMetrics),
    /// Current Knative's (`requestMetrics.protocol: prometheus`).
    Current(current_metrics::CurrentMetrics),
}

impl UserMetrics {
    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        match self {
            UserMetrics::Classic(m) => m.render(),
            UserMetrics::Current(m) => m.render(),
        }
    }

    /// Folds recorded histogram samples into their buckets; run every
    /// [`request_metrics::UPKEEP_PERIOD`].
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
