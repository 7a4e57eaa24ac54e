//! HTTP/1.1 connections to the app kept alive for reuse, one pool
//! whichever request they served.
//!
//! The idle connections are a stack: a request takes the one used last,
//! as Go's transport does, so that the others age out. At most `max` are
//! kept, each for at most 90 s (Go's transport default), or for less when
//! the app announced a shorter idle time ([`Pooled::keep`]): a connection
//! past it is closed when it is found, never written to.
//!
//! Most apps that close idle connections do not announce it (Go's
//! `net/http`, gunicorn, uvicorn). The pool learns it instead: when the app
//! turns out to have closed a connection that idled for `d` (found closed
//! here, or failed under a request, [`Idle::closed_after`]), no connection
//! is reused after idling for more than `d / 2` from then on. The app's
//! limit is below `d`, and so, once it has been seen once, a connection
//! is not written to just as the app closes it. Closes after less than
//! [`LEARN_FLOOR`] are not taken for a limit (an app that restarts closes
//! its connections whatever their idle time).
//!
//! A limit learned is forgotten after [`FORGET_AFTER`] with no close to
//! teach it again: an app whose early close was a one-off (a deploy, a
//! restart under load) or that lengthened its timeout gets its
//! connections reused for as long again. An app that still closes early
//! teaches it again with the next connection it closes, found closed
//! here (which costs nothing) or, rarely, under a request it drops (which
//! is sent again by the rules above when that is safe). No connection is
//! kept open past the limit to watch the app: an app that serves one
//! connection at a time would wait on it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// How long an idle connection is kept (Go's transport default).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often connections idle for longer are closed.
pub const IDLE_SWEEP: Duration = Duration::from_secs(15);
/// The shortest idle time after which an app's close is taken for its
/// idle limit.
pub const LEARN_FLOOR: Duration = Duration::from_millis(500);
/// How long a learned limit lasts with no close to teach it again.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);

/// A connection that may wait in [`Idle`].
pub trait Pooled {
    /// Whether the app has closed it (or it can no longer be used).
    fn is_closed(&self) -> bool;

    /// How long it may wait idle, if less than [`IDLE_TIMEOUT`].
    fn keep(&self) -> Option<Duration> {
        None
    }
}

/// The idle HTTP/1.1 connections, the one used last at the end, each with
/// when it went idle and when it stops being reused.
#[derive(Debug)]
pub struct Idle<C> {
    max: usize,
    conns: Mutex<Vec<Entry<C>>>,
    /// The longest a connection may idle, as learned from the app's closes,
    /// in nanoseconds ([`IDLE_TIMEOUT`] until one is seen).
    learned: AtomicU64,
    /// Some connection may have to go before [`IDLE_TIMEOUT`] (its app
    /// announced less, or a limit was learned): until then the sweep alone
    /// keeps the 90 s, and taking a connection reads no clock.
    timed: AtomicBool,
    /// When a close last taught the limit, if one is learned.
    taught: Mutex<Option<Instant>>,
}

#[derive(Debug)]
struct Entry<C> {
    conn: C,
    since: Instant,
    /// How long it may idle.
    keep: Duration,
}

