//! Handlers in languages other than Rust, and the toolchains that build them.
//!
//! Every tool is pinned and installed on first use under
//! `$CARGO_TARGET_DIR/tools/`, next to the build cache, and reused after that:
//! - Python: componentize-py in a venv (`tools/venv`);
//! - JavaScript: componentize-js (and jco) from npm (`tools/node_modules`);
//! - C: wit-bindgen's C generator (`tools/bin/wit-bindgen`) plus Debian's
//!   clang, lld, wasi-libc and wasm32 compiler-rt, installed with apt-get.
//!
//! A component is rebuilt only when its inputs change: the hash of its
//! sources, the WIT and the tool versions is kept next to the output.

use crate::{root, run, step, target_dir};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub const COMPONENTIZE_PY: &str = "0.25.1";
pub const COMPONENTIZE_JS: &str = "0.23.0";
pub const JCO: &str = "1.35.0";
pub const WIT_BINDGEN: &str = "0.63.0";
/// Debian packages the C handlers need.
const DEBIAN_C: [&str; 4] = ["clang", "lld", "wasi-libc", "libclang-rt-dev-wasm32"];

/// A handler built by a non-Rust toolchain.
struct Guest {
    /// Directory under `plugins/`.
    dir: &'static str,
    /// Output file stem in `plugins/dist/`.
    out: &'static str,
    lang: Lang,
}

#[derive(Clone, Copy, PartialEq)]
enum Lang {
    Python,
    Js,
    C,
}

const GUESTS: [Guest; 3] = [
    Guest {
        dir: "order-timeout-py",
        out: "order_timeout_py",
        lang: Lang::Python,
    },
    Guest {
        dir: "order-timeout-js",
        out: "order_timeout_js",
        lang: Lang::Js,
    },
    Guest {
        dir: "order-timeout-c",
        out: "order_timeout_c",
        lang: Lang::C,
    },
];

pub fn tools_dir() -> PathBuf {
    target_dir().join("tools")
}

/// Builds the Python, JavaScript and C handlers into `plugins/dist/`,
/// skipping those whose inputs did not change.
pub fn build(dist: &Path) -> Result<()> {
    for guest in &GUESTS {
        let src = root().join("plugins").join(guest.dir);
        let dest = dist.join(format!("{}.wasm", guest.out));
        let stamp = dist.join(format!(".{}.inputs", guest.out));
        let inputs = inputs_hash(&src, guest.lang)?;
        if dest.is_file() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&inputs) {
            eprintln!("    {} is up to date", dest.display());
            continue;
        }
        let started = Instant::now();
        let tmp = dist.join(format!(".{}.wasm.tmp", guest.out));
        match guest.lang {
            Lang::Python => {
                let tool = componentize_py()?;
                step(&format!(
                    "componentizing {} with componentize-py {COMPONENTIZE_PY} (~15-40 s)",
                    guest.dir
                ));
                build_python(&tool, &src, &tmp)?;
            }
            Lang::Js => {
                let tool = componentize_js()?;
                step(&format!(
                    "componentizing {} with componentize-js {COMPONENTIZE_JS} (~30-90 s)",
                    guest.dir
                ));
                build_js(&tool, &src, &tmp)?;
            }
            Lang::C => {
                let tools = c_tools()?;
                step(&format!(
                    "compiling {} with clang and wit-bindgen {WIT_BINDGEN}",
                    guest.dir
                ));
                build_c(&tools, &src, &tmp)?;
            }
        }
        std::fs::rename(&tmp, &dest)?;
        std::fs::write(&stamp, &inputs)?;
        eprintln!(
            "    {} ({} KiB, built in {:.1?})",
            dest.display(),
            std::fs::metadata(&dest)?.len() / 1024,
            started.elapsed()
        );
    }
    Ok(())
}

