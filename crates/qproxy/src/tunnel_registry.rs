//! Upgraded connections (WebSocket and the like), as the layers, the proxy
//! and the shutdown see them.
//!
//! The reverse proxy runs each tunnel; the `101` response that opened it
//! carries a [`Tunnel`] handle, through which the layers keep what they
//! hold for the request (its breaker slot, for one) until the tunnel
//! closes, and the shutdown counts the open ones in [`Tunnels`], as
//! Knative's hijack tracker does. The timeout layer tells the proxy when
//! to close a tunnel with a [`TunnelDeadline`].

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

/// When the upgraded connection of a request must be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TunnelDeadline(pub(crate) Instant);

/// Keeps things alive for as long as an upgraded connection is open.
///
/// Found in the extensions of a `101` response; cloning gives another
/// handle to the same tunnel.
#[derive(Debug, Clone)]
pub(crate) struct Tunnel {
    /// `None` once the tunnel has closed.
    kept: Arc<Mutex<Option<Kept>>>,
}

/// What a tunnel keeps alive.
type Kept = Vec<Box<dyn Any + Send>>;

impl Tunnel {
    /// A tunnel that has just opened, keeping nothing yet.
    pub(crate) fn open() -> Self {
        Tunnel {
            kept: Arc::new(Mutex::new(Some(Vec::new()))),
        }
    }

    /// Keeps `thing` until the tunnel closes; drops it at once if it has
    /// closed already.
    pub(crate) fn keep(&self, thing: impl Any + Send) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = kept.as_mut() {
            kept.push(Box::new(thing));
        }
    }

    /// Drops everything kept; later [`Tunnel::keep`]s drop at once.
    pub(crate) fn close(&self) {
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(kept);
    }
}

/// The upgraded connections open at one time; cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tunnels {
    inner: Arc<TunnelCount>,
}

#[derive(Debug, Default)]
struct TunnelCount {
    open: AtomicUsize,
    all_closed: Notify,
}

/// Counts one open tunnel until dropped.
#[derive(Debug)]
pub(crate) struct OpenTunnel(Arc<TunnelCount>);

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.all_closed.notify_waiters();
        }
    }
}

impl Tunnels {
    /// How many tunnels are open.
    pub(crate) fn open(&self) -> usize {
        self.inner.open.load(Ordering::Acquire)
    }

    /// Waits until no tunnel is open.
    pub(crate) async fn all_closed(&self) {
        loop {
            let notified = self.inner.all_closed.notified();
            tokio::pin!(notified);
            // Registered before the check, so no wake-up is missed.
            notified.as_mut().enable();
            if self.open() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Counts one more open tunnel, until the returned guard is dropped.
    pub(crate) fn opened(&self) -> OpenTunnel {
        self.inner.open.fetch_add(1, Ordering::AcqRel);
        OpenTunnel(self.inner.clone())
    }
}
