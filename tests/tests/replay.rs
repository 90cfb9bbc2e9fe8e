//! Replay against a real broker: a dry run changes nothing, a replay is
//! handled again and counted per record, the loop guard trips at its limit,
//! and the rate limit holds.

use hopper::config::OwnedKind;
use hopper::events::{self, Event};
use hopper::kafka::Cluster;
use hopper_tests::*;
use rdkafka::Message;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A route whose handler fails (`fatal`) every message `config:fixed=yes`
/// until its config says `fixed = "yes"`: the cause, and the fix.
fn broken_route(max_replays: u32, rate: u32) -> TestRoute {
    ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")).config("fixed", "no"))
        .admin(AdminTable::loopback().token(TOKEN))
        .replay(max_replays, rate)
        .test_route()
}

fn fix(route: &TestRoute) {
    let text = std::fs::read_to_string(&route.config_path).unwrap();
    std::fs::write(
        &route.config_path,
        text.replace("fixed = \"no\"", "fixed = \"yes\""),
    )
    .unwrap();
}

fn cluster() -> Cluster {
    Cluster::new(brokers(), Default::default())
}

fn size(topic: &str) -> i64 {
    hopper::lag::topic_size(&cluster(), topic).unwrap()
}

/// `topic:partition:offset` of a record.
fn at(m: &rdkafka::message::OwnedMessage) -> String {
    format!("{}:{}:{}", m.topic(), m.partition(), m.offset())
}

/// The headers `genuine` has, with `changes` in place of theirs: a dead
/// letter as anyone who can write the DLQ could forge it.
fn forged(
    genuine: &std::collections::HashMap<String, String>,
    changes: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = genuine
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in changes {
        headers.retain(|(k, _)| k != key);
        headers.push((key.to_string(), value.to_string()));
    }
    headers
}

