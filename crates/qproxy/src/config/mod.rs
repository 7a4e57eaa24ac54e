//! The environment contract: every variable Knative sets on the queue-proxy
//! container, parsed once at start into one typed [`Config`].
//!
//! Rules (the same as Knative's `envconfig` parsing, made stricter only
//! where Knative itself could never produce the value):
//! - a required variable that is not set is an error naming it;
//! - a set variable whose value does not parse (port, integer, boolean,
//!   probe JSON, observability JSON, TLS setting) is an error naming it and
//!   showing the value;
//! - an optional variable that is not set takes its zero value; strings that
//!   are set but empty count as not set;
//! - unknown variables are ignored.
//!
//! Besides Knative's variables, qproxy reads a few of its own, all prefixed
//! `QPROXY_` and all optional, for running outside a pod (tests, the demo):
//! see [`Ports`].

mod probe;
mod tls;

use std::path::PathBuf;
use std::time::Duration;

pub use probe::{GrpcAction, HttpGetAction, HttpHeader, Probe, ProbePort, TcpSocketAction};
pub(crate) use qproxy_core::config::LiveOptions;
pub use qproxy_core::config::{
    ANNOTATION_PREFIXES, ConfigError, Generation, Opt, Options, Revision, Vars, knative_defaults,
};
pub use qproxy_observe::config::{
    Classic, Current, DEFAULT_REQUEST_LOG_TEMPLATE, Level, LevelStyle, LogOutput, LogSampling,
    Logging, MetricsBackend, MetricsConfig, MetricsProtocol, Observability, OtelEnv,
    RequestLogConfig, RuntimeConfig, TimeStyle, TlsFiles, TracingBackend, TracingConfig,
    TracingProtocol,
};
pub use tls::{TlsSettings, TlsVersion};

/// Where Knative mounts the queue-proxy's TLS certificate and key
/// (`queue.CertDirectory`).
pub const KNATIVE_CERT_DIR: &str = "/var/lib/knative/certs";
/// qproxy's own: another directory for the certificate and key, for
/// running outside a pod (Knative sets none).
const CERT_DIR: &str = "QPROXY_CERT_DIR";
/// Where Knative mounts the pod's annotations for the queue-proxy, when
/// `queueproxy.mount-podinfo` lets it (`queue.PodInfoDirectory`).
pub const KNATIVE_PODINFO_DIR: &str = "/etc/podinfo";
/// qproxy's own: another directory for the annotations file, for running
/// outside a pod.
const PODINFO_DIR: &str = "QPROXY_PODINFO_DIR";

/// Where qproxy listens and where the user container is.
///
/// The admin, stats, metrics and profiling ports are fixed in Knative;
/// `QPROXY_ADMIN_PORT`, `QPROXY_STATS_PORT`, `QPROXY_METRICS_PORT` and
/// `QPROXY_PROFILING_PORT` move them for running outside a pod. Port `0`
/// anywhere but `USER_PORT` means "any free port" (the bound address is
/// logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// `QUEUE_SERVING_PORT`: the main proxy port (8012, or 8013 for h2c revisions).
    pub main: u16,
    /// `QUEUE_SERVING_TLS_PORT`: the same handler over TLS (8112).
    pub tls: u16,
    /// `USER_PORT`: the user container, dialled at `127.0.0.1`.
    pub user: u16,
    /// Admin (`/wait-for-drain`): 8022.
    pub admin: u16,
    /// Autoscaler stats (`/metrics`, protobuf): 9090.
    pub stats: u16,
    /// User-facing request metrics (Prometheus): 9091.
    pub metrics: u16,
    /// CPU profiles when profiling is on: 8008.
    pub profiling: u16,
}

/// The three revision timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `REVISION_TIMEOUT_SECONDS`: overall bound of a request.
    pub revision: Duration,
    /// `REVISION_RESPONSE_START_TIMEOUT_SECONDS`: until the first response byte.
    pub response_start: Option<Duration>,
    /// `REVISION_IDLE_TIMEOUT_SECONDS`: longest gap between writes.
    pub idle: Option<Duration>,
}

