//! The crate's modules stay in layers: each uses only modules below its
//! own, as the crate docs (`src/lib.rs`) list them, so that no two modules
//! need each other. Read off the sources: every `crate::<module>` path
//! outside comments.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level modules, bottom up; a module may use those of the layers
/// before its own.
const LAYERS: &[&[&str]] = &[
    &["common"],
    &["config"],
    &["observe", "readiness", "drain", "proxy", "tls"],
    &["layers"],
    &["stack"],
    &["admin", "stats", "profiling"],
    &["server"],
    &["demo", "fuzz"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The modules `lib.rs` declares.
fn declared(src: &Path) -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")?.strip_suffix(';').map(str::to_owned)
        })
        .collect()
}

/// `text` without its comments (line comments only: the crate has no
/// block comments).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segment of every `crate::` path in `code`, braced groups
/// (`use crate::{a::b, c}`) included.
fn used(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let head = item.trim().split("::").next().unwrap_or("");
                out.insert(head.to_owned());
            }
        } else {
            let head: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(head);
        }
    }
    out
}

/// Each top-level module and the crate's other top-level modules it uses.
fn dependencies(src: &Path, modules: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let relative = path.strip_prefix(src).unwrap();
            let first = relative.components().next().unwrap();
            let top = first.as_os_str().to_string_lossy();
            let top = top.trim_end_matches(".rs").to_owned();
            if !modules.contains(&top) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let entry = deps.entry(top.clone()).or_default();
            for module in used(&code(&text)) {
                if module != top && modules.contains(&module) {
                    entry.insert(module);
                }
            }
        }
    }
    deps
}

#[test]
fn every_module_uses_only_the_layers_below_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = declared(&src);
    for module in &modules {
        assert!(
            layer_of(module).is_some(),
            "module {module} is in no layer: add it to LAYERS and to the crate docs"
        );
    }
    let deps = dependencies(&src, &modules);
    assert!(
        deps.contains_key("layers") && deps.contains_key("server"),
        "the sources were read: {deps:?}"
    );
    for (module, uses) in &deps {
        let own = layer_of(module).unwrap();
        for dep in uses {
            let theirs = layer_of(dep).unwrap();
            assert!(
                theirs < own,
                "{module} uses {dep}, which is not below it; the layers are {LAYERS:?}"
            );
        }
    }
}

#[test]
fn the_reader_sees_braced_and_plain_paths_but_not_comments() {
    let text = "use crate::common::body::Body;\nuse crate::{drain::Drainer, stats};\n// crate::server\nlet x = crate::proxy::hop::f(); // crate::demo";
    let got = used(&code(text));
    let want: BTreeSet<String> = ["common", "drain", "stats", "proxy"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(got, want);
}
