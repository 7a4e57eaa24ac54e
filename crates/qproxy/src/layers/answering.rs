//! The answers the layers make themselves: the body they take in the
//! stack ([`FromReply`]), and the future of a layer that answers some
//! requests itself and passes the others on ([`Answering`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::header::{CONNECTION, HeaderValue};
use http::{Response, StatusCode};
use pin_project_lite::pin_project;

use qproxy_breaker::PermitBody;
use qproxy_core::body::{Guarded, ReplyBody, Settle};

/// A response body of the stack that can carry one of qproxy's own answers
/// (a [`ReplyBody`]), made by a layer in place of its inner service's.
///
/// `From<ReplyBody>` says the same for the bodies below the breaker; above
/// it, the body holds the breaker's [`PermitBody`], which neither
/// qproxy-core nor qproxy-breaker can convert into without depending on the
/// other, so the layers above the breaker ask for this trait instead.
pub(crate) trait FromReply {
    /// `body` as this body type: one of qproxy's own answers.
    fn from_reply(body: ReplyBody) -> Self;
}

impl FromReply for ReplyBody {
    fn from_reply(body: ReplyBody) -> Self {
        body
    }
}

/// An answer of qproxy's own made above the breaker holds no slot.
impl<B: From<ReplyBody>> FromReply for PermitBody<B> {
    fn from_reply(body: ReplyBody) -> Self {
        PermitBody::new(B::from(body))
    }
}

/// An answer of qproxy's own is observed from its first frame, with
/// nothing to settle.
impl<B: http_body::Body + FromReply, G: Settle> FromReply for Guarded<B, G> {
    fn from_reply(body: ReplyBody) -> Self {
        Guarded::new(B::from_reply(body), None)
    }
}

/// An answer that takes a while to make (a readiness check, say).
pub(crate) type Later = Pin<Box<dyn Future<Output = Response<ReplyBody>> + Send>>;

pin_project! {
    /// The response future of a layer that answers some requests itself
    /// and passes the others on: the inner service's response, or one of
    /// the layer's own, made now or later.
    #[project = AnsweringProj]
    #[allow(missing_docs)]
    pub(crate) enum Answering<F> {
        /// Passed on to the inner service.
        Inner { #[pin] inner: F },
        /// Passed on to the inner service, its response made the
        /// connection's last (`Connection: close`) unless it switches
        /// protocols.
        Last { #[pin] inner: F },
        /// Answered here; taken once polled.
        Now { res: Option<Response<ReplyBody>> },
        /// Answered here, once the answer is made.
        Later { answer: Later },
    }
}

impl<F> Answering<F> {
    /// The inner service's response.
    pub(crate) fn inner(inner: F) -> Self {
        Answering::Inner { inner }
    }

    /// The inner service's response, the last on its connection.
    pub(crate) fn last(inner: F) -> Self {
        Answering::Last { inner }
    }

    /// `res`, at once.
    pub(crate) fn now(res: Response<ReplyBody>) -> Self {
        Answering::Now { res: Some(res) }
    }

    /// The response `answer` makes.
    pub(crate) fn later(
        answer: impl Future<Output = Response<ReplyBody>> + Send + 'static,
    ) -> Self {
        Answering::Later {
            answer: Box::pin(answer),
        }
    }
}

impl<F, B, E> Future for Answering<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: FromReply,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let res = match self.project() {
            AnsweringProj::Inner { inner } => return inner.poll(cx),
            AnsweringProj::Last { inner } => {
                let mut answer = std::task::ready!(inner.poll(cx));
                if let Ok(res) = &mut answer
                    && res.status() != StatusCode::SWITCHING_PROTOCOLS
                {
                    res.headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                }
                return Poll::Ready(answer);
            }
            // Polled again after it completed: it never completes again.
            AnsweringProj::Now { res } => match res.take() {
                Some(res) => res,
                None => return Poll::Pending,
            },
            AnsweringProj::Later { answer } => std::task::ready!(answer.as_mut().poll(cx)),
        };
        Poll::Ready(Ok(res.map(B::from_reply)))
    }
}
