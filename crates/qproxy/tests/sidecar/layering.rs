//! The sidecar crate's modules stay in layers, and no modules anywhere in
//! the workspace need each other: what Cargo cannot say (it keeps the
//! crates in order: `qproxy-core` below `qproxy-observe` below `qproxy`).
//! Read off the sources by [`qproxy_test_support::modgraph`]: every path
//! to another module, at any depth.
//!
//! - Across top-level modules of `qproxy`, each uses only those of the
//!   layers below its own, as the crate docs (`src/lib.rs`) list them.
//! - Inside a crate, in every crate of the workspace, no module uses one
//!   that uses it back, directly or round a longer cycle.

use std::path::{Path, PathBuf};

use qproxy_test_support::modgraph::{ModGraph, ROOT};

/// The top-level modules, bottom up; a module may use those of the layers
/// before its own. The crate root's own items (`run`, `shutdown_signal`)
/// sit above the server they start.
const LAYERS: &[&[&str]] = &[
    &["config", "go", "tunnel_registry", "dir_events"],
    &["readiness", "drain", "proxy", "tls"],
    &["layers"],
    &["stack"],
    &["admin", "stat_server", "profiling"],
    &["server"],
    &[ROOT],
    &["demo", "fuzz"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

#[test]
fn every_module_uses_only_the_layers_below_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = ModGraph::read(&src, "lib.rs");
    assert!(
        graph.files.contains_key("crate::layers::timeout")
            && graph.files.contains_key("crate::server::conn"),
        "the sources were read: {:?}",
        graph.files.keys()
    );
    for module in graph.files.keys() {
        let top = ModGraph::top(module);
        assert!(
            layer_of(top).is_some(),
            "module {top} is in no layer: add it to LAYERS and to the crate docs"
        );
    }
    for (module, uses) in &graph.uses {
        let (top, own) = (
            ModGraph::top(module),
            layer_of(ModGraph::top(module)).unwrap(),
        );
        for dep in uses {
            let theirs = ModGraph::top(dep);
            if theirs == top {
                continue;
            }
            assert!(
                layer_of(theirs).unwrap() < own,
                "{} ({module}) uses {dep}, which is not below it; the layers are {LAYERS:?}",
                graph.files[module].display()
            );
        }
    }
}

/// Each crate root of the workspace: its source directory and root file.
fn crate_roots() -> Vec<(PathBuf, &'static str)> {
    let root = workspace();
    let mut roots = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        for file in ["lib.rs", "main.rs"] {
            if src.join(file).exists() {
                roots.push((src.clone(), file));
            }
        }
    }
    roots.push((root.join("tests/support/src"), "lib.rs"));
    roots.push((root.join("tests/e2e"), "main.rs"));
    roots.push((
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sidecar"),
        "main.rs",
    ));
    roots.sort();
    roots
}

#[test]
fn no_crate_in_the_workspace_has_an_import_cycle() {
    let roots = crate_roots();
    assert!(
        roots.len() >= 8,
        "the workspace's crates were found: {roots:?}"
    );
    let mut found = Vec::new();
    for (src, root) in &roots {
        let graph = ModGraph::read(src, root);
        assert!(
            !graph.files.is_empty(),
            "{} was read",
            src.join(root).display()
        );
        for cycle in graph.cycles() {
            let files: Vec<String> = cycle
                .iter()
                .map(|f| src.join(f).display().to_string())
                .collect();
            found.push(files.join(" <-> "));
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}