/// The line each order-timeout handler's edit changes, and what it becomes:
/// the one-line change `cargo xtask bench handlers` times from file to
/// serving.
pub const EDIT: (&str, &str) = ("Closed unpaid order", "Closed an unpaid order");

/// Builds each Python, JavaScript and C order-timeout handler with the
/// one-line change [`EDIT`] into `out` as `<stem>_edited.wasm`, skipping
/// those whose inputs did not change. Returns `(stem, edited file)`.
pub fn build_edits(out: &Path) -> Result<Vec<(&'static str, PathBuf)>> {
    std::fs::create_dir_all(out)?;
    let mut built = Vec::new();
    for guest in &GUESTS {
        let src = root().join("plugins").join(guest.dir);
        let edited = tempdir(&format!("edit-{}", guest.out))?;
        let mut changed = 0;
        for entry in std::fs::read_dir(&src)? {
            let path = entry?.path();
            if !path.is_file() {
                continue;
            }
            let mut bytes = std::fs::read(&path)?;
            if let Ok(text) = std::str::from_utf8(&bytes)
                && text.contains(EDIT.0)
            {
                changed += text.matches(EDIT.0).count();
                bytes = text.replacen(EDIT.0, EDIT.1, 1).into_bytes();
            }
            std::fs::write(edited.join(path.file_name().unwrap()), bytes)?;
        }
        anyhow::ensure!(
            changed >= 1,
            "{} has no line with `{}` to edit",
            src.display(),
            EDIT.0
        );
        let dest = out.join(format!("{}_edited.wasm", guest.out));
        let stamp = out.join(format!(".{}_edited.inputs", guest.out));
        let inputs = inputs_hash(&edited, guest.lang)?;
        if !(dest.is_file() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&inputs)) {
            step(&format!("building {} with its one-line edit", guest.dir));
            match guest.lang {
                Lang::Python => build_python(&componentize_py()?, &edited, &dest)?,
                Lang::Js => build_js(&componentize_js()?, &edited, &dest)?,
                Lang::C => build_c(&c_tools()?, &edited, &dest)?,
            }
            std::fs::write(&stamp, &inputs)?;
        }
        let _ = std::fs::remove_dir_all(&edited);
        built.push((guest.out, dest));
    }
    Ok(built)
}

/// componentize-py: `app.py` in `src` is the module that defines `WitWorld`,
/// for world `handler` (HTTP through its `fetch`).
pub fn build_python(tool: &Path, src: &Path, out: &Path) -> Result<()> {
    let mut c = Command::new(tool);
    c.current_dir(src)
        .arg("-d")
        .arg(root().join("wit"))
        .args(["-w", "handler", "componentize", "app", "-o"])
        .arg(out);
    run(c, &format!("componentize-py on {}", src.display()))
}

/// componentize-js: `handler.js` in `src` exports `handle`. Every WASI
/// feature is disabled, `http` (the web's `fetch` over wasi:http) too: HTTP
/// is the handler world's own `fetch`, and the rest would only add imports.
pub fn build_js(tool: &Path, src: &Path, out: &Path) -> Result<()> {
    let mut c = Command::new("node");
    c.current_dir(src)
        .arg(tool)
        .arg("handler.js")
        .arg("--wit")
        .arg(root().join("wit"))
        .args(["--world-name", "handler", "-d"])
        .args(["stdio", "random", "clocks", "http", "fetch-event"])
        .arg("-o")
        .arg(out);
    run(c, &format!("componentize-js on {}", src.display()))
}

pub struct CTools {
    pub wit_bindgen: PathBuf,
    /// `jco`, which wraps a core module into a component with the WASI
    /// preview1 reactor adapter embedded in it.
    pub jco: PathBuf,
}

