//! Cancelling and replacing delayed messages by id, against a real broker,
//! counting at the target: a cancel well before the due time, a replace to
//! an earlier and to a later time, the bad combinations, a kill -9 of the
//! relay between the cancel and the due time, three relay processes in one
//! group, cancels for unknown ids and after delivery, and a storm of them.

use hopper::events::{self, Event};
use hopper::hop;
use hopper::metrics::series;
use hopper::types::CancelKind;
use hopper_tests::*;
use rdkafka::Message;
use rdkafka::consumer::Consumer as _;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// A relay config on topics of `partitions` partitions with its own inbox,
/// tiers of 1s, 2s and 4s, and what `more` adds to the relay.
fn relay(partitions: i32, more: impl FnOnce(DelayTable) -> DelayTable) -> (TestConfig, String) {
    relay_in(ConfigBuilder::new().partitions(partitions), more)
}

/// [`relay`], and a target topic made for it: the config, the inbox and
/// the target.
async fn relay_to_target(
    partitions: i32,
    more: impl FnOnce(DelayTable) -> DelayTable,
) -> (TestConfig, String, String) {
    let (config, inbox) = relay(partitions, more);
    let target = rand_name("target");
    create_topics(&[&target]).await;
    (config, inbox, target)
}

/// [`relay`], in `config`.
fn relay_in(
    config: ConfigBuilder,
    more: impl FnOnce(DelayTable) -> DelayTable,
) -> (TestConfig, String) {
    let name = rand_name("cancel");
    let delay = more(DelayTable::named(&name).tiers(&["1s", "2s", "4s"]));
    (config.delay(delay).write(), name)
}

/// Schedules `id` (key = id) for `at` with `payload`, and `extra` headers.
async fn schedule(
    producer: &FutureProducer,
    inbox: &str,
    target: &str,
    id: &str,
    at: i64,
    payload: &str,
    extra: &[(&str, &str)],
) {
    let at = at.to_string();
    let mut headers = vec![
        ("hopper-target", target),
        ("hopper-deliver-at", at.as_str()),
        ("hopper-id", id),
    ];
    headers.extend_from_slice(extra);
    produce(producer, inbox, Some(id), payload, &headers).await;
}

/// Cancels `id` the way any client can: key = id, two headers.
async fn cancel(producer: &FutureProducer, inbox: &str, id: &str) {
    produce(
        producer,
        inbox,
        Some(id),
        "",
        &[("hopper-cancel", "true"), ("hopper-id", id)],
    )
    .await;
}

/// A record with any bytes as key and header values.
async fn produce_raw(
    producer: &FutureProducer,
    topic: &str,
    key: &[u8],
    payload: &str,
    headers: &[(&str, &[u8])],
) {
    let mut owned = OwnedHeaders::new();
    for (k, v) in headers {
        owned = owned.insert(Header {
            key: k,
            value: Some(*v),
        });
    }
    let record = FutureRecord::<[u8], str>::to(topic)
        .key(key)
        .payload(payload)
        .headers(owned);
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

/// Everything that reaches `topic` until `until_ms` (epoch ms) and until
/// `enough` accepts what was read.
async fn watch(
    topic: &str,
    until_ms: i64,
    mut enough: impl FnMut(&[OwnedMessage]) -> bool,
) -> Vec<OwnedMessage> {
    let consumer = reader(topic);
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    let mut seen = Vec::new();
    loop {
        let left = until_ms - now_ms();
        if left <= 0 && enough(&seen) {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "watching {topic}: still waiting after {:?}, {} read",
            PATIENCE * 2,
            seen.len()
        );
        let wait = Duration::from_millis(left.clamp(50, 500) as u64);
        if let Ok(record) = tokio::time::timeout(wait, consumer.recv()).await {
            seen.push(record.expect("reading the target").detach());
        }
    }
}

/// A bad record: what it is (its payload), its key, its headers, and what
/// its dead-letter error must say.
type Bad<'a> = (&'a str, &'a [u8], Vec<(&'a str, &'a [u8])>, &'a str);

