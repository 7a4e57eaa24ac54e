//! Go's predefined template functions.

use std::borrow::Cow;
use std::cmp::Ordering;

use crate::printf::{is_print, sprintf};
use crate::value::{Value, sorted};

/// The functions a template may name. `and` and `or` are evaluated lazily
/// by the executor; `call` parses but fails when run, having nothing to
/// call.
const NAMES: &[&str] = &[
    "and", "or", "not", "len", "index", "slice", "print", "printf", "println", "html", "js",
    "urlquery", "eq", "ne", "lt", "le", "gt", "ge", "call",
];

pub(crate) fn exists(name: &str) -> bool {
    NAMES.contains(&name)
}

/// Calls the (eager) function `name`.
pub(crate) fn call<'a>(name: &str, args: Vec<Value<'a>>) -> Result<Value<'a>, String> {
    match name {
        "not" => {
            let [v] = exactly::<1>(name, args)?;
            Ok(Value::Bool(!v.is_true()))
        }
        "len" => {
            let [v] = exactly::<1>(name, args)?;
            match v {
                Value::Str(s) => Ok(Value::Int(s.len() as i64)),
                Value::List(l) => Ok(Value::Int(l.len() as i64)),
                Value::Map { entries, .. } => Ok(Value::Int(entries.len() as i64)),
                v => Err(format!("len of type {}", v.type_name())),
            }
        }
        "index" => index(args),
        "slice" => slice(args),
        "print" => Ok(Value::Str(Cow::Owned(sprint(&args)))),
        "println" => {
            let mut out = Vec::new();
            for (i, a) in args.iter().enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                a.write_v(&mut out);
            }
            out.push(b'\n');
            Ok(Value::Str(Cow::Owned(out)))
        }
        "printf" => {
            let mut args = args.into_iter();
            let format = match args.next() {
                Some(Value::Str(f)) => f,
                Some(v) => {
                    return Err(format!(
                        "wrong type for value; expected string; got {}",
                        v.type_name()
                    ));
                }
                None => return Err("wrong number of args for printf: want at least 1 got 0".into()),
            };
            let rest: Vec<_> = args.collect();
            let mut out = Vec::new();
            sprintf(&format, &rest, &mut out);
            Ok(Value::Str(Cow::Owned(out)))
        }
        "html" => Ok(Value::Str(Cow::Owned(html(&text_of(args))))),
        "js" => Ok(Value::Str(Cow::Owned(js(&text_of(args))))),
        "urlquery" => Ok(Value::Str(Cow::Owned(urlquery(&text_of(args))))),
        "eq" => {
            let mut args = args.into_iter();
            let first = args.next().ok_or("missing argument for comparison")?;
            let rest: Vec<_> = args.collect();
            if rest.is_empty() {
                return Err("missing argument for comparison".into());
            }
            for other in &rest {
                if equal(&first, other)? {
                    return Ok(Value::Bool(true));
                }
            }
            Ok(Value::Bool(false))
        }
        "ne" => {
            let [a, b] = exactly::<2>(name, args)?;
            Ok(Value::Bool(!equal(&a, &b)?))
        }
        "lt" | "le" | "gt" | "ge" => {
            let [a, b] = exactly::<2>(name, args)?;
            let ord = order(&a, &b)?;
            Ok(Value::Bool(match name {
                "lt" => ord == Some(Ordering::Less),
                "le" => matches!(ord, Some(Ordering::Less | Ordering::Equal)),
                "gt" => ord == Some(Ordering::Greater),
                _ => matches!(ord, Some(Ordering::Greater | Ordering::Equal)),
            }))
        }
        "call" => Err("call of nil".into()),
        _ => Err(format!("function \"{name}\" not defined")),
    }
}

fn exactly<'a, const N: usize>(name: &str, args: Vec<Value<'a>>) -> Result<[Value<'a>; N], String> {
    let got = args.len();
    args.try_into()
        .map_err(|_| format!("wrong number of args for {name}: want {N} got {got}"))
}

