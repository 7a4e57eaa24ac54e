//! Execution: walking the tree with the data, as Go's `text/template`
//! does.

use std::borrow::Cow;

use crate::funcs;
use crate::parse::{Command, List, Node, Operand, Pipeline, Term};
use crate::value::Value;

/// A template that failed while it ran (a missing field, a function given
/// the wrong values).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExecError {
    message: String,
}

pub(crate) struct State<'o, 'a> {
    out: &'o mut Vec<u8>,
    vars: Vec<(String, Value<'a>)>,
}

fn err(message: impl Into<String>) -> ExecError {
    ExecError {
        message: message.into(),
    }
}

impl<'o, 'a> State<'o, 'a> {
    pub(crate) fn new(out: &'o mut Vec<u8>, data: Value<'a>) -> Self {
        State {
            out,
            vars: vec![("$".to_owned(), data)],
        }
    }

    pub(crate) fn walk(&mut self, dot: &Value<'a>, list: &List) -> Result<(), ExecError> {
        for node in list {
            self.node(dot, node)?;
        }
        Ok(())
    }

    fn node(&mut self, dot: &Value<'a>, node: &Node) -> Result<(), ExecError> {
        match node {
            Node::Text(t) => self.out.extend_from_slice(t),
            Node::Action(pipe) => {
                let v = self.pipeline(dot, pipe)?;
                if pipe.vars.is_empty() {
                    v.write_printed(self.out);
                }
            }
            Node::If {
                pipe,
                then,
                otherwise,
            } => {
                let mark = self.vars.len();
                let v = self.pipeline(dot, pipe)?;
                let branch = if v.is_true() { then } else { otherwise };
                self.walk(dot, branch)?;
                self.vars.truncate(mark);
            }
            Node::With {
                pipe,
                then,
                otherwise,
            } => {
                let mark = self.vars.len();
                let v = self.pipeline(dot, pipe)?;
                if v.is_true() {
                    self.walk(&v, then)?;
                } else {
                    self.walk(dot, otherwise)?;
                }
                self.vars.truncate(mark);
            }
            Node::Range {
                pipe,
                body,
                otherwise,
            } => {
                let mark = self.vars.len();
                // The variables are set per element, not to the whole.
                let bare = Pipeline {
                    vars: Vec::new(),
                    assign: false,
                    cmds: pipe.cmds.clone(),
                };
                let v = self.pipeline(dot, &bare)?;
                // Elements are made one at a time: `range 1000000000` costs
                // time, as in Go, not memory.
                let items: Box<dyn Iterator<Item = (Value<'a>, Value<'a>)>> = match v {
                    Value::List(items) => Box::new(
                        items
                            .into_iter()
                            .enumerate()
                            .map(|(i, v)| (Value::Int(i as i64), v)),
                    ),
                    Value::Map { entries, .. } => Box::new(
                        funcs::map_entries(&entries)
                            .into_iter()
                            .map(|(k, v)| (Value::Str(k.clone()), v.clone()))
                            .collect::<Vec<_>>()
                            .into_iter(),
                    ),
                    Value::Int(n) => {
                        Box::new((0..n.max(0)).map(|i| (Value::Int(i), Value::Int(i))))
                    }
                    Value::Nil | Value::Missing => Box::new(std::iter::empty()),
                    v => return Err(err(format!("range can't iterate over {v:?}"))),
                };
                let mut empty = true;
                for (key, item) in items {
                    empty = false;
                    let scope = self.vars.len();
                    match pipe.vars.as_slice() {
                        [] => {}
                        [one] => self.set(one, item.clone(), pipe.assign),
                        [k, v, ..] => {
                            self.set(k, key, pipe.assign);
                            self.set(v, item.clone(), pipe.assign);
                        }
                    }
                    self.walk(&item, body)?;
                    self.vars.truncate(scope);
                }
                if empty {
                    self.walk(dot, otherwise)?;
                }
                self.vars.truncate(mark);
            }
        }
        Ok(())
    }

    fn set(&mut self, name: &str, value: Value<'a>, assign: bool) {
        if assign {
            if let Some(slot) = self.vars.iter_mut().rev().find(|(n, _)| n == name) {
                slot.1 = value;
            }
        } else {
            self.vars.push((name.to_owned(), value));
        }
    }

    fn var(&self, name: &str) -> Result<Value<'a>, ExecError> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| err(format!("undefined variable: {name}")))
    }

    fn pipeline(&mut self, dot: &Value<'a>, pipe: &Pipeline) -> Result<Value<'a>, ExecError> {
        let mut value = None;
        for cmd in &pipe.cmds {
            value = Some(self.command(dot, cmd, value)?);
        }
        let value = value.unwrap_or(Value::Nil);
        for name in &pipe.vars {
            self.set(name, value.clone(), pipe.assign);
        }
        Ok(value)
    }

    fn command(
        &mut self,
        dot: &Value<'a>,
        cmd: &Command,
        last: Option<Value<'a>>,
    ) -> Result<Value<'a>, ExecError> {
        let first = &cmd.args[0];
        let args = &cmd.args[1..];
        match &first.term {
            Term::Func(name) if first.chain.is_empty() => self.function(dot, name, args, last),
            Term::Field(chain) => self.chain(dot, dot.clone(), chain, args, last),
            _ if !first.chain.is_empty() => {
                let receiver = self.term(dot, &first.term)?;
                self.chain(dot, receiver, &first.chain, args, last)
            }
            term => {
                if !args.is_empty() || last.is_some() {
                    return Err(err(format!("can't give argument to non-function {term:?}")));
                }
                self.term(dot, term)
            }
        }
    }

