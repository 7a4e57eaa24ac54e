//! The TLS settings of either generation ([`TlsSettings`]) as a rustls server
//! configuration, with Go's meaning for each.
//!
//! - **Versions:** TLS 1.2 and 1.3 between the minimum and the maximum.
//! - **Cipher suites** name the TLS 1.2 suites only, as in Go: TLS 1.3
//!   names are accepted and change nothing (Go offers every TLS 1.3 suite
//!   it has). A TLS 1.2 suite rustls does not have (the CBC ones) stops
//!   the start, naming the variable: offering fewer suites than asked
//!   would be a silent change of policy. As Go's HTTP/2 server does, a
//!   list that allows TLS 1.2 must hold an ECDHE AES-128-GCM suite.
//! - **Curves** choose among Go's groups, which keep Go's order (Go 1.24
//!   and later filter their own list by the preference rather than
//!   following it). A group the crypto provider does not have (P-521)
//!   stops the start. With none named, each generation gets its Knative's
//!   default: current Knative's queue-proxy (Go 1.25) offers
//!   X25519MLKEM768 first; classic Knative's (Go 1.22) does not.
//! - **ALPN:** `h2` then `http/1.1`, as Go's `ListenAndServeTLS` adds.

use std::sync::Arc;

use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::server::ResolvesServerCert;
use rustls::{CipherSuite, NamedGroup, ProtocolVersion, ServerConfig, SupportedCipherSuite};

use crate::config::{ConfigError, Generation, TlsSettings, TlsVersion};

const MIN_VERSION: &str = "QUEUE_PROXY_TLS_MIN_VERSION";
const CIPHER_SUITES: &str = "QUEUE_PROXY_TLS_CIPHER_SUITES";
const CURVES: &str = "QUEUE_PROXY_TLS_CURVE_PREFERENCES";

/// The protocols offered by ALPN, in Go's order.
pub(crate) const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Go's key exchange groups, in Go's order, by the names Knative accepts.
const GROUPS: [(NamedGroup, &[&str]); 5] = [
    (NamedGroup::X25519MLKEM768, &["X25519MLKEM768"]),
    (NamedGroup::X25519, &["X25519"]),
    (NamedGroup::secp256r1, &["CurveP256", "P-256"]),
    (NamedGroup::secp384r1, &["CurveP384", "P-384"]),
    (NamedGroup::secp521r1, &["CurveP521", "P-521"]),
];

/// The TLS 1.2 suites Go's HTTP/2 server requires one of.
const H2_REQUIRED: [CipherSuite; 2] = [
    CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
];

/// The server configuration for `tls` in `generation`, with certificates
/// from `certs`, over `base`'s cryptography.
pub(crate) fn server_config(
    tls: &TlsSettings,
    generation: Generation,
    base: &CryptoProvider,
    certs: Arc<dyn ResolvesServerCert>,
) -> Result<ServerConfig, ConfigError> {
    let versions = versions(tls)?;
    let provider = CryptoProvider {
        cipher_suites: cipher_suites(tls, base)?,
        kx_groups: kx_groups(tls, generation, base)?,
        ..base.clone()
    };
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&versions)
        .map_err(|e| {
            ConfigError::invalid(CIPHER_SUITES, &tls.cipher_suites.join(","), e.to_string())
        })?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

fn versions(
    tls: &TlsSettings,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, ConfigError> {
    let max = tls.max_version.unwrap_or(TlsVersion::Tls13);
    let versions: Vec<_> = [
        (TlsVersion::Tls12, &rustls::version::TLS12),
        (TlsVersion::Tls13, &rustls::version::TLS13),
    ]
    .into_iter()
    .filter(|(v, _)| tls.min_version <= *v && *v <= max)
    .map(|(_, version)| version)
    .collect();
    if versions.is_empty() {
        // Go would start and then fail every handshake.
        return Err(ConfigError::invalid(
            MIN_VERSION,
            version_name(tls.min_version),
            format!(
                "is above QUEUE_PROXY_TLS_MAX_VERSION ({}): no version left to serve",
                version_name(max)
            ),
        ));
    }
    Ok(versions)
}

fn version_name(v: TlsVersion) -> &'static str {
    match v {
        TlsVersion::Tls12 => "1.2",
        TlsVersion::Tls13 => "1.3",
    }
}

/// Every TLS 1.3 suite of `base`, then the TLS 1.2 suites named (or, with
/// none named, `base`'s).
fn cipher_suites(
    tls: &TlsSettings,
    base: &CryptoProvider,
) -> Result<Vec<SupportedCipherSuite>, ConfigError> {
    if tls.cipher_suites.is_empty() {
        return Ok(base.cipher_suites.clone());
    }
    let is_tls13 = |s: &SupportedCipherSuite| s.version().version == ProtocolVersion::TLSv1_3;
    let mut suites: Vec<_> = base
        .cipher_suites
        .iter()
        .copied()
        .filter(is_tls13)
        .collect();
    for name in &tls.cipher_suites {
        // Go's TLS 1.3 names: accepted, no effect.
        if matches!(
            name.as_str(),
            "TLS_AES_128_GCM_SHA256" | "TLS_AES_256_GCM_SHA384" | "TLS_CHACHA20_POLY1305_SHA256"
        ) {
            continue;
        }
        let suite = base
            .cipher_suites
            .iter()
            .find(|s| !is_tls13(s) && s.suite().as_str() == Some(name.as_str()))
            .ok_or_else(|| {
                ConfigError::invalid(
                    CIPHER_SUITES,
                    &tls.cipher_suites.join(","),
                    format!("{name} is not offered by qproxy (rustls has no CBC suites)"),
                )
            })?;
        if !suites.iter().any(|s| s.suite() == suite.suite()) {
            suites.push(*suite);
        }
    }
    let tls12_allowed = tls.min_version == TlsVersion::Tls12;
    if tls12_allowed && !suites.iter().any(|s| H2_REQUIRED.contains(&s.suite())) {
        return Err(ConfigError::invalid(
            CIPHER_SUITES,
            &tls.cipher_suites.join(","),
            "HTTP/2 needs TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 or \
             TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 when TLS 1.2 is allowed \
             (Go's server does not start without one)",
        ));
    }
    Ok(suites)
}

