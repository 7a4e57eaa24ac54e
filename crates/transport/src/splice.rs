//! Bytes moved between two TCP sockets without passing through user
//! space: `splice(2)` from one socket into a pipe, and from the pipe into
//! the other, as HAProxy's `splice-auto` moves them.
//!
//! [`copy`] moves one direction to its end ([`forward`]: after the bytes
//! read of it already), [`shutdown_write`] half-closes the far end. Pipes
//! are kept per thread ([`Pipe`]: taken when bytes are there to move,
//! given back as soon as they have gone, at most [`KEPT_PIPES`] kept),
//! each [`PIPE_SIZE`] large: a quiet tunnel holds no pipe, and a thread
//! holds as many as it moves bytes for at once. Where no pipe can be had
//! (the process is out of descriptors), the copy goes through a buffer.
//!
//! A body's bytes are spliced the same way, in pieces (`Lent`): the
//! server that writes a response lends the body it polls a place for a
//! pipe, the app's response body splices its next bytes from the app's
//! socket into a pipe there and hands on, in their place, a data frame of
//! as many bytes (`in_pipe`), and the server splices them from the pipe
//! into the client's socket. The frame counts as the bytes it stands for
//! everywhere between (metrics, logs, timeouts, the breaker's permit);
//! only the server that lent the pipe ever sees what it holds. A pipe is
//! held only while bytes are in it. Bodies are spliced where that was
//! measured to pay ([`SPLICE_MIN`], [`SPLICE_MAX`]).
//!
//! A socket whose bytes the kernel hands over outside its TCP receive
//! queue is never spliced from: a socket the accelerator's `sk_msg`
//! program redirects into (its bytes wait in the socket's BPF queue, which
//! `recvmsg` reads and `splice` does not see). Such a socket tells itself
//! as it turns readable: `splice` finds nothing (or the peer's end, which
//! comes by TCP after bytes that wait there), a peek finds bytes, and a
//! second splice still finds none (bytes that came in between, it
//! takes). The
//! copy then goes on by `recv` and `send` through a buffer, for good. A
//! connection's bytes take one path each way, so nothing spliced can come
//! before bytes waiting there.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags, Shutdown, recv, send, shutdown};
use rustix::pipe::{PipeFlags, SpliceFlags, fcntl_setpipe_size, pipe_with, splice};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// How many bytes a pipe holds: 64 KiB, the kernel's default, which
/// `F_SETPIPE_SZ` makes sure of. A 256 KiB pipe cost a quarter less CPU
/// per 1 MiB answer (2026-12-04), but each pipe counts its pages against
/// its user's pipe budget (`fs.pipe-user-pages-soft`, 16,384 pages), which
/// every container of the same UID on a node shares, kept pipes too: past
/// it, their new pipes get two pages.
pub const PIPE_SIZE: usize = 64 * 1024;
/// The least of a body's data spliced at once: a length-framed response
/// shorter than this is not lent a pipe, and a body's data is read rather
/// than spliced while fewer of its bytes are ahead (the rest of data
/// spliced already aside). Measured on 2026-12-04: 16 KiB answers cost
/// as much spliced as copied, 32 KiB ones 5% less, 64 KiB ones 22% less.
pub const SPLICE_MIN: usize = 32 * 1024;
/// The most of a body spliced: a length-framed response longer than this
/// is not lent a pipe, and a chunked one is read once this much of it has
/// been spliced. Measured on 2026-12-04 (wrk, 10 connections, loopback):
/// 256 KiB answers spliced were served 4% faster for 18% less CPU, 1 MiB
/// ones 17% slower (the kernel sent the spliced bytes the client's socket
/// could not take yet as the client's acknowledgements came, billed to the
/// client, whose one thread was the bound).
pub const SPLICE_MAX: u64 = 256 * 1024;
/// Most pipes a thread keeps for the next copy (two descriptors each).
pub const KEPT_PIPES: usize = 16;
/// The buffer of a copy that cannot splice.
const COPY_BUF: usize = 16 * 1024;

thread_local! {
    static PIPES: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
    /// The pipe the server polling a body lends it, while it polls it.
    static LENT: Cell<Option<Lent>> = const { Cell::new(None) };
}

/// What the data frames of bytes in a pipe point at: never written, only
/// told apart by where they point.
static IN_PIPE: [u8; PIPE_SIZE] = [0; PIPE_SIZE];

