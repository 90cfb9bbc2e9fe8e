//! Handler benchmark: the order-timeout handler in Rust, Python, JavaScript
//! and C, side by side in one process. For each: the component's size, the
//! first load (compile and validate), and the time of one call in a fresh
//! instance (the host's only policy), p50 and p99.
//!
//! ```text
//! bench-handlers [CALLS]    # default 1000 calls per handler
//! ```
//!
//! Calls go round-robin across the handlers, so a noisy neighbour slows all
//! four alike. No broker is involved: this calls `hopper::plugin` directly.

use hopper::config::{Route, TrapPolicy};
use hopper::plugin::{Delivery, Runtime, Verdict};
use hopper_tests::plugin;
use std::collections::BTreeMap;
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
    let route = Route {
        name: "bench".into(),
        topics: vec!["bench.in".into()],
        handler: "unused".into(),
        retry_ladder: vec![Duration::from_secs(1)],
        max_attempts: 3,
        dlq: "bench.dlq".into(),
        group: "bench".into(),
        retry_topic_prefix: "bench.retry".into(),
        on_trap: TrapPolicy::DeadLetter,
        timeout: Duration::from_secs(5),
        memory_bytes: 256 << 20,
        // The per-language figures are for a fresh instance per call.
        instance: hopper::config::InstancePolicy::Fresh,
        config: BTreeMap::from([("order-service".into(), "orders-api".into())]),
        grants: Default::default(),
    };
    let runtime = Runtime::new(route.memory_bytes)?;
    let delivery = Delivery {
        id: "bench-1".into(),
        topic: "bench.in".into(),
        partition: 0,
        offset: 0,
        key: Some(b"o-1".to_vec()),
        // The common path: parse, read config, log, ok.
        payload: Some(br#"{"order_id":"o-1","status":"pending"}"#.to_vec()),
        headers: vec![("hopper-id".into(), b"bench-1".to_vec())],
        timestamp: Some(0),
        attempt: 1,
        route: "bench".into(),
    };

    let mut loaded = Vec::new();
    for (lang, stem) in HANDLERS {
        let path = plugin(stem);
        let size = std::fs::metadata(&path)?.len();
        let started = Instant::now();
        let handler = runtime.load(&path, &route)?;
        let load = started.elapsed();
        for _ in 0..WARM_UP {
            let verdict = handler.call(delivery.clone()).await;
            anyhow::ensure!(verdict == Verdict::Ok, "{lang}: {verdict:?}");
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

    println!("| handler | component | first load (compile) | call p50 | call p99 |");
    println!("|---|---|---|---|---|");
    for (lang, size, load, _, mut times) in loaded {
        times.sort();
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
        println!(
            "| {lang} | {} | {:.2} s | {} | {} |",
            bytes(size),
            load.as_secs_f64(),
            micros(at(0.5)),
            micros(at(0.99)),
        );
    }
    println!("({calls} calls per handler, fresh instance per call)");
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
