//! Facts `hopper --version` prints that only the build knows: the commit it
//! was built from and the wasmtime version in Cargo.lock.

use std::process::Command;

/// What `git ARGS` prints, trimmed; `None` without git or a repository.
fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|text| !text.is_empty())
}

fn main() {
    println!("cargo:rerun-if-changed=../Cargo.lock");
    // A new commit, or a checkout of another one: this checkout's HEAD and
    // the branch it names (a loose ref, or packed), wherever the repository
    // keeps them (a worktree's HEAD is not in `.git/`). Only files that
    // exist are watched, as cargo reruns for a missing one every time; a
    // commit on another branch or worktree changes none of them.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let common = git(&["rev-parse", "--git-common-dir"]).unwrap_or_else(|| dir.clone());
        let mut watched = vec![format!("{dir}/HEAD"), format!("{common}/packed-refs")];
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(format!("{common}/{branch}"));
        }
        for path in watched {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"])
        // A build from a source tree without git (a container build that
        // copied no .git).
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=HOPPER_COMMIT={commit}");
    let lock = std::fs::read_to_string("../Cargo.lock").unwrap_or_default();
    let wasmtime = lock
        .split("[[package]]")
        .find(|p| p.contains("\nname = \"wasmtime\"\n"))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=HOPPER_WASMTIME={wasmtime}");
}
