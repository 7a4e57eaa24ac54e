//! The main port's layers that follow a request without answering it:
//! request logs, traces, request metrics and the autoscaler's statistics,
//! and what they share ([`observe`]: a group of them served as one). The
//! `qproxy` crate's stack puts each where Knative's handler of the same
//! concern sits.

pub mod metrics;
pub mod observe;
pub mod request_log;
pub mod stats;
pub mod trace;
