//! A connection's first bytes and its request-head deadline: how long a
//! client may take to send a request head, as Go's `ReadHeaderTimeout`
//! bounds it on every Knative server.
//!
//! Go starts the clock for a connection's first request when the
//! connection is accepted, and for each later request when that request's
//! first bytes arrive: a keep-alive connection waiting for its next request
//! has no clock at all, since Knative sets no `IdleTimeout`. When the clock
//! runs out, the connection is closed without an answer.
//!
//! hyper's own header timeout starts as soon as hyper waits for a head,
//! which would close idle keep-alive connections. So each connection gets
//! one [`HeadClock`], made by its owner at accept (or at the end of its
//! TLS handshake), and everything that reads a head reads it:
//! - until the connection's first request head has been read (HTTP/1.1),
//!   or the client's preface and first `SETTINGS` frame (h2c), the
//!   connection's task races [`first_head`], a deadline the clock's
//!   timeout after it was made;
//! - for every later head this crate's server ([`serve`](super::serve))
//!   reads, a deadline from the head's first bytes;
//! - for every later head hyper reads, its header timeout runs on a [`HeadTimer`],
//!   whose sleeps start counting only once [`Watched`], the connection's
//!   I/O, sees the head's first bytes arrive.
//!
//! A connection's first head is read ahead of hyper, into a buffer taken
//! once the first bytes have come and the size of what has come
//! ([`read_first_head`]): hyper's 16 KiB of buffers are only taken once a
//! client has sent a whole head, so that idle and slow clients cost less
//! than they cost Go's server.
//!
//! One case differs from Go: bytes of the next request that arrived with
//! the previous one (pipelining) start no clock until more bytes come. A
//! client that sends part of a head that way and then nothing holds what
//! an idle keep-alive connection holds, which Knative allows for as long as
//! the client likes.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::rewind::Rewind;

/// The HTTP/2 client connection preface.
pub(crate) const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The preface and a frame header, whose first three bytes are the
/// frame's length.
const H2_SNIFF: usize = H2_PREFACE.len() + 9;

/// The first read's buffer for a connection's first head: most heads fit.
const READ_AHEAD_FIRST: usize = 1024;
/// Most bytes read ahead of hyper: a first head not complete by then is
/// left to hyper, which refuses one over Go's limit.
const READ_AHEAD_MAX: usize = 16 * 1024;

/// Reads a connection's first bytes until they hold a whole HTTP/1
/// request head or the h2c preface, or [`READ_AHEAD_MAX`] bytes, or the
/// client stops sending; returns them, for [`Watched`] to give hyper
/// first.
pub(crate) async fn read_first_head<IO: AsyncRead + Unpin>(io: &mut IO) -> io::Result<Bytes> {
    // Room is taken once the first bytes have come: a connection that
    // sends nothing holds no buffer. A read into no room waits until the
    // socket is readable (or a TLS stream has plaintext) and takes
    // nothing.
    poll_fn(|cx| Pin::new(&mut *io).poll_read(cx, &mut ReadBuf::new(&mut []))).await?;
    let mut buf = BytesMut::with_capacity(READ_AHEAD_FIRST);
    loop {
        if buf.len() == buf.capacity() {
            buf.reserve(buf.capacity());
        }
        if io.read_buf(&mut buf).await? == 0 || first_head_read(&buf) {
            return Ok(buf.freeze());
        }
    }
}

/// Whether `buf`, a connection's first bytes, holds enough for hyper.
fn first_head_read(buf: &[u8]) -> bool {
    let known = buf.len().min(H2_PREFACE.len());
    if buf[..known] == H2_PREFACE[..known] {
        return buf.len() >= H2_PREFACE.len();
    }
    // A blank line ends a head; Go and hyper take bare LFs too.
    buf.len() >= READ_AHEAD_MAX
        || buf.windows(2).any(|w| w == b"\n\n")
        || buf.windows(3).any(|w| w == b"\n\r\n")
        // A first line that cannot begin a request (the TLS handshake of a
        // client that took a plain port for a TLS one) is refused, as Go
        // refuses it, once the line ends.
        || (buf.first().is_some_and(|b| !begins_request(*b)) && buf.contains(&b'\n'))
}

