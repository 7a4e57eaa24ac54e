//! Hop-by-hop headers (RFC 9110 §7.6.1), handled as Go's
//! `httputil.ReverseProxy` handles them, since that is what the app behind a
//! Knative queue-proxy has always seen.
//!
//! Requests: every header named in `Connection` is removed, then the fixed
//! list below; `TE: trailers` is put back when the client offered trailers;
//! for an upgrade, `Connection: Upgrade` and `Upgrade: <protocol>` are put
//! back. Responses: the same removal. In both directions `Trailer` stays:
//! Go removes it but rebuilds it from the trailers it forwards, and the
//! announcement is what lets trailers pass over HTTP/1.1.

use http::HeaderMap;
use http::header::{CONNECTION, HeaderName, HeaderValue, TE, TRAILER, UPGRADE};
use qproxy_transport::wire::token::any_value_has;

use qproxy_core::headers::{HOP_HEADERS, HopFields};

/// What an inbound request asked of the connection, read before its
/// hop-by-hop headers are removed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hop {
    /// The protocol of an `Upgrade` request (`Connection: upgrade` and a
    /// non-empty `Upgrade`).
    pub(crate) upgrade: Option<HeaderValue>,
}

/// Removes the hop-by-hop headers of a request bound upstream and returns
/// the upgrade it asked for, if any.
///
/// An upgrade to `h2c` is declined (the request goes on as plain HTTP/1.1,
/// as RFC 9110 §7.8 allows): Knative's queue-proxy takes that upgrade
/// itself and never passes it to the app, and a tunnel would let the
/// connection's later requests bypass the proxy. Clients that want HTTP/2
/// use prior knowledge, which the main port serves.
pub fn prepare_request(headers: &mut HeaderMap) -> Hop {
    prepare_request_with(headers, HopFields::of(headers))
}

/// [`prepare_request`] of a request whose hop-by-hop fields are known to
/// be `present`.
pub(crate) fn prepare_request_with(headers: &mut HeaderMap, present: HopFields) -> Hop {
    debug_assert_eq!(present, HopFields::of(headers), "stale hop-by-hop facts");
    if present.is_empty() {
        return Hop::default();
    }
    let upgrade = upgrade_type(headers)
        .filter(|p| !p.as_bytes().eq_ignore_ascii_case(b"h2c"))
        .cloned();
    let trailers = any_value_has(headers, &TE, "trailers");
    remove_hop_headers(headers, present);
    if trailers {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
    if let Some(protocol) = &upgrade {
        headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(UPGRADE, protocol.clone());
    }
    Hop { upgrade }
}

/// Removes the hop-by-hop headers of a response bound for the client.
pub fn prepare_response(headers: &mut HeaderMap) {
    let present = HopFields::of(headers);
    if !present.is_empty() {
        remove_hop_headers(headers, present);
    }
}

/// The protocol a message asks to switch to: the first `Upgrade` value when
/// `Connection` lists `upgrade`, and `None` otherwise (or when it is empty).
pub(crate) fn upgrade_type(headers: &HeaderMap) -> Option<&HeaderValue> {
    if !any_value_has(headers, &CONNECTION, "upgrade") {
        return None;
    }
    headers.get(UPGRADE).filter(|v| !v.is_empty())
}

/// Removes the headers `Connection` names and those of [`HOP_HEADERS`] the
/// message has (`present`).
fn remove_hop_headers(headers: &mut HeaderMap, present: HopFields) {
    // `Connection` is the first of them.
    if present.has(0) {
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|t| !t.is_empty())
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            .collect();
        for name in named.iter().filter(|n| **n != TRAILER) {
            headers.remove(name);
        }
    }
    for (i, name) in HOP_HEADERS.iter().enumerate() {
        if present.has(i) {
            headers.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use qproxy_core::headers::header_map as headers;

    fn names(h: &HeaderMap) -> Vec<&str> {
        let mut n: Vec<_> = h.keys().map(HeaderName::as_str).collect();
        n.sort_unstable();
        n
    }

    #[test]
    fn request_drops_fixed_and_named_hop_headers() {
        let mut h = headers(&[
            ("connection", "keep-alive, X-Secret"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic abc"),
            ("proxy-authenticate", "Basic"),
            ("transfer-encoding", "chunked"),
            ("trailer", "x-checksum"),
            ("te", "gzip"),
            ("x-secret", "1"),
            ("upgrade", "websocket"),
            ("x-kept", "yes"),
        ]);
        let hop = prepare_request(&mut h);
        assert_eq!(hop.upgrade, None);
        assert_eq!(names(&h), ["trailer", "x-kept"]);
    }

    #[test]
    fn te_trailers_survives() {
        let mut h = headers(&[
            ("te", "gzip, Trailers"),
            ("content-type", "application/grpc"),
        ]);
        prepare_request(&mut h);
        assert_eq!(h[TE], "trailers");
        let mut h = headers(&[("te", "deflate")]);
        prepare_request(&mut h);
        assert!(h.get(TE).is_none());
    }

    #[test]
    fn upgrade_is_kept_and_normalised() {
        let mut h = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        let hop = prepare_request(&mut h);
        assert_eq!(hop.upgrade.unwrap(), "websocket");
        assert_eq!(h[CONNECTION], "Upgrade");
        assert_eq!(h[UPGRADE], "websocket");
        assert!(h.contains_key("sec-websocket-key"));
    }

    #[test]
    fn upgrade_needs_both_headers() {
        let mut h = headers(&[("upgrade", "websocket")]);
        assert_eq!(prepare_request(&mut h).upgrade, None);
        let mut h = headers(&[("connection", "upgrade")]);
        assert_eq!(prepare_request(&mut h).upgrade, None);
        let mut h = headers(&[("connection", "upgrade"), ("upgrade", "")]);
        assert_eq!(prepare_request(&mut h).upgrade, None);
        let mut h = headers(&[("connection", "close"), ("connection", " UPGRADE ")]);
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        assert_eq!(prepare_request(&mut h).upgrade.unwrap(), "websocket");
    }

    #[test]
    fn h2c_upgrade_is_declined() {
        let mut h = headers(&[
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "H2C"),
            ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
        ]);
        assert_eq!(prepare_request(&mut h).upgrade, None);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn response_keeps_trailer_announcement() {
        let mut h = headers(&[
            ("connection", "close, trailer"),
            ("transfer-encoding", "chunked"),
            ("trailer", "grpc-status"),
            ("keep-alive", "timeout=5"),
            ("content-type", "text/plain"),
        ]);
        prepare_response(&mut h);
        assert_eq!(names(&h), ["content-type", "trailer"]);
    }

    #[test]
    fn invalid_names_in_connection_are_skipped() {
        let mut h = headers(&[("connection", "bad name, x-gone"), ("x-gone", "1")]);
        prepare_request(&mut h);
        assert!(h.is_empty());
    }
}
