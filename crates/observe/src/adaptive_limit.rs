//! The adaptive concurrency limit, as gauges.
//!
//! With the `adaptive-concurrency` option on a revision without
//! `containerConcurrency`, the breaker's capacity follows the app
//! ([`qproxy_breaker::Breaker::adaptive`]). The limit in force and the app's
//! unloaded latency the rule last measured are served on the user metrics
//! port (9091) with the revision's labels, as
//! `qproxy_adaptive_concurrency_limit` and
//! `qproxy_adaptive_concurrency_unloaded_seconds` (once measured), and,
//! where current Knative pushes request metrics over OTLP, as
//! `qproxy.adaptive_concurrency.limit` and
//! `qproxy.adaptive_concurrency.unloaded` (unit `s`) beside them.

use opentelemetry::metrics::{Meter, ObservableGauge};
use qproxy_breaker::Breaker;

use crate::prom_text::gauge;

const LIMIT: &str = "qproxy_adaptive_concurrency_limit";
const LIMIT_HELP: &str = "The concurrency limit qproxy found from the app's latency.";
const UNLOADED: &str = "qproxy_adaptive_concurrency_unloaded_seconds";
const UNLOADED_HELP: &str =
    "The app's latency at the probe's low concurrency, as qproxy last measured it.";

/// An adaptive breaker's limit and unloaded latency, read as they are
/// served.
#[derive(Debug, Clone)]
pub struct AdaptiveLimit(Breaker);

impl AdaptiveLimit {
    /// The gauges of `breaker`, if it is adaptive.
    pub fn of(breaker: Option<&Breaker>) -> Option<Self> {
        breaker
            .filter(|b| b.is_adaptive())
            .map(|b| AdaptiveLimit(b.clone()))
    }

    /// Appends the gauges, labelled with `labels`, in the Prometheus text
    /// format, to `out`.
    pub fn render(&self, labels: &str, out: &mut String) {
        gauge(out, LIMIT, LIMIT_HELP, labels, self.0.capacity());
        if let Some(unloaded) = self.0.unloaded() {
            gauge(out, UNLOADED, UNLOADED_HELP, labels, unloaded.as_secs_f64());
        }
    }

    /// The gauges as OTLP instruments of `meter`.
    pub fn gauges(&self, meter: &Meter) -> (ObservableGauge<u64>, ObservableGauge<f64>) {
        let breaker = self.0.clone();
        let limit = meter
            .u64_observable_gauge("qproxy.adaptive_concurrency.limit")
            .with_description(LIMIT_HELP)
            .with_unit("{request}")
            .with_callback(move |observer| observer.observe(u64::from(breaker.capacity()), &[]))
            .build();
        let breaker = self.0.clone();
        let unloaded = meter
            .f64_observable_gauge("qproxy.adaptive_concurrency.unloaded")
            .with_description(UNLOADED_HELP)
            .with_unit("s")
            .with_callback(move |observer| {
                if let Some(unloaded) = breaker.unloaded() {
                    observer.observe(unloaded.as_secs_f64(), &[]);
                }
            })
            .build();
        (limit, unloaded)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use qproxy_breaker::GradientSettings;

    use super::*;

    #[test]
    fn the_limit_is_served_and_the_unloaded_latency_once_measured() {
        assert!(AdaptiveLimit::of(Some(&Breaker::new(3, 30))).is_none());
        let settings = GradientSettings {
            probe_samples: 1,
            ..GradientSettings::default()
        };
        let breaker = Breaker::adaptive(settings, Duration::ZERO, 10);
        let gauges = AdaptiveLimit::of(Some(&breaker)).expect("adaptive");
        let mut out = String::new();
        gauges.render("a=\"b\"", &mut out);
        assert_eq!(
            out,
            format!("# HELP {LIMIT} {LIMIT_HELP}\n# TYPE {LIMIT} gauge\n{LIMIT}{{a=\"b\"}} 3\n")
        );
        let permit = breaker.acquire().ok().and_then(|mut a| a.now());
        drop(permit);
        let mut out = String::new();
        gauges.render("a=\"b\"", &mut out);
        assert!(out.contains(&format!("{LIMIT}{{a=\"b\"}} 20\n")), "{out}");
        assert!(out.contains(&format!("# TYPE {UNLOADED} gauge\n{UNLOADED}{{a=\"b\"}} ")));
    }
}
