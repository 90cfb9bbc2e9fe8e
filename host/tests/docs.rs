//! The docs name only things that exist.
//!
//! Every Markdown file in `docs/`, plus README.md and BENCHMARKS.md, is read,
//! and each inline code span (text in single backticks, outside fenced code
//! blocks) is checked if it is one of two kinds of reference:
//!
//! - **A source path**: a span ending in `.rs` (`host/src/hold.rs`,
//!   `plugin/handler.rs`, `mod.rs`), optionally followed by `::name`
//!   (`tests/tests/trust.rs::some_test`), or a directory (`host/src/dlq/`,
//!   `wit/deps/`: relative, with a `/`, ending in `/`). It must exist
//!   relative to the repository's root, or be the tail of a path that does
//!   (`plugin/handler.rs` is `host/src/plugin/handler.rs`), whole
//!   components only.
//!   With `::name`, that file must define a function `name`.
//! - **A Rust path**: `a::b` or longer, each segment an identifier
//!   (`Metrics::record`, `pipeline::run`, `hopper::egress::Transport`); a
//!   trailing call (`Hopper::status()`, `emit::publish(record)`) or `!` is
//!   cut off first. It must name an item defined in the workspace's Rust
//!   sources (see [`index`]): the segments are those of the item's path,
//!   read from the end, where the crate and modules in between may be left
//!   out (a module re-exports what it names in `pub use`, and the docs say
//!   `egress::Transport` for `egress::transport::Transport`), but never a
//!   type: `pipeline::run` is not `pipeline::partition::Runner::run`.
//!
//! A Rust path whose first segment is in [`EXTERNAL`] names something
//! outside the workspace (the standard library, librdkafka's client, the
//! WIT interfaces as a guest's bindings see them) and is not checked. Every
//! other first segment is checked, so a renamed or removed type is caught
//! as well as a renamed method; the list is kept short on purpose: a name
//! belongs on it only when it is really defined elsewhere.
//!
//! Spans of any other shape (config keys, shell commands, header names,
//! addresses like `::1`) are not references and are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// First segments of Rust paths defined outside the workspace.
const EXTERNAL: &[&str] = &[
    // The standard library and primitive types.
    "std",
    "core",
    "u64",
    "i64",
    "u32",
    // rdkafka's consumer.
    "StreamConsumer",
    // The WIT interfaces and their types as a guest's bindings name them
    // (docs/writing-handlers.md, docs/wit.md).
    "wasi",
    "wit_bindgen",
    "outgoing_handler",
    "OutgoingRequest",
    "IncomingBody",
];

/// Full Rust paths, written as a guest's bindings name them, whose first
/// segment is also a module of the host: the guest's `config` and `emit`
/// interfaces are not `hopper::config` and `hopper::plugin::emit`.
const EXTERNAL_PATHS: &[&str] = &[
    "config::get",
    "emit::publish",
    "emit::schedule",
    "emit::cancel",
];

/// One segment of an item's path: its name, and whether it is a crate or
/// module (which a reference may leave out).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Segment {
    name: String,
    module: bool,
}

/// Every item the workspace defines, as its full path.
#[derive(Default)]
struct Index {
    items: BTreeSet<Vec<Segment>>,
    /// Functions by file (relative to the root), for `file.rs::name`.
    functions: BTreeMap<String, BTreeSet<String>>,
}

impl Index {
    /// Whether `reference` (segments) names an item.
    fn knows(&self, reference: &[&str]) -> bool {
        self.items.iter().any(|path| matches(path, reference))
    }
}

