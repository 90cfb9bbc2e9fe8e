//! `hopper dev` in a project made by `hopper plugin new`, for every
//! template: the first version serves a message typed on stdin; an edit to
//! the source is built, tested and swapped in, and the next message shows
//! the handler's new log line; an edit that breaks the build, and one that
//! fails a case, are reported and leave that version serving, which the
//! message sent after them shows; SIGTERM stops it cleanly.
//!
//! Like `scaffold.rs`, the build scripts reuse the toolchains `cargo xtask
//! build-plugins` installed (`HOPPER_TOOLS`), and the Rust project builds
//! in a target dir of its own that is kept between runs.

use hopper_tests::{PATIENCE, hopper_bin, per_template, target_dir};
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Longest one step may take: a build (componentizing JavaScript takes up
/// to ~90 s on 2 busy cores), its cases, and the swap.
const LIMIT: Duration = Duration::from_secs(600);

/// A template's source file, and a line that does not compile in it.
fn source(lang: &str) -> (&'static str, &'static str) {
    match lang {
        "rust" => ("src/lib.rs", "fn broken( {"),
        "python" => ("app.py", "def broken(:"),
        "js" => ("handler.js", "function broken( {"),
        "c" => ("handler.c", "int broken( {"),
        _ => unreachable!(),
    }
}

/// Every line `hopper dev` printed, stdout and stderr, as they come.
#[derive(Default)]
struct Lines {
    lines: Mutex<Vec<String>>,
    more: Condvar,
}

impl Lines {
    fn follow(self: &Arc<Self>, from: impl std::io::Read + Send + 'static) {
        let lines = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines() {
                let Ok(line) = line else { break };
                lines.lines.lock().unwrap().push(line);
                lines.more.notify_all();
            }
        });
    }

    /// Waits for a line after `from` that has every one of `texts`;
    /// returns the index after it.
    fn wait(&self, from: usize, texts: &[&str], lang: &str) -> Result<usize, String> {
        let deadline = Instant::now() + LIMIT;
        let mut lines = self.lines.lock().unwrap();
        loop {
            if let Some(at) = lines
                .iter()
                .skip(from)
                .position(|l| texts.iter().all(|t| l.contains(t)))
            {
                return Ok(from + at + 1);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "{lang}: no line with {texts:?} after line {from} within {LIMIT:?}:\n{}",
                    lines.join("\n")
                ));
            }
            lines = self.more.wait_timeout(lines, left).unwrap().0;
        }
    }

    fn all(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

/// Kills `hopper dev` if the test fails before stopping it.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn send(stdin: &mut ChildStdin, line: &str) {
    writeln!(stdin, "{line}").unwrap();
    stdin.flush().unwrap();
}

fn edit(file: &Path, edit: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(file).unwrap();
    std::fs::write(file, edit(text)).unwrap();
}

fn dev_loop(lang: &'static str, root: PathBuf) -> Result<(), String> {
    let name = format!("dev-{lang}");
    let dir = root.join(lang);
    let out = Command::new(hopper_bin())
        .args(["plugin", "new", "--lang", lang, &name, "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(format!("{lang}: plugin new failed: {out:?}"));
    }
    let mut child = Command::new(hopper_bin())
        .arg("dev")
        .arg(&dir)
        .env("HOPPER_TOOLS", target_dir().join("tools"))
        .env("CARGO_TARGET_DIR", target_dir().join("scaffold-rust"))
        .env("HOPPER_CACHE_DIR", hopper_tests::cache_dir())
        .env_remove("HOPPER_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Lines::default());
    lines.follow(child.stdout.take().unwrap());
    lines.follow(child.stderr.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut running = Running(child);
    let (file, broken) = source(lang);
    let file = dir.join(file);

    // Compiled by Winch, `hopper dev`'s default, and said so.
    let at = lines.wait(0, &["Compiled by winch (quick to compile"], lang)?;
    // Version 1 serves a message.
    let at = lines.wait(at, &["v1 (", "serving: build"], lang)?;
    send(&mut stdin, "k-1: hello");
    lines.wait(at, &["Handled message dev-1 (5 bytes)"], lang)?;
    let at = lines.wait(at, &["dev-1 attempt 1: ok, by v1 ("], lang)?;

    // An edit: version 2 serves, with its new log line.
    edit(&file, |t| t.replace("Handled message", "Greeted message"));
    let at = lines.wait(at, &["v2 (", "serving: build", "swap"], lang)?;
    send(&mut stdin, "k-2: hello");
    lines.wait(at, &["Greeted message dev-2 (5 bytes)"], lang)?;
    let at = lines.wait(at, &["dev-2 attempt 1: ok, by v2 ("], lang)?;

    // A build that fails: its output is shown, version 2 keeps serving.
    edit(&file, |t| format!("{t}\n{broken}\n"));
    let at = lines.wait(at, &["build.sh failed", "its output:"], lang)?;
    let at = lines.wait(at, &["failed: v2 (", "keeps serving"], lang)?;

    // A case that fails: shown as `plugin test` shows it, and version 2
    // keeps serving.
    edit(&file, |t| {
        t.replace(&format!("\n{broken}\n"), "")
            .replace("a tombstone has nothing to handle", "a tombstone is empty")
    });
    let at = lines.wait(
        at,
        &["FAIL a tombstone is fatal  (fatal: a tombstone is empty"],
        lang,
    )?;
    let at = lines.wait(at, &["- \"a tombstone has nothing to handle\""], lang)?;
    let at = lines.wait(at, &["6 cases: 5 passed, 1 failed."], lang)?;
    let at = lines.wait(at, &["failed: v2 (", "keeps serving"], lang)?;
    send(&mut stdin, "k-3: hello");
    lines.wait(at, &["Greeted message dev-3 (5 bytes)"], lang)?;
    let at = lines.wait(at, &["dev-3 attempt 1: ok, by v2 ("], lang)?;

    // SIGTERM stops it.
    let pid = libc::pid_t::try_from(running.0.id()).unwrap();
    // SAFETY: signals our own child, which is not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    lines.wait(at, &["SIGTERM: stopping"], lang)?;
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = running.0.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            return Err(format!("{lang}: still running 60 s after SIGTERM"));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !status.success() {
        return Err(format!("{lang}: exited {status}:\n{}", lines.all()));
    }
    lines.wait(at, &["stopped"], lang)?;
    // The times of each change, for `--nocapture`.
    let all = lines.all();
    for line in all.lines().filter(|l| {
        l.contains("serving: build") || l.contains("build.sh failed") || l.contains(" failed: v")
    }) {
        println!("{lang}: {line}");
    }
    Ok(())
}

#[test]
fn hopper_dev_swaps_in_what_builds_and_passes_and_keeps_serving_otherwise() {
    let root = tempfile::tempdir().unwrap();
    let failures: Vec<String> = per_template(root.path(), dev_loop)
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn hopper_dev_outside_a_project_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(hopper_bin())
        .arg("dev")
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is not a handler project: it has no build.sh"),
        "{stderr}"
    );
}
