//! Delay relay benchmark: lateness at a steady rate, and memory with a large
//! backlog pending. Runs `hopper run` as its own process against the broker
//! in `HOPPER_TEST_BROKERS` (see `cargo xtask bench`).
//!
//! ```text
//! bench-delay lateness [RATE] [SECONDS]   # delays uniform in 1-60 s
//! bench-delay memory [PENDING]
//! bench-delay cancel [RATE] [SECONDS]        # 20% cancelled, 10% replaced
//! bench-delay cancel-memory [PENDING]        # cancellations pending
//! bench-delay cancel-reach [RATE] [SECONDS]  # cancel ack -> every relay
//! bench-delay cancel-bound [PENDING] [RATE] [SECONDS] [ROUNDS] [ID_BYTES]
//!                                            # PENDING entries against none
//! ```
//!
//! Lateness is measured on the forwarded record's timestamp, which hopper
//! sets when it produces the record to the target, against the deliver-at
//! the benchmark asked for (carried in the payload). End-to-end figures add
//! the benchmark consumer's own fetch latency, and are also given by fifth
//! of the deliveries, so that a tail growing as the run goes on shows.
//!
//! `BENCH_RELAY_EXTRA` is appended to the lateness relay's config, to try a
//! setting (`[kafka.properties]` with `"linger.ms" = "20"`, for example)
//! against the defaults in one sitting.

use hopper_tests::*;
use rand::{Rng, SeedableRng};
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../bench/bound.rs"]
mod bound;
#[path = "../bench/cancel.rs"]
mod cancel;

/// The allocator of the `hopper` binary, so both sides are measured alike.
#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

#[tokio::main]
async fn main() {
    hopper::tune_allocator();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("lateness") => {
            let rate: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5_000);
            let seconds: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
            lateness(rate, seconds).await;
        }
        Some("memory") => {
            let pending: u64 = args
                .get(1)
                .and_then(|a| a.parse().ok())
                .unwrap_or(1_000_000);
            memory(pending).await;
        }
        Some("cancel") => {
            let rate: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5_000);
            let seconds: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
            cancel::lateness(rate, seconds).await;
        }
        Some("cancel-memory") => {
            let pending: u64 = args
                .get(1)
                .and_then(|a| a.parse().ok())
                .unwrap_or(1_000_000);
            cancel::memory(pending).await;
        }
        Some("cancel-reach") => {
            let rate: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200);
            let seconds: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10);
            cancel::reach(rate, seconds).await;
        }
        Some("cancel-bound") => {
            let arg = |i: usize, default: u64| {
                args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
            };
            bound::bound(bound::Run {
                pending: arg(1, 1_000_000),
                rate: arg(2, 1_000),
                seconds: arg(3, 15),
                rounds: arg(4, 3),
                id_bytes: arg(5, 14) as usize,
            })
            .await;
        }
        _ => eprintln!(
            "usage: bench-delay lateness [RATE] [SECONDS] | memory [PENDING] | cancel [RATE] [SECONDS] | cancel-memory [PENDING] | cancel-reach [RATE] [SECONDS] | cancel-bound [PENDING] [RATE] [SECONDS] [ROUNDS] [ID_BYTES]"
        ),
    }
}

struct Relay {
    child: Child,
    inbox: String,
    target: String,
    _config: TestConfig,
}

impl Relay {
    async fn start() -> Relay {
        Self::start_with("").await
    }

