//! The host's HTTP path: a route whose handler makes one HTTP request per
//! message, against a bare Rust hyper client making the same requests with
//! the same concurrency, side by side in one run.
//!
//! ```text
//! bench-http [--partitions P] [--service-ms MS] [--rounds ROUNDS] [--limits] [MESSAGES]
//! ```
//!
//! The loopback HTTP server (`hopper_tests::http_server`, keep-alive, one
//! worker thread) runs in a child process, so this process's CPU time is
//! the client side's alone, and it counts the TCP connections it accepts.
//!
//! On a machine with two CPUs or more, the server runs on one CPU and the
//! rows that make requests on another, as a client and a service on two
//! machines would. Left to the kernel, the client and the server sometimes
//! share one CPU, where answering a request costs a context switch instead
//! of a wake-up across CPUs, and that mode comes and goes by itself: one
//! bare client measured 11,000 to 40,000 requests a second within a run,
//! fastest after a pause, so whichever row ran first after one (the bare
//! client) came out ahead (BENCHMARKS.md, "The HTTP benchmark's CPUs").
//! The rows without a request (`denied`, `noop`) run on every CPU.
//!
//! - **hopper, `wasi:http`**: a route over a preloaded topic of P
//!   partitions (default 1) with the `fetch` fixture (GET, read the body,
//!   `ok` on 2xx) making its request through `wasi:http`, warm instances,
//!   `ordering = "partition"`: a partition handles one message at a time,
//!   so at most P requests are in flight, as for the bare client.
//!   (`bench-concurrency` measures many calls per partition.)
//! - **hopper, `fetch`**: the same, the request made through
//!   `hopper:handler/http.fetch` (`api = "fetch"`), one host call.
//! - **bare client**: hyper-util's pooled client, P tasks each making its
//!   share of the requests one after another, reading each body.
//! - **transport**: hopper's own HTTP client for a route
//!   (`hopper::egress::Transport`), driven like the bare client, without a
//!   handler: what the transport costs apart from WebAssembly.
//! - **denied**: the `fetch` route without `allowed_hosts`, its handler
//!   told to take the refusal as `ok`: what a request costs the handler
//!   and the host without any network I/O, through `wasi:http` and through
//!   `fetch`.
//! - **noop**: the same route with the no-op handler, for what Kafka and
//!   the handler call cost without the request.
//!
//! - with `--limits`, **hopper, limits that never bind**: the `fetch` route
//!   with `[route.http.hosts."ORIGIN"]` at `max_concurrent = 100000`,
//!   `rate = 1000000`, `burst = 100000`, run right after the `fetch` row
//!   without limits in each round: what holding requests to a host's
//!   limits costs when they never make one wait. After the rounds, the
//!   same route at a `rate` of a quarter of the median `fetch` row's
//!   msg/s, offered four times that load by its partition(s): the rate
//!   the service saw, against the rate configured.
//!
//! With `--service-ms`, the server answers each request after MS
//! milliseconds, like a service doing work, instead of at once.
//!
//! Each row gives msg/s, this process's CPU µs per message (and, in the
//! summary, the median of each round's ratio to the bare client's), its context
//! switches per message (by thread, with `BENCH_SWITCHES` set), and the
//! connections the server accepted per 10,000 messages. Rounds run the
//! contenders in the same order, with the bare client first and again
//! last; the round's bare figure is the mean of the two, so a drift during
//! the round moves it as it moves the rows between. The summary gives
//! medians, and the median of each round's ratio to the bare client in
//! that round.
//!
//! `BENCH_WINDOWS`, when set, prints each contender's timed window, for
//! `perf report --time` on a run recorded with `perf record -k
//! CLOCK_MONOTONIC`.

use hopper::Hopper;
use hopper_tests::bench_server::{
    Server, allowed_cpus, bare_gets, context_switches, cpu_seconds, pin_process, preload,
    transport, transport_gets, window_clock,
};
use hopper_tests::*;
use std::time::{Duration, Instant};

/// The allocator of the `hopper` binary, so both sides are measured alike.
#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