/// Whether `reference` names `path`: its last segment is the path's last,
/// and the others are found in order going back, skipping only crates and
/// modules.
fn matches(path: &[Segment], reference: &[&str]) -> bool {
    let (Some(last), Some(wanted)) = (path.last(), reference.last()) else {
        return false;
    };
    if last.name != *wanted {
        return false;
    }
    let rest = &reference[..reference.len() - 1];
    let mut i = path.len() - 1;
    for wanted in rest.iter().rev() {
        loop {
            if i == 0 {
                return false;
            }
            i -= 1;
            if path[i].name == *wanted {
                break;
            }
            if !path[i].module {
                return false;
            }
        }
    }
    true
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every file and directory under `dir`, relative to `root`, without build
/// output and version control.
fn walk(root: &Path, dir: &Path, files: &mut Vec<String>, dirs: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if matches!(name.as_ref(), ".git" | "target" | "node_modules") {
            continue;
        }
        let relative = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if path.is_dir() {
            dirs.push(format!("{relative}/"));
            walk(root, &path, files, dirs);
        } else {
            files.push(relative);
        }
    }
}

/// The crate and module path of a source file, from where it lies:
/// `host/src/pipeline/partition.rs` is `hopper::pipeline::partition`,
/// `tests/src/bin/crash-loop.rs` and `tests/tests/crash_loop.rs` are
/// `crash_loop`.
fn module_path(relative: &str) -> Option<Vec<String>> {
    let crates = [
        ("host/src/bin/hopper/", "hopper"),
        ("host/src/", "hopper"),
        ("tests/src/bin/", ""),
        ("tests/tests/", ""),
        ("host/tests/", ""),
        ("tests/src/", "hopper_tests"),
        ("xtask/src/", "xtask"),
        ("order-service/src/", "order_service"),
    ];
    let (krate, rest) = crates
        .iter()
        .find_map(|(prefix, krate)| Some((*krate, relative.strip_prefix(prefix)?)))
        .or_else(|| {
            // plugins/<crate>/src/...
            let rest = relative.strip_prefix("plugins/")?;
            let (krate, rest) = rest.split_once("/src/")?;
            Some((krate, rest))
        })?;
    let mut segments: Vec<String> = Vec::new();
    if !krate.is_empty() {
        segments.push(krate.replace('-', "_"));
    }
    let rest = rest.strip_suffix(".rs")?;
    for part in rest.split('/') {
        if !matches!(part, "lib" | "main" | "mod") {
            segments.push(part.replace('-', "_"));
        }
    }
    Some(segments)
}

/// Indexes every Rust source file of the workspace: crates and modules,
/// functions, structs, enums and their variants, traits and their items,
/// consts, statics, type aliases, macros, and the items of every `impl`
/// (under the type's own path too, where that is known). A module's
/// `pub use` adds the names it re-exports.
fn index(root: &Path, files: &[String]) -> Index {
    let mut index = Index::default();
    // Impl items by self type, to file under the type's path too.
    let mut impls: Vec<(String, String)> = Vec::new();
    for file in files {
        let Some(module) = module_path(file) else {
            continue;
        };
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {file}: {e}"));
        let mut path: Vec<Segment> = module
            .iter()
            .map(|name| Segment {
                name: name.clone(),
                module: true,
            })
            .collect();
        for i in 1..=path.len() {
            index.items.insert(path[..i].to_vec());
        }
        let functions = index.functions.entry(file.clone()).or_default();
        let mut found = Found::default();
        items(&parsed.items, &mut path, &mut found);
        functions.extend(found.functions);
        index.items.extend(found.items);
        impls.extend(found.impls);
    }
    // `Type::method` under every path the type is defined at.
    let types: Vec<Vec<Segment>> = index
        .items
        .iter()
        .filter(|p| !p.last().unwrap().module)
        .cloned()
        .collect();
    for (ty, member) in impls {
        for path in types.iter().filter(|p| p.last().unwrap().name == ty) {
            let mut full = path.clone();
            full.push(item(&member));
            index.items.insert(full);
        }
    }
    index
}

#[derive(Default)]
struct Found {
    items: Vec<Vec<Segment>>,
    functions: BTreeSet<String>,
    /// (self type's last segment, member name).
    impls: Vec<(String, String)>,
}

