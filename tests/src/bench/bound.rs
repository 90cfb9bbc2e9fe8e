//! The cancellation table's bound (BENCHMARKS.md, "Cancel and replace"):
//!
//! ```text
//! bench-delay cancel-bound [PENDING] [RATE] [SECONDS] [ROUNDS] [ID_BYTES]
//! ```
//!
//! Two relays side by side on one broker: one whose cancellation table holds
//! PENDING entries (ids of ID_BYTES bytes, none expiring during the run, so
//! the sweep looks at every one of them each second), one whose table is
//! empty. The benchmark writes the entries to the first relay's cancellation
//! topic before starting it, and reads from its log how long it took to load
//! them before it forwarded anything. Then both get the same schedules, RATE
//! a second each for SECONDS, delays uniform in 1-10 s, in ROUNDS rounds,
//! and the lateness at each target is compared round by round. Bytes per
//! entry are the two fresh processes' RSS apart, over PENDING.

use super::{Relay, fast_producer, quantile};
use hopper_tests::*;
use rand::{Rng, SeedableRng};
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub struct Run {
    pub pending: u64,
    pub rate: u64,
    pub seconds: u64,
    pub rounds: u64,
    pub id_bytes: usize,
}

/// The id of entry `i`: `order-00000042`, padded with `x` to `bytes`.
fn id(i: u64, bytes: usize) -> String {
    let mut id = format!("order-{i:08}");
    while id.len() < bytes {
        id.push('x');
    }
    id
}

