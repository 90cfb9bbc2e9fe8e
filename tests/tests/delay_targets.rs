//! The delay relay's target topics: a lookup that gets no answer is not a
//! missing topic, and a target deleted while hopper runs is noticed.
//!
//! Regressions: a metadata error while checking a target dead-lettered a
//! valid message as "topic does not exist"; a target, once found, was
//! trusted for ever, so messages went on being forwarded to it after it was
//! deleted; and a target the cluster answered with an error for the topic
//! was looked up again for ever, the message holding its place meanwhile.

use hopper::Hopper;
use hopper::config::OwnedKind;
use hopper::delay::TARGET_TRUSTED_FOR;
use hopper::metrics::series;

use hopper::embedded::EmbeddedBroker;
use hopper_tests::*;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureProducer;
use rdkafka::types::RDKafkaRespErr;
use std::time::Duration;

/// The high watermark of each partition of `topic`, summed: how many
/// records it holds.
fn records_in(brokers: &str, topic: &str) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let partitions = metadata.topics()[0].partitions().len() as i32;
    (0..partitions)
        .map(|p| {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap();
            high - low
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_without_a_leader_for_a_while_is_waited_for_not_dead_lettered() {
    logs::capture();
    let broker = EmbeddedBroker::start().unwrap();
    let bootstrap = broker.bootstrap_servers();
    let file = ConfigBuilder::new()
        .brokers(&bootstrap)
        .partitions(1)
        .delay(DelayTable::default().tiers(&["1s"]))
        .write();
    let config = file.load();
    let relay = config.delay.clone().unwrap();
    broker.create_topics(&config.all_topics(), 1).unwrap();
    // Named for this test alone: the log lines below are told apart by it.
    let target = rand_name("orders");
    broker.create_topics([&target], 1).unwrap();
    // The target exists, but the cluster answers every lookup of it with
    // LEADER_NOT_AVAILABLE, as it does during a leader election.
    broker
        .mock()
        .topic_error(
            &target,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        )
        .unwrap();
    let hopper = Hopper::start(config, options())
        .await
        .expect("hopper starts");
    // Consuming before the message is sent, so that the relay reads it
    // while the error is in place.
    let ready_by = tokio::time::Instant::now() + PATIENCE;
    while !hopper.telemetry().health().ready() {
        assert!(
            tokio::time::Instant::now() < ready_by,
            "the relay never got its partitions"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let at = (now_ms() + 300).to_string();
    produce(
        &producer,
        &relay.inbox,
        None,
        "close order 7",
        &[("hopper-target", &target), ("hopper-deliver-at", &at)],
    )
    .await;
    // Several lookups of the target get an error for it meanwhile.
    let failed = logs::wait_for_lines(
        &[
            "Delay target lookup got an error for the topic",
            &format!("topic=\"{target}\""),
        ],
        3,
    )
    .await;
    assert!(
        failed[0].contains("LEADER_NOT_AVAILABLE") || failed[0].contains("Leader not available"),
        "{failed:?}"
    );
    let counted = count(hopper.telemetry(), &series::FailedTargetLookups);
    assert!(counted >= 3, "each failed lookup is counted: {counted}");
    broker
        .mock()
        .topic_error(&target, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .unwrap();

    let consumer: rdkafka::consumer::StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", rand_name("reader"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[&target]).unwrap();
    let got = tokio::time::timeout(PATIENCE, consumer.recv())
        .await
        .expect("the message reaches its target once the leader is back")
        .unwrap();
    assert_eq!(rdkafka::Message::payload(&got), Some(&b"close order 7"[..]));
    assert_eq!(
        records_in(&bootstrap, &relay.dlq),
        0,
        "a valid message was dead-lettered"
    );
    hopper.stop().await;
}

/// A target the cluster answers with an error for the topic for good (here
/// LEADER_NOT_AVAILABLE; the test broker answers no such error, the
/// embedded one can be told to) is asked about for `[delay]
/// target_lookup_timeout`, then the message goes to the relay's DLQ as
/// `HOP_FAILED`, its scheduling headers kept for a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_answered_with_an_error_for_target_lookup_timeout_is_dead_lettered_as_hop_failed()
{
    logs::capture();
    let broker = EmbeddedBroker::start().unwrap();
    let bootstrap = broker.bootstrap_servers();
    let file = ConfigBuilder::new()
        .brokers(&bootstrap)
        .partitions(1)
        .delay(
            DelayTable::default()
                .tiers(&["1s"])
                .key("target_lookup_timeout", "\"2s\""),
        )
        .write();
    let config = file.load();
    let relay = config.delay.clone().unwrap();
    broker.create_topics(&config.all_topics(), 1).unwrap();
    let target = rand_name("orders");
    broker.create_topics([&target], 1).unwrap();
    broker
        .mock()
        .topic_error(
            &target,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        )
        .unwrap();
    let hopper = Hopper::start(config, options())
        .await
        .expect("hopper starts");

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let at = (now_ms() + 300).to_string();
    produce(
        &producer,
        &relay.inbox,
        Some("o-7"),
        "close order 7",
        &[
            ("hopper-target", &target),
            ("hopper-deliver-at", &at),
            ("hopper-id", "o-7"),
        ],
    )
    .await;

    let consumer: rdkafka::consumer::StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", rand_name("reader"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[&relay.dlq]).unwrap();
    let dead = tokio::time::timeout(PATIENCE, consumer.recv())
        .await
        .expect("the message is dead-lettered once target_lookup_timeout has passed")
        .unwrap()
        .detach();
    let (h, _) = header_map(&dead);
    assert_eq!(h["hopper-reason"], "HOP_FAILED", "{h:?}");
    let error = &h["hopper-last-error"];
    assert!(
        error.starts_with(&format!(
            "header hopper-target: topic `{target}` could not be used: the cluster answered "
        )) && error.contains("with an error for it ([delay] target_lookup_timeout = 2s)")
            && error.contains("Leader not available"),
        "{error}"
    );
    // Kept, so the record can be sent to the inbox again.
    assert_eq!(h["hopper-target"], target);
    assert_eq!(h["hopper-deliver-at"], at);
    assert_eq!(h["hopper-id"], "o-7");
    assert_eq!(
        rdkafka::Message::payload(&dead),
        Some(&b"close order 7"[..])
    );
    // Asked about with an error for the topic before, and given up once.
    let retried = logs::wait_for_lines(
        &[
            "Delay target lookup got an error for the topic",
            &format!("topic=\"{target}\""),
        ],
        2,
    )
    .await;
    assert!(retried[0].contains("gives_up_in_ms="), "{retried:?}");
    let gave_up = logs::wait_for_lines(
        &[
            "Delay target lookup gave up",
            &format!("topic=\"{target}\""),
        ],
        1,
    )
    .await;
    assert!(gave_up[0].contains("Leader not available"), "{gave_up:?}");
    let abandoned = count(hopper.telemetry(), &series::AbandonedTargetLookups);
    assert_eq!(abandoned, 1);
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_deleted_while_hopper_runs_dead_letters_instead_of_looping() {
    logs::capture();
    let inbox = rand_name("delay");
    let config = ConfigBuilder::new()
        .delay(
            DelayTable::named(&inbox)
                .tiers(&["1s", "2s"])
                .max_delay("1h"),
        )
        .write();
    let dlq = format!("{inbox}.dlq");
    let target = rand_name("target");
    create_topics(&[&target]).await;
    let hopper = config.start().await;
    let producer = producer();

    // Delivered once: the relay now knows the target.
    let soon = (now_ms() + 200).to_string();
    produce(
        &producer,
        &inbox,
        None,
        "first",
        &[
            ("hopper-target", &target),
            ("hopper-deliver-at", &soon),
            ("hopper-id", "first"),
        ],
    )
    .await;
    consume(&target, 1, PATIENCE).await;

    // Accepted while the target exists, then waiting in the tiers when it
    // is deleted.
    let later = (now_ms() + 6_000).to_string();
    produce(
        &producer,
        &inbox,
        None,
        "waiting",
        &[
            ("hopper-target", &target),
            ("hopper-deliver-at", &later),
            ("hopper-id", "waiting"),
        ],
    )
    .await;
    let admin: AdminClient<DefaultClientContext> = client_config().create().unwrap();
    let deleted = admin
        .delete_topics(&[&target], &AdminOptions::new())
        .await
        .unwrap();
    assert!(deleted.iter().all(Result::is_ok), "{deleted:?}");
    let metadata: BaseConsumer = client_config().create().unwrap();
    let gone = tokio::time::Instant::now() + Duration::from_secs(30);
    while metadata
        .fetch_metadata(Some(&target), Duration::from_secs(5))
        .map(|m| m.topics()[0].error().is_none())
        .unwrap_or(true)
    {
        assert!(
            tokio::time::Instant::now() < gone,
            "{target} is still there"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Sent once the relay's trust in the target has run out.
    tokio::time::sleep(TARGET_TRUSTED_FOR).await;
    let soon = (now_ms() + 200).to_string();
    produce(
        &producer,
        &inbox,
        None,
        "after",
        &[
            ("hopper-target", &target),
            ("hopper-deliver-at", &soon),
            ("hopper-id", "after"),
        ],
    )
    .await;

    let dead = consume(&dlq, 2, PATIENCE).await;
    let mut ids: Vec<String> = dead
        .iter()
        .map(|m| {
            let (h, _) = header_map(m);
            assert_eq!(h["hopper-reason"], "INVALID_ENVELOPE", "{h:?}");
            assert!(
                h["hopper-last-error"].contains(&format!(
                    "header hopper-target: topic `{target}` does not exist"
                )),
                "{h:?}"
            );
            // Kept, so the record can be sent again once the topic is back.
            assert_eq!(h["hopper-target"], target);
            h["hopper-id"].clone()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, ["after", "waiting"]);
    // No loop: the relay goes on, and the target was not recreated.
    let other = rand_name("target");
    create_topics(&[&other]).await;
    let soon = (now_ms() + 200).to_string();
    produce(
        &producer,
        &inbox,
        None,
        "other",
        &[("hopper-target", &other), ("hopper-deliver-at", &soon)],
    )
    .await;
    consume(&other, 1, PATIENCE).await;
    assert!(
        metadata
            .fetch_metadata(Some(&target), Duration::from_secs(5))
            .map(|m| m.topics()[0].error().is_some())
            .unwrap_or(false),
        "{target} came back"
    );
    hopper.stop().await;
}

/// Regression: the relay forwarded to any topic that existed, so any
/// producer could write into a route's retry tier or dead-letter topic, a
/// replay journal or the relay's own tiers through `hopper-target`. hopper's
/// own topics are never targets now, and `[delay] targets` narrows the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hoppers_own_topics_and_those_outside_targets_get_invalid_target() {
    logs::capture();
    let inbox = rand_name("delay");
    let route = rand_name("route");
    let allowed = rand_name("allowed");
    let outside = rand_name("outside");
    // A route with ordered retries, so every kind of hopper's own topic is
    // in the config, and targets that match its park topic and tiers.
    let config = ConfigBuilder::new()
        .delay(DelayTable::named(&inbox).tiers(&["1s"]).targets(&[
            format!("{allowed}*"),
            format!("{route}.in"),
            format!("{route}.*"),
            format!("{inbox}*"),
        ]))
        .route(
            RouteTable::named(&route, &plugin("noop"))
                .ordering("key")
                .key("retry_order", quoted("key")),
        )
        .write();
    let loaded = config.config();
    // Every kind, from the one list hopper reads: a kind added later is
    // sent here too without this test changing.
    let owned = loaded.owned();
    let mut sends: Vec<(String, String)> = Vec::new();
    for kind in OwnedKind::ALL {
        let topics: Vec<&str> = owned.of_kind(kind).map(|o| o.topic.as_str()).collect();
        assert!(!topics.is_empty(), "the config has no {kind:?} topic");
        for (n, topic) in topics.into_iter().enumerate() {
            sends.push((format!("{kind:?}-{n}"), topic.to_string()));
        }
    }
    let own_count = sends.len();
    sends.push(("outside".into(), outside.clone()));
    sends.push(("allowed".into(), allowed.clone()));
    create_topics(&[&allowed, &outside]).await;
    let hopper = config.start().await;
    let producer = producer();
    for (id, target) in &sends {
        let soon = (now_ms() + 200).to_string();
        produce(
            &producer,
            &inbox,
            Some(id),
            id,
            &[
                ("hopper-target", target),
                ("hopper-deliver-at", &soon),
                ("hopper-id", id),
                // The marker of a park record, as a forger would set it.
                ("hopper-park-by", "forged"),
            ],
        )
        .await;
    }
    // The positive control: a target the rules allow is delivered, without
    // the park marker.
    let delivered = consume(&allowed, 1, PATIENCE).await;
    let (delivered_headers, _) = header_map(&delivered[0]);
    assert_eq!(delivered_headers["hopper-id"], "allowed");
    assert!(
        !delivered_headers.contains_key("hopper-park-by"),
        "{delivered_headers:?}"
    );
    let dead = consume(&format!("{inbox}.dlq"), own_count + 1, PATIENCE).await;
    let mut got: Vec<(String, String, String)> = dead
        .iter()
        .map(|m| {
            let (h, _) = header_map(m);
            (
                h["hopper-id"].clone(),
                h["hopper-reason"].clone(),
                h["hopper-last-error"].clone(),
            )
        })
        .collect();
    got.sort();
    let relay = loaded.delay.as_ref().unwrap();
    let mut want: Vec<(String, String)> = sends[..own_count]
        .iter()
        .map(|(id, topic)| {
            let why = owned.refusal(topic).unwrap();
            assert!(why.contains("which only hopper writes"), "{why}");
            assert_eq!(
                relay.check_target(topic).unwrap_err(),
                format!("{why}: a delayed message cannot target it")
            );
            (
                id.clone(),
                format!("header hopper-target: {why}: a delayed message cannot target it"),
            )
        })
        .collect();
    want.push((
        "outside".to_string(),
        format!(
            "header hopper-target: `{outside}` is not in the delay relay's targets ({allowed}*, {route}.in, {route}.*, {inbox}*)"
        ),
    ));
    want.sort();
    let want: Vec<(String, String, String)> = want
        .into_iter()
        .map(|(id, error)| (id, "INVALID_TARGET".to_string(), error))
        .collect();
    assert_eq!(got, want);
    // A refusal is final: every refused message is in the relay's DLQ, so
    // none of them can still reach the topic it named. (The relay's own DLQ
    // holds exactly the dead letters counted above.)
    let brokers = brokers();
    for (_, topic) in &sends[..own_count] {
        let expected = if *topic == relay.dlq {
            own_count as i64 + 1
        } else {
            0
        };
        if *topic != relay.inbox {
            assert_eq!(records_in(&brokers, topic), expected, "{topic}");
        }
    }
    assert_eq!(records_in(&brokers, &outside), 0);
    hopper.stop().await;
}
