//! What qproxy tells its operators: logs, request metrics and request logs
//! (traces to come).

pub mod log;
pub mod request_log;
pub mod request_metrics;