fn id_of(m: &OwnedMessage) -> String {
    header_map(m).0["hopper-id"].clone()
}

fn timestamp(m: &OwnedMessage) -> i64 {
    m.timestamp().to_millis().expect("record has a timestamp")
}

fn by_id(records: &[OwnedMessage]) -> HashMap<String, Vec<&OwnedMessage>> {
    let mut out: HashMap<String, Vec<&OwnedMessage>> = HashMap::new();
    for m in records {
        out.entry(id_of(m)).or_default().push(m);
    }
    out
}

/// A cancel well before the due time holds, a replace moves a message to
/// an earlier or a later time (exactly one copy, at the new time), and every
/// bad combination is dead-lettered naming its problem, while a twin that
/// nobody cancelled arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_and_replaces_hold_and_bad_ones_are_dead_lettered() {
    init_tracing();
    let (config, inbox, target) = relay_to_target(2, |d| d).await;
    let hopper = config.start().await;
    let producer = producer();
    let base = now_ms() + 4_000;
    let later = base + 3_000;
    schedule(&producer, &inbox, &target, "twin", base, "twin", &[]).await;
    schedule(&producer, &inbox, &target, "gone", base, "gone", &[]).await;
    schedule(&producer, &inbox, &target, "sooner", later, "old", &[]).await;
    schedule(&producer, &inbox, &target, "delayed", base, "old", &[]).await;
    cancel(&producer, &inbox, "gone").await;
    let replace = [("hopper-replace", "true")];
    schedule(&producer, &inbox, &target, "sooner", base, "new", &replace).await;
    schedule(
        &producer, &inbox, &target, "delayed", later, "new", &replace,
    )
    .await;

    // The bad ones, each naming its problem.
    let long = "x".repeat(300);
    let bad: [Bad; 6] = [
        (
            "no id",
            b"k",
            vec![("hopper-cancel", b"true")],
            "a cancel needs hopper-id",
        ),
        (
            "with a target",
            b"t-1",
            vec![
                ("hopper-cancel", b"true"),
                ("hopper-id", b"t-1"),
                ("hopper-target", target.as_bytes()),
            ],
            "cannot carry hopper-target",
        ),
        (
            "replace without a time",
            b"r-1",
            vec![
                ("hopper-replace", b"true"),
                ("hopper-id", b"r-1"),
                ("hopper-target", target.as_bytes()),
            ],
            "header hopper-deliver-at or hopper-delay is missing",
        ),
        (
            "key not the id",
            b"another",
            vec![("hopper-cancel", b"true"), ("hopper-id", b"k-1")],
            "key must be its hopper-id (`k-1`)",
        ),
        (
            "a 300-byte id",
            long.as_bytes(),
            vec![("hopper-cancel", b"true"), ("hopper-id", long.as_bytes())],
            "must be 1 to 256 bytes, not 300",
        ),
        (
            "a non-UTF-8 id",
            b"\xff\xfe",
            vec![("hopper-cancel", b"true"), ("hopper-id", b"\xff\xfe")],
            "hopper-id",
        ),
    ];
    for (what, key, headers, _) in &bad {
        produce_raw(&producer, &inbox, key, what, headers).await;
    }

    let dead = consume(&format!("{inbox}.dlq"), bad.len(), PATIENCE).await;
    for (what, _, _, expected) in &bad {
        let record = dead
            .iter()
            .find(|m| m.payload() == Some(what.as_bytes()))
            .unwrap_or_else(|| panic!("{what}: not dead-lettered"));
        let (h, _) = header_map(record);
        assert_eq!(h["hopper-reason"], "INVALID_ENVELOPE", "{what}");
        assert!(
            h["hopper-last-error"].contains(expected),
            "{what}: {}",
            h["hopper-last-error"]
        );
    }

    let seen = watch(&target, later + 5_000, |_| true).await;
    let seen = by_id(&seen);
    let twin = &seen["twin"];
    assert_eq!(twin.len(), 1, "the twin arrives once");
    assert!(timestamp(twin[0]) >= base, "the twin is not early");
    assert!(
        !seen.contains_key("gone"),
        "a cancelled message arrived: {:?}",
        seen["gone"].iter().map(|m| m.offset()).collect::<Vec<_>>()
    );
    for (id, at) in [("sooner", base), ("delayed", later)] {
        let copies = &seen[id];
        assert_eq!(copies.len(), 1, "{id}: one copy, not {}", copies.len());
        assert_eq!(copies[0].payload(), Some(&b"new"[..]), "{id}");
        let ts = timestamp(copies[0]);
        assert!(ts >= at, "{id} delivered {} ms early", at - ts);
        assert!(ts < at + 1_000, "{id} delivered {} ms late", ts - at);
    }
    let t = hopper.telemetry();
    assert_eq!(count(t, &series::CancelledSchedules), 1);
    assert_eq!(count(t, &series::ReplacedSchedules), 2);
    assert_eq!(count(t, &series::RecordedCancels { kind: "cancel" }), 1);
    assert_eq!(count(t, &series::RecordedCancels { kind: "replace" }), 2);
    hopper.stop().await;
}