/// Whether a request may begin with `b`: a method's first character (a
/// token character), or the empty lines a client may send before it.
fn begins_request(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~\r\n".contains(&b)
}

/// One connection's request-head clock: made by the connection's owner
/// when it accepts it (or ends its TLS handshake), and read by everything
/// that reads its heads ([`serve_connection`](super::conn::serve_connection):
/// the first head's deadline, this crate's server, and hyper's header
/// timeout once the connection is hyper's).
#[derive(Debug)]
pub struct HeadClock {
    accepted: Instant,
    timeout: Duration,
    /// The first head (or the h2c preface and settings) has been read.
    first_done: AtomicBool,
    /// hyper is waiting for a head.
    awaiting: AtomicBool,
    /// When the first bytes of the awaited head arrived, as nanoseconds
    /// since `accepted`, plus one; zero while none have.
    started: AtomicU64,
}

impl HeadClock {
    /// A clock for a connection accepted now, whose heads have `timeout`
    /// each.
    pub fn new(timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            accepted: Instant::now(),
            timeout,
            first_done: AtomicBool::new(false),
            awaiting: AtomicBool::new(false),
            started: AtomicU64::new(0),
        })
    }

    /// How long each head may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Notes that the connection's first head has been read, by this
    /// crate's server ([`serve`](super::serve)).
    pub(crate) fn first_read(&self) {
        self.first_done.store(true, Ordering::Relaxed);
    }

    pub(crate) fn first_done(&self) -> bool {
        self.first_done.load(Ordering::Relaxed)
    }

    /// Notes that bytes arrived: if a later head is awaited and its clock
    /// has not started, it starts now.
    fn bytes_arrived(&self) {
        if self.awaiting.load(Ordering::Relaxed) && self.started.load(Ordering::Relaxed) == 0 {
            let since = self.accepted.elapsed().as_nanos();
            let since = u64::try_from(since).unwrap_or(u64::MAX - 1);
            self.started.store(since + 1, Ordering::Relaxed);
        }
    }

    fn started_at(&self) -> Option<Instant> {
        match self.started.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.accepted + Duration::from_nanos(n - 1)),
        }
    }

    fn await_head(&self) {
        self.started.store(0, Ordering::Relaxed);
        self.awaiting.store(true, Ordering::Relaxed);
    }

    fn head_read(&self) {
        self.awaiting.store(false, Ordering::Relaxed);
        self.first_done.store(true, Ordering::Relaxed);
    }
}

/// Resolves when the connection's first head has not arrived within its
/// timeout of accept; never, if it has.
///
/// Once the first head is in, the timer is not polled again: a connection
/// polls this at every wake-up, and a timer that can no longer fire is not
/// worth a look each time. (Armed already, it wakes the task once more when
/// it expires.)
pub(crate) async fn first_head(clock: &HeadClock) {
    let mut expired = pin!(tokio::time::sleep_until(clock.accepted + clock.timeout));
    poll_fn(|cx| {
        if clock.first_done() {
            return Poll::Pending;
        }
        expired.as_mut().poll(cx)
    })
    .await;
}

/// The timer hyper's HTTP/1 header timeout runs on. hyper asks it for a
/// sleep each time it begins waiting for a head, and drops the sleep once
/// the head is read; the sleep counts the connection's head timeout from
/// the head's first bytes, whatever deadline hyper asked for.
#[derive(Debug, Clone)]
pub(crate) struct HeadTimer(pub(crate) Arc<HeadClock>);

impl HeadTimer {
    fn head_sleep(&self) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let first = !self.0.first_done();
        self.0.await_head();
        Box::pin(HeadSleep {
            clock: self.0.clone(),
            first,
            timer: None,
        })
    }
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, _: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.head_sleep()
    }

    fn sleep_until(&self, _: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.head_sleep()
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, _: std::time::Instant) {
        // The old sleep says its head is read when dropped: drop it first.
        *sleep = Box::pin(Never);
        *sleep = self.head_sleep();
    }
}

