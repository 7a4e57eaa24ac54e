//! The parts of the environment contract every layer reads: who this
//! queue-proxy serves ([`Revision`]), which generation of Knative started
//! it ([`Generation`]), qproxy's own options ([`Options`], in force as
//! [`LiveOptions`]), and the variables themselves ([`Vars`]) with the one
//! error a bad one gives ([`ConfigError`]).
//!
//! The whole contract is parsed in the `qproxy` crate's `config` module,
//! which re-exports these; the observability settings are parsed in
//! `qproxy-observe`.

mod error;
pub mod json;
mod options;
mod vars;

use std::collections::HashMap;

pub use error::ConfigError;
pub use options::{ANNOTATION_PREFIXES, LiveOptions, Opt, Options};
pub use vars::Vars;

/// Who this queue-proxy serves: the revision and pod it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    /// `SERVING_NAMESPACE`.
    pub namespace: String,
    /// `SERVING_SERVICE` (empty for a bare Configuration).
    pub service: String,
    /// `SERVING_CONFIGURATION`.
    pub configuration: String,
    /// `SERVING_REVISION`.
    pub name: String,
    /// `SERVING_POD`.
    pub pod: String,
    /// `SERVING_POD_IP`.
    pub pod_ip: String,
}

impl Revision {
    /// Reads the revision's and the pod's names from `vars`: all but
    /// `SERVING_SERVICE` are required.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Self {
            namespace: vars.required("SERVING_NAMESPACE")?.to_owned(),
            service: vars.raw("SERVING_SERVICE")?.unwrap_or_default().to_owned(),
            configuration: vars.required("SERVING_CONFIGURATION")?.to_owned(),
            name: vars.required("SERVING_REVISION")?.to_owned(),
            pod: vars.required("SERVING_POD")?.to_owned(),
            pod_ip: vars.required("SERVING_POD_IP")?.to_owned(),
        })
    }
}

/// Which Knative generation started us, as shown by the environment:
/// current when `OBSERVABILITY_CONFIG` is set, classic otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    /// Serving v0.42 (Knative 1.15) and its neighbours: separate variables,
    /// OpenCensus-era metric names.
    Classic,
    /// Serving with `OBSERVABILITY_CONFIG`: OpenTelemetry.
    Current,
}

/// Knative's default environment, shared with the Go and Python tools
/// (`crates/core/knative-env.json`).
const KNATIVE_ENV: &str = include_str!("../../knative-env.json");

/// The variables a Knative reconciler of `generation` sets, with the
/// values of a default install and the app on `user_port`; for tests and
/// the demo.
pub fn knative_defaults(generation: Generation, user_port: u16) -> Vars {
    #[derive(serde::Deserialize)]
    struct File {
        common: HashMap<String, String>,
        classic: HashMap<String, String>,
        current: HashMap<String, String>,
    }
    // The file is part of the build, and a unit test reads it.
    let file: File = serde_json::from_str(KNATIVE_ENV).expect("knative-env.json is a valid file");
    let own = match generation {
        Generation::Classic => file.classic,
        Generation::Current => file.current,
    };
    let mut vars = Vars::from_pairs(file.common.into_iter().chain(own));
    vars.set("USER_PORT", user_port.to_string());
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_generations_defaults_name_a_revision() {
        for generation in [Generation::Classic, Generation::Current] {
            let revision = Revision::from_vars(&knative_defaults(generation, 8080)).unwrap();
            assert_eq!(revision.namespace, "default");
            assert_eq!(revision.name, "hello-00001");
        }
    }
}
