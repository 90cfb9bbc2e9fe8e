//! Project tooling: `cargo xtask <command>`.
//!
//! - `demo`: builds hopper (as `test` builds it, so the two share one
//!   build), and runs the demo, with the handlers inside the binary, on the
//!   embedded broker.
//! - `demo-components`: rebuilds those handlers (host/demo/) from plugins/.
//! - `dist`: the release tarball (`dist.rs`); `test` packs and checks one
//!   from its own build.
//! - `test`: installs the test broker if missing, builds the handlers, starts
//!   the broker on 127.0.0.1, runs every test, and stops the broker.
//! - `build-plugins`: builds every handler component into `plugins/dist/`:
//!   the Rust ones with cargo, the Python, JavaScript and C ones with pinned
//!   toolchains it installs on first use (see `polyglot.rs`).
//! - `broker`: starts the test broker and prints its address, until Ctrl-C.
//! - `crash-loop`: kills hopper with SIGKILL during a run of messages and
//!   counts every message's fate (`--messages N --kills K`).
//! - `promtool`: unpacks Debian's promtool (for the alert-rules test) and
//!   prints its path.
//! - `check-deploy`: lints and validates `deploy/` offline, and checks the
//!   README's handler example (see `deploy.rs`); `test` runs it too.

use anyhow::{Context, Result, bail};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod deploy;
mod dist;
mod polyglot;

/// Components built from `plugins/`, by crate name.
const PLUGINS: [&str; 12] = [
    "order-timeout",
    "order-events",
    "noop",
    "fatal",
    "scripted",
    "wrong-world",
    "acting",
    "fetch",
    "imports",
    // Built against the WIT releases they are named for, kept unchanged.
    "legacy-0-1-0",
    "legacy-0-1-1",
    "legacy-0-1-2",
];
const NISSHI_VERSION: &str = "0.8.1";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, rest) = args
        .split_first()
        .map_or(("help", &[][..]), |(c, r)| (c.as_str(), r));
    match command {
        "build-plugins" => build_plugins(),
        "demo" => demo(rest),
        "demo-components" => demo_components(),
        "dist" => dist::dist(rest),
        "test" => test(rest),
        "broker" => broker(),
        "promtool" => ensure_promtool().map(|p| println!("{}", p.display())),
        "bench" => bench(rest),
        "fuzz" => fuzz(rest),
        "crash-loop" => crash_loop(rest),
        "check-deploy" => deploy::check(),
        _ => {
            eprintln!(
                "usage: cargo xtask <command>\n\n  demo           run the demo on the embedded broker\n  test [ARGS]    run the whole test suite against a real broker (ARGS go to cargo test)\n  build-plugins  build every handler component into plugins/dist/\n  dist [--binary PATH] [--out DIR] [--check]  the release tarball: stripped binary, completions, man pages (target/dist/)\n  demo-components  rebuild the demo's handlers inside the hopper binary (host/demo/) from plugins/\n  broker         start the test broker on 127.0.0.1 and wait\n  promtool       unpack promtool (alert-rules test) and print its path\n  bench NAME     run a benchmark: throughput, delay, handler, handlers, http, concurrency, parked, dlq (BENCHMARKS.md)\n  fuzz [CASES]   run every header-value fuzz target with CASES cases each (default 1,000,000)\n  crash-loop     kill -9 hopper during a run and count every message (--messages N --kills K)\n  check-deploy   lint the Dockerfile, validate the Kubernetes manifests and the systemd unit, check the README's handler"
            );
            if command == "help" {
                Ok(())
            } else {
                bail!("unknown command `{command}`")
            }
        }
    }
}

