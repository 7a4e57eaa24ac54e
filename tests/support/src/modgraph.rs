//! A crate's modules and the paths between them, read off its sources: the
//! graph that the layering tests check for layers and cycles.
//!
//! A node is a module that has a file of its own (`a/b.rs` or `a/b/mod.rs`
//! is `a::b`; the crate root is `crate`). Its edges are every path in its
//! code that names another module of the crate: `crate::…`, `super::…`,
//! `self::…`, or one of its own children (`body::Body` where the file
//! declares `mod body;`), braced groups expanded at any depth. A path
//! resolves to the longest module it names; an item it names through a
//! module that re-exports it from a child (`pub use child::Item`) resolves
//! on into that child. A `pub use` of a module's own descendant is a facade,
//! not an edge. Comments, string and char literals, and test-only modules
//! (`#[cfg(test)] mod tests { … }`, or a file declared under
//! `#[cfg(test)]`) are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crate root's name in [`ModGraph`].
pub const ROOT: &str = "crate";

/// The modules of one crate (a library or a binary), and which use which.
#[derive(Debug, Default)]
pub struct ModGraph {
    /// Each module's file, relative to the crate's source directory.
    pub files: BTreeMap<String, PathBuf>,
    /// Each module, and the other modules its code names.
    pub uses: BTreeMap<String, BTreeSet<String>>,
}

/// One module's file, read.
#[derive(Debug, Default)]
struct Module {
    /// Its children (`mod x;`, not under `#[cfg(test)]`).
    children: BTreeSet<String>,
    /// Paths its code names, each with whether a `pub` `use` names it.
    paths: Vec<(Vec<String>, bool)>,
}

impl ModGraph {
    /// The graph of the crate whose root file is `src/root` (`lib.rs` or
    /// `main.rs`), read from disk.
    pub fn read(src: &Path, root: &str) -> ModGraph {
        let mut files = BTreeMap::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    files.insert(path.strip_prefix(src).unwrap().to_path_buf(), text);
                }
            }
        }
        ModGraph::from_files(root, &files)
    }

    /// The graph of the crate whose root is `root` among `files` (paths
    /// relative to its source directory, and their text).
    pub fn from_files(root: &str, files: &BTreeMap<PathBuf, String>) -> ModGraph {
        let mut graph = ModGraph::default();
        let mut modules: BTreeMap<String, Module> = BTreeMap::new();
        // Modules to read: name, file, the directory its children are in.
        let mut queue = vec![(ROOT.to_owned(), PathBuf::from(root), PathBuf::new())];
        while let Some((name, file, dir)) = queue.pop() {
            let Some(text) = files.get(&file) else {
                continue;
            };
            let module = read_module(text);
            for child in &module.children {
                let flat = dir.join(format!("{child}.rs"));
                let nested = dir.join(child).join("mod.rs");
                let (file, child_dir) = if files.contains_key(&flat) {
                    (flat, dir.join(child))
                } else {
                    (nested, dir.join(child))
                };
                queue.push((join(&name, child), file, child_dir));
            }
            graph.files.insert(name.clone(), file);
            modules.insert(name, module);
        }
        for (name, module) in &modules {
            let mut uses = BTreeSet::new();
            for (path, public) in &module.paths {
                let Some(target) = resolve(&modules, name, path) else {
                    continue;
                };
                let facade = *public && is_below(&target, name);
                if target != *name && !facade {
                    uses.insert(target);
                }
            }
            graph.uses.insert(name.clone(), uses);
        }
        graph
    }

    /// The module's top-level module (`server` for `server::conn`), or
    /// [`ROOT`] for the root.
    pub fn top(module: &str) -> &str {
        module
            .strip_prefix("crate::")
            .map_or(ROOT, |m| m.split("::").next().unwrap_or(m))
    }

    /// Every cycle among the modules, each as the files of one strongly
    /// connected set (Tarjan's algorithm), in a stable order.
    pub fn cycles(&self) -> Vec<Vec<PathBuf>> {
        let names: Vec<&String> = self.uses.keys().collect();
        let index_of: BTreeMap<&String, usize> =
            names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let edges: Vec<Vec<usize>> = names
            .iter()
            .map(|n| {
                self.uses[*n]
                    .iter()
                    .filter_map(|t| index_of.get(t).copied())
                    .collect()
            })
            .collect();
        let mut tarjan = Tarjan::new(names.len());
        for v in 0..names.len() {
            if tarjan.index[v].is_none() {
                tarjan.connect(v, &edges);
            }
        }
        tarjan
            .sets
            .into_iter()
            .filter(|set| set.len() > 1)
            .map(|set| {
                let mut files: Vec<PathBuf> =
                    set.iter().map(|&v| self.files[names[v]].clone()).collect();
                files.sort();
                files
            })
            .collect()
    }
}

