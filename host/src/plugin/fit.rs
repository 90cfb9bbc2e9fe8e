//! `hopper plugin check`: how a file compares with the handler world, item by
//! item, so a user sees everything that is missing or extra at once rather
//! than the linker's first complaint.

use super::{LoadError, Runtime, WORLD, read, root_cause, version_of};
use std::fmt;
use std::path::{Path, PathBuf};
use wasmtime::component::types::ComponentItem;

/// The function every handler exports.
const EXPORT: &str = "handle";
/// The world's own imports (any 0.1.x version links).
const WORLD_IMPORTS: [&str; 5] = [
    "hopper:handler/types",
    "hopper:handler/log",
    "hopper:handler/config",
    "hopper:handler/emit",
    "hopper:handler/secrets",
];
/// WASI 0.2 packages hopper links, with an empty context.
const WASI_PACKAGES: [&str; 6] = [
    "wasi:io/",
    "wasi:clocks/",
    "wasi:random/",
    "wasi:cli/",
    "wasi:filesystem/",
    "wasi:sockets/",
];

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