/// A replace too close for any tier waits in memory, so the relay writes
/// its entry first and awaits it, on a producer of its own. When librdkafka
/// has failed that producer for good, it is replaced and the entry written
/// on the new one: the replace arrives once, at its new time, and the old
/// copy is held, as beside a twin that nobody replaced, which arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replace_that_waits_in_memory_is_written_after_its_producer_fails_for_good() {
    init_tracing();
    let (config, inbox, target) = relay_to_target(1, |d| d).await;
    let hopper = config.start().await;
    let producer = producer();
    let base = now_ms() + 6_000;
    schedule(&producer, &inbox, &target, "twin", base, "twin", &[]).await;
    schedule(&producer, &inbox, &target, "moved", base, "old", &[]).await;

    let entries = hopper.relay_entries().expect("the relay runs");
    entries.raise_fatal("sequence desynchronization, raised by the test");
    assert!(
        entries.fatal_error().is_some(),
        "the relay's entry producer is failed for good"
    );
    // 1.2 s away: within the 1s tier's wait plus its 250 ms margin, so it
    // waits in memory, unless the relay takes over 1.2 s to read it.
    let sooner = now_ms() + 1_200;
    let replace = [("hopper-replace", "true")];
    schedule(&producer, &inbox, &target, "moved", sooner, "new", &replace).await;

    let seen = watch(&target, base + 2_000, |_| true).await;
    let seen = by_id(&seen);
    let twin = &seen["twin"];
    assert_eq!(twin.len(), 1, "the twin arrives once");
    assert!(timestamp(twin[0]) >= base, "the twin is not early");
    let moved = &seen["moved"];
    assert_eq!(
        moved.iter().map(|m| m.payload()).collect::<Vec<_>>(),
        [Some(&b"new"[..])],
        "only the replacement arrives"
    );
    let ts = timestamp(moved[0]);
    assert!(ts >= sooner, "delivered {} ms early", sooner - ts);
    assert!(ts < base, "delivered at the old time, not the new one");
    assert_eq!(
        entries.fatal_error(),
        None,
        "the failed producer is replaced"
    );
    let t = hopper.telemetry();
    assert_eq!(count(t, &series::ReplacedSchedules), 1);
    assert_eq!(count(t, &series::RecordedCancels { kind: "replace" }), 1);
    drop(entries);
    hopper.stop().await;
}

