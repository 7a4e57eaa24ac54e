//! HTTP/1.1 connections to the app kept alive for reuse: the idle ones,
//! and the [`Checkin`] by which a response body hands its connection back
//! once the app's response has been read to its end.
//!
//! The idle connections are a stack: a request takes the one used last,
//! as Go's transport does, so that the others age out. At most `max` are
//! kept, each for at most 90 s (Go's transport default). The stack holds
//! any kind of connection that says, through [`Pooled`], whether it is
//! still open: qproxy keeps hyper's connections and its own apart, a
//! stack of each.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// How long an idle connection is kept (Go's transport default).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often connections idle for longer are closed.
pub const IDLE_SWEEP: Duration = Duration::from_secs(15);

/// A connection that may wait in [`Idle`].
pub trait Pooled {
    /// Whether the app has closed it (or it can no longer be used).
    fn is_closed(&self) -> bool;
}

/// The idle HTTP/1.1 connections, the one used last at the end.
#[derive(Debug)]
pub struct Idle<C> {
    max: usize,
    conns: Mutex<Vec<(C, Instant)>>,
}

impl<C: Pooled + Send + 'static> Idle<C> {
    /// Keeps at most `max` connections, each for at most [`IDLE_TIMEOUT`]
    /// (swept every [`IDLE_SWEEP`] when made within a Tokio runtime).
    pub fn new(max: usize) -> Arc<Self> {
        let idle = Arc::new(Idle {
            max,
            conns: Mutex::new(Vec::new()),
        });
        Idle::keep_swept(Arc::downgrade(&idle));
        idle
    }

    /// The connection used last, if one is open.
    pub fn take(&self) -> Option<C> {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((conn, _)) = conns.pop() {
            if !conn.is_closed() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for reuse, unless enough are kept already.
    pub fn put(&self, conn: C) {
        if conn.is_closed() {
            return;
        }
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        if conns.len() < self.max {
            conns.push((conn, Instant::now()));
        }
    }

    /// Closes the connections idle for longer than [`IDLE_TIMEOUT`].
    fn sweep(&self, now: Instant) {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        conns.retain(|(conn, since)| {
            !conn.is_closed() && now.saturating_duration_since(*since) < IDLE_TIMEOUT
        });
    }

    /// Sweeps `idle` every [`IDLE_SWEEP`] while it exists.
    fn keep_swept(idle: Weak<Idle<C>>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let mut every = tokio::time::interval(IDLE_SWEEP);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let now = every.tick().await;
                let Some(idle) = idle.upgrade() else { return };
                idle.sweep(now);
            }
        });
    }
}

/// A connection whose response is being read: handed back for reuse by
/// [`Checkin::release`] once the response has been read to its end, closed
/// if dropped before that.
#[derive(Debug)]
pub struct Checkin<C: Pooled + Send + 'static> {
    idle: Arc<Idle<C>>,
    conn: C,
}

impl<C: Pooled + Send + 'static> Checkin<C> {
    /// `conn`, to be handed back to `idle`.
    pub fn new(idle: Arc<Idle<C>>, conn: C) -> Self {
        Checkin { idle, conn }
    }

    /// The response was read whole: the connection may serve another.
    pub fn release(self) {
        self.idle.put(self.conn);
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use hyper::client::conn::http1;
    use hyper_util::rt::TokioIo;
    use tokio::io::DuplexStream;

    use super::*;

    /// A hyper HTTP/1.1 client connection, as qproxy pools them; `local`
    /// tells one apart.
    struct TestConn {
        sender: http1::SendRequest<http_body_util::Empty<bytes::Bytes>>,
        local: SocketAddr,
    }

    impl Pooled for TestConn {
        fn is_closed(&self) -> bool {
            self.sender.is_closed()
        }
    }

    /// A connection over an in-memory stream, open while the returned task
    /// and stream are; `port` tells it apart.
    async fn conn(port: u16) -> (TestConn, (tokio::task::JoinHandle<()>, DuplexStream)) {
        let (ours, theirs) = tokio::io::duplex(64);
        let (sender, connection) = http1::handshake(TokioIo::new(ours)).await.unwrap();
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        let local = SocketAddr::from(([127, 0, 0, 1], port));
        (TestConn { sender, local }, (task, theirs))
    }

    fn ports(idle: &Idle<TestConn>) -> Vec<u16> {
        let conns = idle.conns.lock().unwrap();
        conns.iter().map(|(c, _)| c.local.port()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_used_is_taken_first_and_at_most_max_are_kept() {
        let idle = Idle::new(2);
        let mut tasks = Vec::new();
        for port in [1, 2, 3] {
            let (c, task) = conn(port).await;
            tasks.push(task);
            idle.put(c);
        }
        assert_eq!(ports(&idle), [1, 2], "the third is closed, not kept");
        assert_eq!(idle.take().unwrap().local.port(), 2);
        assert_eq!(idle.take().unwrap().local.port(), 1);
        assert!(idle.take().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn connections_idle_for_90_seconds_are_closed() {
        let idle = Idle::new(10);
        let (old, _t1) = conn(1).await;
        idle.put(old);
        tokio::time::sleep(Duration::from_secs(60)).await;
        let (young, _t2) = conn(2).await;
        idle.put(young);
        // The sweep runs every 15 s: by 105 s the first has aged out.
        tokio::time::sleep(Duration::from_secs(45)).await;
        assert_eq!(ports(&idle), [2]);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(ports(&idle).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_connection_is_neither_kept_nor_taken() {
        let idle = Idle::new(10);
        let (c, (task, _app)) = conn(1).await;
        idle.put(c);
        // The connection's task ends: its sender reports it closed.
        task.abort();
        let _ = task.await;
        assert!(idle.take().is_none());
        let (c, (task, _app)) = conn(2).await;
        task.abort();
        let _ = task.await;
        idle.put(c);
        assert!(ports(&idle).is_empty());
    }
}
