//! The delay relay against a real broker: header-only scheduling from a plain
//! client, several tiers, a kill -9 with messages pending, and bad input.

use hopper::events::{self, Event};
use hopper_tests::*;
use rdkafka::Message;
use std::collections::HashMap;

/// A relay config with its own inbox and tiers of 1s, 2s and 4s.
fn relay() -> (TestConfig, String) {
    let name = rand_name("delay");
    let config = ConfigBuilder::new()
        .delay(
            DelayTable::named(&name)
                .tiers(&["1s", "2s", "4s"])
                .max_delay("1h"),
        )
        .write();
    (config, name)
}

/// A relay config with its inbox, and a new target topic.
async fn relay_with_target() -> (TestConfig, String, String) {
    init_tracing();
    let (config, inbox) = relay();
    let target = rand_name("target");
    create_topics(&[&target]).await;
    (config, inbox, target)
}

fn timestamp(m: &rdkafka::message::OwnedMessage) -> i64 {
    m.timestamp().to_millis().expect("record has a timestamp")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_schedules_with_headers_alone() {
    let (config, inbox, target) = relay_with_target().await;
    let hopper = config.start().await;

    // Not hopper's API: a plain librdkafka producer and three headers.
    let producer = producer();
    let sent_at = now_ms();
    produce(
        &producer,
        &inbox,
        Some("order-9"),
        "close me",
        &[
            ("hopper-target", &target),
            ("hopper-delay", "2500ms"),
            ("x-trace", "t-1"),
            ("x-binary", "\u{1}\u{2}"),
        ],
    )
    .await;

    let got = consume(&target, 1, PATIENCE).await;
    let m = &got[0];
    assert_eq!(m.key(), Some(&b"order-9"[..]));
    assert_eq!(m.payload(), Some(&b"close me"[..]));
    let (h, counts) = header_map(m);
    assert_eq!(h["x-trace"], "t-1");
    assert_eq!(h["x-binary"], "\u{1}\u{2}");
    assert!(h.contains_key("hopper-id"));
    for gone in [
        "hopper-target",
        "hopper-delay",
        "hopper-deliver-at",
        "hopper-due-at",
    ] {
        assert!(!h.contains_key(gone), "{gone} reached the target: {h:?}");
    }
    assert!(counts.values().all(|c| *c == 1), "{counts:?}");
    assert!(
        timestamp(m) >= sent_at + 2500,
        "delivered {} ms early",
        sent_at + 2500 - timestamp(m)
    );
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_across_several_tiers_arrive_at_their_own_time() {
    let (config, inbox, target) = relay_with_target().await;
    let hopper = config.start().await;
    let producer = producer();

    let delays = [300i64, 1_500, 3_300, 7_900];
    let mut due: HashMap<String, i64> = HashMap::new();
    for delay in delays {
        let id = format!("d{delay}");
        let at = now_ms() + delay;
        produce(
            &producer,
            &inbox,
            None,
            &id,
            &[
                ("hopper-target", &target),
                ("hopper-deliver-at", &at.to_string()),
                ("hopper-id", &id),
            ],
        )
        .await;
        due.insert(id, at);
    }
    let got = consume(&target, delays.len(), PATIENCE).await;
    for m in &got {
        let (h, _) = header_map(m);
        let at = due[&h["hopper-id"]];
        let ts = timestamp(m);
        assert!(
            ts >= at,
            "{} delivered {} ms early",
            h["hopper-id"],
            at - ts
        );
        assert!(
            ts < at + 5_000,
            "{} delivered {} ms late",
            h["hopper-id"],
            ts - at
        );
    }
    // The longest delay went down every tier: 4s, then 2s, then 1s.
    for tier in ["4s", "2s", "1s"] {
        consume_until(&format!("{inbox}.{tier}"), PATIENCE, |r| {
            header_map(r).0["hopper-id"] == "d7900"
        })
        .await;
    }
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_to_a_route_is_handled_after_its_time() {
    init_tracing();
    let route = rand_name("route");
    let inbox = rand_name("delay");
    let config = ConfigBuilder::new()
        .delay(DelayTable::named(&inbox).tiers(&["1s"]))
        .route(RouteTable::named(&route, &plugin("scripted")))
        .write();
    let hopper = config.start().await;
    let mut events = hopper.events();
    let at = now_ms() + 2_000;
    let message = hopper::delay::DelayedMessage {
        target: format!("{route}.in"),
        deliver_at: Some(at),
        id: Some("late-ok".into()),
        payload: Some(b"ok".to_vec()),
        ..Default::default()
    };
    message.send(&producer(), &inbox).await.unwrap();
    let (verdict, at_ms) = wait_for_event(&mut events, "the call of `late-ok`", |e| match e {
        Event::Handled(events::Handled {
            id, verdict, at_ms, ..
        }) if id == "late-ok" => Some((*verdict, *at_ms)),
        _ => None,
    })
    .await;
    assert_eq!(verdict, "ok");
    assert!(at_ms >= at, "handled {} ms early", at - at_ms);
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_goes_to_the_delay_dlq_and_the_relay_keeps_going() {
    let (config, inbox, target) = relay_with_target().await;
    let hopper = config.start().await;
    let producer = producer();
    // An id over 256 bytes: dead-lettered under the id cut to 256 bytes,
    // as a route does (`Envelope::fallback`).
    let long_id = "L".repeat(300);
    let cases: [(&str, Vec<(&str, String)>); 6] = [
        ("no-target", vec![("hopper-delay", "1s".into())]),
        (
            "bad-time",
            vec![
                ("hopper-target", target.clone()),
                ("hopper-deliver-at", "next tuesday".into()),
            ],
        ),
        (
            "no-topic",
            vec![
                ("hopper-target", format!("{target}-missing")),
                ("hopper-delay", "1s".into()),
            ],
        ),
        (
            "too-long",
            vec![
                ("hopper-target", target.clone()),
                ("hopper-delay", "2h".into()),
            ],
        ),
        (
            long_id.as_str(),
            vec![
                ("hopper-target", target.clone()),
                ("hopper-delay", "1s".into()),
            ],
        ),
        (
            "past",
            vec![
                ("hopper-target", target.clone()),
                ("hopper-deliver-at", (now_ms() - 60_000).to_string()),
            ],
        ),
    ];
    for (id, headers) in &cases {
        let mut all: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.push(("hopper-id", id));
        produce(&producer, &inbox, None, id, &all).await;
    }
    let dlq = consume(&format!("{inbox}.dlq"), 5, PATIENCE).await;
    let mut got: HashMap<String, (String, String)> = HashMap::new();
    for m in &dlq {
        let (h, _) = header_map(m);
        let id = h["hopper-id"].trim_end_matches('…');
        assert!(
            m.payload().unwrap().starts_with(id.as_bytes()),
            "payload kept under {id}"
        );
        got.insert(
            h["hopper-id"].clone(),
            (h["hopper-reason"].clone(), h["hopper-last-error"].clone()),
        );
    }
    assert_eq!(got["no-target"].0, "INVALID_ENVELOPE");
    assert_eq!(got["no-target"].1, "header hopper-target is missing");
    assert_eq!(got["bad-time"].0, "INVALID_ENVELOPE");
    assert!(
        got["bad-time"]
            .1
            .starts_with("header hopper-deliver-at: `next tuesday` is neither"),
        "{:?}",
        got["bad-time"]
    );
    assert_eq!(got["no-topic"].0, "INVALID_ENVELOPE");
    assert_eq!(
        got["no-topic"].1,
        format!("header hopper-target: topic `{target}-missing` does not exist")
    );
    let cut = format!("{}…", "L".repeat(256 - '…'.len_utf8()));
    assert_eq!(got[&cut].0, "INVALID_ENVELOPE");
    assert_eq!(
        got[&cut].1,
        "header hopper-id: must be 1 to 256 bytes, not 300"
    );
    assert_eq!(got["too-long"].0, "DELAY_TOO_LONG");
    assert!(
        got["too-long"].1.contains("the maximum delay is 1h"),
        "{:?}",
        got["too-long"]
    );

    let delivered = consume(&target, 1, PATIENCE).await;
    assert_eq!(
        delivered[0].payload(),
        Some(&b"past"[..]),
        "a past deliver-at is delivered at once"
    );
    hopper.stop().await;
}

/// kill -9 with messages pending in tiers and in memory: after a restart
/// every message arrives, none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_relay_loses_nothing_and_delivers_nothing_early() {
    let (config, inbox, target) = relay_with_target().await;
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
    let mut due: HashMap<String, i64> = HashMap::new();
    for i in 0..30i64 {
        let id = format!("k{i}");
        let at = now_ms() + 1_500 + i * 200;
        produce(
            &producer,
            &inbox,
            Some(&id),
            &id,
            &[
                ("hopper-target", &target),
                ("hopper-deliver-at", &at.to_string()),
                ("hopper-id", &id),
            ],
        )
        .await;
        due.insert(id, at);
    }
    // Killed once the relay has taken every message from its inbox (into
    // its tiers, or delivered) and committed them there.
    until_committed_on(&inbox, &inbox, 30).await;
    let delivered = records_on(std::slice::from_ref(&target));
    eprintln!("kill -9 with {delivered} of 30 delivered");
    assert!(
        delivered < 30,
        "the kill lands while messages wait in the relay's tiers"
    );
    first.kill().expect("kill -9");
    first.wait().unwrap();
    let mut second = spawn();

    let reader_deadline = tokio::time::Instant::now() + PATIENCE;
    let mut seen: HashMap<String, i64> = HashMap::new();
    let consumer: rdkafka::consumer::StreamConsumer = client_config()
        .set("group.id", rand_name("reader"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    rdkafka::consumer::Consumer::subscribe(&consumer, &[target.as_str()]).unwrap();
    while seen.len() < due.len() {
        let m = tokio::time::timeout_at(reader_deadline, consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {} arrived", seen.len(), due.len()))
            .unwrap();
        let id = header_map(&m.detach()).0["hopper-id"].clone();
        let ts = m.timestamp().to_millis().unwrap();
        assert!(ts >= due[&id], "{id} delivered {} ms early", due[&id] - ts);
        seen.insert(id, ts);
    }
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hopper_send_schedules_from_the_command_line() {
    let (config, inbox, target) = relay_with_target().await;
    let hopper = config.start().await;
    let before = now_ms();
    let out = std::process::Command::new(hopper_bin())
        .args([
            "send",
            "--brokers",
            &brokers(),
            "--inbox",
            &inbox,
            "--topic",
            &target,
        ])
        .args([
            "--delay",
            "1500ms",
            "--key",
            "k-7",
            "-H",
            "x-source=cli",
            "--id",
            "cli-1",
        ])
        .args(["--payload", "from the shell"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Scheduled for "));
    let got = consume(&target, 1, PATIENCE).await;
    let (h, _) = header_map(&got[0]);
    assert_eq!(got[0].key(), Some(&b"k-7"[..]));
    assert_eq!(got[0].payload(), Some(&b"from the shell"[..]));
    assert_eq!(h["x-source"], "cli");
    assert_eq!(h["hopper-id"], "cli-1");
    assert!(timestamp(&got[0]) >= before + 1500);

    // Bad input is refused before anything is sent.
    let bad = std::process::Command::new(hopper_bin())
        .args([
            "send",
            "--brokers",
            &brokers(),
            "--topic",
            &target,
            "--at",
            "someday",
            "--payload",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--at: `someday` is neither"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    hopper.stop().await;
}
