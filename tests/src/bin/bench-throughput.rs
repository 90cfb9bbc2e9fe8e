//! Throughput: hopper against a bare Kafka relay, side by side in one run.
//!
//! ```text
//! bench-throughput [--mock | --tls] [--only NAME[,NAME...]] [--rounds ROUNDS] [MESSAGES]
//! ```
//!
//! On the broker in `HOPPER_TEST_BROKERS` (see `cargo xtask bench`); with
//! `--mock` on librdkafka's in-process mock cluster, so that a broker in
//! another process is out of the picture; with `--tls` on a Nisshi of its
//! own that serves only TLS (in-memory storage, like the plaintext broker),
//! every client of both sides verifying it against a test CA. `--only` runs some contenders:
//! `bare`, `noop`, `metrics`, `fresh`, `json`, `sized`, `hop`, `storm`,
//! `traced`. `traced` is the `noop` route with `[tracing]` exporting 10% and
//! 100% of traces to a loopback OTLP sink (it answers 200 and keeps
//! nothing), beside `noop` (tracing off) in the same run.
//! `noop` runs without an admin server, so with metrics off; `metrics` is the
//! same route with `[admin]` (metrics on: call timing, the consumed counter,
//! the lag sampler) and `/metrics` scraped every second while it runs.
//!
//! Every contender reads a preloaded 2-partition topic with a consumer group
//! of its own, from the beginning, and is timed from its first message read
//! to its last one done: handled `ok`, or its produce acknowledged. The bare
//! relay's producer has its producer id and the output topic's metadata
//! before it reads (a new producer's first acknowledgement waits for both,
//! up to a second on this broker); hopper's producer gets them while its
//! consumer joins the group. The contenders run in ROUNDS rounds (default 5)
//! in the same order; the summary gives each one's median, and ratios of
//! medians. The meter looks at the counters from the thread `main` blocks
//! on, sleeping it between looks: a task's timer fired late while the
//! routes kept every worker busy.
//!
//! `storm`: route A (no-op) alone, then beside route B, whose handler fails
//! every message `retryable` (retry tier 1 s, 1,000 attempts), each in a
//! hopper of its own in this process: B starts first, with four times A's
//! messages, and A once B has failed as many as A has, so A's window meets
//! the storm under way; then the same with B's `[route.breaker]` at its
//! defaults, A starting once B has failed each of its messages once and its
//! breaker is open.
//!
//! `BENCH_ROUTE_EXTRA`, when set, goes inside every measured route's table
//! (`BENCH_ROUTE_EXTRA='ordering = "partition"'`, say).
//!
//! `BENCH_WINDOWS`, when set, prints each contender's timed window, for
//! `perf report --time` on a run recorded with `perf record -k
//! CLOCK_MONOTONIC` (BENCHMARKS.md, "Profiling one contender").
//!
//! Besides the rate, each row gives the CPU time per message of this process
//! (the relay or hopper, with librdkafka's threads) and, when
//! `HOPPER_BENCH_BROKER_PID` names the broker's process, of the broker.

use hopper::Hopper;
use hopper::embedded::EmbeddedBroker;
use hopper::metrics::series::{self, Series};
use hopper_tests::*;
use order_service::{Order, OrderService, Status};
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The allocator of the `hopper` binary, so both sides are measured alike.
#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

/// Partitions of every topic in the benchmark.
const PARTITIONS: i32 = 2;
/// No contender may take longer than this.
const TIME_LIMIT: Duration = Duration::from_secs(600);

const CONTENDERS: [&str; 9] = [
    "bare", "noop", "metrics", "fresh", "json", "sized", "hop", "storm", "traced",
];
/// The admin server of the `metrics` contender, appended after its route.
const METRICS_ON: &str = "\n[admin]\nlisten = \"127.0.0.1:0\"\n";

