//! What qproxy tells its operators: logs and request metrics (traces to
//! come).

pub mod log;
pub mod request_metrics;
