//! Ordered retries (`retry_order = "key"`, docs/ordered-retries.md): what
//! parking keys costs the other keys, what a parked key and a parked message
//! cost in memory, and what a `kill -9` with keys parked makes hopper do
//! again.
//!
//! ```text
//! bench-parked [--only throughput,memory,loaded,kill] [--rounds N] [--messages N] [--keys K]
//!              [--mem-keys K] [--mem-messages M] [--loaded M]
//!              [--park-seconds S] [--kill-keys K] [--kill-waiting W] [--drain-kill-at F]
//! ```
//!
//! On the broker in `HOPPER_TEST_BROKERS` (see `cargo xtask bench`).
//!
//! - **throughput**: a preloaded 2-partition input of MESSAGES (100,000)
//!   over KEYS (10,000) keys, message i of key `i mod KEYS`, so a key's
//!   messages spread through the run. For a parked share p, the first
//!   message of p% of the keys is `retry` (the `scripted` fixture: retryable
//!   on every attempt) on a route whose ladder is `retry = ["1h"]`, so those
//!   heads never come back during the run and their keys stay parked; every
//!   other message is `ok`. Contenders, each a hopper in this process with
//!   a route (so a consumer group) of its own, in this order every round:
//!   `key` (`ordering = "key"`, no `retry_order`, no failures), `ordered-0`
//!   (`retry_order = "key"`, no failures), `ordered-1` and `ordered-10`,
//!   then `key-1` and `key-10`: `key` over the inputs of `ordered-1` and
//!   `ordered-10`, the same heads retried but nothing parked (what the
//!   retries cost without ordered retries; reported, not in the rows).
//!   Each is timed (a) from its first message handled to the last `ok` of
//!   the keys that never park (the rate of the other keys; for `key-1` and
//!   `key-10`, of every message but the heads, which all come to `ok`), and (b) to the
//!   moment its group's committed offsets reach the input's end (every
//!   message handled, retried or parked; commits go every 100 ms).
//!   Medians of ROUNDS (3) rounds, and each round's ratio against `key` of
//!   that round.
//! - **memory**: in this process, no broker: a `ParkTable` takes a head for
//!   each of MEM_KEYS (100,000) keys, then MEM_MESSAGES (1,000,000) parked
//!   messages over those keys (a 100-byte payload and two small headers
//!   each). The RSS before and after each gives the bytes per parked key and
//!   per parked message, beside what the table counts against
//!   `max_parked_mib` (`ParkedSummary::bytes`).
//! - **loaded**: the same through `hopper run`: a fresh process's RSS with
//!   an empty park topic, and with LOADED (100,000) parked messages (100 per
//!   key) written to the topic before it starts, once its table holds them
//!   (`hopper_parked_messages` on its `/metrics`).
//! - **kill**: `hopper run` over KILL_KEYS (100) keys, each a head and
//!   KILL_WAITING (100) messages behind it, every message a `get:` of a
//!   loopback recorder that answers 503 to each head's first call and 200 to
//!   everything else; the ladder is `retry = ["PARK_SECONDS s"]` (60), so the
//!   keys are parked for that long. Once every message waits in the park
//!   topic (the input committed to its end), hopper is killed with SIGKILL
//!   and started again; once every head has its 200 and a share F (a
//!   third) of the waiting messages theirs, it is killed and started again
//!   once more.
//!   The recorder counts the calls of each (key, message): re-done calls
//!   (more than one 200), and each key's order (no message called before
//!   every earlier message of its key had its 200; no message called after
//!   a later one of its key).
//!
//! The summary at the end is rows for BENCHMARKS.md's "All figures" table,
//! also written to /tmp/parked-bench-rows.md.

use hopper::Hopper;
use hopper::metrics::series::{self, Series};
use hopper_tests::fleet::HopperProcess;
use hopper_tests::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The allocator of the `hopper` binary, so both sides are measured alike.
#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

/// Partitions of the input topics.
const PARTITIONS: i32 = 2;
/// No contender, and no phase of the kill run, may take longer than this.
const TIME_LIMIT: Duration = Duration::from_secs(300);
/// The parts, in the order they run: memory first, while this process has
/// allocated little, so freed pages it keeps do not hide its growth.
const PARTS: [&str; 4] = ["memory", "throughput", "loaded", "kill"];
/// The shares of keys parked, in percent, after `key` and `ordered-0`.
const SHARES: [u64; 2] = [1, 10];
const ROWS_FILE: &str = "/tmp/parked-bench-rows.md";

struct Args {
    only: Vec<String>,
    rounds: usize,
    messages: u64,
    keys: u64,
    mem_keys: u64,
    mem_messages: u64,
    loaded: u64,
    park_seconds: u64,
    kill_keys: u64,
    kill_waiting: u64,
    /// The share of the waiting messages handled (a 200) at the second
    /// kill; 0: as soon as every head has its 200.
    drain_kill_at: f64,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench-parked [--only {}] [--rounds N] [--messages N] [--keys K] [--mem-keys K] [--mem-messages M] [--loaded M] [--park-seconds S] [--kill-keys K] [--kill-waiting W] [--drain-kill-at F]",
        PARTS.join(",")
    );
    std::process::exit(2)
}

