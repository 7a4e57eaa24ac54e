//! The revision's options, read from the pod's annotations and followed.
//!
//! Knative mounts the pod's annotations for the queue-proxy through the
//! Downward API (`/etc/podinfo/annotations`) when `config-features` lets
//! it; [`crate::config::Options`] says which annotations are options. The
//! file is read once before the first request is served, and again
//! whenever the kubelet updates it (it swaps the directory's `..data`
//! link, seen by inotify, with a re-read every minute where inotify cannot
//! be had). A change applies to the requests that arrive after it.
//!
//! With no such directory (the feature off, or outside a pod) the
//! image's defaults are all there is and nothing is watched.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{LiveOptions, Opt, Options};
use crate::dir_events::DirEvents;

/// The annotations file in the directory Knative mounts.
const FILE: &str = "annotations";
/// How often the file is re-read when inotify is not watching it.
const RECHECK: Duration = Duration::from_secs(60);

/// Where the options come from: the image's defaults and a directory
/// that may hold the annotations.
#[derive(Debug, Clone)]
pub(crate) struct PodInfo {
    dir: PathBuf,
    defaults: Options,
}

impl PodInfo {
    /// Options `defaults`, with the annotations under `dir` if any.
    pub(crate) fn new(dir: &Path, defaults: Options) -> Self {
        Self {
            dir: dir.to_owned(),
            defaults,
        }
    }

    /// Whether the directory is there to be watched.
    pub(crate) fn mounted(&self) -> bool {
        self.dir.is_dir()
    }

    /// The options as they stand, each annotation that cannot be applied
    /// logged once.
    pub(crate) fn read(&self) -> Options {
        let path = self.dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => return self.defaults,
            Err(e) => {
                tracing::warn!(
                    file = %path.display(),
                    error = %e,
                    "cannot read the pod's annotations; qproxy's options are the image's defaults"
                );
                return self.defaults;
            }
        };
        let (options, warnings) = self.defaults.with_annotations(&text);
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        options
    }

    /// The options at start, logged when any is on.
    pub(crate) fn start(&self) -> Options {
        let options = self.read();
        if !options.is_empty() {
            tracing::info!(options = %options.names(), "qproxy options on");
        }
        options
    }

    /// Follows the file for as long as the process runs, putting each
    /// change in force in `live`; `started` are the options at start.
    pub(crate) async fn follow(self, live: LiveOptions, started: Options) {
        let mut events = DirEvents::new(&self.dir, "the pod's annotations");
        let mut next = Instant::now() + RECHECK;
        let mut last = started;
        loop {
            tokio::select! {
                () = events.changed() => {}
                () = tokio::time::sleep_until(next), if !events.watching() => {}
            }
            next = Instant::now() + RECHECK;
            let read = self.read();
            if read == last {
                continue;
            }
            if read.has(Opt::AdaptiveConcurrency) != last.has(Opt::AdaptiveConcurrency) {
                tracing::info!(
                    "qproxy option adaptive-concurrency is read at start only: \
                     it changes with the revision's next pod"
                );
            }
            last = read;
            live.set(read);
            tracing::info!(options = %read.names(), "qproxy options changed");
        }
    }
}