/// How long a drain lasts; qproxy's own settings (Knative's are fixed).
///
/// `QPROXY_DRAIN_QUIET_SECONDS` (default 30) is the quiet period: the drain
/// completes once that long has passed with no request, and once it has
/// lasted that long, connections still sending are closed after their next
/// answer. `0` completes it at once. `QPROXY_DRAIN_UPGRADED_SECONDS` (default 60) bounds how long, after
/// the listeners close, upgraded connections (WebSockets) may stay open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainTimes {
    /// The quiet period.
    pub quiet: Duration,
    /// The grace period of upgraded connections.
    pub upgraded: Duration,
}

/// How many threads serve requests: qproxy's own setting,
/// `QPROXY_WORKERS` (Knative sets none).
///
/// The default is one: a sidecar shares its pod's cores with the app, and
/// on one thread qproxy spends the least CPU per request (no work stealing,
/// no wake-ups across threads; `benches/RESULTS.md` has the measurements).
/// One thread proxies tens of thousands of small requests a second; an app
/// that needs more sets a number, or `auto` for one per core the process
/// may use (`std::thread::available_parallelism`, which honours a cgroup CPU
/// limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// Everything on the thread that started qproxy.
    One,
    /// A work-stealing pool of this many threads (two or more).
    Pool(usize),
    /// A work-stealing pool of one thread per core the process may use.
    Auto,
}

impl Workers {
    const VAR: &'static str = "QPROXY_WORKERS";

    fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        let Some(v) = vars.non_empty(Self::VAR)? else {
            return Ok(Self::One);
        };
        if v == "auto" {
            return Ok(Self::Auto);
        }
        match v.parse::<usize>() {
            Ok(0) => Err(ConfigError::invalid(Self::VAR, v, "must be at least 1")),
            Ok(1) => Ok(Self::One),
            Ok(n) if n <= 1024 => Ok(Self::Pool(n)),
            Ok(_) => Err(ConfigError::invalid(Self::VAR, v, "is more than 1024")),
            Err(_) => Err(ConfigError::invalid(
                Self::VAR,
                v,
                "not a number of threads or `auto`",
            )),
        }
    }
}

/// Feature switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features {
    /// `ENABLE_HTTP2_AUTO_DETECTION`: HTTP readiness probes try h2c first.
    pub http2_auto_detection: bool,
    /// `ENABLE_HTTP_FULL_DUPLEX`: read the request body while writing the response.
    pub http_full_duplex: bool,
    /// `ENABLE_MULTI_CONTAINER_PROBES`: `SERVING_READINESS_PROBE` is a list.
    pub multi_container_probes: bool,
}

/// Everything qproxy is told by its environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Revision and pod identity.
    pub revision: Revision,
    /// Listening and upstream ports.
    pub ports: Ports,
    /// `CONTAINER_CONCURRENCY`: most requests inside the user container at
    /// once; `0` is unlimited.
    pub container_concurrency: u32,
    /// Revision timeouts.
    pub timeouts: Timeouts,
    /// Drain timing.
    pub drain: DrainTimes,
    /// `SERVING_READINESS_PROBE`: empty when not set.
    pub readiness_probes: Vec<Probe>,
    /// Feature switches.
    pub features: Features,
    /// Threads that serve requests.
    pub workers: Workers,
    /// Log format and level.
    pub logging: Logging,
    /// Metrics, tracing, request log, profiling.
    pub observability: Observability,
    /// TLS listener settings, or why they are invalid: like Knative, qproxy
    /// fails on them only when it serves TLS.
    pub tls: Result<TlsSettings, ConfigError>,
    /// Where the TLS certificate (`tls.crt`) and key (`tls.key`) are
    /// mounted: Knative's `/var/lib/knative/certs`, or `QPROXY_CERT_DIR`.
    /// TLS is served when both files exist at start.
    pub cert_dir: PathBuf,
    /// qproxy's options as the image's environment sets them
    /// (`QPROXY_OPTION_*`), before the revision's annotations.
    pub options: Options,
    /// Where the pod's annotations are mounted: Knative's `/etc/podinfo`,
    /// or `QPROXY_PODINFO_DIR`. The file `annotations` there, if any, is
    /// read at start and again whenever the kubelet updates it.
    pub podinfo_dir: PathBuf,
    /// `HOST_IP`: the node's address.
    pub host_ip: Option<String>,
    /// `SYSTEM_NAMESPACE`: Knative's own namespace.
    pub system_namespace: Option<String>,
    /// `ROOT_CA`: extra CA bundle (PEM) for talking TLS to Knative.
    pub root_ca: Option<String>,
    /// Settings that were accepted but not honoured as given, to be logged
    /// once logging is up.
    pub warnings: Vec<String>,
}