const TIME_LIMIT: Duration = Duration::from_secs(600);

fn main() {
    hopper::tune_allocator();
    if std::env::args().nth(1).as_deref() == Some("--serve") {
        hopper_tests::bench_server::serve();
        return;
    }
    let usage = || -> ! {
        eprintln!(
            "usage: bench-http [--partitions P] [--service-ms MS] [--rounds N] [--limits] [MESSAGES >= 1000]"
        );
        std::process::exit(2)
    };
    let (mut messages, mut rounds, mut partitions) = (20_000u64, 5usize, 1i32);
    let mut service_ms = 0u64;
    let mut limits = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--limits" => limits = true,
            "--rounds" => match args.next().map(|r| r.parse()) {
                Some(Ok(r)) if r >= 1 => rounds = r,
                _ => usage(),
            },
            "--service-ms" => match args.next().map(|m| m.parse()) {
                Some(Ok(m)) => service_ms = m,
                _ => usage(),
            },
            "--partitions" => match args.next().map(|p| p.parse()) {
                Some(Ok(p)) if (1..=64).contains(&p) => partitions = p,
                _ => usage(),
            },
            n => match n.parse() {
                Ok(n) if n >= 1_000 => messages = n,
                _ => usage(),
            },
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(messages, rounds, partitions, service_ms, limits));
}

/// One contender's figures in one round.
struct Figures {
    rate: f64,
    cpu_us: f64,
    /// This process's context switches per message.
    switches: f64,
    connections_per_10k: f64,
    /// The timed window on the boot clock, with `BENCH_WINDOWS`.
    window: Option<(String, String)>,
}

impl Figures {
    fn row(&self, what: &str) {
        println!(
            "{what}: {:.0} msg/s, cpu {:.1} µs/msg, {:.2} context switches/msg, {:.1} connections per 10,000 messages",
            self.rate, self.cpu_us, self.switches, self.connections_per_10k
        );
        if let Some((opened, closed)) = &self.window {
            println!("  window: {opened},{closed} s");
        }
    }
}

/// Counts a timed window: rate and CPU.
struct Meter {
    started: Instant,
    cpu: f64,
    switches: std::collections::BTreeMap<String, u64>,
    opened: Option<String>,
}

impl Figures {
    /// The mean of two runs of one contender.
    fn mean(&self, other: &Figures) -> Figures {
        Figures {
            rate: (self.rate + other.rate) / 2.0,
            cpu_us: (self.cpu_us + other.cpu_us) / 2.0,
            switches: (self.switches + other.switches) / 2.0,
            connections_per_10k: (self.connections_per_10k + other.connections_per_10k) / 2.0,
            window: None,
        }
    }
}

impl Meter {
    fn start() -> Meter {
        Meter {
            opened: window_clock(),
            started: Instant::now(),
            cpu: cpu_seconds(),
            switches: context_switches(),
        }
    }

    /// The window's figures for `n` messages, during which the server
    /// accepted `connections`.
    fn finish(self, n: u64, connections: u64) -> Figures {
        let elapsed = self.started.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - self.cpu;
        Figures {
            rate: n as f64 / elapsed,
            cpu_us: cpu * 1e6 / n as f64,
            switches: switches_per(&self.switches, n),
            connections_per_10k: connections as f64 * 10_000.0 / n as f64,
            window: self.opened.zip(window_clock()),
        }
    }
}

/// Context switches per message since `before`, in all; with
/// `BENCH_SWITCHES` set, printed by thread name too.
fn switches_per(before: &std::collections::BTreeMap<String, u64>, n: u64) -> f64 {
    let now = context_switches();
    let by_thread: Vec<(&String, f64)> = now
        .iter()
        .map(|(name, &count)| {
            let was = before.get(name).copied().unwrap_or(0);
            (name, count.saturating_sub(was) as f64 / n as f64)
        })
        .collect();
    if std::env::var_os("BENCH_SWITCHES").is_some() {
        let listed: Vec<String> = by_thread
            .iter()
            .filter(|&&(_, per)| per >= 0.005)
            .map(|(name, per)| format!("{name} {per:.2}"))
            .collect();
        println!("  context switches/msg by thread: {}", listed.join(", "));
    }
    by_thread.iter().map(|(_, per)| per).sum()
}

