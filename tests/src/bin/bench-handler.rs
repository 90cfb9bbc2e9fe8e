//! Handler call overhead, fresh against warm instances, and hot-reload
//! latency. Needs no broker.
//!
//! ```sh
//! cargo xtask bench handler [ROUNDS] [CALLS] [SWAPS]
//! ```
//!
//! Call overhead: `Handler::call` of a no-op (noop.wasm, which returns `ok`
//! and calls no import),
//! ROUNDS rounds of CALLS calls per policy, the two policies alternating
//! within each round so both see the same machine. Reload: SWAPS writes of
//! a new version (compiled: content never seen) and SWAPS writes of a
//! version seen before (its artifact is cached), each timed from just before
//! the write to the swap. Prints figures; asserts no timings.

use hopper::config::ConfigFile;
use hopper::events::{self, Event, Telemetry};
use hopper::plugin::HandlerSlot;
use hopper::plugin::{Delivery, Handler, Runtime, Verdict};
use hopper::reload::{Reloader, Target};
use hopper_tests::{plugin, sha256_hex, with_custom_section, write_atomically};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The allocator of the `hopper` binary, so both sides are measured alike.
#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

fn main() {
    hopper::tune_allocator();
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments are numbers"))
        .collect();
    let rounds = args.first().copied().unwrap_or(10);
    let calls = args.get(1).copied().unwrap_or(5_000);
    let swaps = args.get(2).copied().unwrap_or(20);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        call_overhead(rounds, calls).await;
        reload_latency(swaps).await;
    });
}

/// Routes `fresh` and `warm` around `handler`, resolved like any config.
fn routes(dir: &Path, handler: &Path) -> Vec<hopper::config::Route> {
    let text = format!(
        "[[route]]\nname = \"fresh\"\ntopics = [\"f\"]\nhandler = \"{0}\"\ninstance = \"fresh\"\n\n\
         [[route]]\nname = \"warm\"\ntopics = [\"w\"]\nhandler = \"{0}\"\ninstance = \"warm\"\n",
        handler.display()
    );
    ConfigFile::parse(&text)
        .unwrap()
        .resolve(dir)
        .unwrap()
        .routes
}

fn delivery() -> Delivery {
    Delivery {
        id: "bench".into(),
        topic: "f".into(),
        partition: 0,
        offset: 0,
        key: None,
        payload: Some(b"ok".to_vec()),
        headers: vec![("hopper-id".into(), b"bench".to_vec())],
        timestamp: Some(0),
        attempt: 1,
        route: "bench".into(),
    }
}

async fn timed_calls(handler: &Handler, calls: usize, out: &mut Vec<Duration>) {
    let message = delivery();
    for _ in 0..calls {
        let message = message.clone();
        let started = Instant::now();
        let verdict = handler.call(message).await;
        out.push(started.elapsed());
        assert_eq!(verdict, Verdict::Ok);
    }
}

async fn call_overhead(rounds: usize, calls: usize) {
    let dir = tempfile::tempdir().unwrap();
    let routes = routes(dir.path(), &plugin("noop"));
    let runtime = Runtime::new(64 << 20).unwrap();
    let fresh = runtime.load(&routes[0].handler, &routes[0]).unwrap();
    let warm = runtime.load(&routes[1].handler, &routes[1]).unwrap();
    let (mut f, mut w) = (Vec::new(), Vec::new());
    // Warm-up: page in the code, fill the pooling allocator's slots.
    timed_calls(&fresh, 500, &mut Vec::new()).await;
    timed_calls(&warm, 500, &mut Vec::new()).await;
    for round in 0..rounds {
        if round % 2 == 0 {
            timed_calls(&fresh, calls, &mut f).await;
            timed_calls(&warm, calls, &mut w).await;
        } else {
            timed_calls(&warm, calls, &mut w).await;
            timed_calls(&fresh, calls, &mut f).await;
        }
    }
    println!("Handler call overhead, no-op call, {rounds} rounds x {calls} calls per policy:");
    println!("| policy | calls | p50 | p99 | mean |");
    println!("|---|---|---|---|---|");
    for (name, samples) in [("fresh", &mut f), ("warm", &mut w)] {
        let (p50, p99, _, mean) = summary(samples);
        println!(
            "| {name} | {} | {} | {} | {} |",
            samples.len(),
            micros(p50),
            micros(p99),
            micros(mean)
        );
    }
    println!();
}

async fn reload_latency(swaps: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("handler.wasm");
    let v1 = std::fs::read(plugin("scripted")).unwrap();
    std::fs::write(&path, &v1).unwrap();
    let route = Arc::new(routes(dir.path(), &path).remove(1));
    let runtime = Runtime::new(64 << 20)
        .unwrap()
        .with_cache(dir.path().join("cache"))
        .unwrap();
    let slot = Arc::new(HandlerSlot::new(runtime.load(&path, &route).unwrap()));
    let telemetry = Telemetry::new();
    let mut events = telemetry.subscribe();
    let targets = vec![Target {
        route,
        slot: slot.clone(),
    }];
    let reloader = Reloader::start(runtime, targets, telemetry).unwrap();
    // Let the start-up check of the file settle.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut seen = Vec::new();
    let mut compiled = Vec::new();
    let mut cached = Vec::new();
    for i in 0..swaps * 2 {
        // First SWAPS new versions, then back through ones seen before.
        let bytes = if i < swaps {
            let version = with_custom_section(&v1, "bench", &i.to_le_bytes());
            seen.push(version.clone());
            version
        } else {
            seen[i % 2].clone()
        };
        let want = sha256_hex(&bytes);
        if slot.current().version() == want {
            continue;
        }
        let started = Instant::now();
        write_atomically(&path, &bytes);
        let hit = loop {
            let event = tokio::time::timeout(Duration::from_secs(30), events.recv())
                .await
                .expect("reloaded within 30s")
                .unwrap();
            match event {
                Event::HandlerReloaded(events::HandlerReloaded {
                    new_version,
                    cached,
                    ..
                }) if new_version == want => break cached,
                Event::HandlerReloadFailed(events::HandlerReloadFailed { error, .. }) => {
                    panic!("{error}")
                }
                _ => {}
            }
        };
        let took = started.elapsed();
        assert_eq!(slot.current().version(), want);
        if hit { &mut cached } else { &mut compiled }.push(took);
    }
    drop(reloader);
    println!(
        "Hot reload, file write to new version serving (debounce {:?}):",
        hopper::reload::DEBOUNCE
    );
    println!("| version | swaps | p50 | max |");
    println!("|---|---|---|---|");
    for (name, samples) in [
        ("new (compiled)", &mut compiled),
        ("seen before (cached artifact)", &mut cached),
    ] {
        let (p50, _, max, _) = summary(samples);
        println!(
            "| {name} | {} | {:.0} ms | {:.0} ms |",
            samples.len(),
            p50.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3
        );
    }
}

/// p50, p99, max and mean of `samples`.
fn summary(samples: &mut [Duration]) -> (Duration, Duration, Duration, Duration) {
    if samples.is_empty() {
        return Default::default();
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    (at(0.5), at(0.99), samples[samples.len() - 1], mean)
}

/// Two decimals: a warm call is under a microsecond.
fn micros(d: Duration) -> String {
    format!("{:.2} µs", d.as_secs_f64() * 1e6)
}