/// The groups named, in Go's order, or each generation's default.
fn kx_groups(
    tls: &TlsSettings,
    generation: Generation,
    base: &CryptoProvider,
) -> Result<Vec<&'static dyn SupportedKxGroup>, ConfigError> {
    let find = |group: NamedGroup| base.kx_groups.iter().copied().find(|g| g.name() == group);
    if tls.curve_preferences.is_empty() {
        return Ok(GROUPS
            .iter()
            .filter(|(g, _)| *g != NamedGroup::X25519MLKEM768 || generation == Generation::Current)
            .filter_map(|(g, _)| find(*g))
            .collect());
    }
    let mut groups = Vec::new();
    for (group, names) in GROUPS {
        let Some(name) = tls
            .curve_preferences
            .iter()
            .find(|n| names.contains(&n.as_str()))
        else {
            continue;
        };
        let kx = find(group).ok_or_else(|| {
            ConfigError::invalid(
                CURVES,
                &tls.curve_preferences.join(","),
                format!("{name} is not offered by qproxy's TLS provider"),
            )
        })?;
        groups.push(kx);
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(min: TlsVersion, suites: &[&str], curves: &[&str]) -> TlsSettings {
        TlsSettings {
            min_version: min,
            max_version: None,
            cipher_suites: suites.iter().map(|s| (*s).to_owned()).collect(),
            curve_preferences: curves.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn groups(tls: &TlsSettings, generation: Generation) -> Vec<NamedGroup> {
        kx_groups(tls, generation, &super::super::provider())
            .unwrap()
            .iter()
            .map(|g| g.name())
            .collect()
    }

    #[test]
    fn each_generation_gets_its_go_default_groups() {
        let tls = TlsSettings::classic();
        assert_eq!(
            groups(&tls, Generation::Current),
            [
                NamedGroup::X25519MLKEM768,
                NamedGroup::X25519,
                NamedGroup::secp256r1,
                NamedGroup::secp384r1
            ]
        );
        assert_eq!(
            groups(&tls, Generation::Classic),
            [
                NamedGroup::X25519,
                NamedGroup::secp256r1,
                NamedGroup::secp384r1
            ]
        );
    }

    #[test]
    fn curve_preferences_filter_in_go_order() {
        let tls = settings(
            TlsVersion::Tls13,
            &[],
            &["P-384", "X25519", "X25519MLKEM768"],
        );
        assert_eq!(
            groups(&tls, Generation::Current),
            [
                NamedGroup::X25519MLKEM768,
                NamedGroup::X25519,
                NamedGroup::secp384r1
            ]
        );
        let err = kx_groups(
            &settings(TlsVersion::Tls13, &[], &["X25519", "CurveP521"]),
            Generation::Current,
            &super::super::provider(),
        )
        .err()
        .unwrap();
        assert_eq!(err.variable(), CURVES);
        assert!(
            err.to_string().contains("CurveP521 is not offered"),
            "{err}"
        );
    }

    #[test]
    fn cipher_suites_name_tls12_ones_and_refuse_what_rustls_lacks() {
        let provider = super::super::provider();
        let names = |tls: &TlsSettings| -> Vec<String> {
            cipher_suites(tls, &provider)
                .unwrap()
                .iter()
                .map(|s| s.suite().as_str().unwrap().to_owned())
                .collect()
        };
        // TLS 1.3 names change nothing; every TLS 1.3 suite stays.
        let tls = settings(
            TlsVersion::Tls12,
            &[
                "TLS_AES_128_GCM_SHA256",
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            ],
            &[],
        );
        let got = names(&tls);
        assert_eq!(got.iter().filter(|n| n.starts_with("TLS13_")).count(), 3);
        assert_eq!(
            got.iter()
                .filter(|n| !n.starts_with("TLS13_"))
                .collect::<Vec<_>>(),
            ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]
        );

        let cbc = settings(
            TlsVersion::Tls12,
            &["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"],
            &[],
        );
        let err = cipher_suites(&cbc, &provider).err().unwrap();
        assert_eq!(err.variable(), CIPHER_SUITES);

        // Go's HTTP/2 server needs an AES-128-GCM suite once TLS 1.2 is on.
        let no_h2 = settings(
            TlsVersion::Tls12,
            &["TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"],
            &[],
        );
        assert!(cipher_suites(&no_h2, &provider).is_err());
        let tls13_only = settings(
            TlsVersion::Tls13,
            &["TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"],
            &[],
        );
        assert!(cipher_suites(&tls13_only, &provider).is_ok());
    }

    #[test]
    fn a_minimum_above_the_maximum_is_refused() {
        let mut tls = settings(TlsVersion::Tls13, &[], &[]);
        tls.max_version = Some(TlsVersion::Tls12);
        assert_eq!(versions(&tls).err().unwrap().variable(), MIN_VERSION);
        tls.min_version = TlsVersion::Tls12;
        assert_eq!(versions(&tls).unwrap().len(), 1);
    }
}