async fn run(messages: u64, rounds: usize, partitions: i32, service_ms: u64, limits: bool) {
    // The client side on one CPU and the server on another, as a service
    // on another machine would be (see the module docs).
    let all_cpus = allowed_cpus();
    let split = match all_cpus[..] {
        [client, server, ..] => Some((client, server)),
        _ => None,
    };
    let mut server = Server::start(service_ms, split.map(|(_, server)| server));
    println!(
        "HTTP path on the broker at {}: {messages} messages per contender, {partitions} partition(s), {rounds} rounds, server at {}",
        brokers(),
        server.url
    );
    match split {
        Some((client, server)) => {
            println!("the clients' rows run on CPU {client} only, the server on CPU {server} only")
        }
        None => println!("one CPU: the clients and the server share it"),
    }
    let clients_alone = || {
        if let Some((client, _)) = split {
            pin_process(&[client]);
        }
    };
    let every_cpu = || {
        if split.is_some() {
            pin_process(&all_cpus);
        }
    };
    let input = preload(
        "bench-http-in",
        messages,
        partitions,
        |i| (i % 1024).to_string(),
        "go",
    )
    .await;
    const BARE: &str = "bare hyper client, one request loop per partition";
    const HOPPER: &str = "hopper, fetch handler through wasi:http: one GET per message, warm";
    const FETCH: &str =
        "hopper, fetch handler through hopper:handler/http.fetch: one GET per message, warm";
    const NOOP: &str = "hopper, no-op handler (no request), warm";
    const TRANSPORT: &str = "hopper's transport alone, one request loop per partition";
    const DENIED: &str =
        "hopper, fetch handler, every request denied (no I/O), through wasi:http, warm";
    const DENIED_FETCH: &str =
        "hopper, fetch handler, every request denied (no I/O), through fetch, warm";
    const LIMITED: &str = "hopper, fetch handler, host limits that never bind";
    const UNBOUND: &str = "max_concurrent = 100000\nrate = 1000000\nburst = 100000\n";
    let (mut limited_ratios, mut limited_cpu) = (Vec::new(), Vec::new());
    let mut results: Vec<(&str, Vec<Figures>)> = vec![
        (BARE, vec![]),
        (TRANSPORT, vec![]),
        (HOPPER, vec![]),
        (FETCH, vec![]),
        (DENIED, vec![]),
        (DENIED_FETCH, vec![]),
        (NOOP, vec![]),
    ];
    for round in 1..=rounds {
        println!("-- round {round}");
        clients_alone();
        let bare_first = bare_client(&mut server, messages, partitions as u64).await;
        bare_first.row(&format!("{BARE}, first"));
        let transport = transport_alone(&mut server, messages, partitions as u64).await;
        transport.row(TRANSPORT);
        results[1].1.push(transport);
        let route = format!("[route.config]\nurl = \"{}\"\n", server.url);
        let hosts = format!("allowed_hosts = [\"{}\"]\n", server.origin);
        let fetch = hopper_route(
            &mut server,
            &input,
            "fetch",
            &format!("{hosts}{route}"),
            messages,
        )
        .await;
        fetch.row(HOPPER);
        if limits {
            let extra = format!("{hosts}{}{route}", host_limits(&server.origin, UNBOUND));
            let limited = hopper_route(&mut server, &input, "fetch", &extra, messages).await;
            limited.row(LIMITED);
            println!(
                "{LIMITED}: {:.3}x the fetch row without limits",
                limited.rate / fetch.rate
            );
            limited_ratios.push(limited.rate / fetch.rate);
            limited_cpu.push(limited.cpu_us - fetch.cpu_us);
        }
        results[2].1.push(fetch);
        let one_call = hopper_route(
            &mut server,
            &input,
            "fetch",
            &format!("{hosts}{route}api = \"fetch\"\n"),
            messages,
        )
        .await;
        one_call.row(FETCH);
        results[3].1.push(one_call);
        // The rows without a request use every CPU, as a route does.
        every_cpu();
        let refused = format!("{route}ok-on-error = \"true\"\n");
        let denied = hopper_route(&mut server, &input, "fetch", &refused, messages).await;
        denied.row(DENIED);
        results[4].1.push(denied);
        let refused = format!("{refused}api = \"fetch\"\n");
        let denied = hopper_route(&mut server, &input, "fetch", &refused, messages).await;
        denied.row(DENIED_FETCH);
        results[5].1.push(denied);
        let noop = hopper_route(&mut server, &input, "noop", "", messages).await;
        noop.row(NOOP);
        results[6].1.push(noop);
        clients_alone();
        let bare_last = bare_client(&mut server, messages, partitions as u64).await;
        bare_last.row(&format!("{BARE}, last"));
        // The round's bare figure is the mean of its first and last run:
        // a rate that drifts during the round moves both ends alike.
        let bare = bare_first.mean(&bare_last);
        println!(
            "{BARE}, mean of first and last: {:.0} msg/s, cpu {:.1} µs/msg",
            bare.rate, bare.cpu_us
        );
        results[0].1.push(bare);
        every_cpu();
    }
    println!("-- medians over {rounds} rounds");
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    if limits {
        println!(
            "{LIMITED}: {:.3}x the fetch row without limits (rounds {}); cpu {:+.1} µs/msg",
            median(limited_ratios.clone()),
            listed(&limited_ratios, 3),
            median(limited_cpu.clone()),
        );
        // Four times the load the rate allows: the route's partitions
        // offer what the fetch row handled, the rate lets a quarter in.
        clients_alone();
        let offered = median(results[2].1.iter().map(|f| f.rate).collect());
        let rate = (offered / 4.0).floor().max(1.0);
        let n = ((rate * 10.0) as u64).clamp(100, messages);
        let route = format!("[route.config]\nurl = \"{}\"\n", server.url);
        let hosts = format!("allowed_hosts = [\"{}\"]\n", server.origin);
        let limits = host_limits(&server.origin, &format!("rate = {rate}\n"));
        let extra = format!("{hosts}{limits}{route}");
        let held = hopper_route(&mut server, &input, "fetch", &extra, n).await;
        println!(
            "hopper, fetch handler, rate = {rate}/s offered {offered:.0} msg/s (4x): {:.1} msg/s over {n} messages, {:.3}x the rate",
            held.rate,
            held.rate / rate
        );
        every_cpu();
    }
    let bare = &results[0].1;
    for (name, all) in &results {
        // Each round's rate against the bare client's in the same round:
        // the machine's load moves both alike.
        let ratios: Vec<f64> = all.iter().zip(bare).map(|(f, b)| f.rate / b.rate).collect();
        let cpu_ratios: Vec<f64> = all
            .iter()
            .zip(bare)
            .map(|(f, b)| f.cpu_us / b.cpu_us)
            .collect();
        println!(
            "{name}: {:.0} msg/s, {:.2}x the bare client (rounds {}); cpu {:.1} µs/msg, {:.2}x the bare client's (rounds {}), {:.2} context switches/msg, {:.1} connections per 10,000 messages",
            median(all.iter().map(|f| f.rate).collect()),
            median(ratios.clone()),
            listed(&ratios, 2),
            median(all.iter().map(|f| f.cpu_us).collect()),
            median(cpu_ratios.clone()),
            listed(&cpu_ratios, 2),
            median(all.iter().map(|f| f.switches).collect()),
            median(all.iter().map(|f| f.connections_per_10k).collect()),
        );
    }
}

