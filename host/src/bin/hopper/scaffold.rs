//! `hopper plugin new`: a handler project in Rust, Python, JavaScript or C,
//! from templates built into the binary, with a copy of the WIT and a
//! one-command build (`./build.sh`), and cases for `hopper plugin test`
//! with the script that runs them (`./test.sh`).

use anyhow::{Context as _, bail};
use std::path::{Path, PathBuf};

/// Toolchain versions the generated build scripts pin; the same as
/// `cargo xtask build-plugins` uses.
const COMPONENTIZE_PY: &str = "0.25.1";
const COMPONENTIZE_JS: &str = "0.23.0";
const JCO: &str = "1.35.0";
const WIT_BINDGEN: &str = "0.63.0";

/// Every project's cases for `hopper plugin test`, and the script that runs
/// them: the four templates behave alike, so one file serves them all.
const TESTS: [(&str, &str); 2] = [
    ("cases.toml", include_str!("../../../templates/cases.toml")),
    ("test.sh", include_str!("../../../templates/test.sh")),
];

/// The handler world, which every project gets.
const WIT: &str = include_str!("../../../../wit/handler.wit");

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
    C,
}

/// (path in the project, template text).
fn files(lang: Lang) -> &'static [(&'static str, &'static str)] {
    match lang {
        Lang::Rust => &[
            (
                "Cargo.toml",
                include_str!("../../../templates/rust/Cargo.toml"),
            ),
            (
                "rust-toolchain.toml",
                include_str!("../../../templates/rust/rust-toolchain.toml"),
            ),
            (
                "src/lib.rs",
                include_str!("../../../templates/rust/src/lib.rs"),
            ),
            ("build.sh", include_str!("../../../templates/rust/build.sh")),
        ],
        Lang::Python => &[
            ("app.py", include_str!("../../../templates/python/app.py")),
            (
                "build.sh",
                include_str!("../../../templates/python/build.sh"),
            ),
        ],
        Lang::Js => &[
            (
                "handler.js",
                include_str!("../../../templates/js/handler.js"),
            ),
            ("build.sh", include_str!("../../../templates/js/build.sh")),
        ],
        Lang::C => &[
            ("handler.c", include_str!("../../../templates/c/handler.c")),
            ("build.sh", include_str!("../../../templates/c/build.sh")),
        ],
    }
}

/// Writes a new handler project named `name` into `dir` (which must not
/// exist yet, or be empty) and returns the files written.
pub fn new(lang: Lang, name: &str, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        bail!(
            "handler name `{name}` must start with a lowercase letter and use only a-z, 0-9, - and _"
        );
    }
    if dir.exists()
        && std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_some()
    {
        bail!("{} already exists and is not empty", dir.display());
    }
    let vars = [
        ("{{name}}", name.to_string()),
        ("{{crate}}", name.replace('-', "_")),
        ("{{componentize_py}}", COMPONENTIZE_PY.to_string()),
        ("{{componentize_js}}", COMPONENTIZE_JS.to_string()),
        ("{{jco}}", JCO.to_string()),
        ("{{wit_bindgen}}", WIT_BINDGEN.to_string()),
    ];
    let mut written = Vec::new();
    // Every language calls services with the world's own `fetch`, so the
    // handler world is all the WIT a project needs.
    let all = files(lang)
        .iter()
        .copied()
        .chain(TESTS)
        .chain([("wit/handler.wit", WIT)]);
    for (path, template) in all {
        let text = vars
            .iter()
            .fold(template.to_string(), |t, (k, v)| t.replace(k, v));
        let dest = dir.join(path);
        std::fs::create_dir_all(dest.parent().unwrap())
            .with_context(|| format!("creating {}", dest.parent().unwrap().display()))?;
        std::fs::write(&dest, text).with_context(|| format!("writing {}", dest.display()))?;
        if path.ends_with(".sh") {
            make_executable(&dest)?;
        }
        written.push(dest);
    }
    Ok(written)
}

#[cfg(unix)]
fn make_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", path.display()))
}

#[cfg(not(unix))]
fn make_executable(_: &Path) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_language_gets_the_wit_and_a_build_script_with_no_placeholder_left() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js, Lang::C] {
            let dir = std::env::temp_dir()
                .join(format!("hopper-scaffold-{}-{lang:?}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let written = new(lang, "my-handler", &dir).unwrap();
            assert!(written.contains(&dir.join("wit/handler.wit")));
            assert!(written.contains(&dir.join("build.sh")));
            assert!(written.contains(&dir.join("cases.toml")));
            assert!(written.contains(&dir.join("test.sh")));
            assert!(
                !written.contains(&dir.join("wit/handler-http.wit")),
                "{lang:?}: `fetch` needs no wasi:http WIT"
            );
            for file in &written {
                let text = std::fs::read_to_string(file).unwrap();
                assert!(
                    !text.contains("{{"),
                    "{} keeps a placeholder",
                    file.display()
                );
            }
            assert!(new(lang, "my-handler", &dir).is_err(), "overwrote {lang:?}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
        assert!(new(Lang::Rust, "My Handler", Path::new("/nonexistent")).is_err());
    }
}
