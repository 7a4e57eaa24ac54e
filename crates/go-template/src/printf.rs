//! The part of Go's `fmt` that templates reach: `printf` with the common
//! verbs, flags, widths and precisions, and Go's quoting and printable
//! rules.

use crate::float::{EXACT_DIGITS, digits, exp_form, float_g, special};
use crate::value::Value;

/// One `printf` directive's flags.
#[derive(Default, Clone, Copy)]
struct Spec {
    minus: bool,
    plus: bool,
    sharp: bool,
    space: bool,
    zero: bool,
    width: Option<usize>,
    precision: Option<usize>,
}

impl Spec {
    /// Pads `s` (already signed) to the width.
    fn pad(&self, s: &[u8], numeric: bool, out: &mut Vec<u8>) {
        let len = std::str::from_utf8(s).map_or(s.len(), |s| s.chars().count());
        let fill = self.width.map_or(0, |w| w.saturating_sub(len));
        if self.minus {
            out.extend_from_slice(s);
            out.extend(std::iter::repeat_n(b' ', fill));
        } else if self.zero && numeric {
            let sign = usize::from(matches!(s.first(), Some(b'-' | b'+' | b' ')));
            out.extend_from_slice(&s[..sign]);
            out.extend(std::iter::repeat_n(b'0', fill));
            out.extend_from_slice(&s[sign..]);
        } else {
            out.extend(std::iter::repeat_n(b' ', fill));
            out.extend_from_slice(s);
        }
    }

    fn sign(&self, negative: bool) -> &'static str {
        if negative {
            "-"
        } else if self.plus {
            "+"
        } else if self.space {
            " "
        } else {
            ""
        }
    }
}

/// A width or precision Go's `fmt` refuses.
struct TooLarge;

/// Go's `fmt.Sprintf`.
pub fn sprintf(format: &[u8], args: &[Value<'_>], out: &mut Vec<u8>) {
    let mut next = 0;
    let mut i = 0;
    while i < format.len() {
        let c = format[i];
        if c != b'%' {
            let start = i;
            while i < format.len() && format[i] != b'%' {
                i += 1;
            }
            out.extend_from_slice(&format[start..i]);
            continue;
        }
        i += 1;
        let mut spec = Spec::default();
        while let Some(&f) = format.get(i) {
            match f {
                b'-' => spec.minus = true,
                b'+' => spec.plus = true,
                b'#' => spec.sharp = true,
                b' ' => spec.space = true,
                b'0' => spec.zero = true,
                _ => break,
            }
            i += 1;
        }
        // Go's `parsenum`: a width or precision past a million is taken
        // for garbage, and the rest of the format with it.
        let number = |i: &mut usize| -> Result<Option<usize>, TooLarge> {
            let mut num = None;
            while let Some(&d) = format.get(*i).filter(|d| d.is_ascii_digit()) {
                let n: usize = num.unwrap_or(0);
                if n > 1_000_000 {
                    return Err(TooLarge);
                }
                num = Some(n * 10 + usize::from(d - b'0'));
                *i += 1;
            }
            Ok(num)
        };
        let parsed = number(&mut i).and_then(|width| {
            spec.width = width;
            // A `.` that ends the format is the verb, not a precision.
            if format.get(i) == Some(&b'.') && i + 1 < format.len() {
                i += 1;
                spec.precision = Some(number(&mut i)?.unwrap_or(0));
            }
            Ok(())
        });
        if parsed.is_err() {
            out.extend_from_slice(b"%!(NOVERB)");
            break;
        }
        let Some(&verb) = format.get(i) else {
            out.extend_from_slice(b"%!(NOVERB)");
            break;
        };
        // A verb is one (UTF-8) character.
        let verb_len = std::str::from_utf8(&format[i..])
            .ok()
            .and_then(|s| s.chars().next())
            .map_or(1, char::len_utf8);
        let verb_bytes = &format[i..i + verb_len];
        i += verb_len;
        if verb == b'%' {
            out.push(b'%');
            continue;
        }
        match args.get(next) {
            None => {
                out.extend_from_slice(b"%!");
                out.extend_from_slice(verb_bytes);
                out.extend_from_slice(b"(MISSING)");
            }
            Some(arg) => {
                next += 1;
                if verb_len != 1 || !format_one(verb, spec, arg, out) {
                    bad_verb(verb_bytes, spec, arg, out);
                }
            }
        }
    }
    if next < args.len() {
        out.extend_from_slice(b"%!(EXTRA ");
        for (n, arg) in args[next..].iter().enumerate() {
            if n > 0 {
                out.extend_from_slice(b", ");
            }
            out.extend_from_slice(arg.type_name().as_bytes());
            out.push(b'=');
            arg.write_v(out);
        }
        out.push(b')');
    }
}

/// `%!v(type=value)`.
/// The value is printed with `%v` and the verb's flags, width and
/// precision, as Go's `badVerb` prints it.
fn bad_verb(verb: &[u8], spec: Spec, arg: &Value<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"%!");
    out.extend_from_slice(verb);
    out.push(b'(');
    if let Value::Nil | Value::Missing = arg {
        out.extend_from_slice(b"<nil>");
    } else {
        out.extend_from_slice(arg.type_name().as_bytes());
        out.push(b'=');
        if !format_one(b'v', spec, arg, out) {
            arg.write_v(out);
        }
    }
    out.push(b')');
}

