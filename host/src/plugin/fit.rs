//! `hopper plugin check`: how a file compares with the handler world, item by
//! item, so a user sees everything that is missing or extra at once rather
//! than the linker's first complaint, and which grants its imports need.

use super::{LoadError, Runtime, WORLD, read, root_cause, version_of};
use std::fmt;
use std::path::{Path, PathBuf};
use wasmtime::component::types::ComponentItem;

/// The function every handler exports.
const EXPORT: &str = "handle";
/// The world's own imports (any 0.1.x version links).
const WORLD_IMPORTS: [&str; 6] = [
    "hopper:handler/types",
    "hopper:handler/log",
    "hopper:handler/config",
    "hopper:handler/emit",
    "hopper:handler/secrets",
    "hopper:handler/http",
];
/// WASI 0.2 packages hopper links: stdio, clocks and randomness work, the
/// filesystem and sockets are empty, and wasi:http goes through the route's
/// `allowed_hosts`.
const WASI_PACKAGES: [&str; 7] = [
    "wasi:io/",
    "wasi:clocks/",
    "wasi:random/",
    "wasi:cli/",
    "wasi:filesystem/",
    "wasi:sockets/",
    "wasi:http/",
];

/// A grant a route must give for a handler's import to do anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// `wasi:http/outgoing-handler` or `hopper:handler/http`: hosts in
    /// `allowed_hosts`.
    Http,
    /// `hopper:handler/emit`: topics in `emit_topics`; ids in `cancel_ids`
    /// for a cancel or a replace.
    Emit,
    /// `hopper:handler/secrets`: names in `[route.secrets]`.
    Secrets,
}

impl Grant {
    /// The grant an import needs, if any.
    fn of_import(name: &str) -> Option<Grant> {
        let interface = name.split_once('@').map_or(name, |(i, _)| i);
        match interface {
            "wasi:http/outgoing-handler" | "hopper:handler/http" => Some(Grant::Http),
            "hopper:handler/emit" => Some(Grant::Emit),
            "hopper:handler/secrets" => Some(Grant::Secrets),
            _ => None,
        }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Grant::Http => {
                "HTTP (wasi:http/outgoing-handler, hopper:handler/http): the hosts in the route's `allowed_hosts`"
            }
            Grant::Emit => {
                "emit (hopper:handler/emit): the topics in the route's `emit_topics`, and the ids in its `cancel_ids` to cancel or replace a schedule"
            }
            Grant::Secrets => {
                "secrets (hopper:handler/secrets): the names in the route's `[route.secrets]`"
            }
        })
    }
}

/// A component's imports and exports against the handler world.
#[derive(Debug)]
pub struct Fit {
    pub path: PathBuf,
    /// sha256 of the file, in hex.
    pub version: String,
    pub exports: Vec<String>,
    pub imports: Vec<String>,
    /// What the world requires and the component lacks.
    pub missing: Vec<String>,
    /// What the component imports and hopper does not provide.
    pub extra: Vec<String>,
    /// Exports hopper ignores.
    pub ignored: Vec<String>,
    /// Grants the component's imports need to do anything; without them
    /// every request is denied, every emit refused, every secret `none`.
    pub grants: Vec<Grant>,
    /// Why hopper would refuse the file, when it would.
    pub error: Option<String>,
}

impl Fit {
    pub fn fits(&self) -> bool {
        self.error.is_none()
    }
}

impl Runtime {
    /// Compiles `path` and compares it with the handler world. A file that
    /// is not a component at all is an error; one that compiles but does
    /// not fit is a [`Fit`] that says why.
    pub fn fit(&self, path: &Path) -> Result<Fit, LoadError> {
        let bytes = read(path)?;
        let version = version_of(&bytes);
        let (component, _) = self.compile(path, &bytes, &version)?;
        let ty = component.component_type();
        let mut exports = Vec::new();
        let mut handle_is_func = false;
        for (name, item) in ty.exports(&self.engine) {
            if name == EXPORT {
                handle_is_func = matches!(item.ty, ComponentItem::ComponentFunc(_));
            }
            exports.push(name.to_string());
        }
        let imports: Vec<String> = ty
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .collect();

        let mut missing = Vec::new();
        if !exports.iter().any(|e| e == EXPORT) {
            missing.push(format!("export `{EXPORT}` (func(message) -> outcome)"));
        } else if !handle_is_func {
            missing.push(format!("export `{EXPORT}` as a function"));
        }
        let extra = imports
            .iter()
            .filter(|name| !provided(name))
            .map(|name| format!("import `{name}`"))
            .collect();
        let ignored = exports.iter().filter(|e| *e != EXPORT).cloned().collect();
        let mut grants: Vec<Grant> = imports.iter().filter_map(|i| Grant::of_import(i)).collect();
        grants.sort_by_key(|g| *g as u8);
        grants.dedup();
        let error = self
            .linker
            .instantiate_pre(&component)
            .and_then(super::bindings::HandlerPre::new)
            .err()
            .map(|e| root_cause(&e));
        Ok(Fit {
            path: path.to_path_buf(),
            version,
            exports,
            imports,
            missing,
            extra,
            ignored,
            grants,
            error,
        })
    }
}

/// Whether hopper's linker provides an import of this name.
fn provided(name: &str) -> bool {
    let (interface, version) = name.split_once('@').unwrap_or((name, ""));
    if WORLD_IMPORTS.contains(&interface) {
        return version.starts_with("0.1.");
    }
    WASI_PACKAGES.iter().any(|p| interface.starts_with(p)) && version.starts_with("0.2.")
}

impl fmt::Display for Fit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            None => writeln!(
                f,
                "ok: {} fits {WORLD} (sha256 {})",
                self.path.display(),
                self.version
            )?,
            Some(error) => writeln!(
                f,
                "error: {} does not fit {WORLD}: {error}",
                self.path.display()
            )?,
        }
        let (world, wasi): (Vec<&String>, Vec<&String>) = self
            .imports
            .iter()
            .partition(|name| name.starts_with("hopper:"));
        let list = |items: &[&String]| {
            if items.is_empty() {
                "(none)".to_string()
            } else {
                items
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        writeln!(
            f,
            "  exports: {}",
            list(&self.exports.iter().collect::<Vec<_>>())
        )?;
        writeln!(f, "  imports from the world: {}", list(&world))?;
        writeln!(f, "  other imports: {}", list(&wasi))?;
        if self.grants.is_empty() {
            writeln!(f, "  grants needed: none")?;
        }
        for grant in &self.grants {
            writeln!(f, "  grant needed: {grant}")?;
        }
        for item in &self.missing {
            writeln!(f, "  missing: {item}")?;
        }
        for item in &self.extra {
            writeln!(f, "  extra: {item} (hopper does not provide it)")?;
        }
        for item in &self.ignored {
            writeln!(f, "  ignored: export `{item}`")?;
        }
        Ok(())
    }
}