pub async fn bound(run: Run) {
    let Run {
        pending,
        rate,
        seconds,
        rounds,
        id_bytes,
    } = run;
    println!(
        "cancel-bound: {pending} entries (ids of {id_bytes} bytes) against none; {rate} schedules/s to each relay for {seconds} s, {rounds} rounds, delays 1-10 s"
    );
    // The full relay's entries, written before it starts.
    let inbox = rand_name("bench-bound");
    let cancels = format!("{inbox}.cancels");
    create_topics_with(&[&cancels], 4).await;
    let producer = fast_producer();
    let started = Instant::now();
    let recorded_at = now_ms();
    let mut acks = Vec::new();
    for i in 0..pending {
        let id = id(i, id_bytes);
        let partition = (i % 4) as i32;
        let key = hopper::delay::entry_key(partition, &id);
        let value = format!("{partition}:{}", 1_000_000 + i);
        let mut record = FutureRecord::<[u8], str>::to(&cancels)
            .key(&key)
            .payload(&value)
            .timestamp(recorded_at)
            .headers(OwnedHeaders::new().insert(Header {
                key: "hopper-cancel-kind",
                value: Some("cancel"),
            }));
        loop {
            match producer.send_result(record) {
                Ok(ack) => {
                    acks.push(ack);
                    break;
                }
                Err((_, back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
        if acks.len() == 20_000 {
            for ack in acks.drain(..) {
                ack.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
        }
    }
    for ack in acks {
        ack.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    println!(
        "wrote {pending} entries to {cancels} in {:.1?}",
        started.elapsed()
    );
    bare_read(&cancels, pending).await;
    in_process(pending, id_bytes);

    let log_path = std::env::temp_dir().join(format!("{inbox}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let extra = format!("max_cancellations = {}\n", pending.max(1));
    let spawned = Instant::now();
    let full = Relay::start_in(inbox, &extra, Stdio::from(log)).await;
    let serving = spawned.elapsed();
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let loaded = text
        .lines()
        .filter(|l| l.contains("Cancellation table loaded."))
        .find_map(|l| {
            let entries = field(l, "entries=")?;
            let took = field(l, "took_ms=")?;
            Some((entries, took))
        });
    let _ = std::fs::remove_file(&log_path);
    match loaded {
        Some((entries, took)) => println!(
            "load at start: {entries} entries in {took} ms (the log's `took_ms`); start to the first message forwarded {:.1?}",
            serving
        ),
        None => println!(
            "load at start: no `Cancellation table loaded.` line; start to the first message forwarded {serving:.1?}"
        ),
    }
    let empty = Relay::start().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rss_full, rss_empty) = (full.rss_kib(), empty.rss_kib());
    println!(
        "RSS, fresh processes: {rss_full} KiB with {pending} entries, {rss_empty} KiB with none: {:.0} bytes per entry",
        (rss_full as f64 - rss_empty as f64) * 1024.0 / pending.max(1) as f64
    );

    let reader: StreamConsumer = client_config()
        .set("group.id", rand_name("bench-reader"))
        .set("auto.offset.reset", "latest")
        .create()
        .unwrap();
    reader
        .subscribe(&[full.target.as_str(), empty.target.as_str()])
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (mut all_full, mut all_empty) = (Vec::new(), Vec::new());
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let (mut late_full, mut late_empty) =
            lateness_round(&reader, &full, &empty, rate, seconds).await;
        late_full.sort_unstable();
        late_empty.sort_unstable();
        let (p99_full, p99_empty) = (quantile(&late_full, 0.99), quantile(&late_empty, 0.99));
        let ratio = p99_full.max(1) as f64 / p99_empty.max(1) as f64;
        ratios.push(ratio);
        println!(
            "round {round}: p99 {p99_full} ms with {pending} entries ({} delivered, {} early, max {} ms), {p99_empty} ms with none ({} delivered, {} early, max {} ms): {ratio:.2}x",
            late_full.len(),
            late_full.iter().filter(|l| **l < 0).count(),
            late_full.last().copied().unwrap_or_default(),
            late_empty.len(),
            late_empty.iter().filter(|l| **l < 0).count(),
            late_empty.last().copied().unwrap_or_default(),
        );
        all_full.extend(late_full);
        all_empty.extend(late_empty);
    }
    super::report(
        &format!("lateness with {pending} entries pending"),
        &mut all_full,
    );
    super::report("lateness with none", &mut all_empty);
    let (p99_full, p99_empty) = (quantile(&all_full, 0.99), quantile(&all_empty, 0.99));
    println!(
        "p99 with {pending} entries / with none: {p99_full} / {p99_empty} ms = {:.2}x (rounds {})",
        p99_full.max(1) as f64 / p99_empty.max(1) as f64,
        ratios
            .iter()
            .map(|r| format!("{r:.2}x"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "RSS after the run: {} KiB with {pending} entries, {} KiB with none",
        full.rss_kib(),
        empty.rss_kib()
    );
}

/// The baseline of the load at start: a plain consumer reading the same
/// topic from its beginning to its end.
async fn bare_read(topic: &str, pending: u64) {
    let consumer: StreamConsumer = client_config()
        .set("group.id", rand_name("bench-bare"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(300);
    let mut read = 0u64;
    while read < pending && Instant::now() < deadline {
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(5), consumer.recv()).await {
            read += 1;
        }
    }
    println!(
        "a plain consumer read {read} of them from the beginning in {:.1?} (group join included)",
        started.elapsed()
    );
}

/// The table alone, in this process: what taking in `pending` entries
/// costs, and how long the sweep holds the lock the forward gate takes, a
/// slice at a time, against a sweep of the whole table under one lock (as
/// before the sweep was sliced), none expiring.
fn in_process(pending: u64, id_bytes: usize) {
    use rdkafka::Timestamp;
    use rdkafka::message::OwnedMessage;
    let table = hopper::delay::CancelTable::new(
        "bench",
        Duration::from_secs(3_600),
        hopper::events::Telemetry::new(),
    )
    .bounded(pending as usize);
    let now = now_ms();
    let started = Instant::now();
    for i in 0..pending {
        let partition = (i % 4) as i32;
        let record = OwnedMessage::new(
            Some(format!("{partition}:{}", 1_000_000 + i).into_bytes()),
            Some(hopper::delay::entry_key(partition, &id(i, id_bytes))),
            "bench".into(),
            Timestamp::CreateTime(now),
            0,
            i as i64,
            Some(OwnedHeaders::new().insert(Header {
                key: "hopper-cancel-kind",
                value: Some("cancel"),
            })),
        );
        table.apply(&record);
    }
    let took = started.elapsed();
    println!(
        "in process: {} entries taken in in {took:.1?} ({:.2} us each)",
        table.len(),
        took.as_secs_f64() * 1e6 / pending.max(1) as f64
    );
    let mut slices = Vec::new();
    let started = Instant::now();
    let mut below = usize::MAX;
    while below > 0 {
        let slice = Instant::now();
        below = table.sweep_slice(now, below);
        slices.push(slice.elapsed().as_micros() as i64);
    }
    let whole = started.elapsed();
    slices.sort_unstable();
    println!(
        "in process: a sweep of {} entries, none expiring: {} slices of {} entries, the lock held p50 {} us, max {} us a slice; {whole:.1?} in all, the time one lock held the gate before",
        table.len(),
        slices.len(),
        hopper::delay::SWEEP_SLICE,
        quantile(&slices, 0.5),
        slices.last().copied().unwrap_or_default()
    );
}

/// The value of `name` (`took_ms=`) in a log line.
fn field(line: &str, name: &str) -> Option<u64> {
    let at = line.find(name)? + name.len();
    let digits: String = line[at..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// One round: the same schedules to both relays, then every delivery read
/// until both targets are quiet past the last deliver-at. Returns the
/// lateness at each target (record timestamp - deliver-at).
async fn lateness_round(
    reader: &StreamConsumer,
    full: &Relay,
    empty: &Relay,
    rate: u64,
    seconds: u64,
) -> (Vec<i64>, Vec<i64>) {
    let total = rate * seconds;
    let producer = fast_producer();
    let sides = [
        (full.inbox.clone(), full.target.clone()),
        (empty.inbox.clone(), empty.target.clone()),
    ];
    let sender = tokio::spawn(async move {
        let started = Instant::now();
        let mut rng = rand::rngs::StdRng::from_os_rng();
        let mut sent = 0u64;
        let mut acks = Vec::new();
        while sent < total {
            let allowed = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            while sent < allowed.min(total) {
                let at = (now_ms() + rng.random_range(1_000..=10_000)).to_string();
                for (inbox, target) in &sides {
                    let mut record = FutureRecord::<str, str>::to(inbox)
                        .key(&at)
                        .payload(&at)
                        .headers(
                            OwnedHeaders::new()
                                .insert(Header {
                                    key: "hopper-target",
                                    value: Some(target.as_str()),
                                })
                                .insert(Header {
                                    key: "hopper-deliver-at",
                                    value: Some(at.as_str()),
                                }),
                        );
                    loop {
                        match producer.send_result(record) {
                            Ok(ack) => {
                                acks.push(ack);
                                break;
                            }
                            Err((_, back)) => {
                                record = back;
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                        }
                    }
                }
                sent += 1;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for ack in acks {
            ack.await.unwrap().map_err(|(e, _)| e).unwrap();
        }
        producer.flush(Duration::from_secs(30)).unwrap();
    });
    let (mut late_full, mut late_empty) = (Vec::new(), Vec::new());
    let last_due = now_ms() + (seconds as i64 + 11) * 1_000;
    let deadline = Instant::now() + Duration::from_secs(seconds + 60);
    while ((late_full.len() as u64) < total || (late_empty.len() as u64) < total)
        && Instant::now() < deadline
    {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(5), reader.recv()).await else {
            if now_ms() > last_due + 5_000 {
                break;
            }
            continue;
        };
        let Some(at) = m
            .payload()
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.parse::<i64>().ok())
        else {
            continue;
        };
        let late = m.timestamp().to_millis().unwrap() - at;
        if m.topic() == full.target {
            late_full.push(late);
        } else {
            late_empty.push(late);
        }
    }
    sender.await.unwrap();
    (late_full, late_empty)
}
