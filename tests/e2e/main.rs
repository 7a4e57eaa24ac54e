//! qproxy checked against the outside world, end to end: side by side
//! with Knative's own Go queue-proxy (built from the Go module proxy by
//! `tests/oracle`), rendered by Go's `text/template`, read by
//! `go tool pprof`, h2spec's HTTP/2 cases, and the image and the Knative overlay opened by the
//! tools a cluster uses (skopeo, kustomize).
//!
//! Each test that needs a tool beyond Rust is `#[ignore]`d with the tool
//! named, so that `cargo test --workspace` passes with Rust alone;
//! `scripts/test` installs the tools and runs them all
//! (`cargo test --workspace -- --include-ignored`).

// A test fails by panicking, with what went wrong.
#![allow(clippy::unwrap_used)]

mod current;
mod go_template;
mod h2spec;
mod health;
mod hostile;
mod image;
mod metrics;
mod overlay;
mod profiling;
mod request_log;
