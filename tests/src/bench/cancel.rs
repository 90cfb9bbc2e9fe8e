//! Cancel and replace figures of the delay relay (BENCHMARKS.md):
//!
//! ```text
//! bench-delay cancel [RATE] [SECONDS]        # lateness with 20% cancelled, 10% replaced
//! bench-delay cancel-memory [PENDING]        # RSS with PENDING cancellations pending
//! bench-delay cancel-reach [RATE] [SECONDS]  # cancel ack -> every relay knows it
//! ```

use super::{Relay, fast_producer, report};
use hopper_tests::*;
use rand::{Rng, SeedableRng};
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What each message of the lateness run is: its payload is
/// `<deliver-at>:<kind>`.
const PLAIN: &str = "P";
const CANCELLED: &str = "C";
const REPLACED_OLD: &str = "O";
const REPLACED_NEW: &str = "N";

fn record<'a>(
    inbox: &'a str,
    id: &'a str,
    payload: &'a str,
    headers: OwnedHeaders,
) -> FutureRecord<'a, str, str> {
    FutureRecord::to(inbox)
        .key(id)
        .payload(payload)
        .headers(headers)
}

fn headers(pairs: &[(&str, &str)]) -> OwnedHeaders {
    pairs.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
        h.insert(Header {
            key: k,
            value: Some(*v),
        })
    })
}

