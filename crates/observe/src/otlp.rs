//! How current Knative's OTLP exporters reach their collector, for traces
//! and request metrics alike, as knative.dev/pkg's `observability`
//! packages and the Go SDK's exporters set them up:
//!
//! - The endpoint is `OBSERVABILITY_CONFIG`'s, unless
//!   `OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
//!   is set: then Knative leaves the exporter to take it from there. Over
//!   HTTP, the generic one is a base the signal's path (`/v1/traces`)
//!   joins.
//! - An endpoint without a scheme (`collector.observability:4317`) is
//!   `https://`, as knative.dev/pkg reads it; one whose first part cannot
//!   be a scheme (`10.0.0.1:4317`) does not parse, in Knative as here.
//! - Over HTTP, any other endpoint without a path gets the signal's
//!   (`/v1/traces`, `/v1/metrics`); one with a path keeps it, `/` too.
//! - `https://` is TLS (rustls): the collector's certificate is verified
//!   against Mozilla's roots, compiled in (the image has no CA bundle), or
//!   against the CA of `OTEL_EXPORTER_OTLP_[<SIGNAL>_]CERTIFICATE`; with
//!   `…_CLIENT_CERTIFICATE` and `…_CLIENT_KEY`, qproxy presents its own
//!   (mutual TLS). A file that cannot be read is a warning, and the public
//!   roots are used, as Go's exporters do.
//! - Headers, timeout and compression (`OTEL_EXPORTER_OTLP_[<SIGNAL>_]`
//!   `HEADERS`, `TIMEOUT`, `COMPRESSION`) the exporter reads itself, as
//!   Go's does.

use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{OtelEnv, TlsFiles};
use crate::export::{ExportError, Signal};

/// How an exporter speaks to its collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `grpc`.
    Grpc,
    /// `http/protobuf`.
    HttpProtobuf,
}

impl Signal {
    /// The signal's path on an OTLP/HTTP collector.
    fn path(self) -> &'static str {
        match self {
            Signal::Traces => "/v1/traces",
            Signal::Metrics => "/v1/metrics",
        }
    }
}

/// Where an exporter sends, and with which TLS files.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    signal: Signal,
    transport: Transport,
    /// The endpoint the exporter is given.
    endpoint: String,
    tls: &'a TlsFiles,
}

impl<'a> Target<'a> {
    /// The collector of `signal`, over `transport`: `configured` (from
    /// `OBSERVABILITY_CONFIG`) unless the environment names one.
    pub fn new(
        signal: Signal,
        transport: Transport,
        configured: &str,
        otel: &'a OtelEnv,
    ) -> Result<Self, ExportError> {
        let (own, tls) = match signal {
            Signal::Traces => (&otel.traces_endpoint, &otel.traces_tls),
            Signal::Metrics => (&otel.metrics_endpoint, &otel.metrics_tls),
        };
        let (endpoint, generic) = match (own, &otel.endpoint) {
            (Some(own), _) => (own.as_str(), false),
            (None, Some(generic)) => (generic.as_str(), true),
            (None, None) => (configured, false),
        };
        let mut endpoint = with_scheme(endpoint)
            .ok_or_else(|| ExportError::new(signal, endpoint, &"the endpoint does not parse"))?;
        if transport == Transport::HttpProtobuf {
            if generic {
                // The generic endpoint is a base: the signal's path joins it.
                endpoint.truncate(endpoint.trim_end_matches('/').len());
                endpoint.push_str(signal.path());
            } else if !has_path(&endpoint) {
                endpoint.push_str(signal.path());
            }
        }
        Ok(Self {
            signal,
            transport,
            endpoint,
            tls,
        })
    }

    /// Whether the collector is reached over TLS.
    fn https(&self) -> bool {
        self.endpoint.starts_with("https://")
    }

    fn failed(&self, reason: &dyn std::fmt::Display) -> ExportError {
        ExportError::new(self.signal, &self.endpoint, reason)
    }

    /// The span exporter to this target.
    pub fn span_exporter(&self) -> Result<opentelemetry_otlp::SpanExporter, ExportError> {
        let builder = opentelemetry_otlp::SpanExporter::builder();
        match self.transport {
            Transport::Grpc => {
                let mut b = builder.with_tonic().with_endpoint(&self.endpoint);
                if self.https() {
                    b = b.with_tls_config(self.tonic_tls());
                }
                b.build()
            }
            Transport::HttpProtobuf => builder
                .with_http()
                .with_http_client(self.http_client())
                .with_endpoint(&self.endpoint)
                .build(),
        }
        .map_err(|e| self.failed(&e))
    }

    /// The metric exporter to this target.
    pub fn metric_exporter(&self) -> Result<opentelemetry_otlp::MetricExporter, ExportError> {
        let builder = opentelemetry_otlp::MetricExporter::builder();
        match self.transport {
            Transport::Grpc => {
                let mut b = builder.with_tonic().with_endpoint(&self.endpoint);
                if self.https() {
                    b = b.with_tls_config(self.tonic_tls());
                }
                b.build()
            }
            Transport::HttpProtobuf => builder
                .with_http()
                .with_http_client(self.http_client())
                .with_endpoint(&self.endpoint)
                .build(),
        }
        .map_err(|e| self.failed(&e))
    }

