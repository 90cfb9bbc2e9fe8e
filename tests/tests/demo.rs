//! `hopper demo`, run as a user runs it: on its embedded broker, against the
//! order service it starts, every sample order settles the way the demo
//! says it will, and the live view shows the handler's HTTP calls and the
//! records it emitted.

use hopper_tests::{cache_dir, hopper_bin, plugin};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The demo gives up by itself after 90 s; this is the test's own bound.
const LIMIT: Duration = Duration::from_secs(240);

#[test]
fn the_demo_settles_every_order_against_the_order_service() {
    // The demo's handlers: order-timeout v1 and the v2 it hot-reloads, and
    // order-events.
    plugin("order_timeout");
    plugin("order_timeout_v2");
    plugin("order_events");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut child = Command::new(hopper_bin())
        .current_dir(&root)
        .args(["demo", "--config", "examples/demo.toml", "--cache-dir"])
        .arg(cache_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting hopper demo");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("hopper demo ran past {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");

    let summary = stdout
        .split_once("\nSummary:\n")
        .unwrap_or_else(|| panic!("no summary:\n{stdout}\n{stderr}"))
        .1;
    let settled = |id: &str| {
        summary
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{id}: ")))
            .unwrap_or_else(|| panic!("{id} is not in the summary:\n{summary}"))
            .split("expected:")
            .next()
            .unwrap()
            .trim()
            .to_string()
    };
    for (id, outcome) in [
        ("o-1001", "ok"),
        ("o-1002", "ok"),
        ("o-1003", "ok"),
        ("o-1004", "dead-lettered (FATAL)"),
        ("o-1005", "dead-lettered (RETRIES_EXHAUSTED)"),
        ("o-1006", "dead-lettered (FATAL)"),
        ("o-1007", "ok"),
        ("o-1008", "ok"),
        ("o-1009", "dead-lettered (FATAL)"),
        ("o-1010", "timeout cancelled, never fired"),
    ] {
        assert_eq!(settled(id), outcome, "{id}\n{stdout}");
    }

    // The live view: the calls the handler made, and what it emitted.
    let view = |needle: &str| stdout.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(view("/orders/o-1003/close: 503"), 2, "{stdout}");
    assert_eq!(view("/orders/o-1003/close: 200"), 1, "{stdout}");
    assert_eq!(view("/orders/o-1009/close: 404"), 1, "{stdout}");
    for id in ["o-1001", "o-1003", "o-1007"] {
        assert_eq!(
            view(&format!("{id}/emit/0 emitted to orders.closed")),
            1,
            "{id}\n{stdout}"
        );
    }
    assert_eq!(view("emitted to orders.closed"), 3, "{stdout}");
    // o-1010: its timeout scheduled and cancelled by the order-events
    // handler, through emit; the relay drops it, so the order-timeout
    // handler never sees it, while o-1007's timeout, sent through the same
    // relay and not cancelled, is released and handled.
    assert_eq!(
        view("timeout-o-1010 scheduled by the handler for orders.timeout"),
        1,
        "{stdout}"
    );
    assert_eq!(
        view("timeout-o-1010: cancel sent by the handler"),
        1,
        "{stdout}"
    );
    assert_eq!(
        view("timeout-o-1010 dropped by the delay relay"),
        1,
        "{stdout}"
    );
    assert_eq!(view("timeout-o-1010 released"), 0, "{stdout}");
    assert_eq!(view("timeout-o-1010 attempt"), 0, "{stdout}");
    assert_eq!(
        view("o-1007 released by the delay relay to orders.timeout"),
        1,
        "{stdout}"
    );
    assert!(
        stdout.contains("o-1001 closed, o-1002 paid, o-1003 closed"),
        "the service's own view of the orders:\n{stdout}"
    );
}