impl<C: Pooled + Send + 'static> Idle<C> {
    /// Keeps at most `max` connections, each for at most [`IDLE_TIMEOUT`]
    /// (swept every [`IDLE_SWEEP`] when made within a Tokio runtime).
    pub fn new(max: usize) -> Arc<Self> {
        let idle = Arc::new(Idle {
            max,
            conns: Mutex::new(Vec::new()),
            learned: AtomicU64::new(nanos(IDLE_TIMEOUT)),
            timed: AtomicBool::new(false),
            taught: Mutex::new(None),
        });
        Idle::keep_swept(Arc::downgrade(&idle));
        idle
    }

    /// The connection used last, if one is open and within its idle time,
    /// and when it went idle; those passed over are closed.
    pub fn take(&self) -> Option<(C, Instant)> {
        // Read once, and only when some limit is shorter than the sweep's.
        let now = self.timed.load(Ordering::Relaxed).then(Instant::now);
        let learned = self.learned();
        let mut closed_since = None;
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        let found = loop {
            let Some(entry) = conns.pop() else { break None };
            if let Some(now) = now {
                let idled = now.saturating_duration_since(entry.since);
                if idled >= entry.keep || idled > learned {
                    continue;
                }
            }
            if entry.conn.is_closed() {
                closed_since = Some(entry.since);
                continue;
            }
            break Some((entry.conn, entry.since));
        };
        drop(conns);
        if let Some(since) = closed_since {
            self.closed_after(since.elapsed());
        }
        found
    }

    /// Keeps `conn` for reuse, unless enough are kept already.
    pub fn put(&self, conn: C) {
        if conn.is_closed() {
            return;
        }
        let keep = match conn.keep() {
            Some(keep) if keep < IDLE_TIMEOUT => {
                self.timed.store(true, Ordering::Relaxed);
                keep
            }
            _ => IDLE_TIMEOUT,
        };
        if keep.is_zero() {
            return;
        }
        let since = Instant::now();
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        if conns.len() < self.max {
            conns.push(Entry { conn, since, keep });
        }
    }

    /// The app closed a connection (or dropped it under a request) that
    /// had idled for `idled`: connections are not reused past half of it
    /// from now on (for [`FORGET_AFTER`], unless a close teaches it
    /// again), unless it is under [`LEARN_FLOOR`].
    pub fn closed_after(&self, idled: Duration) {
        if idled < LEARN_FLOOR {
            return;
        }
        let limit = nanos(idled / 2);
        *self.taught.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let before = self.learned.fetch_min(limit, Ordering::Relaxed);
        if limit < before {
            self.timed.store(true, Ordering::Relaxed);
            tracing::debug!(
                idle_limit_ms = limit / 1_000_000,
                "the app closes idle connections: not reusing one idle for longer"
            );
        }
    }

    /// The longest a connection may idle, as learned.
    pub fn learned(&self) -> Duration {
        Duration::from_nanos(self.learned.load(Ordering::Relaxed))
    }

    /// Forgets a limit no close has taught for [`FORGET_AFTER`] by `now`.
    fn forget(&self, now: Instant) {
        let mut taught = self.taught.lock().unwrap_or_else(PoisonError::into_inner);
        if taught.is_some_and(|at| now.saturating_duration_since(at) >= FORGET_AFTER) {
            *taught = None;
            self.learned.store(nanos(IDLE_TIMEOUT), Ordering::Relaxed);
            tracing::debug!(
                "no close of the app's has taught its idle limit for a while: forgotten"
            );
        }
    }

    /// Closes the connections past their idle time, and forgets a limit no
    /// close has taught for a while.
    fn sweep(&self, now: Instant) {
        self.forget(now);
        let learned = self.learned();
        let mut closed_after = None;
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        conns.retain(|entry| {
            let idled = now.saturating_duration_since(entry.since);
            if idled >= entry.keep || idled > learned {
                return false;
            }
            if entry.conn.is_closed() {
                closed_after = Some(closed_after.map_or(idled, |c: Duration| c.min(idled)));
                return false;
            }
            true
        });
        drop(conns);
        if let Some(idled) = closed_after {
            self.closed_after(idled);
        }
    }

    /// Sweeps `idle` every [`IDLE_SWEEP`] while it exists.
    fn keep_swept(idle: Weak<Idle<C>>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let mut every = tokio::time::interval(IDLE_SWEEP);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let now = every.tick().await;
                let Some(idle) = idle.upgrade() else { return };
                idle.sweep(now);
            }
        });
    }
}

