//! What qproxy tells its operators: logs, request metrics, request logs and
//! traces.

pub mod log;
pub mod request_log;
pub mod request_metrics;
pub mod traces;
pub mod zipkin;
