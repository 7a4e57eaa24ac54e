//! The `Forwarded` shim: RFC 7239 `Forwarded` synthesised from the de-facto
//! `X-Forwarded-*` headers when the request carries none.
//!
//! Knative's queue-proxy does this so apps can rely on the standard header
//! whatever the ingress sends. The value is built exactly as Knative builds
//! it (`pkg/queue/forwarded_shim.go`): the first `X-Forwarded-For` node with
//! `host=` and `proto=`, then one `for=` per further node; a node containing
//! `:` is taken for IPv6 and written `"[node]"`. `X-Forwarded-By` is ignored.
//! Only the first value of each header is read.

use http::{HeaderMap, HeaderValue, Request};

use super::Rewrite;
use qproxy_core::facts::{HasFacts, facts};
use qproxy_core::headers::{
    FORWARDED, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO, first_values,
};

/// The shim as a [`Rewrite`]: apply it with
/// [`RewriteLayer`](super::RewriteLayer).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ForwardedShim;

impl Rewrite for ForwardedShim {
    fn rewrite<B: HasFacts>(&self, req: &mut Request<B>) {
        // Most requests carry neither `Forwarded` nor `X-Forwarded-*`:
        // the facts tell, with no pass over the fields.
        if facts(req).wants_forwarded() {
            shim(req.headers_mut());
        }
    }
}

/// Inserts the synthesised `Forwarded` header, if one is due.
pub fn shim(headers: &mut HeaderMap) {
    if let Some(value) = synthesize(headers) {
        headers.insert(FORWARDED, value);
    }
}

/// The `Forwarded` value Knative would synthesise for these headers, or
/// `None` when there is a `Forwarded` header already or no `X-Forwarded-*`.
pub(crate) fn synthesize(headers: &HeaderMap) -> Option<HeaderValue> {
    let [forwarded, xff, xfp, xfh] = first_values(
        headers,
        [
            &FORWARDED,
            &X_FORWARDED_FOR,
            &X_FORWARDED_PROTO,
            &X_FORWARDED_HOST,
        ],
    )
    .map(|v| v.map(HeaderValue::as_bytes).unwrap_or_default());
    if !forwarded.is_empty() {
        return None;
    }
    if xff.is_empty() && xfp.is_empty() && xfh.is_empty() {
        return None;
    }

    let mut out = Vec::with_capacity(xff.len() + xfp.len() + xfh.len() + 16);
    // Knative drops the empty node after a trailing comma ("a," is one node)
    // but keeps empty nodes in the middle ("a,,b" is three).
    let mut nodes = xff
        .strip_suffix(b",")
        .unwrap_or(xff)
        .split(|&b| b == b',')
        // Go's strings.TrimSpace; spaces and tabs are the only whitespace a
        // header value can hold.
        .map(<[u8]>::trim_ascii);
    let node = if xff.is_empty() {
        &[][..]
    } else {
        nodes.next().unwrap_or_default()
    };
    if !xff.is_empty() {
        out.extend_from_slice(b"for=");
        write_node(&mut out, node);
    }
    if !xfh.is_empty() {
        if !node.is_empty() {
            out.push(b';');
        }
        out.extend_from_slice(b"host=");
        out.extend_from_slice(xfh);
    }
    if !xfp.is_empty() {
        if !node.is_empty() || !xfh.is_empty() {
            out.push(b';');
        }
        out.extend_from_slice(b"proto=");
        out.extend_from_slice(xfp);
    }
    if !xff.is_empty() {
        for node in nodes {
            out.extend_from_slice(b", for=");
            write_node(&mut out, node);
        }
    }
    // Every byte came from valid header values or is ASCII punctuation.
    HeaderValue::from_bytes(&out).ok()
}

