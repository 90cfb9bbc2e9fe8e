//! Messages that cannot go on as they are must not stop their partition: a
//! record too large once hopper's headers are added is dead-lettered cut,
//! and a call that panics stops its pipeline without committing past it.
//! A producer that librdkafka fails for good is replaced, and nothing it
//! held is lost. Against the test broker.
//!
//! hopper has no processor that panics on purpose, so the panic test's
//! processor is the test's own; everything under it (the consumer, the
//! partition task, the offset tracker, the producer, the commit) is
//! hopper's.

use hopper::config::KafkaConfig;
use hopper::config::{Concurrency, MessageOrder};
use hopper::events::{self, Event, Telemetry};
use hopper::hop::{self, Action, Completion, Halt, OutRecord, Outcome, PlannedHop, Processor};
use hopper::kafka::Cluster;
use hopper::metrics::series;
use hopper::offsets::OffsetTracker;
use hopper::pipeline::{self, Ended};
use hopper::produce::HopProducer;
use hopper::renewable::AwaitedProducer;
use hopper_tests::*;
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::message::{BorrowedMessage, OwnedMessage};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_too_large_with_hoppers_headers_is_dead_lettered_cut_and_the_partition_goes_on() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted"))
        .max_attempts(1)
        .test_route();
    create_topics_with(&[&route.input], 1).await;
    let hopper = route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    // Fits under the producer's 1,000,000-byte message.max.bytes as it is,
    // not with a dead-letter record's headers.
    let big = "x".repeat(999_800);
    produce(&producer, &route.input, None, &big, &[]).await;
    produce(&producer, &route.input, None, "ok", &[]).await;

    let dead = consume(&route.dlq, 1, PATIENCE).await;
    let (headers, _) = header_map(&dead[0]);
    assert_eq!(headers["hopper-reason"], "RECORD_TOO_LARGE");
    assert_eq!(headers["hopper-payload-size"], "999800");
    assert_eq!(
        dead[0].payload().map(<[u8]>::len),
        Some(hopper::dlq::CUT_PAYLOAD_BYTES)
    );
    let error = &headers["hopper-last-error"];
    assert!(
        error.contains(&route.dlq) && error.contains("FATAL"),
        "the error names the topic and why it was on its way: {error}"
    );
    assert_eq!(headers["hopper-origin-offset"], "0");
    // The message after it is handled: the partition did not stall.
    let verdict = wait_for_event(&mut events, "the call of offset 1", |e| match e {
        Event::Handled(events::Handled {
            offset: 1, verdict, ..
        }) => Some(*verdict),
        _ => None,
    })
    .await;
    assert_eq!(verdict, "ok");
    let dead_lettered = series::HopFailures {
        route: &route.name,
        outcome: "dead_lettered",
    };
    assert_eq!(count(hopper.telemetry(), &dead_lettered), 1);
    hopper.stop().await;
}

const MESSAGES: i64 = 10;

/// Done for every message, but panics on the one at `panic_at`. Keeps the
/// offsets it finished.
struct PanicsAt {
    panic_at: Option<i64>,
    done: Arc<Mutex<Vec<i64>>>,
    dlq: String,
}

impl Processor for PanicsAt {
    type Job = std::convert::Infallible;

    fn name(&self) -> &str {
        "panics"
    }

    fn hop_topics(&self) -> Vec<String> {
        Vec::new()
    }

    fn due_at(&self, _: &BorrowedMessage<'_>) -> Option<i64> {
        None
    }

    fn process(&self, message: &OwnedMessage) -> impl Future<Output = Action> + Send {
        let offset = message.offset();
        let (panic_at, done) = (self.panic_at, self.done.clone());
        async move {
            assert_ne!(Some(offset), panic_at, "the processor panics at {offset}");
            done.lock().unwrap().push(offset);
            Action::Done
        }
    }

    fn dlq_topic(&self) -> &str {
        &self.dlq
    }