/// C: bindings from wit-bindgen for world `handler` (`handler.h`; HTTP is
/// its `fetch`), clang for wasm32-wasi (a reactor: no `main`), then the core
/// module is wrapped into a component.
pub fn build_c(tools: &CTools, src: &Path, out: &Path) -> Result<()> {
    let work = tempdir("c-build")?;
    let mut bindgen = Command::new(&tools.wit_bindgen);
    bindgen
        .args(["c", "--world", "handler", "--out-dir"])
        .arg(&work)
        .arg(root().join("wit"));
    run(bindgen, "wit-bindgen c")?;
    let mut sources: Vec<PathBuf> = std::fs::read_dir(src)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    sources.retain(|p| p.extension().is_some_and(|e| e == "c"));
    sources.sort();
    let core = work.join("core.wasm");
    let mut cc = Command::new("clang");
    cc.args([
        "--target=wasm32-wasi",
        "--sysroot=/usr",
        "-O2",
        "-Wall",
        "-mexec-model=reactor",
    ])
    .arg("-I")
    .arg(&work)
    .args(&sources)
    .arg(work.join("handler.c"))
    .arg(work.join("handler_component_type.o"))
    .arg("-o")
    .arg(&core);
    run(cc, &format!("clang on {}", src.display()))?;
    let mut new = Command::new("node");
    new.arg(&tools.jco)
        .arg("new")
        .arg(&core)
        .arg("--wasi-reactor")
        .arg("-o")
        .arg(out);
    run(new, "jco new (core module to component)")?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// A hash of everything a component is built from.
fn inputs_hash(src: &Path, lang: Lang) -> Result<String> {
    let mut files = vec![
        root().join("wit/handler.wit"),
        root().join("wit/handler-http.wit"),
    ];
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let path = entry?.path();
        if path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    // FNV-1a, 64 bit: a change detector, not a security boundary.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    let tools = match lang {
        Lang::Python => format!("componentize-py {COMPONENTIZE_PY}"),
        Lang::Js => format!("componentize-js {COMPONENTIZE_JS}"),
        Lang::C => format!("wit-bindgen {WIT_BINDGEN}, jco {JCO}"),
    };
    feed(tools.as_bytes());
    for file in &files {
        feed(file.file_name().unwrap().as_encoded_bytes());
        feed(&std::fs::read(file).with_context(|| format!("reading {}", file.display()))?);
    }
    Ok(format!("{hash:016x}\n"))
}

/// `componentize-py` in the tools venv, installed when missing.
pub fn componentize_py() -> Result<PathBuf> {
    let venv = tools_dir().join("venv");
    let tool = venv.join("bin/componentize-py");
    if version_of(&tool, &["--version"]).is_some_and(|v| v.contains(COMPONENTIZE_PY)) {
        return Ok(tool);
    }
    step(&format!(
        "installing componentize-py {COMPONENTIZE_PY} into {} (~15 s, done once)",
        venv.display()
    ));
    // Made anew each time: a venv moved or copied from elsewhere keeps
    // scripts that point at its old path.
    let mut create = Command::new("python3");
    create.args(["-m", "venv", "--clear"]).arg(&venv);
    run(
        create,
        "python3 -m venv (on Debian: apt-get install python3-venv)",
    )?;
    let mut pip = Command::new(venv.join("bin/python3"));
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("componentize-py=={COMPONENTIZE_PY}"),
    ]);
    run(pip, "pip install componentize-py")?;
    Ok(tool)
}

/// Installs the pinned npm packages into the tools dir when missing.
fn npm_tools() -> Result<PathBuf> {
    let dir = tools_dir();
    let modules = dir.join("node_modules/@bytecodealliance");
    let installed = |name: &str, version: &str| {
        std::fs::read_to_string(modules.join(name).join("package.json"))
            .is_ok_and(|p| p.contains(&format!("\"version\": \"{version}\"")))
    };
    if installed("componentize-js", COMPONENTIZE_JS) && installed("jco", JCO) {
        return Ok(modules);
    }
    step(&format!(
        "installing componentize-js {COMPONENTIZE_JS} and jco {JCO} into {} (~1 min, done once)",
        dir.display()
    ));
    std::fs::create_dir_all(&dir)?;
    let mut npm = Command::new("npm");
    trust_npm_cafile(&mut npm);
    npm.arg("install")
        .arg("--prefix")
        .arg(&dir)
        .args(["--no-audit", "--no-fund", "--save-exact"])
        .arg(format!(
            "@bytecodealliance/componentize-js@{COMPONENTIZE_JS}"
        ))
        .arg(format!("@bytecodealliance/jco@{JCO}"));
    run(npm, "npm install componentize-js and jco")?;
    Ok(modules)
}