/// `d` in nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A connection told apart by `port`, closed when its flag is set,
    /// kept as long as its app announced.
    struct TestConn {
        port: u16,
        closed: Arc<AtomicBool>,
        keep: Option<Duration>,
    }

    impl Pooled for TestConn {
        fn is_closed(&self) -> bool {
            self.closed.load(Ordering::Relaxed)
        }

        fn keep(&self) -> Option<Duration> {
            self.keep
        }
    }

    fn conn(port: u16) -> TestConn {
        TestConn {
            port,
            closed: Arc::default(),
            keep: None,
        }
    }

    fn ports(idle: &Idle<TestConn>) -> Vec<u16> {
        let conns = idle.conns.lock().unwrap();
        conns.iter().map(|e| e.conn.port).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_used_is_taken_first_and_at_most_max_are_kept() {
        let idle = Idle::new(2);
        for port in [1, 2, 3] {
            idle.put(conn(port));
        }
        assert_eq!(ports(&idle), [1, 2], "the third is closed, not kept");
        assert_eq!(idle.take().unwrap().0.port, 2);
        assert_eq!(idle.take().unwrap().0.port, 1);
        assert!(idle.take().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn connections_idle_for_90_seconds_are_closed() {
        let idle = Idle::new(10);
        idle.put(conn(1));
        tokio::time::sleep(Duration::from_secs(60)).await;
        idle.put(conn(2));
        // The sweep runs every 15 s: by 105 s the first has aged out.
        tokio::time::sleep(Duration::from_secs(45)).await;
        assert_eq!(ports(&idle), [2]);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(ports(&idle).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_connection_is_neither_kept_nor_taken() {
        let idle = Idle::new(10);
        let c = conn(1);
        let closed = c.closed.clone();
        idle.put(c);
        closed.store(true, Ordering::Relaxed);
        assert!(idle.take().is_none());
        let c = conn(2);
        c.closed.store(true, Ordering::Relaxed);
        idle.put(c);
        assert!(ports(&idle).is_empty());
    }

    /// The app's announced idle time bounds a connection's: past it, the
    /// connection is passed over (and closed) for an older one still
    /// within its own.
    #[tokio::test(start_paused = true)]
    async fn a_connection_is_not_taken_past_the_idle_time_its_app_announced() {
        let idle = Idle::new(10);
        idle.put(conn(1));
        idle.put(TestConn {
            keep: Some(Duration::from_millis(750)),
            ..conn(2)
        });
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(idle.take().unwrap().0.port, 2, "still within its time");
        idle.put(TestConn {
            keep: Some(Duration::from_millis(750)),
            ..conn(2)
        });
        tokio::time::sleep(Duration::from_millis(751)).await;
        assert_eq!(idle.take().unwrap().0.port, 1, "2 is past its time");
        assert!(idle.take().is_none());
        idle.put(TestConn {
            keep: Some(Duration::ZERO),
            ..conn(3)
        });
        assert!(ports(&idle).is_empty(), "no idle time: not kept");
    }

    /// A close the pool finds after 2 s of idling makes it keep none for
    /// more than 1 s from then on; a close after less than the floor (a
    /// restart) teaches nothing, and a later, longer one does not undo it.
    #[tokio::test(start_paused = true)]
    async fn the_idle_time_after_which_the_app_closes_is_learned() {
        let idle = Idle::new(10);
        let c = conn(1);
        let closed = c.closed.clone();
        idle.put(c);
        tokio::time::sleep(Duration::from_secs(2)).await;
        closed.store(true, Ordering::Relaxed);
        assert!(idle.take().is_none());
        assert_eq!(idle.learned(), Duration::from_secs(1));
        idle.put(conn(2));
        tokio::time::sleep(Duration::from_millis(900)).await;
        let (c, since) = idle.take().unwrap();
        assert_eq!((c.port, since.elapsed()), (2, Duration::from_millis(900)));
        idle.put(conn(3));
        tokio::time::sleep(Duration::from_millis(1001)).await;
        assert!(idle.take().is_none(), "past the learned limit");
        idle.closed_after(Duration::from_millis(400));
        idle.closed_after(Duration::from_secs(30));
        assert_eq!(idle.learned(), Duration::from_secs(1));
        idle.closed_after(Duration::from_millis(1200));
        assert_eq!(idle.learned(), Duration::from_millis(600));
    }

    /// A learned limit lasts while closes teach it again, and is forgotten
    /// (at the sweep) once none has for [`FORGET_AFTER`]; connections past
    /// it are closed, never kept open.
    #[tokio::test(start_paused = true)]
    async fn a_learned_limit_no_close_teaches_again_is_forgotten() {
        let idle = Idle::new(10);
        idle.closed_after(Duration::from_secs(4));
        assert_eq!(idle.learned(), Duration::from_secs(2));
        idle.put(conn(1));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(idle.take().is_none(), "past the limit");
        assert!(ports(&idle).is_empty(), "closed, not kept");
        // Taught again at 5 min: it lasts until 15 min.
        tokio::time::sleep(Duration::from_secs(297)).await;
        idle.closed_after(Duration::from_secs(4));
        tokio::time::sleep(Duration::from_secs(595)).await;
        assert_eq!(
            idle.learned(),
            Duration::from_secs(2),
            "taught 9 min 55 s ago"
        );
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(idle.learned(), IDLE_TIMEOUT, "forgotten");
        idle.put(conn(2));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(idle.take().unwrap().0.port, 2, "reused after 10 s again");
    }
}