/// Lateness at `rate` schedules a second for `seconds`, delays uniform in
/// 2-60 s; of them 20% are cancelled and 10% replaced (to a new time uniform
/// in 2-60 s from now, earlier or later), right after being scheduled.
pub async fn lateness(rate: u64, seconds: u64) {
    let relay = Relay::start().await;
    let total = rate * seconds;
    println!(
        "cancel: {total} schedules at {rate}/s for {seconds}s, delays uniform in 2-60 s, 20% cancelled, 10% replaced"
    );
    let reader: StreamConsumer = client_config()
        .set("group.id", rand_name("bench-reader"))
        .set("auto.offset.reset", "latest")
        .create()
        .unwrap();
    reader.subscribe(&[relay.target.as_str()]).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let producer = fast_producer();
    let (inbox, target) = (relay.inbox.clone(), relay.target.clone());
    let sender = tokio::spawn(async move {
        let started = Instant::now();
        let mut rng = rand::rngs::StdRng::from_os_rng();
        let (mut sent, mut expected) = (0u64, 0u64);
        let mut acks = Vec::new();
        while sent < total {
            let allowed = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            while sent < allowed.min(total) {
                let id = format!("m-{sent}");
                let roll = rng.random_range(0..10);
                let at = now_ms() + rng.random_range(2_000..=60_000);
                let kind = match roll {
                    0 | 1 => CANCELLED,
                    2 => REPLACED_OLD,
                    _ => PLAIN,
                };
                let at_text = at.to_string();
                let payload = format!("{at}:{kind}");
                let schedule = headers(&[
                    ("hopper-target", &target),
                    ("hopper-deliver-at", &at_text),
                    ("hopper-id", &id),
                ]);
                let mut batch = vec![record(&inbox, &id, &payload, schedule)];
                let new_at = (now_ms() + rng.random_range(2_000..=60_000)).to_string();
                let new_payload = format!("{new_at}:{REPLACED_NEW}");
                match kind {
                    CANCELLED => batch.push(record(
                        &inbox,
                        &id,
                        "",
                        headers(&[("hopper-cancel", "true"), ("hopper-id", &id)]),
                    )),
                    REPLACED_OLD => batch.push(record(
                        &inbox,
                        &id,
                        &new_payload,
                        headers(&[
                            ("hopper-target", &target),
                            ("hopper-deliver-at", &new_at),
                            ("hopper-id", &id),
                            ("hopper-replace", "true"),
                        ]),
                    )),
                    _ => {}
                }
                if kind != CANCELLED {
                    expected += 1;
                }
                for record in batch {
                    let mut record = record;
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
        let achieved = sent as f64 / started.elapsed().as_secs_f64();
        for ack in acks {
            ack.await.unwrap().map_err(|(e, _)| e).unwrap();
        }
        producer.flush(Duration::from_secs(30)).unwrap();
        (achieved, expected)
    });
    let mut late = Vec::new();
    let mut copies: HashMap<String, u32> = HashMap::new();
    let (mut cancelled, mut old) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(seconds + 60 + 60);
    // Reads until the target is quiet for 5 s after the last deliver-at.
    let last_due = now_ms() + (seconds as i64 + 62) * 1_000;
    while Instant::now() < deadline {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(5), reader.recv()).await else {
            if now_ms() > last_due {
                break;
            }
            continue;
        };
        let Some((at, kind)) = m
            .payload()
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.split_once(':'))
            .and_then(|(at, kind)| Some((at.parse::<i64>().ok()?, kind.to_string())))
        else {
            continue;
        };
        match kind.as_str() {
            CANCELLED => cancelled += 1,
            REPLACED_OLD => old += 1,
            _ => {}
        }
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        *copies.entry(key).or_default() += 1;
        late.push(m.timestamp().to_millis().unwrap() - at);
    }
    let (achieved, expected) = sender.await.unwrap();
    let twice = copies.values().filter(|c| **c > 1).count();
    println!(
        "offered rate achieved: {achieved:.0} schedules/s; delivered {} of {expected} expected; cancelled delivered: {cancelled}; replaced (old time) delivered: {old}; ids delivered more than once: {twice}",
        late.len()
    );
    report(
        "lateness at the target (record timestamp - deliver-at)",
        &mut late,
    );
}

/// RSS of a relay holding `pending` cancellations (ids `order-00000042`),
/// after it took them in, and after a restart that reads them back.
pub async fn memory(pending: u64) {
    let (admin, relay) = Relay::start_with_admin().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = relay.rss_kib();
    println!("cancel-memory: relay RSS with 0 cancellations: {idle} KiB");
    let producer = fast_producer();
    let started = Instant::now();
    let mut acks = Vec::new();
    for i in 0..pending {
        let id = format!("order-{i:08}");
        let mut record = record(
            &relay.inbox,
            &id,
            "",
            headers(&[("hopper-cancel", "true"), ("hopper-id", &id)]),
        );
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
        if acks.len() == 10_000 {
            for ack in acks.drain(..) {
                ack.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
        }
    }
    for ack in acks {
        ack.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    println!("produced {pending} cancels in {:.1?}", started.elapsed());
    let held = wait_for_entries(admin, pending).await;
    println!("table holds {held} entries after {:.1?}", started.elapsed());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let loaded = relay.rss_kib();
    let per = |kib: u64| (kib as f64 - idle as f64) * 1024.0 / pending as f64;
    println!(
        "relay RSS: {idle} KiB idle, {loaded} KiB with {pending} pending ({:.0} bytes per cancellation)",
        per(loaded)
    );
    let relay = relay.restart();
    let held = wait_for_entries(admin, pending).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reloaded = relay.rss_kib();
    println!(
        "restarted relay, table read back ({held} entries): {reloaded} KiB ({:.0} bytes per cancellation over the idle {idle} KiB)",
        per(reloaded)
    );
}

/// Polls the relay's `/metrics` until its cancellation table holds `want`.
async fn wait_for_entries(admin: std::net::SocketAddr, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        // A restarted relay serves once its table is read back.
        if tokio::net::TcpStream::connect(admin).await.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let (_, body) = http(admin, "GET", "/metrics", None, None).await;
        let held = body
            .lines()
            .find_map(|l| l.strip_prefix("hopper_delay_cancellations "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
        if held >= want || Instant::now() > deadline {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The time from a cancel's acknowledgement to the moment each of three
/// relay processes (one group, in this process) has it in its table.
pub async fn reach(rate: u64, seconds: u64) {
    let inbox = rand_name("bench-reach");
    let target = rand_name("bench-target");
    create_topics(&[&target]).await;
    let config = ConfigBuilder::new()
        .partitions(4)
        .delay(DelayTable::named(&inbox))
        .write();
    let mut relays = Vec::new();
    for _ in 0..3 {
        relays.push(config.start().await);
    }
    let known: std::sync::Arc<std::sync::Mutex<HashMap<String, Vec<i64>>>> = Default::default();
    for relay in &relays {
        let mut events = relay.events();
        let known = known.clone();
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(hopper::events::Event::CancellationKnown(k)) => {
                        known
                            .lock()
                            .unwrap()
                            .entry(k.id)
                            .or_default()
                            .push(now_ms());
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        eprintln!("  an observer lagged by {n} events");
                    }
                    Err(_) => return,
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let producer: FutureProducer = producer();
    let total = rate * seconds;
    println!("cancel-reach: {total} cancels at {rate}/s, 3 relay processes in one group");
    let started = Instant::now();
    // Each cancel in a task of its own, so its acknowledgement is timed
    // when it arrives.
    let mut sending = Vec::with_capacity(total as usize);
    for i in 0..total {
        let due = started + Duration::from_secs_f64(i as f64 / rate as f64);
        tokio::time::sleep_until(due.into()).await;
        let id = format!("reach-{i}");
        let inbox = inbox.clone();
        let producer = producer.clone();
        sending.push(tokio::spawn(async move {
            let sent = hopper::delay::cancel(&producer, &inbox, &id).await;
            sent.expect("cancel sent");
            (id, now_ms())
        }));
    }
    let mut acked: HashMap<String, i64> = HashMap::new();
    for sent in sending {
        let (id, at) = sent.await.unwrap();
        acked.insert(id, at);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut reach = loop {
        let complete: Vec<i64> = {
            let known = known.lock().unwrap();
            acked
                .iter()
                .filter_map(|(id, at)| {
                    let seen = known.get(id)?;
                    (seen.len() >= 3).then(|| seen.iter().max().unwrap() - at)
                })
                .collect()
        };
        if complete.len() == acked.len() || Instant::now() > deadline {
            break complete;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "{} of {} cancels known to all 3 relays",
        reach.len(),
        acked.len()
    );
    report(
        "cancel acknowledged -> known to every relay (ms)",
        &mut reach,
    );
    for relay in relays {
        relay.stop().await;
    }
}
