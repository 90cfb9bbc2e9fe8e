//! A handler call's instructions, for a profiler that counts them: N calls
//! (or N bare GETs) made one way, on a current-thread runtime, all inside
//! one function, [`measured`], so that `valgrind --tool=callgrind
//! --toggle-collect='*profile_call*measured*'` counts those and nothing of
//! the set-up. The GETs go to the benchmarks' loopback server, in a child
//! process.
//!
//! ```text
//! profile-call bare|transport|call|denied|fetch|fetch-denied|fresh N
//! ```
//!
//! - **bare**: hyper-util's pooled client, as `bench-http`'s bare client;
//! - **transport**: hopper's own client for a route, without a handler;
//! - **call**: the `fetch` fixture called warm through `hopper::plugin`,
//!   no broker, one GET per call through `wasi:http`;
//! - **denied**: the same without `allowed_hosts`, every request refused;
//! - **fetch**, **fetch-denied**: `call` and `denied` with the GET made
//!   through `hopper:handler/http.fetch`;
//! - **fresh**: the no-op fixture in a fresh instance per call.
//!
//! Prints the wall time and this process's CPU per call; asserts every
//! request answered (or every call `ok`).

use hopper::plugin::{Delivery, Runtime, Verdict};
use hopper_tests::bench_server::{Server, bare_gets, cpu_seconds, transport, transport_gets};
use hopper_tests::{RouteTable, plugin, resolve_route};
use std::future::Future;
use std::time::Instant;

/// The allocator of the `hopper` binary, so both sides are measured alike.
#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

/// Calls made before the counted ones: the connection, the instance, the
/// first page faults.
const WARM_UP: u64 = 50;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--serve") {
        hopper_tests::bench_server::serve();
        return;
    }
    hopper::tune_allocator();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, n) = match args.as_slice() {
        [mode, n] => (mode.clone(), n.parse::<u64>().expect("N is a number")),
        _ => {
            eprintln!("usage: profile-call bare|transport|call|denied|fetch|fetch-denied|fresh N");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = Server::start(0, None);
    let (started, cpu) = match mode.as_str() {
        "bare" => {
            runtime.block_on(bare_gets(&server.url, WARM_UP, 1));
            let at = (Instant::now(), cpu_seconds());
            measured(&runtime, bare_gets(&server.url, n, 1));
            at
        }
        "transport" => {
            let transport = transport(&server.origin);
            let uri: http::Uri = server.url.parse().unwrap();
            runtime.block_on(transport_gets(&transport, &uri, WARM_UP));
            let at = (Instant::now(), cpu_seconds());
            measured(&runtime, transport_gets(&transport, &uri, n));
            at
        }
        "call" | "denied" | "fetch" | "fetch-denied" | "fresh" => {
            let granted = mode == "call" || mode == "fetch";
            let (fixture, instance) = match mode.as_str() {
                "fresh" => ("noop", "fresh"),
                _ => ("fetch", "warm"),
            };
            let mut route = RouteTable::new(&plugin(fixture))
                .timeout("5s")
                .instance(instance)
                .config("url", &server.url)
                .config("ok-on-error", "true");
            if granted {
                route = route.allowed_hosts(&[&server.origin]);
            }
            if mode.starts_with("fetch") {
                route = route.config("api", "fetch");
            }
            let route = resolve_route(route);
            // The compiled artifact is cached, so a run under a profiler
            // does not compile the component under it.
            // One instance slot: a profiler's address space holds less
            // than the standalone pool reserves.
            let hopper = Runtime::sized(64 << 20, 1)
                .unwrap()
                .with_cache(hopper_tests::cache_dir())
                .unwrap();
            let handler = runtime.block_on(async { hopper.load(&plugin(fixture), &route) });
            let handler = handler.unwrap();
            let calls = |n: u64| {
                let handler = &handler;
                async move {
                    let message = delivery();
                    for _ in 0..n {
                        let verdict = handler.call(message.clone()).await;
                        assert_eq!(verdict, Verdict::Ok);
                    }
                }
            };
            runtime.block_on(calls(WARM_UP));
            let at = (Instant::now(), cpu_seconds());
            measured(&runtime, calls(n));
            at
        }
        other => {
            panic!("no mode {other:?}: bare, transport, call, denied, fetch, fetch-denied or fresh")
        }
    };
    let (elapsed, cpu) = (started.elapsed(), cpu_seconds() - cpu);
    println!(
        "{mode}: {n} calls, {:.1} µs each, cpu {:.1} µs each",
        elapsed.as_secs_f64() * 1e6 / n as f64,
        cpu * 1e6 / n as f64
    );
}

/// Runs `work` to its end: the counted part.
#[inline(never)]
fn measured(runtime: &tokio::runtime::Runtime, work: impl Future<Output = ()>) {
    runtime.block_on(work);
}

fn delivery() -> Delivery {
    Delivery {
        id: "profile".into(),
        topic: "direct.in".into(),
        partition: 0,
        offset: 0,
        key: None,
        payload: Some(b"x".to_vec()),
        headers: vec![("hopper-id".into(), b"profile".to_vec())],
        timestamp: Some(0),
        attempt: 1,
        route: "direct".into(),
    }
}