fn item(name: &str) -> Segment {
    Segment {
        name: name.to_string(),
        module: false,
    }
}

fn items(list: &[syn::Item], path: &mut Vec<Segment>, found: &mut Found) {
    let add = |found: &mut Found, path: &[Segment], name: String| {
        let mut full = path.to_vec();
        full.push(item(&name));
        found.items.push(full);
    };
    let mut nested: Vec<(&syn::Ident, &[syn::Item])> = Vec::new();
    let mut members: Vec<(Option<String>, String, Vec<String>)> = Vec::new();
    for entry in list {
        match entry {
            syn::Item::Fn(f) => {
                found.functions.insert(f.sig.ident.to_string());
                add(found, path, f.sig.ident.to_string());
            }
            syn::Item::Struct(s) => add(found, path, s.ident.to_string()),
            syn::Item::Union(u) => add(found, path, u.ident.to_string()),
            syn::Item::Const(c) => add(found, path, c.ident.to_string()),
            syn::Item::Static(s) => add(found, path, s.ident.to_string()),
            syn::Item::Type(t) => add(found, path, t.ident.to_string()),
            syn::Item::Macro(m) => {
                if let Some(ident) = &m.ident {
                    add(found, path, ident.to_string());
                }
            }
            syn::Item::Enum(e) => {
                let variants = e.variants.iter().map(|v| v.ident.to_string()).collect();
                members.push((None, e.ident.to_string(), variants));
            }
            syn::Item::Trait(t) => {
                let names = t
                    .items
                    .iter()
                    .filter_map(|i| match i {
                        syn::TraitItem::Fn(f) => Some(f.sig.ident.to_string()),
                        syn::TraitItem::Const(c) => Some(c.ident.to_string()),
                        syn::TraitItem::Type(t) => Some(t.ident.to_string()),
                        _ => None,
                    })
                    .collect();
                members.push((None, t.ident.to_string(), names));
            }
            syn::Item::Impl(i) => {
                let syn::Type::Path(ty) = &*i.self_ty else {
                    continue;
                };
                let Some(last) = ty.path.segments.last() else {
                    continue;
                };
                let names = i
                    .items
                    .iter()
                    .filter_map(|i| match i {
                        syn::ImplItem::Fn(f) => {
                            found.functions.insert(f.sig.ident.to_string());
                            Some(f.sig.ident.to_string())
                        }
                        syn::ImplItem::Const(c) => Some(c.ident.to_string()),
                        syn::ImplItem::Type(t) => Some(t.ident.to_string()),
                        _ => None,
                    })
                    .collect();
                members.push((Some(last.ident.to_string()), last.ident.to_string(), names));
            }
            syn::Item::Mod(m) => {
                if let Some((_, content)) = &m.content {
                    nested.push((&m.ident, content));
                }
            }
            syn::Item::Use(u) if !matches!(u.vis, syn::Visibility::Inherited) => {
                let mut names = Vec::new();
                use_names(&u.tree, &mut names);
                for name in names {
                    add(found, path, name);
                }
            }
            _ => {}
        }
    }
    for (from_impl, owner, names) in members {
        if from_impl.is_none() {
            add(found, path, owner.clone());
        }
        let mut owner_path = path.clone();
        owner_path.push(item(&owner));
        for name in names {
            if from_impl.is_some() {
                found.impls.push((owner.clone(), name.clone()));
            }
            let mut full = owner_path.clone();
            full.push(item(&name));
            found.items.push(full);
        }
    }
    for (ident, content) in nested {
        path.push(Segment {
            name: ident.to_string(),
            module: true,
        });
        found.items.push(path.clone());
        items(content, path, found);
        path.pop();
    }
}