/// Formats `arg` with `verb`; false when the verb does not apply to it.
fn format_one(verb: u8, spec: Spec, arg: &Value<'_>, out: &mut Vec<u8>) -> bool {
    let mut s = Vec::new();
    let numeric;
    match (verb, arg) {
        (b'T', _) => {
            s.extend_from_slice(arg.type_name().as_bytes());
            numeric = false;
        }
        (b'v', Value::Float(f)) => {
            s = float_g(*f, spec.precision, spec.plus).into_bytes();
            numeric = true;
        }
        (b'v' | b'd', Value::Int(n)) => {
            s = format!("{}{}", spec.sign(*n < 0), n.unsigned_abs()).into_bytes();
            numeric = true;
        }
        (b'v', Value::List(items)) => {
            s.push(b'[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    s.push(b' ');
                }
                let inner = Spec {
                    width: spec.width,
                    minus: spec.minus,
                    ..Spec::default()
                };
                format_one(b'v', inner, item, &mut s);
            }
            s.push(b']');
            out.extend_from_slice(&s);
            return true;
        }
        (b'v' | b's', Value::Str(v)) => {
            let v = match spec.precision {
                Some(p) => truncate_chars(v, p),
                None => v,
            };
            s.extend_from_slice(v);
            numeric = false;
        }
        (b'v', _) => {
            arg.write_v(&mut s);
            numeric = false;
        }
        (b's', Value::List(items)) => {
            s.push(b'[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    s.push(b' ');
                }
                if !format_one(b's', spec, item, &mut s) {
                    bad_verb(b"s", spec, item, &mut s);
                }
            }
            s.push(b']');
            out.extend_from_slice(&s);
            return true;
        }
        (b't', Value::Bool(b)) => {
            s.extend_from_slice(if *b { b"true" } else { b"false" });
            numeric = false;
        }
        (b'f' | b'F', Value::Float(f)) => {
            s = float_f(*f, spec.precision.unwrap_or(6), spec).into_bytes();
            numeric = true;
        }
        (b'e' | b'E', Value::Float(f)) => {
            let body = match special(f.abs(), false) {
                Some(sp) if !f.is_finite() => sp,
                _ => {
                    let p = spec.precision.unwrap_or(6);
                    let (digits, exp) = if *f == 0.0 {
                        (vec![b'0'; p + 1], 0)
                    } else {
                        digits(f.abs(), Some(p + 1))
                    };
                    exp_form(&digits, exp, p)
                }
            };
            let body = if verb == b'E' {
                body.to_uppercase()
            } else {
                body
            };
            s = format!(
                "{}{}",
                spec.sign(f.is_sign_negative()),
                body.trim_start_matches(['+', '-'])
            )
            .into_bytes();
            numeric = true;
        }
        (b'g' | b'G', Value::Float(f)) => {
            let body = float_g(*f, spec.precision, spec.plus);
            s = if verb == b'G' {
                body.to_uppercase()
            } else {
                body
            }
            .into_bytes();
            numeric = true;
        }
        (b'x' | b'X', Value::Int(n)) => {
            let digits = if verb == b'x' {
                format!("{:x}", n.unsigned_abs())
            } else {
                format!("{:X}", n.unsigned_abs())
            };
            let prefix = match (spec.sharp, verb) {
                (true, b'x') => "0x",
                (true, _) => "0X",
                _ => "",
            };
            s = format!("{}{prefix}{digits}", spec.sign(*n < 0)).into_bytes();
            numeric = true;
        }
        (b'x' | b'X', Value::Str(v)) => {
            for b in v.iter() {
                s.extend_from_slice(
                    if verb == b'x' {
                        format!("{b:02x}")
                    } else {
                        format!("{b:02X}")
                    }
                    .as_bytes(),
                );
            }
            numeric = false;
        }
        (b'q', Value::Str(v)) => {
            quote(v, &mut s);
            numeric = false;
        }
        (b'c', Value::Int(n)) => {
            let c = u32::try_from(*n)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or('\u{FFFD}');
            s.extend_from_slice(c.to_string().as_bytes());
            numeric = false;
        }
        (b'U', Value::Int(n)) => {
            s = format!("U+{:04X}", n).into_bytes();
            numeric = false;
        }
        (b'o', Value::Int(n)) => {
            s = format!("{}{:o}", spec.sign(*n < 0), n.unsigned_abs()).into_bytes();
            numeric = true;
        }
        (b'b', Value::Int(n)) => {
            s = format!("{}{:b}", spec.sign(*n < 0), n.unsigned_abs()).into_bytes();
            numeric = true;
        }
        _ => return false,
    }
    spec.pad(&s, numeric, out);
    true
}

