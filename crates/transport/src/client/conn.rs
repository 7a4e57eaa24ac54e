//! A connection to the app that qproxy speaks HTTP/1.1 on itself.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::net::TcpStream;

use super::Uploading;
use crate::pool::Pooled;

/// An HTTP/1.1 connection to the app that qproxy speaks itself. It lives
/// on the heap, made once per connection, so that the request's future and
/// the response's body, which hold it in turn, move a pointer with every
/// move rather than the whole of it.
#[derive(Debug)]
pub struct Conn(pub(crate) Box<Link>);

/// What a [`Conn`] holds: its socket and what it keeps from one response
/// to the next.
#[derive(Debug)]
pub struct Link {
    /// The socket.
    pub(crate) tcp: TcpStream,
    /// Our end, for error texts.
    pub(crate) local: SocketAddr,
    /// Where the next response is read: empty, and, once the connection
    /// has served a response whose head and body came in one read, that
    /// read's memory, used again when nothing holds it any more.
    pub(crate) buf: BytesMut,
    /// How long it may wait idle after its last response, in
    /// milliseconds, as the app announced it (0: as long as qproxy keeps
    /// any).
    pub(crate) keep_ms: u32,
    /// The rest of a request body, still being written when its response
    /// came (written on by the response's body).
    pub(crate) upload: Option<Box<dyn Uploading>>,
    /// Its bytes come outside its TCP receive queue (the accelerator's
    /// redirect): they are never spliced from it.
    pub(crate) redirected: bool,
}

impl std::ops::Deref for Conn {
    type Target = Link;

    fn deref(&self) -> &Link {
        &self.0
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Link {
        &mut self.0
    }
}

impl Conn {
    /// A connection just made, whose end is `local`.
    pub fn new(tcp: TcpStream, local: SocketAddr) -> Self {
        Self(Box::new(Link {
            tcp,
            local,
            buf: BytesMut::new(),
            keep_ms: 0,
            upload: None,
            redirected: false,
        }))
    }

    /// Our end of it.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// The socket, and what the app sent after the head just read: an
    /// upgraded connection (or a `CONNECT`'s), for its tunnel.
    pub fn into_io(self) -> (TcpStream, Bytes) {
        let Link { tcp, buf, .. } = *self.0;
        (tcp, buf.freeze())
    }
}

impl Pooled for Conn {
    fn keep(&self) -> Option<Duration> {
        (self.0.keep_ms > 0).then(|| Duration::from_millis(u64::from(self.0.keep_ms)))
    }

    /// An idle connection the app has closed (or written to unasked) reads
    /// something; an open one would block. Costs no system call unless the
    /// socket turned readable since it was last read dry.
    fn is_closed(&self) -> bool {
        let mut probe = [0u8; 1];
        !matches!(self.tcp.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}