    /// A relay whose admin server (with `/metrics`) listens on a free
    /// loopback port.
    async fn start_with_admin() -> (std::net::SocketAddr, Relay) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let extra = format!("\n[admin]\nlisten = \"{addr}\"\nmetrics = true\n");
        (addr, Self::start_with(&extra).await)
    }

    /// Kills the relay and starts it again on the same config.
    fn restart(mut self) -> Relay {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Command::new(hopper_bin())
            .args(["run", "--config"])
            .arg(&self._config.path)
            .env("HOPPER_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .expect("hopper runs");
        self
    }

    async fn start_with(extra: &str) -> Relay {
        Self::start_in(rand_name("bench-delay"), extra, Stdio::inherit()).await
    }

    /// A relay on the inbox `inbox`, its standard error to `stderr`.
    async fn start_in(inbox: String, extra: &str, stderr: Stdio) -> Relay {
        let target = rand_name("bench-target");
        let config = TestConfig::new(&format!(
            "[delay]\ninbox = \"{inbox}\"\ngroup = \"{inbox}\"\n{extra}"
        ));
        // Four partitions everywhere: the relay runs a worker per partition.
        let text = std::fs::read_to_string(&config.path)
            .unwrap()
            .replace("partitions = 2", "partitions = 4");
        std::fs::write(&config.path, text).unwrap();
        create_topics(&[&target]).await;
        let child = Command::new(hopper_bin())
            .args(["run", "--config"])
            .arg(&config.path)
            .env("HOPPER_LOG", "error,hopper::delay::table=info")
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("hopper runs");
        let relay = Relay {
            child,
            inbox,
            target,
            _config: config,
        };
        // Ready once a message with no delay comes through.
        let probe = hopper::delay::DelayedMessage {
            target: relay.target.clone(),
            delay: Some(Duration::ZERO),
            payload: Some(b"probe".to_vec()),
            ..Default::default()
        };
        probe
            .send(&producer(), &relay.inbox)
            .await
            .expect("probe sent");
        consume(&relay.target, 1, Duration::from_secs(60)).await;
        relay
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fast_producer() -> FutureProducer {
    client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap()
}

async fn lateness(rate: u64, seconds: u64) {
    let relay = Relay::start_with(&std::env::var("BENCH_RELAY_EXTRA").unwrap_or_default()).await;
    let total = rate * seconds;
    println!("lateness: {total} messages at {rate}/s for {seconds}s, delays uniform in 1-60 s");
    // The end-to-end figure is what a consumer of the target reads, with a
    // fetch that waits at most 10 ms for data (librdkafka's default is
    // 500 ms, which the consumer's own fetch then adds).
    let reader: StreamConsumer = client_config()
        .set("group.id", rand_name("bench-reader"))
        .set("auto.offset.reset", "latest")
        .set("fetch.wait.max.ms", "10")
        .create()
        .unwrap();
    reader.subscribe(&[relay.target.as_str()]).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;

    let producer = fast_producer();
    let inbox = relay.inbox.clone();
    let target = relay.target.clone();
    let sender = tokio::spawn(async move {
        let started = Instant::now();
        let mut rng = rand::rngs::StdRng::from_os_rng();
        let mut sent = 0u64;
        let mut acks = Vec::with_capacity(total as usize);
        while sent < total {
            let allowed = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            while sent < allowed.min(total) {
                let at = now_ms() + rng.random_range(1_000..=60_000);
                let at_text = at.to_string();
                let record = FutureRecord::<str, str>::to(&inbox)
                    .key(&at_text)
                    .payload(&at_text)
                    .headers(
                        rdkafka::message::OwnedHeaders::new()
                            .insert(rdkafka::message::Header {
                                key: "hopper-target",
                                value: Some(target.as_str()),
                            })
                            .insert(rdkafka::message::Header {
                                key: "hopper-deliver-at",
                                value: Some(at_text.as_str()),
                            }),
                    );
                match producer.send_result(record) {
                    Ok(ack) => {
                        acks.push(ack);
                        sent += 1;
                    }
                    Err(_) => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let achieved = sent as f64 / started.elapsed().as_secs_f64();
        for ack in acks {
            ack.await.unwrap().map_err(|(e, _)| e).unwrap();
        }
        producer.flush(Duration::from_secs(30)).unwrap();
        achieved
    });

    let mut relay_late = Vec::with_capacity(total as usize);
    let mut e2e_late = Vec::with_capacity(total as usize);
    let deadline = Instant::now() + Duration::from_secs(seconds + 60 + 60);
    while (relay_late.len() as u64) < total && Instant::now() < deadline {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(5), reader.recv()).await else {
            continue;
        };
        let received = now_ms();
        let Some(at) = m
            .payload()
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.parse::<i64>().ok())
        else {
            continue;
        };
        relay_late.push(m.timestamp().to_millis().unwrap() - at);
        e2e_late.push(received - at);
        if relay_late.len() % 20_000 == 0 {
            eprintln!("  {} of {total} delivered", relay_late.len());
        }
    }
    let achieved = sender.await.unwrap();
    println!(
        "offered rate achieved: {achieved:.0} msg/s; delivered {} of {total}",
        relay_late.len()
    );
    report(
        "lateness at the target (record timestamp - deliver-at)",
        &mut relay_late,
    );
    // The tail by fifth of the run, in the order received, to show whether
    // it grows as the topics fill.
    let fifth = e2e_late.len().div_ceil(5).max(1);
    let tails: Vec<String> = e2e_late
        .chunks(fifth)
        .map(|chunk| {
            let mut chunk = chunk.to_vec();
            chunk.sort_unstable();
            format!("{} ms", quantile(&chunk, 0.99))
        })
        .collect();
    report(
        "end to end (benchmark consumer receive - deliver-at, fetch.wait.max.ms = 10)",
        &mut e2e_late,
    );
    println!(
        "end to end p99 by fifth of the deliveries: {}",
        tails.join(", ")
    );
}

/// The `q` quantile of `sorted`, which is sorted and not empty.
fn quantile(sorted: &[i64], q: f64) -> i64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

fn report(what: &str, samples: &mut [i64]) {
    samples.sort_unstable();
    let early = samples.iter().filter(|l| **l < 0).count();
    let pick = |q: f64| quantile(samples, q);
    println!(
        "{what}: n={} early={early} p50={} ms p99={} ms p99.9={} ms max={} ms",
        samples.len(),
        pick(0.50),
        pick(0.99),
        pick(0.999),
        samples.last().unwrap()
    );
}

async fn memory(pending: u64) {
    let relay = Relay::start().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = relay.rss_kib();
    println!("memory: relay RSS with 0 pending: {} KiB", idle);
    let producer = fast_producer();
    let at = (now_ms() + 2 * 3600 * 1000).to_string();
    let payload = "x".repeat(100);
    let started = Instant::now();
    let mut acks = Vec::new();
    for i in 0..pending {
        let key = i.to_string();
        loop {
            let record = FutureRecord::<str, str>::to(&relay.inbox)
                .key(&key)
                .payload(&payload)
                .headers(
                    rdkafka::message::OwnedHeaders::new()
                        .insert(rdkafka::message::Header {
                            key: "hopper-target",
                            value: Some(relay.target.as_str()),
                        })
                        .insert(rdkafka::message::Header {
                            key: "hopper-deliver-at",
                            value: Some(at.as_str()),
                        }),
                );
            match producer.send_result(record) {
                Ok(ack) => {
                    acks.push(ack);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        if acks.len() == 10_000 {
            for ack in acks.drain(..) {
                ack.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
        }
        if (i + 1) % 200_000 == 0 {
            eprintln!("  produced {} of {pending}", i + 1);
        }
    }
    for ack in acks {
        ack.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    println!("produced {pending} in {:.1?}", started.elapsed());
    // Pending means: taken from the inbox into the 1h tier, waiting there.
    let tier = format!("{}.1h", relay.inbox);
    let watcher: StreamConsumer = client_config().create().unwrap();
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut peak = idle;
    loop {
        let mut in_tier = 0;
        for p in 0..4 {
            if let Ok((low, high)) = watcher.fetch_watermarks(&tier, p, Duration::from_secs(10)) {
                in_tier += high - low;
            }
        }
        peak = peak.max(relay.rss_kib());
        if in_tier as u64 >= pending || Instant::now() > deadline {
            println!(
                "{in_tier} messages pending in {tier} after {:.1?}",
                started.elapsed()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let loaded = relay.rss_kib();
    println!(
        "relay RSS: {idle} KiB idle, {loaded} KiB with {pending} pending (growth {} KiB = {:.1} MiB; peak while moving {} KiB)",
        loaded as i64 - idle as i64,
        (loaded as f64 - idle as f64) / 1024.0,
        peak
    );
    // A fresh process holding the same backlog: what pending messages cost,
    // without the allocator's memory from moving them.
    let mut relay = relay;
    let _ = relay.child.kill();
    let _ = relay.child.wait();
    relay.child = Command::new(hopper_bin())
        .args(["run", "--config"])
        .arg(&relay._config.path)
        .env("HOPPER_LOG", "error")
        .stdin(Stdio::null())
        .spawn()
        .expect("hopper runs");
    tokio::time::sleep(Duration::from_secs(20)).await;
    println!(
        "restarted relay RSS with {pending} pending: {} KiB (vs {idle} KiB idle before the backlog)",
        relay.rss_kib()
    );
}
