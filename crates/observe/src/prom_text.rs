//! The Prometheus text format's rules that qproxy's own families need
//! where no exporter writes them for it.

use std::fmt::{Display, Write as _};

/// Appends a gauge family of one sample, `name{labels} value`, with its
/// help and type, to `out`.
pub fn gauge(out: &mut String, name: &str, help: &str, labels: &str, value: impl Display) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    let _ = writeln!(out, "{name}{{{labels}}} {value}");
}

/// `name="value"`, the value escaped as the text format escapes a label
/// value: backslash, double quote and line feed.
pub fn label(name: &str, value: &str) -> String {
    let mut out = String::with_capacity(name.len() + value.len() + 3);
    out.push_str(name);
    out.push_str("=\"");
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_value_is_escaped_as_the_text_format_says() {
        assert_eq!(label("pod_name", "p-1"), r#"pod_name="p-1""#);
        assert_eq!(
            label("service_name", "a\\b\"c\nd"),
            r#"service_name="a\\b\"c\nd""#
        );
    }
}
