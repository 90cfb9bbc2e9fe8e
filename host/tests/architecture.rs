//! The library's module graph has no cycles: a reader following a message
//! only ever goes down the layers (docs/architecture.md).
//!
//! Every top-level module of `host/src` (a file, or a folder with its
//! submodules) is a node; a `crate::<module>` path in its code, outside
//! comments, is an edge. Regression test for the cycles that once ran
//! `pipeline` ↔ `produce`, `pipeline` ↔ `scheduler`, `pipeline` ↔ `events`
//! and `config` ↔ `kafka`.

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
