//! qproxy's own metrics besides the autoscaler's view: served on the user
//! metrics port after the request metrics, with the same labels, and
//! pushed with them where current Knative pushes them over OTLP.

use std::sync::Arc;

use crate::adaptive_limit::AdaptiveLimit;
use crate::queue_wait::QueueWait;
use crate::startup::Startup;

/// The start-up's spans, the queue's waits and the adaptive limit; cheap
/// to clone.
#[derive(Debug, Clone)]
pub struct OwnMetrics {
    /// The start-up's spans ([`startup`](crate::startup)).
    pub startup: Arc<Startup>,
    /// The queue's waits, where there is a queue
    /// ([`queue_wait`](crate::queue_wait)).
    pub queue_wait: Option<Arc<QueueWait>>,
    /// The adaptive concurrency limit, where the option gave one
    /// ([`adaptive_limit`](crate::adaptive_limit)).
    pub adaptive: Option<AdaptiveLimit>,
}
