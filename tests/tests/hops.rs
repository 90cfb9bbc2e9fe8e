//! Messages that cannot go on as they are must not stop their partition: a
//! record too large once hopper's headers are added is dead-lettered cut,
//! and a call that panics stops its pipeline without committing past it.
//! Against the test broker.

use hopper::events::{self, Event, Telemetry};
use hopper::hop::{Action, Halt, Processor};
use hopper::kafka::Cluster;
use hopper::pipeline::{self, Ended, Shared};
use hopper::produce::HopProducer;
use hopper_tests::*;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_too_large_with_hoppers_headers_is_dead_lettered_cut_and_the_partition_goes_on() {
    init_tracing();
    let route = TestRoute::new(&plugin("scripted"), "max_attempts = 1");
    create_topics_with(&[&route.input], 1).await;
    let hopper = route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    // Fits under the producer's 1,000,000-byte message.max.bytes as it is,
    // not with a dead-letter record's headers.
    let big = "x".repeat(999_800);
    produce(&producer, &route.input, None, &big, &[]).await;
    produce(&producer, &route.input, None, "ok", &[]).await;

    let dead = consume(&route.dlq, 1, Duration::from_secs(60)).await;
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
    let verdict = next_matching(
        &mut events,
        |_| {},
        |e| match e {
            Event::Handled(events::Handled {
                offset: 1, verdict, ..
            }) => Some(*verdict),
            _ => None,
        },
    )
    .await;
    assert_eq!(verdict, "ok");
    let counters = hopper.telemetry().counters();
    let key = format!(
        "hopper_hop_failures_total{{route={},outcome=dead_lettered}}",
        route.name
    );
    assert_eq!(counters.get(&key), Some(&1), "{counters:#?}");
    hopper.stop().await;
}

/// A processor that completes every message at once, and panics on one
/// offset.
struct PanicsAt {
    offset: i64,
}

impl Processor for PanicsAt {
    fn name(&self) -> &str {
        "panics"
    }
    fn hop_topics(&self) -> Vec<String> {
        Vec::new()
    }
    fn due_at(&self, _: &BorrowedMessage<'_>) -> Option<i64> {
        None
    }
    async fn process(&self, message: &OwnedMessage) -> Action {
        assert_ne!(message.offset(), self.offset, "told to panic here");
        Action::Done
    }
    fn dlq_topic(&self) -> &str {
        "panics.dlq"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_panics_stops_its_pipeline_without_committing_past_it() {
    init_tracing();
    let topic = rand_name("panics");
    create_topics_with(&[&topic], 1).await;
    let producer = producer();
    for i in 0..10 {
        produce(&producer, &topic, None, &format!("m{i}"), &[]).await;
    }
    let cluster = Cluster {
        brokers: brokers(),
        kafka: Default::default(),
    };
    let group = rand_name("panics-group");
    let pipeline::Connected {
        consumer,
        rebalances: rx,
        trackers,
    } = pipeline::connect(&cluster.consumer_config(&group), "panics").unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let acks = TaskTracker::new();
    let halt = Arc::new(Halt::default());
    let telemetry = Telemetry::new();
    let hops = HopProducer::new(
        &cluster.producer_config(),
        "panics",
        "panics.dlq",
        telemetry.clone(),
        acks.clone(),
        halt.clone(),
    )
    .unwrap();
    let shared = Arc::new(Shared {
        processor: PanicsAt { offset: 4 },
        producer: hops,
        consumer,
        telemetry,
        acks,
        halt,
        trackers,
    });
    let ended = tokio::time::timeout(
        Duration::from_secs(60),
        pipeline::run(
            shared.clone(),
            rx,
            CancellationToken::new(),
            Duration::from_secs(5),
        ),
    )
    .await
    .expect("the panic ends the loop without being asked to stop");
    match &ended {
        Ended::Failed(why) => assert!(
            why.contains("@4 panicked"),
            "the reason names the offset: {why}"
        ),
        other => panic!("expected a failure, got {other:?}"),
    }
    let mut wanted = TopicPartitionList::new();
    wanted.add_partition(&topic, 0);
    let committed = shared
        .consumer
        .committed_offsets(wanted, Duration::from_secs(10))
        .unwrap();
    let offset = committed.elements()[0].offset();
    assert!(
        matches!(offset, rdkafka::Offset::Offset(o) if o <= 4)
            || offset == rdkafka::Offset::Invalid,
        "nothing past the panicked offset 4 is committed: {offset:?}"
    );
}
