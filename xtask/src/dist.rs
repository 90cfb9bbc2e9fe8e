//! `cargo xtask dist`: the release tarball, `hopper-<version>-<target>.tar.gz`.
//!
//! ```text
//! hopper-0.1.0-x86_64-unknown-linux-gnu/
//!   bin/hopper                 stripped; its debug info is the .debug file beside the tarball
//!   completions/hopper.bash    _hopper (zsh)    hopper.fish
//!   man/man1/hopper.1          and one page per subcommand (hopper-run.1, hopper-dlq-ls.1, ...)
//!   hopper.toml                an example config (deploy/docker/hopper.toml)
//!   LICENSE  README.md
//!   SHA256SUMS                 of every file above
//! hopper-0.1.0-x86_64-unknown-linux-gnu.tar.gz  (+ .sha256)
//! hopper-0.1.0-x86_64-unknown-linux-gnu.debug   (objcopy --only-keep-debug; gdb finds it by
//!                                                the binary's .gnu_debuglink)
//! ```
//!
//! The completions and man pages come from the binary itself (`hopper
//! completions`, `hopper manpages`), so they describe exactly the commands
//! it has. `--binary PATH` packs a binary already built (the test command
//! packs its own debug build, then [`check`]s the tarball); without it, a
//! release build. `--check` unpacks the tarball where no checkout is and
//! runs it ([`check`]).

use crate::{cargo, root, step, target_dir};
use anyhow::{Context, Result, bail, ensure};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What [`pack`] made.
pub struct Packed {
    pub tarball: PathBuf,
    /// The name of the folder inside, `hopper-<version>-<target>`.
    pub name: String,
}

/// `cargo xtask dist [--binary PATH] [--out DIR]`.
pub fn dist(args: &[String]) -> Result<()> {
    let mut binary = None;
    let mut out = target_dir().join("dist");
    let mut unpack = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .map(PathBuf::from)
                .with_context(|| format!("{arg} needs a path"))
        };
        match arg.as_str() {
            "--binary" => binary = Some(value()?),
            "--out" => out = value()?,
            "--check" => unpack = true,
            other => bail!(
                "usage: cargo xtask dist [--binary PATH] [--out DIR] [--check]; unknown `{other}`"
            ),
        }
    }
    let binary = match binary {
        Some(binary) => binary,
        None => {
            step("building hopper: cargo build --release --locked -p hopper --bin hopper");
            let mut build = cargo();
            build.current_dir(root()).args([
                "build",
                "--release",
                "--locked",
                "-p",
                "hopper",
                "--bin",
                "hopper",
            ]);
            crate::run(build, "building hopper (release)")?;
            target_dir().join("release/hopper")
        }
    };
    let packed = pack(&binary, &out)?;
    eprintln!("    {}", packed.tarball.display());
    if unpack {
        crate::build_rust_plugins(&["order-timeout"])?;
        check(&packed, &crate::dist().join("order_timeout.wasm"))?;
    }
    Ok(())
}

/// Packs `binary` into a tarball in `out` (module docs).
pub fn pack(binary: &Path, out: &Path) -> Result<Packed> {
    step(&format!("packing {} into a tarball", binary.display()));
    ensure!(
        binary.is_file(),
        "{} is not a built binary",
        binary.display()
    );
    let version = output(Command::new(binary).arg("--version"))?;
    let version = version
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("`hopper --version` printed {version:?}"))?
        .to_string();
    let rustc = output(Command::new("rustc").arg("-vV"))?;
    let target = rustc
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .context("`rustc -vV` names no host target")?
        .to_string();
    let name = format!("hopper-{version}-{target}");
    let stage = out.join(&name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    for dir in ["bin", "completions", "man/man1"] {
        std::fs::create_dir_all(stage.join(dir))?;
    }

    // The binary without its debug info, which goes beside the tarball.
    let debug = out.join(format!("{name}.debug"));
    let stripped = stage.join("bin/hopper");
    let mut keep = Command::new("objcopy");
    keep.arg("--only-keep-debug").arg(binary).arg(&debug);
    crate::run(keep, "objcopy --only-keep-debug")?;
    let mut strip = Command::new("objcopy");
    strip
        .arg("--strip-debug")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(binary)
        .arg(&stripped);
    crate::run(strip, "objcopy --strip-debug")?;

    for (shell, file) in [
        ("bash", "hopper.bash"),
        ("zsh", "_hopper"),
        ("fish", "hopper.fish"),
    ] {
        let script = output(Command::new(&stripped).args(["completions", shell]))?;
        std::fs::write(stage.join("completions").join(file), script)?;
    }
    let mut man = Command::new(&stripped);
    man.arg("manpages").arg(stage.join("man/man1"));
    crate::run(man, "hopper manpages")?;
    for (from, to) in [
        ("LICENSE", "LICENSE"),
        ("README.md", "README.md"),
        ("deploy/docker/hopper.toml", "hopper.toml"),
    ] {
        std::fs::copy(root().join(from), stage.join(to))
            .with_context(|| format!("copying {from}"))?;
    }

    // Checksums of every file inside, then of the tarball.
    let mut files = Vec::new();
    collect(&stage, &stage, &mut files)?;
    files.sort();
    let mut sums = Command::new("sha256sum");
    sums.current_dir(&stage).args(&files);
    std::fs::write(stage.join("SHA256SUMS"), output(&mut sums)?)?;
    let tarball = out.join(format!("{name}.tar.gz"));
    let mut tar = Command::new("tar");
    tar.arg("-czf")
        .arg(&tarball)
        .arg("--owner=0")
        .arg("--group=0")
        .arg("-C")
        .arg(out)
        .arg(&name);
    crate::run(tar, "tar")?;
    let mut sum = Command::new("sha256sum");
    sum.current_dir(out).arg(format!("{name}.tar.gz"));
    std::fs::write(out.join(format!("{name}.tar.gz.sha256")), output(&mut sum)?)?;
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len() / (1024 * 1024));
    eprintln!(
        "    binary {} MiB, stripped {} MiB (debug info {} MiB beside it), tarball {} MiB",
        size(binary)?,
        size(&stripped)?,
        size(&debug)?,
        size(&tarball)?
    );
    std::fs::remove_dir_all(&stage)?;
    Ok(Packed { tarball, name })
}

