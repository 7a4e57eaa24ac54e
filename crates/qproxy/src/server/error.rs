//! Why qproxy could not start: each part's own error, gathered.

use super::listener::BindError;
use crate::config::ConfigError;
use crate::tls::TlsError;
use qproxy_observe::ExportError;

/// Why qproxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The environment was rejected.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A port could not be listened on.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// TLS could not be served as configured.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// An exporter could not be set up as configured.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// Anything else at start-up.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}
