//! A certificate authority of the test's own: a CA, a server certificate
//! for `localhost` and `127.0.0.1` it signed, and a client certificate
//! for mutual TLS, written as PEM files the way a pod mounts them.

use std::path::PathBuf;
use std::sync::Arc;

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
        let signed = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert_pem, server_key_pem) =
            signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]);
        let (client_cert_pem, client_key_pem) = signed(vec!["qproxy".to_owned()]);
        let dir = crate::target_dir()
            .join("tmp")
            .join(format!("tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = TestCa {
            ca_pem: ca_cert.pem(),
            server_cert_pem,
            server_key_pem,
            client_cert_pem,
            client_key_pem,
            dir,
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

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
