//! Facts `hopper --version` prints that only the build knows: the commit it
//! was built from and the wasmtime version in Cargo.lock.

use std::process::Command;

fn main() {
    // A new commit, or a checkout of another one.
    println!("cargo:rerun-if-changed=../.git/HEAD");
    println!("cargo:rerun-if-changed=../.git/refs/heads");
    println!("cargo:rerun-if-changed=../Cargo.lock");
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
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