/// A pipe for [`copy`]: its two ends, empty whenever it is kept.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    /// A pipe kept by this thread, or a new one.
    pub fn take() -> io::Result<Self> {
        if let Some(pipe) = PIPES.with(|p| p.borrow_mut().pop()) {
            return Ok(pipe);
        }
        let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        // Its size is the default's unless the system says otherwise.
        let _ = fcntl_setpipe_size(&write, PIPE_SIZE);
        Ok(Pipe { read, write })
    }

    /// Keeps the pipe for this thread's next copy, if it is empty and
    /// fewer than [`KEPT_PIPES`] are kept.
    pub(crate) fn give_back(self) {
        PIPES.with(|p| {
            let mut pipes = p.borrow_mut();
            if pipes.len() < KEPT_PIPES {
                pipes.push(self);
            }
        });
    }
}

/// How a [`copy`] moved its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Copied {
    /// Bytes spliced, which never passed through user space.
    pub spliced: u64,
    /// Bytes read and written through a buffer: those of a socket that
    /// cannot be spliced from.
    pub copied: u64,
}

impl Copied {
    /// `n` bytes moved through memory, none spliced.
    pub fn through_memory(n: u64) -> Self {
        Copied {
            spliced: 0,
            copied: n,
        }
    }

    /// Every byte moved.
    pub fn total(&self) -> u64 {
        self.spliced + self.copied
    }
}

/// What one splice into the empty pipe did.
enum Filled {
    /// The pipe holds this many bytes.
    Bytes(usize),
    /// `from` has ended its side.
    End,
    /// `from` holds bytes `splice` cannot take.
    Unspliceable,
}

/// One splice of `from` into the empty pipe; `WouldBlock` when there is
/// nothing yet. Where the splice would block yet a peek finds bytes,
/// `from` holds bytes outside its receive queue.
fn into_pipe(from: &TcpStream, pipe: &Pipe) -> io::Result<Filled> {
    into_pipe_at_most(from, pipe, PIPE_SIZE)
}

/// [`into_pipe`], moving at most `most` bytes.
fn into_pipe_at_most(from: &TcpStream, pipe: &Pipe, most: usize) -> io::Result<Filled> {
    let ended = match splice_into(from, pipe, most) {
        Ok(0) => true,
        Ok(n) => return Ok(Filled::Bytes(n)),
        Err(Errno::AGAIN) => false,
        Err(e) => return Err(e.into()),
    };
    // Nothing spliced, at the end or not yet. Bytes a peek finds came
    // since, or are outside the receive queue: the accelerator's, which
    // come before the peer's end although `splice` sees the end (it came
    // by TCP) and not them. A second splice tells which.
    let mut one = [0u8; 1];
    match recv(from, &mut one[..], RecvFlags::PEEK | RecvFlags::DONTWAIT) {
        Ok((_, n)) if n > 0 => match splice_into(from, pipe, most) {
            Ok(n) if n > 0 => Ok(Filled::Bytes(n)),
            Ok(_) | Err(Errno::AGAIN) => Ok(Filled::Unspliceable),
            Err(e) => Err(e.into()),
        },
        Ok(_) if ended => Ok(Filled::End),
        // An end a peek sees first is the next splice's to tell.
        Ok(_) | Err(Errno::AGAIN) => Err(io::ErrorKind::WouldBlock.into()),
        Err(e) => Err(e.into()),
    }
}

/// One splice of at most `most` bytes of `from` into `pipe`.
fn splice_into(from: &TcpStream, pipe: &Pipe, most: usize) -> rustix::io::Result<usize> {
    splice(from, None, &pipe.write, None, most, flags())
}

fn flags() -> SpliceFlags {
    SpliceFlags::MOVE | SpliceFlags::NONBLOCK
}

/// Moves what `from` sends to `to` until `from` ends its side (`Ok`, with
/// what was moved; `to`'s side is left open for the caller to shut), or
/// either fails.
pub fn copy<'a>(from: &'a TcpStream, to: &'a TcpStream) -> Forward<'a> {
    forward(from, Bytes::new(), to)
}

/// Writes `ahead` (what was read of `from` already) to `to`, then moves
/// what `from` sends, as [`copy`] does. `ahead` is let go of once written
/// (at once if empty: even so it may hold the buffer it was read into).
pub fn forward<'a>(from: &'a TcpStream, ahead: Bytes, to: &'a TcpStream) -> Forward<'a> {
    Forward {
        from,
        to,
        ahead: if ahead.is_empty() {
            Bytes::new()
        } else {
            ahead
        },
        pipe: None,
        buffer: None,
        copied: Copied::default(),
    }
}

