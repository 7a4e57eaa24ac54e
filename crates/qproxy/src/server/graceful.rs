//! Graceful shutdown of a port's connections: when the servers close,
//! each connection finishes the requests it has (HTTP/1.1: the one in
//! flight, then it closes; HTTP/2: a `GOAWAY`, then the streams open),
//! and shutdown waits for them all.
//!
//! hyper-util's `GracefulShutdown` does the same for the connection types
//! it knows; this one watches hyper's HTTP/1.1 and HTTP/2 connections
//! themselves, which are what a connection's task holds.

use std::future::Future;
use std::pin::pin;

use hyper::body::Incoming;
use hyper::rt::{Read, Write};
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
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
    pub(crate) fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    /// Serves `conn` to its end, shutting it down gracefully once asked.
    pub(crate) async fn watch<C: Graceful>(self, conn: C) -> C::Output {
        let mut conn = pin!(conn);
        tokio::select! {
            served = conn.as_mut() => return served,
            () = self.stopping() => {}
        }
        conn.as_mut().graceful_shutdown();
        conn.await
    }
}

/// A connection that can be asked to finish what it has and close.
pub(crate) trait Graceful: Future {
    /// Starts the graceful shutdown.
    fn graceful_shutdown(self: std::pin::Pin<&mut Self>);
}

impl<I, S, B> Graceful for http1::UpgradeableConnection<I, S>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: Read + Write + Unpin + Send + 'static,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful_shutdown(self: std::pin::Pin<&mut Self>) {
        http1::UpgradeableConnection::graceful_shutdown(self);
    }
}

impl<I, S, B, E> Graceful for http2::Connection<I, S, E>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: Read + Write + Unpin + 'static,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: std::pin::Pin<&mut Self>) {
        http2::Connection::graceful_shutdown(self);
    }
}