/// A replay through the admin API: a filter's selection is a run, whose
/// final status this returns; records named one by one are replayed before
/// the answer, their report.
async fn replay(addr: std::net::SocketAddr, body: Value) -> Value {
    if body.get("filter").is_some() {
        let status = replay_run(addr, Some(TOKEN), &body).await;
        assert_eq!(status["state"], "done", "{status}");
        return status;
    }
    let (status, answer) = http(
        addr,
        "POST",
        "/api/replay",
        Some(TOKEN),
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    serde_json::from_str(&answer).unwrap()
}

/// The DLQ listing of `route` through the admin API.
async fn listing(addr: std::net::SocketAddr, route: &str) -> Value {
    get_json_as(addr, &format!("/api/dlq?route={route}"), Some(TOKEN)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_lists_what_would_be_replayed_and_changes_nothing() {
    init_tracing();
    let route = broken_route(3, 100);
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let producer = producer();
    for id in ["d1", "d2"] {
        produce(
            &producer,
            &route.input,
            None,
            "config:fixed=yes",
            &[("hopper-id", id)],
        )
        .await;
    }
    consume(&route.dlq, 2, PATIENCE).await;
    // Someone else's record in the DLQ: skipped, and the reason says why.
    produce(&producer, &route.dlq, None, "not hopper's", &[]).await;
    let report = replay(addr, json!({ "filter": {}, "dry_run": true })).await;
    assert_eq!(report["dry_run"], true);
    // A run's status keeps the outcomes that were not a plain replay.
    let outcomes = report["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 1, "{report}");
    assert_eq!(outcomes[0]["action"], "skip", "{report}");
    assert_eq!(
        outcomes[0]["problem"],
        "not a hopper dead-letter record: header hopper-id: is missing"
    );
    assert_eq!(report["skipped"], 1, "{report}");
    assert_eq!(report["replayed"], 2, "a dry run counts what it would do");
    assert_eq!(size(&route.dlq), 3, "the DLQ is untouched");
    let list = listing(addr, &route.name).await;
    assert_eq!(list["total"], 2, "the foreign record has no route: {list}");
    assert!(
        list["records"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["replayed"] == 0)
    );
    // The same request for real: its records are acknowledged before the
    // run is done, so a record the dry run had sent would be counted with
    // them.
    let report = replay(addr, json!({ "filter": {} })).await;
    assert_eq!(report["replayed"], 2, "{report}");
    assert_eq!(
        size(&route.input),
        2 + 2,
        "the dry run added nothing to the input"
    );
    assert_eq!(
        size(&format!("{}.replays", route.dlq)),
        2,
        "the dry run recorded no replay"
    );
    // Handled again with the same config, the replayed records fail again
    // and are dead-lettered again: two more, and no other.
    consume(&route.dlq, 5, PATIENCE).await;
    assert_eq!(size(&route.dlq), 5, "the dry run added nothing to the DLQ");
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_record_is_handled_again_and_each_replay_is_counted_on_it() {
    init_tracing();
    let route = broken_route(5, 100);
    let hopper = route.start().await;
    let producer = producer();
    let (_, origin_offset) = produce(
        &producer,
        &route.input,
        Some("k1"),
        "config:fixed=yes",
        &[("hopper-id", "r1"), ("x-trace", "t-9")],
    )
    .await;
    let dead = consume(&route.dlq, 1, PATIENCE).await.remove(0);
    hopper.stop().await;

    // The cause is fixed; replay the record.
    fix(&route);
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let mut events = hopper.events();
    for round in 1..=2u32 {
        let report = replay(addr, json!({ "records": [at(&dead)] })).await;
        assert_eq!(report["replayed"], 1, "{report}");
        let (attempt, verdict) = wait_for_event(&mut events, "the call of `r1`", |e| match e {
            Event::Handled(events::Handled {
                id,
                attempt,
                verdict,
                ..
            }) if id == "r1" => Some((*attempt, *verdict)),
            _ => None,
        })
        .await;
        assert_eq!(
            (attempt, verdict.as_str()),
            (1, "ok"),
            "attempts start over"
        );
        let list = listing(addr, &route.name).await;
        assert_eq!(
            list["records"][0]["replayed"], round,
            "round {round}: {list}"
        );
    }
    let replayed = consume(&route.input, 3, PATIENCE).await;
    let (h, counts) = header_map(&replayed[1]);
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    assert_eq!(replayed[1].key(), Some(&b"k1"[..]));
    assert_eq!(h["hopper-id"], "r1");
    assert_eq!(h["hopper-replay-count"], "1");
    assert_eq!(h["hopper-trail"], "dlq,replay");
    assert_eq!(h["hopper-origin-topic"], route.input);
    assert_eq!(h["hopper-origin-offset"], origin_offset.to_string());
    assert_eq!(h["hopper-replayed-from"], at(&dead));
    assert_eq!(h["x-trace"], "t-9", "the producer's headers are kept");
    assert!(!h.contains_key("hopper-reason") && !h.contains_key("hopper-attempt"));
    assert_eq!(size(&route.dlq), 1, "the DLQ is never changed");
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_guard_sends_a_record_past_its_limit_back_with_replay_loop() {
    init_tracing();
    let route = broken_route(1, 100);
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let mut events = hopper.events();
    // Keyed, so every record of it lands in one partition, in order.
    produce(
        &producer(),
        &route.input,
        Some("loop-key"),
        "config:fixed=yes",
        &[("hopper-id", "loop")],
    )
    .await;
    let first = consume(&route.dlq, 1, PATIENCE).await.remove(0);

    // Replay 1 of 1 is allowed; the handler is still broken.
    let report = replay(addr, json!({ "records": [at(&first)] })).await;
    assert_eq!(report["replayed"], 1, "{report}");
    let second = consume(&route.dlq, 2, PATIENCE).await.remove(1);
    let (h, _) = header_map(&second);
    assert_eq!(h["hopper-replay-count"], "1");
    assert_eq!(h["hopper-trail"], "dlq,replay,dlq");
    assert_eq!(h["hopper-reason"], "FATAL");

    // Replaying its new dead letter, or the first one again, is one too many.
    for record in [&second, &first] {
        let report = replay(addr, json!({ "records": [at(record)] })).await;
        assert_eq!(report["looped"], 1, "{report}");
        assert_eq!(report["outcomes"][0]["action"], "loop");
    }
    let looped = consume(&route.dlq, 4, PATIENCE).await;
    for record in &looped[2..] {
        let (h, _) = header_map(record);
        assert_eq!(h["hopper-reason"], "REPLAY_LOOP");
        assert_eq!(h["hopper-id"], "loop");
        assert_eq!(h["hopper-replay-count"], "1");
        assert!(
            h["hopper-last-error"].contains("replay.max_replays"),
            "{h:?}"
        );
    }
    assert_eq!(size(&route.input), 2, "the loop guard replays nothing");
    // The handler saw the message twice: once, and once replayed.
    let mut calls = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Ok(event)) = tokio::time::timeout_at(deadline, events.recv()).await {
        calls +=
            matches!(&event, Event::Handled(events::Handled { id, .. }) if id == "loop") as u32;
    }
    assert_eq!(calls, 2);
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_holds_its_rate_limit() {
    init_tracing();
    let route = broken_route(3, 5);
    let hopper = route.start().await;
    let producer = producer();
    for i in 0..11 {
        produce(
            &producer,
            &route.input,
            None,
            "config:fixed=yes",
            &[("hopper-id", &format!("rate-{i}"))],
        )
        .await;
    }
    consume(&route.dlq, 11, PATIENCE).await;
    hopper.stop().await;

    let config = route.config();
    let cluster = cluster();
    let (c, k) = (config.clone(), cluster.clone());
    let selected = tokio::task::spawn_blocking(move || {
        hopper::dlq::Dlq {
            cluster: &k,
            config: &c,
        }
        .select(&Default::default(), 100)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(selected.len(), 11);
    let dlq = hopper::dlq::Dlq {
        cluster: &cluster,
        config: &config,
    };
    let pacer = hopper::dlq::Pacer::new(config.replay.rate);
    let started = Instant::now();
    let report = dlq
        .replay(
            hopper::dlq::run::RunId::new(),
            selected,
            3,
            false,
            &pacer,
            &hopper::trace::Tracer::default(),
            |_| {},
        )
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(report.replayed, 11);
    // 11 produces at 5 a second: the first at once, then one every 200 ms.
    assert!(
        took >= Duration::from_millis(2000),
        "11 replays took {took:?}"
    );
}

/// Regression: a replay took its destination from the record's own
/// `hopper-route` and `hopper-origin-topic`, so anyone who could write to a
/// dead-letter topic could forge a record that a replay sent to another
/// route, or through the delay relay to any topic. A record now goes back
/// only to an input of the route that owns the topic it was read from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_dead_letter_is_skipped_and_never_reaches_the_topic_it_names() {
    init_tracing();
    let other = rand_name("other");
    let inbox = rand_name("inbox");
    let victim = rand_name("victim");
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")))
        .admin(AdminTable::loopback().token(TOKEN))
        .delay(DelayTable::default().inbox(&inbox))
        .route(RouteTable::named(&other, &plugin("scripted")))
        .test_route();
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let producer = producer();
    create_topics(&[&victim]).await;
    produce(
        &producer,
        &route.input,
        Some("k"),
        "fatal",
        &[("hopper-id", "real")],
    )
    .await;
    let genuine = consume(&route.dlq, 1, PATIENCE).await.remove(0);
    let (h, _) = header_map(&genuine);
    let forge = |changes: &[(&str, &str)]| forged(&h, changes);
    let other_input = format!("{other}.in");
    let forged = [
        forge(&[("hopper-id", "as-other"), ("hopper-route", &other)]),
        forge(&[
            ("hopper-id", "as-relay"),
            ("hopper-route", "delay"),
            ("hopper-target", &victim),
            ("hopper-deliver-at", "0"),
        ]),
        forge(&[
            ("hopper-id", "outside"),
            ("hopper-origin-topic", &other_input),
        ]),
    ];
    for headers in &forged {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        produce(&producer, &route.dlq, Some("k"), "forged", &headers).await;
    }
    consume(&route.dlq, 4, PATIENCE).await;

    let dry = replay(addr, json!({ "filter": {}, "dry_run": true })).await;
    let report = replay(addr, json!({ "filter": {} })).await;
    for report in [&dry, &report] {
        let find = |id: &str| {
            report["outcomes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| o["id"] == id)
                .cloned()
        };
        let problem = |id: &str| find(id).unwrap_or_else(|| panic!("{id} is not in {report}"));
        // The positive control: the genuine record is replayed (a plain
        // replay, which the run's status counts but does not list).
        assert_eq!(report["replayed"], 1, "{report}");
        assert_eq!(find("real"), None, "{report}");
        assert_eq!(report["skipped"], 3, "{report}");
        for id in ["as-other", "as-relay", "outside"] {
            assert_eq!(problem(id)["action"], "skip", "{report}");
        }
        let text = |id: &str| problem(id)["problem"].as_str().unwrap().to_string();
        assert_eq!(
            text("as-other"),
            format!(
                "header hopper-route names `{other}`, but `{}` is the dead-letter topic of route `{}`",
                route.dlq, route.name
            )
        );
        assert_eq!(
            text("as-relay"),
            format!(
                "header hopper-route names `delay`, but `{}` is the dead-letter topic of route `{}`",
                route.dlq, route.name
            )
        );
        assert_eq!(
            text("outside"),
            format!(
                "header hopper-origin-topic names `{other_input}`, which is not an input of route `{}` ({})",
                route.name, route.input
            )
        );
    }
    assert_eq!(report["replayed"], 1, "{report}");
    // The run produced (and awaited) every record before it was done, so
    // what reached each topic is there now: the genuine record went back
    // to its input, and nothing reached another route, the relay or the
    // topic a forged header named.
    let back = consume(&route.input, 2, PATIENCE).await;
    assert_eq!(header_map(&back[1]).0["hopper-id"], "real");
    assert_eq!(size(&other_input), 0);
    assert_eq!(size(&inbox), 0);
    assert_eq!(size(&victim), 0);
    hopper.stop().await;
}

/// Every kind of hopper's own topic, named as a dead letter's origin or as
/// a relay dead letter's target, is refused as a replay's destination:
/// the kinds come from hopper's one list, so a kind added later is tried
/// here without this test changing.
#[tokio::test(flavor = "multi_thread")]
async fn no_kind_of_hoppers_own_topic_is_a_replay_destination() {
    init_tracing();
    let inbox = rand_name("inbox");
    let builder = ConfigBuilder::new()
        .route(
            RouteTable::new(&plugin("scripted"))
                .ordering("key")
                .key("retry_order", quoted("key")),
        )
        .admin(AdminTable::loopback().token(TOKEN))
        .delay(DelayTable::default().inbox(&inbox));
    let route = builder.test_route();
    let config = route.config();
    let owned = config.owned();
    let relay = config.delay.clone().unwrap();
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let producer = producer();
    produce(
        &producer,
        &route.input,
        Some("k"),
        "fatal",
        &[("hopper-id", "real")],
    )
    .await;
    let genuine = consume(&route.dlq, 1, PATIENCE).await.remove(0);
    let (h, _) = header_map(&genuine);
    let forge = |changes: &[(&str, &str)]| forged(&h, changes);
    let mut expected: Vec<(String, String)> = Vec::new();
    let (mut in_route_dlq, mut in_relay_dlq) = (0, 0);
    for kind in OwnedKind::ALL {
        let topics: Vec<String> = owned.of_kind(kind).map(|o| o.topic.clone()).collect();
        assert!(!topics.is_empty(), "the config has no {kind:?} topic");
        for (n, topic) in topics.iter().enumerate() {
            let as_origin = format!("origin-{kind:?}-{n}");
            let as_target = format!("target-{kind:?}-{n}");
            for (dlq, headers) in [
                (
                    &route.dlq,
                    forge(&[("hopper-id", &as_origin), ("hopper-origin-topic", topic)]),
                ),
                (
                    &relay.dlq,
                    forge(&[
                        ("hopper-id", &as_target),
                        ("hopper-route", "delay"),
                        ("hopper-target", topic),
                        ("hopper-deliver-at", "0"),
                    ]),
                ),
            ] {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                produce(&producer, dlq, Some("k"), "forged", &headers).await;
            }
            in_route_dlq += 1;
            in_relay_dlq += 1;
            let origin_problem = match owned.get(topic).unwrap().kind {
                // Another route's dead-letter topic may be an input; this
                // one is not an input of the route.
                OwnedKind::DeadLetter => format!(
                    "header hopper-origin-topic names `{topic}`, which is not an input of route `{}` ({})",
                    route.name, route.input
                ),
                _ => format!(
                    "header hopper-origin-topic names `{topic}`, {}, which a replay never writes",
                    owned
                        .refusal(topic)
                        .unwrap()
                        .trim_start_matches(&format!("`{topic}` is "))
                        .replace(", which only hopper writes", "")
                ),
            };
            expected.push((as_origin, origin_problem));
            expected.push((
                as_target,
                format!(
                    "header hopper-target: {}",
                    relay.check_target(topic).unwrap_err()
                ),
            ));
        }
    }
    consume(&route.dlq, 1 + in_route_dlq, PATIENCE).await;
    consume(&relay.dlq, in_relay_dlq, PATIENCE).await;
    for dry_run in [true, false] {
        let report = replay(addr, json!({ "filter": {}, "dry_run": dry_run })).await;
        let outcomes = report["outcomes"].as_array().unwrap();
        let outcome = |id: &str| {
            outcomes
                .iter()
                .find(|o| o["id"] == id)
                .unwrap_or_else(|| panic!("{id} is not in {report}"))
                .clone()
        };
        // The positive control: the genuine record is replayed (a plain
        // replay, which the run's status counts but does not list).
        assert_eq!(report["replayed"], 1, "{report}");
        assert!(outcomes.iter().all(|o| o["id"] != "real"), "{report}");
        for (id, problem) in &expected {
            let got = outcome(id);
            assert_eq!(got["action"], "skip", "{id}: {got}");
            assert_eq!(got["problem"], problem.as_str(), "{id}");
        }
        assert_eq!(report["skipped"], expected.len(), "{report}");
    }
    // The genuine record, replayed, failed again: wait for its second dead
    // letter, so the count below is final.
    consume(&route.dlq, 2 + in_route_dlq, PATIENCE).await;
    // Nothing reached a topic a forged header named: the replay awaited every
    // record it produced before it answered.
    for own in owned.iter() {
        let want = if own.topic == route.dlq {
            2 + in_route_dlq
        } else if own.topic == relay.dlq {
            in_relay_dlq
        } else if own.kind == OwnedKind::ReplayJournal {
            continue; // each replay is recorded there
        } else {
            0
        };
        assert_eq!(size(&own.topic), want as i64, "{}", own.topic);
    }
    hopper.stop().await;
}

/// A replay through the admin API is a run like the CLI's: the CLI's
/// `--resume RUN` with the same selection finds every record of it
/// replayed, and replays none again. (A server killed part way leaves the
/// run in the journal; its log line at the start names the run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_api_replay_is_a_run_the_cli_resumes_without_replaying_twice() {
    init_tracing();
    let route = broken_route(5, 1000);
    const N: usize = 4;
    dead_letters(&route, "api", N).await;
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let report = replay(addr, json!({ "filter": { "route": route.name } })).await;
    assert_eq!(report["replayed"], N, "{report}");
    let run = report["run"]
        .as_str()
        .expect("the report names its run")
        .to_string();
    hopper.stop().await;

    let (out, stdout, stderr) = resume_by_cli(&route, &run);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "Resuming run {run}: {N} record(s) replayed before"
        )),
        "{stderr}"
    );
    assert!(
        stdout.contains("Replayed 0 of 0 record(s)")
            && stdout.contains(&format!("{N} more were replayed by run {run} before")),
        "{stdout}"
    );
    // The input holds the N messages and one replay of each, by this run.
    let input = consume(&route.input, 2 * N, PATIENCE).await;
    let mut from = std::collections::HashMap::new();
    for m in &input {
        let (h, _) = header_map(m);
        if h.get("hopper-replay-run") == Some(&run) {
            *from.entry(h["hopper-replayed-from"].clone()).or_insert(0) += 1;
        }
    }
    assert_eq!(from.len(), N, "{from:?}");
    assert!(from.values().all(|n| *n == 1), "{from:?}");
    assert_eq!(
        size(&route.input),
        2 * N as i64,
        "nothing was replayed again"
    );
}

/// The route of [`broken_route`] with `replay.max_records` at `max` and
/// the admin server on `listen`.
fn capped_route(rate: u32, max: usize, listen: &str) -> TestRoute {
    ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")).config("fixed", "no"))
        .admin(AdminTable::listen(listen).token(TOKEN))
        .replay(5, rate)
        .key("replay", "max_records", max)
        .test_route()
}

/// `n` messages through `route`'s broken handler, each dead-lettered once;
/// then the handler is fixed, so that their replays are handled and stay
/// in the input.
async fn dead_letters(route: &TestRoute, prefix: &str, n: usize) {
    let hopper = route.start().await;
    let producer = producer();
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        produce(
            &producer,
            &route.input,
            Some(&id),
            "config:fixed=yes",
            &[("hopper-id", &id)],
        )
        .await;
    }
    consume(&route.dlq, n, PATIENCE).await;
    hopper.stop().await;
    fix(route);
}

/// The replays of run `run` in `topic`: how many times each dead letter
/// (`hopper-replayed-from`) was replayed by it.
async fn replays_of(topic: &str, run: &str) -> std::collections::HashMap<String, usize> {
    let mut from = std::collections::HashMap::new();
    for m in consume(topic, size(topic) as usize, PATIENCE).await {
        let (h, _) = header_map(&m);
        if h.get("hopper-replay-run").map(String::as_str) == Some(run) {
            *from.entry(h["hopper-replayed-from"].clone()).or_insert(0) += 1;
        }
    }
    from
}

/// A selection larger than `replay.max_records` is replayed whole, as a
/// run in the background whose status goes from `running` to `done`; its
/// dry run plans all of it, and each record reaches the input once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_api_replay_of_a_filter_is_a_run_of_any_size_with_its_progress() {
    init_tracing();
    const N: usize = 300;
    let route = capped_route(100, 50, "127.0.0.1:0");
    dead_letters(&route, "big", N).await;
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let filter = json!({ "route": route.name });

    let plan = replay_run(
        addr,
        Some(TOKEN),
        &json!({ "filter": filter, "dry_run": true }),
    )
    .await;
    assert_eq!(plan["state"], "done", "{plan}");
    assert_eq!(plan["dry_run"], true, "{plan}");
    assert_eq!(plan["replayed"], N, "the dry run plans all: {plan}");
    assert_eq!(size(&route.input), N as i64, "a dry run produces nothing");
    // Records named one by one stay bounded by replay.max_records.
    let records: Vec<String> = (0..51).map(|o| format!("{}:0:{o}", route.dlq)).collect();
    let (status, answer) = http(
        addr,
        "POST",
        "/api/replay",
        Some(TOKEN),
        Some(&json!({ "records": records }).to_string()),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("replay.max_records allows 50"), "{answer}");

    // At 100 a second, 300 records take 3 s at least: the status read at
    // once finds the run running.
    let (status, answer) = http(
        addr,
        "POST",
        "/api/replay",
        Some(TOKEN),
        Some(&json!({ "filter": filter }).to_string()),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let started: Value = serde_json::from_str(&answer).unwrap();
    let run = started["run"].as_str().unwrap().to_string();
    let path = started["status"].as_str().unwrap().to_string();
    let first = get_json_as(addr, &path, Some(TOKEN)).await;
    assert_eq!(first["state"], "running", "{first}");
    assert_eq!(first["run"], run.as_str());
    assert!(first["finished_at_ms"].is_null(), "{first}");
    let done = run_ended(addr, Some(TOKEN), &run).await;
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["replayed"], N, "{done}");
    for count in ["looped", "skipped", "failed", "already"] {
        assert_eq!(done[count], 0, "{count}: {done}");
    }
    assert_eq!(
        done["outcomes"],
        json!([]),
        "plain replays are counted, not listed"
    );
    assert!(done["error"].is_null(), "{done}");
    assert!(
        done["finished_at_ms"].as_i64().unwrap() >= done["started_at_ms"].as_i64().unwrap(),
        "{done}"
    );
    let replays = replays_of(&route.input, &run).await;
    assert_eq!(replays.len(), N, "every record replayed");
    assert!(replays.values().all(|n| *n == 1), "{replays:?}");
    hopper.stop().await;
}

/// What a run refuses, each named: an unknown run, a malformed run id to
/// resume, a fifth run at once, a resume of a run still running, and
/// records with a filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_replay_runs_refuse_what_they_cannot_do_and_name_it() {
    init_tracing();
    // One record a second: three dead letters keep each run running.
    let route = capped_route(1, 50, "127.0.0.1:0");
    dead_letters(&route, "bound", 3).await;
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let post = |body: Value| async move {
        http(
            addr,
            "POST",
            "/api/replay",
            Some(TOKEN),
            Some(&body.to_string()),
        )
        .await
    };

    let (status, answer) = http(addr, "GET", "/api/replay/runs/r-nope", Some(TOKEN), None).await;
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer.contains("replay run `r-nope` is not one of"),
        "{answer}"
    );
    let (status, answer) = http(addr, "GET", "/api/replay/runs/r-nope", None, None).await;
    assert_eq!(
        status, 401,
        "a run's status is a read, with the token: {answer}"
    );
    let (status, answer) = post(json!({ "filter": {}, "resume": "x;y" })).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("`x;y` is not a replay run id"), "{answer}");
    let (status, answer) = post(json!({ "filter": {}, "resume": "r-nope" })).await;
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer.contains(&format!(
            "replay run `r-nope` is not in `{}.replays`",
            route.dlq
        )),
        "{answer}"
    );
    let (status, answer) =
        post(json!({ "records": [format!("{}:0:0", route.dlq)], "filter": {} })).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("either records or filter"), "{answer}");

    let mut runs = Vec::new();
    for _ in 0..4 {
        let (status, answer) = post(json!({ "filter": {} })).await;
        assert_eq!(status, 202, "{answer}");
        let started: Value = serde_json::from_str(&answer).unwrap();
        runs.push(started["run"].as_str().unwrap().to_string());
    }
    let (status, answer) = post(json!({ "filter": {} })).await;
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("4 replay runs are running"), "{answer}");
    let (status, answer) = post(json!({ "filter": {}, "resume": runs[0] })).await;
    assert_eq!(status, 409, "a run resumed while it runs: {answer}");
    assert!(
        answer.contains(&format!("replay run {} is running", runs[0])),
        "{answer}"
    );
    let running = get_json_as(addr, &format!("/api/replay/runs/{}", runs[3]), Some(TOKEN)).await;
    assert_eq!(running["state"], "running", "{running}");
    // Stopped with the server, between two batches.
    hopper.stop().await;
}

