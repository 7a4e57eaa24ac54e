//! The user container's readiness probe, as Knative hands it over.
//!
//! Knative copies the user container's `readinessProbe` (a Kubernetes
//! `corev1.Probe`), fills in host `127.0.0.1` and the port, and passes it as
//! JSON in `SERVING_READINESS_PROBE`: one object, or an array of them when
//! `ENABLE_MULTI_CONTAINER_PROBES=true`. These types mirror the fields of
//! that JSON that matter to the queue-proxy; unknown fields are ignored, as
//! Go's `encoding/json` ignores them.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// One Kubernetes readiness probe.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Probe {
    /// HTTP GET check.
    pub http_get: Option<HttpGetAction>,
    /// TCP connect check.
    pub tcp_socket: Option<TcpSocketAction>,
    /// gRPC health check (`grpc.health.v1.Health/Check`).
    pub grpc: Option<GrpcAction>,
    /// `exec` probes cannot run from the queue-proxy; Knative keeps them on
    /// the user container. Recorded only so that such a probe is recognised.
    pub exec: Option<serde_json::Value>,
    /// Seconds after the container starts before the probe is first run.
    pub initial_delay_seconds: i32,
    /// Seconds after which one try times out.
    pub timeout_seconds: i32,
    /// How often to probe; `0` makes the queue-proxy probe aggressively.
    pub period_seconds: i32,
    /// Consecutive passes needed to count as ready.
    pub success_threshold: i32,
    /// Consecutive failures needed to count as not ready.
    pub failure_threshold: i32,
}

/// `httpGet` of a probe.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpGetAction {
    /// Request path.
    pub path: String,
    /// Target port.
    pub port: ProbePort,
    /// Target host; Knative sets `127.0.0.1`.
    pub host: String,
    /// `HTTP` or `HTTPS`; empty means `HTTP`.
    pub scheme: String,
    /// Extra request headers.
    pub http_headers: Vec<HttpHeader>,
}

/// A custom header of an HTTP probe.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default)]
pub struct HttpHeader {
    /// Header name.
    pub name: String,
    /// Header value.
    pub value: String,
}

/// `tcpSocket` of a probe.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default)]
pub struct TcpSocketAction {
    /// Target port.
    pub port: ProbePort,
    /// Target host; Knative sets `127.0.0.1`.
    pub host: String,
}

/// `grpc` of a probe.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default)]
pub struct GrpcAction {
    /// Target port.
    pub port: i32,
    /// Service name sent in the health check request.
    pub service: Option<String>,
}

/// A probe port: Kubernetes allows a number or a numeric string here (a
/// named port would have been resolved by Knative before it reaches us).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProbePort(pub u16);

impl<'de> Deserialize<'de> for ProbePort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PortVisitor;

        impl Visitor<'_> for PortVisitor {
            type Value = ProbePort;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ProbePort, E> {
                u16::try_from(v)
                    .map(ProbePort)
                    .map_err(|_| E::custom(format!("port {v} is out of range")))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ProbePort, E> {
                u16::try_from(v)
                    .map(ProbePort)
                    .map_err(|_| E::custom(format!("port {v} is out of range")))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<ProbePort, E> {
                v.parse::<u16>()
                    .map(ProbePort)
                    .map_err(|_| E::custom(format!("port {v:?} is not a port number")))
            }
        }

        d.deserialize_any(PortVisitor)
    }
}

/// Decodes `SERVING_READINESS_PROBE`: one probe, or a list of them when
/// multi-container probing is on (`ENABLE_MULTI_CONTAINER_PROBES`).
pub(crate) fn decode(json: &str, multi_container: bool) -> Result<Vec<Probe>, serde_json::Error> {
    if multi_container {
        qproxy_core::config::json::from_json_objects(json)
    } else {
        qproxy_core::config::json::from_json_object(json).map(|p| vec![p])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape Knative generates for a user container's HTTP readiness probe
    /// (host, port and scheme filled in by `applyReadinessProbeDefaults`).
    const KNATIVE_HTTP: &str = r#"{"httpGet":{"path":"/healthz","port":8080,"host":"127.0.0.1","scheme":"HTTP","httpHeaders":[{"name":"X-Probe","value":"ready"}]},"timeoutSeconds":1,"periodSeconds":0,"successThreshold":1,"failureThreshold":3}"#;

    #[test]
    fn decodes_knative_http_probe() {
        let probes = decode(KNATIVE_HTTP, false).unwrap();
        assert_eq!(probes.len(), 1);
        let p = &probes[0];
        let http = p.http_get.as_ref().unwrap();
        assert_eq!(http.path, "/healthz");
        assert_eq!(http.port, ProbePort(8080));
        assert_eq!(http.host, "127.0.0.1");
        assert_eq!(http.http_headers[0].name, "X-Probe");
        assert_eq!(p.timeout_seconds, 1);
        assert_eq!(p.period_seconds, 0);
        assert_eq!(p.success_threshold, 1);
    }

    #[test]
    fn decodes_tcp_and_grpc_probes() {
        let tcp = decode(r#"{"tcpSocket":{"port":"8080","host":"127.0.0.1"}}"#, false).unwrap();
        assert_eq!(tcp[0].tcp_socket.as_ref().unwrap().port, ProbePort(8080));
        let grpc = decode(r#"{"grpc":{"port":9000,"service":"svc"}}"#, false).unwrap();
        let g = grpc[0].grpc.as_ref().unwrap();
        assert_eq!((g.port, g.service.as_deref()), (9000, Some("svc")));
    }

    #[test]
    fn decodes_a_list_only_in_multi_container_mode() {
        let list = r#"[{"tcpSocket":{"port":8080}},{"httpGet":{"port":8081,"path":"/"}}]"#;
        assert_eq!(decode(list, true).unwrap().len(), 2);
        assert!(decode(list, false).is_err());
        assert!(decode(KNATIVE_HTTP, true).is_err());
    }

    #[test]
    fn ignores_unknown_fields_and_rejects_wrong_types() {
        let p = decode(
            r#"{"tcpSocket":{"port":1},"someFutureField":{"x":1}}"#,
            false,
        )
        .unwrap();
        assert!(p[0].tcp_socket.is_some());
        assert!(decode(r#"{"timeoutSeconds":"one"}"#, false).is_err());
        assert!(decode(r#"{"tcpSocket":{"port":"http"}}"#, false).is_err());
        assert!(decode(r#"{"tcpSocket":{"port":70000}}"#, false).is_err());
        assert!(decode("{", false).is_err());
        assert!(decode("null", false).is_err());
        assert!(decode("[[]]", true).is_err());
    }
}
