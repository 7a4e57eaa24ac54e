//! What qproxy tells its operators: logs (and, later, metrics and traces).

pub mod log;
