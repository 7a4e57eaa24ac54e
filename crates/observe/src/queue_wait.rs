//! How long requests wait in qproxy's queue for a slot, as a histogram.
//!
//! With `containerConcurrency` set, a request that finds every slot taken
//! waits in the breaker's queue, and that wait is often most of what a
//! client sees; Knative's queue-proxy shows it nowhere
//! (knative/serving#13661). qproxy counts each admitted request's wait
//! (zero when a slot was free) in `qproxy_queue_wait_seconds`, served on
//! the user metrics port (9091) with the revision's labels in both
//! generations, and, where current Knative pushes request metrics over
//! OTLP, as `qproxy.queue.wait` (unit `s`) beside them. Without a limit
//! there is no queue, and no histogram.
//!
//! Recording is two atomic additions (three when the wait is not zero);
//! rendering reads the counts without a lock, so a scrape taken while
//! requests are counted may see a count one ahead of a bucket.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::metrics::Histogram;

/// The histogram's name in the Prometheus text.
const NAME: &str = "qproxy_queue_wait_seconds";
/// Its help.
pub const HELP: &str =
    "Seconds a request waited in the queue-proxy's queue for a slot (containerConcurrency).";

/// Upper bounds of the buckets, in seconds: Prometheus' defaults, finer
/// below 5 ms, and on to the revision's default timeout.
pub const BUCKETS: [f64; 15] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The waits counted so far.
#[derive(Debug, Default)]
pub struct QueueWait {
    /// Waits per bucket, not cumulative; the last is past every bound.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    count: AtomicU64,
    sum_nanos: AtomicU64,
    /// Where current Knative pushes request metrics over OTLP.
    otlp: OnceLock<Histogram<f64>>,
}

impl QueueWait {
    /// Counts one request's wait.
    pub fn record(&self, wait: Duration) {
        let seconds = wait.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        if !wait.is_zero() {
            let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
        if let Some(otlp) = self.otlp.get() {
            otlp.record(seconds, &[]);
        }
    }

    /// How many waits were counted.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Records into `histogram` too, from now on (the first one given).
    pub fn export_to(&self, histogram: Histogram<f64>) {
        let _ = self.otlp.set(histogram);
    }

    /// Appends the histogram, labelled with `labels`, in the Prometheus
    /// text format, to `out`.
    pub fn render(&self, labels: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {NAME} {HELP}");
        let _ = writeln!(out, "# TYPE {NAME} histogram");
        let mut cumulative = 0;
        for (i, count) in self.buckets.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = BUCKETS
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), f64::to_string);
            let _ = writeln!(out, "{NAME}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed)).as_secs_f64();
        let _ = writeln!(out, "{NAME}_sum{{{labels}}} {sum}");
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{NAME}_count{{{labels}}} {count}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_fall_in_cumulative_buckets_with_their_sum_and_count() {
        let waits = QueueWait::default();
        waits.record(Duration::ZERO);
        waits.record(Duration::from_millis(20));
        waits.record(Duration::from_secs(400));
        let mut out = String::new();
        waits.render("a=\"b\"", &mut out);
        assert!(out.contains("# TYPE qproxy_queue_wait_seconds histogram\n"));
        for (le, count) in [
            ("0.001", 1),
            ("0.01", 1),
            ("0.025", 2),
            ("300", 2),
            ("+Inf", 3),
        ] {
            let line = format!("qproxy_queue_wait_seconds_bucket{{a=\"b\",le=\"{le}\"}} {count}\n");
            assert!(out.contains(&line), "{line}{out}");
        }
        assert!(
            out.contains("qproxy_queue_wait_seconds_sum{a=\"b\"} 400.02\n"),
            "{out}"
        );
        assert!(
            out.contains("qproxy_queue_wait_seconds_count{a=\"b\"} 3\n"),
            "{out}"
        );
    }
}
