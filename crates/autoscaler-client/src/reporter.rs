//! The reporter: one [`Stat`] per period, ready to serve.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use prost::Message;

use crate::stat::Stat;
use crate::stats::{Nanos, Report};

/// The latest [`Stat`] of a pod, as Knative's `ProtobufStatsReporter`
/// keeps it: before the first report it holds only the pod's name.
#[derive(Debug)]
pub struct Reporter {
    pod_name: String,
    started: Nanos,
    period_seconds: f64,
    latest: Mutex<Arc<Published>>,
}

/// A stat and its protobuf encoding.
#[derive(Debug)]
pub struct Published {
    /// The figures.
    pub stat: Stat,
    /// [`Published::stat`], encoded.
    pub protobuf: Bytes,
}

impl Published {
    fn new(stat: Stat) -> Self {
        let protobuf = Bytes::from(stat.encode_to_vec());
        Published { stat, protobuf }
    }
}

impl Reporter {
    /// A reporter for `pod_name`, started at `started`, whose reports each
    /// cover `period_seconds`.
    pub fn new(pod_name: impl Into<String>, started: Nanos, period_seconds: f64) -> Self {
        let pod_name = pod_name.into();
        let first = Stat {
            pod_name: pod_name.clone(),
            ..Stat::default()
        };
        Reporter {
            pod_name,
            started,
            period_seconds,
            latest: Mutex::new(Arc::new(Published::new(first))),
        }
    }

    /// Publishes `report`, taken at `now`: counts become rates over the
    /// period, and the uptime is added.
    pub fn publish(&self, report: &Report, now: Nanos) {
        let stat = Stat {
            pod_name: self.pod_name.clone(),
            average_concurrent_requests: report.average_concurrency,
            average_proxied_concurrent_requests: report.average_proxied_concurrency,
            request_count: report.request_count / self.period_seconds,
            proxied_request_count: report.proxied_request_count / self.period_seconds,
            process_uptime: now.saturating_sub(self.started) as f64 / 1e9,
            timestamp: 0,
        };
        *self.latest.lock().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(Published::new(stat));
    }

    /// The latest stat.
    pub fn latest(&self) -> Arc<Published> {
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_only_the_pod_name_before_the_first_report() {
        let r = Reporter::new("pod-1", 0, 1.0);
        let latest = r.latest();
        assert_eq!(latest.stat.pod_name, "pod-1");
        assert_eq!(&latest.protobuf[..], b"\x0a\x05pod-1");
    }

    #[test]
    fn counts_become_rates_and_uptime_is_added() {
        let r = Reporter::new("p", 1_000_000_000, 2.0);
        let report = Report {
            average_concurrency: 3.0,
            average_proxied_concurrency: 1.0,
            request_count: 10.0,
            proxied_request_count: 4.0,
        };
        r.publish(&report, 3_500_000_000);
        let stat = &r.latest().stat;
        assert_eq!(stat.request_count, 5.0);
        assert_eq!(stat.proxied_request_count, 2.0);
        assert_eq!(stat.average_concurrent_requests, 3.0);
        assert_eq!(stat.process_uptime, 2.5);
        assert_eq!(stat.timestamp, 0);
    }
}
