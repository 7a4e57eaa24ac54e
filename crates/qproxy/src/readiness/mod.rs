//! The user container's readiness probe, run from inside the pod.
//!
//! Knative moves the user container's readiness probe into the queue-proxy:
//! the kubelet and the activator ask the queue-proxy (health checks with
//! `K-Network-Probe: queue`), and the queue-proxy runs the probe against
//! the app on loopback. [`Readiness::check`] is that run:
//!
//! - every probe of the list runs at once, and all must pass;
//! - a probe whose `periodSeconds` is `0` is *aggressive*: it is tried
//!   every 50 ms, each try bounded by 100 ms, until `successThreshold`
//!   consecutive passes (counted across checks, as Knative counts them) or
//!   10 s; any other probe is tried once, bounded by `timeoutSeconds`;
//! - checks asked for while one runs share its result (single flight), and
//!   the run goes on even if the health check that started it goes away.
//!
//! The kinds are in [`http`] (`httpGet`), [`grpc`] (`grpc`) and here
//! (`tcpSocket`).

pub(crate) mod attempt;
pub(crate) mod error;
pub(crate) mod grpc;
pub(crate) mod http;

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::Probe;

pub(crate) use attempt::HttpOptions;
use attempt::host_or_loopback;
use error::ProbeError;

/// Interval between the tries of an aggressive probe.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_millis(50);
/// Bound on each try of an aggressive probe.
pub(crate) const AGGRESSIVE_TRY_TIMEOUT: Duration = Duration::from_millis(100);
/// How long an aggressive probe keeps trying.
pub(crate) const POLL_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on a try when `timeoutSeconds` is 0, Kubernetes' default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Runs the readiness probes; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Readiness {
    inner: Option<Arc<Prober>>,
}

#[derive(Debug)]
struct Prober {
    checks: Vec<Arc<Check>>,
    /// The run under way, whose result every caller shares.
    flight: Mutex<Option<watch::Receiver<Option<bool>>>>,
}

#[derive(Debug)]
struct Check {
    probe: Probe,
    http: HttpOptions,
    /// Consecutive passes, kept across runs as Knative keeps them.
    passes: AtomicI32,
}

impl Readiness {
    /// A readiness check running `probes`; with none, every check passes.
    pub(crate) fn new(probes: Vec<Probe>, http: HttpOptions) -> Self {
        if probes.is_empty() {
            return Self { inner: None };
        }
        let checks = probes
            .into_iter()
            .map(|probe| {
                Arc::new(Check {
                    probe,
                    http,
                    passes: AtomicI32::new(0),
                })
            })
            .collect();
        Self {
            inner: Some(Arc::new(Prober {
                checks,
                flight: Mutex::new(None),
            })),
        }
    }

    /// Whether there is a probe to run.
    pub(crate) fn is_configured(&self) -> bool {
        self.inner.is_some()
    }

    /// Runs the probes, or joins the run under way, and tells whether the
    /// app is ready.
    pub(crate) async fn check(&self) -> bool {
        let Some(prober) = &self.inner else {
            return true;
        };
        let mut result = prober.join_or_start();
        match result.wait_for(Option::is_some).await {
            Ok(ready) => ready.unwrap_or(false),
            // The run's task is gone without an answer: not ready.
            Err(_) => false,
        }
    }
}

impl Prober {
    fn join_or_start(self: &Arc<Self>) -> watch::Receiver<Option<bool>> {
        let mut flight = self.flight.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = flight.as_ref() {
            tracing::debug!("readiness check joins the probe run under way");
            return running.clone();
        }
        let (tx, rx) = watch::channel(None);
        *flight = Some(rx.clone());
        let prober = self.clone();
        tokio::spawn(async move {
            // However the run ends, the next check starts a new one.
            let _landed = Landed(prober.clone());
            let ready = prober.run().await;
            let _ = tx.send(Some(ready));
        });
        rx
    }

    async fn run(&self) -> bool {
        let mut running = JoinSet::new();
        for check in &self.checks {
            let check = check.clone();
            running.spawn(async move { check.run().await });
        }
        let mut first_error = None;
        while let Some(done) = running.join_next().await {
            let outcome = done.unwrap_or(Err(ProbeError::Unsupported("probe task failed")));
            if let Err(e) = outcome {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            None => true,
            Some(e) => {
                tracing::warn!(error = %e, "readiness probe failed");
                false
            }
        }
    }
}

/// Clears the flight of its prober when dropped.
struct Landed(Arc<Prober>);

impl Drop for Landed {
    fn drop(&mut self) {
        *self.0.flight.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Check {
    async fn run(&self) -> Result<(), ProbeError> {
        if self.probe.period_seconds != 0 {
            let timeout = match self.probe.timeout_seconds {
                n if n > 0 => Duration::from_secs(n.unsigned_abs().into()),
                _ => DEFAULT_TIMEOUT,
            };
            return self.try_once(timeout).await;
        }
        self.run_aggressively().await
    }

    /// Knative's aggressive probing: tries every [`RETRY_INTERVAL`] until
    /// enough consecutive passes, for at most [`POLL_TIMEOUT`].
    async fn run_aggressively(&self) -> Result<(), ProbeError> {
        let give_up = tokio::time::Instant::now() + POLL_TIMEOUT;
        let mut ticks = tokio::time::interval(RETRY_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0;
        let mut last = None;
        loop {
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(give_up) => break,
                _ = ticks.tick() => {}
            }
            match self.try_once(AGGRESSIVE_TRY_TIMEOUT).await {
                Ok(()) => {
                    let passes = self.passes.fetch_add(1, Ordering::Relaxed) + 1;
                    if passes >= self.probe.success_threshold {
                        return Ok(());
                    }
                }
                Err(e) => {
                    self.passes.store(0, Ordering::Relaxed);
                    failures += 1;
                    last = Some(e);
                }
            }
        }
        Err(match last {
            Some(last) => ProbeError::Aggressive {
                failures,
                last: Box::new(last),
            },
            None => ProbeError::NotEnoughPasses,
        })
    }

    /// One try, bounded by `timeout`: as in Knative, each HTTP request of
    /// the try (h2c detection, then the probe) has that long, redirects
    /// included; a TCP or gRPC try has it all in all.
    async fn try_once(&self, timeout: Duration) -> Result<(), ProbeError> {
        let probe = &self.probe;
        if let Some(get) = &probe.http_get {
            return http::probe(get, self.http, timeout).await;
        }
        let attempt = async {
            if let Some(tcp) = &probe.tcp_socket {
                let addr = format!("{}:{}", host_or_loopback(&tcp.host), tcp.port.0);
                tcp_probe(addr).await
            } else if let Some(grpc) = &probe.grpc {
                grpc::probe(grpc, timeout).await
            } else if probe.exec.is_some() {
                // Knative turns exec probes into TCP probes before they get here.
                Err(ProbeError::Unsupported("exec probe not supported"))
            } else {
                Err(ProbeError::Unsupported("no probe found"))
            }
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or(Err(ProbeError::Timeout(timeout)))
    }
}

/// A TCP probe: the app accepts a connection.
async fn tcp_probe(addr: String) -> Result<(), ProbeError> {
    match tokio::net::TcpStream::connect(&addr).await {
        Ok(_) => Ok(()),
        Err(source) => Err(ProbeError::Connect { addr, source }),
    }
}
