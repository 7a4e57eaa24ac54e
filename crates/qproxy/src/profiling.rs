//! CPU profiles on the profiling port (8008), as Knative serves them when
//! profiling is on (`ENABLE_PROFILING=true`, or `runtime.profiling:
//! enabled` in `OBSERVABILITY_CONFIG`).
//!
//! `GET /debug/pprof/profile?seconds=N` samples the whole process for `N`
//! seconds (30 when absent or not a positive number, as Go's handler
//! reads it) and answers a gzipped pprof protobuf, which `go tool pprof`
//! reads. One profile runs at a time; another request meanwhile gets Go's
//! `500`. Go's other `/debug/pprof/` pages (heap, goroutines, traces) have
//! no meaning here and answer `404`. When profiling is off, the port is not
//! opened and the sampler is never started.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;
use http::header::{CONTENT_DISPOSITION, CONTENT_TYPE, HeaderValue, X_CONTENT_TYPE_OPTIONS};
use http::{Request, Response, StatusCode};
use pprof::protos::Message;

use crate::admin::not_found;
use crate::body::Body;
use crate::proxy::plain_text;

/// Path of the CPU profile.
pub const PROFILE: &str = "/debug/pprof/profile";
/// Samples per second, as Go's CPU profiler takes them.
const FREQUENCY: i32 = 100;
/// Profile length when the request does not say.
const DEFAULT_SECONDS: u64 = 30;

/// Why a profile could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The sampler failed.
    #[error(transparent)]
    Pprof(#[from] pprof::Error),
    /// Compressing failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The blocking task was lost.
    #[error("profile task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// The profiling server's state: at most one profile at a time.
#[derive(Debug, Clone, Default)]
pub struct Profiling {
    busy: Arc<AtomicBool>,
}

impl Profiling {
    /// Answers `req`.
    pub async fn answer<B>(self, req: Request<B>) -> Response<Body> {
        if req.uri().path() != PROFILE {
            return not_found();
        }
        let seconds = seconds(req.uri().query());
        if self.busy.swap(true, Ordering::AcqRel) {
            return plain_text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Could not enable CPU profiling: cpu profiling already in use\n",
            );
        }
        let profile = profile(Duration::from_secs(seconds)).await;
        self.busy.store(false, Ordering::Release);
        match profile {
            Ok(gzipped) => {
                let mut res = Response::new(Body::full(gzipped));
                let headers = res.headers_mut();
                headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
                headers.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                );
                headers.insert(
                    CONTENT_DISPOSITION,
                    HeaderValue::from_static("attachment; filename=\"profile\""),
                );
                res
            }
            Err(e) => {
                tracing::error!(error = %e, "CPU profile failed");
                plain_text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("Could not enable CPU profiling: {e}\n"),
                )
            }
        }
    }
}

/// The `seconds` parameter as Go's handler reads it.
fn seconds(query: Option<&str>) -> u64 {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("seconds="))
        .and_then(|v| v.parse::<i64>().ok())
        .and_then(|n| u64::try_from(n).ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_SECONDS)
}

/// Samples the process for `length`, then builds the gzipped pprof.
async fn profile(length: Duration) -> Result<Vec<u8>, ProfileError> {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()?;
    tracing::debug!(seconds = length.as_secs(), "CPU profile started");
    tokio::time::sleep(length).await;
    // Symbolizing is CPU work: off the reactor.
    tokio::task::spawn_blocking(move || {
        let profile = guard.report().build()?.pprof()?;
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&profile.encode_to_vec())?;
        Ok(gz.finish()?)
    })
    .await?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_seconds_as_go_does() {
        assert_eq!(seconds(None), 30);
        assert_eq!(seconds(Some("seconds=5")), 5);
        assert_eq!(seconds(Some("debug=1&seconds=2")), 2);
        assert_eq!(seconds(Some("seconds=0")), 30);
        assert_eq!(seconds(Some("seconds=-4")), 30);
        assert_eq!(seconds(Some("seconds=x")), 30);
    }
}
