//! Throughput: hopper against a bare Kafka relay, side by side in one run,
//! on the broker in `HOPPER_TEST_BROKERS` (see `cargo xtask bench`).
//!
//! ```text
//! bench-throughput relay [MESSAGES]   # bare relay vs hopper routes
//! bench-throughput storm [MESSAGES]   # route A with and without route B failing
//! ```
//!
//! Every contender reads the same preloaded topic with its own consumer
//! group, from the beginning, and is timed from its first message to its
//! last one done (handled and offset stored, or relayed and acknowledged).
//! `extra` route settings (such as the instance policy) come from the
//! `HOPPER_BENCH_ROUTE` environment variable, one `key = value` per line.

use hopper::Hopper;
use hopper_tests::*;
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let messages: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    match args.first().map(String::as_str) {
        Some("relay") => relay_vs_hopper(messages).await,
        Some("storm") => storm(messages).await,
        _ => eprintln!("usage: bench-throughput relay|storm [MESSAGES]"),
    }
}

/// Fills a new 4-partition topic with `n` copies of `payload`.
async fn preload(n: u64, payload: &str) -> String {
    let topic = rand_name("bench-in");
    create_topics(&[&topic]).await;
    let producer: FutureProducer = client_config()
        .set("linger.ms", "10")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .unwrap();
    let mut acks = Vec::new();
    for i in 0..n {
        let key = (i % 1024).to_string();
        loop {
            match producer.send_result(FutureRecord::to(&topic).key(&key).payload(payload)) {
                Ok(ack) => {
                    acks.push(ack);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
    }
    for ack in acks {
        ack.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    topic
}

/// The physical limit: consume, produce with hopper's guarantees
/// (idempotent, acks=all), store the offset when the produce is
/// acknowledged.
async fn bare_relay(input: &str, n: u64) -> f64 {
    let output = rand_name("bench-out");
    create_topics(&[&output]).await;
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
    let consumer = std::sync::Arc::new(consumer);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut started = None;
    let mut read = 0u64;
    while read < n {
        let m = consumer.recv().await.unwrap();
        started.get_or_insert_with(Instant::now);
        read += 1;
        let mut record = FutureRecord::to(&output).payload(m.payload().unwrap_or_default());
        if let Some(k) = m.key() {
            record = record.key(k);
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
        let (topic, partition, offset) = (m.topic().to_string(), m.partition(), m.offset());
        let (consumer, done_tx) = (consumer.clone(), done_tx.clone());
        tokio::spawn(async move {
            ack.await.unwrap().map_err(|(e, _)| e).unwrap();
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, partition, Offset::Offset(offset + 1))
                .unwrap();
            let _ = consumer.store_offsets(&tpl);
            let _ = done_tx.send(());
        });
    }
    for _ in 0..n {
        done_rx.recv().await.unwrap();
    }
    n as f64 / started.unwrap().elapsed().as_secs_f64()
}

/// Hopper with one route over `input`; returns messages per second.
async fn hopper_route(input: &str, handler: &str, extra: &str, n: u64) -> f64 {
    let name = rand_name("bench");
    let config = TestConfig::new(&format!(
        "[[route]]\nname = \"{name}\"\ntopics = [\"{input}\"]\nhandler = \"{}\"\nretry = [\"1s\"]\n{extra}\n",
        plugin(handler).display()
    ));
    let hopper = config.start().await;
    let rate = measure(&hopper, &name, n).await;
    hopper.stop().await;
    rate
}

/// Waits for `n` handled messages of `route`, timing first to last.
async fn measure(hopper: &Hopper, route: &str, n: u64) -> f64 {
    let handled = |h: &Hopper| -> u64 {
        h.telemetry()
            .counters()
            .iter()
            .filter(|(k, _)| {
                k.starts_with("hopper_handled_total{") && k.contains(&format!("route={route},"))
            })
            .map(|(_, v)| *v)
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    while handled(hopper) == 0 {
        assert!(Instant::now() < deadline, "route {route} handled nothing");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    let first = handled(hopper);
    while handled(hopper) < n {
        assert!(
            Instant::now() < deadline,
            "route {route} is stuck at {}",
            handled(hopper)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (n - first) as f64 / started.elapsed().as_secs_f64()
}

fn route_extra() -> String {
    std::env::var("HOPPER_BENCH_ROUTE").unwrap_or_default()
}

async fn relay_vs_hopper(n: u64) {
    println!("throughput: {n} messages per contender, 4 partitions");
    let ok = preload(n, "ok").await;
    let json = preload(n, r#"{"order_id":"o-1","status":"paid"}"#).await;
    // The bare relay runs before and after hopper, so neither side gets the
    // broker's warm-up alone; the ratio uses the better of its two runs.
    let before = bare_relay(&ok, n).await;
    println!("bare relay (consume -> produce, acks=all), first run: {before:.0} msg/s");
    let extra = route_extra();
    let noop = hopper_route(&ok, "scripted", &extra, n).await;
    let after = bare_relay(&ok, n).await;
    println!("bare relay, second run: {after:.0} msg/s");
    let bare = before.max(after);
    println!(
        "hopper, no-op handler ({}): {noop:.0} msg/s = {:.2}x",
        if extra.is_empty() {
            "default policy".into()
        } else {
            extra.replace('\n', "; ")
        },
        noop / bare
    );
    // Like for like with the bare relay: every message is produced onward
    // (to the route's dead-letter topic, acks=all) before its offset is stored.
    let fatal = preload(n, "fatal").await;
    let hop = hopper_route(&fatal, "scripted", &extra, n).await;
    println!(
        "hopper, handler says fatal (consume -> handler -> produce to DLQ): {hop:.0} msg/s = {:.2}x",
        hop / bare
    );
    let realistic = hopper_route(&json, "order_timeout", &extra, n).await;
    println!(
        "hopper, order-timeout handler (parses JSON): {realistic:.0} msg/s = {:.2}x",
        realistic / bare
    );
}

async fn storm(n: u64) {
    println!(
        "retry storm: route A handles {n} messages, alone and beside route B failing 100% retryable"
    );
    let a_input = preload(n, "ok").await;
    let b_input = preload(n, "retry").await;
    let alone = hopper_route(&a_input, "scripted", &route_extra(), n).await;
    println!("route A alone: {alone:.0} msg/s");

    let (a, b) = (rand_name("bench-a"), rand_name("bench-b"));
    let scripted = plugin("scripted");
    let config = TestConfig::new(&format!(
        "[[route]]\nname = \"{a}\"\ntopics = [\"{a_input}\"]\nhandler = \"{}\"\n{}\n\n[[route]]\nname = \"{b}\"\ntopics = [\"{b_input}\"]\nhandler = \"{}\"\nretry = [\"1s\"]\nmax_attempts = 1000\n",
        scripted.display(),
        route_extra(),
        scripted.display()
    ));
    let hopper = config.start().await;
    let beside = measure(&hopper, &a, n).await;
    let storm_handled: u64 = hopper
        .telemetry()
        .counters()
        .iter()
        .filter(|(k, _)| {
            k.contains(&format!("route={b},")) && k.starts_with("hopper_handled_total{")
        })
        .map(|(_, v)| *v)
        .sum();
    hopper.stop().await;
    println!(
        "route A beside the storm: {beside:.0} msg/s = {:.2}x (route B failed {storm_handled} deliveries meanwhile)",
        beside / alone
    );
}
