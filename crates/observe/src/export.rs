//! Why an exporter could not be set up, and what it sends.

/// An exporter the configuration asks for could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot export {signal} to {endpoint:?}: {reason}")]
pub struct ExportError {
    signal: Signal,
    endpoint: String,
    reason: String,
}

impl ExportError {
    /// The exporter of `signal` to `endpoint` failed for `reason`.
    pub fn new(signal: Signal, endpoint: &str, reason: &dyn std::fmt::Display) -> Self {
        Self {
            signal,
            endpoint: endpoint.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// What an exporter sends.
#[derive(Debug, Clone, Copy)]
pub enum Signal {
    /// Spans.
    Traces,
    /// Request metrics.
    Metrics,
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Signal::Traces => "traces",
            Signal::Metrics => "request metrics",
        })
    }
}