/// `cargo xtask fuzz [CASES]`: every function of a header value
/// (host/tests/fuzz.rs) and every host import a guest calls
/// (tests/tests/fuzz_imports.rs, through the `imports` fixture), CASES
/// (default 1,000,000) proptest cases per target. The header targets run in
/// the dev profile, which builds hopper with overflow checks on. Any panic
/// fails it. Prints the time taken (BENCHMARKS.md).
fn fuzz(rest: &[String]) -> Result<()> {
    let cases = rest.first().map_or("1000000", String::as_str);
    build_rust_plugins(&["imports"])?;
    // `--workspace`, as the test command builds: the same features, so the
    // test build is reused rather than done again.
    let test = |target: &str, extra: &[&str]| {
        let mut test = cargo();
        test.current_dir(root())
            .args(["test", "--workspace", "--test", target])
            .args(extra)
            .env("PROPTEST_CASES", cases);
        test
    };
    let targets = ["fuzz", "fuzz_imports"];
    for target in targets {
        run(test(target, &["--no-run"]), "building the fuzz targets")?;
    }
    // The reason and log paths' targets are unit tests, in `fuzz` modules.
    step(&format!(
        "fuzzing the library's fuzz modules, {cases} cases per target"
    ));
    let mut unit = cargo();
    unit.current_dir(root())
        .args(["test", "--workspace", "--lib", "--", "::fuzz::"])
        .env("PROPTEST_CASES", cases);
    run(unit, "the library's fuzz targets")?;
    for target in targets {
        step(&format!("fuzzing {target}, {cases} cases per target"));
        let started = Instant::now();
        run(test(target, &[]), "the fuzz targets")?;
        eprintln!(
            "==> {target}: {cases} cases per target, 0 panics, in {:.1?}",
            started.elapsed()
        );
    }
    Ok(())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn step(what: &str) {
    eprintln!("==> {what}");
}

fn run(mut command: Command, what: &str) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("starting {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Builds every handler into `plugins/dist/`: the Rust ones, then the
/// Python, JavaScript and C ones.
fn build_plugins() -> Result<()> {
    build_rust_plugins(&PLUGINS)?;
    polyglot::build(&dist())
}

/// Where configs and tests find the built handlers.
fn dist() -> PathBuf {
    root().join("plugins/dist")
}

/// Builds the Rust handlers `crates` for wasm32-wasip2 and copies each to
/// `plugins/dist/<crate_name>.wasm`; with `order-timeout`, also its v2 (the
/// demo's hot reload) as `order_timeout_v2.wasm`.
fn build_rust_plugins(crates: &[&str]) -> Result<()> {
    step("building handler components (wasm32-wasip2, release)");
    let plugin_target = target_dir().join("plugins");
    let mut build = cargo();
    reproducible(&mut build);
    build
        .current_dir(root().join("plugins"))
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&plugin_target);
    for name in crates {
        build.args(["-p", name]);
    }
    run(build, "building the handler components")?;
    let mut builds: Vec<(String, PathBuf)> = crates
        .iter()
        .map(|name| {
            let file = format!("{}.wasm", name.replace('-', "_"));
            let built = plugin_target.join("wasm32-wasip2/release").join(&file);
            (file, built)
        })
        .collect();
    if crates.contains(&"order-timeout") {
        // Version 2 of the order-timeout handler, for the demo's hot reload.
        // Its own target dir, so the two builds do not invalidate each other.
        let v2_target = target_dir().join("plugins-v2");
        let mut v2 = cargo();
        reproducible(&mut v2);
        v2.current_dir(root().join("plugins"))
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "-p",
                "order-timeout",
            ])
            .args(["--features", "refunds", "--target-dir"])
            .arg(&v2_target);
        run(v2, "building order-timeout v2")?;
        builds.push((
            "order_timeout_v2.wasm".to_string(),
            v2_target.join("wasm32-wasip2/release/order_timeout.wasm"),
        ));
    }
    let dist = dist();
    std::fs::create_dir_all(&dist)?;
    for (file, built) in builds {
        let dest = dist.join(&file);
        // Write a temp file and rename, so a running hopper never sees half a file.
        let tmp = dist.join(format!(".{file}.tmp"));
        std::fs::copy(&built, &tmp).with_context(|| format!("copying {}", built.display()))?;
        std::fs::rename(&tmp, &dest)?;
        eprintln!(
            "    {} ({} KiB)",
            dest.display(),
            std::fs::metadata(&dest)?.len() / 1024
        );
    }
    Ok(())
}

/// Has `command` (a cargo build of handler components) build the same bytes
/// from the same source on any machine and in any checkout: the paths of
/// dependencies' sources, which panic messages carry, are written relative
/// to `$CARGO_HOME` (the workspace's own are relative already, and the
/// standard library's are remapped by its build). So the demo components
/// committed in host/demo/ can be checked against a fresh build.
///
/// A workspace wrapper of rustc that the caller's shell exports is dropped
/// too: built through clippy-driver, the same source gave other bytes.
fn reproducible(command: &mut Command) {
    command.env_remove("RUSTC_WORKSPACE_WRAPPER");
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(home) = home {
        command.env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--remap-path-prefix={}=/cargo", home.display()),
        );
    }
}

/// The handler components the demo carries inside the hopper binary
/// (host/demo/, beside its config), by file name in plugins/dist.
const DEMO_COMPONENTS: [&str; 3] = [
    "order_timeout.wasm",
    "order_timeout_v2.wasm",
    "order_events.wasm",
];

