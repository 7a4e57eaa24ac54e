//! The certificate and key served on the TLS port, and their reloading.
//!
//! Knative mounts a secret volume with `tls.crt` and `tls.key`, and its
//! queue-proxy re-reads them every minute (`certificate.NewCertWatcher`),
//! reloading when their bytes changed and keeping the pair it has when the
//! new one does not load. [`CertStore`] does the same, and
//! [`CertStore::watch`] reloads as soon as the directory changes: the
//! kubelet updates a secret volume by swapping its `..data` symlink, which
//! the directory's inotify events show, with the minute's re-read kept as a
//! fallback.
//!
//! A certificate past its validity is served, as Go serves it, with a
//! warning in the log: refusing it would take the pod out of service
//! without helping a client that already refuses it.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::time::Instant;

use crate::dir_events::DirEvents;

/// The certificate's file name in the directory (`certificates.CertName`).
pub(crate) const CERT_FILE: &str = "tls.crt";
/// The key's file name (`certificates.PrivateKeyName`).
pub(crate) const KEY_FILE: &str = "tls.key";
/// How often the pair is re-read whatever the directory's events say:
/// Knative's period.
const RECHECK: Duration = Duration::from_secs(60);
/// How soon a pair that did not load is tried again after a change: a
/// writer may not have finished.
const RETRY: Duration = Duration::from_secs(1);

/// Why a certificate and key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{0} holds no PEM certificate")]
    NoCertificate(PathBuf),
    /// The certificate file's PEM is malformed.
    #[error("{path}: {reason}")]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key file holds no usable private key.
    #[error("{path}: no usable private key: {reason}")]
    BadKey {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key does not match the certificate, or cannot sign.
    #[error("{cert} and {key} do not make a pair: {reason}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        reason: String,
    },
}

/// The files of one certificate directory.
#[derive(Debug, Clone)]
pub(crate) struct CertFiles {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl CertFiles {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            cert: dir.join(CERT_FILE),
            key: dir.join(KEY_FILE),
        }
    }

    /// Whether TLS is to be served: both files exist (through symlinks),
    /// as Knative checks once at start. An error other than "not found"
    /// is returned, as Knative stops on it.
    pub(crate) fn present(&self) -> Result<bool, CertError> {
        let exists = |path: &Path| match std::fs::metadata(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(CertError::Read {
                path: path.to_owned(),
                source,
            }),
        };
        Ok(exists(&self.cert)? && exists(&self.key)?)
    }

    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), CertError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| CertError::Read {
                path: path.to_owned(),
                source,
            })
        };
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    fn parse(
        &self,
        cert_pem: &[u8],
        key_pem: &[u8],
        provider: &CryptoProvider,
    ) -> Result<Arc<CertifiedKey>, CertError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CertError::BadCertificate {
                path: self.cert.clone(),
                reason: e.to_string(),
            })?;
        if chain.is_empty() {
            return Err(CertError::NoCertificate(self.cert.clone()));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| CertError::BadKey {
            path: self.key.clone(),
            reason: e.to_string(),
        })?;
        let certified =
            CertifiedKey::from_der(chain, key, provider).map_err(|e| CertError::Mismatch {
                cert: self.cert.clone(),
                key: self.key.clone(),
                reason: e.to_string(),
            })?;
        Ok(Arc::new(certified))
    }
}

/// The pair being served, and the bytes it was loaded from.
#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    files: (Vec<u8>, Vec<u8>),
}

/// The certificate the TLS port serves, replaced when the files change.
#[derive(Debug)]
pub(crate) struct CertStore {
    files: CertFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Loaded>,
}

impl CertStore {
    /// Loads the pair in `files`: an error stops the start, as Knative's
    /// does.
    pub(crate) fn load(files: CertFiles, provider: Arc<CryptoProvider>) -> Result<Self, CertError> {
        let bytes = files.read()?;
        let key = files.parse(&bytes.0, &bytes.1, &provider)?;
        warn_if_out_of_date(&files.cert, &key);
        Ok(Self {
            files,
            provider,
            current: RwLock::new(Loaded { key, files: bytes }),
        })
    }

    /// Re-reads the files and serves the pair they hold if it changed and
    /// loads; returns whether the pair served is what the files hold.
    pub(crate) fn reload(&self) -> bool {
        let bytes = match self.files.read() {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "cannot reload the TLS certificate; the previous one is kept");
                return false;
            }
        };
        if self
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .files
            == bytes
        {
            return true;
        }
        match self.files.parse(&bytes.0, &bytes.1, &self.provider) {
            Ok(key) => {
                warn_if_out_of_date(&self.files.cert, &key);
                *self.current.write().unwrap_or_else(PoisonError::into_inner) =
                    Loaded { key, files: bytes };
                tracing::info!("Certificate and/or key have changed on disk and were reloaded.");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot reload the TLS certificate; the previous one is kept");
                false
            }
        }
    }

    /// Reloads whenever the directory changes, and every minute anyway,
    /// for as long as anyone else holds the store.
    pub(crate) fn watch(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let store = Arc::downgrade(self);
        let dir = self.files.dir.clone();
        async move {
            let mut events = DirEvents::new(&dir, "the certificate directory");
            let mut next = Instant::now() + RECHECK;
            loop {
                tokio::select! {
                    () = events.changed() => {}
                    () = tokio::time::sleep_until(next) => {}
                }
                let Some(store) = store.upgrade() else { return };
                let current = store.reload();
                next = Instant::now() + if current { RECHECK } else { RETRY };
            }
        }
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .key
                .clone(),
        )
    }
}

/// Logs a warning when the leaf certificate is not valid now.
fn warn_if_out_of_date(path: &Path, key: &CertifiedKey) {
    let Some(leaf) = key.cert.first() else { return };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else {
        return;
    };
    let validity = cert.validity();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    if now > validity.not_after.timestamp() {
        tracing::warn!(
            certificate = %path.display(),
            not_after = %validity.not_after,
            "the TLS certificate has expired; it is served all the same, as Knative's queue-proxy serves it"
        );
    } else if now < validity.not_before.timestamp() {
        tracing::warn!(
            certificate = %path.display(),
            not_before = %validity.not_before,
            "the TLS certificate is not valid yet; it is served all the same"
        );
    }
}
