//! Settings of the TLS listener (`QUEUE_SERVING_TLS_PORT`).
//!
//! Current Knative sets the `QUEUE_PROXY_TLS_*` variables (knative.dev/pkg
//! `network/tls.DefaultConfigFromEnv("QUEUE_PROXY_")`, from
//! `config-deployment`'s `queue-sidecar-tls-*`). Names are Go's: cipher
//! suites as `crypto/tls.CipherSuiteName` spells them, curves as Go
//! constant names or standard names. Empty means default. Knative reads
//! these only when it serves TLS (its certificates are mounted), so a bad
//! value is kept as an error for that moment rather than stopping a start
//! that may never need it.
//!
//! Classic Knative has none of these: its queue-proxy serves TLS 1.3 only,
//! with Go's default suites and curves, whatever the environment says.

use qproxy_core::config::{ConfigError, Generation, Vars};

/// A TLS protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

/// TLS listener settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// Lowest version accepted (Knative's default: 1.3).
    pub min_version: TlsVersion,
    /// Highest version accepted; `None` is the library's highest.
    pub max_version: Option<TlsVersion>,
    /// Cipher suites by Go name; empty is the library default.
    pub cipher_suites: Vec<String>,
    /// Key exchange groups by Go name; empty is the library default.
    pub curve_preferences: Vec<String>,
}

/// The suites Go's `crypto/tls.CipherSuites()` lists, i.e. the names
/// Knative accepts.
const CIPHER_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
];

/// The curve names Knative accepts.
const CURVES: &[&str] = &[
    "CurveP256",
    "CurveP384",
    "CurveP521",
    "X25519",
    "X25519MLKEM768",
    "P-256",
    "P-384",
    "P-521",
];

impl TlsSettings {
    /// Classic Knative's fixed settings: TLS 1.3 only, Go's defaults.
    pub fn classic() -> Self {
        Self {
            min_version: TlsVersion::Tls13,
            max_version: None,
            cipher_suites: Vec::new(),
            curve_preferences: Vec::new(),
        }
    }

    pub(crate) fn from_vars(vars: &Vars, generation: Generation) -> Result<Self, ConfigError> {
        if generation == Generation::Classic {
            return Ok(Self::classic());
        }
        Ok(Self {
            min_version: version(vars, "QUEUE_PROXY_TLS_MIN_VERSION")?.unwrap_or(TlsVersion::Tls13),
            max_version: version(vars, "QUEUE_PROXY_TLS_MAX_VERSION")?,
            cipher_suites: names(
                vars,
                "QUEUE_PROXY_TLS_CIPHER_SUITES",
                CIPHER_SUITES,
                "cipher suite",
            )?,
            curve_preferences: names(vars, "QUEUE_PROXY_TLS_CURVE_PREFERENCES", CURVES, "curve")?,
        })
    }
}

fn version(vars: &Vars, name: &'static str) -> Result<Option<TlsVersion>, ConfigError> {
    match vars.non_empty(name)? {
        None => Ok(None),
        Some("1.2") => Ok(Some(TlsVersion::Tls12)),
        Some("1.3") => Ok(Some(TlsVersion::Tls13)),
        Some(v) => Err(ConfigError::invalid(name, v, "must be 1.2 or 1.3")),
    }
}

/// A comma-separated list of known names; blanks between commas are skipped.
fn names(
    vars: &Vars,
    name: &'static str,
    known: &[&str],
    what: &str,
) -> Result<Vec<String>, ConfigError> {
    let Some(v) = vars.non_empty(name)? else {
        return Ok(Vec::new());
    };
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            if known.contains(&s) {
                Ok(s.to_owned())
            } else {
                Err(ConfigError::invalid(
                    name,
                    v,
                    format!("unknown {what} {s:?}"),
                ))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(pairs: &[(&str, &str)]) -> Result<TlsSettings, ConfigError> {
        TlsSettings::from_vars(
            &Vars::from_pairs(pairs.iter().copied()),
            Generation::Current,
        )
    }

    #[test]
    fn classic_knative_has_fixed_settings() {
        let vars = Vars::from_pairs([
            ("QUEUE_PROXY_TLS_MIN_VERSION", "1.2"),
            ("QUEUE_PROXY_TLS_CIPHER_SUITES", "nonsense"),
        ]);
        assert_eq!(
            TlsSettings::from_vars(&vars, Generation::Classic).unwrap(),
            TlsSettings::classic()
        );
    }

    #[test]
    fn defaults_to_tls13_only() {
        let t = tls(&[("QUEUE_PROXY_TLS_MIN_VERSION", "")]).unwrap();
        assert_eq!(t.min_version, TlsVersion::Tls13);
        assert_eq!(t.max_version, None);
        assert!(t.cipher_suites.is_empty());
        assert!(t.curve_preferences.is_empty());
    }

    #[test]
    fn parses_versions_and_lists() {
        let t = tls(&[
            ("QUEUE_PROXY_TLS_MIN_VERSION", "1.2"),
            ("QUEUE_PROXY_TLS_MAX_VERSION", "1.3"),
            (
                "QUEUE_PROXY_TLS_CIPHER_SUITES",
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256,",
            ),
            ("QUEUE_PROXY_TLS_CURVE_PREFERENCES", "X25519,P-256"),
        ])
        .unwrap();
        assert_eq!(t.min_version, TlsVersion::Tls12);
        assert_eq!(t.max_version, Some(TlsVersion::Tls13));
        assert_eq!(
            t.cipher_suites,
            [
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_AES_128_GCM_SHA256"
            ]
        );
        assert_eq!(t.curve_preferences, ["X25519", "P-256"]);
    }

    #[test]
    fn rejects_unknown_values() {
        let err = tls(&[("QUEUE_PROXY_TLS_MIN_VERSION", "1.1")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"QUEUE_PROXY_TLS_MIN_VERSION="1.1" is invalid: must be 1.2 or 1.3"#
        );
        let err =
            tls(&[("QUEUE_PROXY_TLS_CIPHER_SUITES", "TLS_RSA_WITH_RC4_128_SHA")]).unwrap_err();
        assert!(err.to_string().contains("unknown cipher suite"));
        assert!(tls(&[("QUEUE_PROXY_TLS_CURVE_PREFERENCES", "brainpool")]).is_err());
    }
}
