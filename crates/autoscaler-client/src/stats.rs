//! Request statistics: Knative's `RequestStats`, recorded without a lock
//! (see [`RequestStats`]).

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Mutex, PoisonError};

/// Nanoseconds since a fixed origin (see [`crate::Clock`]).
pub type Nanos = u64;

/// How many threads get a lock-free shard of their own.
pub const SHARDS: usize = 32;

/// A request event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A request arrived.
    In,
    /// A request finished.
    Out,
    /// A request that came through the activator arrived.
    ProxiedIn,
    /// A request that came through the activator finished.
    ProxiedOut,
}

/// The figures of one reporting window, as Knative's
/// `RequestStatsReport`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Report {
    /// Time-weighted average of requests in flight.
    pub average_concurrency: f64,
    /// The same for requests through the activator.
    pub average_proxied_concurrency: f64,
    /// Requests that arrived in the window.
    pub request_count: f64,
    /// Requests through the activator that arrived in the window.
    pub proxied_request_count: f64,
}

/// Knative's request statistics, recorded without a lock.
///
/// Knative's `RequestStats` keeps, under one mutex, the requests in flight
/// and the integral of that count over time: every event first adds
/// `concurrency × seconds since the last event`, then moves the count. A
/// report divides the integral by the seconds it covers and starts a new
/// window. Every request takes that mutex twice.
///
/// Here the integral is linear, so it can be split: each thread that
/// records gets a shard of its own, which only it writes, and which holds
/// the same state as Knative's (in flight, time of the last change, the
/// integral since the start, and the requests counted). A request that
/// arrives on one thread and leaves on another leaves `+1` in one shard and
/// `-1` in the other; the sums are right. Recording is then a few plain
/// stores behind a sequence counter, with no read-modify-write at all; the
/// reporter, once a second, reads each shard consistently (retrying if a
/// write was under way), extends each integral to the report's time, sums,
/// and subtracts the previous report's totals. Times are integer
/// nanoseconds and the integrals integers, so sharding loses nothing; the
/// division is the only floating-point step, which is where Knative's
/// float sums could differ from these in the last bits.
///
/// A thread takes the lowest free shard when it first records and gives it
/// back when it exits; threads beyond [`SHARDS`] at once share one shard
/// under a mutex.
#[derive(Debug)]
pub struct RequestStats {
    shards: Box<[Shard]>,
    overflow: Mutex<Totals>,
    window: Mutex<Window>,
}

/// What a shard holds, read consistently.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Totals {
    concurrency: i64,
    proxied_concurrency: i64,
    last_change: Nanos,
    /// ∫ concurrency dt since the start, in request·nanoseconds.
    integral: i128,
    proxied_integral: i128,
    requests: u64,
    proxied_requests: u64,
}

impl Totals {
    fn record(&mut self, event: Event, now: Nanos) {
        *self = self.at(now);
        match event {
            Event::In => {
                self.concurrency += 1;
                self.requests += 1;
            }
            Event::ProxiedIn => {
                self.concurrency += 1;
                self.proxied_concurrency += 1;
                self.requests += 1;
                self.proxied_requests += 1;
            }
            Event::Out => self.concurrency -= 1,
            Event::ProxiedOut => {
                self.concurrency -= 1;
                self.proxied_concurrency -= 1;
            }
        }
    }

    /// The integrals carried on to `now` (never backwards).
    fn at(mut self, now: Nanos) -> Self {
        if now > self.last_change {
            let dt = i128::from(now - self.last_change);
            self.integral += i128::from(self.concurrency) * dt;
            self.proxied_integral += i128::from(self.proxied_concurrency) * dt;
            self.last_change = now;
        }
        self
    }

    fn add(&mut self, other: &Totals) {
        self.integral += other.integral;
        self.proxied_integral += other.proxied_integral;
        self.requests += other.requests;
        self.proxied_requests += other.proxied_requests;
    }
}

/// One thread's totals, behind a sequence counter: odd while the owning
/// thread writes, so that a reader can tell a torn read and retry.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    seq: AtomicU64,
    concurrency: AtomicI64,
    proxied_concurrency: AtomicI64,
    last_change: AtomicU64,
    integral: [AtomicU64; 2],
    proxied_integral: [AtomicU64; 2],
    requests: AtomicU64,
    proxied_requests: AtomicU64,
}

