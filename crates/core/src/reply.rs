//! The answers qproxy makes itself, shaped as Go's `net/http` shapes them
//! (the metrics servers' `404` among them, so they are here, below every
//! crate that answers).
//!
//! Knative's queue-proxy answers from three places, and Go writes each a
//! little differently, which clients can see:
//!
//! - `http.Error` (the breaker's `503`, the proxy's `502`, the admin
//!   servers' `404`): the text, `text/plain; charset=utf-8` and
//!   `X-Content-Type-Options: nosniff` ([`http_error`], [`not_found`]);
//! - a handler that writes text without a type (the health check's `200
//!   queue`, the timeout's `504`): Go sniffs `text/plain; charset=utf-8`
//!   from the bytes, and there is no `nosniff` ([`text`]);
//! - Go's server itself, refusing a request before any handler: the
//!   reason in the status line and the body, and the connection closed
//!   ([`server_error`]).

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE, HeaderValue, X_CONTENT_TYPE_OPTIONS};
use http::{Response, StatusCode};
use hyper::ext::ReasonPhrase;

use super::body::ReplyBody;

/// The content type Go sniffs from text, and `http.Error` sets.
const TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

/// `text` as a handler writes it without a content type: Go sniffs
/// `text/plain; charset=utf-8` from it.
pub fn text(status: StatusCode, text: impl Into<Bytes>) -> Response<ReplyBody> {
    let mut res = Response::new(ReplyBody::full(text));
    *res.status_mut() = status;
    res.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN);
    res
}

/// Go's `http.Error(w, text, status)`.
pub fn http_error(status: StatusCode, text: impl Into<Bytes>) -> Response<ReplyBody> {
    let mut res = self::text(status, text);
    res.headers_mut()
        .insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    res
}

/// Go's `http.NotFound`.
pub fn not_found() -> Response<ReplyBody> {
    http_error(StatusCode::NOT_FOUND, "404 page not found\n")
}

/// Go's server's own reply to a request it cannot serve: `<code> <reason>`
/// as the status line's reason and as the body, and the connection closed.
pub fn server_error(status: StatusCode, reason: &str) -> Response<ReplyBody> {
    let mut res = text(status, format!("{} {reason}", status.as_u16()));
    res.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    if let Ok(phrase) = ReasonPhrase::try_from(reason.as_bytes().to_vec()) {
        res.extensions_mut().insert(phrase);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_s_three_shapes_of_text() {
        let sniffed = text(StatusCode::GATEWAY_TIMEOUT, "request timeout");
        assert_eq!(sniffed.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
        assert!(!sniffed.headers().contains_key(X_CONTENT_TYPE_OPTIONS));

        let error = not_found();
        assert_eq!(error.status(), StatusCode::NOT_FOUND);
        assert_eq!(error.headers()[X_CONTENT_TYPE_OPTIONS], "nosniff");

        let refused = server_error(
            StatusCode::BAD_REQUEST,
            "Bad Request: malformed Host header",
        );
        assert_eq!(refused.headers()[CONNECTION], "close");
        assert_eq!(
            refused
                .extensions()
                .get::<ReasonPhrase>()
                .map(|p| p.as_bytes()),
            Some(&b"Bad Request: malformed Host header"[..])
        );
    }
}