/// A cancel for an id never scheduled and one after the delivery are
/// harmless, counted, and their entries expire; a storm of 100,000 cancels
/// is taken in and forgotten the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_late_and_stormy_cancels_are_counted_and_expire() {
    init_tracing();
    let (config, inbox, target) =
        relay_to_target(2, |d| d.max_delay("3s").key("cancel_grace", quoted("1s"))).await;
    let hopper = config.start().await;
    let table = hopper.cancellations().expect("the relay runs");
    let mut events = hopper.events();
    let producer = producer();
    schedule(&producer, &inbox, &target, "early", now_ms(), "", &[]).await;
    wait_for_event(&mut events, "`early` delivered", |e| match e {
        Event::Hop(hop::Outcome::Forward(d)) if d.id == "early" => Some(()),
        _ => None,
    })
    .await;
    cancel(&producer, &inbox, "early").await;
    cancel(&producer, &inbox, "never").await;
    wait_for_event(
        &mut events,
        "the cancel of `early` found too late",
        |e| match e {
            Event::CancelTooLate(e) if e.id == "early" => Some(()),
            _ => None,
        },
    )
    .await;
    let mut expired = HashMap::new();
    while expired.len() < 2 {
        let e = wait_for_event(&mut events, "a cancellation to expire", |e| match e {
            Event::CancellationExpired(e) => Some(e.clone()),
            _ => None,
        })
        .await;
        expired.insert(e.id.clone(), e);
    }
    assert!(expired["never"].unknown_id, "{:?}", expired["never"]);
    assert!(!expired["early"].unknown_id, "too late, not unknown");
    assert!(table.is_empty());
    let t = hopper.telemetry();
    assert_eq!(count(t, &series::LateCancels), 1);
    assert_eq!(count(t, &series::UnknownIdCancels), 1);
    drop(events);

    // The storm: 100,000 ids, all unknown.
    const STORM: u64 = 100_000;
    let started = std::time::Instant::now();
    let storm: Vec<String> = (0..STORM).map(|i| format!("storm-{i}")).collect();
    let mut sending = futures::stream::FuturesUnordered::new();
    for id in &storm {
        let record = FutureRecord::<str, str>::to(&inbox)
            .key(id)
            .payload("")
            .headers(
                OwnedHeaders::new()
                    .insert(Header {
                        key: "hopper-cancel",
                        value: Some("true"),
                    })
                    .insert(Header {
                        key: "hopper-id",
                        value: Some(id),
                    }),
            );
        sending.push(producer.send(record, Duration::from_secs(30)));
        if sending.len() >= 10_000 {
            use futures::StreamExt;
            while let Some(sent) = sending.next().await {
                sent.map_err(|(e, _)| e).expect("produce");
            }
        }
    }
    use futures::StreamExt;
    while let Some(sent) = sending.next().await {
        sent.map_err(|(e, _)| e).expect("produce");
    }
    let recorded = || {
        count(
            hopper.telemetry(),
            &series::RecordedCancels { kind: "cancel" },
        )
    };
    let unknown = || count(hopper.telemetry(), &series::UnknownIdCancels);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut peak = 0;
    loop {
        peak = peak.max(table.len());
        if recorded() == STORM + 2 && unknown() == STORM + 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "storm: {} recorded, {} expired unknown, {} in the table",
            recorded(),
            unknown(),
            table.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "storm of {STORM} cancels taken in and expired in {:?}, at most {peak} in the table at once",
        started.elapsed()
    );
    assert!(peak > 0, "the storm went through the table");
    assert!(table.is_empty(), "every storm entry expired");
    hopper.stop().await;
}

