//! qproxy's own metrics besides the autoscaler's view: served on the user
//! metrics port after the request metrics, with the same labels, and
//! pushed with them where current Knative pushes them over OTLP.

use std::sync::Arc;

use crate::common::startup::Startup;
use crate::observe::adaptive_limit::AdaptiveLimit;
use crate::observe::queue_wait::QueueWait;

/// The start-up's spans, the queue's waits and the adaptive limit; cheap
/// to clone.
#[derive(Debug, Clone)]
pub(crate) struct Extra {
    /// The start-up's spans ([`startup`](crate::common::startup)).
    pub(crate) startup: Arc<Startup>,
    /// The queue's waits, where there is a queue
    /// ([`queue_wait`](crate::observe::queue_wait)).
    pub(crate) queue_wait: Option<Arc<QueueWait>>,
    /// The adaptive concurrency limit, where the option gave one
    /// ([`adaptive_limit`](crate::observe::adaptive_limit)).
    pub(crate) adaptive: Option<AdaptiveLimit>,
}
