//! Why one try of a readiness probe failed, whatever its kind: one
//! module for the errors, which nest (a failed protocol detection is an
//! HTTP error holding the try's error).

use std::time::Duration;

/// Go's client gives up after this many redirects.
pub(crate) const MAX_REDIRECTS: usize = 10;

/// Why one try of a probe failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    /// The try did not finish in time.
    #[error("probe timed out after {0:?}")]
    Timeout(Duration),
    /// A connection could not be made.
    #[error("dial {addr}: {source}")]
    Connect {
        /// Where.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error(transparent)]
    Http(#[from] HttpProbeError),
    /// The gRPC health check failed.
    #[error(transparent)]
    Grpc(#[from] GrpcProbeError),
    /// An aggressive probe never reached its success threshold.
    #[error("aggressive probe error (failed {failures} times): {last}")]
    Aggressive {
        /// Failed tries.
        failures: u32,
        /// The last failure.
        last: Box<ProbeError>,
    },
    /// An aggressive probe timed out between tries that passed.
    #[error("timed out waiting for the condition")]
    NotEnoughPasses,
    /// The probe has no kind qproxy can run.
    #[error("{0}")]
    Unsupported(&'static str),
}

/// Why an HTTP probe failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpProbeError {
    /// The app answered, but not ready.
    #[error("HTTP probe did not respond Ready, got status code: {0}")]
    NotReady(u16),
    /// The probe's URL does not parse.
    #[error("error constructing probe url: {0}")]
    Url(#[from] url::ParseError),
    /// A scheme other than `http`.
    #[error("unsupported probe scheme {0:?}")]
    Scheme(String),
    /// A custom header that cannot be sent.
    #[error("invalid probe header {0:?}")]
    Header(String),
    /// A redirect's `Location` does not parse.
    #[error("failed to parse Location header {location:?}: {source}")]
    Location {
        /// The header.
        location: String,
        /// Why.
        #[source]
        source: url::ParseError,
    },
    /// Too many redirects.
    #[error("stopped after {MAX_REDIRECTS} redirects")]
    Redirects,
    /// The HTTP exchange failed.
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    /// HTTP/2 detection failed (classic's wording).
    #[error("failed to run HTTP2 upgrade probe with error: {0}")]
    Upgrade(Box<ProbeError>),
    /// Protocol detection failed (current's wording).
    #[error("failed to run HTTP protocol probe with error: {0}")]
    Detection(Box<ProbeError>),
}

/// Why a gRPC probe failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GrpcProbeError {
    /// The port is not one.
    #[error("invalid gRPC probe port {0}")]
    Port(i32),
    /// No connection could be made.
    #[error("failed to connect service at {addr:?}: {source}")]
    Connect {
        /// Where.
        addr: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// The app does not implement the health service.
    #[error("this server does not implement the grpc health protocol (grpc.health.v1.Health): {0}")]
    Unimplemented(tonic::Status),
    /// The health call failed.
    #[error("health rpc probe failed: {0}")]
    Rpc(tonic::Status),
    /// The app answered, not `SERVING`.
    #[error("service unhealthy (responded with {0:?})")]
    Unhealthy(&'static str),
}
