//! Dead-letter groups (docs/operations.md, "Groups" and "Live groups"):
//! how fast the CLI groups a cold DLQ against a plain consumer reading it,
//! and what the admin server's live groups cost in memory and answer time.
//!
//! ```text
//! bench-dlq [--rounds N] [--records N] [--only cold,live]
//! ```
//!
//! On the broker in `HOPPER_TEST_BROKERS` (see `cargo xtask bench`).
//!
//! - **cold**: RECORDS (1,000,000) dead letters as hopper writes them
//!   (route, reason, a last error of one of 1,000 causes, failure time,
//!   handler version, a 100-byte payload) in a 2-partition DLQ of a route.
//!   Each of ROUNDS (3) rounds, in this order: a plain consumer (rdkafka,
//!   by assignment, every record to the high watermarks, nothing parsed),
//!   then `hopper dlq groups --json` (the binary, its start included).
//!   Records per second of each, the round's ratio, and medians. Then the
//!   admin server's reader ([`LiveGroups::follow`]) catching up on the same
//!   topic, in records per second.
//! - **live**: in this process, no broker: a live tally takes RECORDS dead
//!   letters over 1,000 causes, then a fresh one over 100,000 causes (past
//!   the cap of 10,000 groups). For each: the resident set before and
//!   after, and the median time of 100 answers of the groups view (the 100
//!   most recent groups, every route).
//!
//! The summary at the end is rows for BENCHMARKS.md's "All figures" table.

use hopper::dlq::DlqSummary;
use hopper::dlq::live::LiveGroups;
use hopper::kafka::Cluster;
use hopper_tests::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The allocator of the `hopper` binary, so memory is measured as it runs.
#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

const TIME_LIMIT: Duration = Duration::from_secs(600);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| v.replace(['_', ','], "").parse().expect("a number"))
            .unwrap_or(default)
    };
    let rounds = value("--rounds", 3) as usize;
    let records = value("--records", 1_000_000);
    let only: Vec<String> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map_or_else(
            || vec!["live".to_string(), "cold".to_string()],
            |v| v.split(',').map(str::to_string).collect(),
        );
    let mut rows = Vec::new();
    // Memory first, while this process has allocated little.
    if only.iter().any(|o| o == "live") {
        rows.extend(live(records));
    }
    if only.iter().any(|o| o == "cold") {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rows.extend(runtime.block_on(cold(records, rounds)));
    }
    println!("\n-- rows for BENCHMARKS.md");
    for row in rows {
        println!("{row}");
    }
}

/// The error of dead letter `i` of `causes` causes: the cause is a word of
/// letters (digits would be taken out), the order number varies.
fn error(i: u64, causes: u64) -> String {
    let word: String = format!("{:x}", i % causes)
        .chars()
        .map(|c| (b'g' + c.to_digit(16).unwrap() as u8) as char)
        .collect();
    format!("order o-{i} failed: {word} is not a known state")
}

fn summary(i: u64, causes: u64, now: i64) -> DlqSummary {
    let error = error(i, causes);
    let cause = hopper::dlq::fingerprint::cause(&error);
    let failed_at = now - 86_400_000 + (i as i64 % 86_400_000);
    DlqSummary {
        at: hopper::dlq::RecordRef {
            topic: "orders.dlq".into(),
            partition: (i % 2) as i32,
            offset: (i / 2) as i64,
        },
        timestamp: Some(failed_at),
        failed_at: Some(failed_at),
        id: Some(format!("id-{i}")),
        route: Some("orders".into()),
        reason: Some(hopper::headers::Reason::Fatal),
        group: hopper::dlq::fingerprint::group("orders", "FATAL", &cause),
        cause,
        error: Some(error),
        attempt: Some(1),
        handler_version: Some("861066833856".into()),
        key: Some(format!("o-{i}")),
        payload_bytes: 100,
        replays_before: 0,
        replayed: 0,
    }
}