/// A kill -9 of the relay between the cancel and the due time: after the
/// restart, the message is still cancelled, and its twin arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_holds_across_a_kill_of_the_relay() {
    init_tracing();
    let (config, inbox, target) = relay_to_target(2, |d| d).await;
    let spawn = || {
        std::process::Command::new(hopper_bin())
            .args(["run", "--config"])
            .arg(&config.path)
            .env("HOPPER_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("hopper runs")
    };
    let mut first = spawn();
    let producer = producer();
    let at = now_ms() + 5_000;
    schedule(&producer, &inbox, &target, "twin", at, "", &[]).await;
    schedule(&producer, &inbox, &target, "gone", at, "", &[]).await;
    cancel(&producer, &inbox, "gone").await;
    // Killed once the cancel is in the cancellation topic, which the relay
    // creates as it starts: read it once it exists.
    let cancels = format!("{inbox}.cancels");
    let metadata: rdkafka::consumer::BaseConsumer = client_config().create().unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !metadata
        .fetch_metadata(Some(&cancels), Duration::from_secs(10))
        .is_ok_and(|m| {
            m.topics()
                .iter()
                .all(|t| t.error().is_none() && !t.partitions().is_empty())
        })
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the relay never created {cancels}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let entry = consume(&cancels, 1, PATIENCE).await;
    let key = entry[0].key().and_then(hopper::delay::entry_key_partition);
    assert_eq!(key.map(|(_, id)| id), Some(&b"gone"[..]));
    assert!(now_ms() < at, "the kill lands before the due time");
    first.kill().expect("kill -9");
    first.wait().unwrap();
    let mut second = spawn();
    let seen = watch(&target, at + 5_000, |seen| {
        seen.iter().any(|m| id_of(m) == "twin")
    })
    .await;
    second.kill().unwrap();
    second.wait().unwrap();
    let seen = by_id(&seen);
    assert!(
        seen.contains_key("twin"),
        "the twin arrives after the restart"
    );
    assert!(!seen.contains_key("gone"), "the cancelled message arrived");
}

/// Three relay processes in one group: cancels read by one process hold
/// for messages whose tier partitions another one owns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_share_every_cancel() {
    init_tracing();
    let (config, inbox, target) = relay_to_target(3, |d| d).await;
    // Tiers of two partitions, the inbox of three: where the inbox reads
    // an id and which process owns its tier partition differ.
    let tiers: Vec<String> = ["1s", "2s", "4s"]
        .iter()
        .map(|t| format!("{inbox}.{t}"))
        .collect();
    create_topics_with(&tiers.iter().map(String::as_str).collect::<Vec<_>>(), 2).await;
    let mut relays = Vec::new();
    for _ in 0..3 {
        relays.push(config.start().await);
    }
    // The group settles first: a record read while a join moves its
    // partition is delivered at least once, which may be twice, and the
    // twins below are counted exactly. Each member holds partitions only
    // once the last join's assignment is done.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !relays.iter().all(|r| r.telemetry().health().ready()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the three relays never all held partitions"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut watchers: Vec<_> = relays.iter().map(|h| h.events()).collect();
    let producer = producer();
    let at = now_ms() + 7_000;
    let ids: Vec<String> = (0..20).map(|i| format!("order-{i}")).collect();
    for id in &ids {
        schedule(&producer, &inbox, &target, id, at, "", &[]).await;
        schedule(
            &producer,
            &inbox,
            &target,
            &format!("{id}-twin"),
            at,
            "",
            &[],
        )
        .await;
    }
    for id in &ids {
        cancel(&producer, &inbox, id).await;
    }
    let seen = watch(&target, at + 5_000, |_| true).await;
    let seen = by_id(&seen);
    for id in &ids {
        assert!(!seen.contains_key(id), "{id} was cancelled but arrived");
        assert_eq!(
            seen.get(&format!("{id}-twin")).map(Vec::len),
            Some(1),
            "{id}-twin"
        );
    }
    // Who read each cancel, and who dropped each message.
    let mut recorded_by = HashMap::new();
    let mut dropped_by: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, watcher) in watchers.iter_mut().enumerate() {
        while let Ok(event) = watcher.try_recv() {
            match event {
                Event::Hop(hop::Outcome::CancelEntry(hop::CancelEntry { id, kind, .. })) => {
                    assert_eq!(kind, CancelKind::Cancel);
                    recorded_by.insert(id, i);
                }
                Event::ScheduleCancelled(events::ScheduleCancelled { id, .. }) => {
                    dropped_by.entry(id).or_default().push(i);
                }
                _ => {}
            }
        }
    }
    let ids: HashSet<&String> = ids.iter().collect();
    assert_eq!(dropped_by.keys().collect::<HashSet<_>>(), ids);
    assert!(
        dropped_by.values().all(|by| by.len() == 1),
        "each dropped once: {dropped_by:?}"
    );
    let crossed = ids
        .iter()
        .filter(|id| recorded_by[**id] != dropped_by[**id][0])
        .count();
    eprintln!(
        "{crossed} of {} cancels held by another process than the one that read them",
        ids.len()
    );
    assert!(
        crossed > 0,
        "no cancel was read by one process and held by another: {recorded_by:?} {dropped_by:?}"
    );
    for relay in relays {
        relay.stop().await;
    }
}