/// `fmt.Sprint`: a space between operands when neither is a string.
pub(crate) fn sprint(args: &[Value<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        let is_str = |v: &Value<'_>| matches!(v, Value::Str(_));
        if i > 0 && !is_str(a) && !is_str(&args[i - 1]) {
            out.push(b' ');
        }
        a.write_v(&mut out);
    }
    out
}

/// The text the escaping functions work on: a lone string as it is, else
/// `fmt.Sprint` of the arguments.
fn text_of(args: Vec<Value<'_>>) -> Vec<u8> {
    match <[Value<'_>; 1]>::try_from(args) {
        Ok([Value::Str(s)]) => s.into_owned(),
        Ok([v]) => sprint(&[v]),
        Err(args) => sprint(&args),
    }
}

fn index<'a>(args: Vec<Value<'a>>) -> Result<Value<'a>, String> {
    let mut args = args.into_iter();
    let mut item = args
        .next()
        .ok_or("wrong number of args for index: want at least 1 got 0")?;
    for key in args {
        item = match (item, key) {
            (Value::Map { entries, .. }, Value::Str(k)) => entries
                .into_iter()
                .find(|(name, _)| *name == k)
                .map_or(Value::List(Vec::new()), |(_, v)| v),
            (Value::Map { .. }, k) => {
                return Err(format!(
                    "value has type {}; should be string",
                    k.type_name()
                ));
            }
            (Value::List(list), Value::Int(i)) => usize::try_from(i)
                .ok()
                .and_then(|i| list.into_iter().nth(i))
                .ok_or_else(|| format!("index out of range: {i}"))?,
            (Value::Str(s), Value::Int(i)) => usize::try_from(i)
                .ok()
                .and_then(|i| s.get(i).copied())
                .map(|b| Value::Int(i64::from(b)))
                .ok_or_else(|| format!("index out of range: {i}"))?,
            (Value::Nil, _) => return Err("index of untyped nil".into()),
            (item, _) => {
                return Err(format!("can't index item of type {}", item.type_name()));
            }
        };
    }
    Ok(item)
}

fn slice<'a>(args: Vec<Value<'a>>) -> Result<Value<'a>, String> {
    let mut args = args.into_iter();
    let item = args
        .next()
        .ok_or("wrong number of args for slice: want at least 1 got 0")?;
    let bounds: Vec<i64> = args
        .map(|v| match v {
            Value::Int(i) => Ok(i),
            v => Err(format!(
                "cannot index slice/array with type {}",
                v.type_name()
            )),
        })
        .collect::<Result<_, _>>()?;
    let len = match &item {
        Value::Str(s) => s.len(),
        Value::List(l) => l.len(),
        v => return Err(format!("can't slice item of type {}", v.type_name())),
    };
    if bounds.len() > 2 {
        return Err("too many slice indexes".into());
    }
    let lo = bounds.first().copied().unwrap_or(0);
    let hi = bounds.get(1).copied().unwrap_or(len as i64);
    if lo < 0 || hi < lo || hi > len as i64 {
        return Err(format!("invalid slice index: {lo} > {hi}"));
    }
    let (lo, hi) = (lo as usize, hi as usize);
    Ok(match item {
        Value::Str(s) => Value::Str(Cow::Owned(s[lo..hi].to_vec())),
        Value::List(l) => Value::List(l[lo..hi].to_vec()),
        v => v,
    })
}

/// Go's comparison kinds.
#[derive(PartialEq)]
enum Kind {
    Bool,
    Int,
    Float,
    Str,
    Other,
}

fn kind(v: &Value<'_>) -> Kind {
    match v {
        Value::Bool(_) => Kind::Bool,
        Value::Int(_) => Kind::Int,
        Value::Float(_) => Kind::Float,
        Value::Str(_) => Kind::Str,
        _ => Kind::Other,
    }
}

