//! Reads from a connection onto the end of a buffer that grows only by
//! what came.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use tokio::io::{AsyncRead, ReadBuf};

/// Most bytes one read of a head takes: most heads, and small bodies, fit.
pub(crate) const READ_CHUNK: usize = 4096;

/// Reads what the peer has sent, at most [`READ_CHUNK`] bytes, onto the
/// end of `buf`, which grows only by what came: the read lands on the
/// stack first.
pub(crate) fn poll_read_into<IO: AsyncRead + Unpin>(
    io: &mut IO,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    poll_read_at_most(io, buf, READ_CHUNK, cx)
}

/// [`poll_read_into`], reading at most `most` bytes.
pub(crate) fn poll_read_at_most<IO: AsyncRead + Unpin>(
    io: &mut IO,
    buf: &mut BytesMut,
    most: usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    let mut room = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
    let mut read = ReadBuf::uninit(&mut room[..most.min(READ_CHUNK)]);
    ready!(Pin::new(io).poll_read(cx, &mut read))?;
    buf.extend_from_slice(read.filled());
    Poll::Ready(Ok(read.filled().len()))
}