/// Tarjan's strongly connected components, recursive (module graphs are
/// shallow).
struct Tarjan {
    next: usize,
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    sets: Vec<Vec<usize>>,
}

impl Tarjan {
    fn new(n: usize) -> Self {
        Tarjan {
            next: 0,
            index: vec![None; n],
            low: vec![0; n],
            on_stack: vec![false; n],
            stack: Vec::new(),
            sets: Vec::new(),
        }
    }

    fn connect(&mut self, v: usize, edges: &[Vec<usize>]) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in &edges[v] {
            match self.index[w] {
                None => {
                    self.connect(w, edges);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut set = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                set.push(w);
                if w == v {
                    break;
                }
            }
            self.sets.push(set);
        }
    }
}

fn join(parent: &str, child: &str) -> String {
    format!("{parent}::{child}")
}

/// Whether `module` is a strict descendant of `ancestor`.
fn is_below(module: &str, ancestor: &str) -> bool {
    module
        .strip_prefix(ancestor)
        .is_some_and(|rest| rest.starts_with("::"))
}

/// The module `path`, named in `from`, resolves to, if it names one of
/// the crate's.
fn resolve(modules: &BTreeMap<String, Module>, from: &str, path: &[String]) -> Option<String> {
    let (mut base, mut rest) = match path.first()?.as_str() {
        "crate" => (ROOT.to_owned(), &path[1..]),
        "self" => (from.to_owned(), &path[1..]),
        "super" => {
            let mut base = from.to_owned();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base = base.rsplit_once("::")?.0.to_owned();
                rest = &rest[1..];
            }
            (base, rest)
        }
        child if modules.get(from)?.children.contains(child) => (join(from, child), &path[1..]),
        _ => return None,
    };
    // Facades followed at most a few deep: a re-export of a re-export.
    for _ in 0..8 {
        while let Some(next) = rest.first() {
            let candidate = join(&base, next);
            if !modules.contains_key(&candidate) {
                break;
            }
            base = candidate;
            rest = &rest[1..];
        }
        let Some(item) = rest.first() else {
            break;
        };
        match reexport(modules, &base, item) {
            Some(child) if child != base => base = child,
            _ => break,
        }
    }
    Some(base)
}

/// The descendant of `module` that `item`, re-exported by `module`
/// (`pub use child::item`), comes from.
fn reexport(modules: &BTreeMap<String, Module>, module: &str, item: &str) -> Option<String> {
    let m = modules.get(module)?;
    m.paths.iter().find_map(|(path, public)| {
        if !*public || path.last().map(String::as_str) != Some(item) {
            return None;
        }
        let inner = &path[..path.len() - 1];
        let target = resolve_module_prefix(modules, module, inner)?;
        is_below(&target, module).then_some(target)
    })
}

/// The module that `path` (module segments only) names from `from`.
fn resolve_module_prefix(
    modules: &BTreeMap<String, Module>,
    from: &str,
    path: &[String],
) -> Option<String> {
    let (mut base, rest) = match path.first()?.as_str() {
        "crate" => (ROOT.to_owned(), &path[1..]),
        "self" => (from.to_owned(), &path[1..]),
        child if modules.get(from)?.children.contains(child) => (join(from, child), &path[1..]),
        _ => return None,
    };
    for segment in rest {
        let candidate = join(&base, segment);
        if !modules.contains_key(&candidate) {
            break;
        }
        base = candidate;
    }
    Some(base)
}

/// A file's children and the paths its code names.
fn read_module(text: &str) -> Module {
    let code = strip(text);
    let tokens = tokenize(&code);
    let tokens = without_test_modules(&tokens);
    let mut module = Module::default();
    // Children: `mod name;`.
    for w in tokens.windows(3) {
        if w[0] == "mod" && w[2] == ";" && is_ident(&w[1]) {
            module.children.insert(w[1].clone());
        }
    }
    // Paths, and whether each is in a `pub` `use`.
    let mut public_use = false;
    let mut in_use = false;
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        if t == "use" {
            in_use = true;
            public_use = is_public_before(&tokens, i);
            i += 1;
            continue;
        }
        if t == ";" {
            in_use = false;
            public_use = false;
        }
        let starts = is_ident(t) && !(i > 0 && tokens[i - 1] == "::");
        if starts && tokens.get(i + 1).is_some_and(|n| n == "::") {
            let (paths, end) = read_path(&tokens, i, Vec::new());
            for path in paths {
                module.paths.push((path, in_use && public_use));
            }
            i = end;
            continue;
        }
        i += 1;
    }
    module
}

