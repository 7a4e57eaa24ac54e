//! The drain: how a pod that is going away stops getting traffic without
//! losing any.
//!
//! When Kubernetes stops a pod it sends `SIGTERM` and, at about the same
//! time, starts taking the pod out of the endpoints every client routes by;
//! that takes a while to reach everyone. Meanwhile requests keep coming.
//! So, as Knative's `Drainer` does, a drain:
//!
//! - makes every health check fail at once (`503 shutting down`), which
//!   takes the pod out of the activator's and the ingress' rotation;
//! - keeps serving every request that still arrives;
//! - completes once a *quiet period* (30 s in Knative) has passed with no
//!   request arriving; each request starts the period again.
//!
//! Once a drain has lasted a whole quiet period the endpoints have
//! changed everywhere; a request still arriving came over a connection
//! opened before, and its answer closes that connection, so that its
//! client dials again and reaches a pod that stays.
//!
//! Only then are the listeners closed; [`Shutdown`] runs that whole way
//! out. [`Drainer::reset`] calls a drain off (the `/wait-for-drain` hook
//! uses it when no `SIGTERM` follows).
//!
//! The request path pays one relaxed atomic load per request while nothing
//! drains.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::go::go_duration;
use crate::tunnel_registry::Tunnels;

/// Drains the main port; cheap to clone, every clone is the same drain.
#[derive(Debug, Clone)]
pub(crate) struct Drainer {
    inner: Arc<DrainerState>,
}

#[derive(Debug)]
struct DrainerState {
    quiet: Duration,
    /// Origin of `last_request`.
    epoch: Instant,
    /// Set from the start of a drain until it is reset.
    draining: AtomicBool,
    /// When the latest request arrived during a drain, in nanoseconds since
    /// `epoch`.
    last_request: AtomicU64,
    /// When the drain under way started, in nanoseconds since `epoch`.
    started: AtomicU64,
    /// The drain under way, if any.
    run: Mutex<Option<Run>>,
}

#[derive(Debug)]
struct Run {
    /// Turns `true` when the drain completes or is reset.
    done: watch::Receiver<bool>,
    /// Dropping it resets the drain.
    _reset: oneshot::Sender<()>,
}

impl Drainer {
    /// A drainer that completes after `quiet` with no request.
    pub(crate) fn new(quiet: Duration) -> Self {
        Self {
            inner: Arc::new(DrainerState {
                quiet,
                epoch: Instant::now(),
                draining: AtomicBool::new(false),
                last_request: AtomicU64::new(0),
                started: AtomicU64::new(0),
                run: Mutex::new(None),
            }),
        }
    }

    /// The quiet period.
    pub(crate) fn quiet_period(&self) -> Duration {
        self.inner.quiet
    }

    /// Whether a drain has started (and not been reset): health checks fail.
    pub(crate) fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Relaxed)
    }

    /// Whether the drain under way has lasted a whole quiet period: the
    /// time Knative allows the pod's leaving to reach every client that
    /// routes by the endpoints.
    pub(crate) fn has_settled(&self) -> bool {
        let inner = &self.inner;
        let lasted = inner
            .since_epoch()
            .saturating_sub(inner.started.load(Ordering::Relaxed));
        self.is_draining() && Duration::from_nanos(lasted) >= inner.quiet
    }

    /// Notes that a request arrived: during a drain, the quiet period
    /// starts again.
    pub(crate) fn request_arrived(&self) {
        if self.is_draining() {
            self.inner
                .last_request
                .fetch_max(self.inner.since_epoch(), Ordering::Relaxed);
        }
    }

    /// Starts a drain, or joins the one under way, and waits until it
    /// completes: the quiet period has passed with no request, or the drain
    /// was reset. Once a drain has completed, later calls return at once
    /// until it is reset.
    pub(crate) async fn drain(&self) {
        let mut done = {
            let mut run = self.inner.lock_run();
            match run.as_ref() {
                Some(run) => run.done.clone(),
                None => {
                    let (started, done) = self.start();
                    *run = Some(started);
                    done
                }
            }
        };
        // An error means the timer task is gone, which it is only once done.
        let _ = done.wait_for(|done| *done).await;
    }

    /// Calls a drain off: health checks pass again and whoever waits in
    /// [`Drainer::drain`] returns. A later drain waits a whole quiet period.
    pub(crate) fn reset(&self) {
        let mut run = self.inner.lock_run();
        self.inner.draining.store(false, Ordering::Relaxed);
        // Dropping the run drops its reset sender, which ends its timer.
        *run = None;
    }

    fn start(&self) -> (Run, watch::Receiver<bool>) {
        let inner = &self.inner;
        let now = inner.since_epoch();
        inner.last_request.store(now, Ordering::Relaxed);
        inner.started.store(now, Ordering::Relaxed);
        inner.draining.store(true, Ordering::Relaxed);
        let (finished, done) = watch::channel(false);
        let (reset, mut was_reset) = oneshot::channel::<()>();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            loop {
                let quiet_until = inner.quiet_until();
                tokio::select! {
                    _ = tokio::time::sleep_until(quiet_until) => {
                        // A request may have moved the end while we slept.
                        if inner.quiet_until() <= Instant::now() {
                            break;
                        }
                    }
                    _ = &mut was_reset => break,
                }
            }
            let _ = finished.send(true);
        });
        let run = Run {
            done: done.clone(),
            _reset: reset,
        };
        (run, done)
    }
}