/// Has `npm` trust the CA bundle npm's own config names (`cafile`, as a
/// TLS-intercepting proxy's machines set it in `/etc/npmrc`) for every
/// request: npm 10 and 11 apply `cafile` to some fetches of an install but
/// not to the full package documents it asks for, which then fail with
/// `SELF_SIGNED_CERT_IN_CHAIN` and are retried until the cache gives up.
/// Node.js reads `NODE_EXTRA_CA_CERTS` for every connection; one set
/// already is left as it is.
fn trust_npm_cafile(npm: &mut Command) {
    if std::env::var_os("NODE_EXTRA_CA_CERTS").is_some() {
        return;
    }
    let Ok(out) = Command::new("npm")
        .args(["config", "get", "cafile"])
        .output()
    else {
        return;
    };
    let cafile = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && Path::new(&cafile).is_file() {
        npm.env("NODE_EXTRA_CA_CERTS", cafile);
    }
}

/// The componentize-js command-line script.
pub fn componentize_js() -> Result<PathBuf> {
    Ok(npm_tools()?.join("componentize-js/src/cli.js"))
}

/// Everything the C build needs, installed when missing.
pub fn c_tools() -> Result<CTools> {
    ensure_debian(&DEBIAN_C)?;
    let jco = npm_tools()?.join("jco/dist/jco.js");
    let root_dir = tools_dir();
    let wit_bindgen = root_dir.join("bin/wit-bindgen");
    if !version_of(&wit_bindgen, &["--version"]).is_some_and(|v| v.contains(WIT_BINDGEN)) {
        step(&format!(
            "installing wit-bindgen-cli {WIT_BINDGEN} into {} (10-17 min on 2 cores, done once)",
            root_dir.display()
        ));
        let mut install = crate::cargo();
        install
            .args([
                "install",
                "--locked",
                "wit-bindgen-cli",
                "--version",
                WIT_BINDGEN,
            ])
            .arg("--root")
            .arg(&root_dir)
            .arg("--target-dir")
            .arg(root_dir.join("cargo-build"));
        run(install, "cargo install wit-bindgen-cli")?;
    }
    Ok(CTools { wit_bindgen, jco })
}

/// Installs Debian packages that are not installed (apt-get, as root or
/// through sudo). On a system without dpkg, assumes they are there.
fn ensure_debian(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    step(&format!(
        "installing Debian packages: {} (~1 min, done once)",
        missing.join(" ")
    ));
    let root_user = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    let apt = |args: &[&str]| {
        let mut c = if root_user {
            Command::new("apt-get")
        } else {
            let mut c = Command::new("sudo");
            c.arg("apt-get");
            c
        };
        c.env("DEBIAN_FRONTEND", "noninteractive").args(args);
        c
    };
    run(apt(&["update", "-q"]), "apt-get update")?;
    let mut install = apt(&["install", "-y", "-q", "--no-install-recommends"]);
    install.args(&missing);
    run(install, "apt-get install")
}

/// The first line a tool prints for `args`, when it runs.
fn version_of(tool: &Path, args: &[&str]) -> Option<String> {
    if !tool.is_file() {
        return None;
    }
    let out = Command::new(tool).args(args).output().ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    })
}

fn tempdir(what: &str) -> Result<PathBuf> {
    let dir = target_dir().join("tmp").join(format!(
        "hopper-{what}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
