//! qproxy's own HTTP/1.1 client reading whatever an app writes back: the
//! response head (status line, header fields, `1xx` heads skipped), the
//! body's framing (length, chunks and trailers, or the close) and the
//! body itself. Input: a selector byte (its lowest bit: the request was a
//! `HEAD`), then the app's bytes.
//!
//! It must never panic; a refused head is a `502` text in Go's transport's
//! words; a body is never longer than its `Content-Length` said.

#![no_main]

use libfuzzer_sys::fuzz_target;
use qproxy_transport::client::read_answer;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let head = selector & 1 == 1;
    match read_answer(bytes, head) {
        Err(e) => {
            let text = e.to_string();
            assert!(
                text == "EOF" || text.starts_with("malformed HTTP response: "),
                "{text}"
            );
        }
        Ok(answer) => {
            assert!((100..=999).contains(&answer.status));
            if head || answer.status == 204 || answer.status == 304 {
                assert_eq!(answer.data, 0);
                assert!(answer.complete);
            }
        }
    }
});