fn truncate_chars(v: &[u8], chars: usize) -> &[u8] {
    match std::str::from_utf8(v) {
        Ok(s) => s.char_indices().nth(chars).map_or(v, |(at, _)| &v[..at]),
        Err(_) => &v[..v.len().min(chars)],
    }
}

fn float_f(f: f64, precision: usize, spec: Spec) -> String {
    if !f.is_finite() {
        return special(f, spec.plus).unwrap_or_default();
    }
    let mut body = format!("{:.*}", precision.min(EXACT_DIGITS), f.abs());
    body.extend(std::iter::repeat_n(
        '0',
        precision.saturating_sub(EXACT_DIGITS),
    ));
    format!("{}{body}", spec.sign(f.is_sign_negative()))
}

/// Go's `strconv.Quote`.
pub(crate) fn quote(v: &[u8], out: &mut Vec<u8>) {
    out.push(b'"');
    let mut rest = v;
    while !rest.is_empty() {
        let (c, len) = match std::str::from_utf8(&rest[..rest.len().min(4)]) {
            Ok(s) => s.chars().next().map(|c| (Some(c), c.len_utf8())),
            Err(e) if e.valid_up_to() > 0 => std::str::from_utf8(&rest[..e.valid_up_to()])
                .ok()
                .and_then(|s| s.chars().next())
                .map(|c| (Some(c), c.len_utf8())),
            Err(_) => None,
        }
        .unwrap_or((None, 1));
        match c {
            None => out.extend_from_slice(format!("\\x{:02x}", rest[0]).as_bytes()),
            Some('"') => out.extend_from_slice(b"\\\""),
            Some('\\') => out.extend_from_slice(b"\\\\"),
            Some('\x07') => out.extend_from_slice(b"\\a"),
            Some('\x08') => out.extend_from_slice(b"\\b"),
            Some('\x0c') => out.extend_from_slice(b"\\f"),
            Some('\n') => out.extend_from_slice(b"\\n"),
            Some('\r') => out.extend_from_slice(b"\\r"),
            Some('\t') => out.extend_from_slice(b"\\t"),
            Some('\x0b') => out.extend_from_slice(b"\\v"),
            Some(c) if is_print(c) => out.extend_from_slice(&rest[..len]),
            Some(c) if (c as u32) < 0x80 => {
                out.extend_from_slice(format!("\\x{:02x}", c as u32).as_bytes())
            }
            Some(c) if (c as u32) < 0x10000 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
            }
            Some(c) => out.extend_from_slice(format!("\\U{:08x}", c as u32).as_bytes()),
        }
        rest = &rest[len..];
    }
    out.push(b'"');
}