#[tokio::main]
async fn main() {
    hopper::tune_allocator();
    let usage = || -> ! {
        eprintln!(
            "usage: bench-throughput [--mock | --tls] [--only {}] [--rounds N] [MESSAGES >= 1000]",
            CONTENDERS.join(",")
        );
        std::process::exit(2)
    };
    let mut args = std::env::args().skip(1);
    let (mut mock, mut tls, mut only, mut messages, mut rounds) =
        (false, false, None::<Vec<String>>, 200_000u64, 5usize);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--mock" => mock = true,
            "--tls" => tls = true,
            "--rounds" => match args.next().map(|r| r.parse()) {
                Some(Ok(r)) if r >= 1 => rounds = r,
                _ => usage(),
            },
            "--only" => {
                let names: Vec<String> = args
                    .next()
                    .unwrap_or_else(|| usage())
                    .split(',')
                    .map(str::to_string)
                    .collect();
                if names.iter().any(|n| !CONTENDERS.contains(&n.as_str())) {
                    usage();
                }
                only = Some(names);
            }
            n => match n.parse() {
                Ok(n) if n >= 1_000 => messages = n,
                _ => usage(),
            },
        }
    }
    if mock && tls {
        usage();
    }
    let bench = Bench::new(mock, tls, only);
    println!(
        "throughput on {}: {messages} messages per contender, {PARTITIONS} partitions, {rounds} rounds",
        bench.label()
    );
    bench.relay_vs_hopper(messages, rounds).await;
    if bench.runs("storm") {
        bench.storm(messages, rounds).await;
    }
}

/// Where the benchmark runs, and how to read CPU time.
struct Bench {
    /// The in-process mock cluster, with `--mock`.
    mock: Option<EmbeddedBroker>,
    /// The TLS broker, with `--tls`.
    tls: Option<hopper_tests::secured::TlsBroker>,
    broker_pid: Option<String>,
    only: Option<Vec<String>>,
}

/// One contender's figures.
struct Figures {
    rate: f64,
    /// CPU µs per message in this process.
    own_us: f64,
    /// CPU µs per message in the broker's process.
    broker_us: Option<f64>,
}

impl Figures {
    fn row(&self, what: &str, base: Option<&Figures>) {
        let ratio = base
            .map(|b| format!(" = {:.2}x", self.rate / b.rate))
            .unwrap_or_default();
        let broker = self
            .broker_us
            .map(|b| format!(", broker {b:.1} µs/msg"))
            .unwrap_or_default();
        println!(
            "{what}: {:.0} msg/s{ratio} (cpu: this process {:.1} µs/msg{broker})",
            self.rate, self.own_us
        );
    }
}

/// CPU seconds used so far by process `pid` (user + system).
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may
    // hold spaces, start with the state (field 3); utime and stime are
    // fields 14 and 15, in clock ticks of 1/100 s.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Rate and CPU over a timed window.
struct Meter {
    started: Instant,
    own: f64,
    broker: Option<f64>,
    broker_pid: Option<String>,
}

impl Meter {
    fn start(bench: &Bench) -> Meter {
        Meter {
            started: Instant::now(),
            own: cpu_seconds("self").unwrap_or(0.0),
            broker: bench.broker_pid.as_deref().and_then(cpu_seconds),
            broker_pid: bench.broker_pid.clone(),
        }
    }

    fn finish(self, messages: u64) -> Figures {
        let n = messages as f64;
        let own = cpu_seconds("self").unwrap_or(0.0) - self.own;
        let broker = match (
            self.broker,
            self.broker_pid.as_deref().and_then(cpu_seconds),
        ) {
            (Some(before), Some(after)) => Some((after - before) * 1e6 / n),
            _ => None,
        };
        Figures {
            rate: n / self.started.elapsed().as_secs_f64(),
            own_us: own * 1e6 / n,
            broker_us: broker,
        }
    }
}

impl Bench {
    fn new(mock: bool, tls: bool, only: Option<Vec<String>>) -> Bench {
        if tls {
            let broker = hopper_tests::secured::TlsBroker::start();
            hopper_tests::set_client_properties(broker.client_properties());
            // SAFETY: set before any other thread reads the environment; the
            // harness reads it once, on first use.
            unsafe { std::env::set_var("HOPPER_TEST_BROKERS", &broker.address) };
            return Bench {
                mock: None,
                broker_pid: Some(broker.broker.pid().to_string()),
                tls: Some(broker),
                only,
            };
        }
        if !mock {
            return Bench {
                mock: None,
                tls: None,
                broker_pid: std::env::var("HOPPER_BENCH_BROKER_PID").ok(),
                only,
            };
        }
        let broker = EmbeddedBroker::start().expect("the mock cluster starts");
        // SAFETY: set before any other thread reads the environment; the
        // harness reads it once, on first use.
        unsafe { std::env::set_var("HOPPER_TEST_BROKERS", broker.bootstrap_servers()) };
        Bench {
            mock: Some(broker),
            tls: None,
            broker_pid: None,
            only,
        }
    }