fn write_node(out: &mut Vec<u8>, node: &[u8]) {
    if node.contains(&b':') {
        out.extend_from_slice(b"\"[");
        out.extend_from_slice(node);
        out.extend_from_slice(b"]\"");
    } else {
        out.extend_from_slice(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fwd(pairs: &[(&str, &str)]) -> Option<String> {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        synthesize(&h).map(|v| v.to_str().unwrap().to_owned())
    }

    // The cases of Knative's forwarded_shim_test.go, and a few of our own.
    #[test]
    fn knative_cases() {
        assert_eq!(fwd(&[]), None);
        assert_eq!(
            fwd(&[("forwarded", "for=a"), ("x-forwarded-for", "b")]),
            None
        );
        assert_eq!(
            fwd(&[("x-forwarded-for", "192.0.2.60")]).as_deref(),
            Some("for=192.0.2.60")
        );
        assert_eq!(
            fwd(&[("x-forwarded-for", "192.0.2.60, 192.0.2.43")]).as_deref(),
            Some("for=192.0.2.60, for=192.0.2.43")
        );
        assert_eq!(
            fwd(&[("x-forwarded-for", "2001:db8:cafe::17")]).as_deref(),
            Some(r#"for="[2001:db8:cafe::17]""#)
        );
        assert_eq!(
            fwd(&[("x-forwarded-proto", "https")]).as_deref(),
            Some("proto=https")
        );
        assert_eq!(
            fwd(&[("x-forwarded-host", "example.com")]).as_deref(),
            Some("host=example.com")
        );
        assert_eq!(
            fwd(&[
                ("x-forwarded-for", "192.0.2.60, 2001:db8:cafe::17"),
                ("x-forwarded-proto", "http"),
                ("x-forwarded-host", "example.com"),
            ])
            .as_deref(),
            Some(r#"for=192.0.2.60;host=example.com;proto=http, for="[2001:db8:cafe::17]""#)
        );
        assert_eq!(
            fwd(&[
                ("x-forwarded-host", "example.com"),
                ("x-forwarded-proto", "https")
            ])
            .as_deref(),
            Some("host=example.com;proto=https")
        );
    }

    #[test]
    fn only_first_values_count() {
        assert_eq!(
            fwd(&[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-forwarded-for", "2.2.2.2")
            ])
            .as_deref(),
            Some("for=1.1.1.1")
        );
        assert_eq!(
            fwd(&[
                ("forwarded", ""),
                ("forwarded", "for=x"),
                ("x-forwarded-for", "3.3.3.3")
            ])
            .as_deref(),
            Some("for=3.3.3.3")
        );
    }

    #[test]
    fn odd_lists_follow_knative_byte_for_byte() {
        // Empty first node: Knative writes "for=" and then no separator.
        assert_eq!(
            fwd(&[("x-forwarded-for", " , 1.2.3.4"), ("x-forwarded-host", "h")]).as_deref(),
            Some("for=host=h, for=1.2.3.4")
        );
        // Empty middle node, trailing comma, tabs.
        assert_eq!(
            fwd(&[("x-forwarded-for", "a,,\tb\t,")]).as_deref(),
            Some("for=a, for=, for=b")
        );
        assert_eq!(fwd(&[("x-forwarded-for", "a,")]).as_deref(), Some("for=a"));
        assert_eq!(
            fwd(&[("x-forwarded-for", "a,,")]).as_deref(),
            Some("for=a, for=")
        );
        assert_eq!(fwd(&[("x-forwarded-for", ",")]).as_deref(), Some("for="));
        // Already bracketed IPv6 is bracketed again, as Knative does.
        assert_eq!(
            fwd(&[("x-forwarded-for", "[::1]:80")]).as_deref(),
            Some(r#"for="[[::1]:80]""#)
        );
    }

    #[test]
    fn layer_inserts_the_header() {
        let mut h = HeaderMap::new();
        h.insert(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.1"));
        shim(&mut h);
        assert_eq!(h[FORWARDED], "for=10.0.0.1");
    }
}
