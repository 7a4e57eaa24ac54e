//! The Go template engine behind request logs: an arbitrary template
//! parsed and, when it parses, executed against an arbitrary request as
//! the main port logs it. Rendering the same line twice gives the same
//! bytes.
//!
//! Ranges over constants are left out (see below).
//!
//! Input: a selector byte (its lowest bit: the generation; the others
//! pick the status), the template, a NUL byte, then the request: its
//! method and target on the first line, header fields on the next lines
//! up to a blank one, then its body.

#![no_main]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri, Version};
use http_body_util::Full;
use libfuzzer_sys::fuzz_target;
use qproxy::fuzz::request_log_line;
use qproxy_fuzz::{generation, header_fields};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (template, request) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(template) = std::str::from_utf8(template) else {
        return;
    };
    // `range 1000000000` runs a billion times, in Go as here: a cost the
    // operator chooses, not a bug. Ranging over constants is left out;
    // ranging over the request is not.
    if template.contains("range") && template.contains(|c: char| c.is_ascii_digit() || c == '\'') {
        return;
    }
    let Some(req) = request_from(request, selector) else {
        return;
    };
    let remote = SocketAddr::from(([10, 0, 0, 9], 40_123));
    let status = 100 + u16::from(selector >> 1) * 4;
    let latency = Duration::from_micros(u64::from(selector) * 997);
    let line = |_| {
        request_log_line(
            template,
            generation(selector),
            &req,
            remote,
            status,
            12,
            latency,
        )
    };
    assert_eq!(line(()), line(()), "the same request rendered two ways");
});

fn request_from(bytes: &[u8], selector: u8) -> Option<Request<Full<Bytes>>> {
    let (head, body) = match bytes.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&bytes[..i], &bytes[i + 2..]),
        None => (bytes, &[][..]),
    };
    let (line, fields) = match head.iter().position(|&b| b == b'\n') {
        Some(i) => (&head[..i], &head[i + 1..]),
        None => (head, &[][..]),
    };
    let (method, target) = match line.iter().position(|&b| b == b' ') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => (&b"GET"[..], line),
    };
    let mut req = Request::new(Full::new(Bytes::copy_from_slice(body)));
    *req.method_mut() = Method::from_bytes(method).ok()?;
    *req.uri_mut() = Uri::try_from(target).ok()?;
    *req.version_mut() = match selector >> 6 {
        0 => Version::HTTP_11,
        1 => Version::HTTP_10,
        _ => Version::HTTP_2,
    };
    *req.headers_mut() = header_fields(fields);
    Some(req)
}