/// Operators cancel by id from the command line and through the admin API
/// (with the token), and see the pending cancellation both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_cancel_and_show_by_id() {
    init_tracing();
    let (config, inbox) = relay_in(
        ConfigBuilder::new().admin(AdminTable::loopback().token(TOKEN)),
        |d| d,
    );
    let target = rand_name("target");
    create_topics(&[&target]).await;
    let hopper = config.start().await;
    let addr = hopper.admin_addr().expect("the admin server runs");
    let mut events = hopper.events();
    let producer = producer();
    let at = now_ms() + 5_000;
    for id in ["by-api", "by-cli", "kept"] {
        schedule(&producer, &inbox, &target, id, at, "", &[]).await;
    }
    let known = |wanted: &'static str| {
        move |e: &Event| match e {
            Event::CancellationKnown(k) if k.id == wanted => Some(()),
            _ => None,
        }
    };

    let body = r#"{"id": "by-api"}"#;
    let (status, answer) = http(addr, "POST", "/api/delay/cancel", None, Some(body)).await;
    assert_eq!(status, 401, "no token: {answer}");
    let (status, answer) = http(addr, "POST", "/api/delay/cancel", Some(TOKEN), Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    wait_for_event(
        &mut events,
        "the relay to know the cancel of `by-api`",
        known("by-api"),
    )
    .await;
    let shown = get_json_as(addr, "/api/delay/cancels/by-api", Some(TOKEN)).await;
    assert_eq!(shown["cancellations"][0]["kind"], "cancel", "{shown}");
    let shown = get_json_as(addr, "/api/delay/cancels/kept", Some(TOKEN)).await;
    assert_eq!(shown["cancellations"], serde_json::json!([]), "{shown}");

    let cli = |args: &[&str]| {
        let out = std::process::Command::new(hopper_bin())
            .args(["delay"])
            .args(args)
            .arg("--config")
            .arg(&config.path)
            .env_remove("HOPPER_BROKERS")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "hopper delay {args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let sent = cli(&["cancel", "--id", "by-cli"]);
    assert!(sent.contains("Cancel of `by-cli` sent to"), "{sent}");
    wait_for_event(
        &mut events,
        "the relay to know the cancel of `by-cli`",
        known("by-cli"),
    )
    .await;
    let shown: serde_json::Value =
        serde_json::from_str(&cli(&["show", "--id", "by-cli", "--json"])).unwrap();
    assert_eq!(shown["cancellations"][0]["kind"], "cancel", "{shown}");
    let shown = cli(&["show", "--id", "kept"]);
    assert!(shown.contains("no pending cancellation"), "{shown}");

    let seen = watch(&target, at + 5_000, |_| true).await;
    let seen = by_id(&seen);
    assert_eq!(seen.get("kept").map(Vec::len), Some(1), "the twin arrives");
    for id in ["by-api", "by-cli"] {
        assert!(!seen.contains_key(id), "{id} was cancelled but arrived");
    }
    hopper.stop().await;
}

/// Produces to one inbox partition chosen explicitly, as a client whose
/// partitioner differs from hopper's (Java's murmur2 against librdkafka's
/// crc32) lands, or one that picks the partition itself. Returns the offset.
async fn produce_to(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    key: &[u8],
    payload: &str,
    headers: &[(&str, &[u8])],
) -> i64 {
    let mut owned = OwnedHeaders::new();
    for (k, v) in headers {
        owned = owned.insert(Header {
            key: k,
            value: Some(*v),
        });
    }
    let record = FutureRecord::<[u8], str>::to(topic)
        .partition(partition)
        .key(key)
        .payload(payload)
        .headers(owned);
    let delivery = producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
    assert_eq!(delivery.partition, partition);
    delivery.offset
}

/// Regression (hardening, "one cancel can undo another"): the table kept
/// one entry per id, so a cancel of `inv-42` read from partition 0 replaced
/// the one read from partition 1 and un-cancelled the schedule there; and a
/// schedule whose key is not its id was reached by a cancel that named its
/// id on its partition, its default `<inbox>-<partition>-<offset>` id
/// included. Every record goes to an explicit partition. A cancel reaches
/// only a schedule of its id, keyed by its id, read before it in its own
/// partition: the controls on the same partitions show a cancel that does
/// reach, and that what is not reached arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_only_its_partition_and_only_schedules_keyed_by_their_id() {
    init_tracing();
    let (config, inbox, target) = relay_to_target(2, |d| d).await;
    let hopper = config.start().await;
    let mut events = hopper.events();
    let producer = producer();
    let at = (now_ms() + 6_000).to_string();
    let schedule = |id: &'static str| -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("hopper-target", target.clone().into_bytes()),
            ("hopper-deliver-at", at.clone().into_bytes()),
            ("hopper-id", id.as_bytes().to_vec()),
        ]
    };
    let send = |partition: i32,
                key: Vec<u8>,
                payload: &'static str,
                headers: Vec<(&'static str, Vec<u8>)>| {
        let producer = producer.clone();
        let inbox = inbox.clone();
        async move {
            let headers: Vec<(&str, &[u8])> =
                headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
            produce_to(&producer, &inbox, partition, &key, payload, &headers).await
        }
    };
    let cancel_of = |id: &str| -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("hopper-cancel", b"true".to_vec()),
            ("hopper-id", id.as_bytes().to_vec()),
        ]
    };
    let known = |id: &'static str, partition: i32| {
        move |e: &Event| match e {
            Event::CancellationKnown(k) if k.id == id && k.inbox.partition == partition => Some(()),
            _ => None,
        }
    };

    // Cancelled on partition 1, then a cancel of the same id read from
    // partition 0, once partition 1's is known everywhere.
    send(1, b"inv-42".to_vec(), "inv-42", schedule("inv-42")).await;
    send(1, b"inv-42".to_vec(), "", cancel_of("inv-42")).await;
    wait_for_event(
        &mut events,
        "the relay to know the schedule of `inv-42`",
        known("inv-42", 1),
    )
    .await;
    send(0, b"inv-42".to_vec(), "", cancel_of("inv-42")).await;
    wait_for_event(
        &mut events,
        "the relay to know the cancel of `inv-42`",
        known("inv-42", 0),
    )
    .await;

    // A schedule on partition 0 and a cancel of its id on partition 1 only:
    // no order relates them, and the cancel does not reach it.
    send(0, b"inv-43".to_vec(), "inv-43", schedule("inv-43")).await;
    send(1, b"inv-43".to_vec(), "", cancel_of("inv-43")).await;

    // A cancel on the schedule's own partition reaches it (the control).
    send(0, b"own".to_vec(), "own", schedule("own")).await;
    send(0, b"own".to_vec(), "", cancel_of("own")).await;

    // A schedule whose key is not its id, and one with no id (its default
    // id is predictable), each with a cancel of its id on its partition.
    send(0, b"other".to_vec(), "named", schedule("named")).await;
    send(0, b"named".to_vec(), "", cancel_of("named")).await;
    let mut unnamed = schedule("x");
    unnamed.retain(|(k, _)| *k != "hopper-id");
    let offset = send(0, b"victim".to_vec(), "unnamed", unnamed).await;
    let default_id = format!("{inbox}-0-{offset}");
    send(
        0,
        default_id.clone().into_bytes(),
        "",
        cancel_of(&default_id),
    )
    .await;
    // Sent last, due with the others, cancelled by nobody.
    send(0, b"twin".to_vec(), "twin", schedule("twin")).await;

    let arrived = ["inv-43", "named", "unnamed", "twin"];
    let seen = watch(&target, at.parse::<i64>().unwrap() + 2_000, |seen| {
        seen.iter().any(|m| m.payload() == Some(&b"twin"[..]))
    })
    .await;
    let payloads: Vec<String> = seen
        .iter()
        .map(|m| String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned())
        .collect();
    assert!(
        !payloads.iter().any(|p| p == "own"),
        "a cancel on the schedule's own partition did not reach it: {payloads:?}"
    );
    assert!(
        !payloads.iter().any(|p| p == "inv-42"),
        "a cancel read from partition 0 undid the one read from partition 1: {payloads:?}"
    );
    for p in arrived {
        assert_eq!(
            payloads.iter().filter(|s| *s == p).count(),
            1,
            "{p} arrives once: {payloads:?}"
        );
    }
    let unnamed = seen
        .iter()
        .find(|m| m.payload() == Some(&b"unnamed"[..]))
        .unwrap();
    assert_eq!(id_of(unnamed), default_id);
    hopper.stop().await;
}

