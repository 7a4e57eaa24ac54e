//! What every try of a probe shares: how it names itself to the app,
//! how HTTP probes speak to it, and where an empty host goes.

use crate::config::Generation;

/// The `User-Agent` of every probe request: Knative's kubelet prefix,
/// followed by an empty Kubernetes version, exactly as the Go queue-proxy
/// sends it.
pub(crate) const PROBE_USER_AGENT: &str = "kube-probe//";

/// How the HTTP probes speak to the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HttpOptions {
    /// `ENABLE_HTTP2_AUTO_DETECTION`: find out whether the app speaks h2c.
    pub(crate) auto_detect_http2: bool,
    /// Which Knative's way of finding that out.
    pub(crate) generation: Generation,
}

/// The host of a probe, loopback when left empty.
pub(crate) fn host_or_loopback(host: &str) -> &str {
    if host.is_empty() { "127.0.0.1" } else { host }
}
