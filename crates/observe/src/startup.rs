//! How long the pod took to come up, measured from inside it.
//!
//! Knative shows a cold start only as a whole, from the activator's side:
//! an operator cannot tell how much of it was the app starting, its
//! readiness probe, or the proxy. qproxy measures two spans from when it
//! starts (its configuration read and its ports bound, a few milliseconds
//! after the process starts):
//!
//! - to the app's first passing readiness check (the first health check
//!   answered `200 queue`), and
//! - to the first request answered by the app (probes that reach it, a
//!   kubelet probe with only `K-Kubelet-Probe`, not counted).
//!
//! Each is logged once, as it happens, and served from then on as a gauge
//! on the user metrics port (9091) in both generations, under a `qproxy_`
//! prefix so that it cannot be taken for one of Knative's own families.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A span of the start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// To the app's first passing readiness check.
    AppReady,
    /// To the first request the app answered.
    FirstRequest,
}

impl Span {
    /// Every span, in the order they are served.
    pub const ALL: [Span; 2] = [Span::AppReady, Span::FirstRequest];

    /// The gauge's name in the Prometheus text.
    pub fn prometheus_name(self) -> &'static str {
        match self {
            Span::AppReady => "qproxy_startup_app_ready_seconds",
            Span::FirstRequest => "qproxy_startup_first_request_seconds",
        }
    }

    /// The instrument's name over OTLP (its unit, `s`, apart).
    pub fn otel_name(self) -> &'static str {
        match self {
            Span::AppReady => "qproxy.startup.app_ready",
            Span::FirstRequest => "qproxy.startup.first_request",
        }
    }

    /// The gauge's help.
    pub fn help(self) -> &'static str {
        match self {
            Span::AppReady => {
                "Seconds from qproxy's start to the user container's first passing readiness check."
            }
            Span::FirstRequest => {
                "Seconds from qproxy's start to the first request the user container answered."
            }
        }
    }

    /// The log line's message.
    fn log(self) -> &'static str {
        match self {
            Span::AppReady => "The user container passed its first readiness check",
            Span::FirstRequest => "The user container answered its first request",
        }
    }
}

/// The start-up's spans, each set once; shared by the health checks, the
/// proxy and the metrics.
#[derive(Debug)]
pub struct Startup {
    begun: Instant,
    app_ready: OnceLock<Duration>,
    first_request: OnceLock<Duration>,
}

impl Startup {
    /// Starts the clock.
    pub fn begin() -> Self {
        Self {
            begun: Instant::now(),
            app_ready: OnceLock::new(),
            first_request: OnceLock::new(),
        }
    }

    /// The app has passed a readiness check; only the first counts.
    pub fn app_ready(&self) {
        self.mark(Span::AppReady);
    }

    /// Whether the app's first answer is still to come.
    pub fn awaits_first_request(&self) -> bool {
        self.first_request.get().is_none()
    }

    /// The app has answered a request; only the first counts.
    pub fn request_answered(&self) {
        self.mark(Span::FirstRequest);
    }

    /// How long `span` took, once known.
    pub fn span(&self, span: Span) -> Option<Duration> {
        self.slot(span).get().copied()
    }

    fn slot(&self, span: Span) -> &OnceLock<Duration> {
        match span {
            Span::AppReady => &self.app_ready,
            Span::FirstRequest => &self.first_request,
        }
    }

    #[cold]
    fn mark(&self, span: Span) {
        let took = self.begun.elapsed();
        if self.slot(span).set(took).is_ok() {
            tracing::info!(seconds = took.as_secs_f64(), "{}", span.log());
        }
    }

    /// Appends the gauges known so far, labelled with `labels`, in the
    /// Prometheus text format, to `out`.
    pub fn render(&self, labels: &str, out: &mut String) {
        for span in Span::ALL {
            if let Some(took) = self.span(span) {
                let (name, help) = (span.prometheus_name(), span.help());
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} gauge");
                let _ = writeln!(out, "{name}{{{labels}}} {}", took.as_secs_f64());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_served_once_known_and_keeps_its_first_value() {
        let startup = Startup::begin();
        let mut out = String::new();
        startup.render("a=\"b\"", &mut out);
        assert_eq!(out, "");

        startup.app_ready();
        let first = startup.span(Span::AppReady).unwrap();
        startup.app_ready();
        assert_eq!(startup.span(Span::AppReady), Some(first));
        startup.render("a=\"b\"", &mut out);
        assert!(out.contains("# TYPE qproxy_startup_app_ready_seconds gauge\n"));
        assert!(out.contains(&format!(
            "qproxy_startup_app_ready_seconds{{a=\"b\"}} {}\n",
            first.as_secs_f64()
        )));
        assert!(!out.contains("first_request"));

        startup.request_answered();
        let mut out = String::new();
        startup.render("a=\"b\"", &mut out);
        assert!(out.contains("qproxy_startup_first_request_seconds{a=\"b\"} "));
    }
}
