//! The OpenTelemetry environment variables current Knative's setup honours
//! (see [`OtelEnv`]).

use std::path::PathBuf;

use qproxy_core::config::ConfigError;
use qproxy_core::config::Vars;

/// The OpenTelemetry environment variables current Knative's setup honours.
///
/// Current Knative's queue-proxy builds its exporters with
/// knative.dev/pkg's `observability` packages and the Go SDK, and each
/// reads some `OTEL_*` variables: knative.dev/pkg itself reads the ones
/// read here (an endpoint variable makes the exporter take its endpoint
/// from the environment, not from `OBSERVABILITY_CONFIG`; a sampler or an
/// export interval variable replaces the configuration's; the service
/// name comes first), and the Go exporters read their TLS files. The
/// variables both SDKs read themselves the same way (headers, timeout,
/// compression, `OTEL_RESOURCE_ATTRIBUTES`, the batch span processor's)
/// are left to qproxy's SDK, which reads them as Go's does.
///
/// They are read only under current Knative: classic Knative's exporters
/// (OpenCensus) read none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OtelEnv {
    /// `OTEL_SERVICE_NAME`: `service.name`, before Knative's own choice.
    pub service_name: Option<String>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: the collector of every signal, in
    /// place of `OBSERVABILITY_CONFIG`'s endpoints (over HTTP, the
    /// signal's path is added).
    pub endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: the traces' collector, as is.
    pub traces_endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`: the metrics' collector, as is.
    pub metrics_endpoint: Option<String>,
    /// `OTEL_TRACES_SAMPLER` is set: the SDK's sampler comes from it.
    pub traces_sampler_from_env: bool,
    /// `OTEL_TRACES_SAMPLER_ARG`, which Knative reads as a sampling rate
    /// (see `observe::traces`); checked when tracing is on.
    pub traces_sampler_arg: Option<String>,
    /// `OTEL_METRIC_EXPORT_INTERVAL` is set: the reader's interval comes
    /// from it.
    pub metric_interval_from_env: bool,
    /// The trace exporter's TLS files.
    pub traces_tls: TlsFiles,
    /// The metric exporter's TLS files.
    pub metrics_tls: TlsFiles,
}

/// The files an OTLP exporter's TLS takes from the environment: the
/// signal's own variable (`OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`), else
/// the generic one (`OTEL_EXPORTER_OTLP_CERTIFICATE`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// `…_CERTIFICATE`: the CA (PEM) the collector's certificate is
    /// verified with, instead of the public roots.
    pub certificate: Option<PathBuf>,
    /// `…_CLIENT_CERTIFICATE`: qproxy's certificate (PEM), for mutual TLS.
    pub client_certificate: Option<PathBuf>,
    /// `…_CLIENT_KEY`: its private key (PEM).
    pub client_key: Option<PathBuf>,
}

impl OtelEnv {
    /// Reads the variables from `vars`.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        let set = |name: &'static str| -> Result<bool, ConfigError> {
            Ok(vars.non_empty(name)?.is_some())
        };
        Ok(Self {
            service_name: owned(vars.non_empty("OTEL_SERVICE_NAME")?),
            endpoint: owned(vars.non_empty("OTEL_EXPORTER_OTLP_ENDPOINT")?),
            traces_endpoint: owned(vars.non_empty("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?),
            metrics_endpoint: owned(vars.non_empty("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")?),
            traces_sampler_from_env: set("OTEL_TRACES_SAMPLER")?,
            traces_sampler_arg: owned(vars.non_empty("OTEL_TRACES_SAMPLER_ARG")?),
            metric_interval_from_env: set("OTEL_METRIC_EXPORT_INTERVAL")?,
            traces_tls: TlsFiles::from_vars(
                vars,
                [
                    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                ],
            )?,
            metrics_tls: TlsFiles::from_vars(
                vars,
                [
                    "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
                    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
                    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
                ],
            )?,
        })
    }

    /// The sampling rate `OTEL_TRACES_SAMPLER_ARG` gives, if any; a value
    /// that is not a number is refused, as Knative's tracer provider
    /// refuses it.
    pub fn sampler_arg(&self) -> Result<Option<f64>, ConfigError> {
        const NAME: &str = "OTEL_TRACES_SAMPLER_ARG";
        self.traces_sampler_arg
            .as_deref()
            .map(|v| {
                v.trim()
                    .parse::<f64>()
                    .map_err(|e| ConfigError::invalid(NAME, v, e.to_string()))
            })
            .transpose()
    }
}

fn owned(v: Option<&str>) -> Option<String> {
    v.map(str::to_owned)
}

impl TlsFiles {
    /// The signal's own variables (certificate, client certificate, client
    /// key), each else its generic counterpart.
    fn from_vars(vars: &Vars, names: [&'static str; 3]) -> Result<Self, ConfigError> {
        let generic = [
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        ];
        let mut files = [None, None, None];
        for ((file, own), generic) in files.iter_mut().zip(names).zip(generic) {
            let value = match vars.non_empty(own)? {
                Some(v) => Some(v),
                None => vars.non_empty(generic)?,
            };
            *file = value.map(PathBuf::from);
        }
        let [certificate, client_certificate, client_key] = files;
        Ok(Self {
            certificate,
            client_certificate,
            client_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn otel(pairs: &[(&str, &str)]) -> OtelEnv {
        OtelEnv::from_vars(&Vars::from_pairs(pairs.iter().copied())).unwrap()
    }

    #[test]
    fn reads_what_knative_s_setup_reads() {
        assert_eq!(otel(&[]), OtelEnv::default());
        let env = otel(&[
            ("OTEL_SERVICE_NAME", "svc"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://c:4318/v1/traces",
            ),
            ("OTEL_TRACES_SAMPLER", "always_on"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
        ]);
        assert_eq!(env.service_name.as_deref(), Some("svc"));
        assert_eq!(
            env.traces_endpoint.as_deref(),
            Some("http://c:4318/v1/traces")
        );
        assert_eq!(
            (env.endpoint.as_ref(), env.metrics_endpoint.as_ref()),
            (None, None)
        );
        assert!(env.traces_sampler_from_env && env.metric_interval_from_env);
    }

    #[test]
    fn a_signal_s_own_tls_file_wins_over_the_generic_one() {
        let env = otel(&[
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces-ca.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/key.pem"),
        ]);
        assert_eq!(
            env.traces_tls.certificate,
            Some(PathBuf::from("/traces-ca.pem"))
        );
        assert_eq!(env.metrics_tls.certificate, Some(PathBuf::from("/ca.pem")));
        assert_eq!(env.metrics_tls.client_key, Some(PathBuf::from("/key.pem")));
        assert_eq!(env.traces_tls.client_certificate, None);
    }

    #[test]
    fn a_sampler_argument_must_be_a_number() {
        assert_eq!(otel(&[]).sampler_arg(), Ok(None));
        assert_eq!(
            otel(&[("OTEL_TRACES_SAMPLER_ARG", "0.25")]).sampler_arg(),
            Ok(Some(0.25))
        );
        let err = otel(&[("OTEL_TRACES_SAMPLER_ARG", "half")])
            .sampler_arg()
            .unwrap_err();
        assert_eq!(err.variable(), "OTEL_TRACES_SAMPLER_ARG");
    }
}
