//! qproxy: a drop-in replacement for Knative Serving's queue-proxy.
//!
//! Knative starts a queue-proxy next to every serverless app: every request
//! to the app crosses it. qproxy starts where the queue-proxy starts (same
//! environment, same ports) and answers the same way, at a fraction of the
//! cost.
//!
//! The binary (`main.rs`) reads the environment into a [`Config`] and calls
//! [`run`] on one thread (a Tokio current-thread runtime; a pool when
//! `QPROXY_WORKERS` asks for one); the rest of the crate is private to it.
//!
//! Below this crate, and kept there by Cargo: [`qproxy_core`] (what every
//! layer shares: bodies, a request's facts, Go-shaped answers, header
//! names, the revision, the generation and qproxy's options),
//! [`qproxy_observe`] (logs, request metrics, request logs, traces, and the
//! layers that feed them), and [`qproxy_transport`] (HTTP/1.1, both sides).
//! Inside, from the bottom up (each module uses only those above it in
//! this list):
//!
//! - [`config`]: the environment contract, parsed once into a [`Config`];
//!   beside it what the layers above share and import nothing of qproxy's:
//!   `go` (Go's formatting of durations and strings), `tunnel_registry`
//!   (the upgraded connections open, for the drain) and `dir_events` (the
//!   events of a directory the kubelet mounts);
//! - `readiness`: the user container's readiness probe;
//! - `drain`: stopping without losing a request;
//! - `proxy`: the reverse proxy to the user container;
//! - `tls`: the TLS port's settings, certificate and its reloading;
//! - `layers`: the main port's request layers that answer or change
//!   requests, one concern each;
//! - `stack`: those layers and the observers, assembled in Knative's order;
//! - `admin`, `stat_server`, `profiling`: the small servers beside the main port;
//! - [`server`]: listeners, connections, and the whole sidecar's start and
//!   stop ([`Server`]);
//! - the crate root's own items: [`run`] and [`shutdown_signal`];
//! - [`demo`]: a hello app with qproxy in front, for a first look.
//!
//! [`headers`] makes Knative's per-request header rules public, for the
//! microbenchmarks.

mod admin;
pub mod config;
pub mod demo;
mod dir_events;
mod drain;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
mod go;
mod layers;
mod profiling;
mod proxy;
mod readiness;
pub mod server;
mod stack;
mod stat_server;
mod tls;
mod tunnel_registry;

pub mod headers {
    //! Knative's per-request header rules, as plain functions over a
    //! request or its headers: what the main port applies to every request
    //! and response. They are public for the microbenchmarks
    //! (`benches/headers.rs`); the sidecar applies them in its layers and
    //! its reverse proxy.

    pub use crate::layers::forwarded::shim as forwarded_shim;
    pub use crate::layers::host_rewrite::rewrite as host_rewrite;
    pub use crate::proxy::hop::{Hop, prepare_request, prepare_response};
}

use std::future::Future;

pub use config::{Config, ConfigError};
pub use qproxy_observe::ExportError;
pub use server::{Addrs, BindError, Error, Server};
pub use tls::{CertError, TlsError};

/// Sets up logging as `config` asks (Knative's zap JSON lines, at its
/// level), and logs the warnings the configuration gave.
pub fn init_logging(config: &Config) {
    qproxy_observe::log::init(&config.logging, &config.revision, &config.warnings);
}

/// Serves `config` until SIGTERM or SIGINT, then drains and returns.
pub async fn run(config: Config) -> Result<(), Error> {
    // Signals are watched before any port is served, so that a stop
    // request is never met by the default action (an abrupt exit).
    let shutdown = shutdown_signal()?;
    Server::bind(config)?.run(shutdown).await?;
    Ok(())
}

/// Starts watching for SIGTERM (Kubernetes stopping the pod) and SIGINT
/// (Ctrl-C) at once; the returned future completes on the first of them.
/// A second signal, while the first one's drain runs, exits at once with
/// status 1, as Knative's signal handling does. Must be called within a
/// Tokio runtime.
pub fn shutdown_signal() -> Result<impl Future<Output = ()>, Error> {
    use tokio::signal::unix::{SignalKind, signal};

    let watch = |kind| {
        signal(kind).map_err(|source| Error::Io {
            context: "cannot watch signals",
            source,
        })
    };
    let mut term = watch(SignalKind::terminate())?;
    let mut int = watch(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::error!("Received a second signal, exiting at once");
            std::process::exit(1);
        });
    })
}
