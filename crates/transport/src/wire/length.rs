//! `Content-Length`, read as hyper reads it.

use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderValue};

/// A `Content-Length` that is not one length: a value that is not ASCII
/// digits, or values that disagree.
#[derive(Debug)]
pub struct InvalidLength;

/// The length a message's `Content-Length` declares, read as hyper reads
/// it: every value (each a comma-separated list) ASCII digits, and all the
/// same. `None` when there is no `Content-Length`.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, InvalidLength> {
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        add_length(&mut length, value)?;
    }
    Ok(length)
}

/// Reads one `Content-Length` value into `length`, the one its values
/// before it declared.
pub(crate) fn add_length(
    length: &mut Option<u64>,
    value: &HeaderValue,
) -> Result<(), InvalidLength> {
    let mut add = |n: u64| {
        if length.is_some_and(|l| l != n) {
            return Err(InvalidLength);
        }
        *length = Some(n);
        Ok(())
    };
    // Almost every value is one length, in digits alone.
    if let Some(n) = digits(value.as_bytes()) {
        return add(n);
    }
    let text = value.to_str().map_err(|_| InvalidLength)?;
    for part in text.split(',') {
        add(digits(part.trim().as_bytes()).ok_or(InvalidLength)?)?;
    }
    Ok(())
}

/// A decimal number of ASCII digits only (no sign), as hyper reads a
/// `Content-Length`: `None` if empty, anything but digits, or past
/// `u64::MAX`.
pub(crate) fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_read_as_hyper_reads_them() {
        for (text, want) in [
            ("0", Some(0)),
            ("007", Some(7)),
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None),
            ("", None),
            ("+1", None),
            ("-1", None),
            ("1 ", None),
            ("0x1", None),
        ] {
            assert_eq!(digits(text.as_bytes()), want, "{text:?}");
        }
        let length = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(CONTENT_LENGTH, HeaderValue::from_str(v).unwrap());
            }
            content_length(&headers).ok()
        };
        assert_eq!(length(&[]), Some(None));
        assert_eq!(length(&["5"]), Some(Some(5)));
        assert_eq!(length(&["5, 5", " 5 "]), Some(Some(5)));
        assert_eq!(length(&["5", "5,5"]), Some(Some(5)));
        assert_eq!(length(&["5", "6"]), None);
        assert_eq!(length(&["5,6"]), None);
        assert_eq!(length(&["5,"]), None);
        assert_eq!(length(&["five"]), None);
        assert_eq!(length(&["18446744073709551616"]), None);
    }
}
