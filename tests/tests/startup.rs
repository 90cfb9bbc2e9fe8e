//! What `hopper run` does before any message moves: a config without
//! brokers is refused unless the in-memory broker is asked for, and topics
//! created with replication 1 are called out.
//!
//! Regression: a config that forgot `kafka.brokers` silently ran on an
//! in-memory broker that loses everything on exit.

use hopper_tests::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A relay-only config (no handler needed) with `kafka` as its `[kafka]`
/// table, in a directory of its own.
fn config(kafka: &str) -> TestConfig {
    let inbox = rand_name("delay");
    TestConfig::raw(&format!(
        "[kafka]\n{kafka}\n\n[delay]\ninbox = \"{inbox}\"\ngroup = \"{inbox}\"\ntiers = [\"1s\"]\n"
    ))
}

/// Kills the child on drop, so a failed assertion leaves nothing running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `hopper run` with `args` and waits for a log line containing
/// `wanted`; returns every line read until then.
fn run_until_logged(args: &[&str], wanted: &str) -> Vec<String> {
    let child = Command::new(hopper_bin())
        .arg("run")
        .args(args)
        .env("HOPPER_LOG", "info")
        .env("HOPPER_LOG_FORMAT", "text")
        .env("NO_COLOR", "1")
        .env_remove("HOPPER_BROKERS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hopper runs");
    let mut child = Running(child);
    let (tx, rx) = mpsc::channel();
    for stream in [
        Box::new(child.0.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.0.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut lines = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains(wanted);
                lines.push(line);
                if done {
                    return lines;
                }
            }
            Err(_) => panic!(
                "no line with {wanted:?} (exit: {:?}):\n{}",
                child.0.try_wait(),
                lines.join("\n")
            ),
        }
    }
}

#[test]
fn a_config_without_brokers_is_refused_and_says_how_to_fix_it() {
    let TestConfig { dir: _dir, path } = config("partitions = 1");
    let out = Command::new(hopper_bin())
        .args(["run", "--config"])
        .arg(&path)
        .env_remove("HOPPER_BROKERS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it ran:\n{stderr}");
    assert_ne!(out.status.code(), None, "it was killed:\n{stderr}");
    for expected in [
        "no brokers",
        "set kafka.brokers in the config",
        "--brokers",
        "pass --embedded or set kafka.embedded = true",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("Embedded broker listening"), "{stdout}");
}

#[test]
fn the_embedded_broker_starts_when_asked_for() {
    let TestConfig { dir: _dir, path } = config("partitions = 1");
    let path = path.to_str().unwrap();
    let lines = run_until_logged(&["--config", path, "--embedded"], "Delay relay started.");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Embedded broker listening on 127.0.0.1:")),
        "{lines:#?}"
    );

    let TestConfig { dir: _dir, path } = config("partitions = 1\nembedded = true");
    let lines = run_until_logged(
        &["--config", path.to_str().unwrap()],
        "Delay relay started.",
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Embedded broker listening on 127.0.0.1:")),
        "{lines:#?}"
    );
}

#[test]
fn embedded_and_brokers_together_are_refused() {
    let TestConfig { dir: _dir, path } = config("brokers = \"127.0.0.1:1\"\nembedded = true");
    let out = Command::new(hopper_bin())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("kafka.embedded = true and kafka.brokers are both set"),
        "{stderr}"
    );
}

#[test]
fn topics_created_with_replication_1_are_named_in_a_warning() {
    let TestConfig { dir: _dir, path } =
        config(&format!("brokers = \"{}\"\npartitions = 1", brokers()));
    let text = std::fs::read_to_string(&path).unwrap();
    let inbox = text
        .lines()
        .find_map(|l| l.strip_prefix("inbox = \""))
        .unwrap()
        .trim_end_matches('"')
        .to_string();
    let lines = run_until_logged(
        &["--config", path.to_str().unwrap()],
        "Delay relay started.",
    );
    let warning = lines
        .iter()
        .find(|l| l.contains("Topics created with replication 1"))
        .unwrap_or_else(|| panic!("no warning:\n{lines:#?}"));
    for topic in [inbox.clone(), format!("{inbox}.1s"), format!("{inbox}.dlq")] {
        assert!(warning.contains(&topic), "{topic} not named: {warning}");
    }
}
