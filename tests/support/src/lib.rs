//! What qproxy's tests share: the real `qproxy` binary run as a child
//! process ([`process`]), real apps on loopback ([`app`]), clients
//! ([`client`]), hostile clients and what they cost ([`hostile`]), raw
//! HTTP/2 frames ([`h2frames`]),
//! collectors of what it exports ([`collector`]), and
//! Knative's own Go queue-proxy run beside it as the oracle ([`oracle`]),
//! and a crate's module graph read off its sources ([`modgraph`]).
//!
//! Nothing waits by sleeping: every wait is on an event ([`within`]) or
//! on a condition ([`until`], the one way to wait on one), with a
//! deadline ([`deadline`]). Everything is re-exported here, so that a test can
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

/// Fails the test if `fut` does not finish within [`deadline`]: the bound
/// on waiting for one event (an answer, a close, a message).
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(deadline(), fut).await {
        Ok(out) => out,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// What a check of [`until`] gives: done (with what it found), or not yet
/// (with what it saw instead, for the message if the wait times out).
pub trait Check {
    /// What the wait returns once the check passes.
    type Done;
    /// `Ok` when done; else what was seen instead, if anything.
    fn done(self) -> Result<Self::Done, Option<String>>;
}

impl Check for bool {
    type Done = ();
    fn done(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Check for Option<T> {
    type Done = T;
    fn done(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: std::fmt::Debug> Check for Result<T, E> {
    type Done = T;
    fn done(self) -> Result<T, Option<String>> {
        self.map_err(|seen| Some(format!("{seen:?}")))
    }
}

/// How often [`until`] checks again.
const RECHECK: Duration = Duration::from_millis(20);

/// Waits until `check` passes (`true`, `Some`, `Ok`), checking again every
/// 20 ms, and returns what it found; fails the test naming `what` (and
/// what the last check saw) if [`deadline`] passes first. The one way the
/// tests wait on a condition: nothing waits by sleeping.
pub async fn until<C: Check>(what: &str, check: impl AsyncFnMut() -> C) -> C::Done {
    until_within(deadline(), what, check).await
}

/// [`until`] with a bound of its own, for a wait that is long by design
/// (a timeout of a minute to fire), or one of a suite with a deadline of
/// its own.
pub async fn until_within<C: Check>(
    limit: Duration,
    what: &str,
    check: impl AsyncFnMut() -> C,
) -> C::Done {
    match wait(limit, check).await {
        Ok(done) => done,
        Err(seen) => timed_out(limit, what, seen),
    }
}

/// The wait of [`until_within`]: what `check` found, or (once `limit` has
/// passed) what it last saw instead.
async fn wait<C: Check>(
    limit: Duration,
    mut check: impl AsyncFnMut() -> C,
) -> Result<C::Done, Option<String>> {
    let mut seen = None;
    let waited = tokio::time::timeout(limit, async {
        loop {
            match check().await.done() {
                Ok(done) => return done,
                Err(now) => seen = now,
            }
            tokio::time::sleep(RECHECK).await;
        }
    })
    .await;
    waited.map_err(|_| seen)
}

/// Whether `cond` comes to hold within `limit`: [`until_within`]'s wait,
/// for a caller that asserts on the answer itself.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    wait(limit, async || cond()).await.is_ok()
}

/// [`until_within`] for code on a thread of its own rather than a task
/// (a test without a runtime, a `Drop`): the same checks, every 20 ms,
/// the calling thread blocked between them.
pub fn until_blocking<C: Check>(limit: Duration, what: &str, check: impl FnMut() -> C) -> C::Done {
    match wait_blocking(limit, check) {
        Ok(done) => done,
        Err(seen) => timed_out(limit, what, seen),
    }
}

/// [`eventually`] for code on a thread of its own, where a failure must
/// not panic (a `Drop`).
pub fn eventually_blocking(limit: Duration, cond: impl FnMut() -> bool) -> bool {
    wait_blocking(limit, cond).is_ok()
}

/// The wait of [`until_blocking`], as [`wait`] is [`until_within`]'s.
fn wait_blocking<C: Check>(
    limit: Duration,
    mut check: impl FnMut() -> C,
) -> Result<C::Done, Option<String>> {
    let end = std::time::Instant::now() + limit;
    loop {
        match check().done() {
            Ok(done) => return Ok(done),
            Err(seen) if std::time::Instant::now() >= end => return Err(seen),
            Err(_) => std::thread::sleep(RECHECK),
        }
    }
}

/// Fails the test: `what` did not come within `limit`; `seen` is what the
/// last check saw instead, if it said.
fn timed_out(limit: Duration, what: &str, seen: Option<String>) -> ! {
    match seen {
        Some(seen) => panic!("timed out after {limit:?} waiting for {what}; last seen: {seen}"),
        None => panic!("timed out after {limit:?} waiting for {what}"),
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
    let what = format!("{what}: {n} lines");
    until(&what, async || {
        let got = lines_with(prefix, lines());
        if got.len() >= n { Ok(got) } else { Err(got) }
    })
    .await
}
