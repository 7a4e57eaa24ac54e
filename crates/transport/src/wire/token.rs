//! Tokens in comma-separated header values (`Connection`,
//! `Transfer-Encoding`, `Upgrade`'s neighbours), matched ASCII
//! case-insensitively with the spaces around each token trimmed.
//!
//! Two readers differ on one point, a value with bytes outside visible
//! ASCII (obs-text): hyper's reads such a value as listing nothing
//! ([`connection_has`]), Go's `httpguts.HeaderValuesContainsToken` still
//! finds the tokens around them ([`any_value_has`]). Each caller keeps the
//! reading of the implementation it stands in for.

use http::header::AsHeaderName;
use http::{HeaderMap, HeaderValue};

/// Whether the comma-separated `list` has `token`.
pub fn list_has(list: &[u8], token: &str) -> bool {
    list.split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Whether a `Connection` value lists `token`, as hyper reads it: a value
/// that is not visible ASCII lists nothing.
pub fn connection_has(value: &HeaderValue, token: &str) -> bool {
    value.to_str().is_ok() && list_has(value.as_bytes(), token)
}

/// Whether any value of `name` has `token` in its list, as Go's
/// `httpguts.HeaderValuesContainsToken` reads them: byte by byte.
pub fn any_value_has(headers: &HeaderMap, name: impl AsHeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|v| list_has(v.as_bytes(), token))
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked`.
pub(crate) fn ends_chunked(value: &HeaderValue) -> bool {
    value
        .to_str()
        .ok()
        .and_then(|s| s.rsplit(',').next())
        .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"))
}

#[cfg(test)]
mod tests {
    use http::header::CONNECTION;

    use super::*;

    #[test]
    fn tokens_are_found_case_insensitively_with_spaces_trimmed() {
        let v = HeaderValue::from_static("keep-alive , Upgrade,close");
        assert!(connection_has(&v, "upgrade"));
        assert!(connection_has(&v, "CLOSE"));
        assert!(connection_has(&v, "keep-alive"));
        assert!(!connection_has(&v, "clos"));
        assert!(!connection_has(&HeaderValue::from_static(""), "close"));
    }

    #[test]
    fn obs_text_hides_every_token_from_hypers_reading_not_from_gos() {
        let v = HeaderValue::from_bytes(b"close, \xe9t\xe9").unwrap();
        assert!(!connection_has(&v, "close"));
        let mut headers = HeaderMap::new();
        headers.append(CONNECTION, HeaderValue::from_static("te"));
        headers.append(CONNECTION, v);
        assert!(any_value_has(&headers, CONNECTION, "close"));
        assert!(any_value_has(&headers, CONNECTION, "TE"));
        assert!(!any_value_has(&headers, CONNECTION, "upgrade"));
    }

    #[test]
    fn chunked_counts_only_as_the_last_coding() {
        assert!(ends_chunked(&HeaderValue::from_static("gzip, Chunked ")));
        assert!(!ends_chunked(&HeaderValue::from_static("chunked, gzip")));
        assert!(!ends_chunked(
            &HeaderValue::from_bytes(b"\xe9, chunked").unwrap()
        ));
    }
}