/// Rebuilds the demo's components and copies them into host/demo/, where
/// the hopper binary's build picks them up. The test suite fails while
/// they differ from a build of their source (tests/tests/demo.rs).
fn demo_components() -> Result<()> {
    build_rust_plugins(&["order-timeout", "order-events"])?;
    let demo = root().join("host/demo");
    for file in DEMO_COMPONENTS {
        let dest = demo.join(file);
        std::fs::copy(dist().join(file), &dest)
            .with_context(|| format!("copying {file} to {}", dest.display()))?;
        eprintln!("    {}", dest.display());
    }
    Ok(())
}

/// The demo carries its handlers inside the hopper binary (host/demo/), so
/// on a fresh machine it builds no handler and waits for no Python,
/// JavaScript or C toolchain.
///
/// hopper is built as the test command builds it, `cargo test --workspace`
/// (here only the `cli` test, whose build includes the `hopper` binary),
/// and that binary is run: the same selection resolves the same features
/// (dev-dependencies such as tokio's `test-util` included), so either
/// command reuses the other's build. A `cargo run -p hopper` would resolve
/// them without the dev-dependencies and rebuild hopper and much of what
/// it depends on.
fn demo(rest: &[String]) -> Result<()> {
    step("building hopper: cargo test --workspace --no-run --test cli");
    let mut build = cargo();
    build
        .current_dir(root())
        .args(["test", "--workspace", "--no-run", "--test", "cli"]);
    linted(&mut build);
    run(build, "building hopper")?;
    step("running the demo on the embedded broker");
    let binary = target_dir()
        .join("debug")
        .join(format!("hopper{}", std::env::consts::EXE_SUFFIX));
    let mut demo = Command::new(&binary);
    demo.current_dir(root()).arg("demo").args(rest);
    run(demo, &format!("the demo ({})", binary.display()))
}

/// Has `command` (a cargo build) run clippy's lints on the workspace's own
/// crates as it compiles them, denying every warning: cargo runs
/// `clippy-driver` in place of rustc for workspace members
/// (`RUSTC_WORKSPACE_WRAPPER`, which is how `cargo clippy` works), with the
/// lint arguments in `CLIPPY_ARGS`, in the form `cargo clippy` passes them.
///
/// A separate `cargo clippy --all-targets` would check every dependency
/// (wasmtime, librdkafka's bindings, ...) a second time, in check mode,
/// before the test build compiles them: minutes on a fresh machine. This
/// way dependencies are compiled once, by rustc, and the lints cover every
/// target the test build compiles (libraries, binaries, tests, examples).
/// Cargo keeps the wrapper and the arguments in each member's fingerprint,
/// so every command that should share this build sets the same.
fn linted(command: &mut Command) {
    const DENY_WARNINGS: &str = "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__";
    command.env("RUSTC_WORKSPACE_WRAPPER", "clippy-driver");
    command.env("CLIPPY_ARGS", DENY_WARNINGS);
}

fn test(rest: &[String]) -> Result<()> {
    let started = Instant::now();
    let nisshi = ensure_nisshi()?;
    build_plugins()?;
    step("checking formatting");
    let mut fmt = cargo();
    fmt.current_dir(root()).args(["fmt", "--all", "--check"]);
    run(fmt, "cargo fmt --check")?;
    // The handler components are a workspace of their own.
    let mut fmt = cargo();
    fmt.current_dir(root().join("plugins"))
        .args(["fmt", "--all", "--check"]);
    run(fmt, "cargo fmt --check (plugins/)")?;
    // The demo builds hopper with this same selection and the same lints
    // (`fn demo`), so the two commands share one build.
    step("building the tests, with clippy's lints (-D warnings)");
    let mut build = cargo();
    build
        .current_dir(root())
        .args(["test", "--workspace", "--no-run"]);
    linted(&mut build);
    run(build, "building the tests (a lint fails it too)")?;
    deploy::check()?;
    // The tarball, packed from this build's binary, unpacked where no
    // checkout is and run.
    let packed = dist::pack(
        &target_dir().join("debug/hopper"),
        &target_dir().join("dist-check"),
    )?;
    dist::check(&packed, &dist().join("order_timeout.wasm"))?;
    let promtool = ensure_promtool()?;
    let broker = Broker::start(&nisshi)?;
    step(&format!(
        "running the tests against nisshi at {}",
        broker.address
    ));
    let mut tests = cargo();
    linted(&mut tests);
    tests
        .current_dir(root())
        .env("HOPPER_TEST_BROKERS", &broker.address)
        // The secured-cluster tests start brokers of their own.
        .env("HOPPER_NISSHI", &nisshi)
        .env("HOPPER_PROMTOOL", &promtool)
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(rest)
        .stdout(Stdio::piped());
    let result = run_counting(tests);
    drop(broker);
    eprintln!("==> finished in {:.0?}", started.elapsed());
    result
}