/// Whether the `use` at `at` is preceded by a `pub` visibility.
fn is_public_before(tokens: &[String], at: usize) -> bool {
    let mut j = at;
    if j > 0 && tokens[j - 1] == ")" {
        while j > 0 && tokens[j - 1] != "(" {
            j -= 1;
        }
        j = j.saturating_sub(1);
    }
    j > 0 && tokens[j - 1] == "pub"
}

/// The paths of the path starting at `at` (`a::b::{c, d::{e, f}}` is
/// three), each after `prefix`; and the index after it.
fn read_path(tokens: &[String], at: usize, prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let mut path = prefix;
    let mut i = at;
    loop {
        match tokens.get(i).map(String::as_str) {
            Some("{") => {
                let mut out = Vec::new();
                i += 1;
                while let Some(t) = tokens.get(i) {
                    match t.as_str() {
                        "}" => {
                            i += 1;
                            break;
                        }
                        "," => i += 1,
                        t if is_ident(t) || t == "*" => {
                            let (paths, end) = read_path(tokens, i, path.clone());
                            out.extend(paths);
                            i = end;
                        }
                        _ => i += 1,
                    }
                }
                return (out, i);
            }
            Some(t) if is_ident(t) || t == "*" => {
                path.push(t.to_owned());
                i += 1;
                if tokens.get(i).is_some_and(|n| n == "::") {
                    i += 1;
                    continue;
                }
                // `item as alias`: the alias is what a re-export names.
                if tokens.get(i).is_some_and(|n| n == "as")
                    && let Some(alias) = tokens.get(i + 1)
                {
                    let mut aliased = path.clone();
                    aliased.pop();
                    aliased.push(alias.clone());
                    return (vec![path, aliased], i + 2);
                }
                return (vec![path], i);
            }
            _ => return (vec![path], i),
        }
    }
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && t.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The tokens that matter here: identifiers, `::`, and single punctuation.
fn tokenize(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
            continue;
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
        i += 1;
    }
    out
}

/// `tokens` without test-only modules: `#[cfg(test)] mod x { … }` to its
/// closing brace, and `#[cfg(test)] mod x;` (so `x` is no child).
fn without_test_modules(tokens: &[String]) -> Vec<String> {
    const CFG_TEST: [&str; 7] = ["#", "[", "cfg", "(", "test", ")", "]"];
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i..].starts_with(&CFG_TEST.map(str::to_owned)) {
            let mut j = i + CFG_TEST.len();
            while tokens
                .get(j)
                .is_some_and(|t| t == "pub" || t == "(" || t == ")" || t == "crate")
            {
                j += 1;
            }
            if tokens.get(j).is_some_and(|t| t == "mod") {
                match tokens.get(j + 2).map(String::as_str) {
                    Some(";") => {
                        i = j + 3;
                        continue;
                    }
                    Some("{") => {
                        let mut depth = 0;
                        let mut k = j + 2;
                        while k < tokens.len() {
                            match tokens[k].as_str() {
                                "{" => depth += 1,
                                "}" => {
                                    depth -= 1;
                                    if depth == 0 {
                                        break;
                                    }
                                }
                                _ => {}
                            }
                            k += 1;
                        }
                        i = k + 1;
                        continue;
                    }
                    _ => {}
                }
            }
        }
        out.push(tokens[i].clone());
        i += 1;
    }
    out
}