/// Unpacks `packed` into an empty directory with no checkout beside it and
/// runs what a user runs first: `--version`, the completions, the man
/// page, `config check` and the whole demo.
pub fn check(packed: &Packed, handler: &Path) -> Result<()> {
    step("checking the tarball: unpacked into an empty directory");
    let dir = tempdir()?;
    let mut untar = Command::new("tar");
    untar.arg("-xzf").arg(&packed.tarball).arg("-C").arg(&dir);
    crate::run(untar, "tar -x")?;
    let home = dir.join(&packed.name);
    let hopper = home.join("bin/hopper");

    let mut sums = Command::new("sha256sum");
    sums.current_dir(&home)
        .args(["--check", "--quiet", "SHA256SUMS"]);
    crate::run(sums, "sha256sum --check SHA256SUMS")?;
    let version = output(Command::new(&hopper).arg("--version"))?;
    ensure!(
        version.starts_with("hopper "),
        "`hopper --version` printed {version:?}"
    );
    let bash = output(Command::new(&hopper).args(["completions", "bash"]))?;
    ensure!(
        std::fs::read_to_string(home.join("completions/hopper.bash"))? == bash
            && bash.contains("dlq"),
        "completions/hopper.bash is not what `hopper completions bash` prints"
    );
    for page in ["hopper.1", "hopper-run.1", "hopper-dlq-replay.1"] {
        let text = std::fs::read_to_string(home.join("man/man1").join(page))
            .with_context(|| format!("man/man1/{page}"))?;
        ensure!(text.contains(".TH"), "man/man1/{page} is not a man page");
    }

    // The example config, checked with its credentials in the environment
    // and its handler pointed at a built one.
    let example = std::fs::read_to_string(home.join("hopper.toml"))?;
    let config = home.join("checked.toml");
    std::fs::write(
        &config,
        example.replace(
            "/var/lib/hopper/handlers/order_timeout.wasm",
            &handler.display().to_string(),
        ),
    )?;
    let mut check = Command::new(&hopper);
    check
        .current_dir(&dir)
        .args(["config", "check", "--config"])
        .arg(&config)
        .env("KAFKA_USERNAME", "user")
        .env("KAFKA_PASSWORD", "secret")
        .env("HOPPER_ADMIN_TOKEN", "a-token-for-the-check")
        .env("HOPPER_CACHE_DIR", dir.join("cache"));
    crate::run(check, "hopper config check on the example config")?;

    // The demo, from the unpacked directory, with everything it needs
    // inside the binary.
    let demo = Command::new(&hopper)
        .current_dir(&dir)
        .arg("demo")
        .env("HOPPER_RUNTIME_DIR", dir.join("run"))
        .env("HOPPER_CACHE_DIR", dir.join("cache"))
        .stdin(Stdio::null())
        .output()
        .context("running hopper demo")?;
    let stdout = String::from_utf8_lossy(&demo.stdout);
    let summary = stdout.split_once("\nSummary:\n").map(|(_, s)| s);
    ensure!(
        demo.status.success() && summary.is_some_and(|s| !s.contains("not settled")),
        "hopper demo from the tarball:\n{stdout}\n{}",
        String::from_utf8_lossy(&demo.stderr)
    );
    std::fs::remove_dir_all(&dir)?;
    eprintln!("    {}: unpacked, checked, demo ran", packed.name);
    Ok(())
}

/// A new empty directory under the system's temp dir.
fn tempdir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("hopper-dist-check-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Every file under `dir`, relative to `base`.
fn collect(base: &Path, dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(base, &path, files)?;
        } else {
            files.push(path.strip_prefix(base)?.to_path_buf());
        }
    }
    Ok(())
}

/// What `command` prints on stdout; an error with its stderr if it fails.
fn output(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}
