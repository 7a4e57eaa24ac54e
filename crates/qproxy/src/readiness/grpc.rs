//! `grpc` readiness probes: the gRPC health checking protocol.
//!
//! `grpc.health.v1.Health/Check` for the probe's service name (empty when
//! unset) over h2c to `127.0.0.1:port`, with `User-Agent: kube-probe//`;
//! `SERVING` passes, anything else fails.

use std::time::Duration;

use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::attempt::PROBE_USER_AGENT;
use super::error::{GrpcProbeError, ProbeError};
use crate::config::GrpcAction;

/// Runs one try of `grpc`, each step bounded by `timeout`.
pub(super) async fn probe(grpc: &GrpcAction, timeout: Duration) -> Result<(), ProbeError> {
    let port = u16::try_from(grpc.port).map_err(|_| GrpcProbeError::Port(grpc.port))?;
    let addr = format!("127.0.0.1:{port}");
    let connect = |source| GrpcProbeError::Connect {
        addr: addr.clone(),
        source,
    };
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(connect)?
        .user_agent(PROBE_USER_AGENT)
        .map_err(connect)?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = endpoint.connect().await.map_err(connect)?;
    let request = HealthCheckRequest {
        service: grpc.service.clone().unwrap_or_default(),
    };
    let response =
        HealthClient::new(channel)
            .check(request)
            .await
            .map_err(|status| match status.code() {
                tonic::Code::Unimplemented => GrpcProbeError::Unimplemented(status),
                _ => GrpcProbeError::Rpc(status),
            })?;
    let status = response.into_inner().status();
    if status == ServingStatus::Serving {
        Ok(())
    } else {
        Err(GrpcProbeError::Unhealthy(status.as_str_name()).into())
    }
}