/// `text` with comments, string literals and char literals blanked
/// (lifetimes kept), so that nothing in them reads as a path or a brace.
fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '/' if next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                let mut depth = 0;
                while i < chars.len() {
                    if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                out.push(' ');
            }
            'r' if (next == Some('"') || next == Some('#'))
                && !chars[..i]
                    .last()
                    .is_some_and(|p| p.is_alphanumeric() || *p == '_') =>
            {
                // A raw string: r"…", r#"…"#, and so on.
                let mut j = i + 1;
                let mut hashes = 0;
                while chars.get(j) == Some(&'#') {
                    hashes += 1;
                    j += 1;
                }
                if chars.get(j) != Some(&'"') {
                    out.push(c);
                    i += 1;
                    continue;
                }
                j += 1;
                loop {
                    match chars.get(j) {
                        None => break,
                        Some('"') if (1..=hashes).all(|h| chars.get(j + h) == Some(&'#')) => {
                            j += 1 + hashes;
                            break;
                        }
                        Some(_) => j += 1,
                    }
                }
                out.push_str("\"\"");
                i = j;
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                out.push_str("\"\"");
            }
            '\'' => {
                // A char literal ('a', '\n', '"'), or a lifetime ('a).
                if next == Some('\\') {
                    let mut j = i + 2;
                    while j < chars.len() && chars[j] != '\'' {
                        j += 1;
                    }
                    i = j + 1;
                    out.push_str("' '");
                } else if chars.get(i + 2) == Some(&'\'') {
                    i += 3;
                    out.push_str("' '");
                } else {
                    out.push(c);
                    i += 1;
                }
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> ModGraph {
        let files = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), (*t).to_owned()))
            .collect();
        ModGraph::from_files("lib.rs", &files)
    }

    fn uses(g: &ModGraph, module: &str) -> Vec<String> {
        g.uses[module].iter().cloned().collect()
    }

    #[test]
    fn paths_of_every_kind_are_edges_but_comments_strings_and_tests_are_not() {
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\nmod e;"),
            ("a/mod.rs", "mod x;\nmod y;\nuse x::X;"),
            (
                "a/x.rs",
                "use super::super::b::{B, inner::{I}};\nfn f() { crate::c::g(); }",
            ),
            (
                "a/y.rs",
                "// crate::d::D\nconst S: &str = \"crate::d\";\nconst R: &str = r#\"crate::e\"#;\nconst Q: char = '\"';\nfn g<'a>(x: &'a u8) {}\n#[cfg(test)]\nmod tests { use crate::d::D; }",
            ),
            ("b/mod.rs", "pub(crate) mod inner;"),
            ("b/inner.rs", ""),
            ("c.rs", ""),
            ("d.rs", ""),
            ("e.rs", ""),
        ]);
        assert_eq!(uses(&g, "crate::a"), ["crate::a::x"]);
        assert_eq!(
            uses(&g, "crate::a::x"),
            ["crate::b", "crate::b::inner", "crate::c"]
        );
        assert!(uses(&g, "crate::a::y").is_empty(), "{:?}", g.uses);
        assert!(g.cycles().is_empty());
    }

    #[test]
    fn an_item_reexported_from_a_child_resolves_into_the_child() {
        let g = graph(&[
            ("lib.rs", "mod low;\nmod high;"),
            (
                "low/mod.rs",
                "mod error;\npub(crate) use error::{Error as LowError, Kind};",
            ),
            ("low/error.rs", ""),
            (
                "high.rs",
                "use crate::low::LowError;\nuse crate::low::Kind;",
            ),
        ]);
        assert_eq!(uses(&g, "crate::high"), ["crate::low::error"]);
        assert!(uses(&g, "crate::low").is_empty(), "a facade is no edge");
    }

    #[test]
    fn a_cycle_between_siblings_is_found_with_its_files() {
        let g = graph(&[
            ("lib.rs", "mod common;"),
            ("common/mod.rs", "mod body;\nmod h1;"),
            ("common/body.rs", "use super::h1::Conn;"),
            ("common/h1.rs", "use super::body::Body;"),
        ]);
        assert_eq!(
            g.cycles(),
            [vec![
                PathBuf::from("common/body.rs"),
                PathBuf::from("common/h1.rs")
            ]]
        );
    }

    #[test]
    fn a_cycle_between_a_module_and_its_child_is_found() {
        let g = graph(&[
            ("lib.rs", "mod config;"),
            (
                "config/mod.rs",
                "mod probe;\nfn f() { probe::parse(); }\npub struct ConfigError;",
            ),
            ("config/probe.rs", "use super::ConfigError;"),
        ]);
        assert_eq!(
            g.cycles(),
            [vec![
                PathBuf::from("config/mod.rs"),
                PathBuf::from("config/probe.rs")
            ]]
        );
    }

    #[test]
    fn a_longer_cycle_is_one_set() {
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;"),
            ("a.rs", "use crate::b::B;"),
            ("b.rs", "use crate::c::C;"),
            ("c.rs", "fn f() { crate::a::g() }"),
        ]);
        assert_eq!(
            g.cycles(),
            [vec![
                PathBuf::from("a.rs"),
                PathBuf::from("b.rs"),
                PathBuf::from("c.rs")
            ]]
        );
    }

    #[test]
    fn top_level_modules_are_named_from_any_depth() {
        assert_eq!(ModGraph::top("crate::server::conn"), "server");
        assert_eq!(ModGraph::top("crate::stack"), "stack");
        assert_eq!(ModGraph::top(ROOT), ROOT);
    }
}
