//! Handler benchmark: the order-timeout handler in Rust, Python, JavaScript
//! and C, side by side in one process. For each, and for each compiler
//! (Cranelift, then Winch): the component's size, the first load (compile
//! and validate), and the time of one call in a fresh instance, p50 and
//! p99.
//!
//! ```text
//! bench-handlers [CALLS]    # default 1000 calls per handler
//! ```
//!
//! Each call takes the handler's common path: parse the JSON payload, read
//! its config values, ask a loopback order service to close the order (one
//! HTTP request through the route's pooled transport; the order is paid, so
//! the service answers 409 and there is nothing to emit), log one line and
//! return `ok`. Calls go round-robin across the handlers, so a noisy
//! neighbour slows all four alike. No broker is involved: this calls
//! `hopper::plugin` directly.

use hopper::plugin::{Compiler, Delivery, Runtime, Verdict};
use hopper_tests::{RouteTable, plugin, resolve_route};
use order_service::{Order, OrderService, Status};
use std::time::{Duration, Instant};

/// The allocator of the `hopper` binary, so both sides are measured alike.
#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

const HANDLERS: [(&str, &str); 4] = [
    ("Rust", "order_timeout"),
    ("Python", "order_timeout_py"),
    ("JavaScript", "order_timeout_js"),
    ("C", "order_timeout_c"),
];

/// Calls before measuring, so the first instance's page faults are not
/// counted.
const WARM_UP: usize = 20;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hopper::tune_allocator();
    let calls: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let orders = OrderService::start([Order::new("o-1", Status::Paid)]).await?;
    // The per-language figures are for a fresh instance per call.
    let route_for = |path: &std::path::Path| {
        resolve_route(
            RouteTable::new(path)
                .timeout("5s")
                .memory_mib(256)
                .instance("fresh")
                .allowed_hosts(&[orders.url()])
                .config("order-service", orders.url()),
        )
    };
    let delivery = Delivery {
        id: "bench-1".into(),
        topic: "bench.in".into(),
        partition: 0,
        offset: 0,
        key: Some(b"o-1".to_vec()),
        // The common path: parse, read config, one request, log, ok.
        payload: Some(br#"{"order_id":"o-1"}"#.to_vec()),
        headers: vec![("hopper-id".into(), b"bench-1".to_vec())],
        timestamp: Some(0),
        attempt: 1,
        route: "direct".into(),
    };

    println!("| handler | compiler | component | first load (compile) | call p50 | call p99 |");
    println!("|---|---|---|---|---|---|");
    // Each compiler's runtime in turn: Cranelift (production), then Winch
    // (`hopper dev`).
    for compiler in Compiler::ALL {
        let runtime = Runtime::with_compiler(256 << 20, compiler)?;
        let mut loaded = Vec::new();
        for (lang, stem) in HANDLERS {
            let path = plugin(stem);
            let size = std::fs::metadata(&path)?.len();
            let route = route_for(&path);
            let started = Instant::now();
            let handler = runtime.load(&path, &route)?;
            let load = started.elapsed();
            for _ in 0..WARM_UP {
                let verdict = handler.call(delivery.clone()).await;
                anyhow::ensure!(verdict == Verdict::Ok, "{lang}, {compiler}: {verdict:?}");
            }
            loaded.push((lang, size, load, handler, Vec::with_capacity(calls)));
        }
        for _ in 0..calls {
            for (_, _, _, handler, times) in &mut loaded {
                let started = Instant::now();
                let verdict = handler.call(delivery.clone()).await;
                times.push(started.elapsed());
                assert_eq!(verdict, Verdict::Ok);
            }
        }
        for (lang, size, load, _, mut times) in loaded {
            times.sort();
            let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
            println!(
                "| {lang} | {compiler} | {} | {:.2} s | {} | {} |",
                bytes(size),
                load.as_secs_f64(),
                micros(at(0.5)),
                micros(at(0.99)),
            );
        }
    }
    println!("({calls} calls per handler and compiler, fresh instance per call)");

    if let Some(edits) = std::env::var_os("HOPPER_BENCH_EDITS") {
        edit_to_serving(std::path::Path::new(&edits), &route_for)?;
    }
    Ok(())
}

/// Each handler, then its one-line edit (`xtask::polyglot::EDIT`; for
/// Rust, its v2), loaded by a runtime with the compiled-handler cache in a
/// fresh directory: the first load fills the compiled-function cache, and
/// the edit's compile reuses it. Beside it, the edit compiled as before,
/// whole, by a runtime without the cache.
fn edit_to_serving(
    edits: &std::path::Path,
    route_for: &dyn Fn(&std::path::Path) -> hopper::config::Route,
) -> anyhow::Result<()> {
    println!();
    println!(
        "| handler | first load, cold cache | edit, compiled whole (before) | edit, with the function cache | functions reused / compiled | cache on disk | edit, Winch (`hopper dev`) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (lang, stem) in HANDLERS {
        let first = plugin(stem);
        let edited = if lang == "Rust" {
            plugin("order_timeout_v2")
        } else {
            edits.join(format!("{stem}_edited.wasm"))
        };
        anyhow::ensure!(edited.is_file(), "{} is missing", edited.display());
        let whole = Runtime::new(256 << 20)?;
        let started = Instant::now();
        whole.load(&edited, &route_for(&edited))?;
        let before = started.elapsed();

        let dir = tempfile::tempdir()?;
        let cached = Runtime::new(256 << 20)?.with_cache(dir.path().join("cache"))?;
        let started = Instant::now();
        cached.load(&first, &route_for(&first))?;
        let cold = started.elapsed();
        let filled = cached.function_stats();
        let started = Instant::now();
        cached.load(&edited, &route_for(&edited))?;
        let edit = started.elapsed();
        let after = cached.function_stats();
        let winch = Runtime::with_compiler(256 << 20, Compiler::Winch)?;
        let started = Instant::now();
        winch.load(&edited, &route_for(&edited))?;
        let winched = started.elapsed();
        let on_disk: u64 = std::fs::read_dir(dir.path().join("cache"))?
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum();
        println!(
            "| {lang} | {:.2} s | {:.2} s | {:.3} s | {} / {} | {} | {:.3} s |",
            cold.as_secs_f64(),
            before.as_secs_f64(),
            edit.as_secs_f64(),
            after.hits - filled.hits,
            after.misses - filled.misses,
            bytes(on_disk),
            winched.as_secs_f64(),
        );
    }
    println!(
        "(one runtime each; \"edit\" is `Runtime::load` of the edited file: a hot reload adds its 50 ms quiet period)"
    );
    Ok(())
}

fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1 << 20) as f64)
    } else {
        format!("{} KiB", n / 1024)
    }
}

fn micros(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}