/// Runs a benchmark binary of the tests crate against a fresh broker.
fn bench(rest: &[String]) -> Result<()> {
    let (name, args) = rest
        .split_first()
        .context("usage: cargo xtask bench throughput [--mock | --tls] [--only NAMES] [--rounds N] [MESSAGES] | delay lateness|memory|cancel|cancel-memory|cancel-reach|cancel-bound [ARGS] | handler [--profile perf] [ROUNDS] [CALLS] [SWAPS] | handlers [CALLS] | http [--rounds N] [MESSAGES] | concurrency [--seconds S] [--service-ms MS] | parked [--only throughput,memory,loaded,kill] [--rounds N] [--messages N] [--keys K] [--park-seconds S] | dlq [--only cold,live] [--rounds N] [--records N]")?;
    // `--profile NAME` (first, before the benchmark's own arguments) builds
    // and runs the benchmark in that cargo profile, for example `perf`
    // (release-like, Cargo.toml) for the handler-call figures.
    let (profile, args) = match args {
        [flag, profile, rest @ ..] if flag == "--profile" => (Some(profile.as_str()), rest),
        _ => (None, args),
    };
    // The handler benchmarks call handlers in-process: no broker.
    let in_process = name == "handlers" || name == "handler";
    let nisshi = if in_process {
        None
    } else {
        Some(ensure_nisshi()?)
    };
    build_plugins()?;
    let mut build = cargo();
    build
        .current_dir(root())
        .args(["build", "-p", "hopper", "-p", "hopper-tests", "--bins"]);
    if let Some(profile) = profile {
        build.args(["--profile", profile]);
    }
    run(build, "building the benchmarks")?;
    let broker = nisshi.as_deref().map(Broker::start).transpose()?;
    let mut bench = cargo();
    bench.current_dir(root()).args([
        "run",
        "--quiet",
        "-p",
        "hopper-tests",
        "--bin",
        &format!("bench-{name}"),
    ]);
    if let Some(profile) = profile {
        bench.args(["--profile", profile]);
    }
    bench.arg("--");
    if let Some(broker) = &broker {
        bench
            .env("HOPPER_TEST_BROKERS", &broker.address)
            .env("HOPPER_BENCH_BROKER_PID", broker.child.id().to_string());
    }
    // `throughput --tls` starts a TLS broker of its own.
    if let Some(nisshi) = &nisshi {
        bench.env("HOPPER_NISSHI", nisshi);
    }
    // The one-line edits whose compile `handlers` times beside the first.
    if name == "handlers" {
        let edits = target_dir().join("bench-edits");
        polyglot::build_edits(&edits)?;
        bench.env("HOPPER_BENCH_EDITS", &edits);
    }
    bench.args(args);
    let result = run(bench, "the benchmark");
    drop(broker);
    result
}

/// Kills a running hopper with SIGKILL again and again during a run of
/// messages, against a fresh broker, and counts every message's fate
/// (`tests/src/crash_loop.rs`). `rest`: `--messages N --kills K --rate R`.
fn crash_loop(rest: &[String]) -> Result<()> {
    let nisshi = ensure_nisshi()?;
    build_rust_plugins(&["acting"])?;
    let mut build = cargo();
    build.current_dir(root()).args([
        "build",
        "-p",
        "hopper",
        "-p",
        "hopper-tests",
        "--bin",
        "hopper",
        "--bin",
        "crash-loop",
    ]);
    run(build, "building hopper and the crash loop")?;
    let broker = Broker::start(&nisshi)?;
    let mut crash = cargo();
    crash
        .current_dir(root())
        .env("HOPPER_TEST_BROKERS", &broker.address)
        .args([
            "run",
            "--quiet",
            "-p",
            "hopper-tests",
            "--bin",
            "crash-loop",
            "--",
        ])
        .args(rest);
    let result = run(crash, "the crash loop");
    drop(broker);
    result
}

