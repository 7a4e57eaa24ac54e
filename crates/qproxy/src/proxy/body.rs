//! The response body of the main port: streamed from the user container by
//! whichever client carried the request, or made by qproxy.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::timing::Timing;
use qproxy_core::body::ReplyBody;
use qproxy_transport::client::{ResponseBody, ResponseBodyError};
use qproxy_transport::connector::h2c::H2cBody;

/// A response body: streamed from the user container, or made by qproxy.
///
/// Upstream bodies are passed through frame by frame (data as the app writes
/// it, then trailers), never collected.
#[derive(Debug)]
pub(crate) enum ProxyBody {
    /// Streamed from the user container over HTTP/1.1, its connection
    /// handed back at the body's end.
    App(ResponseBody),
    /// Streamed from the user container over h2c, by qproxy's own client.
    H2c(H2cBody),
    /// A body qproxy made itself (error texts, probe answers).
    Reply(ReplyBody),
    /// A gRPC answer that adds `Server-Timing` to its trailers (boxed: it
    /// is rare, and every body is moved through the stack).
    Timed(Box<TimedBody>),
}

/// Why a response body from the user container failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyBodyError {
    /// Read by qproxy's HTTP/1.1 client.
    #[error(transparent)]
    App(#[from] ResponseBodyError),
    /// Read from an h2c stream of qproxy's own client.
    #[error("error reading a body from connection")]
    H2(#[from] h2::Error),
}

impl http_body::Body for ProxyBody {
    type Data = Bytes;
    type Error = ProxyBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ProxyBodyError>>> {
        let polled = match self.get_mut() {
            ProxyBody::App(b) => Pin::new(b).poll_frame(cx).map_err(ProxyBodyError::from),
            ProxyBody::H2c(b) => Pin::new(b).poll_frame(cx).map_err(ProxyBodyError::from),
            ProxyBody::Reply(b) => {
                return Pin::new(b)
                    .poll_frame(cx)
                    .map(|f| f.map(|f| f.map_err(|e| match e {})));
            }
            // The body inside says if it failed.
            ProxyBody::Timed(b) => return b.poll_frame(cx),
        };
        if let Poll::Ready(Some(Err(e))) = &polled {
            tracing::debug!(error = %e, "response body from the user container failed");
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::App(b) => b.is_end_stream(),
            ProxyBody::H2c(b) => b.is_end_stream(),
            ProxyBody::Reply(b) => b.is_end_stream(),
            ProxyBody::Timed(b) => b.body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::App(b) => b.size_hint(),
            ProxyBody::H2c(b) => b.size_hint(),
            ProxyBody::Reply(b) => b.size_hint(),
            ProxyBody::Timed(b) => b.body.size_hint(),
        }
    }
}

impl ProxyBody {
    /// This body, adding `timing`'s `Server-Timing` to its trailers.
    pub(crate) fn timed(self, timing: Timing) -> Self {
        ProxyBody::Timed(Box::new(TimedBody { body: self, timing }))
    }
}

/// A gRPC answer's body, which adds `Server-Timing` to its trailers.
#[derive(Debug)]
pub(crate) struct TimedBody {
    body: ProxyBody,
    timing: Timing,
}

impl TimedBody {
    /// The inner body's next frame, trailers with the field added. Kept
    /// out of [`ProxyBody`]'s own: every other body goes through that.
    #[cold]
    #[inline(never)]
    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ProxyBodyError>>> {
        let mut polled = http_body::Body::poll_frame(Pin::new(&mut self.body), cx);
        if let Poll::Ready(Some(Ok(frame))) = &mut polled
            && let Some(trailers) = frame.trailers_mut()
        {
            self.timing.add_to(trailers);
        }
        polled
    }
}

impl From<ResponseBody> for ProxyBody {
    fn from(body: ResponseBody) -> Self {
        ProxyBody::App(body)
    }
}

impl From<ReplyBody> for ProxyBody {
    fn from(body: ReplyBody) -> Self {
        ProxyBody::Reply(body)
    }
}