fn equal(a: &Value<'_>, b: &Value<'_>) -> Result<bool, String> {
    match (a, b) {
        (Value::Nil, Value::Nil) => Ok(true),
        (Value::Nil, _) | (_, Value::Nil) => Ok(false),
        (Value::Bool(x), Value::Bool(y)) => Ok(x == y),
        (Value::Int(x), Value::Int(y)) => Ok(x == y),
        (Value::Float(x), Value::Float(y)) => Ok(x == y),
        (Value::Str(x), Value::Str(y)) => Ok(x == y),
        (Value::Object(x), Value::Object(y)) => Ok(std::ptr::addr_eq(*x, *y)),
        (Value::List(_) | Value::Map { .. }, _) => {
            Err(format!("non-comparable type {}", a.type_name()))
        }
        _ if kind(a) != kind(b) => Err("incompatible types for comparison".into()),
        _ => Err(format!("non-comparable type {}", b.type_name())),
    }
}

fn order(a: &Value<'_>, b: &Value<'_>) -> Result<Option<Ordering>, String> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(Some(x.cmp(y))),
        (Value::Float(x), Value::Float(y)) => Ok(x.partial_cmp(y)),
        (Value::Str(x), Value::Str(y)) => Ok(Some(x.cmp(y))),
        _ if kind(a) == kind(b) && kind(a) != Kind::Other => {
            Err("invalid type for comparison".into())
        }
        _ if kind(a) == Kind::Other || kind(b) == Kind::Other => {
            Err("invalid type for comparison".into())
        }
        _ => Err("incompatible types for comparison".into()),
    }
}

/// Go's `template.HTMLEscape`.
pub(crate) fn html(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"&#34;"),
            b'\'' => out.extend_from_slice(b"&#39;"),
            b'&' => out.extend_from_slice(b"&amp;"),
            b'<' => out.extend_from_slice(b"&lt;"),
            b'>' => out.extend_from_slice(b"&gt;"),
            0 => out.extend_from_slice("\u{FFFD}".as_bytes()),
            b => out.push(b),
        }
    }
    out
}

/// Go's `template.JSEscape`.
pub(crate) fn js(s: &[u8]) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\'' => out.extend_from_slice(b"\\'"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'<' => out.extend_from_slice(b"\\u003C"),
            b'>' => out.extend_from_slice(b"\\u003E"),
            b'&' => out.extend_from_slice(b"\\u0026"),
            b'=' => out.extend_from_slice(b"\\u003D"),
            b if b < b' ' => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
            b if b < 0x80 => out.push(b),
            _ => {
                // One rune: printable ones (and bytes that are no UTF-8,
                // which Go decodes as the printable U+FFFD) pass as they are.
                let rest = &s[i..s.len().min(i + 4)];
                let decoded = match std::str::from_utf8(rest) {
                    Ok(t) => t.chars().next(),
                    Err(e) => std::str::from_utf8(&rest[..e.valid_up_to()])
                        .ok()
                        .and_then(|t| t.chars().next()),
                };
                match decoded {
                    Some(c) => {
                        let len = c.len_utf8();
                        if is_print(c) {
                            out.extend_from_slice(&s[i..i + len]);
                        } else {
                            out.extend_from_slice(format!("\\u{:04X}", c as u32).as_bytes());
                        }
                        i += len;
                        continue;
                    }
                    None => out.push(b),
                }
            }
        }
        i += 1;
    }
    out
}

/// Go's `url.QueryEscape`.
pub(crate) fn urlquery(s: &[u8]) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(s.len());
    for &b in s {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b),
            b' ' => out.push(b'+'),
            b => {
                out.push(b'%');
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
    }
    out
}

/// A map's entries in Go's order, for `range`.
pub(crate) fn map_entries<'m, 'a>(
    entries: &'m [(Cow<'a, [u8]>, Value<'a>)],
) -> Vec<&'m (Cow<'a, [u8]>, Value<'a>)> {
    sorted(entries)
}