impl Config {
    /// Reads and validates the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(&Vars::from_process())
    }

    /// Reads and validates a given set of variables.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        let revision = Revision::from_vars(vars)?;
        let ports = Ports {
            main: vars.required_port("QUEUE_SERVING_PORT")?,
            tls: vars.required_port("QUEUE_SERVING_TLS_PORT")?,
            user: vars.required_port("USER_PORT")?,
            admin: vars.port_or("QPROXY_ADMIN_PORT", 8022)?,
            stats: vars.port_or("QPROXY_STATS_PORT", 9090)?,
            metrics: vars.port_or("QPROXY_METRICS_PORT", 9091)?,
            profiling: vars.port_or("QPROXY_PROFILING_PORT", 8008)?,
        };
        if ports.user == 0 {
            return Err(ConfigError::invalid("USER_PORT", "0", "must not be 0"));
        }
        let container_concurrency = vars.required_count("CONTAINER_CONCURRENCY")?;
        let timeouts = Timeouts {
            revision: Duration::from_secs(vars.required_count("REVISION_TIMEOUT_SECONDS")?.into()),
            response_start: vars.seconds("REVISION_RESPONSE_START_TIMEOUT_SECONDS")?,
            idle: vars.seconds("REVISION_IDLE_TIMEOUT_SECONDS")?,
        };
        let drain = DrainTimes {
            quiet: vars.seconds_or("QPROXY_DRAIN_QUIET_SECONDS", 30)?,
            upgraded: vars.seconds_or("QPROXY_DRAIN_UPGRADED_SECONDS", 60)?,
        };
        let mut warnings = Vec::new();
        if timeouts.revision.is_zero() {
            warnings.push(
                "REVISION_TIMEOUT_SECONDS is 0: every request times out at once \
                 (as in Knative's queue-proxy)"
                    .to_owned(),
            );
        }
        let features = Features {
            http2_auto_detection: vars.bool("ENABLE_HTTP2_AUTO_DETECTION")?,
            http_full_duplex: vars.bool("ENABLE_HTTP_FULL_DUPLEX")?,
            multi_container_probes: vars.bool("ENABLE_MULTI_CONTAINER_PROBES")?,
        };
        const PROBE: &str = "SERVING_READINESS_PROBE";
        let readiness_probes = match vars.non_empty(PROBE)? {
            None => Vec::new(),
            Some(json) => probe::decode(json, features.multi_container_probes)
                .map_err(|e| ConfigError::invalid(PROBE, json, e.to_string()))?,
        };
        let workers = Workers::from_vars(vars)?;
        let logging = Logging::from_vars(vars, &mut warnings)?;
        let observability = qproxy_observe::config::observability_from_vars(vars, &mut warnings)?;
        let tls = TlsSettings::from_vars(vars, observability.generation());
        let cert_dir = vars
            .non_empty(CERT_DIR)?
            .map_or_else(|| PathBuf::from(KNATIVE_CERT_DIR), PathBuf::from);
        let options = Options::from_vars(vars)?;
        let podinfo_dir = vars
            .non_empty(PODINFO_DIR)?
            .map_or_else(|| PathBuf::from(KNATIVE_PODINFO_DIR), PathBuf::from);
        if let Err(e) = &tls {
            warnings.push(format!("{e}; TLS settings matter only when TLS is served"));
        }
        Ok(Self {
            revision,
            ports,
            container_concurrency,
            timeouts,
            drain,
            readiness_probes,
            features,
            workers,
            logging,
            observability,
            tls,
            cert_dir,
            options,
            podinfo_dir,
            host_ip: vars.non_empty("HOST_IP")?.map(str::to_owned),
            system_namespace: vars.non_empty("SYSTEM_NAMESPACE")?.map(str::to_owned),
            root_ca: vars.non_empty("ROOT_CA")?.map(str::to_owned),
            warnings,
        })
    }

    /// Idle connections kept open to the user container: `CONTAINER_CONCURRENCY`,
    /// or 1000 when unlimited (Knative's choice).
    pub fn upstream_idle_connections(&self) -> usize {
        match self.container_concurrency {
            0 => 1000,
            cc => cc as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Vars {
        knative_defaults(Generation::Classic, 8080)
    }

    #[test]
    fn the_shared_defaults_carry_knative_s_request_log_template() {
        let vars = defaults();
        let template = vars
            .iter()
            .find(|(k, _)| *k == "SERVING_REQUEST_LOG_TEMPLATE");
        assert_eq!(
            template,
            Some(("SERVING_REQUEST_LOG_TEMPLATE", DEFAULT_REQUEST_LOG_TEMPLATE))
        );
    }

    #[test]
    fn current_knative_s_defaults_parse_as_the_current_generation() {
        let c = Config::from_vars(&knative_defaults(Generation::Current, 8080)).unwrap();
        assert_eq!(c.observability.generation(), Generation::Current);
        assert!(
            !c.observability.prometheus_metrics(),
            "off in a stock install"
        );
        assert_eq!(c.ports.user, 8080);
    }

    #[test]
    fn knative_defaults_parse() {
        let c = Config::from_vars(&defaults()).unwrap();
        assert_eq!(c.revision.namespace, "default");
        assert_eq!(c.revision.name, "hello-00001");
        assert_eq!(c.revision.service, "hello");
        assert_eq!(c.ports.main, 8012);
        assert_eq!(c.ports.tls, 8112);
        assert_eq!(c.ports.user, 8080);
        assert_eq!(
            (
                c.ports.admin,
                c.ports.stats,
                c.ports.metrics,
                c.ports.profiling
            ),
            (8022, 9090, 9091, 8008)
        );
        assert_eq!(c.container_concurrency, 0);
        assert_eq!(c.upstream_idle_connections(), 1000);
        assert_eq!(c.timeouts.revision, Duration::from_secs(300));
        assert_eq!(c.timeouts.response_start, None);
        assert_eq!(c.timeouts.idle, None);
        assert_eq!(
            c.drain,
            DrainTimes {
                quiet: Duration::from_secs(30),
                upgraded: Duration::from_secs(60),
            }
        );
        assert!(c.readiness_probes.is_empty());
        assert_eq!(c.features, Features::default());
        assert_eq!(c.observability.generation(), Generation::Classic);
        assert!(c.observability.prometheus_metrics());
        assert_eq!(c.logging.level, Level::Info);
        assert_eq!(c.system_namespace.as_deref(), Some("knative-serving"));
        assert_eq!(c.root_ca, None);
        assert_eq!(c.options, Options::NONE);
        assert_eq!(c.podinfo_dir, PathBuf::from("/etc/podinfo"));
        assert_eq!(c.tls.as_ref().unwrap().min_version, TlsVersion::Tls13);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn every_required_variable_is_named_when_missing() {
        for name in [
            "SERVING_NAMESPACE",
            "SERVING_CONFIGURATION",
            "SERVING_REVISION",
            "SERVING_POD",
            "SERVING_POD_IP",
            "QUEUE_SERVING_PORT",
            "QUEUE_SERVING_TLS_PORT",
            "USER_PORT",
            "CONTAINER_CONCURRENCY",
            "REVISION_TIMEOUT_SECONDS",
            "SERVING_LOGGING_CONFIG",
            "SERVING_LOGGING_LEVEL",
        ] {
            let mut vars = defaults();
            vars.remove(name);
            let err = Config::from_vars(&vars).unwrap_err();
            assert_eq!(err, ConfigError::Missing { name }, "{name}");
            assert_eq!(err.variable(), name);
        }
    }

    #[test]
    fn optional_variables_may_be_absent() {
        let mut vars = Vars::default();
        for name in [
            "SERVING_NAMESPACE",
            "SERVING_CONFIGURATION",
            "SERVING_REVISION",
            "SERVING_POD",
            "SERVING_POD_IP",
            "SERVING_LOGGING_CONFIG",
            "SERVING_LOGGING_LEVEL",
        ] {
            vars.set(name, "");
        }
        vars.set("QUEUE_SERVING_PORT", "8012");
        vars.set("QUEUE_SERVING_TLS_PORT", "8112");
        vars.set("USER_PORT", "8080");
        vars.set("CONTAINER_CONCURRENCY", "10");
        vars.set("REVISION_TIMEOUT_SECONDS", "300");
        let c = Config::from_vars(&vars).unwrap();
        assert_eq!(c.revision.service, "");
        assert_eq!(c.container_concurrency, 10);
        assert_eq!(c.upstream_idle_connections(), 10);
        assert_eq!(c.host_ip, None);
    }

    #[test]
    fn bad_values_are_named() {
        for (name, value) in [
            ("QUEUE_SERVING_PORT", "eighty"),
            ("QUEUE_SERVING_TLS_PORT", "100000"),
            ("USER_PORT", ""),
            ("USER_PORT", "0"),
            ("CONTAINER_CONCURRENCY", "-1"),
            ("CONTAINER_CONCURRENCY", "1.5"),
            ("REVISION_TIMEOUT_SECONDS", "5m"),
            ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", ""),
            ("REVISION_IDLE_TIMEOUT_SECONDS", "-3"),
            ("ENABLE_HTTP2_AUTO_DETECTION", "yes"),
            ("ENABLE_HTTP_FULL_DUPLEX", "on"),
            ("ENABLE_MULTI_CONTAINER_PROBES", "2"),
            ("SERVING_READINESS_PROBE", "{\"httpGet\":"),
            ("SERVING_LOGGING_LEVEL", "chatty"),
            (
                "OBSERVABILITY_CONFIG",
                "{\"metrics\":{\"protocol\":\"smtp\"}}",
            ),
            ("QPROXY_ADMIN_PORT", "x"),
            ("QPROXY_STATS_PORT", "-9090"),
            ("QPROXY_METRICS_PORT", ""),
            ("QPROXY_PROFILING_PORT", "70000"),
            ("QPROXY_DRAIN_QUIET_SECONDS", "1s"),
            ("QPROXY_DRAIN_UPGRADED_SECONDS", "-1"),
            ("QPROXY_WORKERS", "0"),
            ("QPROXY_WORKERS", "two"),
            ("QPROXY_WORKERS", "1025"),
        ] {
            let mut vars = defaults();
            vars.set(name, value);
            let err = Config::from_vars(&vars).unwrap_err();
            assert_eq!(err.variable(), name, "{name}={value}: {err}");
            assert!(
                err.to_string()
                    .starts_with(&format!("{name}={value:?} is invalid: ")),
                "{err}"
            );
        }
    }

    #[test]
    fn workers_default_to_one_thread() {
        let mut vars = defaults();
        assert_eq!(Config::from_vars(&vars).unwrap().workers, Workers::One);
        for (value, workers) in [
            ("", Workers::One),
            ("1", Workers::One),
            ("4", Workers::Pool(4)),
            ("auto", Workers::Auto),
        ] {
            vars.set("QPROXY_WORKERS", value);
            assert_eq!(
                Config::from_vars(&vars).unwrap().workers,
                workers,
                "{value}"
            );
        }
    }

    #[test]
    fn bad_tls_settings_wait_until_tls_is_served() {
        let mut vars = knative_defaults(Generation::Current, 8080);
        vars.set("QUEUE_PROXY_TLS_MAX_VERSION", "2.0");
        let c = Config::from_vars(&vars).unwrap();
        let err = c.tls.unwrap_err();
        assert_eq!(err.variable(), "QUEUE_PROXY_TLS_MAX_VERSION");
        assert_eq!(c.warnings.len(), 1);
        assert!(c.warnings[0].starts_with(r#"QUEUE_PROXY_TLS_MAX_VERSION="2.0" is invalid"#));

        // Classic Knative has no such variables: they are not read.
        let mut vars = defaults();
        vars.set("QUEUE_PROXY_TLS_MAX_VERSION", "2.0");
        let c = Config::from_vars(&vars).unwrap();
        assert_eq!(c.tls.unwrap(), TlsSettings::classic());
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn unknown_variables_are_ignored() {
        let mut vars = defaults();
        vars.set("SOMETHING_KNATIVE_ADDS_LATER", "{{not json");
        vars.set("KUBERNETES_SERVICE_HOST", "10.0.0.1");
        assert!(Config::from_vars(&vars).is_ok());
    }

    #[test]
    fn readiness_probe_single_and_multi() {
        let mut vars = defaults();
        vars.set(
            "SERVING_READINESS_PROBE",
            r#"{"tcpSocket":{"port":8080,"host":"127.0.0.1"},"successThreshold":1}"#,
        );
        let c = Config::from_vars(&vars).unwrap();
        assert_eq!(c.readiness_probes.len(), 1);

        vars.set("ENABLE_MULTI_CONTAINER_PROBES", "true");
        let err = Config::from_vars(&vars).unwrap_err();
        assert_eq!(err.variable(), "SERVING_READINESS_PROBE");

        vars.set(
            "SERVING_READINESS_PROBE",
            r#"[{"tcpSocket":{"port":8080}},{"httpGet":{"port":8081,"path":"/ready"}}]"#,
        );
        let c = Config::from_vars(&vars).unwrap();
        assert_eq!(c.readiness_probes.len(), 2);
        assert!(c.features.multi_container_probes);
    }

    #[test]
    fn timeouts_and_ports_overrides() {
        let mut vars = defaults();
        vars.set("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "10");
        vars.set("REVISION_IDLE_TIMEOUT_SECONDS", "20");
        vars.set("QPROXY_ADMIN_PORT", "0");
        vars.set("QPROXY_STATS_PORT", "19090");
        let c = Config::from_vars(&vars).unwrap();
        assert_eq!(c.timeouts.response_start, Some(Duration::from_secs(10)));
        assert_eq!(c.timeouts.idle, Some(Duration::from_secs(20)));
        assert_eq!((c.ports.admin, c.ports.stats), (0, 19090));
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn zero_revision_timeout_is_kept_with_a_warning() {
        let mut vars = defaults();
        vars.set("REVISION_TIMEOUT_SECONDS", "0");
        let c = Config::from_vars(&vars).unwrap();
        assert_eq!(c.timeouts.revision, Duration::ZERO);
        assert!(c.warnings[0].starts_with("REVISION_TIMEOUT_SECONDS is 0"));
    }

    #[test]
    fn long_values_are_shortened_in_errors() {
        let mut vars = defaults();
        let long = format!("{{{}", "x".repeat(1000));
        vars.set("SERVING_READINESS_PROBE", long);
        let ConfigError::Invalid { value, .. } = Config::from_vars(&vars).unwrap_err() else {
            panic!("expected invalid")
        };
        assert_eq!(value.chars().count(), 201);
        assert!(value.ends_with('…'));
    }
}