    fn runs(&self, contender: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == contender))
    }

    fn label(&self) -> String {
        match &self.mock {
            Some(m) => format!(
                "librdkafka's mock cluster, in this process, at {}",
                m.bootstrap_servers()
            ),
            None if self.tls.is_some() => format!("the TLS-only broker at {}", brokers()),
            None => format!("the broker at {}", brokers()),
        }
    }

    async fn create(&self, topics: &[&str]) {
        match &self.mock {
            Some(mock) => {
                for topic in topics {
                    // A route's input topics exist already.
                    if let Err(e) = mock.create_topics([&topic.to_string()], PARTITIONS)
                        && !e.to_string().contains("TopicAlreadyExists")
                    {
                        panic!("{e}");
                    }
                }
            }
            None => create_topics(topics).await,
        }
    }

    /// Fills a new topic with `n` copies of `payload`, keys spread over 1024.
    async fn preload(&self, n: u64, payload: &str) -> String {
        let topic = rand_name("bench-in");
        self.create(&[&topic]).await;
        hopper_tests::bench_server::fill(&topic, n, |i| (i % 1024).to_string(), payload).await;
        topic
    }

    /// The physical limit: consume, produce with hopper's guarantees
    /// (idempotent, acks=all), store the offset when the produce is
    /// acknowledged. `headers` go on every produced record.
    async fn bare_relay(&self, input: &str, n: u64, headers: Option<&OwnedHeaders>) -> Figures {
        let output = rand_name("bench-out");
        self.create(&[&output]).await;
        let consumer: StreamConsumer = client_config()
            .set("group.id", rand_name("bare"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.offset.store", "false")
            .set("fetch.wait.max.ms", "20")
            .create()
            .unwrap();
        consumer.subscribe(&[input]).unwrap();
        let producer: FutureProducer = client_config()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .create()
            .unwrap();
        // The producer id and the topic's metadata, before the clock runs.
        producer
            .send(
                FutureRecord::<str, str>::to(&output).payload("warm-up"),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("the bare relay's producer warms up");
        let consumer = Arc::new(consumer);
        let (read, done) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let relay = {
            let (consumer, read, done, headers) = (
                consumer.clone(),
                read.clone(),
                done.clone(),
                headers.cloned(),
            );
            // The task ends when every message is read; acknowledgements
            // come later, and the producer outside it keeps them coming.
            let producer = producer.clone();
            tokio::spawn(async move {
                for _ in 0..n {
                    let m = consumer.recv().await.unwrap();
                    read.fetch_add(1, Ordering::Relaxed);
                    let mut record =
                        FutureRecord::to(&output).payload(m.payload().unwrap_or_default());
                    if let Some(k) = m.key() {
                        record = record.key(k);
                    }
                    if let Some(h) = &headers {
                        record = record.headers(h.clone());
                    }
                    let ack = loop {
                        match producer.send_result(record) {
                            Ok(ack) => break ack,
                            Err((_, r)) => {
                                record = r;
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                        }
                    };
                    let (topic, partition, offset) =
                        (m.topic().to_string(), m.partition(), m.offset());
                    let (consumer, done) = (consumer.clone(), done.clone());
                    tokio::spawn(async move {
                        ack.await.unwrap().map_err(|(e, _)| e).unwrap();
                        let mut tpl = TopicPartitionList::new();
                        tpl.add_partition_offset(&topic, partition, Offset::Offset(offset + 1))
                            .unwrap();
                        let _ = consumer.store_offsets(&tpl);
                        done.fetch_add(1, Ordering::Relaxed);
                    });
                }
            })
        };
        let figures = self
            .time(
                n,
                "the bare relay",
                || read.load(Ordering::Relaxed),
                || done.load(Ordering::Relaxed),
            )
            .await;
        relay.await.unwrap();
        drop(producer);
        figures
    }

    /// Times from the first message `begun()` counts to the `n`th that
    /// `done()` counts.
    async fn time(
        &self,
        n: u64,
        who: &str,
        begun: impl Fn() -> u64,
        done: impl Fn() -> u64,
    ) -> Figures {
        let deadline = Instant::now() + TIME_LIMIT;
        let wait_for = |target: u64, count: &dyn Fn() -> u64| {
            let now = count();
            assert!(
                Instant::now() < deadline,
                "{who} is stuck at {now} of {target} messages"
            );
            now >= target
        };
        // The looks sleep this thread, not this task: a task's timer fires
        // only when a worker gets round to it, and with every worker busy
        // with the routes it fired late enough to open a window after a
        // fast route had handled nearly every message. This thread is the
        // one `main` blocks on, never a worker, so sleeping it holds up no
        // task.
        while !wait_for(1, &begun) {
            std::thread::sleep(Duration::from_micros(200));
        }
        let opened = hopper_tests::bench_server::window_clock();
        let meter = Meter::start(self);
        let mut first_done = None;
        while !wait_for(n, &done) {
            if first_done.is_none() && done() > 0 {
                first_done = Some(meter.started.elapsed());
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        if let (Some(opened), Some(closed)) = (opened, hopper_tests::bench_server::window_clock()) {
            println!(
                "  window of {who}: {opened},{closed} s; first done after {:.1} ms",
                first_done.unwrap_or_default().as_secs_f64() * 1e3
            );
        }
        meter.finish(n)
    }

    /// Starts hopper with `routes` (TOML route tables), creating its topics
    /// first on the mock cluster.
    async fn start(&self, routes: &str) -> Hopper {
        let config = TestConfig::new(routes);
        let config = config.config();
        if self.mock.is_some() {
            let topics = config.all_topics();
            let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
            self.create(&topics).await;
        }
        Hopper::start(config, hopper_tests::options())
            .await
            .expect("hopper starts")
    }

    /// Hopper with one route over `input`.
    async fn hopper_route(&self, input: &str, handler: &str, extra: &str, n: u64) -> Figures {
        self.hopper_named_route(input, handler, extra, n).await.0
    }

    /// The same, also returning the route's name.
    async fn hopper_named_route(
        &self,
        input: &str,
        handler: &str,
        extra: &str,
        n: u64,
    ) -> (Figures, String) {
        let name = rand_name("bench");
        let hopper = self
            .start(&format!(
                "[[route]]\nname = \"{name}\"\ntopics = [\"{input}\"]\nhandler = \"{}\"\nretry = [\"1s\"]\n{}\n{extra}\n",
                plugin(handler).display(),
                std::env::var("BENCH_ROUTE_EXTRA").unwrap_or_default()
            ))
            .await;
        // With an admin server, scrape it every second, as a hurried
        // Prometheus would.
        let scraper = hopper.admin_addr().map(|addr| {
            tokio::spawn(async move {
                loop {
                    let (status, _) = http(addr, "GET", "/metrics", None, None).await;
                    assert_eq!(status, 200, "scraping {addr}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
        });
        let figures = self
            .time(
                n,
                &format!("route {name}"),
                || handled(&hopper, &name),
                || done(&hopper, &name),
            )
            .await;
        if let Some(scraper) = scraper {
            scraper.abort();
        }
        hopper.stop().await;
        (figures, name)
    }

    async fn relay_vs_hopper(&self, n: u64, rounds: usize) {
        let ok = self.preload(n, "ok").await;
        let json = if self.runs("json") {
            self.preload(n, r#"{"order_id":"o-1"}"#).await
        } else {
            String::new()
        };
        // The order-timeout handler asks this service about o-1 for every
        // message: paid (409), nothing to close, `ok`, nothing emitted.
        let orders = OrderService::start([Order::new("o-1", Status::Paid)])
            .await
            .expect("the order service starts");
        let order_route = format!(
            "allowed_hosts = [\"{0}\"]\n\n[route.config]\norder-service = \"{0}\"",
            orders.url()
        );
        let fatal = if self.runs("hop") || self.runs("sized") {
            self.preload(n, "fatal").await
        } else {
            String::new()
        };
        let mut results: Vec<(&str, Vec<Figures>)> = Vec::new();
        let mut record = |name: &'static str, figures: Figures| {
            figures.row(name, None);
            match results.iter_mut().find(|(n, _)| *n == name) {
                Some((_, all)) => all.push(figures),
                None => results.push((name, vec![figures])),
            }
        };
        const BARE: &str = "bare relay (consume -> produce, acks=all)";
        const NOOP: &str =
            "hopper, no-op handler, warm, metrics off (ok: consume -> handler -> commit)";
        const METRICS: &str =
            "hopper, no-op handler, warm, metrics on (admin server, /metrics scraped every second)";
        const FRESH: &str = "hopper, no-op handler, fresh instance per message";
        const JSON: &str = "hopper, order-timeout handler (parses JSON, one HTTP call to a loopback service, ok), warm";
        const SIZED: &str = "bare relay producing hopper's dead-letter headers (15 headers)";
        const HOP: &str = "hopper, handler says fatal (consume -> handler -> produce to the DLQ)";
        const TRACED_10: &str = "hopper, no-op handler, warm, tracing on, 10% of traces exported";
        const TRACED_100: &str = "hopper, no-op handler, warm, tracing on, every trace exported";
        let sink = self.runs("traced").then(otlp_sink);
        let tracing = |sampling: f64| {
            let sink = sink.as_ref().expect("the sink runs");
            format!(
                "\n[tracing]\nendpoint = \"http://{}/v1/traces\"\nsampling = {sampling}\n",
                sink.addr
            )
        };
        let mut dlq_headers = None;
        for round in 1..=rounds {
            println!("-- round {round}");
            record(BARE, self.bare_relay(&ok, n, None).await);
            if self.runs("noop") {
                record(NOOP, self.hopper_route(&ok, "noop", "", n).await);
            }
            if self.runs("traced") {
                if !self.runs("noop") {
                    record(NOOP, self.hopper_route(&ok, "noop", "", n).await);
                }
                let tenth = self.hopper_route(&ok, "noop", &tracing(0.1), n).await;
                record(TRACED_10, tenth);
                let all = self.hopper_route(&ok, "noop", &tracing(1.0), n).await;
                record(TRACED_100, all);
            }
            if self.runs("metrics") {
                let on = self.hopper_route(&ok, "noop", METRICS_ON, n).await;
                record(METRICS, on);
            }
            if self.runs("fresh") {
                let fresh = self
                    .hopper_route(&ok, "noop", "instance = \"fresh\"", n)
                    .await;
                record(FRESH, fresh);
            }
            if self.runs("json") {
                let figures = self
                    .hopper_route(&json, "order_timeout", &order_route, n)
                    .await;
                record(JSON, figures);
            }
            if self.runs("hop") || self.runs("sized") {
                let (hop, headers) = self.hopper_hop(&fatal, n).await;
                let headers = dlq_headers.get_or_insert(headers);
                record(SIZED, self.bare_relay(&ok, n, Some(headers)).await);
                record(HOP, hop);
            }
        }

        let median = |name: &str| -> Option<f64> {
            let (_, all) = results.iter().find(|(n, _)| *n == name)?;
            let mut rates: Vec<f64> = all.iter().map(|f| f.rate).collect();
            rates.sort_by(f64::total_cmp);
            Some(rates[rates.len() / 2])
        };
        let cpu = |name: &str| -> String {
            let Some((_, all)) = results.iter().find(|(n, _)| *n == name) else {
                return String::new();
            };
            let mut own: Vec<f64> = all.iter().map(|f| f.own_us).collect();
            own.sort_by(f64::total_cmp);
            let mut broker: Vec<f64> = all.iter().filter_map(|f| f.broker_us).collect();
            broker.sort_by(f64::total_cmp);
            match broker.get(broker.len() / 2) {
                Some(b) => format!(
                    " (cpu µs/msg: {:.1} here, {b:.1} broker)",
                    own[own.len() / 2]
                ),
                None => format!(" (cpu µs/msg: {:.1})", own[own.len() / 2]),
            }
        };
        println!("-- medians of {rounds} rounds");
        let bare = median(BARE).expect("the bare relay ran");
        println!("{BARE}: {bare:.0} msg/s{}", cpu(BARE));
        for name in [
            NOOP, TRACED_10, TRACED_100, METRICS, FRESH, JSON, SIZED, HOP,
        ] {
            if let Some(rate) = median(name) {
                println!("{name}: {rate:.0} msg/s = {:.2}x{}", rate / bare, cpu(name));
            }
        }
        if let (Some(on), Some(off)) = (median(METRICS), median(NOOP)) {
            println!(
                "hopper's no-op route with metrics on against metrics off: {:.3}x",
                on / off
            );
        }
        for (name, share) in [(TRACED_10, "10%"), (TRACED_100, "100%")] {
            if let (Some(on), Some(off)) = (median(name), median(NOOP)) {
                println!(
                    "hopper's no-op route exporting {share} of traces against tracing off: {:.3}x",
                    on / off
                );
            }
        }
        if let (Some(hop), Some(sized)) = (median(HOP), median(SIZED)) {
            println!(
                "hopper's dead-lettering against the bare relay producing the same headers: {:.2}x",
                hop / sized
            );
        }
        // A median of ratios hides how far the rounds spread: each round's
        // ratio, rate and CPU per message, against the relay of that round.
        let rounds_of = |name: &str| results.iter().find(|(n, _)| *n == name).map(|(_, all)| all);
        println!("-- each round against its own relay: rate, cpu per message");
        for (name, base) in [
            (NOOP, BARE),
            (TRACED_10, BARE),
            (TRACED_100, BARE),
            (METRICS, BARE),
            (FRESH, BARE),
            (JSON, BARE),
            (HOP, SIZED),
        ] {
            let (Some(all), Some(bases)) = (rounds_of(name), rounds_of(base)) else {
                continue;
            };
            let each: Vec<String> = all
                .iter()
                .zip(bases)
                .map(|(f, b)| format!("{:.2}x/{:.2}x", f.rate / b.rate, f.own_us / b.own_us))
                .collect();
            println!("{name} against {base}: {}", each.join(" "));
        }
    }

    /// Hopper with every message dead-lettered: the hop path, like for like
    /// with the bare relay. Returns the figures and the headers of one
    /// dead-letter record, for a bare relay that produces records of the
    /// same size.
    async fn hopper_hop(&self, input: &str, n: u64) -> (Figures, OwnedHeaders) {
        // The `fatal` fixture returns `fatal` and calls no import, as the
        // no-op row's handler returns `ok`: the handler's own work is not
        // the hop's.
        let (figures, name) = self.hopper_named_route(input, "fatal", "", n).await;
        let record = consume(&format!("{name}.dlq"), 1, Duration::from_secs(30))
            .await
            .remove(0);
        let headers = record.headers().expect("a DLQ record has headers").clone();
        (figures, headers)
    }

    async fn storm(&self, n: u64, rounds: usize) {
        println!(
            "retry storm: route A handles {n} ok messages, alone and beside route B failing 100% retryable, without and with B's circuit breaker"
        );
        let a_input = self.preload(n, "ok").await;
        // Four times A's messages: B's first pass lasts longer than its
        // retry tier's second, so once it is under way B always has
        // messages to fail, and A's window meets the storm at its height.
        let b_input = self.preload(4 * n, "retry").await;
        let (mut ratios, mut guarded) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            println!("-- round {round}");
            let alone = self.hopper_route(&a_input, "noop", "", n).await;
            alone.row("route A alone", None);
            ratios.push(
                self.beside_storm(&a_input, &b_input, n, &alone, false)
                    .await,
            );
            guarded.push(self.beside_storm(&a_input, &b_input, n, &alone, true).await);
        }
        for (ratios, what) in [
            (&mut ratios, "route A beside the storm"),
            (&mut guarded, "route A beside B with its breaker open"),
        ] {
            ratios.sort_by(f64::total_cmp);
            println!(
                "-- {what} against route A alone, median of {rounds} rounds: {:.2}x",
                ratios[ratios.len() / 2]
            );
        }
    }

    /// Route A (a new route, so a new group, over `a_input`) beside route
    /// B failing every message of `b_input` `retryable`, each in a hopper
    /// of its own in this process; A's rate against `alone`'s.
    ///
    /// B starts first. Without a breaker, A starts once B has failed `n`
    /// messages, so A's window meets the storm under way. (Started together
    /// in one hopper, how much of B's storm A's short window met was luck:
    /// rounds from 0.17x to 0.97x.) With B's `[route.breaker]` (its
    /// defaults: open at half retryable over 10 calls or more, tiers paused
    /// for 30 s), A starts once B has failed its whole input once, every
    /// one of those hops is acknowledged, and its breaker is open: B's
    /// tiers hold every message, and its input is read to the end.
    async fn beside_storm(
        &self,
        a_input: &str,
        b_input: &str,
        n: u64,
        alone: &Figures,
        breaker: bool,
    ) -> f64 {
        let (a, b) = (rand_name("bench-a"), rand_name("bench-b"));
        let table = if breaker { "[route.breaker]\n" } else { "" };
        let storm = self
            .start(&format!(
                "[[route]]\nname = \"{b}\"\ntopics = [\"{b_input}\"]\nhandler = \"{}\"\nretry = [\"1s\"]\nmax_attempts = 1000\n{table}",
                plugin("scripted").display()
            ))
            .await;
        let deadline = Instant::now() + TIME_LIMIT;
        let opened = |hopper: &Hopper| route_total::<series::BreakerOpenings>(hopper, &b);
        // Looked at from this thread, as in `time`.
        loop {
            let ready = if breaker {
                done(&storm, &b) >= 4 * n && opened(&storm) > 0
            } else {
                handled(&storm, &b) >= n
            };
            if ready {
                break;
            }
            assert!(Instant::now() < deadline, "route B's storm never got going");
            std::thread::sleep(Duration::from_micros(500));
        }
        let hopper = self
            .start(&format!(
                "[[route]]\nname = \"{a}\"\ntopics = [\"{a_input}\"]\nhandler = \"{}\"\n",
                plugin("noop").display()
            ))
            .await;
        let failed_before = handled(&storm, &b);
        let beside = self
            .time(
                n,
                &format!("route {a}"),
                || handled(&hopper, &a),
                || done(&hopper, &a),
            )
            .await;
        let failed = handled(&storm, &b) - failed_before;
        hopper.stop().await;
        storm.stop().await;
        let what = if breaker {
            "route A beside route B with its breaker open"
        } else {
            "route A beside route B's storm"
        };
        beside.row(
            &format!("{what} (B failed {failed} deliveries from A's start to its last message)"),
            Some(alone),
        );
        beside.rate / alone.rate
    }
}

/// The sum of `route`'s series of family `S`.
fn route_total<S: Series>(hopper: &Hopper, route: &str) -> u64 {
    let metrics = hopper.telemetry().metrics();
    metrics.sum::<S>(|labels| labels.first().is_some_and(|r| r == route))
}

/// Messages `route` has handled so far, any verdict.
fn handled(hopper: &Hopper, route: &str) -> u64 {
    route_total::<series::HandlerOutcomes>(hopper, route)
}

/// Messages of `route` that are done: handled `ok`, or hopped and
/// acknowledged.
fn done(hopper: &Hopper, route: &str) -> u64 {
    let ok = series::HandlerOutcomes {
        route,
        outcome: "ok",
    };
    hopper_tests::count(hopper.telemetry(), &ok)
        + route_total::<series::DeadLetters>(hopper, route)
        + route_total::<series::Retries>(hopper, route)
}

/// A loopback OTLP/HTTP sink for the `traced` contenders: answers every
/// export 200 with an empty response and keeps nothing.
fn otlp_sink() -> hopper_tests::http_server::Loopback {
    use http_body_util::{BodyExt, Full};
    hopper_tests::http_server::Loopback::start("otlp-sink", 1, |stream| async move {
        let service = hyper::service::service_fn(
            |request: hyper::Request<hyper::body::Incoming>| async move {
                request.into_body().collect().await?;
                Ok::<_, hyper::Error>(
                    hyper::Response::builder()
                        .header("content-type", "application/x-protobuf")
                        .body(Full::new(bytes::Bytes::new()))
                        .unwrap(),
                )
            },
        );
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
            .await;
    })
}
