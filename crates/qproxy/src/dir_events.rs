//! Changes to a directory the kubelet mounts, from inotify.
//!
//! The kubelet updates a secret or Downward API volume atomically: it
//! writes the new files into a fresh timestamped directory, points a
//! `..data_tmp` symlink at it and renames that over `..data`, through
//! which the visible files (`tls.crt`, `annotations`) resolve. The rename
//! is an `IN_MOVED_TO` in the watched directory; files written in place
//! (as tests and hand-made setups do) show as `IN_CLOSE_WRITE` or
//! `IN_MOVED_TO`. Any event is only a hint: the reader re-reads the files
//! and compares. Whoever watches also re-reads every minute, for when
//! inotify cannot be had.

use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use inotify::{EventStream, Inotify, WatchMask};

/// Events closer together than this are one change (a kubelet update is a
/// few events in a row).
const SETTLE: Duration = Duration::from_millis(50);

/// The events of one directory; without inotify (or once it fails), a
/// change never shows, and the periodic re-read is all there is.
pub(crate) struct DirEvents {
    stream: Option<EventStream<[u8; 1024]>>,
    /// What the directory holds, for logs: "the certificate directory".
    what: &'static str,
}

impl DirEvents {
    /// The events of `dir`, which holds `what`.
    pub(crate) fn new(dir: &Path, what: &'static str) -> Self {
        let stream = (|| {
            let inotify = Inotify::init()?;
            inotify.watches().add(
                dir,
                WatchMask::CREATE
                    | WatchMask::MOVED_TO
                    | WatchMask::CLOSE_WRITE
                    | WatchMask::DELETE
                    | WatchMask::ATTRIB,
            )?;
            inotify.into_event_stream([0; 1024])
        })();
        match stream {
            Ok(stream) => Self {
                stream: Some(stream),
                what,
            },
            Err(e) => {
                tracing::warn!(
                    directory = %dir.display(),
                    error = %e,
                    "cannot watch {what}; it is re-read every minute"
                );
                Self { stream: None, what }
            }
        }
    }

    /// Whether inotify is watching (if not, a change never shows).
    pub(crate) fn watching(&self) -> bool {
        self.stream.is_some()
    }

    /// Waits for the directory to change, then for its events to settle.
    pub(crate) async fn changed(&mut self) {
        let Some(stream) = self.stream.as_mut() else {
            return std::future::pending().await;
        };
        match stream.next().await {
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!(
                    error = %e,
                    "the watch of {} failed; it is re-read every minute",
                    self.what
                );
                self.stream = None;
                return std::future::pending().await;
            }
            None => {
                self.stream = None;
                return std::future::pending().await;
            }
        }
        while let Ok(Some(Ok(_))) = tokio::time::timeout(SETTLE, stream.next()).await {}
    }
}

impl std::fmt::Debug for DirEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirEvents")
            .field("what", &self.what)
            .field("watching", &self.stream.is_some())
            .finish()
    }
}
