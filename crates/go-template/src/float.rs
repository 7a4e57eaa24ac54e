//! Go's formatting of a `float64`: the digits `strconv` chooses, and the
//! `%v`/`%g` forms built from them. A leaf: every other module formats
//! floats through it.

/// Digits and decimal exponent of `f` (finite, non-zero, positive):
/// `f = 0.d1d2d3... × 10^(exp+1)`, i.e. `exp` is the exponent of the first
/// digit. With `precision`, rounded to that many significant digits;
/// without, the shortest digits that read back as `f`.
pub(crate) fn digits(f: f64, precision: Option<usize>) -> (Vec<u8>, i32) {
    let s = match precision {
        Some(p) => format!("{:.*e}", p.saturating_sub(1).min(EXACT_DIGITS), f),
        None => format!("{f:e}"),
    };
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let mut digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    if let Some(p) = precision {
        // Past the exact expansion, every digit is a zero.
        digits.resize(digits.len().max(p), b'0');
    }
    (digits, exp.parse().unwrap_or(0))
}

/// More digits than any `f64`'s exact decimal expansion has (at most 767
/// significant ones, 1,074 after the point): Rust's formatting takes
/// precisions up to 65,535 only, Go's up to ten million, and past these
/// every digit is a zero.
pub(crate) const EXACT_DIGITS: usize = 1_100;

pub(crate) fn special(f: f64, plus: bool) -> Option<String> {
    if f.is_nan() {
        Some("NaN".to_owned())
    } else if f.is_infinite() {
        Some(if f > 0.0 { "+Inf" } else { "-Inf" }.to_owned())
    } else if f == 0.0 {
        let sign = if f.is_sign_negative() {
            "-"
        } else if plus {
            "+"
        } else {
            ""
        };
        Some(format!("{sign}0"))
    } else {
        None
    }
}

/// `digits` written as `d.ddde±XX`.
pub(crate) fn exp_form(digits: &[u8], exp: i32, min_frac: usize) -> String {
    let mut s = String::new();
    s.push(digits[0] as char);
    let frac = &digits[1..];
    if !frac.is_empty() || min_frac > 0 {
        s.push('.');
        for d in frac {
            s.push(*d as char);
        }
        for _ in frac.len()..min_frac {
            s.push('0');
        }
    }
    let sign = if exp < 0 { '-' } else { '+' };
    s.push_str(&format!("e{sign}{:02}", exp.unsigned_abs()));
    s
}

/// `digits` written without an exponent.
fn plain_form(digits: &[u8], exp: i32) -> String {
    let mut s = String::new();
    if exp < 0 {
        s.push_str("0.");
        for _ in 0..(-exp - 1) {
            s.push('0');
        }
        s.extend(digits.iter().map(|d| *d as char));
    } else {
        let int_len = exp as usize + 1;
        for i in 0..int_len {
            s.push(digits.get(i).map_or('0', |d| *d as char));
        }
        if digits.len() > int_len {
            s.push('.');
            s.extend(digits[int_len..].iter().map(|d| *d as char));
        }
    }
    s
}

/// `%g` (and so `%v`) of a float: the shortest (or `precision`
/// significant digits), with an exponent when it is below -4 or at least
/// the precision (6 for the shortest), as Go's `strconv` chooses.
pub(crate) fn float_g(f: f64, precision: Option<usize>, plus: bool) -> String {
    if let Some(s) = special(f, plus) {
        return s;
    }
    let sign = if f < 0.0 {
        "-"
    } else if plus {
        "+"
    } else {
        ""
    };
    let precision = precision.map(|p| p.max(1));
    let (mut digits, exp) = digits(f.abs(), precision);
    while digits.len() > 1 && digits.last() == Some(&b'0') {
        digits.pop();
    }
    let eprec = match precision {
        None => 6,
        Some(p) => {
            let dp = exp + 1;
            if p > digits.len() && digits.len() as i32 >= dp {
                digits.len() as i32
            } else {
                p as i32
            }
        }
    };
    let body = if exp < -4 || exp >= eprec {
        exp_form(&digits, exp, 0)
    } else {
        plain_form(&digits, exp)
    };
    format!("{sign}{body}")
}

/// Go's `%v` of a `float64`.
pub fn float_v(f: f64) -> String {
    float_g(f, None, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_go_prints_them() {
        for (f, go) in [
            (0.0, "0"),
            (1.0, "1"),
            (0.5, "0.5"),
            (0.001234567, "0.001234567"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (123456.0, "123456"),
            (1234567.0, "1.234567e+06"),
            (1e21, "1e+21"),
            (-2.5, "-2.5"),
            (1.0 / 3.0, "0.3333333333333333"),
            (f64::INFINITY, "+Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(float_v(f), go, "{f}");
        }
    }
}