    /// Many at once, in no order: offsets after the panicked one finish.
    fn concurrency(&self) -> Concurrency {
        Concurrency {
            ordering: MessageOrder::Unordered,
            max_in_flight: 16,
        }
    }
}

/// Runs a pipeline of `processor` on `topic` as group `group`; with
/// `stop_at` it asks it to stop once the group committed that many offsets.
async fn run(topic: &str, group: &str, processor: PanicsAt, stop_at: Option<i64>) -> Ended {
    let cluster = Cluster::of(&KafkaConfig {
        brokers: Some(brokers()),
        ..KafkaConfig::default()
    })
    .unwrap();
    let connected = pipeline::connect(
        &cluster.consumer_config(group),
        processor.name(),
        cluster.watch().clone(),
    )
    .unwrap();
    connected.consumer.subscribe(&[topic]).unwrap();
    let (acks, halt) = (TaskTracker::new(), Arc::new(Halt::default()));
    let producer = HopProducer::new(
        &cluster.producer_config(),
        cluster.hops_held().unwrap(),
        processor.name(),
        processor.dlq_topic(),
        Telemetry::new(),
        acks.clone(),
        halt.clone(),
    )
    .unwrap();
    let shared = Arc::new(pipeline::Shared {
        processor,
        producer,
        consumer: connected.consumer,
        telemetry: Telemetry::new(),
        acks,
        halt,
        trackers: connected.trackers,
    });
    let shutdown = CancellationToken::new();
    let loop_ = tokio::spawn(pipeline::run(
        shared,
        connected.rebalances,
        shutdown.clone(),
        Duration::from_secs(10),
    ));
    if let Some(offsets) = stop_at {
        until_committed_on(group, topic, offsets).await;
        shutdown.cancel();
    }
    tokio::time::timeout(PATIENCE, loop_)
        .await
        .expect("the pipeline ends")
        .expect("the loop does not panic")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_panics_stops_the_pipeline_and_nothing_from_its_offset_is_committed() {
    init_tracing();
    let name = rand_name("panic");
    let (topic, dlq) = (format!("{name}.in"), format!("{name}.dlq"));
    create_topics_with(&[&topic, &dlq], 1).await;
    let producer = producer();
    for i in 0..MESSAGES {
        produce(&producer, &topic, None, &format!("m{i}"), &[]).await;
    }

    // Without a panic, the same pipeline commits every offset: the commit
    // this test reads does move.
    let done = Arc::new(Mutex::new(Vec::new()));
    let processor = PanicsAt {
        panic_at: None,
        done: done.clone(),
        dlq: dlq.clone(),
    };
    let ended = run(
        &topic,
        &format!("{name}.control"),
        processor,
        Some(MESSAGES),
    )
    .await;
    assert_eq!(ended, Ended::Drained);
    assert_eq!(done.lock().unwrap().len(), MESSAGES as usize);

    // Panicking at offset 5: the pipeline stops on its own.
    let group = format!("{name}.panics");
    let done = Arc::new(Mutex::new(Vec::new()));
    let processor = PanicsAt {
        panic_at: Some(5),
        done: done.clone(),
        dlq,
    };
    let ended = run(&topic, &group, processor, None).await;
    let Ended::Failed(why) = ended else {
        panic!("the pipeline ended {ended:?}, not failed");
    };
    assert!(
        why.contains(&format!("processing {topic}[0]@5 panicked")),
        "the failure names the partition and offset: {why}"
    );
    assert!(
        why.contains("nothing from that offset on is committed"),
        "{why}"
    );
    let done = done.lock().unwrap().clone();
    assert!(!done.contains(&5), "{done:?}");
    assert!(
        (0..5).all(|offset| done.contains(&offset)),
        "the offsets before the panic were done: {done:?}"
    );
    // The loop has ended: nothing commits any more. The commit stops at the
    // panicked offset whatever came after it.
    let committed = committed_on(&group, &topic);
    assert!(
        committed <= 5,
        "committed {committed}, past the offset that panicked (done: {done:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_failed_for_good_is_replaced_and_every_hop_it_held_is_produced_on_the_new_one() {
    init_tracing();
    let name = rand_name("fatal");
    let out = format!("{name}.out");
    create_topics_with(&[&out], 1).await;
    let cluster = Cluster::of(&KafkaConfig {
        brokers: Some(brokers()),
        ..KafkaConfig::default()
    })
    .unwrap();
    let telemetry = Telemetry::new();
    let mut events = telemetry.subscribe();
    let (acks, halt) = (TaskTracker::new(), Arc::new(Halt::default()));
    let producer = HopProducer::new(
        &cluster.producer_config(),
        cluster.hops_held().unwrap(),
        "fatal",
        &format!("{name}.dlq"),
        telemetry.clone(),
        acks.clone(),
        halt.clone(),
    )
    .unwrap();
    let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
    let send = |offset: i64| {
        tracker.lock().unwrap().begin(offset);
        let record = OutRecord {
            topic: out.clone(),
            key: Some(format!("k{offset}").into_bytes()),
            payload: Some(format!("m{offset}").into_bytes()),
            headers: rdkafka::message::OwnedHeaders::new(),
            timestamp: 1_700_000_000_000,
        };
        // What the hop is does not matter to the producer; a publish
        // counts nothing for an unknown route.
        let outcome = Outcome::Emit(hop::Emit {
            route: "fatal".into(),
            id: format!("m{offset}"),
            topic: out.clone(),
            deliver_at: None,
            kind: hopper::types::EmitKind::Publish,
        });
        producer.send(
            PlannedHop { record, outcome },
            Completion::new(offset, tracker.clone()),
        )
    };

    // Hops on their way when librdkafka fails the producer for good, as it
    // does when it and the broker no longer agree on a partition's
    // sequence numbers, and hops sent after.
    for offset in 0..50 {
        send(offset).await;
    }
    producer.raise_fatal("sequence desynchronization, raised by the test");
    for offset in 50..100 {
        send(offset).await;
    }

    // The failure is seen and reported as a hop produced again, not as
    // one refused or dead-lettered; so is each hop the old producer still
    // held (purged when it is dropped)...
    let retried = |e: &Event| {
        if let Event::HopFailed(failed) = e {
            assert_eq!(
                failed.outcome,
                hopper::types::HopFailure::Retried,
                "{failed:?}"
            );
        }
    };
    wait_for_event(&mut events, "a hop that failed for good", |e| {
        retried(e);
        match e {
            Event::HopFailed(failed) if failed.error.contains("Fatal") => Some(()),
            _ => None,
        }
    })
    .await;
    // ... and every hop is acknowledged, on a new producer: all 100 offsets
    // are done, and the pipeline was never halted.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while tracker.lock().unwrap().in_flight() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} hops were not acknowledged within {PATIENCE:?}",
            tracker.lock().unwrap().in_flight()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(tracker.lock().unwrap().position(), Some(100));
    assert_eq!(halt.reason(), None);
    acks.close();
    tokio::time::timeout(Duration::from_secs(5), acks.wait())
        .await
        .expect("no hop is left pending");

    // Each record reached the topic, at least once.
    let records = consume(&out, 100, PATIENCE).await;
    let mut payloads: Vec<String> = records
        .iter()
        .map(|m| String::from_utf8_lossy(m.payload().unwrap()).into_owned())
        .collect();
    payloads.sort_by_key(|p| p[1..].parse::<i64>().unwrap());
    payloads.dedup();
    let expected: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
    assert_eq!(payloads, expected);
    // ... and none was dead-lettered or halted the pipeline afterwards.
    while let Ok(event) = events.try_recv() {
        retried(&event);
    }
}

/// A fresh one-partition `.out` topic named from `prefix`, and an
/// [`AwaitedProducer`] on the test broker to write to it.
async fn awaited_producer(prefix: &str) -> (String, AwaitedProducer) {
    let out = format!("{}.out", rand_name(prefix));
    create_topics_with(&[&out], 1).await;
    let cluster = Cluster::of(&KafkaConfig {
        brokers: Some(brokers()),
        ..KafkaConfig::default()
    })
    .unwrap();
    let producer = AwaitedProducer::new(cluster.producer_config(), "the test's").unwrap();
    (out, producer)
}

/// The delay relay's cancellation entries and DLQ replays produce one
/// record at a time and await it, on a producer of their own; it is
/// replaced the same way, and the record that met the failure is produced
/// on the new one with its key, payload, headers and timestamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awaited_producer_failed_for_good_is_replaced_and_the_record_goes_on_the_new_one() {
    use rdkafka::message::{Header, Headers, OwnedHeaders};
    use rdkafka::producer::FutureRecord;
    init_tracing();
    let (out, producer) = awaited_producer("awaited").await;
    let record = |n: i64| {
        FutureRecord::<str, str>::to(&out)
            .key("the-id")
            .payload(if n == 0 { "before" } else { "after" })
            .timestamp(1_700_000_000_000 + n)
            .headers(OwnedHeaders::new().insert(Header {
                key: "hopper-id",
                value: Some("the-id"),
            }))
    };
    producer
        .send(record(0), Duration::from_secs(10))
        .await
        .unwrap();

    producer.raise_fatal("sequence desynchronization, raised by the test");
    // The producer is in librdkafka's fatal state: every produce on it
    // fails from here on.
    let (code, reason) = producer.fatal_error().expect("the fatal state is raised");
    assert_eq!(
        code,
        rdkafka::types::RDKafkaErrorCode::OutOfOrderSequenceNumber
    );
    assert!(reason.contains("raised by the test"), "{reason}");

    producer
        .send(record(1), Duration::from_secs(10))
        .await
        .expect("produced on a new producer");
    assert_eq!(
        producer.fatal_error(),
        None,
        "the failed producer is replaced"
    );

    let records = consume(&out, 2, PATIENCE).await;
    let after = &records[1];
    assert_eq!(after.payload(), Some(&b"after"[..]));
    assert_eq!(after.key(), Some(&b"the-id"[..]));
    assert_eq!(after.timestamp().to_millis(), Some(1_700_000_000_001));
    let header = after.headers().unwrap().get(0);
    assert_eq!(
        (header.key, header.value),
        ("hopper-id", Some(&b"the-id"[..]))
    );
}

/// The record produced again after the replacement is the one that met the
/// failure, whatever it holds: no key, a payload that is not UTF-8 and near
/// the producer's 1,000,000-byte limit, no timestamp of its own, a header
/// without a value and one with an empty value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awaited_producer_produces_an_extreme_record_again_unchanged() {
    use rdkafka::message::{Header, Headers, OwnedHeaders};
    use rdkafka::producer::FutureRecord;
    init_tracing();
    let (out, producer) = awaited_producer("awaited-extreme").await;
    let payload: Vec<u8> = (0..999_000u32).map(|i| 0x80 | (i % 0x80) as u8).collect();
    assert!(std::str::from_utf8(&payload).is_err());
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "no-value",
            value: None::<&[u8]>,
        })
        .insert(Header {
            key: "empty",
            value: Some(&b""[..]),
        });

    producer.raise_fatal("sequence desynchronization, raised by the test");
    assert!(
        producer.fatal_error().is_some(),
        "the fatal state is raised"
    );
    producer
        .send(
            FutureRecord::<[u8], [u8]>::to(&out)
                .payload(&payload)
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .expect("produced on a new producer");
    assert_eq!(
        producer.fatal_error(),
        None,
        "the failed producer is replaced"
    );

    let record = consume(&out, 1, PATIENCE).await.remove(0);
    assert_eq!(record.key(), None);
    assert_eq!(record.payload(), Some(&payload[..]));
    assert!(record.timestamp().to_millis().is_some());
    let got = record.headers().unwrap();
    assert_eq!(got.count(), 2);
    assert_eq!(
        (got.get(0).key, got.get(0).value),
        ("no-value", None::<&[u8]>)
    );
    assert_eq!(
        (got.get(1).key, got.get(1).value),
        ("empty", Some(&b""[..]))
    );
}
