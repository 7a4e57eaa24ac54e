//! The per-request header rules on arbitrary requests: the
//! `K-Original-Host` rewrite, the `Forwarded` shim and the hop-by-hop
//! preparation of the request and of a response. The input's first line is
//! the request target, the others its header fields (`name: value`).

#![no_main]

use http::header::{CONNECTION, HOST, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, Request, Uri};
use libfuzzer_sys::fuzz_target;
use qproxy::headers::{Hop, forwarded_shim, host_rewrite, prepare_request, prepare_response};
use qproxy_fuzz::header_fields;

const ALWAYS_HOP: [&str; 8] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "transfer-encoding",
    "upgrade",
];

fuzz_target!(|data: &[u8]| {
    let (target, fields) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(uri) = Uri::try_from(target) else {
        return;
    };
    let mut req = Request::new(());
    *req.uri_mut() = uri;
    *req.headers_mut() = header_fields(fields);
    let before = req.headers().clone();

    // K-Original-Host: a non-empty one becomes the host and goes away.
    host_rewrite(&mut req);
    match before.get("k-original-host").filter(|v| !v.is_empty()) {
        Some(original) => {
            assert_eq!(req.headers().get(HOST), Some(original));
            assert!(req.headers().get("k-original-host").is_none());
            assert!(req.uri().authority().is_none());
        }
        None => assert_eq!(req.headers(), &before),
    }

    // Forwarded: synthesised only when absent and some X-Forwarded-* is set.
    let rewritten = req.headers().clone();
    forwarded_shim(req.headers_mut());
    let first = |h: &HeaderMap, name: &str| h.get(name).is_some_and(|v| !v.is_empty());
    if first(&rewritten, "forwarded") {
        assert_eq!(req.headers(), &rewritten);
    } else if ["x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"]
        .iter()
        .any(|n| first(&rewritten, n))
    {
        assert!(req.headers().contains_key("forwarded"));
    }

    // Hop-by-hop: gone, but for what is put back on purpose.
    let shimmed = req.headers().clone();
    let upgrading = prepare_request(req.headers_mut()) != Hop::default();
    let headers = req.headers();
    for name in [
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
    ] {
        assert!(!headers.contains_key(name), "{name} left in the request");
    }
    assert!(!headers.contains_key(TRANSFER_ENCODING));
    if let Some(te) = headers.get(TE) {
        assert_eq!(te, "trailers");
    }
    assert_eq!(headers.contains_key(UPGRADE), upgrading);
    if let Some(connection) = headers.get(CONNECTION) {
        assert_eq!(connection, "Upgrade");
        assert!(upgrading);
    }
    // `Trailer` stays even when `Connection` names it (see `proxy::hop`).
    for token in named_in_connection(&shimmed) {
        if !["connection", "upgrade", "te", "trailer"].contains(&token.as_str()) {
            assert!(
                !headers.contains_key(&token),
                "{token} named in Connection survived"
            );
        }
    }

    // A response with the same fields loses every hop-by-hop one, `Trailer`
    // again excepted.
    let mut response = shimmed;
    let named = named_in_connection(&response)
        .into_iter()
        .filter(|name| name != "trailer");
    prepare_response(&mut response);
    for name in ALWAYS_HOP.iter().map(|s| s.to_string()).chain(named) {
        assert!(!response.contains_key(&name), "{name} left in the response");
    }
});

/// The valid header names listed in `Connection`, lowercased.
fn named_in_connection(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| http::HeaderName::from_bytes(t.as_bytes()).is_ok())
        .collect()
}
