//! What qproxy's tests share: the real `qproxy` binary run as a child
//! process ([`process`]), real apps on loopback ([`app`]), clients
//! ([`client`]), hostile clients and what they cost ([`hostile`]), raw
//! HTTP/2 frames ([`h2frames`]),
//! collectors of what it exports ([`collector`]), and
//! Knative's own Go queue-proxy run beside it as the oracle ([`oracle`]),
//! and a crate's module graph read off its sources ([`modgraph`]).
//!
//! Nothing waits by sleeping: every wait is on a condition with a deadline
//! ([`deadline`]). Everything is re-exported here, so that a test can
//! `use qproxy_test_support::*`.

// A test helper fails its test by panicking, with what went wrong.
#![allow(clippy::unwrap_used)]

pub mod app;
pub mod client;
pub mod collector;
pub mod h2frames;
pub mod hostile;
pub mod modgraph;
pub mod oracle;
pub mod process;
pub mod tls;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use tokio::io::AsyncReadExt;

pub use app::*;
pub use client::*;
pub use hostile::*;
pub use oracle::{GoQueueProxy, Oracle};
pub use process::*;

/// How long any single wait in a test may take before it fails: 20 s, or
/// `QPROXY_TEST_DEADLINE_SECS` (scripts/multiarch gives tests under
/// emulation more). A bound on failing, never a measure of speed.
pub fn deadline() -> Duration {
    seconds_from_env("QPROXY_TEST_DEADLINE_SECS", 20)
}

/// Whole seconds from the environment variable `var`, or `default` when
/// it is unset or not a number.
pub fn seconds_from_env(var: &str, default: u64) -> Duration {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(default), Duration::from_secs)
}

/// Fails the test if `fut` does not finish within [`deadline`].
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(deadline(), fut).await {
        Ok(out) => out,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// A body for test responses and requests.
pub type TestBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A complete body.
pub fn full(data: impl Into<Bytes>) -> TestBody {
    Full::new(data.into()).map_err(|e| match e {}).boxed()
}

/// An empty body.
pub fn empty() -> TestBody {
    Empty::new().map_err(|e| match e {}).boxed()
}

/// Reads one message head (through the blank line), byte by byte so that
/// nothing after it is consumed. `None` if the peer closes first.
pub async fn read_head(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.ok()?;
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// The workspace's root directory.
pub fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The directory cargo builds the running test's profile into
/// (`target/debug`): the test binary is in its `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent()
        .and_then(Path::parent)
        .expect("a test binary in target/<profile>/deps")
        .to_path_buf()
}

/// The target directory (`target/`), where built tools and oracles are
/// kept between runs.
pub fn target_dir() -> PathBuf {
    profile_dir()
        .parent()
        .expect("target/<profile> has a parent")
        .to_path_buf()
}

/// The lines starting with `prefix` among `lines`, sorted: a request's
/// line is written once the request is done, which may be after its
/// client has the response.
pub fn lines_with(prefix: &str, lines: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut lines: Vec<String> = lines
        .into_iter()
        .filter(|l| l.starts_with(prefix))
        .collect();
    lines.sort();
    lines
}

/// Waits until `lines` gives at least `n` lines starting with `prefix`;
/// returns them sorted.
pub async fn wait_lines_with(
    what: &str,
    n: usize,
    prefix: &str,
    lines: impl Fn() -> Vec<String>,
) -> Vec<String> {
    let deadline = std::time::Instant::now() + deadline();
    loop {
        let got = lines_with(prefix, lines());
        if got.len() >= n {
            return got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {} of {n} lines: {got:#?}",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
