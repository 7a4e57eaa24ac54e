//! The values a template works with, and how Go prints them.

use std::borrow::Cow;
use std::fmt;

/// A value in a template: the data given to it, what its fields hold, and
/// what its functions return.
///
/// Strings are bytes, as in Go: header values need not be UTF-8.
#[derive(Clone)]
pub enum Value<'a> {
    /// No value: what a missing map key gives as a field (`.Header.Nope`);
    /// printed `<no value>`.
    Missing,
    /// Go's untyped `nil` (and nil pointers).
    Nil,
    /// `bool`.
    Bool(bool),
    /// A signed integer (`int`, `int64`).
    Int(i64),
    /// `float64`.
    Float(f64),
    /// `string`.
    Str(Cow<'a, [u8]>),
    /// A slice (`[]string`).
    List(Vec<Value<'a>>),
    /// A map with string keys, entries in any order (Go sorts them when it
    /// prints or ranges). `header` marks an `http.Header`, which also has
    /// the methods `Get` and `Values`.
    Map {
        /// The entries.
        entries: Vec<(Cow<'a, [u8]>, Value<'a>)>,
        /// Whether this is an `http.Header`.
        header: bool,
    },
    /// A struct (behind a pointer, as Knative passes them).
    Object(&'a dyn Object),
}

impl fmt::Debug for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Vec::new();
        self.write_v(&mut out);
        write!(f, "{}", String::from_utf8_lossy(&out))
    }
}

impl<'a> Value<'a> {
    /// A string borrowed from the data.
    pub fn str(s: &'a str) -> Self {
        Value::Str(Cow::Borrowed(s.as_bytes()))
    }

    /// A string of bytes borrowed from the data.
    pub fn bytes(s: &'a [u8]) -> Self {
        Value::Str(Cow::Borrowed(s))
    }

    /// An owned string.
    pub fn string(s: String) -> Self {
        Value::Str(Cow::Owned(s.into_bytes()))
    }

    /// Go's name of the value's type, as `%T` and error messages show it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Missing | Value::Nil => "<nil>",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float64",
            Value::Str(_) => "string",
            Value::List(_) => "[]string",
            Value::Map { header: true, .. } => "http.Header",
            Value::Map { .. } => "map[string][]string",
            Value::Object(o) => o.type_name(),
        }
    }

    /// Go's truth: false, zero, empty and nil are false.
    pub fn is_true(&self) -> bool {
        match self {
            Value::Missing | Value::Nil => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map { entries, .. } => !entries.is_empty(),
            Value::Object(_) => true,
        }
    }

    /// The value as Go's `%v` prints it.
    pub fn write_v(&self, out: &mut Vec<u8>) {
        match self {
            Value::Missing | Value::Nil => out.extend_from_slice(b"<nil>"),
            Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Value::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
            Value::Float(f) => out.extend_from_slice(crate::float::float_v(*f).as_bytes()),
            Value::Str(s) => out.extend_from_slice(s),
            Value::List(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b' ');
                    }
                    item.write_v(out);
                }
                out.push(b']');
            }
            Value::Map { entries, .. } => {
                out.extend_from_slice(b"map[");
                for (i, (k, v)) in sorted(entries).into_iter().enumerate() {
                    if i > 0 {
                        out.push(b' ');
                    }
                    out.extend_from_slice(k);
                    out.push(b':');
                    v.write_v(out);
                }
                out.push(b']');
            }
            Value::Object(o) => o.write_v(out, true),
        }
    }

    /// The value as a template action prints it: as `%v`, except that a
    /// struct is printed without the `&` of its pointer.
    pub fn write_printed(&self, out: &mut Vec<u8>) {
        match self {
            Value::Object(o) => o.write_v(out, false),
            Value::Missing => out.extend_from_slice(b"<no value>"),
            v => v.write_v(out),
        }
    }
}

/// A map's entries in the order Go prints and ranges over them.
pub(crate) fn sorted<'m, 'a>(
    entries: &'m [(Cow<'a, [u8]>, Value<'a>)],
) -> Vec<&'m (Cow<'a, [u8]>, Value<'a>)> {
    let mut sorted: Vec<_> = entries.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    sorted
}

/// A Go struct a template can look into: its exported fields and its
/// methods.
pub trait Object {
    /// Go's name of the type, for messages (`*http.Request`).
    fn type_name(&self) -> &'static str;

    /// The field or argument-less method `name`, or `None` when the type has
    /// neither.
    fn field(&self, name: &str) -> Option<Value<'_>>;

    /// The value as Go's `%v` prints it: `&{field field ...}` through a
    /// `pointer`, `{field field ...}` without one; a type with a `String`
    /// method prints that either way.
    fn write_v(&self, out: &mut Vec<u8>, pointer: bool);
}