/// A sleep of [`HeadTimer`]: pending until the head's first bytes arrive,
/// then the head timeout from them. The first head's deadline is
/// [`first_head`]'s, so its sleep never fires.
struct HeadSleep {
    clock: Arc<HeadClock>,
    first: bool,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.first {
            return Poll::Pending;
        }
        if self.timer.is_none() {
            // hyper polls this right after each read that left the head
            // incomplete, so the bytes that start the clock have been
            // seen; until then, the next read wakes the task.
            let Some(started) = self.clock.started_at() else {
                return Poll::Pending;
            };
            let deadline = started + self.clock.timeout;
            self.timer = Some(Box::pin(tokio::time::sleep_until(deadline)));
        }
        match self.timer.as_mut() {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

impl Drop for HeadSleep {
    fn drop(&mut self) {
        self.clock.head_read();
    }
}

impl hyper::rt::Sleep for HeadSleep {}

/// A future that never resolves, as a hyper sleep.
struct Never;

impl Future for Never {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

impl hyper::rt::Sleep for Never {}

/// A connection's I/O, telling its [`HeadClock`] when bytes arrive, and
/// when an h2c client's preface and first frame are complete.
#[derive(Debug)]
pub(crate) struct Watched<IO> {
    /// The connection, with the bytes read ahead ([`read_first_head`])
    /// given to hyper first.
    io: Rewind<IO>,
    clock: Arc<HeadClock>,
    /// For an h2c connection, its first bytes, until the frame after the
    /// preface is complete.
    sniff: Option<Box<Sniff>>,
}

#[derive(Debug)]
struct Sniff {
    first: [u8; H2_SNIFF],
    read: usize,
}

impl<IO> Watched<IO> {
    /// Wraps `io`, a connection whose clock is `clock` and from which
    /// `ahead` has been read already ([`read_first_head`]), which tells
    /// whether it is h2c.
    pub(crate) fn new(io: IO, clock: Arc<HeadClock>, ahead: Bytes) -> Self {
        let h2c = ahead.starts_with(H2_PREFACE);
        Self {
            io: Rewind::new(io, ahead),
            clock,
            sniff: h2c.then(|| {
                Box::new(Sniff {
                    first: [0; H2_SNIFF],
                    read: 0,
                })
            }),
        }
    }

    /// The connection, and what of the bytes read ahead is still to be
    /// read.
    pub(crate) fn into_parts(self) -> (IO, Bytes) {
        self.io.into_parts()
    }

    fn arrived(&mut self, bytes: &[u8]) {
        if let Some(sniff) = &mut self.sniff
            && sniff.settled(bytes)
        {
            self.clock.first_done.store(true, Ordering::Relaxed);
            self.sniff = None;
        }
        self.clock.bytes_arrived();
    }
}

impl Sniff {
    /// Takes the next bytes read from an h2c connection; true once the
    /// whole frame after the preface (the client's `SETTINGS`) is in.
    fn settled(&mut self, bytes: &[u8]) -> bool {
        let start = self.read.min(H2_SNIFF);
        let take = (H2_SNIFF - start).min(bytes.len());
        self.first[start..start + take].copy_from_slice(&bytes[..take]);
        self.read = self.read.saturating_add(bytes.len());
        if self.read < H2_SNIFF {
            return false;
        }
        let [a, b, c] = [self.first[24], self.first[25], self.first[26]];
        let frame = u32::from_be_bytes([0, a, b, c]) as usize;
        self.read >= H2_SNIFF + frame
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled
            && buf.filled().len() > before
        {
            self.arrived(&buf.filled()[before..]);
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_head_is_read_to_its_end() {
        assert!(!first_head_read(b"GET / HTTP/1.1\r\nHost: a\r\n"));
        assert!(first_head_read(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(first_head_read(b"GET / HTTP/1.1\nHost: a\n\n"));
        assert!(!first_head_read(&H2_PREFACE[..20]));
        assert!(first_head_read(H2_PREFACE));
    }

    #[test]
    fn a_tls_client_hello_is_given_to_hyper_at_its_first_line_end() {
        let hello = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];
        assert!(!first_head_read(&hello));
        assert!(first_head_read(&[&hello[..], b"\x0a\x99"].concat()));
    }
}
