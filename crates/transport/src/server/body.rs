//! The request bodies [`serve`](super::serve) reads whole, and how the
//! connection's owner makes its own request body type from them and from
//! hyper's.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Frame, SizeHint};

/// The request body type of the service behind [`serve`](super::serve):
/// the owner's own, made from what the server read.
///
/// Each is given the head's fields, so that what the owner wants to know
/// of them can be found once, as the request comes in.
pub trait MakeBody {
    /// The body of a request without one, whose head has `headers`.
    fn empty(headers: &HeaderMap) -> Self;
    /// A body read whole with its head, whose fields are `headers`.
    fn whole(body: WholeBody, headers: &HeaderMap) -> Self;
    /// The body of a request hyper serves (once the connection is handed
    /// over, or from its start), whose fields are `headers`.
    fn streamed(body: hyper::body::Incoming, headers: &HeaderMap) -> Self;
}

/// A request body read whole by qproxy's own HTTP/1.1 server, which
/// learns through [`BodyRead`] once the stack has read it (or let it go),
/// as Go's server and hyper's learn it when a body is read to its end: only
/// then do they watch the client for a hang-up.
#[derive(Debug)]
pub struct WholeBody {
    data: Bytes,
    read: Arc<AtomicBool>,
}

/// Whether a [`WholeBody`] has been read.
#[derive(Debug)]
pub struct BodyRead(Arc<AtomicBool>);

impl WholeBody {
    /// `data`, and what tells when it has been read.
    pub fn new(data: Bytes) -> (Self, BodyRead) {
        let read = Arc::new(AtomicBool::new(false));
        (
            Self {
                data,
                read: read.clone(),
            },
            BodyRead(read),
        )
    }

    /// How many bytes are left to take.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether no bytes are left to take.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The body's bytes, taken: it has been read.
    pub fn take(&mut self) -> Bytes {
        self.read.store(true, Ordering::Release);
        std::mem::take(&mut self.data)
    }
}

/// One data frame, the whole body, taken by the first poll.
impl http_body::Body for WholeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let data = self.get_mut().take();
        Poll::Ready((!data.is_empty()).then(|| Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len() as u64)
    }
}

impl Drop for WholeBody {
    fn drop(&mut self) {
        self.read.store(true, Ordering::Release);
    }
}

impl BodyRead {
    /// The body has been read, or let go of.
    pub fn is_read(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