impl DrainerState {
    fn since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn quiet_until(&self) -> Instant {
        let last = Duration::from_nanos(self.last_request.load(Ordering::Relaxed));
        self.epoch + last + self.quiet
    }

    fn lock_run(&self) -> std::sync::MutexGuard<'_, Option<Run>> {
        self.run.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The way out once `SIGTERM` has arrived, as Knative's queue-proxy takes
/// it: health checks fail and requests are served until the quiet period
/// passes without one, then the listeners close and the requests in flight
/// finish, and upgraded connections get a bounded time to close.
#[derive(Debug)]
pub(crate) struct Shutdown {
    /// The main port's drain.
    pub(crate) drainer: Drainer,
    /// Tells the admin server's drain hook that `SIGTERM` has arrived.
    pub(crate) terminate: watch::Sender<bool>,
    /// The upgraded connections open.
    pub(crate) tunnels: Tunnels,
    /// How long upgraded connections get to close.
    pub(crate) upgraded: Duration,
}

impl Shutdown {
    /// Drains; then `close` closes the listeners and waits for the requests
    /// in flight; then the upgraded connections get their time.
    pub(crate) async fn run(self, close: impl Future<Output = ()>) {
        tracing::info!("Received TERM signal, attempting to gracefully shutdown servers.");
        tracing::info!(
            "Sleeping {} to allow K8s propagation of non-ready state",
            go_duration(self.drainer.quiet_period())
        );
        let _ = self.terminate.send(true);
        self.drainer.drain().await;
        close.await;
        let tunnels = &self.tunnels;
        if tunnels.open() > 0 {
            tracing::info!(
                open = tunnels.open(),
                "Waiting for upgraded connections to close"
            );
        }
        if tokio::time::timeout(self.upgraded, tunnels.all_closed())
            .await
            .is_err()
        {
            tracing::warn!(
                open = tunnels.open(),
                "Hijack connection drain failed: context deadline exceeded"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Duration = Duration::from_secs(30);

    /// Whether `fut` is still pending after the runtime has run everything
    /// it can at the current (paused) time.
    async fn pending<F: std::future::Future + Unpin>(fut: &mut F) -> bool {
        tokio::select! {
            biased;
            _ = fut => false,
            _ = tokio::task::yield_now() => true,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn completes_after_a_quiet_period_without_requests() {
        let drainer = Drainer::new(QUIET);
        assert!(!drainer.is_draining());
        let start = Instant::now();
        drainer.drain().await;
        assert_eq!(start.elapsed(), QUIET);
        assert!(drainer.is_draining(), "health checks keep failing");
        // Completed: later drains return at once.
        let again = Instant::now();
        drainer.drain().await;
        assert_eq!(again.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn every_request_starts_the_quiet_period_again() {
        let drainer = Drainer::new(QUIET);
        let start = Instant::now();
        let mut drain = Box::pin(drainer.drain());
        assert!(pending(&mut drain).await);
        tokio::time::advance(Duration::from_secs(20)).await;
        drainer.request_arrived();
        tokio::time::advance(Duration::from_secs(20)).await;
        assert!(pending(&mut drain).await, "20 s after the request");
        drainer.request_arrived();
        drain.await;
        assert_eq!(start.elapsed(), Duration::from_secs(40) + QUIET);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_settles_a_quiet_period_after_it_starts_whatever_arrives() {
        let drainer = Drainer::new(QUIET);
        assert!(!drainer.has_settled());
        let mut drain = Box::pin(drainer.drain());
        assert!(pending(&mut drain).await);
        tokio::time::advance(QUIET - Duration::from_secs(1)).await;
        drainer.request_arrived();
        assert!(!drainer.has_settled());
        tokio::time::advance(Duration::from_secs(1)).await;
        drainer.request_arrived();
        assert!(drainer.has_settled(), "requests keep the drain open");
        assert!(pending(&mut drain).await);
        drainer.reset();
        assert!(!drainer.has_settled());
        let mut again = Box::pin(drainer.drain());
        assert!(pending(&mut again).await);
        assert!(!drainer.has_settled(), "a new drain starts over");
    }

    #[tokio::test(start_paused = true)]
    async fn requests_before_a_drain_do_not_count() {
        let drainer = Drainer::new(QUIET);
        drainer.request_arrived();
        tokio::time::advance(Duration::from_secs(100)).await;
        let start = Instant::now();
        drainer.drain().await;
        assert_eq!(start.elapsed(), QUIET);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_releases_waiters_and_a_new_drain_starts_over() {
        let drainer = Drainer::new(QUIET);
        let mut first = Box::pin(drainer.drain());
        let mut second = Box::pin(drainer.drain());
        assert!(pending(&mut first).await && pending(&mut second).await);
        tokio::time::advance(Duration::from_secs(1)).await;
        drainer.reset();
        assert!(!drainer.is_draining());
        first.await;
        second.await;
        let start = Instant::now();
        drainer.drain().await;
        assert_eq!(start.elapsed(), QUIET, "a whole quiet period again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_quiet_period_completes_at_once() {
        let drainer = Drainer::new(Duration::ZERO);
        let start = Instant::now();
        drainer.drain().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(drainer.is_draining());
    }
}
