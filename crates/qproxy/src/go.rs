//! Values written as Go writes them, where Knative's texts show them to
//! clients or operators.

use std::time::Duration;

/// A whole number of seconds as Go's `time.Duration` prints it: `30s`,
/// `5m0s`, `1h0m0s`.
pub(crate) fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// `s` quoted as Go's `%q` quotes it: printable characters as they are,
/// `"` and `\\` escaped, control characters and invalid UTF-8 as escapes.
pub(crate) fn go_quote(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for chunk in s.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                    out.push_str(&format!("\\x{:02x}", c as u32));
                }
                c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(0)), "0s");
        assert_eq!(go_duration(Duration::from_secs(30)), "30s");
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(go_duration(Duration::from_secs(3661)), "1h1m1s");
    }

    #[test]
    fn quoting_follows_go() {
        assert_eq!(go_quote(b"websocket"), r#""websocket""#);
        assert_eq!(go_quote(b"caf\xc3\xa9"), r#""café""#);
        assert_eq!(go_quote(b"caf\xe9"), r#""caf\xe9""#);
        assert_eq!(go_quote(b"a\"b\\c\td\x01\x7f"), r#""a\"b\\c\td\x01\x7f""#);
    }
}
