//! The autoscaler's view of the pod, as Prometheus gauges on the user
//! metrics port (9091), in both generations.
//!
//! Knative's autoscaler scales by the `Stat` it scrapes from the stats
//! port (9090) every second: requests in flight, time-weighted over the
//! reporting window, and requests per second, each with the part that came
//! through the activator. Knative removed the Prometheus form of those
//! figures, so an operator cannot graph what the autoscaler sees. qproxy
//! serves the latest `Stat`'s figures again, as gauges next to the request
//! metrics, under a `qproxy_` prefix so that they cannot be taken for
//! Knative's own: an addition, not a difference. The bytes on 9090 stay
//! Knative's.

use std::sync::Arc;

use qproxy_autoscaler_client::{Reporter, Stat};

use crate::prom_text::{gauge, label};
use qproxy_core::config::Revision;

/// One gauge: its name, its help, and the figure of the `Stat` it shows.
type Gauge = (&'static str, &'static str, fn(&Stat) -> f64);

/// The gauges.
const GAUGES: [Gauge; 4] = [
    (
        "qproxy_autoscaler_average_concurrency",
        "Requests in flight, time-weighted over the latest reporting window, as the autoscaler reads them from the stats port.",
        |s| s.average_concurrent_requests,
    ),
    (
        "qproxy_autoscaler_average_proxied_concurrency",
        "The part of qproxy_autoscaler_average_concurrency that came through the activator.",
        |s| s.average_proxied_concurrent_requests,
    ),
    (
        "qproxy_autoscaler_requests_per_second",
        "Requests that arrived in the latest reporting window, per second, as the autoscaler reads them from the stats port.",
        |s| s.request_count,
    ),
    (
        "qproxy_autoscaler_proxied_requests_per_second",
        "The part of qproxy_autoscaler_requests_per_second that came through the activator.",
        |s| s.proxied_request_count,
    ),
];

/// The latest `Stat`'s figures, rendered as Prometheus gauges; cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct AutoscalerView {
    reporter: Arc<Reporter>,
    /// The revision's labels, rendered once.
    labels: Arc<str>,
}

impl AutoscalerView {
    /// The view of what `reporter` publishes for `revision`'s pod.
    pub fn new(reporter: Arc<Reporter>, revision: &Revision) -> Self {
        let service = if revision.service.is_empty() {
            "unknown"
        } else {
            &revision.service
        };
        // The labels of classic Knative's request metrics, in both
        // generations, so that one query serves both.
        let labels = [
            ("configuration_name", revision.configuration.as_str()),
            ("container_name", "queue-proxy"),
            ("namespace_name", revision.namespace.as_str()),
            ("pod_name", revision.pod.as_str()),
            ("revision_name", revision.name.as_str()),
            ("service_name", service),
        ]
        .iter()
        .map(|(name, value)| label(name, value))
        .collect::<Vec<_>>()
        .join(",");
        Self {
            reporter,
            labels: labels.into(),
        }
    }

    /// The revision's labels, rendered.
    pub fn labels(&self) -> &str {
        &self.labels
    }

    /// Appends the gauges, in the Prometheus text format, to `out`.
    pub fn render(&self, out: &mut String) {
        let latest = self.reporter.latest();
        for (name, help, figure) in GAUGES {
            gauge(out, name, help, &self.labels, figure(&latest.stat));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use qproxy_autoscaler_client::Report;

    fn revision() -> Revision {
        Revision {
            namespace: "default".to_owned(),
            service: String::new(),
            configuration: "hello".to_owned(),
            name: "hello-00001".to_owned(),
            pod: "hello-00001-deployment-a\"b".to_owned(),
            pod_ip: "10.0.0.1".to_owned(),
        }
    }

    #[test]
    fn shows_the_latest_stat_with_the_revision_s_labels() {
        let reporter = Arc::new(Reporter::new("pod", 0, 1.0));
        let view = AutoscalerView::new(reporter.clone(), &revision());
        let mut before = String::new();
        view.render(&mut before);
        let labels = r#"configuration_name="hello",container_name="queue-proxy",namespace_name="default",pod_name="hello-00001-deployment-a\"b",revision_name="hello-00001",service_name="unknown""#;
        assert!(
            before.contains(&format!(
                "qproxy_autoscaler_average_concurrency{{{labels}}} 0\n"
            )),
            "{before}"
        );
        reporter.publish(
            &Report {
                average_concurrency: 2.5,
                average_proxied_concurrency: 0.5,
                request_count: 10.0,
                proxied_request_count: 4.0,
            },
            2_000_000_000,
        );
        let mut after = String::new();
        view.render(&mut after);
        for line in [
            format!("qproxy_autoscaler_average_concurrency{{{labels}}} 2.5"),
            format!("qproxy_autoscaler_average_proxied_concurrency{{{labels}}} 0.5"),
            format!("qproxy_autoscaler_requests_per_second{{{labels}}} 10"),
            format!("qproxy_autoscaler_proxied_requests_per_second{{{labels}}} 4"),
            "# TYPE qproxy_autoscaler_requests_per_second gauge".to_owned(),
        ] {
            assert!(after.lines().any(|l| l == line), "no {line} in {after}");
        }
    }
}
