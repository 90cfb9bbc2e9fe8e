//! Many calls in flight per partition: a route whose handler makes one HTTP
//! call to a loopback server answering after 20 ms, on a 3-partition input,
//! under each `ordering` at `max_in_flight` 16, 64 and 256, in one run; then
//! a CPU-bound handler (no I/O) under each ordering, for what concurrency
//! costs when it cannot help.
//!
//! ```text
//! bench-concurrency [--seconds S] [--service-ms MS]
//! ```
//!
//! The server runs in a child process (`hopper_tests::bench_server`), so
//! this process's CPU time is hopper's alone. Each row gives msg/s, the
//! bound `partitions × max_in_flight / latency`, the rate as a share of it,
//! and CPU µs per message. Each configuration reads a fresh topic preloaded
//! with about S seconds' worth of messages at its bound (1,000 to 30,000),
//! keyed over 10,000 keys. After each, a bare hyper client makes as many
//! GETs with as many in flight (`partitions × max_in_flight` loops): what
//! the server itself allows, since its 20 ms is a timer's, which never
//! fires early. The row gives hopper's rate against it.

use hopper::Hopper;
use hopper_tests::bench_server::{Server, bare_gets, cpu_seconds, preload};
use hopper_tests::*;
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

const PARTITIONS: i32 = 3;
const KEYS: u64 = 10_000;
const TIME_LIMIT: Duration = Duration::from_secs(600);
/// Rounds of the `scripted` fixture's `work` command per message: a CPU-only
/// call of a few hundred microseconds.
const CPU_WORK: u64 = 200_000;

fn main() {
    hopper::tune_allocator();
    if std::env::args().nth(1).as_deref() == Some("--serve") {
        hopper_tests::bench_server::serve();
        return;
    }
    let usage = || -> ! {
        eprintln!("usage: bench-concurrency [--seconds S] [--service-ms MS]");
        std::process::exit(2)
    };
    let (mut seconds, mut service_ms) = (6u64, 20u64);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.parse::<u64>().ok());
        match (arg.as_str(), value) {
            ("--seconds", Some(s)) if (1..=120).contains(&s) => seconds = s,
            ("--service-ms", Some(ms)) if (1..=1000).contains(&ms) => service_ms = ms,
            _ => usage(),
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(seconds, service_ms));
}

async fn run(seconds: u64, service_ms: u64) {
    let mut server = Server::start(service_ms, None);
    println!(
        "ordering × max_in_flight, on the broker at {}: {PARTITIONS} partitions, {KEYS} keys, one GET per message answered after {service_ms} ms",
        brokers()
    );
    let mut partition_rate = 0.0;
    let mut rows = Vec::new();
    for (ordering, max_in_flight) in [
        ("partition", 1),
        ("key", 16),
        ("key", 64),
        ("key", 256),
        ("unordered", 16),
        ("unordered", 64),
        ("unordered", 256),
    ] {
        let bound = PARTITIONS as f64 * max_in_flight as f64 * 1000.0 / service_ms as f64;
        let n = ((bound * seconds as f64) as u64).clamp(1_000, 30_000);
        let input = preload("bench-conc-in", n, PARTITIONS, key_of, "go").await;
        let hosts = format!(
            "allowed_hosts = [\"{}\"]\n[route.config]\nurl = \"{}\"\n",
            server.origin, server.url
        );
        let (rate, cpu_us) = measure(
            &mut server,
            &input,
            "fetch",
            ordering,
            max_in_flight,
            &hosts,
            n,
        )
        .await;
        if ordering == "partition" {
            partition_rate = rate;
        }
        let bare = bare_client(&server, n, PARTITIONS as u64 * max_in_flight as u64).await;
        let row = format!(
            "io  {ordering:<9} max_in_flight {max_in_flight:>3}: {rate:>7.0} msg/s, bound {bound:>6.0} ({:>5.1}%), {:>5.1}× partition, cpu {cpu_us:.0} µs/msg ({n} messages); bare client {bare:>7.0} msg/s ({:>5.1}% of the bound, hopper {:.2}×)",
            100.0 * rate / bound,
            rate / partition_rate,
            100.0 * bare / bound,
            rate / bare,
        );
        println!("{row}");
        rows.push(row);
    }
    let payload = format!("work:{CPU_WORK}");
    for ordering in ["partition", "key", "unordered"] {
        let max_in_flight = if ordering == "partition" { 1 } else { 64 };
        let n = 3_000;
        let input = preload("bench-conc-in", n, PARTITIONS, key_of, &payload).await;
        let (rate, cpu_us) = measure(
            &mut server,
            &input,
            "scripted",
            ordering,
            max_in_flight,
            "",
            n,
        )
        .await;
        let row = format!(
            "cpu {ordering:<9} max_in_flight {max_in_flight:>3}: {rate:>7.0} msg/s, cpu {cpu_us:.0} µs/msg ({n} messages of work:{CPU_WORK})"
        );
        println!("{row}");
        rows.push(row);
    }
    println!("-- summary");
    for row in rows {
        println!("{row}");
    }
}

/// What the server allows at `loops` requests in flight: requests a
/// second of a bare hyper client making `n` GETs.
async fn bare_client(server: &Server, n: u64, loops: u64) -> f64 {
    let started = Instant::now();
    bare_gets(&server.url, n, loops).await;
    n as f64 / started.elapsed().as_secs_f64()
}

/// The key of the i-th message: over `KEYS` keys.
fn key_of(i: u64) -> String {
    format!("k{}", i % KEYS)
}

/// Runs a route over `input` until its `n` messages are handled `ok`;
/// returns msg/s and CPU µs per message from the first `ok` on.
async fn measure(
    server: &mut Server,
    input: &str,
    handler: &str,
    ordering: &str,
    max_in_flight: usize,
    extra: &str,
    n: u64,
) -> (f64, f64) {
    let name = rand_name("bench");
    let instances = (PARTITIONS as usize * max_in_flight).min(1000);
    let config = TestConfig::new(&format!(
        "[limits]\ninstance_memory_mib = 16384\n\n[[route]]\nname = \"{name}\"\ntopics = [\"{input}\"]\nhandler = \"{}\"\nretry = [\"1s\"]\ntimeout = \"30s\"\nordering = \"{ordering}\"\nmax_in_flight = {max_in_flight}\nmax_instances = {instances}\nmemory_mib = 16\n{extra}\n",
        plugin(handler).display()
    ));
    let (_, requests) = server.stats();
    let hopper = Hopper::start(config.config(), hopper_tests::options())
        .await
        .expect("hopper starts");
    let ok = hopper::metrics::series::HandlerOutcomes {
        route: &name,
        outcome: "ok",
    };
    let deadline = Instant::now() + TIME_LIMIT;
    let handled = |hopper: &Hopper| {
        assert!(Instant::now() < deadline, "route {name} is stuck");
        hopper_tests::count(hopper.telemetry(), &ok)
    };
    while handled(&hopper) < 1 {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let first = handled(&hopper);
    while handled(&hopper) < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    hopper.stop().await;
    let (_, requests_after) = server.stats();
    if !extra.is_empty() {
        assert_eq!(requests_after - requests, n, "one request per message");
    }
    let measured = (n - first) as f64;
    (measured / elapsed, cpu * 1e6 / measured)
}