fn split(v: i128) -> [u64; 2] {
    [v as u64, (v >> 64) as u64]
}

fn join(lo: u64, hi: u64) -> i128 {
    (i128::from(hi as i64) << 64) | i128::from(lo)
}

impl Shard {
    /// Only the owning thread calls this.
    fn load_relaxed(&self) -> Totals {
        Totals {
            concurrency: self.concurrency.load(Ordering::Relaxed),
            proxied_concurrency: self.proxied_concurrency.load(Ordering::Relaxed),
            last_change: self.last_change.load(Ordering::Relaxed),
            integral: join(
                self.integral[0].load(Ordering::Relaxed),
                self.integral[1].load(Ordering::Relaxed),
            ),
            proxied_integral: join(
                self.proxied_integral[0].load(Ordering::Relaxed),
                self.proxied_integral[1].load(Ordering::Relaxed),
            ),
            requests: self.requests.load(Ordering::Relaxed),
            proxied_requests: self.proxied_requests.load(Ordering::Relaxed),
        }
    }

    /// Only the owning thread calls this.
    fn record(&self, event: Event, now: Nanos) {
        let mut t = self.load_relaxed();
        t.record(event, now);
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.concurrency.store(t.concurrency, Ordering::Relaxed);
        self.proxied_concurrency
            .store(t.proxied_concurrency, Ordering::Relaxed);
        self.last_change.store(t.last_change, Ordering::Relaxed);
        let [lo, hi] = split(t.integral);
        self.integral[0].store(lo, Ordering::Relaxed);
        self.integral[1].store(hi, Ordering::Relaxed);
        let [lo, hi] = split(t.proxied_integral);
        self.proxied_integral[0].store(lo, Ordering::Relaxed);
        self.proxied_integral[1].store(hi, Ordering::Relaxed);
        self.requests.store(t.requests, Ordering::Relaxed);
        self.proxied_requests
            .store(t.proxied_requests, Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Any thread: a consistent copy.
    fn snapshot(&self) -> Totals {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let t = self.load_relaxed();
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return t;
            }
        }
    }
}

/// The reporter's memory of the previous report.
#[derive(Debug)]
struct Window {
    start: Nanos,
    totals: Totals,
}

/// A thread's shard index: the lowest free one when the thread first
/// records, given back when the thread exits, so that short-lived threads do
/// not use up the shards.
struct Slot(usize);

static FREE_SLOTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

impl Slot {
    fn claim() -> Self {
        let mut free = FREE_SLOTS.lock().unwrap_or_else(PoisonError::into_inner);
        match free.iter().enumerate().min_by_key(|(_, i)| **i) {
            Some((at, _)) => Slot(free.swap_remove(at)),
            None => Slot(NEXT_SLOT.fetch_add(1, Ordering::Relaxed)),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The mutex orders this thread's last writes to its shards before
        // the next owner's first reads.
        FREE_SLOTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.0);
    }
}

thread_local! {
    static SLOT: Slot = Slot::claim();
}

/// The calling thread's shard index; past the shards (so, the shared one)
/// while the thread is being torn down.
fn thread_index() -> usize {
    SLOT.try_with(|slot| slot.0).unwrap_or(usize::MAX)
}

impl RequestStats {
    /// Statistics whose first window starts at `started_at`.
    pub fn new(started_at: Nanos) -> Self {
        RequestStats {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            overflow: Mutex::new(Totals::default()),
            window: Mutex::new(Window {
                start: started_at,
                totals: Totals::default(),
            }),
        }
    }

    /// Records `event`, which happened at `now`.
    pub fn record(&self, event: Event, now: Nanos) {
        self.record_in(thread_index(), event, now);
    }

    /// Records `event` in shard `index`, which only the calling thread may
    /// write (or the shared one, beyond [`SHARDS`]).
    fn record_in(&self, index: usize, event: Event, now: Nanos) {
        match self.shards.get(index) {
            Some(shard) => shard.record(event, now),
            None => self
                .overflow
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(event, now),
        }
    }