/// Regression (hardening, "the cancellation table has no bound"): past
/// `max_cancellations`, a cancel or replace of an id the table does not
/// hold is dead-lettered as `CANCEL_TABLE_FULL` and counted, nothing of it
/// applied (the schedule it would have cancelled arrives, and the refused
/// replace schedules nothing); a cancel of an id the table holds still
/// extends its entry. The dead letter keeps the record for a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bound_cancels_are_dead_lettered_as_cancel_table_full() {
    init_tracing();
    let (config, inbox, target) = relay_to_target(1, |d| d.key("max_cancellations", 3)).await;
    let hopper = config.start().await;
    let table = hopper.cancellations().expect("the relay runs");
    let mut events = hopper.events();
    let producer = producer();
    let at = now_ms() + 5_000;
    schedule(&producer, &inbox, &target, "a", at, "a", &[]).await;
    schedule(&producer, &inbox, &target, "late", at, "late", &[]).await;
    for id in ["a", "b", "c"] {
        cancel(&producer, &inbox, id).await;
        let id = id.to_string();
        wait_for_event(
            &mut events,
            "the relay to know a cancellation",
            |e| match e {
                Event::CancellationKnown(k) if k.id == id => Some(()),
                _ => None,
            },
        )
        .await;
    }
    assert_eq!(table.len(), 3);
    cancel(&producer, &inbox, "late").await;
    let replace = [("hopper-replace", "true")];
    schedule(&producer, &inbox, &target, "moved", at, "moved", &replace).await;
    // Held already: extended, not refused.
    cancel(&producer, &inbox, "a").await;

    let dead = consume(&format!("{inbox}.dlq"), 2, PATIENCE).await;
    let mut refused = Vec::new();
    for record in &dead {
        let (h, _) = header_map(record);
        assert_eq!(h["hopper-reason"], "CANCEL_TABLE_FULL", "{h:?}");
        assert!(
            h["hopper-last-error"].contains("3 entries")
                && h["hopper-last-error"].contains("max_cancellations"),
            "{}",
            h["hopper-last-error"]
        );
        refused.push(h["hopper-id"].clone());
    }
    refused.sort();
    assert_eq!(refused, ["late", "moved"]);
    let seen = watch(&target, at + 2_000, |seen| {
        seen.iter().any(|m| id_of(m) == "late")
    })
    .await;
    let seen = by_id(&seen);
    assert_eq!(
        seen.get("late").map(Vec::len),
        Some(1),
        "the refused cancel cancelled nothing"
    );
    assert!(!seen.contains_key("a"), "a held cancel still holds");
    assert!(
        !seen.contains_key("moved"),
        "a refused replace schedules nothing"
    );
    let t = hopper.telemetry();
    let refused = |kind| count(t, &series::RefusedCancels { kind });
    assert_eq!(refused("cancel"), 1);
    assert_eq!(refused("replace"), 1);
    assert_eq!(count(t, &series::RecordedCancels { kind: "cancel" }), 4);
    assert_eq!(table.len(), 3);
    hopper.stop().await;
}