    fn term(&mut self, dot: &Value<'a>, term: &Term) -> Result<Value<'a>, ExecError> {
        Ok(match term {
            Term::Dot => dot.clone(),
            Term::Field(chain) => return self.chain(dot, dot.clone(), chain, &[], None),
            Term::Var(name) => self.var(name)?,
            Term::Func(name) => return self.function(dot, name, &[], None),
            Term::Str(s) => Value::Str(Cow::Owned(s.clone())),
            Term::Int(i) => Value::Int(*i),
            Term::Float(f) => Value::Float(*f),
            Term::Bool(b) => Value::Bool(*b),
            Term::Nil => return Err(err("nil is not a command")),
            Term::Pipe(pipe) => {
                let mark = self.vars.len();
                let v = self.pipeline(dot, pipe);
                self.vars.truncate(mark);
                v?
            }
        })
    }

    fn operand(&mut self, dot: &Value<'a>, operand: &Operand) -> Result<Value<'a>, ExecError> {
        match (&operand.term, operand.chain.is_empty()) {
            (Term::Nil, true) => Ok(Value::Nil),
            (term, true) => self.term(dot, term),
            (term, false) => {
                let receiver = self.term(dot, term)?;
                self.chain(dot, receiver, &operand.chain, &[], None)
            }
        }
    }

    /// `receiver.A.B ...`: the last link gets the arguments, evaluated
    /// with the command's `dot`.
    fn chain(
        &mut self,
        dot: &Value<'a>,
        mut receiver: Value<'a>,
        chain: &[String],
        args: &[Operand],
        last: Option<Value<'a>>,
    ) -> Result<Value<'a>, ExecError> {
        let Some((final_name, links)) = chain.split_last() else {
            return Ok(receiver);
        };
        for name in links {
            receiver = field(receiver, name, Vec::new())?;
        }
        let mut values = Vec::with_capacity(args.len() + 1);
        for a in args {
            values.push(self.operand(dot, a)?);
        }
        values.extend(last);
        field(receiver, final_name, values)
    }

    fn function(
        &mut self,
        dot: &Value<'a>,
        name: &str,
        args: &[Operand],
        last: Option<Value<'a>>,
    ) -> Result<Value<'a>, ExecError> {
        let call_err = |e: String| err(format!("error calling {name}: {e}"));
        match name {
            // Evaluated lazily: the first false (true) argument, or the last.
            "and" | "or" => {
                let total = args.len() + usize::from(last.is_some());
                if total == 0 {
                    return Err(err(format!(
                        "wrong number of args for {name}: want at least 1 got 0"
                    )));
                }
                let mut value = Value::Nil;
                for a in args {
                    value = self.operand(dot, a)?;
                    if value.is_true() == (name == "or") {
                        return Ok(value);
                    }
                }
                Ok(last.unwrap_or(value))
            }
            _ => {
                let mut values = Vec::with_capacity(args.len() + 1);
                for a in args {
                    values.push(self.operand(dot, a)?);
                }
                values.extend(last);
                funcs::call(name, values).map_err(call_err)
            }
        }
    }
}

/// Field (or method, or map key) `name` of `receiver`, called with `args`.
fn field<'a>(
    receiver: Value<'a>,
    name: &str,
    args: Vec<Value<'a>>,
) -> Result<Value<'a>, ExecError> {
    match receiver {
        Value::Object(o) => {
            let v = o.field(name).ok_or_else(|| {
                err(format!(
                    "can't evaluate field {name} in type {}",
                    o.type_name()
                ))
            })?;
            if !args.is_empty() {
                return Err(err(format!(
                    "{name} has arguments but cannot be invoked as function"
                )));
            }
            Ok(v)
        }
        Value::Map {
            entries,
            header: true,
        } if name == "Get" || name == "Values" => {
            let [Value::Str(key)] = <[Value<'a>; 1]>::try_from(args).map_err(|a| {
                err(format!(
                    "wrong number of args for {name}: want 1 got {}",
                    a.len()
                ))
            })?
            else {
                return Err(err("wrong type for value; expected string"));
            };
            let key = canonical_header_key(&key);
            let values = entries
                .into_iter()
                .find(|(k, _)| **k == *key)
                .map_or(Value::List(Vec::new()), |(_, v)| v);
            Ok(match (name, values) {
                ("Get", Value::List(l)) => l.into_iter().next().unwrap_or(Value::str("")),
                (_, v) => v,
            })
        }
        Value::Map { entries, .. } => {
            if !args.is_empty() {
                return Err(err(format!("{name} is not a method but has arguments")));
            }
            Ok(entries
                .into_iter()
                .find(|(k, _)| **k == *name.as_bytes())
                .map_or(Value::Missing, |(_, v)| v))
        }
        Value::Nil | Value::Missing => Err(err(format!("nil pointer evaluating <nil>.{name}"))),
        v => Err(err(format!(
            "can't evaluate field {name} in type {}",
            v.type_name()
        ))),
    }
}

/// Go's `textproto.CanonicalMIMEHeaderKey`: `x-b3-traceid` is
/// `X-B3-Traceid`; a key with a byte no header name may hold stays as it
/// is.
pub fn canonical_header_key(key: &[u8]) -> Cow<'_, [u8]> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !key.iter().all(|b| token(*b)) {
        return Cow::Borrowed(key);
    }
    let mut upper = true;
    let canonical: Vec<u8> = key
        .iter()
        .map(|&b| {
            let c = if upper {
                b.to_ascii_uppercase()
            } else {
                b.to_ascii_lowercase()
            };
            upper = b == b'-';
            c
        })
        .collect();
    if canonical == key {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(canonical)
    }
}
