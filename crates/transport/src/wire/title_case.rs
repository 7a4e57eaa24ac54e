//! Header names written in title case, as hyper writes them when asked
//! to (and Go always does).

use http::{HeaderName, HeaderValue};

/// Writes a header line, its name in [title case](title_case).
pub(crate) fn header_line(dst: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    // A standard name is spelt out by a table lookup: once.
    let name = name.as_str();
    dst.reserve(name.len() + value.len() + 4);
    title_case(dst, name);
    dst.extend_from_slice(b": ");
    dst.extend_from_slice(value.as_bytes());
    dst.extend_from_slice(b"\r\n");
}

/// Writes `name` as hyper writes header names in title case (and Go
/// writes them): the first letter and each one after a `-` upper-cased.
pub(crate) fn title_case(dst: &mut Vec<u8>, name: &str) {
    let start = dst.len();
    dst.extend_from_slice(name.as_bytes());
    let mut word = &mut dst[start..];
    while let Some(first) = word.first_mut() {
        first.make_ascii_uppercase();
        let Some(dash) = word.iter().position(|&c| c == b'-') else {
            break;
        };
        word = &mut std::mem::take(&mut word)[dash + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_title_cased_after_every_dash() {
        for (name, want) in [
            ("host", "Host"),
            ("x-forwarded-for", "X-Forwarded-For"),
            ("a--b", "A--B"),
            ("-a-", "-A-"),
            ("k-1x", "K-1x"),
        ] {
            let mut dst = b"GET / HTTP/1.1\r\n".to_vec();
            title_case(&mut dst, HeaderName::from_static(name).as_str());
            assert_eq!(&dst[16..], want.as_bytes(), "{name}");
        }
    }
}