impl Args {
    fn parse() -> Args {
        let mut args = Args {
            only: PARTS.iter().map(|p| p.to_string()).collect(),
            rounds: 3,
            messages: 100_000,
            keys: 10_000,
            mem_keys: 100_000,
            mem_messages: 1_000_000,
            loaded: 100_000,
            park_seconds: 60,
            kill_keys: 100,
            kill_waiting: 100,
            drain_kill_at: 1.0 / 3.0,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut number = || -> u64 {
                match it.next().map(|v| v.parse::<u64>()) {
                    Some(Ok(n)) if n >= 1 => n,
                    _ => usage(),
                }
            };
            match flag.as_str() {
                "--rounds" => args.rounds = number() as usize,
                "--messages" => args.messages = number(),
                "--keys" => args.keys = number(),
                "--mem-keys" => args.mem_keys = number(),
                "--mem-messages" => args.mem_messages = number(),
                "--loaded" => args.loaded = number(),
                "--park-seconds" => args.park_seconds = number(),
                "--kill-keys" => args.kill_keys = number(),
                "--kill-waiting" => args.kill_waiting = number(),
                "--drain-kill-at" => match it.next().map(|v| v.parse::<f64>()) {
                    Some(Ok(f)) if (0.0..1.0).contains(&f) => args.drain_kill_at = f,
                    _ => usage(),
                },
                "--only" => {
                    let names: Vec<String> = it
                        .next()
                        .unwrap_or_else(|| usage())
                        .split(',')
                        .map(str::to_string)
                        .collect();
                    if names.iter().any(|n| !PARTS.contains(&n.as_str())) {
                        usage();
                    }
                    args.only = names;
                }
                _ => usage(),
            }
        }
        if args.keys > args.messages || args.keys < 100 {
            eprintln!("--keys must be at least 100 and at most --messages");
            usage();
        }
        args
    }

    fn runs(&self, part: &str) -> bool {
        self.only.iter().any(|p| p == part)
    }

    /// The command that reproduces this run, for the summary.
    fn command(&self) -> String {
        let given: Vec<String> = std::env::args().skip(1).collect();
        if given.is_empty() {
            "`cargo xtask bench parked`".to_string()
        } else {
            format!("`cargo xtask bench parked {}`", given.join(" "))
        }
    }
}

/// One row of BENCHMARKS.md's "All figures" table.
struct Row {
    figure: String,
    target: String,
    latest: String,
    status: String,
}

#[tokio::main]
async fn main() {
    hopper::tune_allocator();
    let args = Args::parse();
    println!(
        "bench-parked: {} on the broker at {}",
        args.only.join(", "),
        if args.only.iter().all(|p| p == "memory") {
            "(none needed)".to_string()
        } else {
            brokers()
        }
    );
    let mut rows = Vec::new();
    if args.runs("memory") {
        rows.extend(memory(args.mem_keys, args.mem_messages));
    }
    if args.runs("throughput") {
        rows.extend(throughput(&args).await);
    }
    if args.runs("loaded") {
        rows.extend(loaded(args.loaded).await);
    }
    if args.runs("kill") {
        rows.extend(kill(&args).await);
    }
    let command = args.command();
    let mut table = String::new();
    for row in &rows {
        writeln!(
            table,
            "| {} | {} | {} | {} | {command} |",
            row.figure, row.target, row.latest, row.status
        )
        .unwrap();
    }
    println!("-- rows for BENCHMARKS.md's \"All figures\" table (also in {ROWS_FILE})");
    print!("{table}");
    if let Err(e) = std::fs::write(ROWS_FILE, &table) {
        eprintln!("writing {ROWS_FILE}: {e}");
    }
}