/// Go's `unicode.IsPrint`: letters, marks, numbers, punctuation, symbols
/// and the ASCII space.
pub(crate) fn is_print(c: char) -> bool {
    use unicode_general_category::{GeneralCategory as G, get_general_category};
    if c == ' ' {
        return true;
    }
    !matches!(
        get_general_category(c),
        G::Control
            | G::Format
            | G::Surrogate
            | G::PrivateUse
            | G::Unassigned
            | G::SpaceSeparator
            | G::LineSeparator
            | G::ParagraphSeparator
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn printf(format: &str, args: &[Value<'_>]) -> String {
        let mut out = Vec::new();
        sprintf(format.as_bytes(), args, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn printf_verbs() {
        assert_eq!(
            printf(
                "%d|%5d|%-5d|%05d",
                &[
                    Value::Int(3),
                    Value::Int(-42),
                    Value::Int(7),
                    Value::Int(-42)
                ]
            ),
            "3|  -42|7    |-0042"
        );
        assert_eq!(
            printf(
                "%.3f|%f|%8.2f",
                &[Value::Float(1.23456), Value::Float(2.0), Value::Float(-2.5)]
            ),
            "1.235|2.000000|   -2.50"
        );
        assert_eq!(
            printf("%s=%q", &[Value::str("a"), Value::str("b\"\n")]),
            "a=\"b\\\"\\n\""
        );
        assert_eq!(printf("%d", &[Value::str("x")]), "%!d(string=x)");
        assert_eq!(printf("%s %s", &[Value::str("x")]), "x %!s(MISSING)");
        assert_eq!(
            printf("%s", &[Value::str("x"), Value::Int(1)]),
            "x%!(EXTRA int=1)"
        );
        assert_eq!(printf("100%%", &[]), "100%");
        assert_eq!(
            printf(
                "%e|%.2e|%g|%.3g",
                &[
                    Value::Float(1234.5678),
                    Value::Float(0.000123),
                    Value::Float(1e-7),
                    Value::Float(1234.5678)
                ]
            ),
            "1.234568e+03|1.23e-04|1e-07|1.23e+03"
        );
        assert_eq!(
            printf(
                "%x|%X|%#x|%x",
                &[
                    Value::Int(255),
                    Value::Int(255),
                    Value::Int(255),
                    Value::str("hi")
                ]
            ),
            "ff|FF|0xff|6869"
        );
        assert_eq!(
            printf(
                "%v|%s",
                &[
                    Value::List(vec![Value::str("a"), Value::str("b")]),
                    Value::List(vec![])
                ]
            ),
            "[a b]|[]"
        );
        assert_eq!(
            printf(
                "%t|%v|%T",
                &[Value::Bool(true), Value::Nil, Value::Float(1.0)]
            ),
            "true|<nil>|float64"
        );
    }
}
