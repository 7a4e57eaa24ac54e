//! A certificate authority of the test's own: a CA, a server certificate
//! for `localhost` and `127.0.0.1` it signed, and a client certificate
//! for mutual TLS, written as PEM files the way a pod mounts them.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A CA and the certificates it signed, as PEM, and as files in a folder.
pub struct TestCa {
    /// The CA's certificate.
    pub ca_pem: String,
    /// The server's certificate and key (`localhost`, `127.0.0.1`).
    pub server_cert_pem: String,
    /// The server's private key.
    pub server_key_pem: String,
    /// A client's certificate and key, for mutual TLS.
    pub client_cert_pem: String,
    /// The client's private key.
    pub client_key_pem: String,
    /// Where the files are: `ca.pem`, `server.pem`, `server.key`,
    /// `client.pem`, `client.key`.
    pub dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    /// A new CA with its certificates, written into a new folder under the
    /// target directory.
    pub fn new(name: &str) -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let (server_cert_pem, server_key_pem) = issue(&issuer, &["localhost", "127.0.0.1"]);
        let (client_cert_pem, client_key_pem) = issue(&issuer, &["qproxy"]);
        // One directory per CA: tests of one process run at once, and each
        // CA removes its directory when dropped.
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        let dir = crate::target_dir()
            .join("tmp")
            .join(format!("tls-{name}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = TestCa {
            ca_pem: ca_cert.pem(),
            server_cert_pem,
            server_key_pem,
            client_cert_pem,
            client_key_pem,
            dir,
            issuer,
        };
        for (file, text) in [
            ("ca.pem", &ca.ca_pem),
            ("server.pem", &ca.server_cert_pem),
            ("server.key", &ca.server_key_pem),
            ("client.pem", &ca.client_cert_pem),
            ("client.key", &ca.client_key_pem),
        ] {
            std::fs::write(ca.dir.join(file), text).unwrap();
        }
        ca
    }

    /// A new certificate for `names` and its key, as PEM.
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        issue(&self.issuer, names)
    }

    /// A certificate for `names` whose validity ended in 2021, and its key.
    pub fn issue_expired(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A new certificate and key as Knative issues them for a revision's
    /// queue-proxy in namespace `default` (`kn-user-default` and
    /// `data-plane.knative.dev`, the name the activator checks).
    pub fn knative_pair(&self) -> (String, String) {
        self.issue(&[KNATIVE_SERVER_NAME, "kn-user-default"])
    }

    /// A client configuration that trusts this CA only, offering `alpn`
    /// and the TLS `versions` given.
    pub fn client_config(
        &self,
        alpn: &[&[u8]],
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// The path of one of the files.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A rustls server configuration with the server certificate; with
    /// `client_auth`, clients must present a certificate the CA signed.
    pub fn server_config(&self, client_auth: bool) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.server_cert_pem.as_bytes())
                .map(Result::unwrap)
                .collect();
        let key = PrivateKeyDer::from_pem_slice(self.server_key_pem.as_bytes()).unwrap();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
                roots.add(cert.unwrap()).unwrap();
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_single_cert(certs, key).unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// The name the activator verifies on a queue-proxy's certificate
/// (`certificates.LegacyFakeDnsName`), and sends as SNI.
pub const KNATIVE_SERVER_NAME: &str = "data-plane.knative.dev";

fn issue(issuer: &Issuer<'static, KeyPair>, names: &[&str]) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, issuer)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A directory laid out and updated as the kubelet lays out and updates a
/// secret volume: the files live in a timestamped directory, reached
/// through the `..data` symlink, which an update swaps atomically.
pub struct SecretVolume {
    /// The mount point.
    pub dir: PathBuf,
    updates: u32,
}

impl SecretVolume {
    /// A volume holding `tls.crt` and `tls.key`, under `parent`.
    pub fn new(parent: &std::path::Path, cert_pem: &str, key_pem: &str) -> Self {
        let dir = parent.join("certs");
        std::fs::create_dir_all(&dir).unwrap();
        let mut volume = SecretVolume { dir, updates: 0 };
        volume.update(&[
            ("tls.crt", cert_pem.as_bytes()),
            ("tls.key", key_pem.as_bytes()),
        ]);
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.dir.join(name)).unwrap();
        }
        volume
    }

    /// Replaces the volume's files at once, as the kubelet does: a new
    /// directory, a `..data_tmp` symlink to it renamed over `..data`, the
    /// old directory removed.
    pub fn update(&mut self, files: &[(&str, &[u8])]) {
        self.updates += 1;
        let fresh = format!(
            "..2026_01_01_00_00_{:02}.{}",
            self.updates % 60,
            self.updates
        );
        std::fs::create_dir(self.dir.join(&fresh)).unwrap();
        for (name, bytes) in files {
            std::fs::write(self.dir.join(&fresh).join(name), bytes).unwrap();
        }
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&fresh, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What one request over TLS got.
#[derive(Debug)]
pub struct TlsAnswer {
    /// The status.
    pub status: http::StatusCode,
    /// The body.
    pub body: bytes::Bytes,
    /// The protocol ALPN chose, if any.
    pub alpn: Option<Vec<u8>>,
    /// The TLS version agreed.
    pub version: Option<rustls::ProtocolVersion>,
    /// The server's certificate (the leaf), DER.
    pub leaf: Vec<u8>,
}

/// Connects to `addr` over TLS with `config`, sending `server_name`.
pub async fn tls_connect(
    addr: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(std::io::Error::other)?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// `GET path` on a new TLS connection to `addr`: HTTP/2 when ALPN chose
/// `h2` or `h2` is asked for (prior knowledge, as the activator speaks),
/// HTTP/1.1 otherwise.
pub async fn tls_get(
    addr: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
    path: &str,
    h2: bool,
) -> Result<TlsAnswer, String> {
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let stream = tls_connect(addr, config, KNATIVE_SERVER_NAME)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (_, session) = stream.get_ref();
    let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
    let version = session.protocol_version();
    let leaf = session
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default();
    let request = http::Request::get(format!("https://{KNATIVE_SERVER_NAME}{path}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let io = TokioIo::new(stream);
    let response = if h2 || alpn.as_deref() == Some(b"h2") {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| format!("h2 handshake: {e}"))?;
        tokio::spawn(conn);
        sender.send_request(request).await
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| format!("http/1.1 handshake: {e}"))?;
        tokio::spawn(conn);
        let mut request = request;
        request.headers_mut().insert(
            http::header::HOST,
            http::HeaderValue::from_static(KNATIVE_SERVER_NAME),
        );
        sender.send_request(request).await
    }
    .map_err(|e| format!("request: {e}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok(TlsAnswer {
        status,
        body,
        alpn,
        version,
        leaf,
    })
}
