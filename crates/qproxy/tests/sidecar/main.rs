//! The sidecar's integration tests: the real `qproxy` binary, started as a
//! child process with Knative's environment, in front of real apps on
//! loopback, driven by real clients. One test binary, a module per theme;
//! what the tests share (the process, apps, clients) is the
//! `qproxy-test-support` crate.
//!
//! Everything here needs Rust alone. Tests that also need Go, skopeo or
//! kustomize (comparisons with Knative's Go queue-proxy, the image, the
//! overlay) are in `tests/e2e`.

// A test fails by panicking, with what went wrong.
#![allow(clippy::unwrap_used)]

mod concurrency;
mod drain;
mod failures;
mod h2_abuse;
mod headers;
mod health;
mod hostile;
mod layering;
mod metrics;
mod options;
mod otel_env;
mod otlp_metrics;
mod process;
mod profiling;
mod protocols;
mod readiness;
mod request_log;
mod stats;
mod timeouts;
mod tls;
mod traces;