/// The names a `use` tree brings in (its leaves, renamed ones by their new
/// name).
fn use_names(tree: &syn::UseTree, out: &mut Vec<String>) {
    match tree {
        syn::UseTree::Path(p) => use_names(&p.tree, out),
        syn::UseTree::Name(n) => out.push(n.ident.to_string()),
        syn::UseTree::Rename(r) => out.push(r.rename.to_string()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_names(t, out)),
        syn::UseTree::Glob(_) => {}
    }
}

/// A reference found in a Markdown file.
#[derive(Debug, PartialEq)]
enum Reference {
    /// A file or directory, with the function `::name` after a file.
    Path(String, Option<String>),
    /// A Rust path's segments.
    Rust(Vec<String>),
}

/// The inline code spans of `markdown` outside fenced blocks, with their
/// line numbers (from 1).
fn code_spans(markdown: &str) -> Vec<(usize, String)> {
    let mut spans = Vec::new();
    let mut fenced = false;
    for (n, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Double-backtick spans (``a`b``) are rare and hold no references:
        // split on single backticks and take every second part.
        let parts: Vec<&str> = line.split('`').collect();
        for span in parts.iter().skip(1).step_by(2).take((parts.len() - 1) / 2) {
            spans.push((n + 1, span.to_string()));
        }
    }
    spans
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_path_part(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// What `span` refers to, if it is a reference at all.
fn reference(span: &str) -> Option<Reference> {
    let span = span.trim();
    // A source file, optionally with a function.
    let (file, function) = match span.split_once("::") {
        Some((file, function)) if file.ends_with(".rs") => (file, Some(function)),
        _ => (span, None),
    };
    if file.ends_with(".rs") && file.split('/').all(is_path_part) {
        let function = function.filter(|f| is_ident(f)).map(str::to_string);
        return Some(Reference::Path(file.to_string(), function));
    }
    // A directory: relative, at least one component, ending in `/`.
    if let Some(dir) = span.strip_suffix('/')
        && !dir.is_empty()
        && dir.split('/').all(is_path_part)
        && dir
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
    {
        return Some(Reference::Path(span.to_string(), None));
    }
    // A Rust path: cut a trailing call or `!`.
    let rust = span.split('(').next().unwrap().trim_end_matches('!');
    let segments: Vec<&str> = rust.split("::").collect();
    if segments.len() >= 2 && segments.iter().all(|s| is_ident(s)) {
        return Some(Reference::Rust(
            segments.into_iter().map(str::to_string).collect(),
        ));
    }
    None
}

/// Checks the references of one Markdown text; returns each stale one as
/// `name:line: why`.
fn check(
    name: &str,
    markdown: &str,
    index: &Index,
    files: &[String],
    dirs: &[String],
) -> Vec<String> {
    let exists = |path: &str, among: &[String]| {
        among
            .iter()
            .any(|p| p == path || p.ends_with(&format!("/{path}")))
    };
    let mut stale = Vec::new();
    for (line, span) in code_spans(markdown) {
        match reference(&span) {
            Some(Reference::Path(path, function)) => {
                let among = if path.ends_with('/') { dirs } else { files };
                if !exists(&path, among) {
                    stale.push(format!("{name}:{line}: `{span}`: no such path"));
                } else if let Some(function) = function {
                    let defined = index.functions.iter().any(|(file, fns)| {
                        (file == &path || file.ends_with(&format!("/{path}")))
                            && fns.contains(&function)
                    });
                    if !defined {
                        stale.push(format!(
                            "{name}:{line}: `{span}`: {path} has no fn `{function}`"
                        ));
                    }
                }
            }
            Some(Reference::Rust(segments)) => {
                let joined = segments.join("::");
                if EXTERNAL.contains(&segments[0].as_str())
                    || EXTERNAL_PATHS.contains(&joined.as_str())
                {
                    continue;
                }
                let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
                if !index.knows(&segments) {
                    stale.push(format!(
                        "{name}:{line}: `{span}`: no such item in the workspace's Rust sources"
                    ));
                }
            }
            None => {}
        }
    }
    stale
}

/// The repository's files and directories, and the index of its sources.
fn repository() -> (PathBuf, Vec<String>, Vec<String>, Index) {
    let root = root();
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    walk(&root, &root, &mut files, &mut dirs);
    let sources: Vec<String> = files
        .iter()
        .filter(|f| f.ends_with(".rs"))
        .cloned()
        .collect();
    let index = index(&root, &sources);
    (root, files, dirs, index)
}

#[test]
fn every_path_and_item_the_docs_name_exists() {
    let (root, files, dirs, index) = repository();
    assert!(
        index.knows(&["Hopper", "start"]) && index.knows(&["pipeline", "run"]),
        "the index misses items it must hold"
    );
    let mut docs: Vec<String> = files
        .iter()
        .filter(|f| f.starts_with("docs/") && f.ends_with(".md"))
        .cloned()
        .collect();
    docs.sort();
    assert!(docs.len() >= 5, "found only {docs:?} in docs/");
    docs.extend(["README.md".to_string(), "BENCHMARKS.md".to_string()]);
    let mut stale = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        checked += code_spans(&text)
            .iter()
            .filter(|(_, s)| reference(s).is_some())
            .count();
        stale.extend(check(doc, &text, &index, &files, &dirs));
    }
    assert!(checked > 100, "only {checked} references found");
    assert!(
        stale.is_empty(),
        "{} stale reference(s) in the docs (rules: host/tests/docs.rs):\n{}",
        stale.len(),
        stale.join("\n")
    );
}

#[test]
fn a_made_up_reference_is_flagged() {
    let (_, files, dirs, index) = repository();
    let doc = "\
One place counts: `Metrics::record`, in `host/src/dlq.rs`, `host/src/nothing/`.\n\
Real: `Hopper::start`, `pipeline::run`, `hopper::egress::Transport`, `host/src/dlq/`.\n\
`tests/tests/trust.rs::no_such_test` and `StreamConsumer::split_partition_queue`.\n\
```\n\
`Fenced::ignored`\n\
```\n\
Not a type: `partition::lookahead` is real, `pipeline::partition::Lane::run` is not.\n";
    let stale = check("made-up.md", doc, &index, &files, &dirs);
    assert_eq!(
        stale,
        vec![
            "made-up.md:1: `Metrics::record`: no such item in the workspace's Rust sources",
            "made-up.md:1: `host/src/dlq.rs`: no such path",
            "made-up.md:1: `host/src/nothing/`: no such path",
            "made-up.md:3: `tests/tests/trust.rs::no_such_test`: tests/tests/trust.rs has no fn `no_such_test`",
            "made-up.md:7: `pipeline::partition::Lane::run`: no such item in the workspace's Rust sources",
        ]
    );
}

#[test]
fn spans_are_read_as_references_or_skipped() {
    assert_eq!(
        reference("Hopper::status()"),
        Some(Reference::Rust(vec!["Hopper".into(), "status".into()]))
    );
    assert_eq!(
        reference("plugin/handler.rs"),
        Some(Reference::Path("plugin/handler.rs".into(), None))
    );
    assert_eq!(
        reference("tests/tests/x.rs::a_test"),
        Some(Reference::Path(
            "tests/tests/x.rs".into(),
            Some("a_test".into())
        ))
    );
    for skipped in [
        "::1",
        "hopper-attempt",
        "GET /",
        "http://127.0.0.1:9464/",
        "max_in_flight",
        "$CARGO_TARGET_DIR/tools/",
    ] {
        assert_eq!(reference(skipped), None, "{skipped}");
    }
    let matches_path = |path: &[(&str, bool)], reference: &[&str]| {
        let path: Vec<Segment> = path
            .iter()
            .map(|(name, module)| Segment {
                name: name.to_string(),
                module: *module,
            })
            .collect();
        matches(&path, reference)
    };
    let transport = [
        ("hopper", true),
        ("egress", true),
        ("transport", true),
        ("Transport", false),
    ];
    assert!(matches_path(&transport, &["egress", "Transport"]));
    assert!(matches_path(&transport, &["Transport"]));
    let run = [
        ("hopper", true),
        ("pipeline", true),
        ("Runner", false),
        ("run", false),
    ];
    assert!(!matches_path(&run, &["pipeline", "run"]));
    assert!(matches_path(&run, &["Runner", "run"]));
}

/// The fenced block that follows the line holding `marker` in `markdown`:
/// its text, without the fences.
fn block_after(markdown: &str, marker: &str) -> Option<String> {
    let rest = &markdown[markdown.find(marker)? + marker.len()..];
    let open = rest.find("```")?;
    let body = &rest[open..];
    let body = &body[body.find('\n')? + 1..];
    Some(body[..body.find("```")?].to_string())
}

/// docs/connecting.md's ACL scripts are what `hopper acls` prints for the
/// config shown beside them, so the documented list cannot drift from the
/// code that creates the topics and groups. `HOPPER_BLESS_DOCS=1` writes
/// what the code prints into the doc.
#[test]
fn the_acl_scripts_in_connecting_md_are_what_hopper_acls_prints() {
    use hopper::config::{AclsFor, ConfigFile, kafka_acls_script};
    let path = root().join("docs/connecting.md");
    let mut text = std::fs::read_to_string(&path).unwrap();
    let bless = std::env::var_os("HOPPER_BLESS_DOCS").is_some();
    let toml = block_after(&text, "<!-- acls: config -->").expect("the example config");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
    std::fs::write(dir.path().join("handlers/orders.wasm"), b"").unwrap();
    let config = ConfigFile::parse(&toml)
        .unwrap()
        .resolve(dir.path())
        .unwrap_or_else(|problems| panic!("{problems:?}"));
    let brokers = config.kafka.brokers.clone().unwrap();
    for (marker, who, principal) in [
        ("<!-- acls: run -->", AclsFor::Run, "User:hopper"),
        ("<!-- acls: cli -->", AclsFor::Cli, "User:hopper-ops"),
    ] {
        let documented = block_after(&text, marker).unwrap_or_else(|| panic!("no {marker}"));
        let printed = kafka_acls_script(&config.acls(who), principal, &brokers);
        if bless && documented != printed {
            let at = text.find(marker).unwrap();
            let start = at + text[at..].find(&documented).unwrap();
            text.replace_range(start..start + documented.len(), &printed);
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        assert_eq!(
            documented, printed,
            "docs/connecting.md's block after {marker} is not what `hopper acls` prints:\n{printed}"
        );
    }
}

/// The routes a router's source registers, as `METHOD /path`: every
/// `.route("PATH", get(..))` (or `post`), with the prefix of the router it
/// is built in when that one is nested (`.nest("/api", api)` makes
/// `let api = Router::new()...`'s routes `/api/...`). Reads the source as
/// rustfmt lays it out: one `let NAME = ` per router, each at the start of
/// a line.
fn registered_routes(source: &str) -> BTreeSet<String> {
    let literal = |text: &str| -> Option<(String, usize)> {
        let text_start = text.find('"')?;
        let rest = &text[text_start + 1..];
        let end = rest.find('"')?;
        Some((rest[..end].to_string(), text_start + end + 2))
    };
    let mut prefixes: BTreeMap<String, String> = BTreeMap::new();
    for (at, _) in source.match_indices(".nest(") {
        let rest = &source[at + ".nest(".len()..];
        let Some((prefix, used)) = literal(rest) else {
            continue;
        };
        let name: String = rest[used..]
            .trim_start_matches([',', ' ', '\n'])
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        prefixes.insert(name, prefix);
    }
    let mut routes = BTreeSet::new();
    let mut prefix = String::new();
    for (n, line) in source.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(binding) = trimmed.strip_prefix("let ") {
            let name: String = binding
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            prefix = prefixes.get(&name).cloned().unwrap_or_default();
        } else if trimmed.starts_with("Router::new()") || trimmed.starts_with("fn ") {
            prefix.clear();
        }
        if !trimmed.starts_with(".route(") {
            continue;
        }
        // The path and the method may sit on the lines below.
        let rest: String = source
            .lines()
            .skip(n)
            .take(4)
            .collect::<Vec<_>>()
            .join("\n");
        let rest = &rest[rest.find(".route(").unwrap() + ".route(".len()..];
        let Some((path, used)) = literal(rest) else {
            continue;
        };
        let method: String = rest[used..]
            .trim_start_matches([',', ' ', '\n'])
            .chars()
            .take_while(|c| c.is_ascii_alphabetic())
            .collect();
        routes.insert(format!("{} {prefix}{path}", method.to_ascii_uppercase()));
    }
    routes
}

/// The routes docs/operations.md's admin table lists: each `METHOD /path`
/// span in a row's first cell, its query cut off.
fn documented_routes(markdown: &str) -> BTreeSet<String> {
    let mut routes = BTreeSet::new();
    for line in markdown.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split(" | ").next().unwrap_or_default();
        for span in first.split('`').skip(1).step_by(2) {
            let Some((method, path)) = span.split_once(' ') else {
                continue;
            };
            if matches!(method, "GET" | "POST" | "PUT" | "DELETE") && path.starts_with('/') {
                let path = path.split('?').next().unwrap();
                routes.insert(format!("{method} {path}"));
            }
        }
    }
    routes
}

/// The admin routes the code registers and those docs/operations.md's
/// table lists, each way: `(missing from the table, stale in it)`.
fn admin_table_drift(sources: &[String], markdown: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let registered: BTreeSet<String> = sources
        .iter()
        .map(String::as_str)
        .flat_map(registered_routes)
        .collect();
    let documented = documented_routes(markdown);
    (
        registered.difference(&documented).cloned().collect(),
        documented.difference(&registered).cloned().collect(),
    )
}

fn admin_sources() -> Vec<String> {
    ["host/src/admin/mod.rs", "host/src/admin/console.rs"]
        .iter()
        .map(|p| std::fs::read_to_string(root().join(p)).unwrap())
        .collect()
}

/// Every route the admin server registers is a row of docs/operations.md's
/// table, and every row is a route it registers.
#[test]
fn the_admin_table_in_operations_md_lists_every_route_the_server_registers() {
    let sources = admin_sources();
    let registered: BTreeSet<String> = sources
        .iter()
        .map(String::as_str)
        .flat_map(registered_routes)
        .collect();
    for known in [
        "GET /ready",
        "POST /api/replay",
        "GET /api/dlq/{topic}/{partition}/{offset}",
        "GET /",
    ] {
        assert!(
            registered.contains(known),
            "{known} not read from the source: {registered:?}"
        );
    }
    let markdown = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let (missing, stale) = admin_table_drift(&sources, &markdown);
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/operations.md's admin table: missing {missing:?}; lists routes the server does not register: {stale:?}"
    );
}

#[test]
fn a_route_missing_from_the_admin_table_is_named() {
    let mut sources = admin_sources();
    sources[0] = sources[0].replacen(
        ".route(\"/routes\", get(api::routes))",
        ".route(\"/routes\", get(api::routes))\n        .route(\"/secret\", post(api::routes))",
        1,
    );
    let markdown = std::fs::read_to_string(root().join("docs/operations.md"))
        .unwrap()
        .replace("| `GET /health` |", "| `GET /healthz` |");
    let (missing, stale) = admin_table_drift(&sources, &markdown);
    assert_eq!(
        missing.into_iter().collect::<Vec<_>>(),
        ["GET /health", "POST /api/secret"]
    );
    assert_eq!(stale.into_iter().collect::<Vec<_>>(), ["GET /healthz"]);
}