/// Runs the test command, passing its output through, and closes with one
/// line that totals every `test result:` line.
fn run_counting(mut command: Command) -> Result<()> {
    use std::io::{BufRead, BufReader};
    let mut child = command.spawn().context("starting the tests")?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let (mut passed, mut failed) = (0u64, 0u64);
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| {
                rest.split(';')
                    .find_map(|part| {
                        part.trim()
                            .strip_suffix(word)?
                            .trim()
                            .rsplit(' ')
                            .next()?
                            .parse::<u64>()
                            .ok()
                    })
                    .unwrap_or(0)
            };
            passed += count("passed");
            failed += count("failed");
        }
    }
    let status = child.wait()?;
    println!("summary: {passed} passed, {failed} failed");
    if !status.success() {
        bail!("the tests failed ({status})");
    }
    Ok(())
}

fn broker() -> Result<()> {
    let nisshi = ensure_nisshi()?;
    let broker = Broker::start(&nisshi)?;
    println!("nisshi listening on {} (Ctrl-C to stop)", broker.address);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The nisshi binary: on PATH, in cargo's bin dir, or installed now. An
/// installed binary is always reused; building it takes 20-35 minutes.
fn ensure_nisshi() -> Result<PathBuf> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    let installed = cargo_home.join("bin/nisshi");
    if installed.is_file() {
        return Ok(installed);
    }
    if let Some(found) = which("nisshi") {
        return Ok(found);
    }
    step(&format!(
        "installing the test broker: cargo install nisshi@{NISSHI_VERSION} --locked (20-35 minutes on 2 cores; done once)"
    ));
    let mut install = cargo();
    install.args(["install", "nisshi", "--version", NISSHI_VERSION, "--locked"]);
    run(install, "cargo install nisshi")?;
    if installed.is_file() {
        Ok(installed)
    } else {
        bail!(
            "nisshi was installed but {} is missing",
            installed.display()
        )
    }
}

/// Debian's promtool, which checks the alert rules in docs/operations.md:
/// on PATH, or unpacked from the `prometheus` package into the target dir's
/// tools (not installed: the package would also start a Prometheus server).
fn ensure_promtool() -> Result<PathBuf> {
    if let Some(found) = which("promtool") {
        return Ok(found);
    }
    let dir = target_dir().join("tools/prometheus");
    let promtool = dir.join("usr/bin/promtool");
    if promtool.is_file() {
        return Ok(promtool);
    }
    step("unpacking promtool from Debian's prometheus package");
    let download = TempDir::new()?;
    let fetch = || {
        Command::new("apt-get")
            .args(["download", "prometheus"])
            .current_dir(&download.0)
            .status()
    };
    if !fetch().is_ok_and(|s| s.success()) {
        run(
            {
                let mut update = Command::new("apt-get");
                update.arg("update");
                update
            },
            "apt-get update",
        )?;
        if !fetch()?.success() {
            bail!("apt-get download prometheus failed");
        }
    }
    let deb = std::fs::read_dir(&download.0)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no .deb")?;
    let mut unpack = Command::new("dpkg-deb");
    unpack.arg("-x").arg(&deb).arg(&dir);
    run(unpack, "unpacking the prometheus package")?;
    if !promtool.is_file() {
        bail!("the prometheus package has no {}", promtool.display());
    }
    Ok(promtool)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A nisshi broker on 127.0.0.1 with in-memory storage, run from a clean
/// temp dir (it reads a `.env` from its working directory). Stopped on drop.
struct Broker {
    child: Child,
    address: String,
    _dir: TempDir,
}

impl Broker {
    fn start(nisshi: &Path) -> Result<Broker> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let address = format!("127.0.0.1:{port}");
        let dir = TempDir::new()?;
        let url = format!("tcp://{address}");
        step(&format!("starting nisshi on {address}"));
        let log = std::fs::File::create(dir.0.join("nisshi.log"))?;
        let child = Command::new(nisshi)
            .current_dir(&dir.0)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args([
                "--storage-engine",
                "memory://nisshi/",
                "--group-initial-rebalance-delay",
                "0s",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", nisshi.display()))?;
        let mut broker = Broker {
            child,
            address,
            _dir: dir,
        };
        let addr: SocketAddr = broker.address.parse()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = broker.child.try_wait()? {
                let log =
                    std::fs::read_to_string(broker._dir.0.join("nisshi.log")).unwrap_or_default();
                bail!("nisshi exited at startup ({status}):\n{log}");
            }
            if Instant::now() > deadline {
                bail!(
                    "nisshi did not accept connections on {} within 30s",
                    broker.address
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(broker)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let dir = std::env::temp_dir().join(format!(
            "hopper-nisshi-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
