//! The one cryptography provider of qproxy's TLS, for the TLS port and for
//! the OTLP exporters' clients alike.

use rustls::crypto::CryptoProvider;

/// The cryptography qproxy's TLS is built on: aws-lc-rs, the provider
/// with `X25519MLKEM768`, the post-quantum group current Knative's Go
/// queue-proxy settles on by default (and one with a FIPS-validated
/// build). Measured against ring (`benches/RESULTS.md`): the same CPU per
/// request and per handshake, 2.9 MB more binary.
pub fn provider() -> CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

/// Makes [`provider`] rustls's process-wide default, for the clients that
/// take the default (the OTLP exporters' tonic and hyper-rustls), so that
/// the one provider linked in is the one they use whatever the features
/// of their crates. The TLS port names its own provider.
pub fn install_default_provider() {
    let _ = provider().install_default();
}
