//! A connection some of whose first bytes were read already, and are
//! given back before the rest. Both roles need one: the server for a TLS
//! port's first bytes, read to tell plain HTTP from TLS, and any port's
//! first request head, read ahead of hyper, or the bytes
//! [`serve`](crate::server::serve) read before it handed a connection to
//! hyper; the client for what the app sent after its `101` (or a `2xx` to
//! `CONNECT`), read with the head, which the tunnel reads first.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`, whose first bytes, read already, are read again from `ahead`.
#[derive(Debug)]
pub struct Rewind<IO> {
    /// What is left to read again; its buffer is freed once it all is.
    ahead: Bytes,
    inner: IO,
}

impl<IO> Rewind<IO> {
    /// `inner`, with `ahead` before it.
    pub fn new(inner: IO, ahead: Bytes) -> Self {
        Self { ahead, inner }
    }

    /// The connection, and what is left to read again before it.
    pub fn into_parts(self) -> (IO, Bytes) {
        (self.inner, self.ahead)
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewind<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.ahead.is_empty() {
            let n = this.ahead.len().min(buf.remaining());
            buf.put_slice(&this.ahead[..n]);
            this.ahead.advance(n);
            if this.ahead.is_empty() {
                this.ahead = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewind<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn gives_back_what_was_read_then_the_rest() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b"world").await.unwrap();
        drop(client);
        let mut io = Rewind::new(server, Bytes::from_static(b"hello"));
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"helloworld");
    }
}