/// One direction of a tunnel, [`forward`]'s: a future of a few words,
/// polled by hand (each wait is the sockets' own readiness, where `async`
/// waits nested a future for each, about 800 bytes a direction). A pipe is
/// held only while bytes are in it: taken once `from` is readable, given
/// back once it is empty, so that a quiet tunnel holds none.
#[derive(Debug)]
#[must_use = "a future does nothing unless polled"]
pub struct Forward<'a> {
    from: &'a TcpStream,
    to: &'a TcpStream,
    /// What is still to be written of the bytes read of `from` already.
    ahead: Bytes,
    /// The pipe taken, and how many bytes are in it.
    pipe: Option<(Pipe, usize)>,
    /// Once `from` cannot be spliced from (or no pipe can be had): the
    /// buffer the rest goes through.
    buffer: Option<Buffered>,
    copied: Copied,
}

/// The buffer of a copy that cannot splice, and the part of it still to
/// be written.
#[derive(Debug)]
struct Buffered {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Future for Forward<'_> {
    type Output = io::Result<Copied>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<Copied>> {
        let this = self.get_mut();
        let (from, to) = (this.from, this.to);
        loop {
            if !this.ahead.is_empty() {
                let n = ready!(poll_send(to, cx, &this.ahead))?;
                this.ahead.advance(n);
                this.copied.copied += n as u64;
                if this.ahead.is_empty() {
                    this.ahead = Bytes::new();
                }
                continue;
            }
            if let Some(buffered) = this.buffer.as_mut() {
                if buffered.start < buffered.end {
                    let rest = &buffered.buf[buffered.start..buffered.end];
                    let n = ready!(poll_send(to, cx, rest))?;
                    buffered.start += n;
                    this.copied.copied += n as u64;
                    continue;
                }
                ready!(from.poll_read_ready(cx))?;
                let buf = &mut buffered.buf;
                match from.try_io(Interest::READABLE, || {
                    Ok(recv(from, &mut buf[..], RecvFlags::DONTWAIT)?.1)
                }) {
                    Ok(0) => return Poll::Ready(Ok(this.copied)),
                    Ok(n) => (buffered.start, buffered.end) = (0, n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
                continue;
            }
            if let Some((pipe, held)) = this.pipe.as_mut() {
                // A pipe that still holds bytes when this fails is closed,
                // not kept.
                let n = ready!(poll_write(to, cx, || {
                    Ok(splice(&pipe.read, None, to, None, *held, flags())?)
                }))?;
                *held -= n;
                this.copied.spliced += n as u64;
                if *held == 0
                    && let Some((pipe, _)) = this.pipe.take()
                {
                    pipe.give_back();
                }
                continue;
            }
            ready!(from.poll_read_ready(cx))?;
            let Ok(pipe) = Pipe::take() else {
                this.buffer = Some(Buffered::new());
                continue;
            };
            match from.try_io(Interest::READABLE, || into_pipe(from, &pipe)) {
                Ok(Filled::Bytes(n)) => this.pipe = Some((pipe, n)),
                Ok(Filled::End) => {
                    pipe.give_back();
                    return Poll::Ready(Ok(this.copied));
                }
                Ok(Filled::Unspliceable) => {
                    pipe.give_back();
                    this.buffer = Some(Buffered::new());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => pipe.give_back(),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl Buffered {
    fn new() -> Self {
        Buffered {
            buf: vec![0; COPY_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }
}

/// One write to `to` by `write` once `to` is writable: how many bytes it
/// took, or `Pending` (the socket's readiness cleared, and the task woken
/// when it is writable again).
fn poll_write(
    to: &TcpStream,
    cx: &mut Context<'_>,
    mut write: impl FnMut() -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        ready!(to.poll_write_ready(cx))?;
        match to.try_io(Interest::WRITABLE, &mut write) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            done => return Poll::Ready(done),
        }
    }
}

/// One send of `bytes` to `to` once `to` is writable, as [`poll_write`].
fn poll_send(to: &TcpStream, cx: &mut Context<'_>, bytes: &[u8]) -> Poll<io::Result<usize>> {
    poll_write(to, cx, || {
        Ok(send(to, bytes, SendFlags::DONTWAIT | SendFlags::NOSIGNAL)?)
    })
}

/// Ends `to`'s sending side (a half-close): the far end reads its end.
pub fn shutdown_write(to: &TcpStream) -> io::Result<()> {
    Ok(shutdown(to, Shutdown::Write)?)
}

/// A pipe lent, while a body is polled, by the server writing it: empty
/// when lent (its pipe taken from the thread's only once the body splices
/// into it), holding `held` bytes when it comes back.
#[derive(Debug, Default)]
pub(crate) struct Lent {
    pipe: Option<Pipe>,
    held: usize,
}

impl Lent {
    /// Runs `poll` (a body's poll) with a pipe lent to the body, and
    /// says what came back: `None` when the body spliced nothing into it,
    /// or the pipe and the bytes it holds.
    pub(crate) fn around<T>(poll: impl FnOnce() -> T) -> (T, Option<(Pipe, usize)>) {
        /// Takes the lent pipe back however the poll ends, a panic too:
        /// no other body this thread polls may splice into it.
        struct Lending;
        impl Drop for Lending {
            fn drop(&mut self) {
                LENT.with(Cell::take);
            }
        }
        LENT.with(|lent| lent.set(Some(Lent::default())));
        let lending = Lending;
        let polled = poll();
        let back = LENT.with(Cell::take).and_then(|lent| match lent {
            Lent {
                pipe: Some(pipe),
                held: 0,
            } => {
                pipe.give_back();
                None
            }
            Lent { pipe, held } => pipe.map(|pipe| (pipe, held)),
        });
        drop(lending);
        (polled, back)
    }
}

/// What [`fill_lent`] did.
#[derive(Debug)]
pub(crate) enum Spliced {
    /// No pipe is lent (the body is not polled by a server that splices,
    /// or it holds bytes already), or none could be had: read the bytes
    /// instead.
    NotLent,
    /// This many bytes are in the pipe: the frame that stands for them.
    Bytes(Bytes),
    /// `from` has ended its side.
    End,
    /// `from` holds bytes `splice` cannot take: read them, and every
    /// later one, instead.
    Unspliceable,
}

/// Splices at most `most` bytes (not 0) of `from` into the pipe lent to
/// the body being polled, once `from` has some. `Ready(Ok(Spliced::Bytes))`
/// with the frame that stands for them.
pub(crate) fn fill_lent(
    from: &TcpStream,
    most: usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<Spliced>> {
    let Some(mut lent) = LENT.with(Cell::take) else {
        return Poll::Ready(Ok(Spliced::NotLent));
    };
    let polled = poll_fill(from, &mut lent, most.min(PIPE_SIZE), cx);
    LENT.with(|l| l.set(Some(lent)));
    polled
}

fn poll_fill(
    from: &TcpStream,
    lent: &mut Lent,
    most: usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<Spliced>> {
    if lent.held > 0 {
        return Poll::Ready(Ok(Spliced::NotLent));
    }
    loop {
        ready!(from.poll_read_ready(cx))?;
        if lent.pipe.is_none() {
            // Out of descriptors: the bytes are read instead.
            let Ok(pipe) = Pipe::take() else {
                return Poll::Ready(Ok(Spliced::NotLent));
            };
            lent.pipe = Some(pipe);
        }
        let Some(pipe) = &lent.pipe else {
            return Poll::Ready(Ok(Spliced::NotLent));
        };
        match from.try_io(Interest::READABLE, || into_pipe_at_most(from, pipe, most)) {
            Ok(Filled::Bytes(n)) => {
                lent.held = n;
                return Poll::Ready(Ok(Spliced::Bytes(in_pipe(n))));
            }
            Ok(Filled::End) => return Poll::Ready(Ok(Spliced::End)),
            Ok(Filled::Unspliceable) => return Poll::Ready(Ok(Spliced::Unspliceable)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

/// The data frame that stands for `n` bytes (at most [`PIPE_SIZE`]) in a
/// lent pipe.
fn in_pipe(n: usize) -> Bytes {
    Bytes::from_static(&IN_PIPE[..n])
}

/// Whether `data` is a frame that stands for bytes in a lent pipe.
pub(crate) fn is_in_pipe(data: &Bytes) -> bool {
    !data.is_empty() && std::ptr::eq(data.as_ptr(), IN_PIPE.as_ptr())
}

/// Splices the `held` bytes of `pipe` into `to`, as it takes them.
pub(crate) fn poll_drain(
    pipe: &Pipe,
    held: &mut usize,
    to: &TcpStream,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    while *held > 0 {
        let n = ready!(poll_write(to, cx, || {
            Ok(splice(&pipe.read, None, to, None, *held, flags())?)
        }))?;
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        *held -= n;
    }
    Poll::Ready(Ok(()))
}

#[cfg(test)]
mod tests;