/// Today's date, UTC, as YYYY-MM-DD.
fn today() -> String {
    let days = hopper::clock::now_ms() / 86_400_000;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The resident set of process `pid` (`self` for this one), KiB.
fn rss_kib(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// CPU seconds used so far by this process (user + system).
fn cpu_seconds() -> f64 {
    cpu_seconds_of("self").unwrap_or(0.0)
}

/// CPU seconds used so far by process `pid` (user + system).
fn cpu_seconds_of(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.rfind(')')?;
    let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    Some((field(11)? + field(12)?) / 100.0)
}

/// CPU seconds used so far by the broker, when `cargo xtask bench` started
/// it and named its process (`HOPPER_BENCH_BROKER_PID`).
fn broker_cpu_seconds() -> Option<f64> {
    cpu_seconds_of(&std::env::var("HOPPER_BENCH_BROKER_PID").ok()?)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ---------------------------------------------------------------------------
// memory: a ParkTable in this process

fn memory(keys: u64, messages: u64) -> Vec<Row> {
    use hopper::parked::{Head, Lane, ParkTable, Parked, Record};
    println!(
        "-- memory, in process: a park table of {} keys (heads), then {} parked messages over them (100-byte payload, 2 headers)",
        thousands(keys),
        thousands(messages)
    );
    let lane = |i: u64| Lane {
        topic: "bench-parked.in".to_string(),
        partition: (i % 2) as i32,
        key: format!("key-{i:08}").into_bytes(),
    };
    let table = ParkTable::new(
        "bench",
        "bench.parked",
        hopper::config::KeyDeadLetter::Continue,
        (usize::MAX, usize::MAX),
        std::collections::HashMap::from([("bench-parked.in".to_string(), vec![i64::MAX; 2])]),
    );
    let before = rss_kib("self");
    let started = Instant::now();
    for i in 0..keys {
        let lane = lane(i);
        table.apply(Record::Head {
            head: Some(Head {
                head: format!("bench-parked.in-{}-{i}", lane.partition),
                seq: i as i64,
                since: hopper::clock::now_ms(),
            }),
            lane,
        });
    }
    let heads_took = started.elapsed();
    let with_heads = rss_kib("self");
    let payload = vec![b'x'; 100];
    let started = Instant::now();
    for m in 0..messages {
        let key = m % keys;
        table.apply(Record::Parked {
            lane: lane(key),
            seq: (keys + m) as i64,
            message: Some(Parked {
                payload: Some(payload.clone()),
                headers: vec![
                    (
                        "content-type".to_string(),
                        Some(b"application/json".to_vec()),
                    ),
                    ("source".to_string(), Some(b"bench-parked".to_vec())),
                ],
                timestamp: Some(hopper::clock::now_ms()),
            }),
        });
    }
    let parked_took = started.elapsed();
    let with_messages = rss_kib("self");
    let summary = table.summary();
    assert_eq!(summary.parked_keys as u64, keys, "every key is parked");
    assert_eq!(summary.messages as u64, messages, "every message waits");
    let per_key = (with_heads.saturating_sub(before) * 1024) as f64 / keys as f64;
    let per_message = (with_messages.saturating_sub(with_heads) * 1024) as f64 / messages as f64;
    let counted = summary.bytes as f64 / messages as f64;
    println!(
        "RSS {before} KiB, with the heads {with_heads} KiB ({:.0} ms), with the messages {with_messages} KiB ({:.0} ms)",
        heads_took.as_secs_f64() * 1e3,
        parked_took.as_secs_f64() * 1e3
    );
    println!("per parked key (its head): {per_key:.0} bytes");
    println!(
        "per parked message: {per_message:.0} bytes; the table counts {counted:.0} bytes a message against max_parked_mib ({:.2}x of the RSS it takes)",
        counted / per_message
    );
    drop(table);
    println!("RSS once the table is dropped: {} KiB", rss_kib("self"));
    vec![Row {
        figure: format!(
            "ordered retries: memory of the park table in process, {} parked keys (heads) then {} parked messages over them (100-byte payload, 2 small headers): RSS per parked key / per parked message, and what the table counts against `max_parked_mib` per message",
            thousands(keys),
            thousands(messages)
        ),
        target: "report".into(),
        latest: format!(
            "{}: **{per_key:.0} bytes** a key / **{per_message:.0} bytes** a message; the table counts {counted:.0} bytes a message ({:.2}× the RSS)",
            today(),
            counted / per_message
        ),
        status: "report".into(),
    }]
}

// ---------------------------------------------------------------------------
// throughput: the other keys' rate with keys parked

/// An input topic and what the contenders should find in it.
struct Input {
    topic: String,
    /// Percent of keys parked.
    share: u64,
    /// Keys whose first message is `retry`.
    heads: u64,
    /// Messages of keys that never park.
    others: u64,
}

/// Whether key `key` is one of the `share` percent that park.
fn parks(key: u64, share: u64) -> bool {
    share > 0 && (key * share) % 100 < share
}

/// Fills a new 2-partition topic: message i of key `key-(i mod keys)`,
/// `retry` for the first message of the keys that park, else `ok`.
async fn preload(messages: u64, keys: u64, share: u64) -> Input {
    let topic = rand_name("bench-parked-in");
    create_topics(&[&topic]).await;
    let producer: FutureProducer = client_config()
        .set("linger.ms", "10")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .unwrap();
    let (mut heads, mut others) = (0, 0);
    let mut acks = Vec::with_capacity(messages as usize);
    for i in 0..messages {
        let key = i % keys;
        let payload = if i < keys && parks(key, share) {
            heads += 1;
            "retry"
        } else {
            "ok"
        };
        if !parks(key, share) {
            others += 1;
        }
        let key = format!("key-{key}");
        let mut tries = 0;
        loop {
            match producer.send_result(FutureRecord::to(&topic).key(&key).payload(payload)) {
                Ok(ack) => {
                    acks.push(ack);
                    break;
                }
                Err(_) => {
                    tries += 1;
                    assert!(tries < 10_000, "the producer's queue stays full");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }
    }
    for ack in acks {
        ack.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    Input {
        topic,
        share,
        heads,
        others,
    }
}

/// One contender's run.
struct Run {
    /// Messages of the keys that never park, per second, from the first
    /// message handled to their last `ok`.
    rate: f64,
    /// From the first message handled to the input committed to its end.
    committed_s: f64,
    /// CPU µs of this process per input message, over the same window.
    cpu_us: f64,
    /// CPU µs of the broker per input message, over the same window, when
    /// its process is known.
    broker_us: Option<f64>,
}

/// The sum of `route`'s series of family `S` whose other labels `keep`
/// keeps.
fn route_sum<S: Series>(hopper: &Hopper, route: &str, keep: impl Fn(&[String]) -> bool) -> u64 {
    hopper
        .telemetry()
        .metrics()
        .sum::<S>(|labels| labels.first().is_some_and(|r| r == route) && keep(&labels[1..]))
}

/// Reads a group's committed offsets on a topic, summed over its
/// partitions, with one client.
struct Committed {
    consumer: BaseConsumer,
    partitions: TopicPartitionList,
}

impl Committed {
    fn new(group: &str, topic: &str) -> Committed {
        let consumer: BaseConsumer = client_config()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut partitions = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            partitions.add_partition(topic, p);
        }
        Committed {
            consumer,
            partitions,
        }
    }

    fn sum(&self) -> i64 {
        match self
            .consumer
            .committed_offsets(self.partitions.clone(), Duration::from_secs(5))
        {
            Ok(got) => got
                .elements()
                .iter()
                .map(|e| match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                })
                .sum(),
            Err(_) => 0,
        }
    }
}

/// Runs one contender over `input`: a hopper of its own in this process,
/// with `retry_order = "key"` when `ordered`.
async fn contender(input: &Input, messages: u64, ordered: bool) -> Run {
    let name = rand_name("bench-parked");
    let order = if ordered {
        "retry_order = \"key\"\n"
    } else {
        ""
    };
    let config = TestConfig::new(&format!(
        "[[route]]\nname = \"{name}\"\ntopics = [\"{}\"]\nhandler = \"{}\"\nordering = \"key\"\nretry = [\"1h\"]\n{order}",
        input.topic,
        plugin("scripted").display()
    ));
    let hopper = Hopper::start(config.config(), options())
        .await
        .expect("hopper starts");
    let committed = Committed::new(&format!("hopper.{name}"), &input.topic);
    let handled = || route_sum::<series::HandlerOutcomes>(&hopper, &name, |_| true);
    let ok = || route_sum::<series::HandlerOutcomes>(&hopper, &name, |l| l[0] == "ok");
    // Without `retry_order`, the later messages of the keys whose head
    // retries are called too: every message but the heads comes to `ok`.
    let target = if ordered {
        input.others
    } else {
        messages - input.heads
    };
    let deadline = Instant::now() + TIME_LIMIT;
    let state = || {
        format!(
            "route {name} (parked share {}%): {} handled, {} ok of {target}, committed {} of {messages}, {} retried, {} parked",
            input.share,
            handled(),
            ok(),
            committed.sum(),
            route_sum::<series::Retries>(&hopper, &name, |_| true),
            route_sum::<series::ParkedMessages>(&hopper, &name, |_| true),
        )
    };
    // The looks sleep this thread, which `main` blocks on and no task runs
    // on (see bench-throughput).
    while handled() == 0 {
        assert!(Instant::now() < deadline, "no message handled: {}", state());
        std::thread::sleep(Duration::from_micros(200));
    }
    let (started, cpu, broker_cpu) = (Instant::now(), cpu_seconds(), broker_cpu_seconds());
    let mut others_done = None;
    let mut last_look = Instant::now();
    let committed_s = loop {
        if others_done.is_none() && ok() >= target {
            others_done = Some(started.elapsed());
        }
        if others_done.is_some() && last_look.elapsed() >= Duration::from_millis(10) {
            last_look = Instant::now();
            if committed.sum() >= messages as i64 {
                break started.elapsed();
            }
        }
        assert!(
            Instant::now() < deadline,
            "stuck past the time limit: {}",
            state()
        );
        std::thread::sleep(Duration::from_micros(500));
    };
    let cpu_us = (cpu_seconds() - cpu) * 1e6 / messages as f64;
    let broker_us = broker_cpu
        .zip(broker_cpu_seconds())
        .map(|(before, after)| (after - before) * 1e6 / messages as f64);
    let others_done = others_done.unwrap();
    let retried = route_sum::<series::Retries>(&hopper, &name, |_| true);
    let parked = route_sum::<series::ParkedMessages>(&hopper, &name, |_| true);
    let keys_parked = route_sum::<series::ParkedKeys>(&hopper, &name, |_| true);
    let all_ok = ok();
    let waiting = messages - input.others - input.heads;
    let stopping = Instant::now();
    hopper.stop().await;
    let stop_s = stopping.elapsed().as_secs_f64();
    // What a run must come to: every other key's message `ok` once, every
    // parked key's head retried once and its later messages parked.
    let expected = if ordered {
        (input.others, input.heads, waiting, input.heads)
    } else {
        (target, input.heads, 0, 0)
    };
    let got = (all_ok, retried, parked, keys_parked);
    let check = if got == expected {
        "as expected".to_string()
    } else {
        format!("UNEXPECTED: (ok, retried, parked, keys parked) = {got:?}, expected {expected:?}")
    };
    println!(
        "  {} ok in {:.3} s = {:.0} msg/s; input committed to its end after {:.3} s ({:.0} parked/s); cpu {:.1} µs/msg{}; {retried} retried, {parked} parked, {keys_parked} keys parked: {check}; stop took {stop_s:.1} s",
        target,
        others_done.as_secs_f64(),
        target as f64 / others_done.as_secs_f64(),
        committed_s.as_secs_f64(),
        parked as f64 / committed_s.as_secs_f64(),
        cpu_us,
        broker_us
            .map(|b| format!(", broker {b:.1} µs/msg"))
            .unwrap_or_default(),
    );
    Run {
        rate: target as f64 / others_done.as_secs_f64(),
        committed_s: committed_s.as_secs_f64(),
        cpu_us,
        broker_us,
    }
}

async fn throughput(args: &Args) -> Vec<Row> {
    let (n, k) = (args.messages, args.keys);
    println!(
        "-- throughput: {} messages over {} keys, {PARTITIONS} partitions, scripted fixture, retry = [\"1h\"], {} rounds",
        thousands(n),
        thousands(k),
        args.rounds
    );
    let all_ok = preload(n, k, 0).await;
    let mut inputs = Vec::new();
    for share in SHARES {
        let input = preload(n, k, share).await;
        println!(
            "input with {share}% of keys parked: {} keys park ({} messages wait behind them), {} messages of other keys",
            input.heads,
            n - input.others - input.heads,
            input.others
        );
        inputs.push(input);
    }
    let names: Vec<String> = ["key".to_string(), "ordered-0".to_string()]
        .into_iter()
        .chain(SHARES.iter().map(|s| format!("ordered-{s}")))
        .chain(SHARES.iter().map(|s| format!("key-{s}")))
        .collect();
    let mut runs: Vec<Vec<Run>> = names.iter().map(|_| Vec::new()).collect();
    for round in 1..=args.rounds {
        println!("-- round {round}");
        for (i, name) in names.iter().enumerate() {
            println!("{name}:");
            let run = match i {
                0 => contender(&all_ok, n, false).await,
                1 => contender(&all_ok, n, true).await,
                _ if i < 2 + SHARES.len() => contender(&inputs[i - 2], n, true).await,
                _ => contender(&inputs[i - 2 - SHARES.len()], n, false).await,
            };
            runs[i].push(run);
        }
    }
    println!("-- medians of {} rounds", args.rounds);
    let key_rate = median(&runs[0].iter().map(|r| r.rate).collect::<Vec<_>>());
    let mut ratio_of = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        let rate = median(&runs[i].iter().map(|r| r.rate).collect::<Vec<_>>());
        let committed = median(&runs[i].iter().map(|r| r.committed_s).collect::<Vec<_>>());
        let cpu = median(&runs[i].iter().map(|r| r.cpu_us).collect::<Vec<_>>());
        let brokers: Vec<f64> = runs[i].iter().filter_map(|r| r.broker_us).collect();
        let broker = if brokers.is_empty() {
            String::new()
        } else {
            format!(", broker {:.1} µs/msg", median(&brokers))
        };
        let rounds: Vec<String> = runs[i]
            .iter()
            .zip(&runs[0])
            .map(|(r, base)| format!("{:.2}x", r.rate / base.rate))
            .collect();
        println!(
            "{name}: other keys {rate:.0} msg/s = {:.2}x key (rounds {}); committed to the end after {committed:.3} s; cpu {cpu:.1} µs/msg{broker}",
            rate / key_rate,
            rounds.join(", ")
        );
        let cpus: Vec<String> = runs[i].iter().map(|r| format!("{:.1}", r.cpu_us)).collect();
        ratio_of.insert(
            name.clone(),
            (
                rate,
                rate / key_rate,
                format!(
                    "{}; CPU {} µs a message",
                    rounds.join(", "),
                    cpus.join(" / ")
                ),
                committed,
            ),
        );
    }
    let date = today();
    let (key_rate, _, key_rounds, key_committed) = ratio_of["key"].clone();
    // `key`'s own rounds are all 1.00×: its CPU is what they are read against.
    let key_rounds = key_rounds
        .split_once("; ")
        .map_or(key_rounds.clone(), |(_, cpu)| cpu.to_string());
    let (o0_rate, o0, o0_rounds, o0_committed) = ratio_of["ordered-0"].clone();
    let (o1_rate, o1, o1_rounds, o1_committed) = ratio_of["ordered-1"].clone();
    let (o10_rate, o10, o10_rounds, o10_committed) = ratio_of["ordered-10"].clone();
    let scene = format!(
        "{} messages over {} keys, 2 partitions, the `scripted` fixture, `retry = [\"1h\"]`, {} rounds",
        thousands(n),
        thousands(k),
        args.rounds
    );
    let met = |ok: bool| if ok { "met" } else { "missed" }.to_string();
    vec![
        Row {
            figure: format!(
                "ordered retries: the other keys' throughput with 1% of keys parked (`retry_order = \"key\"`, each parked key's head in a 1 h tier, its later messages parked) against `ordering = \"key\"` without `retry_order` and no failures; {scene}"
            ),
            target: "≥ 0.9×; with 10% parked ≥ 0.7×, CPU per message reported".into(),
            latest: format!(
                "{date}: **{o1:.2}×** ({o1_rate:.0} against {key_rate:.0} msg/s; rounds {o1_rounds}, against `key`'s {key_rounds}); with 10% parked **{o10:.2}×** ({o10_rate:.0} msg/s; rounds {o10_rounds})"
            ),
            status: format!("{} (1%); {} (10%)", met(o1 >= 0.9), met(o10 >= 0.7)),
        },
        Row {
            figure: format!(
                "ordered retries on, no key parked (`retry_order = \"key\"`, every message `ok`), against `ordering = \"key\"` without it; {scene}"
            ),
            target: "≥ 0.97×".into(),
            latest: format!(
                "{date}: **{o0:.2}×** ({o0_rate:.0} against {key_rate:.0} msg/s; rounds {o0_rounds}, against `key`'s {key_rounds})"
            ),
            status: met(o0 >= 0.97),
        },
        Row {
            figure: format!(
                "ordered retries: from the first message handled to the input committed to its end (every message handled, retried or parked; commits every 100 ms): `key` / `ordered-0` / `ordered-1` / `ordered-10`; {scene}"
            ),
            target: "report".into(),
            latest: format!(
                "{date}: {key_committed:.2} / {o0_committed:.2} / {o1_committed:.2} / {o10_committed:.2} s"
            ),
            status: "report".into(),
        },
    ]
}

// ---------------------------------------------------------------------------
// loaded: a fresh `hopper run` reading a park topic

/// A route with ordered retries and an admin server with `/metrics`, in a
/// config file: its name, input and admin address.
struct OrderedRoute {
    name: String,
    input: String,
    admin: std::net::SocketAddr,
    config: TestConfig,
}

impl OrderedRoute {
    async fn new(retry: &str, extra: &str) -> OrderedRoute {
        let name = rand_name("bench-parked");
        let input = format!("{name}.in");
        create_topics(&[&input]).await;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let admin: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let config = TestConfig::new(&format!(
            "[[route]]\nname = \"{name}\"\ntopics = [\"{input}\"]\nhandler = \"{}\"\nretry = [\"{retry}\"]\nretry_order = \"key\"\n{extra}\n\n[admin]\nlisten = \"{admin}\"\nmetrics = true\n",
            plugin("scripted").display()
        ));
        OrderedRoute {
            name,
            input,
            admin,
            config,
        }
    }

    /// `hopper_parked_messages` of the route on `/metrics`, once it answers.
    async fn parked_messages(&self) -> Option<u64> {
        let connect = tokio::net::TcpStream::connect(self.admin);
        match tokio::time::timeout(Duration::from_secs(2), connect).await {
            Ok(Ok(_)) => {}
            _ => return None,
        }
        let (status, body) = http(self.admin, "GET", "/metrics", None, None).await;
        if status != 200 {
            return None;
        }
        let prefix = format!("hopper_parked_messages{{route=\"{}\"}} ", self.name);
        body.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    }

    /// Waits until the process's table holds `messages` parked messages.
    async fn until_parked(&self, process: &mut HopperProcess, messages: u64) -> Duration {
        let started = Instant::now();
        loop {
            if self.parked_messages().await == Some(messages) {
                return started.elapsed();
            }
            if let Some(status) = process.exited() {
                panic!(
                    "hopper exited ({status}) before its table held {messages} messages:\n{}",
                    process.log_tail(20)
                );
            }
            assert!(
                started.elapsed() < TIME_LIMIT,
                "the table did not reach {messages} parked messages within {TIME_LIMIT:?} (last: {:?}):\n{}",
                self.parked_messages().await,
                process.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Writes `keys` head records and `messages` parked-message records (over
/// those keys, 100-byte payload, 2 small headers) to `route`'s park topic,
/// as docs/ordered-retries.md describes them, by a writer no process is.
async fn write_park_topic(route: &OrderedRoute, keys: u64, messages: u64) {
    let topic = format!("{}.parked", route.name);
    let probe: BaseConsumer = client_config().create().unwrap();
    let metadata = probe
        .fetch_metadata(Some(&topic), Duration::from_secs(10))
        .unwrap();
    let partitions = metadata.topics()[0].partitions().len() as i32;
    assert!(partitions > 0, "{topic} exists");
    let producer: FutureProducer = client_config()
        .set("linger.ms", "10")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .unwrap();
    let lane_key = |kind: &str, key: u64| -> (i32, String) {
        let partition = (key % PARTITIONS as u64) as i32;
        let digest = sha256_hex(format!("key-{key}").as_bytes());
        (
            partition,
            format!("{kind}\0{}\0{partition}\0{digest}", route.input),
        )
    };
    let since = now_ms();
    let by = |key: u64| {
        OwnedHeaders::new()
            .insert(Header {
                key: "hopper-park-by",
                value: Some("bench-parked"),
            })
            .insert(Header {
                key: "hopper-park-key",
                value: Some(format!("key-{key}").as_bytes()),
            })
    };
    let payload = {
        let mut value = vec![1u8];
        value.extend_from_slice(&[b'x'; 100]);
        value
    };
    let mut acks = Vec::new();
    let mut send = |mut record: FutureRecord<'_, [u8], [u8]>| {
        for _ in 0..10_000 {
            match producer.send_result(record) {
                Ok(ack) => {
                    acks.push(ack);
                    return;
                }
                Err((_, back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
        panic!("the producer's queue stays full");
    };
    for key in 0..keys {
        let (partition, record_key) = lane_key("h", key);
        let value = format!(
            "{{\"head\":\"{}-{partition}-{key}\",\"seq\":{key},\"since\":{since}}}",
            route.input
        );
        send(
            FutureRecord::to(&topic)
                .partition(partition % partitions)
                .key(record_key.as_bytes())
                .payload(value.as_bytes())
                .headers(by(key)),
        );
    }
    for m in 0..messages {
        let key = m % keys;
        let (partition, record_key) = lane_key("p", key);
        let record_key = format!("{record_key}\0{}", keys + m);
        let headers = by(key)
            .insert(Header {
                key: "content-type",
                value: Some("application/json"),
            })
            .insert(Header {
                key: "source",
                value: Some("bench-parked"),
            });
        send(
            FutureRecord::to(&topic)
                .partition(partition % partitions)
                .key(record_key.as_bytes())
                .payload(&payload[..])
                .headers(headers),
        );
    }
    for ack in acks {
        ack.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
}

/// The RSS of `process` once it has settled: sampled every second for
/// five seconds (freed pages go back after a second), the last sample.
async fn settled_rss(process: &HopperProcess) -> u64 {
    let mut samples = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(rss_kib(&process.pid().to_string()));
    }
    println!("  RSS of {} each second: {samples:?} KiB", process.label);
    *samples.last().unwrap()
}

async fn loaded(messages: u64) -> Vec<Row> {
    let keys = (messages / 100).max(1);
    println!(
        "-- loaded: RSS of a fresh `hopper run` with an empty park topic, and with {} parked messages over {} keys in it",
        thousands(messages),
        thousands(keys)
    );
    let route = OrderedRoute::new("1h", "").await;
    let logs = tempfile::tempdir().unwrap();
    // An empty table, and the topic created.
    let mut empty = HopperProcess::spawn("empty", &route.config.path, logs.path());
    route.until_parked(&mut empty, 0).await;
    let idle = settled_rss(&empty).await;
    empty.kill9();
    println!("fresh hopper, empty park table: RSS {idle} KiB");
    let started = Instant::now();
    write_park_topic(&route, keys, messages).await;
    println!(
        "wrote {} head and {} parked records in {:.1} s",
        keys,
        messages,
        started.elapsed().as_secs_f64()
    );
    let mut full = HopperProcess::spawn("loaded", &route.config.path, logs.path());
    let took = route.until_parked(&mut full, messages).await;
    let rss = settled_rss(&full).await;
    let _ = full.stop(Duration::from_secs(30)).await;
    let per_message = (rss.saturating_sub(idle) * 1024) as f64 / messages as f64;
    println!(
        "fresh hopper, {messages} parked messages loaded (table full {:.1} s after start): RSS {rss} KiB: {per_message:.0} bytes a parked message (its key's head included)",
        took.as_secs_f64()
    );
    vec![Row {
        figure: format!(
            "ordered retries: RSS of a fresh `hopper run` whose park topic holds {} parked messages over {} keys (100-byte payload, 2 small headers), against one with an empty park topic",
            thousands(messages),
            thousands(keys)
        ),
        target: "report".into(),
        latest: format!(
            "{}: **{per_message:.0} bytes** a parked message, its key's share included ({:.1} against {:.1} MiB); the table full {:.1} s after start",
            today(),
            rss as f64 / 1024.0,
            idle as f64 / 1024.0,
            took.as_secs_f64()
        ),
        status: "report".into(),
    }]
}

// ---------------------------------------------------------------------------
// kill: calls re-done after a SIGKILL with keys parked

/// One call the recorder answered.
#[derive(Debug, Clone, Copy)]
struct Call {
    key: u64,
    seq: u64,
    ok: bool,
    /// Which hopper process made it: 1 the first, 2 the one started after
    /// the first kill, 3 after the second.
    process: u64,
}

/// A loopback HTTP server that answers `/r/KEY/SEQ`: 503 to the first call
/// of each key's message 0 (its head), 200 to everything else, and keeps
/// every call in the order it came.
struct Recorder {
    calls: Arc<Mutex<Vec<Call>>>,
    process: Arc<std::sync::atomic::AtomicU64>,
    _server: hopper_tests::http_server::Loopback,
    origin: String,
}

impl Recorder {
    fn start() -> Recorder {
        use http_body_util::{BodyExt, Full};
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let failed: Arc<Mutex<HashSet<u64>>> = Arc::default();
        let process = Arc::new(std::sync::atomic::AtomicU64::new(1));
        let (kept, current) = (calls.clone(), process.clone());
        let server = hopper_tests::http_server::Loopback::start("recorder", 2, move |stream| {
            let (calls, failed, current) = (kept.clone(), failed.clone(), current.clone());
            async move {
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let (calls, failed, current) =
                            (calls.clone(), failed.clone(), current.clone());
                        async move {
                            let path = request.uri().path().to_string();
                            request.into_body().collect().await?;
                            let mut parts = path.trim_start_matches("/r/").split('/');
                            let key = parts.next().and_then(|k| k.parse::<u64>().ok());
                            let seq = parts.next().and_then(|s| s.parse::<u64>().ok());
                            let status = match (key, seq) {
                                (Some(key), Some(seq)) => {
                                    let fail = seq == 0 && failed.lock().unwrap().insert(key);
                                    calls.lock().unwrap().push(Call {
                                        key,
                                        seq,
                                        ok: !fail,
                                        process: current.load(std::sync::atomic::Ordering::Relaxed),
                                    });
                                    if fail { 503 } else { 200 }
                                }
                                _ => 404,
                            };
                            Ok::<_, hyper::Error>(
                                hyper::Response::builder()
                                    .status(status)
                                    .body(Full::new(bytes::Bytes::from_static(b"recorded")))
                                    .unwrap(),
                            )
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            }
        });
        let origin = format!("http://{}", server.addr);
        Recorder {
            calls,
            process,
            _server: server,
            origin,
        }
    }

    /// Calls from now on are made by process `n`.
    fn process(&self, n: u64) {
        self.process.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Heads failed, and distinct messages with a 200.
    fn progress(&self) -> (u64, u64) {
        let calls = self.calls.lock().unwrap();
        let failed = calls.iter().filter(|c| !c.ok).count() as u64;
        let done: HashSet<(u64, u64)> = calls
            .iter()
            .filter(|c| c.ok)
            .map(|c| (c.key, c.seq))
            .collect();
        (failed, done.len() as u64)
    }
}

/// What the recorder's calls say about order and repeats.
#[derive(Debug, Default)]
struct Verdict {
    /// Calls of a message before every earlier message of its key had its
    /// 200.
    ahead: Vec<String>,
    /// Calls of a message after a later message of its key was called.
    behind: Vec<String>,
    /// Messages with more than one 200, and those extra 200s.
    redone_messages: u64,
    redone_calls: u64,
    /// Messages that never had a 200.
    missing: u64,
}

fn judge(calls: &[Call], keys: u64, per_key: u64) -> Verdict {
    let mut verdict = Verdict::default();
    // Per key: messages with a 200 so far, the lowest without one, and the
    // highest called.
    let mut done: HashMap<u64, HashSet<u64>> = HashMap::new();
    let mut next: HashMap<u64, u64> = HashMap::new();
    let mut highest: HashMap<u64, u64> = HashMap::new();
    let mut oks: HashMap<(u64, u64), u64> = HashMap::new();
    for (i, call) in calls.iter().enumerate() {
        let first_open = *next.get(&call.key).unwrap_or(&0);
        if call.seq > first_open {
            verdict.ahead.push(format!(
                "call #{i} (process {}): key {} message {} before message {first_open} had its 200",
                call.process, call.key, call.seq
            ));
        }
        if let Some(&high) = highest.get(&call.key)
            && call.seq < high
        {
            verdict.behind.push(format!(
                "call #{i} (process {}): key {} message {} after message {high} was called",
                call.process, call.key, call.seq
            ));
        }
        let high = highest.entry(call.key).or_insert(call.seq);
        *high = (*high).max(call.seq);
        if call.ok {
            *oks.entry((call.key, call.seq)).or_default() += 1;
            let set = done.entry(call.key).or_default();
            set.insert(call.seq);
            let open = next.entry(call.key).or_insert(0);
            while set.contains(open) {
                *open += 1;
            }
        }
    }
    for key in 0..keys {
        for seq in 0..per_key {
            match oks.get(&(key, seq)).copied().unwrap_or(0) {
                0 => verdict.missing += 1,
                1 => {}
                n => {
                    verdict.redone_messages += 1;
                    verdict.redone_calls += n - 1;
                }
            }
        }
    }
    verdict
}

async fn kill(args: &Args) -> Vec<Row> {
    let (keys, waiting, park) = (args.kill_keys, args.kill_waiting, args.park_seconds);
    let per_key = waiting + 1;
    let total = keys * per_key;
    println!(
        "-- kill: `hopper run`, {keys} keys each with a head and {waiting} messages behind it ({total} messages), retry = [\"{park}s\"]: each head fails its first call, so its key is parked for {park} s"
    );
    let recorder = Recorder::start();
    let route = OrderedRoute::new(
        &format!("{park}s"),
        &format!("allowed_hosts = [\"{}\"]", recorder.origin),
    )
    .await;
    // Message s of every key, then message s + 1 of every key: the heads
    // come first.
    let producer: FutureProducer = client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let mut acks = Vec::new();
    for seq in 0..per_key {
        for key in 0..keys {
            let payload = format!("get:{}/r/{key}/{seq}", recorder.origin);
            let key = format!("key-{key}");
            let mut tries = 0;
            loop {
                let record = FutureRecord::to(&route.input).key(&key).payload(&payload);
                match producer.send_result(record) {
                    Ok(ack) => {
                        acks.push(ack);
                        break;
                    }
                    Err(_) => {
                        tries += 1;
                        assert!(tries < 10_000, "the producer's queue stays full");
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
            }
        }
    }
    for ack in acks {
        ack.await
            .unwrap()
            .map_err(|(e, _)| e)
            .expect("the input is written");
    }
    let committed = Committed::new(&format!("hopper.{}", route.name), &route.input);
    let logs = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut process = HopperProcess::spawn("first", &route.config.path, logs.path());
    let deadline = Instant::now() + TIME_LIMIT + Duration::from_secs(park);
    let bounded = |process: &HopperProcess, what: &str| {
        assert!(
            Instant::now() < deadline,
            "the kill run is stuck {what}: {:?} (heads failed, messages with a 200), committed {} of {total}:\n{}",
            recorder.progress(),
            committed.sum(),
            process.log_tail(20)
        );
    };
    // Every head failed, and every other message waits: the input is
    // committed to its end.
    let mut first_failure = None;
    loop {
        let (failed, _) = recorder.progress();
        if failed > 0 && first_failure.is_none() {
            first_failure = Some(Instant::now());
        }
        if failed == keys && committed.sum() == total as i64 {
            break;
        }
        bounded(&process, "parking the keys");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_failure = first_failure.unwrap();
    let parked_after = first_failure.elapsed();
    println!(
        "every key parked and the input committed to its end {:.1} s after the first head failed ({:.1} s after start)",
        parked_after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    if parked_after.as_secs() >= park {
        println!(
            "WARNING: parking took longer than the ladder: some heads may have come back before the kill"
        );
    }
    // A second for the last commit's bookkeeping, then the kill.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, done_before_kill) = recorder.progress();
    process.kill9();
    recorder.process(2);
    let killed_parked_at = first_failure.elapsed();
    println!(
        "kill -9 while parked, {:.1} s after the first head failed ({done_before_kill} messages had their 200); started again",
        killed_parked_at.as_secs_f64()
    );
    let mut process = HopperProcess::spawn("second", &route.config.path, logs.path());
    // The heads come back from their tier; once a third of the waiting
    // messages are handled, kill it again.
    let third = keys + (keys as f64 * waiting as f64 * args.drain_kill_at) as u64;
    let mut drain_kill = None;
    loop {
        let (_, done) = recorder.progress();
        if done >= third {
            if done < total {
                process.kill9();
                recorder.process(3);
                drain_kill = Some((done, first_failure.elapsed()));
                process = HopperProcess::spawn("third", &route.config.path, logs.path());
            }
            break;
        }
        bounded(&process, "waiting for the heads to come back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    match drain_kill {
        Some((done, at)) => println!(
            "kill -9 while the parked messages were handled, {:.1} s after the first head failed, {done} of {total} messages with their 200; started again",
            at.as_secs_f64()
        ),
        None => println!("the parked messages were all handled before the second kill"),
    }
    loop {
        let (_, done) = recorder.progress();
        if done == total {
            break;
        }
        bounded(&process, "handling the parked messages");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let done_at = first_failure.elapsed();
    // Calls that a late redelivery would make.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let parked_left = route.parked_messages().await;
    let stopped = process.stop(Duration::from_secs(60)).await;
    let calls = recorder.calls();
    let verdict = judge(&calls, keys, per_key);
    println!(
        "every message had its 200 {:.1} s after the first head failed; {} calls in all for {total} messages; the table holds {parked_left:?} parked messages at the end; stop: {stopped:?}",
        done_at.as_secs_f64(),
        calls.len()
    );
    println!(
        "re-done: {} calls ({} messages with more than one 200); missing: {}; out of order: {} ahead of an earlier message, {} behind a later one",
        verdict.redone_calls,
        verdict.redone_messages,
        verdict.missing,
        verdict.ahead.len(),
        verdict.behind.len()
    );
    for line in verdict.ahead.iter().chain(&verdict.behind).take(20) {
        println!("  {line}");
    }
    // Each re-done message, by where it stands in its key and which
    // processes gave it a 200.
    let mut oks: HashMap<(u64, u64), Vec<u64>> = HashMap::new();
    for call in calls.iter().filter(|c| c.ok) {
        oks.entry((call.key, call.seq))
            .or_default()
            .push(call.process);
    }
    let mut redone: HashMap<(bool, Vec<u64>), u64> = HashMap::new();
    for ((_, seq), processes) in oks.iter().filter(|(_, p)| p.len() > 1) {
        *redone.entry((*seq == 0, processes.clone())).or_default() += 1;
    }
    let mut redone: Vec<_> = redone.into_iter().collect();
    redone.sort();
    for ((head, processes), n) in redone {
        let what = if head { "heads" } else { "waiting messages" };
        println!("  {n} {what} had their 200s from processes {processes:?}");
    }
    // The calls of one key that went out of order, as they came.
    let first_bad = calls
        .iter()
        .enumerate()
        .find(|(i, _)| {
            verdict
                .ahead
                .iter()
                .chain(&verdict.behind)
                .any(|l| l.starts_with(&format!("call #{i} ")))
        })
        .map(|(_, c)| c.key);
    if let Some(key) = first_bad {
        let timeline: Vec<String> = calls
            .iter()
            .filter(|c| c.key == key)
            .map(|c| format!("{}{}@{}", c.seq, if c.ok { "" } else { "(503)" }, c.process))
            .collect();
        println!(
            "  key {key}'s calls as they came (message@process): {}",
            timeline.join(" ")
        );
    }
    let ordered = verdict.ahead.is_empty() && verdict.behind.is_empty() && verdict.missing == 0;
    let drain = match drain_kill {
        Some((done, _)) => {
            format!(", the second while they were handled ({done} of {total} with their 200)")
        }
        None => ", the second missed (all handled before it)".to_string(),
    };
    vec![Row {
        figure: format!(
            "ordered retries: kill -9 with {keys} keys parked for {park} s (`retry = [\"{park}s\"]`, each head failing its first call), {waiting} messages waiting behind each, every message a GET to a loopback recorder: calls re-done (a message with more than one 200), and each key's order"
        ),
        target: "in order, none missing; re-done reported".into(),
        latest: format!(
            "{}: **{} calls re-done** ({} messages) of {total}, **{} out of order**, {} missing; the first kill {:.0} s into the park{drain}",
            today(),
            verdict.redone_calls,
            verdict.redone_messages,
            verdict.ahead.len() + verdict.behind.len(),
            verdict.missing,
            killed_parked_at.as_secs_f64()
        ),
        status: if ordered { "met" } else { "missed" }.into(),
    }]
}