    /// gRPC's TLS: the CA file, or the public roots; the client identity.
    fn tonic_tls(&self) -> tonic::transport::ClientTlsConfig {
        let mut config = tonic::transport::ClientTlsConfig::new();
        config = match read(self.tls.certificate.as_deref()) {
            Some(ca) => config.ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            None => config.with_webpki_roots(),
        };
        if let Some((cert, key)) = self.client_identity_pem() {
            config = config.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        config
    }

    /// The client certificate and key, both read, if both are given.
    fn client_identity_pem(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        let cert = read(self.tls.client_certificate.as_deref())?;
        let key = read(self.tls.client_key.as_deref())?;
        Some((cert, key))
    }

    /// The HTTP client: plain, or TLS as the module docs say.
    fn http_client(&self) -> HyperClient<HttpsConnector<HttpConnector>> {
        HyperClient::new(https_connector(self.rustls_config()), TIMEOUT, None)
    }

    /// rustls' client configuration for this target.
    fn rustls_config(&self) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        let ca = read(self.tls.certificate.as_deref()).map(|pem| {
            CertificateDer::pem_slice_iter(&pem)
                .filter_map(Result::ok)
                .collect::<Vec<_>>()
        });
        match ca {
            Some(certs) if !certs.is_empty() => {
                let (_, ignored) = roots.add_parsable_certificates(certs);
                if ignored > 0 {
                    tracing::warn!(
                        ignored,
                        "some certificates of the OTLP CA file were not usable"
                    );
                }
            }
            _ => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let builder =
            rustls::ClientConfig::builder_with_provider(Arc::new(qproxy_core::crypto::provider()))
                .with_safe_default_protocol_versions()
                .unwrap_or_else(|_| {
                    unreachable!("aws-lc-rs supports the default protocol versions")
                })
                .with_root_certificates(roots);
        let identity = self.client_identity_pem().and_then(|(cert, key)| {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
                .filter_map(Result::ok)
                .collect();
            let key = PrivateKeyDer::from_pem_slice(&key).ok()?;
            Some((certs, key))
        });
        match identity {
            Some((certs, key)) => builder
                .clone()
                .with_client_auth_cert(certs, key)
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "the OTLP client certificate is not usable");
                    builder.with_no_client_auth()
                }),
            None => builder.with_no_client_auth(),
        }
    }
}

/// How long one export over HTTP may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A connector for `http://` and `https://` alike.
fn https_connector(tls: rustls::ClientConfig) -> HttpsConnector<HttpConnector> {
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build()
}

/// The HTTP client of exporters that only ever speak plain HTTP (Zipkin).
pub fn plain_http_client() -> HyperClient {
    HyperClient::with_default_connector(Duration::from_secs(5), None)
}

/// Reads a PEM file named in the environment; a file that cannot be read
/// is a warning, and `None`.
fn read(path: Option<&std::path::Path>) -> Option<Vec<u8>> {
    let path = path?;
    match std::fs::read(path) {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read a TLS file for OTLP export");
            None
        }
    }
}

/// `endpoint` with a scheme: as it is when it has one, `https://` in front
/// when its first part cannot be a host but can be a scheme followed by an
/// opaque rest (Go's `url.Parse` reads `collector:4317` so, and Knative
/// then adds `https://`); `None` when Go's `url.Parse` refuses it.
fn with_scheme(endpoint: &str) -> Option<String> {
    if endpoint.contains("://") {
        return Some(endpoint.to_owned());
    }
    let Some((first, rest)) = endpoint.split_once(':') else {
        // No colon: a path, which Go's exporter takes as no endpoint.
        return Some(endpoint.to_owned());
    };
    if first.contains('/') {
        return Some(endpoint.to_owned());
    }
    let scheme = first
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && first
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    match (scheme, rest.starts_with('/')) {
        (true, false) => Some(format!("https://{endpoint}")),
        (true, true) => Some(endpoint.to_owned()),
        // "first path segment in URL cannot contain colon".
        (false, _) => None,
    }
}

/// Whether a URL with a scheme has a path (even `/`) after its authority.
fn has_path(endpoint: &str) -> bool {
    endpoint
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_without_a_scheme_are_https_as_knative_reads_them() {
        assert_eq!(
            with_scheme("collector.observability:4317").as_deref(),
            Some("https://collector.observability:4317")
        );
        assert_eq!(
            with_scheme("http://c:4318").as_deref(),
            Some("http://c:4318")
        );
        assert_eq!(with_scheme("10.0.0.1:4317"), None);
        assert_eq!(with_scheme("collector").as_deref(), Some("collector"));
    }

    fn target(transport: Transport, configured: &str, otel: &OtelEnv) -> String {
        Target::new(Signal::Traces, transport, configured, otel)
            .unwrap()
            .endpoint
    }

    #[test]
    fn the_environment_names_the_collector_before_the_configuration() {
        let none = OtelEnv::default();
        assert_eq!(
            target(Transport::HttpProtobuf, "http://c:4318", &none),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            target(Transport::HttpProtobuf, "http://c:4318/", &none),
            "http://c:4318/"
        );
        assert_eq!(
            target(Transport::Grpc, "http://c:4317", &none),
            "http://c:4317"
        );
        let generic = OtelEnv {
            endpoint: Some("https://env:4318/otlp/".to_owned()),
            ..OtelEnv::default()
        };
        assert_eq!(
            target(Transport::HttpProtobuf, "http://c:4318", &generic),
            "https://env:4318/otlp/v1/traces"
        );
        let own = OtelEnv {
            traces_endpoint: Some("http://own:4318/custom".to_owned()),
            ..generic
        };
        assert_eq!(
            target(Transport::HttpProtobuf, "http://c:4318", &own),
            "http://own:4318/custom"
        );
        let bare = OtelEnv {
            traces_endpoint: Some("http://own:4318".to_owned()),
            ..OtelEnv::default()
        };
        assert_eq!(
            target(Transport::HttpProtobuf, "", &bare),
            "http://own:4318/v1/traces"
        );
    }
}