/// A server killed (SIGKILL) in the middle of a run: a new server's
/// `POST /api/replay` with `resume` replays the rest, none twice, and
/// counts the ones replayed before; the CLI's `--resume` then finds all
/// of it done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_api_run_killed_part_way_is_resumed_by_the_api_none_twice() {
    init_tracing();
    const N: usize = 300;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    let route = capped_route(50, 50, &listen);
    dead_letters(&route, "kill", N).await;

    let mut child = Killed(
        std::process::Command::new(hopper_bin())
            .args(["run", "--config"])
            .arg(&route.config_path)
            .env("HOPPER_CACHE_DIR", cache_dir())
            .env_remove("HOPPER_BROKERS")
            .env_remove("HOPPER_LOG_FORMAT")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        let up = tokio::net::TcpStream::connect(addr).await.is_ok()
            && http(addr, "GET", "/health", None, None).await.0 == 200;
        if up {
            break;
        }
        assert!(Instant::now() < deadline, "hopper run serves no admin API");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let filter = json!({ "route": route.name });
    let (status, answer) = http(
        addr,
        "POST",
        "/api/replay",
        Some(TOKEN),
        Some(&json!({ "filter": filter }).to_string()),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let started: Value = serde_json::from_str(&answer).unwrap();
    let run = started["run"].as_str().unwrap().to_string();
    // Killed once its status shows some replayed: at 50 a second, the
    // 300 take 6 s.
    loop {
        let status = get_json_as(addr, &format!("/api/replay/runs/{run}"), Some(TOKEN)).await;
        assert_eq!(
            status["state"], "running",
            "killed before the end: {status}"
        );
        if status["replayed"].as_u64().unwrap() >= 30 {
            break;
        }
        assert!(Instant::now() < deadline, "{status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let before = replays_of(&route.input, &run).await;
    assert!(
        before.len() >= 30 && before.len() < N,
        "{} replayed before the kill",
        before.len()
    );
    assert!(before.values().all(|n| *n == 1), "{before:?}");

    // A new server resumes it: the rest, none twice.
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let resumed = replay_run(
        addr,
        Some(TOKEN),
        &json!({ "filter": filter, "resume": run }),
    )
    .await;
    assert_eq!(resumed["state"], "done", "{resumed}");
    assert_eq!(resumed["run"], run.as_str());
    assert_eq!(resumed["resumed"], true);
    let already = resumed["already"].as_u64().unwrap() as usize;
    let replayed = resumed["replayed"].as_u64().unwrap() as usize;
    assert_eq!(already + replayed, N, "{resumed}");
    let all = replays_of(&route.input, &run).await;
    assert_eq!(all.len(), N, "every record replayed");
    let twice: Vec<_> = all.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "replayed more than once: {twice:?}");
    assert_eq!(
        already,
        before.len(),
        "already counts those replayed before the kill"
    );
    hopper.stop().await;

    // The CLI's resume of the same run finds every record replayed.
    let (out, stdout, stderr) = resume_by_cli(&route, &run);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Replayed 0 of 0 record(s)")
            && stdout.contains(&format!("{N} more were replayed by run {run} before")),
        "{stdout}"
    );
    assert_eq!(replays_of(&route.input, &run).await.len(), N);
}

/// A child process killed when dropped: a failed assertion leaves no
/// `hopper run` behind, holding its admin port and its group.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `hopper dlq replay --route ROUTE --resume RUN` on `route`'s config, to
/// its end: its output, stdout and stderr.
fn resume_by_cli(route: &TestRoute, run: &str) -> (std::process::Output, String, String) {
    let out = std::process::Command::new(hopper_bin())
        .args(["dlq", "replay", "--config"])
        .arg(&route.config_path)
        .args(["--route", &route.name, "--resume", run])
        .env_remove("HOPPER_BROKERS")
        .env_remove("HOPPER_LOG_FORMAT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}
