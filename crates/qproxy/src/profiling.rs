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
//!
//! The sampler keeps its samples in a temporary file. Knative gives the
//! queue-proxy a read-only root filesystem, so when the usual temporary
//! directory cannot be written, [`prepare_temp_dir`] points it at
//! `/dev/shm`, which every container has.

use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;
use http::header::{CONTENT_DISPOSITION, CONTENT_TYPE, HeaderValue, X_CONTENT_TYPE_OPTIONS};
use http::{Request, Response, StatusCode};
use pprof::protos::Message;
use qproxy_core::body::RequestBody;

use qproxy_core::Endpoint;
use qproxy_core::body::ReplyBody;
use qproxy_core::reply::{http_error, not_found};

/// Path of the CPU profile.
pub(crate) const PROFILE: &str = "/debug/pprof/profile";
/// Samples per second, as Go's CPU profiler takes them.
const FREQUENCY: i32 = 100;
/// Profile length when the request does not say.
const DEFAULT_SECONDS: u64 = 30;

/// Why a profile could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProfileError {
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
pub(crate) struct Profiling {
    busy: Arc<AtomicBool>,
}

impl Profiling {
    /// Answers `req`.
    pub(crate) async fn answer<B>(self, req: Request<B>) -> Response<ReplyBody> {
        if req.uri().path() != PROFILE {
            return not_found();
        }
        let seconds = seconds(req.uri().query());
        if self.busy.swap(true, Ordering::AcqRel) {
            return profile_error("cpu profiling already in use");
        }
        // Freed however the profile ends, its client gone included.
        let _busy = Busy(self.busy.clone());
        match profile(Duration::from_secs(seconds)).await {
            Ok(gzipped) => {
                let mut res = Response::new(ReplyBody::full(gzipped));
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
                profile_error(&e.to_string())
            }
        }
    }
}

/// Marks the profiler free when dropped.
struct Busy(Arc<AtomicBool>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Go's `serveError` for a profile that could not start.
fn profile_error(why: &str) -> Response<ReplyBody> {
    let mut res = http_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("Could not enable CPU profiling: {why}\n"),
    );
    res.headers_mut()
        .insert("x-go-pprof", HeaderValue::from_static("1"));
    res
}

/// Makes sure the sampler has a temporary directory it can write: the
/// usual one (`TMPDIR`, else `/tmp`), or else `/dev/shm`. Called once,
/// before the first profile, when profiling is on.
pub(crate) fn prepare_temp_dir() {
    let usual = std::env::temp_dir();
    if writable(&usual) {
        return;
    }
    let shm = Path::new("/dev/shm");
    if writable(shm) && tempfile::env::override_temp_dir(shm).is_ok() {
        tracing::info!(
            unwritable = %usual.display(),
            "CPU profiles keep their samples in /dev/shm"
        );
    } else {
        tracing::warn!(
            unwritable = %usual.display(),
            "no writable temporary directory: CPU profiles will fail"
        );
    }
}

fn writable(dir: &Path) -> bool {
    tempfile::tempfile_in(dir).is_ok()
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
    let builder = pprof::ProfilerGuardBuilder::default().frequency(FREQUENCY);
    // Samples are not unwound into these libraries where they are shared
    // objects (a dynamically linked build); pprof offers it on these
    // architectures only, and the image's static binary has none of them.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    let builder = builder.blocklist(&["libc", "libgcc", "pthread", "vdso"]);
    let guard = builder.build()?;
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

impl Endpoint for Profiling {
    fn respond(
        self,
        req: Request<RequestBody>,
    ) -> impl Future<Output = Response<ReplyBody>> + Send {
        self.answer(req)
    }
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
