//! Records a handler emits: produced on `ok` only, with their headers and a
//! stable id, through the delay relay when delayed, never lost to a crash
//! between the emit and the commit.

use hopper::events::{self, Event};
use hopper::metrics::series;
use hopper::plugin::Verdict;
use hopper::types::VerdictKind;
use hopper_tests::*;
use rdkafka::Message;
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

fn script(steps: serde_json::Value, verdict: &str) -> String {
    json!({"steps": steps, "verdict": verdict}).to_string()
}

fn emit(topic: &str, payload: &str) -> serde_json::Value {
    json!({"emit": {"topic": topic, "payload": payload}})
}

/// A route around the `acting` fixture that may emit to a new topic, and
/// that topic.
async fn emitting_route(more: impl FnOnce(RouteTable) -> RouteTable) -> (TestRoute, String) {
    init_tracing();
    let closed = rand_name("closed");
    let route = more(RouteTable::new(&plugin("acting")).emit_topics(&[&closed])).test_route();
    (route, closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emitted_records_land_on_the_granted_topic_with_their_headers_and_a_stable_id() {
    let (route, closed) = emitting_route(|r| r).await;
    let hopper = route.start().await;
    let producer = producer();
    let steps = json!([
        {"emit": {"topic": closed, "key": "o-1", "payload": "closed o-1",
                  "headers": {"x-order": "o-1", "x-reason": "timeout"}}},
        emit(&closed, "second"),
    ]);
    produce(
        &producer,
        &route.input,
        Some("o-1"),
        &script(steps, "ok"),
        &[("hopper-id", "order-o-1")],
    )
    .await;
    // Without a hopper-id, the message's id is its origin.
    let (partition, offset) = produce(
        &producer,
        &route.input,
        None,
        &script(json!([emit(&closed, "third")]), "ok"),
        &[],
    )
    .await;

    let records = consume(&closed, 3, PATIENCE).await;
    let by_id: HashMap<String, _> = records
        .iter()
        .map(|r| (header_map(r).0["hopper-id"].clone(), r))
        .collect();
    let first = by_id["order-o-1/emit/0"];
    assert_eq!(first.key(), Some(&b"o-1"[..]));
    assert_eq!(first.payload(), Some(&b"closed o-1"[..]));
    let (h, counts) = header_map(first);
    assert_eq!(h["x-order"], "o-1");
    assert_eq!(h["x-reason"], "timeout");
    assert_eq!(h["hopper-route"], route.name);
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    assert!(
        !h.contains_key("hopper-attempt"),
        "an emitted record is new: {h:?}"
    );
    assert_eq!(
        by_id["order-o-1/emit/1"].payload(),
        Some(&b"second"[..]),
        "the index counts the call's records"
    );
    let third = format!("{}-{partition}-{offset}/emit/0", route.input);
    assert_eq!(by_id[&third].payload(), Some(&b"third"[..]));
    let produced = series::EmittedRecords {
        route: &route.name,
        result: "produced",
    };
    assert_eq!(count(hopper.telemetry(), &produced), 3);
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_emit_goes_through_the_delay_relay_and_arrives_no_earlier() {
    init_tracing();
    let name = rand_name("route");
    let closed = rand_name("closed");
    let inbox = rand_name("delay");
    let config = ConfigBuilder::new()
        .route(RouteTable::named(&name, &plugin("acting")).emit_topics(&[&closed]))
        .delay(DelayTable::named(&inbox).tiers(&["1s"]))
        .write();
    let hopper = config.start().await;
    let steps = json!([{"emit": {"topic": closed, "payload": "later", "delay_ms": 1500}}]);
    let before = now_ms();
    produce(
        &producer(),
        &format!("{name}.in"),
        None,
        &script(steps, "ok"),
        &[("hopper-id", "d1")],
    )
    .await;

    let records = consume(&closed, 1, PATIENCE).await;
    let (h, _) = header_map(&records[0]);
    assert_eq!(h["hopper-id"], "d1/emit/0");
    assert_eq!(records[0].payload(), Some(&b"later"[..]));
    let at = records[0].timestamp().to_millis().unwrap();
    assert!(
        at >= before + 1500,
        "delivered {} ms early",
        before + 1500 - at
    );
    let scheduled = consume(&inbox, 1, PATIENCE).await;
    assert_eq!(header_map(&scheduled[0]).0["hopper-target"], closed);
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_the_route_does_not_grant_is_an_error_the_handler_sees() {
    let acting = InProcess::new(
        RouteTable::new(&plugin("acting"))
            .emit_topics(&["closed"])
            // Every emit counts against max_records, refused ones included:
            // four refusals, two kept, and the seventh is one too many.
            .emit_limits(6, 100),
    );
    let steps = json!([
        emit("other", "x"),
        {"emit": {"topic": "closed", "payload": "x", "headers": {"Hopper-Id": "forged"}}},
        {"emit": {"topic": "closed", "payload": "x", "delay_ms": 1000}},
        emit("closed", &"x".repeat(101)),
        emit("closed", "kept 1"),
        emit("closed", "kept 2"),
        emit("closed", "one too many"),
    ]);
    let handled = acting
        .handler
        .run(acting.delivery("m-1", &script(steps, "ok")))
        .await;
    assert_eq!(handled.verdict, Verdict::Ok);
    let payloads: Vec<&[u8]> = handled
        .emitted
        .iter()
        .map(|e| e.payload.as_deref().unwrap())
        .collect();
    assert_eq!(payloads, vec![&b"kept 1"[..], b"kept 2"]);
    let ids: Vec<&str> = handled.emitted.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, vec!["m-1/emit/0", "m-1/emit/1"]);
    assert_eq!(
        acting.count(&series::EmittedRecords {
            route: "inproc",
            result: "refused"
        }),
        5
    );

    let steps = json!([
        emit("other", "x"),
        {"emit": {"topic": "closed", "payload": "x", "headers": {"Hopper-Id": "forged"}}},
        {"emit": {"topic": "closed", "payload": "x", "delay_ms": 1000}},
        emit("closed", &"x".repeat(101)),
        emit("closed", "kept 1"),
        emit("closed", "kept 2"),
        emit("closed", "one too many"),
    ]);
    let Verdict::Fatal { reason } = acting
        .handler
        .call(acting.delivery("m-2", &script(steps, "fatal")))
        .await
    else {
        panic!("the script says fatal");
    };
    let lines: Vec<&str> = reason.split(" | ").collect();
    assert_eq!(
        lines,
        vec![
            "emit other -> error EmitError::TopicNotGranted(\"other\")",
            "emit closed -> error EmitError::Invalid(\"header `Hopper-Id` starts with `hopper-`, which is hopper's own\")",
            "emit closed -> error EmitError::NoDelayRelay",
            "emit closed -> error EmitError::TooLarge(100)",
            "emit closed -> m-2/emit/0",
            "emit closed -> m-2/emit/1",
            "emit closed -> error EmitError::TooManyRecords(6)",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_retryable_or_fatal_verdict_nothing_emitted_is_produced() {
    let (route, closed) = emitting_route(|r| r.retry(&["1s"]).max_attempts(2)).await;
    let hopper = route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    // One key: one partition, handled in this order.
    for (id, verdict) in [("retried", "retry"), ("failed", "fatal")] {
        let payload = script(json!([emit(&closed, id)]), verdict);
        produce(
            &producer,
            &route.input,
            Some("k"),
            &payload,
            &[("hopper-id", id)],
        )
        .await;
    }
    let dead = consume(&route.dlq, 2, PATIENCE).await;
    assert_eq!(dead.len(), 2);
    // Only now, after both are dead-lettered, a message that succeeds.
    let payload = script(json!([emit(&closed, "done")]), "ok");
    produce(
        &producer,
        &route.input,
        Some("k"),
        &payload,
        &[("hopper-id", "done")],
    )
    .await;

    let first = consume(&closed, 1, PATIENCE).await;
    assert_eq!(first[0].payload(), Some(&b"done"[..]));
    let mut discarded = HashMap::new();
    while discarded.values().sum::<usize>() < 3 {
        let (id, count, verdict) = wait_for_event(
            &mut events,
            "a call whose emits were discarded",
            |e| match e {
                Event::EmitsDiscarded(events::EmitsDiscarded {
                    id, count, verdict, ..
                }) => Some((id.clone(), *count, *verdict)),
                _ => None,
            },
        )
        .await;
        assert_eq!(count, 1);
        *discarded.entry((id, verdict)).or_insert(0) += count;
    }
    assert_eq!(
        discarded[&("retried".to_string(), VerdictKind::Retryable)],
        2
    );
    assert_eq!(discarded[&("failed".to_string(), VerdictKind::Fatal)], 1);
    // Nothing else arrives on the emit topic: read it again from the start.
    let again = consume_for(&closed, Duration::from_secs(2)).await;
    assert_eq!(again.len(), 1, "only the ok message's record");
    hopper.stop().await;
}

/// Every record on `topic` from the beginning, read for `wait`.
async fn consume_for(topic: &str, wait: Duration) -> Vec<rdkafka::message::OwnedMessage> {
    let consumer = reader(topic);
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Ok(m)) = tokio::time::timeout_at(deadline, consumer.recv()).await {
        out.push(m.detach());
    }
    out
}

/// kill -9 while messages are being handled: some emits are acknowledged
/// but their offsets not yet committed. After a restart every emitted
/// record is there at least once (any re-handled one twice, with the same
/// id), and every source message was handled. The done prefix is committed
/// every 50 ms, so a kill may land where every acknowledged emit is
/// committed already: the test does not need a duplicate, only a kill in
/// the middle of the stream, which it shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_between_the_emit_and_the_commit_loses_no_record_and_no_message() {
    const MESSAGES: usize = 200;
    // One message at a time per partition, so the kill lands while both
    // partitions are busy, not after every message was handled.
    let (route, closed) = emitting_route(|r| r.ordering("partition")).await;
    create_topics(&[&closed]).await;
    let spawn = || {
        Killed(
            std::process::Command::new(hopper_bin())
                .args(["run", "--config"])
                .arg(&route.config_path)
                .arg("--cache-dir")
                .arg(cache_dir())
                .env("HOPPER_LOG", "warn")
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("hopper runs"),
        )
    };
    let producer = producer();
    for i in 0..MESSAGES {
        let id = format!("m{i}");
        // 20 ms each: the kill lands while both partitions are busy.
        let steps = json!([emit(&closed, &id), {"sleep_ms": 20}]);
        produce(
            &producer,
            &route.input,
            Some(&id),
            &script(steps, "ok"),
            &[("hopper-id", &id)],
        )
        .await;
    }
    let mut first = spawn();
    let consumer = reader(&closed);
    let mut copies: HashMap<String, usize> = HashMap::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while copies.len() < MESSAGES / 10 {
        let m = tokio::time::timeout_at(deadline, consumer.recv())
            .await
            .expect("the first hopper emits")
            .unwrap();
        *copies
            .entry(header_map(&m.detach()).0["hopper-id"].clone())
            .or_default() += 1;
    }
    first.kill();
    let killed_at = now_ms();

    let mut second = spawn();
    // Records first produced after the kill: the second process's work.
    let mut after_kill = 0;
    while copies.len() < MESSAGES {
        let Ok(m) = tokio::time::timeout_at(deadline, consumer.recv()).await else {
            panic!(
                "only {} of {MESSAGES} emitted records arrived",
                copies.len()
            );
        };
        let m = m.unwrap().detach();
        let id = header_map(&m).0["hopper-id"].clone();
        let copy = copies.entry(id).or_default();
        if *copy == 0 && m.timestamp().to_millis().is_some_and(|at| at > killed_at) {
            after_kill += 1;
        }
        *copy += 1;
    }
    second.kill();
    for i in 0..MESSAGES {
        assert!(copies.contains_key(&format!("m{i}/emit/0")), "m{i} lost");
    }
    // The positive control: the kill landed mid-stream, with records the
    // first process never produced left for the second.
    assert!(
        after_kill > 0,
        "the first hopper emitted every record before the kill; the test proves nothing"
    );
    let duplicated = copies.values().filter(|n| **n > 1).count();
    eprintln!("{after_kill} records first emitted after the kill; {duplicated} emitted twice");
}

/// A child process, killed with SIGKILL when dropped, so a failing test
/// leaves no hopper behind.
struct Killed(std::process::Child);

impl Killed {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.kill();
    }
}
