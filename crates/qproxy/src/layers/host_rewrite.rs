//! `K-Original-Host` back into `Host`.
//!
//! The activator moves the original `Host` into `K-Original-Host` so that a
//! mesh does not route on it; the queue-proxy undoes that before the app
//! sees the request (knative.dev/networking `header.RewriteHostOut`). A
//! non-empty `K-Original-Host` becomes the request's host and is removed.
//! Kubelet probes are left untouched, as Knative's proxy handler skips them.

use http::header::HOST;
use http::uri::Uri;
use http::{HeaderMap, Request};

use super::Rewrite;
use qproxy_core::facts::{HasFacts, facts};
use qproxy_core::headers::K_ORIGINAL_HOST;

/// The rewrite as a [`Rewrite`], skipping kubelet probes: apply it with
/// [`RewriteLayer`](super::RewriteLayer).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HostRewrite;

impl Rewrite for HostRewrite {
    fn rewrite<B: HasFacts>(&self, req: &mut Request<B>) {
        // Most requests carry no `K-Original-Host`: the facts tell, with
        // no lookup.
        let facts = facts(req);
        if facts.has_original_host() && !facts.is_kubelet_probe() {
            rewrite(req);
        }
    }
}

/// Applies `K-Original-Host`, if any, to the request.
///
/// The host of a request lives in the URI when the client sent one (HTTP/2
/// `:authority`, HTTP/1 absolute-form) and in `Host` otherwise; the proxy
/// reads it in that order. So the original host goes into `Host` and the
/// URI is reduced to its path.
pub fn rewrite<B>(req: &mut Request<B>) {
    let Some(original) = take_original_host(req.headers_mut()) else {
        return;
    };
    req.headers_mut().insert(HOST, original);
    if req.uri().authority().is_some() {
        let mut parts = std::mem::take(req.uri_mut()).into_parts();
        parts.scheme = None;
        parts.authority = None;
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        *req.uri_mut() = Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"));
    }
}

fn take_original_host(headers: &mut HeaderMap) -> Option<http::HeaderValue> {
    let value = headers.get(K_ORIGINAL_HOST)?;
    if value.is_empty() {
        return None;
    }
    let value = value.clone();
    headers.remove(K_ORIGINAL_HOST);
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn original_host_becomes_host() {
        let mut req = request(
            "/path?q=1",
            &[
                ("host", "activator-svc"),
                ("k-original-host", "app.example.com"),
            ],
        );
        rewrite(&mut req);
        assert_eq!(req.headers()[HOST], "app.example.com");
        assert!(req.headers().get(K_ORIGINAL_HOST).is_none());
        assert_eq!(req.uri(), "/path?q=1");
    }

    #[test]
    fn uri_authority_yields_to_original_host() {
        let mut req = request(
            "http://activator-svc/path",
            &[("k-original-host", "app.example.com")],
        );
        rewrite(&mut req);
        assert_eq!(req.headers()[HOST], "app.example.com");
        assert_eq!(req.uri(), "/path");
    }

    #[test]
    fn without_or_with_empty_header_nothing_changes() {
        let mut req = request("/", &[("host", "a")]);
        rewrite(&mut req);
        assert_eq!(req.headers()[HOST], "a");

        let mut req = request("/", &[("host", "a"), ("k-original-host", "")]);
        rewrite(&mut req);
        assert_eq!(req.headers()[HOST], "a");
        assert_eq!(req.headers()[K_ORIGINAL_HOST], "");
    }

    #[test]
    fn all_values_are_removed() {
        let mut req = request(
            "/",
            &[("k-original-host", "first"), ("k-original-host", "second")],
        );
        rewrite(&mut req);
        assert_eq!(req.headers()[HOST], "first");
        assert!(req.headers().get(K_ORIGINAL_HOST).is_none());
    }

    #[test]
    fn kubelet_probes_are_left_alone() {
        use std::convert::Infallible;
        use tower::{Layer, ServiceExt};

        let inner = tower::service_fn(|req: Request<()>| async move {
            Ok::<_, Infallible>(req.headers().get(HOST).cloned())
        });
        let svc = super::super::RewriteLayer::new(HostRewrite).layer(inner);
        let probe = request(
            "/",
            &[
                ("host", "a"),
                ("k-original-host", "b"),
                ("user-agent", "kube-probe/1.30"),
            ],
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let host = rt.block_on(svc.oneshot(probe)).unwrap();
        assert_eq!(host.unwrap(), "a");
    }
}
