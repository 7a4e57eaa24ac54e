//! Graceful shutdown of a port's connections: when the servers close,
//! each connection finishes the requests it has (HTTP/1.1: the one in
//! flight, then it closes; HTTP/2: a `GOAWAY`, then the streams open),
//! and shutdown waits for them all.
//!
//! hyper-util's `GracefulShutdown` does the same for the connection types
//! it knows; here each connection's [`Watcher`] is its owner's side of
//! `qproxy-transport`'s [`Lifecycle`], which shuts down whichever connection
//! the task holds (qproxy's own server's, or hyper's HTTP/1.1 or HTTP/2).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use pin_project_lite::pin_project;
use qproxy_transport::server::Lifecycle;
use tokio::sync::watch;

/// Tells the connections it watches to finish, and waits until they have.
#[derive(Debug)]
pub(crate) struct GracefulShutdown {
    tx: watch::Sender<bool>,
}

impl Default for GracefulShutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl GracefulShutdown {
    /// Watches no connection yet.
    pub(crate) fn new() -> Self {
        Self {
            tx: watch::Sender::new(false),
        }
    }

    /// A handle for one connection; the connection counts until it drops.
    pub(crate) fn watcher(&self) -> Watcher {
        Watcher {
            rx: self.tx.subscribe(),
        }
    }

    /// Tells every connection to finish, and waits until all have.
    pub(crate) async fn shutdown(self) {
        self.tx.send_replace(true);
        self.tx.closed().await;
    }
}

/// One connection's end of a [`GracefulShutdown`].
#[derive(Debug)]
pub(crate) struct Watcher {
    rx: watch::Receiver<bool>,
}

impl Watcher {
    /// Whether the connection has been asked to finish.
    pub(crate) fn is_stopping(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once the connection is asked to finish: made once for a
    /// connection's life, so that it registers its interest once.
    pub(crate) fn stopping(&self) -> Stopping<impl Future<Output = ()> + Send + 'static> {
        let mut rx = self.rx.clone();
        Stopping {
            wait: async move {
                let _ = rx.wait_for(|stop| *stop).await;
            },
            seen: self.rx.clone(),
            polled_by: None,
        }
    }
}

impl Lifecycle for Watcher {
    fn is_stopping(&self) -> bool {
        Watcher::is_stopping(self)
    }

    fn stopping(&self) -> impl Future<Output = ()> {
        Watcher::stopping(self)
    }
}

pin_project! {
    /// A connection's wait for the shutdown, which it polls at every
    /// wake-up. Registering for the signal takes a lock each time; once it
    /// has registered this task, polling it again is a look at the signal's
    /// version, until a signal comes.
    pub(crate) struct Stopping<F> {
        #[pin]
        wait: F,
        // The signal, to tell whether it has been sent since `wait`
        // registered.
        seen: watch::Receiver<bool>,
        // The task `wait` last registered to be woken.
        polled_by: Option<Waker>,
    }
}

impl<F: Future<Output = ()>> Future for Stopping<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        // A closed signal counts as sent: `wait` ends on it too.
        let sent = this.seen.has_changed().unwrap_or(true);
        if !sent
            && this
                .polled_by
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
        {
            return Poll::Pending;
        }
        let polled = this.wait.poll(cx);
        if polled.is_pending() {
            *this.polled_by = Some(cx.waker().clone());
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_connection_polling_again_still_hears_the_stop() {
        let graceful = GracefulShutdown::new();
        let watcher = graceful.watcher();
        let mut stopping = pin!(watcher.stopping());
        let (one, other) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let (one_waker, other_waker) = (Waker::from(one.clone()), Waker::from(other.clone()));
        let mut cx = Context::from_waker(&one_waker);
        for _ in 0..3 {
            assert!(stopping.as_mut().poll(&mut cx).is_pending());
        }
        // Polled by another task now: that task is the one woken.
        assert!(
            stopping
                .as_mut()
                .poll(&mut Context::from_waker(&other_waker))
                .is_pending()
        );
        graceful.tx.send_replace(true);
        assert_eq!(
            other.0.load(Ordering::SeqCst),
            1,
            "the last poller is woken"
        );
        assert_eq!(one.0.load(Ordering::SeqCst), 0);
        assert!(stopping.as_mut().poll(&mut cx).is_ready());
    }

    #[tokio::test]
    async fn a_stop_sent_before_the_first_poll_is_heard() {
        let graceful = GracefulShutdown::new();
        let watcher = graceful.watcher();
        let stopping = watcher.stopping();
        graceful.tx.send_replace(true);
        stopping.await;
        assert!(watcher.is_stopping());
    }
}
