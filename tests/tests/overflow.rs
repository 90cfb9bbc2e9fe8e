//! Hostile header values on a route's input, on its retry tier and on the
//! delay relay's inbox and tiers: numbers at and past their type's edges,
//! text that is not UTF-8, empty values. Each lands in its dead-letter
//! topic as INVALID_ENVELOPE with an error that names the header (or, where
//! the value is merely odd, is handled as usual); no worker panics or
//! stalls, so a good message sent after them on the same partition is
//! handled too, and nothing is lost.
//!
//! Regression: `hopper-attempt: 4294967295` on a retry tier overflowed
//! `attempts + 1`, and `hopper-deliver-at: -9223372036854775808` on the
//! delay inbox overflowed `deliver_at - now`; both panicked the partition's
//! worker and lost the message.

use hopper_tests::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::HashMap;
use std::time::Duration;

/// Header names and raw values, in order.
type Headers<'a> = Vec<(&'a str, &'a [u8])>;

/// Produces a record with raw header values (so a value can be any bytes),
/// all on key `k` so that every record of a test shares one partition.
async fn send(producer: &FutureProducer, topic: &str, payload: &str, headers: &[(&str, &[u8])]) {
    let mut owned = OwnedHeaders::new();
    for (key, value) in headers {
        owned = owned.insert(Header {
            key,
            value: Some(*value),
        });
    }
    let record = FutureRecord::<str, str>::to(topic)
        .key("k")
        .payload(payload)
        .headers(owned);
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

/// Reads `count` records of `topic` and returns them by their `x-case`
/// header (which every hop keeps), failing on a case seen twice.
async fn by_case(topic: &str, count: usize) -> HashMap<String, HashMap<String, String>> {
    let mut out = HashMap::new();
    for m in consume(topic, count, PATIENCE).await {
        let (h, _) = header_map(&m);
        let case = h.get("x-case").cloned().unwrap_or_default();
        assert!(out.insert(case.clone(), h).is_none(), "{case} twice");
    }
    out
}

/// Asserts `case` was dead-lettered with `reason` and an error naming
/// `header`.
fn assert_dead(
    found: &HashMap<String, HashMap<String, String>>,
    case: &str,
    reason: &str,
    header: &str,
) {
    let h = found
        .get(case)
        .unwrap_or_else(|| panic!("{case} is not in the DLQ: {:?}", found.keys()));
    assert_eq!(h["hopper-reason"], reason, "{case}: {h:?}");
    assert!(
        h["hopper-last-error"].contains(header),
        "{case}: the error does not name {header}: {}",
        h["hopper-last-error"]
    );
}

/// The headers of a well-formed retry record, with `hostile` replacing or
/// adding one.
fn tier_record<'a>(case: &'a str, hostile: (&'a str, &'a [u8])) -> Vec<(&'a str, &'a [u8])> {
    let mut h: Vec<(&str, &[u8])> = vec![
        ("x-case", case.as_bytes()),
        ("hopper-id", case.as_bytes()),
        ("hopper-attempt", b"1"),
        ("hopper-origin-topic", b"elsewhere"),
        ("hopper-origin-partition", b"0"),
        ("hopper-origin-offset", b"7"),
    ];
    h.retain(|(k, _)| *k != hostile.0);
    h.push(hostile);
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_headers_on_a_route_are_dead_lettered_and_the_route_goes_on() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted"))
        .retry(&["1s"])
        .max_attempts(3)
        .test_route();
    let hopper = route.start().await;
    let tier = format!("{}.retry.1s", route.name);
    let producer = producer();

    // On the retry tier. Every record asks the handler to fail, so one
    // that is handled lands in the DLQ as FATAL.
    let max = u32::MAX.to_string();
    let trail_overflow = format!("+{},+1,retry.1s", u64::MAX);
    let far_due = i64::MAX.to_string();
    let tier_cases: [(&str, (&str, &[u8])); 8] = [
        ("attempt-max", ("hopper-attempt", max.as_bytes())),
        ("attempt-negative", ("hopper-attempt", b"-1")),
        (
            "attempt-huge",
            ("hopper-attempt", b"99999999999999999999999"),
        ),
        ("attempt-empty", ("hopper-attempt", b"")),
        ("attempt-binary", ("hopper-attempt", b"\xff\xfe1")),
        (
            "trail-overflow",
            ("hopper-trail", trail_overflow.as_bytes()),
        ),
        (
            "origin-offset-huge",
            ("hopper-origin-offset", b"9223372036854775808"),
        ),
        // Not hopper's: a due time no tier could have written. It must not
        // hold the partition for ever; the message is handled.
        ("due-far", ("hopper-due-at", far_due.as_bytes())),
    ];
    for (case, hostile) in &tier_cases {
        send(&producer, &tier, "fatal", &tier_record(case, *hostile)).await;
    }
    send(
        &producer,
        &tier,
        "fatal",
        &tier_record("tier-good", ("hopper-attempt", b"2")),
    )
    .await;

    // On the input.
    let mut replay_trail: Vec<(&str, &[u8])> =
        tier_record("replay-trail", ("hopper-trail", trail_overflow.as_bytes()));
    replay_trail.push(("hopper-replay-count", b"1"));
    let input_cases: Vec<(&str, Headers)> = vec![
        ("id-binary", vec![("hopper-id", b"\xc3\x28")]),
        ("id-empty", vec![("hopper-id", b"")]),
        ("id-long", vec![("hopper-id", &[b'a'; 300])]),
        (
            "replay-count-huge",
            vec![("hopper-replay-count", b"4294967296")],
        ),
        (
            "replay-count-negative",
            vec![("hopper-replay-count", b"-1")],
        ),
        ("replay-trail", replay_trail),
    ];
    for (case, headers) in &input_cases {
        let mut headers = headers.clone();
        headers.retain(|(k, _)| *k != "x-case");
        headers.push(("x-case", case.as_bytes()));
        send(&producer, &route.input, "fatal", &headers).await;
    }
    send(
        &producer,
        &route.input,
        "fatal",
        &[
            ("x-case", b"input-good"),
            ("hopper-attempt", max.as_bytes()),
        ],
    )
    .await;

    let expected = tier_cases.len() + 1 + input_cases.len() + 1;
    let found = by_case(&route.dlq, expected).await;
    for (case, (header, _)) in &tier_cases[..7] {
        assert_dead(&found, case, "INVALID_ENVELOPE", header);
    }
    for (case, header) in [
        ("id-binary", "hopper-id"),
        ("id-empty", "hopper-id"),
        ("id-long", "hopper-id"),
        ("replay-count-huge", "hopper-replay-count"),
        ("replay-count-negative", "hopper-replay-count"),
        ("replay-trail", "hopper-trail"),
    ] {
        assert_dead(&found, case, "INVALID_ENVELOPE", header);
    }
    // Handled: the handler's own verdict, at the attempt the record said
    // (the input ignores a producer's `hopper-attempt`).
    for (case, attempt) in [("due-far", "2"), ("tier-good", "3"), ("input-good", "1")] {
        let h = &found[case];
        assert_eq!(h["hopper-reason"], "FATAL", "{case}: {h:?}");
        assert_eq!(h["hopper-attempt"], attempt, "{case}");
    }
    assert_eq!(found.len(), expected, "nothing lost, nothing twice");
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_schedules_on_the_delay_relay_are_dead_lettered_and_it_goes_on() {
    init_tracing();
    let inbox = rand_name("delay");
    let config = ConfigBuilder::new()
        .delay(
            DelayTable::named(&inbox)
                .tiers(&["1s", "2s"])
                .max_delay("1h"),
        )
        .write();
    let target = rand_name("target");
    create_topics(&[&target]).await;
    let hopper = config.start().await;
    let dlq = format!("{inbox}.dlq");
    let tier = format!("{inbox}.2s");
    let producer = producer();
    let t = target.as_bytes();

    let min = i64::MIN.to_string();
    let max = i64::MAX.to_string();
    let inbox_cases: [(&str, &str, &[u8], &str); 7] = [
        (
            "at-min",
            "hopper-deliver-at",
            min.as_bytes(),
            "INVALID_ENVELOPE",
        ),
        (
            "at-negative",
            "hopper-deliver-at",
            b"-1",
            "INVALID_ENVELOPE",
        ),
        (
            "at-huge",
            "hopper-deliver-at",
            b"99999999999999999999",
            "INVALID_ENVELOPE",
        ),
        (
            "at-binary",
            "hopper-deliver-at",
            b"\xff17",
            "INVALID_ENVELOPE",
        ),
        ("at-empty", "hopper-deliver-at", b"", "INVALID_ENVELOPE"),
        (
            "delay-huge",
            "hopper-delay",
            b"99999999999999999999999y",
            "INVALID_ENVELOPE",
        ),
        (
            "at-max",
            "hopper-deliver-at",
            max.as_bytes(),
            "DELAY_TOO_LONG",
        ),
    ];
    for (case, header, value, _) in &inbox_cases {
        send(
            &producer,
            &inbox,
            case,
            &[
                ("x-case", case.as_bytes()),
                ("hopper-target", t),
                (header, value),
            ],
        )
        .await;
    }
    // On a tier, as if hopper had written them.
    send(
        &producer,
        &tier,
        "tier-at-min",
        &[
            ("x-case", b"tier-at-min"),
            ("hopper-target", t),
            ("hopper-deliver-at", min.as_bytes()),
            ("hopper-due-at", b"0"),
        ],
    )
    .await;
    let soon = (now_ms() + 500).to_string();
    // A due time no tier writes must not hold the tier for ever.
    send(
        &producer,
        &tier,
        "tier-due-far",
        &[
            ("x-case", b"tier-due-far"),
            ("hopper-target", t),
            ("hopper-deliver-at", soon.as_bytes()),
            ("hopper-due-at", max.as_bytes()),
        ],
    )
    .await;
    let soon = (now_ms() + 500).to_string();
    send(
        &producer,
        &inbox,
        "good",
        &[
            ("x-case", b"good"),
            ("hopper-target", t),
            ("hopper-deliver-at", soon.as_bytes()),
        ],
    )
    .await;

    let found = by_case(&dlq, inbox_cases.len() + 1).await;
    for (case, header, _, reason) in &inbox_cases {
        let header = if *reason == "DELAY_TOO_LONG" {
            "deliver-at"
        } else {
            header
        };
        assert_dead(&found, case, reason, header);
    }
    assert_dead(
        &found,
        "tier-at-min",
        "INVALID_ENVELOPE",
        "hopper-deliver-at",
    );
    let delivered = by_case(&target, 2).await;
    assert!(delivered.contains_key("good"), "{:?}", delivered.keys());
    assert!(
        delivered.contains_key("tier-due-far"),
        "{:?}",
        delivered.keys()
    );
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_dead_letter_records_are_listed_and_replayed_without_a_panic() {
    init_tracing();
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")))
        .admin(AdminTable::loopback().token("t"))
        .test_route();
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let producer = producer();
    // As hopper writes them, but with times at the ends of i64 (the
    // histogram spans them) and a replay count at the end of u32 (the loop
    // guard adds to it).
    let (min, max) = (i64::MIN.to_string(), i64::MAX.to_string());
    let replays = u32::MAX.to_string();
    for (id, failed_at) in [("early", &min), ("late", &max)] {
        send(
            &producer,
            &route.dlq,
            "fatal",
            &[
                ("hopper-id", id.as_bytes()),
                ("hopper-attempt", b"1"),
                ("hopper-route", route.name.as_bytes()),
                ("hopper-origin-topic", route.input.as_bytes()),
                ("hopper-origin-partition", b"0"),
                ("hopper-origin-offset", b"0"),
                ("hopper-reason", b"FATAL"),
                ("hopper-last-failure-at", failed_at.as_bytes()),
                ("hopper-replay-count", replays.as_bytes()),
            ],
        )
        .await;
    }
    let listed = get_json_as(addr, &format!("/api/dlq?route={}", route.name), Some("t")).await;
    assert_eq!(listed["total"], 2, "{listed}");
    assert!(
        !listed["histogram"].as_array().unwrap().is_empty(),
        "{listed}"
    );
    let body = serde_json::json!({ "filter": {}, "dry_run": true });
    let report = replay_run(addr, Some("t"), &body).await;
    assert_eq!(report["state"], "done", "{report}");
    let outcomes = report["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 2, "{report}");
    for outcome in outcomes {
        assert_eq!(outcome["action"], "loop", "past any loop guard: {report}");
    }
    hopper.stop().await;
}
