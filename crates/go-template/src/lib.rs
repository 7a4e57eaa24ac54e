//! The part of Go's `text/template` that request-log templates use,
//! rendering byte for byte what Go renders.
//!
//! Knative shapes each request-log line with a Go template over a
//! request, a response and a revision. This crate parses such templates
//! and executes them over data a caller describes with [`Value`] and
//! [`Object`]:
//!
//! - text, actions, `{{- ` and ` -}}` trim markers, `{{/* comments */}}`;
//! - pipelines with `|`, parenthesized pipelines, fields and methods
//!   chained on dot, variables and parentheses (`.A.B`, `$x.A`, `(p).A`),
//!   method arguments (`.Request.Header.Get "X"`);
//! - `if` / `else if` / `else`, `with` / `else with`, `range` (with one or
//!   two variables, over slices, maps, integers) and `else`, variable
//!   declaration and assignment;
//! - string (interpreted and raw), character, integer, float, boolean and
//!   `nil` constants;
//! - every predefined function: `and`, `or`, `not`, `len`, `index`,
//!   `slice`, `print`, `printf`, `println`, `html`, `js`, `urlquery`, `eq`,
//!   `ne`, `lt`, `le`, `gt`, `ge` (`call` parses, and fails when run:
//!   there is nothing to call);
//! - values printed as Go's `fmt` prints them (`%v` floats, slices, maps,
//!   structs), and `printf`'s common verbs, flags, widths and precisions.
//!
//! Not supported: `define`, `template`, `block`, `break` and `continue`
//! (a template using them does not parse), custom delimiters, functions
//! beyond Go's own.
//!
//! ```
//! use qproxy_go_template::{Template, Value};
//!
//! let t = Template::parse(r#"{{js .}} is {{len .}} bytes"#).unwrap();
//! let mut out = Vec::new();
//! t.execute(&mut out, Value::str("<a>")).unwrap();
//! assert_eq!(out, br"\u003Ca\u003E is 3 bytes");
//! ```

mod exec;
mod float;
mod funcs;
mod parse;
mod printf;
mod value;

pub use exec::{ExecError, canonical_header_key};
pub use float::float_v;
pub use parse::ParseError;
pub use printf::sprintf;
pub use value::{Object, Value};

/// A parsed template.
#[derive(Debug, Clone)]
pub struct Template {
    root: parse::List,
}

impl Template {
    /// Parses `src`.
    pub fn parse(src: &str) -> Result<Self, ParseError> {
        Ok(Template {
            root: parse::parse(src.as_bytes())?,
        })
    }

    /// Renders the template with `data` as dot, appending to `out`. On an
    /// error, `out` holds what was rendered before it, as with Go.
    pub fn execute<'a>(&self, out: &mut Vec<u8>, data: Value<'a>) -> Result<(), ExecError> {
        let mut state = exec::State::new(out, data.clone());
        state.walk(&data, &self.root)
    }
}

#[cfg(test)]
mod tests;
