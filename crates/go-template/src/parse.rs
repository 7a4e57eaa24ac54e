//! Parsing: template text into a tree of nodes, with Go's rules for
//! actions, trim markers, comments, pipelines, literals and variables.

use crate::funcs;

/// A template that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    line: usize,
    message: String,
}

/// A parsed template: text and actions, in order.
pub(crate) type List = Vec<Node>;

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Text(Vec<u8>),
    Action(Pipeline),
    If {
        pipe: Pipeline,
        then: List,
        otherwise: List,
    },
    With {
        pipe: Pipeline,
        then: List,
        otherwise: List,
    },
    Range {
        pipe: Pipeline,
        body: List,
        otherwise: List,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Pipeline {
    /// Variables declared (`:=`) or assigned (`=`) by the pipeline.
    pub vars: Vec<String>,
    pub assign: bool,
    pub cmds: Vec<Command>,
}

#[derive(Debug, Clone)]
pub(crate) struct Command {
    pub args: Vec<Operand>,
}

/// A term and the fields chained to it (`$x.A.B`, `(pipe).A`).
#[derive(Debug, Clone)]
pub(crate) struct Operand {
    pub term: Term,
    pub chain: Vec<String>,
}

#[derive(Debug, Clone)]
pub(crate) enum Term {
    /// `.`
    Dot,
    /// `.A.B`: fields of dot (the chain is in the term).
    Field(Vec<String>),
    /// `$x` or `$`.
    Var(String),
    /// A function name.
    Func(String),
    Str(Vec<u8>),
    Int(i64),
    Float(f64),
    Bool(bool),
    Nil,
    /// `( pipeline )`.
    Pipe(Box<Pipeline>),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Field(String),
    Dot,
    Var(String),
    Ident(String),
    Str(Vec<u8>),
    Char(i64),
    Number(String),
    Pipe,
    LParen,
    RParen,
    Declare,
    Assign,
    Comma,
}

/// A token and whether space came before it.
#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    spaced: bool,
}

/// Parses `src`.
pub(crate) fn parse(src: &[u8]) -> Result<List, ParseError> {
    let mut parser = Parser {
        src,
        pos: 0,
        line: 1,
        vars: vec!["$".to_owned()],
        trim_next: false,
    };
    let (list, end) = parser.list()?;
    match end {
        Close::Eof => Ok(list),
        Close::End => Err(parser.error("unexpected {{end}}")),
        Close::Else(_) => Err(parser.error("unexpected {{else}}")),
    }
}

/// How a list of nodes ended.
enum Close {
    Eof,
    End,
    /// `{{else}}`, or `{{else <keyword> ...}}` with its remaining tokens.
    Else(Vec<Token>),
}

struct Parser<'s> {
    src: &'s [u8],
    pos: usize,
    line: usize,
    /// Variables in scope.
    vars: Vec<String>,
    /// The last action ended with ` -}}`.
    trim_next: bool,
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

