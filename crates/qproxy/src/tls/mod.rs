//! TLS on `QUEUE_SERVING_TLS_PORT` (8112), Knative's system-internal TLS.
//!
//! When Knative mounts a certificate and key into the queue-proxy's
//! container (`/var/lib/knative/certs/tls.crt` and `tls.key`, or
//! `QPROXY_CERT_DIR`), the activator and the ingress reach the pod on the
//! TLS port, which serves the same stack as the main port. Whether TLS is
//! served is decided once, at start, by whether both files exist; a pair
//! that does not load then stops the start, as in Knative. Classic Knative
//! also moves the admin port to TLS; current Knative keeps it plain.
//!
//! The port speaks what Go's TLS server with Knative's h2c wrapper speaks:
//! HTTP/2 when ALPN chose `h2`, and also when a client without ALPN starts
//! with HTTP/2's preface (the activator offers no ALPN and does so), and
//! HTTP/1.1 otherwise.

mod certs;
mod settings;

use std::future::Future;
use std::sync::Arc;

use tokio_rustls::TlsAcceptor;

pub use certs::CertError;
use certs::{CertFiles, CertStore};

use crate::config::{Config, ConfigError, Generation};

/// Why TLS could not be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A `QUEUE_PROXY_TLS_*` setting is invalid, or cannot be honoured.
    #[error(transparent)]
    Settings(#[from] ConfigError),
    /// The certificate and key could not be loaded.
    #[error(transparent)]
    Cert(#[from] CertError),
}

pub(crate) use qproxy_core::crypto::provider;

/// The TLS side of the servers, when the certificate is mounted.
#[derive(Clone)]
pub(crate) struct TlsPort {
    /// Handshakes with the configured settings and the current pair.
    pub(crate) acceptor: TlsAcceptor,
    /// Whether the admin port is served over TLS too (classic Knative).
    pub(crate) admin: bool,
    store: Arc<CertStore>,
}

impl std::fmt::Debug for TlsPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPort")
            .field("admin", &self.admin)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl TlsPort {
    /// TLS as `config` asks for it, or `None` when the certificate and key
    /// are not both there.
    pub(crate) fn from_config(config: &Config) -> Result<Option<Self>, TlsError> {
        let files = CertFiles::new(&config.cert_dir);
        if !files.present()? {
            return Ok(None);
        }
        let settings = config.tls.clone()?;
        let provider = Arc::new(provider());
        let store = Arc::new(CertStore::load(files, provider.clone())?);
        let generation = config.observability.generation();
        let server = settings::server_config(&settings, generation, &provider, store.clone())?;
        Ok(Some(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            admin: generation == Generation::Classic,
            store,
        }))
    }

    /// Reloads the pair when its files change, for as long as the
    /// servers run.
    pub(crate) fn watch(&self) -> impl Future<Output = ()> + Send + 'static {
        self.store.watch()
    }
}
