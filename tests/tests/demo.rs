//! `hopper demo`, run as a user runs it: the binary alone, copied into an
//! empty directory with no checkout beside it, on its embedded broker,
//! against the order service it starts. Every sample order settles the way
//! the demo says it will, the live view shows the handler's HTTP calls and
//! the records it emitted, and the console answers at the address it
//! prints.
//!
//! The handlers the binary carries (host/demo/) are the ones their source
//! builds.

use hopper_tests::{cache_dir, hopper_bin, http, plugin};
use std::io::{BufRead as _, BufReader, Read as _};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The demo gives up by itself after 90 s; this is the test's own bound.
const LIMIT: Duration = Duration::from_secs(240);

#[test]
fn the_demo_components_inside_the_binary_are_built_from_their_source() {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/demo");
    let config = std::fs::read_to_string(demo.join("demo.toml")).unwrap();
    let mut named = 0;
    for name in ["order_timeout", "order_timeout_v2", "order_events"] {
        let file = format!("{name}.wasm");
        // plugins/dist holds what `cargo xtask build-plugins` just built
        // from plugins/, the way the test command builds it.
        let built = std::fs::read(plugin(name)).unwrap();
        let carried = std::fs::read(demo.join(&file)).unwrap();
        assert!(
            carried == built,
            "host/demo/{file} ({} bytes) is not what its source builds ({} bytes): \
             run `cargo xtask demo-components` and commit the result",
            carried.len(),
            built.len()
        );
        named += usize::from(config.contains(&format!("handler = \"{file}\"")));
    }
    // v2 is the hot reload's, found beside v1; the config names the others.
    assert_eq!(named, 2, "host/demo/demo.toml:\n{config}");
}

#[test]
fn the_demo_settles_every_order_against_the_order_service() {
    // Nothing but the binary: copied into an empty directory, run there.
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("hopper");
    std::fs::copy(hopper_bin(), &bin).unwrap();
    let work = dir.path().join("work");
    let runtime = dir.path().join("run");
    std::fs::create_dir(&work).unwrap();
    let mut child = Command::new(&bin)
        .current_dir(&work)
        .env("HOPPER_RUNTIME_DIR", &runtime)
        .args(["demo", "--linger", "--cache-dir"])
        .arg(cache_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting hopper demo");
    let (lines_tx, lines) = mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in stdout.lines() {
            let line = line.unwrap();
            all.push_str(&line);
            all.push('\n');
            let _ = lines_tx.send(line);
        }
        all
    });
    let mut stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all);
        all
    });
    // The console's address, printed before the first order, and the line
    // that says every order settled.
    let started = Instant::now();
    let mut console = None;
    loop {
        let left = LIMIT.saturating_sub(started.elapsed());
        let Ok(line) = lines.recv_timeout(left) else {
            let _ = child.kill();
            panic!(
                "hopper demo printed no `Still running` within {LIMIT:?} (console: {console:?})"
            );
        };
        if let Some(url) = line.strip_prefix("Console: ") {
            console = Some(url.split(' ').next().unwrap().to_string());
        }
        if line.starts_with("Still running") {
            break;
        }
    }
    // The console answers with the session's token from the URL, and shows
    // the demo's route; without the token it answers 401.
    let url = console.expect("the demo printed its console address");
    let (addr, token) = url
        .strip_prefix("http://")
        .and_then(|u| u.split_once("/#token="))
        .unwrap_or_else(|| panic!("console URL {url}"));
    let addr: SocketAddr = addr.parse().unwrap();
    assert!(addr.ip().is_loopback(), "{url}");
    let runtime_files = std::fs::read_dir(&runtime).unwrap().count();
    let answers = tokio::runtime::Runtime::new().unwrap().block_on(async {
        (
            http(addr, "GET", "/api/status", Some(token), None).await,
            http(addr, "GET", "/api/status", None, None).await,
        )
    });
    assert_eq!(answers.0.0, 200, "{}", answers.0.1);
    assert!(answers.0.1.contains("orders.timeout"), "{}", answers.0.1);
    assert_eq!(answers.1.0, 401, "{}", answers.1.1);
    // The token is written for `hopper status` while the demo runs.
    assert_eq!(runtime_files, 1);

    // Ctrl-C ends the lingering demo.
    let pid = child.id() as i32;
    // SAFETY: kill(2) on the child this test started and has not reaped.
    let signalled = unsafe { libc::kill(pid, libc::SIGINT) };
    assert_eq!(signalled, 0, "signalling the demo");
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("hopper demo ran past {LIMIT:?} after Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = reader.join().unwrap();
    let stderr = errors.join().unwrap();
    assert!(status.success(), "{stdout}\n{stderr}");
    // The live view alone: no log lines unless asked for with --logs, not
    // even the handler's own error line for the poison message, whose dead
    // letter the view shows with the same words.
    for level in [" INFO ", " WARN ", " DEBUG "] {
        assert!(
            !stdout.contains(level) && !stderr.contains(level),
            "a log line in the live view:\n{stdout}\n{stderr}"
        );
    }
    let poison = "payload is not an order";
    assert!(
        stdout.contains(&format!("hopper-last-error={poison}")),
        "{stdout}"
    );
    assert!(
        !stderr.contains(poison) && stdout.matches(poison).count() == 1,
        "the handler's log line in the live view:\n{stdout}\n{stderr}"
    );
    // The token file went with the demo.
    assert_eq!(std::fs::read_dir(&runtime).unwrap().count(), 0);

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