impl Parser<'_> {
    fn error(&self, msg: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            message: msg.into(),
        }
    }

    fn advance(&mut self, to: usize) {
        self.line += self.src[self.pos..to]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        self.pos = to;
    }

    /// Nodes up to the end of input or the `{{end}}`/`{{else}}` of the
    /// enclosing action.
    fn list(&mut self) -> Result<(List, Close), ParseError> {
        let mut list = Vec::new();
        loop {
            let open = find(self.src, self.pos, b"{{");
            let text_end = open.unwrap_or(self.src.len());
            let mut text = &self.src[self.pos..text_end];
            if self.trim_next {
                let start = text
                    .iter()
                    .position(|b| !is_space(*b))
                    .unwrap_or(text.len());
                text = &text[start..];
                self.trim_next = false;
            }
            let Some(open) = open else {
                if !text.is_empty() {
                    list.push(Node::Text(text.to_vec()));
                }
                self.advance(self.src.len());
                return Ok((list, Close::Eof));
            };
            // `{{- ` trims the text before.
            let trim_before = self.src.get(open + 2) == Some(&b'-')
                && self.src.get(open + 3).is_some_and(|b| is_space(*b));
            if trim_before {
                let end = text
                    .iter()
                    .rposition(|b| !is_space(*b))
                    .map_or(0, |i| i + 1);
                text = &text[..end];
            }
            if !text.is_empty() {
                list.push(Node::Text(text.to_vec()));
            }
            self.advance(open + if trim_before { 4 } else { 2 });
            let Some(tokens) = self.action_tokens()? else {
                continue; // a comment
            };
            match self.action(tokens)? {
                Step::Node(node) => list.push(node),
                Step::Close(end) => return Ok((list, end)),
            }
        }
    }

    /// The tokens of the action just opened, through its `}}`; `None` for a
    /// comment.
    fn action_tokens(&mut self) -> Result<Option<Vec<Token>>, ParseError> {
        // A comment is the whole action.
        let rest = &self.src[self.pos..];
        let lead = rest.iter().take_while(|b| is_space(**b)).count();
        if rest[lead..].starts_with(b"/*") {
            let Some(close) = find(self.src, self.pos + lead + 2, b"*/") else {
                return Err(self.error("unclosed comment"));
            };
            let mut at = close + 2;
            let tail = &self.src[at..];
            let spaces = tail.iter().take_while(|b| is_space(**b)).count();
            if tail[spaces..].starts_with(b"-}}") && spaces > 0 {
                self.trim_next = true;
                at += spaces + 3;
            } else if tail.starts_with(b"}}") {
                at += 2;
            } else {
                return Err(self.error("comment ends before closing delimiter"));
            }
            self.advance(at);
            return Ok(None);
        }
        let mut tokens = Vec::new();
        let mut spaced = true;
        loop {
            let Some(&c) = self.src.get(self.pos) else {
                return Err(self.error("unclosed action"));
            };
            if is_space(c) {
                let rest = &self.src[self.pos..];
                let n = rest.iter().take_while(|b| is_space(**b)).count();
                if rest[n..].starts_with(b"-}}") {
                    self.trim_next = true;
                    self.advance(self.pos + n + 3);
                    return Ok(Some(tokens));
                }
                self.advance(self.pos + n);
                spaced = true;
                continue;
            }
            if self.src[self.pos..].starts_with(b"}}") {
                self.advance(self.pos + 2);
                return Ok(Some(tokens));
            }
            let tok = self.token()?;
            tokens.push(Token { tok, spaced });
            spaced = false;
        }
    }

    fn token(&mut self) -> Result<Tok, ParseError> {
        let src = self.src;
        let start = self.pos;
        let c = src[start];
        let ident_end = |from: usize| {
            let mut i = from;
            while src
                .get(i)
                .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b >= 0x80)
            {
                i += 1;
            }
            i
        };
        let (tok, end) = match c {
            b'|' => (Tok::Pipe, start + 1),
            b'(' => (Tok::LParen, start + 1),
            b')' => (Tok::RParen, start + 1),
            b',' => (Tok::Comma, start + 1),
            b'=' => (Tok::Assign, start + 1),
            b':' if src.get(start + 1) == Some(&b'=') => (Tok::Declare, start + 2),
            b'.' if src.get(start + 1).is_some_and(u8::is_ascii_digit) => self.number(start)?,
            b'.' => {
                let end = ident_end(start + 1);
                if end == start + 1 {
                    (Tok::Dot, end)
                } else {
                    (Tok::Field(utf8(&src[start + 1..end])), end)
                }
            }
            b'$' => {
                let end = ident_end(start + 1);
                (Tok::Var(utf8(&src[start..end])), end)
            }
            b'"' => {
                let (s, end) = self.quoted(start)?;
                (Tok::Str(s), end)
            }
            b'`' => {
                let Some(close) = find(src, start + 1, b"`") else {
                    return Err(self.error("unterminated raw quoted string"));
                };
                let raw: Vec<u8> = src[start + 1..close]
                    .iter()
                    .copied()
                    .filter(|b| *b != b'\r')
                    .collect();
                (Tok::Str(raw), close + 1)
            }
            b'\'' => self.char_constant(start)?,
            b'+' | b'-' | b'0'..=b'9' => self.number(start)?,
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let end = ident_end(start);
                (Tok::Ident(utf8(&src[start..end])), end)
            }
            c => {
                return Err(self.error(format!("unexpected {:?} in command", char::from(c))));
            }
        };
        self.advance(end);
        Ok(tok)
    }

    fn number(&self, start: usize) -> Result<(Tok, usize), ParseError> {
        let src = self.src;
        let mut i = start;
        if matches!(src.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        while src.get(i).is_some_and(|b| {
            b.is_ascii_alphanumeric()
                || *b == b'.'
                || *b == b'_'
                || ((*b == b'+' || *b == b'-') && matches!(src[i - 1], b'e' | b'E' | b'p' | b'P'))
        }) {
            i += 1;
        }
        Ok((Tok::Number(utf8(&src[start..i])), i))
    }

    /// A double-quoted string with Go's escapes, ending at its quote.
    fn quoted(&self, start: usize) -> Result<(Vec<u8>, usize), ParseError> {
        let src = self.src;
        let mut out = Vec::new();
        let mut i = start + 1;
        loop {
            match src.get(i) {
                None | Some(b'\n') => return Err(self.error("unterminated quoted string")),
                Some(b'"') => return Ok((out, i + 1)),
                Some(b'\\') => {
                    let (bytes, len) = self.escape(i, b'"')?;
                    out.extend_from_slice(&bytes);
                    i += len;
                }
                Some(b) => {
                    out.push(*b);
                    i += 1;
                }
            }
        }
    }

    /// The escape at `at` (a backslash): its bytes and its length.
    fn escape(&self, at: usize, quote: u8) -> Result<(Vec<u8>, usize), ParseError> {
        let src = self.src;
        let bad = || self.error("invalid syntax in quoted string");
        let c = *src.get(at + 1).ok_or_else(bad)?;
        let simple = match c {
            b'a' => Some(7),
            b'b' => Some(8),
            b'f' => Some(12),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'v' => Some(11),
            b'\\' => Some(b'\\'),
            c if c == quote => Some(c),
            _ => None,
        };
        if let Some(b) = simple {
            return Ok((vec![b], 2));
        }
        let hex = |n: usize| -> Result<u32, ParseError> {
            let digits = src.get(at + 2..at + 2 + n).ok_or_else(bad)?;
            u32::from_str_radix(std::str::from_utf8(digits).map_err(|_| bad())?, 16)
                .map_err(|_| bad())
        };
        match c {
            b'x' => Ok((vec![hex(2)? as u8], 4)),
            b'0'..=b'7' => {
                let digits = src.get(at + 1..at + 4).ok_or_else(bad)?;
                let v = u32::from_str_radix(std::str::from_utf8(digits).map_err(|_| bad())?, 8)
                    .map_err(|_| bad())?;
                u8::try_from(v).map(|b| (vec![b], 4)).map_err(|_| bad())
            }
            b'u' | b'U' => {
                let n = if c == b'u' { 4 } else { 8 };
                let c = char::from_u32(hex(n)?).ok_or_else(bad)?;
                Ok((c.to_string().into_bytes(), 2 + n))
            }
            _ => Err(bad()),
        }
    }

    fn char_constant(&self, start: usize) -> Result<(Tok, usize), ParseError> {
        let src = self.src;
        let bad = || self.error("malformed character constant");
        let (bytes, len) = if src.get(start + 1) == Some(&b'\\') {
            self.escape(start + 1, b'\'')?
        } else {
            let rest = &src[start + 1..];
            let s = std::str::from_utf8(&rest[..rest.len().min(4)])
                .or_else(|e| std::str::from_utf8(&rest[..e.valid_up_to()]))
                .map_err(|_| bad())?;
            let c = s.chars().next().ok_or_else(bad)?;
            (c.to_string().into_bytes(), c.len_utf8())
        };
        if src.get(start + 1 + len) != Some(&b'\'') {
            return Err(bad());
        }
        let value = match std::str::from_utf8(&bytes) {
            Ok(s) if s.chars().count() == 1 => s.chars().next().map_or(0, |c| c as i64),
            _ => i64::from(bytes[0]),
        };
        Ok((Tok::Char(value), start + len + 2))
    }

    /// The node of an action, or the end of the enclosing list.
    fn action(&mut self, tokens: Vec<Token>) -> Result<Step, ParseError> {
        let keyword = match tokens.first() {
            Some(Token {
                tok: Tok::Ident(k), ..
            }) => k.as_str(),
            _ => "",
        };
        match keyword {
            "end" => {
                if tokens.len() > 1 {
                    return Err(self.error("unexpected token in end"));
                }
                Ok(Step::Close(Close::End))
            }
            "else" => Ok(Step::Close(Close::Else(tokens[1..].to_vec()))),
            "if" | "with" | "range" => self.control(keyword, tokens[1..].to_vec()).map(Step::Node),
            "define" | "template" | "block" | "break" | "continue" => Err(self.error(format!(
                "{{{{{keyword}}}}} is not supported in request log templates"
            ))),
            _ => {
                let pipe = self.pipeline(&tokens, "command")?;
                Ok(Step::Node(Node::Action(pipe)))
            }
        }
    }

    /// `if`, `with` or `range`, through its `{{end}}`.
    fn control(&mut self, keyword: &str, tokens: Vec<Token>) -> Result<Node, ParseError> {
        let scope = self.vars.len();
        let pipe = self.pipeline(&tokens, keyword)?;
        let (then, end) = self.list()?;
        let otherwise = match end {
            Close::Eof => return Err(self.error(format!("unexpected EOF in {keyword}"))),
            Close::End => Vec::new(),
            Close::Else(rest) if rest.is_empty() => {
                let (otherwise, end) = self.list()?;
                match end {
                    Close::End => otherwise,
                    Close::Eof => return Err(self.error(format!("unexpected EOF in {keyword}"))),
                    Close::Else(_) => return Err(self.error("expected end; found {{else}}")),
                }
            }
            // `{{else if ...}}` (and `else with`) is an `if` nested in
            // the else branch, sharing its `{{end}}`.
            Close::Else(rest) => match rest.first().map(|t| &t.tok) {
                Some(Tok::Ident(k)) if (k == "if" || k == "with") && k == keyword => {
                    self.vars.truncate(scope);
                    let k = k.clone();
                    vec![self.control(&k, rest[1..].to_vec())?]
                }
                _ => return Err(self.error("unexpected token after else")),
            },
        };
        self.vars.truncate(scope);
        Ok(match keyword {
            "if" => Node::If {
                pipe,
                then,
                otherwise,
            },
            "with" => Node::With {
                pipe,
                then,
                otherwise,
            },
            _ => Node::Range {
                pipe,
                body: then,
                otherwise,
            },
        })
    }

    /// A pipeline, with its leading variable declaration if any.
    fn pipeline(&mut self, tokens: &[Token], context: &str) -> Result<Pipeline, ParseError> {
        let mut rest = tokens;
        let mut vars = Vec::new();
        let mut assign = false;
        // `$x :=`, `$x =`, `$i, $e :=` (range only).
        let decl = match tokens {
            [
                Token {
                    tok: Tok::Var(v), ..
                },
                Token {
                    tok: op @ (Tok::Declare | Tok::Assign),
                    ..
                },
                ..,
            ] => Some((vec![v.clone()], op == &Tok::Assign, 2)),
            [
                Token {
                    tok: Tok::Var(a), ..
                },
                Token {
                    tok: Tok::Comma, ..
                },
                Token {
                    tok: Tok::Var(b), ..
                },
                Token {
                    tok: op @ (Tok::Declare | Tok::Assign),
                    ..
                },
                ..,
            ] if context == "range" => Some((vec![a.clone(), b.clone()], op == &Tok::Assign, 4)),
            _ => None,
        };
        if let Some((declared, is_assign, n)) = decl {
            rest = &tokens[n..];
            assign = is_assign;
            vars = declared;
        }
        let mut cmds = Vec::new();
        let mut i = 0;
        loop {
            let (cmd, used) = self.command(&rest[i..])?;
            i += used;
            cmds.push(cmd);
            match rest.get(i).map(|t| &t.tok) {
                None => break,
                Some(Tok::Pipe) => i += 1,
                Some(t) => return Err(self.error(format!("unexpected {t:?} in {context}"))),
            }
        }
        if assign {
            for v in &vars {
                if !self.vars.contains(v) {
                    return Err(self.error(format!("undefined variable \"{v}\"")));
                }
            }
        } else {
            self.vars.extend(vars.iter().cloned());
        }
        Ok(Pipeline { vars, assign, cmds })
    }

    /// One command, up to a `|`, a `)` or the end; with how many tokens it
    /// took.
    fn command(&mut self, tokens: &[Token]) -> Result<(Command, usize), ParseError> {
        let mut args = Vec::new();
        let mut i = 0;
        while let Some(token) = tokens.get(i) {
            if matches!(token.tok, Tok::Pipe | Tok::RParen) {
                break;
            }
            if !args.is_empty() && !token.spaced && token.tok != Tok::LParen {
                return Err(self.error(format!("missing space before {:?}", token.tok)));
            }
            let (operand, used) = self.operand(&tokens[i..])?;
            args.push(operand);
            i += used;
        }
        if args.is_empty() {
            return Err(self.error("missing value for command"));
        }
        Ok((Command { args }, i))
    }

    fn operand(&mut self, tokens: &[Token]) -> Result<(Operand, usize), ParseError> {
        let mut used = 1;
        let term = match &tokens[0].tok {
            Tok::Dot => Term::Dot,
            Tok::Field(f) => {
                let mut chain = vec![f.clone()];
                while let Some(Token {
                    tok: Tok::Field(f),
                    spaced: false,
                }) = tokens.get(used)
                {
                    chain.push(f.clone());
                    used += 1;
                }
                return Ok((
                    Operand {
                        term: Term::Field(chain),
                        chain: Vec::new(),
                    },
                    used,
                ));
            }
            Tok::Var(v) => {
                if !self.vars.contains(v) {
                    return Err(self.error(format!("undefined variable \"{v}\"")));
                }
                Term::Var(v.clone())
            }
            Tok::Ident(name) => match name.as_str() {
                "true" => Term::Bool(true),
                "false" => Term::Bool(false),
                "nil" => Term::Nil,
                name if funcs::exists(name) => Term::Func(name.to_owned()),
                name => return Err(self.error(format!("function \"{name}\" not defined"))),
            },
            Tok::Str(s) => Term::Str(s.clone()),
            Tok::Char(c) => Term::Int(*c),
            Tok::Number(n) => self.number_term(n)?,
            Tok::LParen => {
                let inner = &tokens[1..];
                let close =
                    matching_paren(inner).ok_or_else(|| self.error("unclosed left paren"))?;
                let pipe = self.pipeline(&inner[..close], "parenthesized pipeline")?;
                used = close + 2;
                Term::Pipe(Box::new(pipe))
            }
            t => return Err(self.error(format!("unexpected {t:?} in operand"))),
        };
        let mut chain = Vec::new();
        while let Some(Token {
            tok: Tok::Field(f),
            spaced: false,
        }) = tokens.get(used)
        {
            chain.push(f.clone());
            used += 1;
        }
        if !chain.is_empty() && !matches!(term, Term::Var(_) | Term::Pipe(_) | Term::Dot) {
            return Err(self.error("unexpected . after term"));
        }
        Ok((Operand { term, chain }, used))
    }

    fn number_term(&self, n: &str) -> Result<Term, ParseError> {
        let bad = || self.error(format!("bad number syntax: \"{n}\""));
        let (negative, digits) = match n.as_bytes().first() {
            Some(b'-') => (true, &n[1..]),
            Some(b'+') => (false, &n[1..]),
            _ => (false, n),
        };
        let digits = digits.replace('_', "");
        let lower = digits.to_ascii_lowercase();
        let int = if let Some(hex) = lower.strip_prefix("0x") {
            i64::from_str_radix(hex, 16).ok()
        } else if let Some(oct) = lower.strip_prefix("0o") {
            i64::from_str_radix(oct, 8).ok()
        } else if let Some(bin) = lower.strip_prefix("0b") {
            i64::from_str_radix(bin, 2).ok()
        } else if lower.len() > 1
            && lower.starts_with('0')
            && lower.bytes().all(|b| b.is_ascii_digit())
        {
            i64::from_str_radix(&lower[1..], 8).ok()
        } else {
            lower.parse::<i64>().ok()
        };
        if let Some(i) = int {
            return Ok(Term::Int(if negative { -i } else { i }));
        }
        if lower.starts_with("0x") {
            return Err(bad());
        }
        let f: f64 = lower.parse().map_err(|_| bad())?;
        Ok(Term::Float(if negative { -f } else { f }))
    }
}

enum Step {
    Node(Node),
    Close(Close),
}

fn matching_paren(tokens: &[Token]) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate() {
        match t.tok {
            Tok::LParen => depth += 1,
            Tok::RParen if depth == 0 => return Some(i),
            Tok::RParen => depth -= 1,
            _ => {}
        }
    }
    None
}

fn find(haystack: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

fn utf8(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