/// Each round's ratio, to `digits` decimals: `0.91x 0.85x 0.82x`.
fn listed(ratios: &[f64], digits: usize) -> String {
    ratios
        .iter()
        .map(|r| format!("{r:.digits$}x"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `[route.http.hosts."ORIGIN"]` with `limits` (TOML lines), after the
/// route's other keys: a sub-table of `[route.http]`.
fn host_limits(origin: &str, limits: &str) -> String {
    format!("[route.http.hosts.\"{origin}\"]\n{limits}")
}

/// The bare client ([`bare_gets`]): `loops` request loops sharing `n`
/// GETs, every one of which the server must count.
async fn bare_client(server: &mut Server, n: u64, loops: u64) -> Figures {
    let (connections, requests) = server.stats();
    let meter = Meter::start();
    bare_gets(&server.url, n, loops).await;
    let figures = meter.finish(n, 0);
    let (connections_after, requests_after) = server.stats();
    assert_eq!(requests_after - requests, n);
    Figures {
        connections_per_10k: (connections_after - connections) as f64 * 10_000.0 / n as f64,
        ..figures
    }
}

/// Like [`bare_client`], through a route's `Transport` instead of a plain
/// hyper-util client.
async fn transport_alone(server: &mut Server, n: u64, loops: u64) -> Figures {
    let transport = std::sync::Arc::new(transport(&server.origin));
    let uri: http::Uri = server.url.parse().unwrap();
    let (connections, requests) = server.stats();
    let meter = Meter::start();
    let tasks: Vec<_> = (0..loops)
        .map(|i| {
            let (transport, uri) = (transport.clone(), uri.clone());
            let share = n / loops + u64::from(i < n % loops);
            tokio::spawn(async move { transport_gets(&transport, &uri, share).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let figures = meter.finish(n, 0);
    let (connections_after, requests_after) = server.stats();
    assert_eq!(requests_after - requests, n);
    Figures {
        connections_per_10k: (connections_after - connections) as f64 * 10_000.0 / n as f64,
        ..figures
    }
}

/// Hopper with one route over `input`, timed from its first message
/// handled to its `n`th handled `ok`.
async fn hopper_route(
    server: &mut Server,
    input: &str,
    handler: &str,
    extra: &str,
    n: u64,
) -> Figures {
    let name = rand_name("bench");
    let config = TestConfig::new(&format!(
        "[[route]]\nname = \"{name}\"\ntopics = [\"{input}\"]\nhandler = \"{}\"\nretry = [\"1s\"]\nordering = \"partition\"\n{extra}\n",
        plugin(handler).display()
    ));
    let (connections, requests) = server.stats();
    let hopper = Hopper::start(config.config(), hopper_tests::options())
        .await
        .expect("hopper starts");
    let outcome = |outcome| {
        let series = hopper::metrics::series::HandlerOutcomes {
            route: &name,
            outcome,
        };
        hopper_tests::count(hopper.telemetry(), &series)
    };
    let deadline = Instant::now() + TIME_LIMIT;
    let wait_for = |target: u64| {
        assert!(Instant::now() < deadline, "route {name} is stuck");
        assert_eq!(outcome("retryable"), 0, "the handler's requests fail");
        outcome("ok") >= target
    };
    while !wait_for(1) {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let meter = Meter::start();
    // Polled more rarely as the window grows, at most a 200th of it late:
    // the poll's wake-ups and its reading of every counter are the
    // benchmark's work, not hopper's, and on the clients' one CPU every
    // 500 µs they took a share of the route's time that the bare client
    // never pays.
    let opened = Instant::now();
    while !wait_for(n) {
        let every =
            (opened.elapsed() / 200).clamp(Duration::from_micros(200), Duration::from_millis(5));
        tokio::time::sleep(every).await;
    }
    let figures = meter.finish(n, 0);
    hopper.stop().await;
    let (connections_after, requests_after) = server.stats();
    if extra.contains("allowed_hosts") {
        // One request per message; a route stopped before the end of its
        // input (the rate row) may have made the next one too.
        let made = requests_after - requests;
        assert!(
            (n..=n + 64).contains(&made),
            "one request per message: {made} for {n} messages"
        );
    }
    Figures {
        connections_per_10k: (connections_after - connections) as f64 * 10_000.0 / n as f64,
        ..figures
    }
}
