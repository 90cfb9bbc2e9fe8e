//! `hopper plugin new` in every language: the project builds with its one
//! command, passes its own cases (`./test.sh`, `hopper plugin test`),
//! `hopper plugin check` accepts the result and names the grants it needs,
//! and the handler makes its HTTP call and emits its record when a route
//! grants them.
//!
//! The build scripts reuse the toolchains `cargo xtask build-plugins`
//! installed (`HOPPER_TOOLS` points at them), and the Rust project builds in
//! a target dir of its own that is kept between runs.

use hopper::plugin::{Delivery, Runtime, Verdict};
use hopper_tests::{RouteTable, TEMPLATES, hopper_bin, per_template, resolve_route, target_dir};
use order_service::{Order, OrderService, Status};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest any one build or check may take. Componentizing JavaScript takes
/// up to ~90 s on 2 busy cores; checking compiles 12-18 MB of Wasm.
const LIMIT: Duration = Duration::from_secs(600);

/// Runs `command` to the end, killing it after `LIMIT`.
fn run_bounded(mut command: Command, what: &str) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("{what} ran past {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    child.wait_with_output().unwrap()
}

/// Builds and checks a new project; returns its component.
fn scaffold_build_check(lang: &'static str, root: PathBuf) -> Result<PathBuf, String> {
    let name = format!("hello-{lang}");
    let dir = root.join(lang);
    let mut new = Command::new(hopper_bin());
    new.args(["plugin", "new", "--lang", lang, &name, "--dir"])
        .arg(&dir);
    let out = run_bounded(new, "hopper plugin new");
    if !out.status.success() {
        return Err(format!(
            "{lang}: plugin new failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    for file in ["build.sh", "test.sh", "cases.toml", "wit/handler.wit"] {
        if !dir.join(file).is_file() {
            return Err(format!("{lang}: the project has no {file}"));
        }
    }

    let mut build = Command::new(dir.join("build.sh"));
    build
        .env("HOPPER_TOOLS", target_dir().join("tools"))
        .env("CARGO_TARGET_DIR", target_dir().join("scaffold-rust"));
    let out = run_bounded(build, &format!("{lang} build.sh"));
    let wasm = dir.join(format!("{name}.wasm"));
    if !out.status.success() || !wasm.is_file() {
        return Err(format!(
            "{lang}: build.sh failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }

    // The project's own cases, through its own script.
    let mut test = Command::new(dir.join("test.sh"));
    test.env("HOPPER", hopper_bin())
        .env("HOPPER_CACHE_DIR", hopper_tests::cache_dir());
    let out = run_bounded(test, &format!("{lang} test.sh"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.contains("6 cases: 6 passed, 0 failed.") {
        return Err(format!(
            "{lang}: test.sh failed ({}):\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }

    let mut check = Command::new(hopper_bin());
    check.args(["plugin", "check"]).arg(&wasm);
    let out = run_bounded(check, "hopper plugin check");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.starts_with("ok: ") || text.contains("missing:") {
        return Err(format!(
            "{lang}: plugin check refused it:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    for grant in ["grant needed: HTTP", "grant needed: emit"] {
        if !text.contains(grant) {
            return Err(format!(
                "{lang}: plugin check does not say `{grant}`:\n{text}"
            ));
        }
    }
    Ok(wasm)
}

/// Calls a template's handler directly: without config it only logs; with
/// `lookup-url` and `out-topic` granted it GETs the URL once and passes the
/// message on with the status in a header.
async fn call_template(lang: &str, wasm: &Path, service: &OrderService) -> Result<(), String> {
    let runtime = Runtime::new(256 << 20)
        .unwrap()
        .with_cache(hopper_tests::cache_dir())
        .unwrap();
    let url = service.url();
    let bare = RouteTable::new(wasm).timeout("5s").memory_mib(256);
    let granted = resolve_route(
        bare.clone()
            .allowed_hosts(&[&url])
            .emit_topics(&["enriched"])
            .config("lookup-url", format!("{url}/orders/o-1"))
            .config("out-topic", "enriched"),
    );
    let bare = resolve_route(bare);
    let delivery = || Delivery {
        id: "m-1".into(),
        topic: "direct.in".into(),
        partition: 0,
        offset: 0,
        key: Some(b"k-1".to_vec()),
        payload: Some(b"hello".to_vec()),
        headers: Vec::new(),
        timestamp: None,
        attempt: 1,
        route: "direct".into(),
    };
    let load = |route| {
        runtime
            .load(wasm, route)
            .map_err(|e| format!("{lang}: {e}"))
    };

    let before = service.served().len();
    let handled = load(&bare)?.run(delivery()).await;
    if handled.verdict != Verdict::Ok || !handled.emitted.is_empty() {
        return Err(format!("{lang}: without config: {:?}", handled.verdict));
    }
    if service.served().len() != before {
        return Err(format!("{lang}: called the service without `lookup-url`"));
    }

    let handled = load(&granted)?.run(delivery()).await;
    let [emitted] = handled.emitted.as_slice() else {
        return Err(format!(
            "{lang}: {:?} with {} records",
            handled.verdict,
            handled.emitted.len()
        ));
    };
    let status = emitted
        .headers
        .iter()
        .find(|(k, _)| k == "lookup-status")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    let passed_on = handled.verdict == Verdict::Ok
        && emitted.topic == "enriched"
        && emitted.key.as_deref() == Some(&b"k-1"[..])
        && emitted.payload.as_deref() == Some(&b"hello"[..])
        && status.as_deref() == Some("200");
    if !passed_on {
        return Err(format!("{lang}: {:?} emitted {emitted:?}", handled.verdict));
    }
    let requests = service.served().len() - before;
    if requests != 1 {
        return Err(format!("{lang}: {requests} requests, not 1"));
    }
    Ok(())
}

#[test]
fn plugin_new_builds_and_checks_in_rust_python_javascript_and_c() {
    let root = tempfile::tempdir().unwrap();
    let results = per_template(root.path(), scaffold_build_check);
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failures.is_empty(), "{failures:#?}");

    // One at a time: the service's request count tells each call's apart.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let service = OrderService::start([Order::new("o-1", Status::Pending)])
            .await
            .unwrap();
        let mut failures = Vec::new();
        for (lang, wasm) in TEMPLATES.iter().zip(&results) {
            if let Err(e) = call_template(lang, wasm.as_ref().unwrap(), &service).await {
                failures.push(e);
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    });
}

#[test]
fn plugin_check_lists_what_is_missing_and_extra() {
    let wrong = hopper_tests::plugin("wrong_world");
    let out = Command::new(hopper_bin())
        .args(["plugin", "check"])
        .arg(&wrong)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.starts_with("error: "), "{text}");
    assert!(text.contains("missing: export `handle`"), "{text}");
}

#[test]
fn plugin_check_lists_the_grants_a_components_imports_need() {
    let check = |stem: &str| {
        let out = Command::new(hopper_bin())
            .args(["plugin", "check"])
            .arg(hopper_tests::plugin(stem))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}");
        text
    };
    let acting = check("acting");
    for grant in [
        "grant needed: HTTP (wasi:http/outgoing-handler, hopper:handler/http): the hosts in the route's `allowed_hosts`",
        "grant needed: emit (hopper:handler/emit): the topics in the route's `emit_topics`",
        "grant needed: secrets (hopper:handler/secrets): the names in the route's `[route.secrets]`",
    ] {
        assert!(acting.contains(grant), "{acting}");
    }
    assert!(
        !acting.contains("extra:"),
        "wasi:http is provided: {acting}"
    );
    let noop = check("noop");
    assert!(noop.contains("grants needed: none"), "{noop}");
}