fn live(records: u64) -> Vec<String> {
    let mut rows = Vec::new();
    let now = hopper::clock::now_ms();
    for causes in [1_000, 100_000] {
        println!(
            "-- live, in process: {} dead letters over {} causes",
            thousands(records),
            thousands(causes)
        );
        let before = rss_kib();
        let tally = LiveGroups::new();
        let started = Instant::now();
        for i in 0..records {
            tally.add(&summary(i, causes, now));
        }
        let took = started.elapsed();
        let after = rss_kib();
        let mut answers: Vec<f64> = (0..100)
            .map(|_| {
                let started = Instant::now();
                let page = tally.page(None, 100);
                assert_eq!(page.groups.len(), 100.min(page.group_count));
                started.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        let page = tally.page(None, 0);
        answers.sort_by(f64::total_cmp);
        let mib = after.saturating_sub(before) as f64 / 1024.0;
        println!(
            "   {} groups, {} in no group; counted at {:.0}/s; resident set +{mib:.1} MiB; groups view answered in {:.2} ms (median of 100)",
            thousands(page.group_count as u64),
            thousands(page.other as u64),
            records as f64 / took.as_secs_f64(),
            answers[50]
        );
        rows.push(format!(
            "| the admin server's live groups: {} dead letters over {} causes ({} groups kept, {} as `other`) | memory; the groups view's answer | ≤ 50 ms | +{mib:.1} MiB resident; {:.2} ms (median of 100 answers of the 100 most recent groups) | `cargo xtask bench dlq --only live` |",
            thousands(records),
            thousands(causes),
            thousands(page.group_count as u64),
            thousands(page.other as u64),
            answers[50]
        ));
        drop(tally);
    }
    rows
}

async fn cold(records: u64, rounds: usize) -> Vec<String> {
    let route = RouteTable::new(&plugin("noop")).test_route();
    create_topics_with(&[&route.dlq], 2).await;
    println!(
        "-- cold: {} dead letters into `{}`",
        thousands(records),
        route.dlq
    );
    let started = Instant::now();
    fill(&route.name, &route.dlq, records).await;
    println!("   produced in {:.1} s", started.elapsed().as_secs_f64());
    let config = route.config_path.to_str().unwrap().to_string();
    let (mut plain, mut grouped, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let started = Instant::now();
        let read = read_plain(&route.dlq);
        let plain_rate = read as f64 / started.elapsed().as_secs_f64();
        assert_eq!(read, records);
        let started = Instant::now();
        let out = std::process::Command::new(hopper_bin())
            .args(["dlq", "groups", "--config", &config, "--json"])
            .env("HOPPER_BROKERS", brokers())
            .output()
            .unwrap();
        let took = started.elapsed();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let page: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(page["scanned"], records);
        assert_eq!(page["groups"].as_array().unwrap().len(), 1_000);
        let rate = records as f64 / took.as_secs_f64();
        println!(
            "   round {round}: plain consumer {:.0}/s, hopper dlq groups {:.0}/s: {:.2}x",
            plain_rate,
            rate,
            rate / plain_rate
        );
        plain.push(plain_rate);
        grouped.push(rate);
        ratios.push(rate / plain_rate);
    }
    // The admin server's reader on the same topic.
    let cluster = Cluster::new(brokers(), Default::default());
    let tally = LiveGroups::new();
    let stop = tokio_util::sync::CancellationToken::new();
    let started = Instant::now();
    let readers = tally.follow(&cluster, [route.dlq.clone()], &stop);
    while !tally.page(None, 0).caught_up || tally.page(None, 0).total < records as usize {
        assert!(
            started.elapsed() < TIME_LIMIT,
            "the live reader did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let live_rate = records as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    for reader in readers {
        reader.await.unwrap();
    }
    println!("   the admin server's reader caught up at {live_rate:.0}/s");
    let per_round = ratios
        .iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(", ");
    vec![format!(
        "| grouping a cold DLQ of {} dead letters (1,000 causes, 2 partitions) from the CLI: `hopper dlq groups --json` (process start included) against a plain consumer reading the same topic | records/s, ratio | ≥ 0.8× | {:.0}/s against {:.0}/s: **{:.2}×** (medians of {rounds} rounds; per round {per_round}); the admin server's reader catches up at {live_rate:.0}/s | `cargo xtask bench dlq --only cold` |",
        thousands(records),
        median(&grouped),
        median(&plain),
        median(&ratios),
    )]
}

/// Produces `records` dead letters of route `route` to `topic`, as hopper
/// writes them, each acknowledged.
async fn fill(route: &str, topic: &str, records: u64) {
    let producer: FutureProducer = client_config()
        .set("linger.ms", "10")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .unwrap();
    let payload = vec![b'p'; 100];
    let now = hopper::clock::now_ms();
    let mut acks = Vec::with_capacity(records as usize);
    for i in 0..records {
        let (key, id) = (format!("o-{i}"), format!("id-{i}"));
        let error = error(i, 1_000);
        let failed_at = (now - 86_400_000 + (i as i64 % 86_400_000)).to_string();
        fn text<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
            Header {
                key,
                value: Some(value),
            }
        }
        let headers = OwnedHeaders::new_with_capacity(7)
            .insert(text("hopper-id", &id))
            .insert(text("hopper-route", route))
            .insert(text("hopper-reason", "FATAL"))
            .insert(text("hopper-last-error", &error))
            .insert(text("hopper-last-failure-at", &failed_at))
            .insert(text("hopper-attempt", "1"))
            .insert(text("hopper-handler-version", "861066833856"));
        let mut record = FutureRecord::to(topic)
            .key(&key)
            .payload(&payload)
            .headers(headers);
        loop {
            match producer.send_result(record) {
                Ok(ack) => {
                    acks.push(ack);
                    break;
                }
                Err((_, back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }
    }
    for ack in acks {
        ack.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Reads every record of `topic` to its high watermarks as a plain
/// consumer does: by assignment, nothing parsed. Returns the count.
fn read_plain(topic: &str) -> u64 {
    let mut config = client_config();
    config
        .set("group.id", "bench-dlq-plain")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    // Properties to try on the plain reader: `key=value,key=value`.
    for pair in std::env::var("BENCH_DLQ_PLAIN")
        .unwrap_or_default()
        .split(',')
    {
        if let Some((key, value)) = pair.split_once('=') {
            config.set(key, value);
        }
    }
    let consumer: BaseConsumer = config.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    let mut ends = HashMap::new();
    for p in 0..2 {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .unwrap();
        if high > 0 {
            ends.insert(p, high);
        }
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let (started, mut read) = (Instant::now(), 0);
    while !ends.is_empty() {
        assert!(
            started.elapsed() < TIME_LIMIT,
            "the plain read took too long"
        );
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.unwrap();
        use rdkafka::Message;
        read += 1;
        if ends
            .get(&m.partition())
            .is_some_and(|end| m.offset() + 1 >= *end)
        {
            ends.remove(&m.partition());
        }
    }
    read
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
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