    /// The figures since the previous report (or the start), as of `now`;
    /// the next window starts where this one ends.
    ///
    /// As in Knative, a window ends at `now` or at the last event recorded,
    /// whichever is later: every shard's integral is carried to that one
    /// time, so that a thread's own count (which drifts as requests move
    /// between threads) never weighs on the figures.
    ///
    /// An event whose time was taken before a report but which is recorded
    /// after it (its thread was preempted in between) is counted in the
    /// next window, with the time it spent in flight before this window's
    /// end: summed over windows, nothing is lost or counted twice. Knative,
    /// which takes the time before its lock too, drops that share instead.
    /// On one-second windows either way is off by the length of the
    /// preemption.
    pub fn report(&self, now: Nanos) -> Report {
        // One report at a time: each subtracts the totals of the last.
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let mut shards: Vec<Totals> = self.shards.iter().map(Shard::snapshot).collect();
        shards.push(*self.overflow.lock().unwrap_or_else(PoisonError::into_inner));
        let end = shards
            .iter()
            .map(|t| t.last_change)
            .fold(now.max(window.start), Nanos::max);
        let mut totals = Totals::default();
        for shard in &shards {
            totals.add(&shard.at(end));
        }

        let prev = window.totals;
        let span = end - window.start;
        let mut report = Report {
            request_count: totals.requests.saturating_sub(prev.requests) as f64,
            proxied_request_count: totals
                .proxied_requests
                .saturating_sub(prev.proxied_requests) as f64,
            ..Report::default()
        };
        if span > 0 {
            let span = span as f64;
            report.average_concurrency = (totals.integral - prev.integral) as f64 / span;
            report.average_proxied_concurrency =
                (totals.proxied_integral - prev.proxied_integral) as f64 / span;
        } else {
            // A window of no time has no average; what late events added
            // to the integrals goes to the next one.
            totals.integral = prev.integral;
            totals.proxied_integral = prev.proxied_integral;
        }
        window.start = end;
        window.totals = totals;
        report
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MS: Nanos = 1_000_000;
    const S: Nanos = 1_000_000_000;

    #[test]
    fn two_half_second_requests_average_one() {
        let stats = RequestStats::new(0);
        stats.record(Event::In, 0);
        stats.record(Event::In, 0);
        stats.record(Event::Out, 500 * MS);
        stats.record(Event::Out, 500 * MS);
        let r = stats.report(S);
        assert_eq!(r.average_concurrency, 1.0);
        assert_eq!(r.request_count, 2.0);
        assert_eq!(r.average_proxied_concurrency, 0.0);
    }

    #[test]
    fn driven_by_a_manual_clock() {
        use crate::{Clock, ManualClock};
        let clock = ManualClock::at(5 * S);
        let stats = RequestStats::new(clock.now());
        stats.record(Event::ProxiedIn, clock.now());
        clock.advance(250 * MS);
        stats.record(Event::ProxiedOut, clock.now());
        clock.advance(750 * MS);
        let r = stats.report(clock.now());
        assert_eq!(r.average_proxied_concurrency, 0.25);
        assert_eq!(r.proxied_request_count, 1.0);
    }

    #[test]
    fn overlapping_requests() {
        // One request for [0, 600ms], another for [300ms, 1s]:
        // 0.3 s at 1, 0.3 s at 2, 0.4 s at 1 → 1.3.
        let stats = RequestStats::new(0);
        stats.record(Event::In, 0);
        stats.record(Event::In, 300 * MS);
        stats.record(Event::Out, 600 * MS);
        stats.record(Event::Out, S);
        let r = stats.report(S);
        assert!((r.average_concurrency - 1.3).abs() < 1e-12, "{r:?}");
        assert_eq!(r.request_count, 2.0);
    }

    #[test]
    fn a_request_straddling_reports_counts_once_and_in_both_averages() {
        let stats = RequestStats::new(0);
        stats.record(Event::In, 500 * MS);
        let first = stats.report(S);
        assert_eq!(first.average_concurrency, 0.5);
        assert_eq!(first.request_count, 1.0);
        stats.record(Event::Out, S + 250 * MS);
        let second = stats.report(2 * S);
        assert_eq!(second.average_concurrency, 0.25);
        assert_eq!(second.request_count, 0.0);
        // Nothing in flight any more.
        assert_eq!(stats.report(3 * S), Report::default());
    }

    #[test]
    fn proxied_requests_are_part_of_the_totals() {
        // Three direct requests all along, one proxied for half the window.
        let stats = RequestStats::new(0);
        for _ in 0..3 {
            stats.record(Event::In, 0);
        }
        stats.record(Event::ProxiedIn, 0);
        stats.record(Event::ProxiedOut, 500 * MS);
        let r = stats.report(S);
        assert_eq!(r.average_concurrency, 3.5);
        assert_eq!(r.average_proxied_concurrency, 0.5);
        assert_eq!((r.request_count, r.proxied_request_count), (4.0, 1.0));
    }

    #[test]
    fn in_and_out_on_different_threads_sum_right() {
        let stats = RequestStats::new(0);
        stats.record_in(0, Event::In, 0);
        stats.record_in(1, Event::Out, 250 * MS);
        stats.record_in(SHARDS + 5, Event::ProxiedIn, 500 * MS);
        stats.record_in(2, Event::ProxiedOut, 750 * MS);
        let r = stats.report(S);
        assert_eq!(r.average_concurrency, 0.5);
        assert_eq!(r.average_proxied_concurrency, 0.25);
    }

    #[test]
    fn the_first_window_starts_at_creation() {
        let stats = RequestStats::new(10 * S);
        stats.record(Event::In, 10 * S);
        let r = stats.report(12 * S);
        assert_eq!(r.average_concurrency, 1.0);
        // A report at the same time covers nothing.
        assert_eq!(stats.report(12 * S).average_concurrency, 0.0);
    }

    #[test]
    fn concurrent_recording_loses_nothing() {
        // Four threads, each with at most one request in flight, on one
        // shared clock; reports taken meanwhile. A thread can be preempted
        // between reading the clock and recording, so one window may get
        // a share of the next one's time (see `RequestStats::report`); what
        // must hold is that, over all windows, every request and every tick
        // of it in flight is counted exactly once.
        let stats = RequestStats::new(0);
        let clock = AtomicU64::new(1);
        let window_end = |stats: &RequestStats| stats.window.lock().unwrap().start;
        let (mut counted, mut in_flight_ticks) = (0.0, 0.0);
        let mut track = |r: Report, from: Nanos, to: Nanos| {
            assert!(r.average_concurrency.is_finite(), "{r:?}");
            counted += r.request_count;
            in_flight_ticks += r.average_concurrency * (to - from) as f64;
        };
        let busy: u64 = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let (stats, clock) = (&stats, &clock);
                    s.spawn(move || {
                        let mut busy = 0;
                        for _ in 0..10_000 {
                            let arrived = clock.fetch_add(1, Ordering::SeqCst);
                            stats.record(Event::In, arrived);
                            let left = clock.fetch_add(1, Ordering::SeqCst);
                            stats.record(Event::Out, left);
                            busy += left - arrived;
                        }
                        busy
                    })
                })
                .collect();
            for _ in 0..200 {
                let from = window_end(&stats);
                let r = stats.report(clock.load(Ordering::SeqCst));
                track(r, from, window_end(&stats));
            }
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        let from = window_end(&stats);
        let r = stats.report(clock.load(Ordering::SeqCst));
        track(r, from, window_end(&stats));
        assert_eq!(counted, 40_000.0);
        // Each product is exact to ~1e-16 relative; the sum is of integers.
        assert!(
            (in_flight_ticks - busy as f64).abs() < 1e-6 * busy as f64,
            "{in_flight_ticks} != {busy}"
        );
        // Every request went out again.
        let later = clock.load(Ordering::SeqCst) + S;
        assert_eq!(stats.report(later).average_concurrency, 0.0);
    }

    #[test]
    fn a_late_event_on_another_shard_does_not_skew_the_window() {
        // Shard 0 holds +3 and shard 1 -3 (requests that moved threads):
        // nothing is in flight. An event on shard 1 recorded after the
        // report's `now` must not make the window negative.
        let stats = RequestStats::new(0);
        for _ in 0..3 {
            stats.record_in(0, Event::In, 0);
            stats.record_in(1, Event::Out, 0);
        }
        stats.record_in(1, Event::In, 10 * S + 4 * MS);
        stats.record_in(1, Event::Out, 10 * S + 4 * MS);
        let r = stats.report(10 * S);
        assert_eq!(r.average_concurrency, 0.0);
        assert_eq!(r.request_count, 4.0);
    }

    /// Knative's `RequestStats`, written the straightforward way.
    #[derive(Default)]
    struct Reference {
        concurrency: f64,
        proxied_concurrency: f64,
        last_change: f64,
        requests: f64,
        proxied: f64,
        computed: f64,
        computed_proxied: f64,
        seconds: f64,
    }

    impl Reference {
        fn compute(&mut self, now: f64) {
            let d = now - self.last_change;
            if d > 0.0 {
                self.seconds += d;
                self.computed += self.concurrency * d;
                self.computed_proxied += self.proxied_concurrency * d;
                self.last_change = now;
            }
        }

        fn handle(&mut self, event: Event, now: f64) {
            self.compute(now);
            match event {
                Event::ProxiedIn => {
                    self.proxied_concurrency += 1.0;
                    self.proxied += 1.0;
                    self.requests += 1.0;
                    self.concurrency += 1.0;
                }
                Event::In => {
                    self.requests += 1.0;
                    self.concurrency += 1.0;
                }
                Event::ProxiedOut => {
                    self.proxied_concurrency -= 1.0;
                    self.concurrency -= 1.0;
                }
                Event::Out => self.concurrency -= 1.0,
            }
        }

        fn report(&mut self, now: f64) -> Report {
            self.compute(now);
            let mut r = Report {
                request_count: self.requests,
                proxied_request_count: self.proxied,
                ..Report::default()
            };
            if self.seconds > 0.0 {
                r.average_concurrency = self.computed / self.seconds;
                r.average_proxied_concurrency = self.computed_proxied / self.seconds;
            }
            self.computed = 0.0;
            self.computed_proxied = 0.0;
            self.requests = 0.0;
            self.proxied = 0.0;
            self.seconds = 0.0;
            r
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Start a request (proxied or not) on a shard, after a pause.
        Arrive(bool, usize, Nanos),
        /// Finish the n-th request in flight on a shard, after a pause.
        Leave(usize, usize, Nanos),
        /// Report, after a pause.
        Report(Nanos),
    }

    fn step() -> impl Strategy<Value = Step> {
        let pause = 0..2 * S;
        let shard = 0..SHARDS + 2;
        prop_oneof![
            3 => (any::<bool>(), shard.clone(), pause.clone()).prop_map(|(p, s, d)| Step::Arrive(p, s, d)),
            3 => (any::<usize>(), shard, pause.clone()).prop_map(|(i, s, d)| Step::Leave(i, s, d)),
            1 => pause.prop_map(Step::Report),
        ]
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    proptest! {
        /// For random events, spread over shards, the sharded recorder and
        /// Knative's mutex algorithm give the same reports.
        #[test]
        fn matches_knative_arithmetic(steps in proptest::collection::vec(step(), 1..300)) {
            let stats = RequestStats::new(0);
            let mut reference = Reference::default();
            let mut now: Nanos = 0;
            let mut in_flight: Vec<bool> = Vec::new();
            for step in steps {
                match step {
                    Step::Arrive(proxied, shard, pause) => {
                        now += pause;
                        let e = if proxied { Event::ProxiedIn } else { Event::In };
                        stats.record_in(shard, e, now);
                        reference.handle(e, now as f64 / 1e9);
                        in_flight.push(proxied);
                    }
                    Step::Leave(i, shard, pause) if !in_flight.is_empty() => {
                        now += pause;
                        let proxied = in_flight.swap_remove(i % in_flight.len());
                        let e = if proxied { Event::ProxiedOut } else { Event::Out };
                        stats.record_in(shard, e, now);
                        reference.handle(e, now as f64 / 1e9);
                    }
                    Step::Report(pause) => {
                        now += pause;
                        let ours = stats.report(now);
                        let theirs = reference.report(now as f64 / 1e9);
                        prop_assert_eq!(ours.request_count, theirs.request_count);
                        prop_assert_eq!(ours.proxied_request_count, theirs.proxied_request_count);
                        prop_assert!(close(ours.average_concurrency, theirs.average_concurrency), "{:?} vs {:?}", ours, theirs);
                        prop_assert!(close(ours.average_proxied_concurrency, theirs.average_proxied_concurrency), "{:?} vs {:?}", ours, theirs);
                    }
                    Step::Leave(..) => {}
                }
            }
        }
    }
}
