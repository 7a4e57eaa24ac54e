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

use std::cell::RefCell;
use std::io;
use std::os::fd::OwnedFd;

use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags, Shutdown, recv, send, shutdown};
use rustix::pipe::{PipeFlags, SpliceFlags, fcntl_setpipe_size, pipe_with, splice};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// How many bytes a pipe holds: 64 KiB, the kernel's default, which
/// `F_SETPIPE_SZ` makes sure of.
pub const PIPE_SIZE: usize = 64 * 1024;
/// Most pipes a thread keeps for the next copy (two descriptors each).
pub const KEPT_PIPES: usize = 16;
/// The buffer of a copy that cannot splice.
const COPY_BUF: usize = 16 * 1024;

thread_local! {
    static PIPES: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

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
    fn give_back(self) {
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

/// Moves what `from` sends to `to` until `from` ends its side (`Ok`, with
/// what was moved; `to`'s side is left open for the caller to shut), or
/// either fails.
pub async fn copy(from: &TcpStream, to: &TcpStream) -> io::Result<Copied> {
    let mut copied = Copied::default();
    if let Path::Unspliceable = splice_all(from, to, &mut copied).await? {
        copy_through_buffer(from, to, &mut copied).await?;
    }
    Ok(copied)
}

/// How [`splice_all`] ended.
enum Path {
    /// `from` ended its side, every byte moved.
    Ended,
    /// `from` holds bytes that `splice` does not see, or no pipe can be
    /// had (the process is out of descriptors): the rest goes through a
    /// buffer.
    Unspliceable,
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

/// Splices `from` into a pipe and the pipe into `to`, until `from` ends.
/// A pipe is held only while bytes are in it: taken once `from` is
/// readable, given back once it is empty, so that a quiet tunnel holds
/// none.
async fn splice_all(from: &TcpStream, to: &TcpStream, copied: &mut Copied) -> io::Result<Path> {
    loop {
        from.readable().await?;
        let Ok(pipe) = Pipe::take() else {
            return Ok(Path::Unspliceable);
        };
        let filled = match from.try_io(Interest::READABLE, || into_pipe(from, &pipe)) {
            Ok(filled) => filled,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                pipe.give_back();
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut held = match filled {
            Filled::Bytes(n) => n,
            Filled::End => {
                pipe.give_back();
                return Ok(Path::Ended);
            }
            Filled::Unspliceable => {
                pipe.give_back();
                return Ok(Path::Unspliceable);
            }
        };
        // A pipe that still holds bytes when this fails is closed, not
        // kept.
        while held > 0 {
            let n = to
                .async_io(Interest::WRITABLE, || {
                    Ok(splice(&pipe.read, None, to, None, held, flags())?)
                })
                .await?;
            held -= n;
            copied.spliced += n as u64;
        }
        pipe.give_back();
    }
}

/// One splice of `from` into the empty pipe; `WouldBlock` when there is
/// nothing yet. Where the splice would block yet a peek finds bytes,
/// `from` holds bytes outside its receive queue.
fn into_pipe(from: &TcpStream, pipe: &Pipe) -> io::Result<Filled> {
    let ended = match splice_into(from, pipe) {
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
        Ok((_, n)) if n > 0 => match splice_into(from, pipe) {
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

/// One splice of `from` into `pipe`, of at most what a pipe holds.
fn splice_into(from: &TcpStream, pipe: &Pipe) -> rustix::io::Result<usize> {
    splice(from, None, &pipe.write, None, PIPE_SIZE, flags())
}

fn flags() -> SpliceFlags {
    SpliceFlags::MOVE | SpliceFlags::NONBLOCK
}

/// Writes `ahead` (what was read of `from` already) to `to`, then moves
/// what `from` sends, as [`copy`] does.
pub async fn forward(from: &TcpStream, ahead: &[u8], to: &TcpStream) -> io::Result<Copied> {
    write_all(to, ahead).await?;
    let mut copied = copy(from, to).await?;
    copied.copied += ahead.len() as u64;
    Ok(copied)
}

/// Ends `to`'s sending side (a half-close): the far end reads its end.
pub fn shutdown_write(to: &TcpStream) -> io::Result<()> {
    Ok(shutdown(to, Shutdown::Write)?)
}

/// Writes all of `bytes` to `to`.
async fn write_all(to: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    let mut sent = 0;
    while sent < bytes.len() {
        sent += to
            .async_io(Interest::WRITABLE, || {
                Ok(send(
                    to,
                    &bytes[sent..],
                    SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
                )?)
            })
            .await?;
    }
    Ok(())
}

/// Moves what `from` sends to `to` through a buffer, until `from` ends.
async fn copy_through_buffer(
    from: &TcpStream,
    to: &TcpStream,
    copied: &mut Copied,
) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        let n = from
            .async_io(Interest::READABLE, || {
                Ok(recv(from, &mut buf[..], RecvFlags::DONTWAIT)?.1)
            })
            .await?;
        if n == 0 {
            return Ok(());
        }
        write_all(to, &buf[..n]).await?;
        copied.copied += n as u64;
    }
}

#[cfg(test)]
mod tests;
