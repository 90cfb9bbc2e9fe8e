//! The library's module graph has no cycles: a reader following a message
//! only ever goes down the layers (docs/architecture.md).
//!
//! Every top-level module of `host/src` (a file, or a folder with its
//! submodules) is a node; a `crate::<module>` path in its code, outside
//! comments, is an edge. Regression test for the cycles that once ran
//! `pipeline` ↔ `produce`, `pipeline` ↔ `scheduler`, `pipeline` ↔ `events`
//! and `config` ↔ `kafka`.
//!
//! lib.rs is the crate's map, above every module: its module declarations,
//! re-exports and the `Hopper` facade over `startup`, which builds and
//! starts everything and which no other module names. Regression test for
//! the lib.rs that held start-up itself, the allocator and the options.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module → the modules its code names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "bin" || name == "lib" {
            // The binary is a crate of its own; lib.rs is the root that
            // wires every module together.
            continue;
        }
        let mut files = Vec::new();
        collect_rs(&path, &mut files);
        let edges = graph.entry(name.clone()).or_default();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for line in text.lines() {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                let code = code.split("//").next().unwrap_or_default();
                for (i, _) in code.match_indices("crate::") {
                    let rest = &code[i + "crate::".len()..];
                    let target: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !target.is_empty() && target != name {
                        edges.insert(target);
                    }
                }
                // `use crate::{a, b::c}` names several modules at once.
                if let Some(group) = code.strip_prefix("use crate::{") {
                    for part in group.split(',') {
                        let target: String = part
                            .trim()
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        if !target.is_empty() && target != name {
                            edges.insert(target);
                        }
                    }
                }
            }
        }
    }
    graph
}

fn collect_rs(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            collect_rs(&entry.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The first cycle found, as `a → b → ... → a`.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Visiting,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Visiting) => {
                let start = stack.iter().position(|n| n == node).unwrap();
                let mut cycle = stack[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Visiting);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn the_module_graph_has_no_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    assert!(graph.len() > 10, "found only {:?}", graph.keys());
    for (module, uses) in &graph {
        for used in uses {
            assert!(
                graph.contains_key(used),
                "module `{module}` names `crate::{used}`, which is not a module of host/src"
            );
        }
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "the module graph has a cycle: {}; move the shared items down a layer (docs/architecture.md)",
            cycle.join(" → ")
        );
    }
}

/// `startup` wires every module together, so it is the top of the graph:
/// a module that named it would depend on all the others.
#[test]
fn no_module_names_startup() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    assert!(graph.contains_key("startup"), "no startup module");
    for (module, uses) in &graph {
        assert!(
            !uses.contains("startup"),
            "module `{module}` names `crate::startup`, the top of the module graph"
        );
    }
}

/// The statements a method of the `Hopper` facade may hold: it hands the
/// call to what `startup` built.
const FACADE_STATEMENTS: usize = 3;

/// lib.rs holds module declarations, re-exports and the `Hopper` facade,
/// whose methods are thin: what they do lives in the modules.
#[test]
fn lib_rs_is_the_map_and_the_facade() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    let file = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut wrong = Vec::new();
    for item in &file.items {
        match item {
            syn::Item::Mod(m) if m.content.is_none() => {}
            syn::Item::Use(_) => {}
            syn::Item::Struct(s) if s.ident == "Hopper" => {}
            syn::Item::Impl(i) if i.trait_.is_none() && names_hopper(&i.self_ty) => {
                for member in &i.items {
                    let syn::ImplItem::Fn(f) = member else {
                        wrong.push("an impl item of `Hopper` that is not a method".to_string());
                        continue;
                    };
                    let statements = f.block.stmts.len();
                    if statements > FACADE_STATEMENTS {
                        wrong.push(format!(
                            "`Hopper::{}`, {statements} statements (at most {FACADE_STATEMENTS})",
                            f.sig.ident
                        ));
                    }
                }
            }
            syn::Item::Mod(m) => wrong.push(format!("the inline module `{}`", m.ident)),
            syn::Item::Fn(f) => wrong.push(format!("the function `{}`", f.sig.ident)),
            syn::Item::Struct(s) => wrong.push(format!("the struct `{}`", s.ident)),
            syn::Item::Enum(e) => wrong.push(format!("the enum `{}`", e.ident)),
            syn::Item::Const(c) => wrong.push(format!("the const `{}`", c.ident)),
            syn::Item::Static(s) => wrong.push(format!("the static `{}`", s.ident)),
            syn::Item::Impl(_) => wrong.push("an impl of something other than `Hopper`".into()),
            _ => wrong.push("an item that is not a module, a re-export or `Hopper`".into()),
        }
    }
    assert!(
        wrong.is_empty(),
        "lib.rs is the crate's map (docs/architecture.md): modules, re-exports and the `Hopper` facade; move these into a module: {}",
        wrong.join("; ")
    );
}

fn names_hopper(ty: &syn::Type) -> bool {
    matches!(ty, syn::Type::Path(p) if p.path.is_ident("Hopper"))
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("pipeline", &["produce", "hop"][..]),
        ("produce", &["hop", "pipeline"][..]),
        ("hop", &[][..]),
    ]
    .into_iter()
    .map(|(m, uses)| (m.to_string(), uses.iter().map(|u| u.to_string()).collect()))
    .collect();
    assert_eq!(
        find_cycle(&graph).unwrap(),
        vec!["pipeline", "produce", "pipeline"]
    );
}
