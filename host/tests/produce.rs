//! A hop whose produce fails is produced again, and its source offset is
//! completed only once some attempt is acknowledged. Runs on librdkafka's
//! mock cluster, whose broker can be taken down and brought back.

use hopper::config::KafkaConfig;
use hopper::events::{self, Event, Telemetry};
use hopper::headers::Reason;
use hopper::hop::{self, Completion, Halt, OutRecord, Outcome, PlannedHop};
use hopper::kafka::Cluster;
use hopper::offsets::OffsetTracker;
use hopper::produce::HopProducer;
use hopper::types::HopFailure;
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::task::TaskTracker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_hop_is_produced_again_and_completes_only_when_acknowledged() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("out", 1, 1).unwrap();
    let cluster = Cluster::new(
        mock.bootstrap_servers(),
        KafkaConfig {
            // A produce the broker never answers fails after 500 ms.
            properties: [("message.timeout.ms".to_string(), "500".to_string())].into(),
            ..Default::default()
        },
    );
    let telemetry = Telemetry::new();
    let mut events = telemetry.subscribe();
    let pending = TaskTracker::new();
    let producer = HopProducer::new(
        &cluster.producer_config(),
        cluster.hops_held().unwrap(),
        "test",
        "test.dlq",
        telemetry.clone(),
        pending.clone(),
        Arc::new(Halt::default()),
    )
    .unwrap();

    let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
    tracker.lock().unwrap().begin(7);
    let done = Completion::new(7, tracker.clone());
    let dead = hop::DeadLetter {
        route: "test".into(),
        id: "m-1".into(),
        attempt: 1,
        topic: "out".into(),
        reason: Reason::Fatal,
        error: "told to fail".into(),
        version: None,
    };
    let headers = OwnedHeaders::new().insert(Header {
        key: "hopper-id",
        value: Some("m-1"),
    });

    mock.broker_down(1).unwrap();
    let record = OutRecord {
        topic: "out".into(),
        key: Some(b"k".to_vec()),
        payload: Some(b"payload".to_vec()),
        headers,
        timestamp: 1_700_000_000_000,
    };
    let outcome = Outcome::DeadLetter(dead.clone());
    producer.send(PlannedHop { record, outcome }, done).await;

    // Two produce attempts time out with the broker down, each reported as
    // a retried hop: the hop is being tried, and nothing else may happen
    // meanwhile, least of all an acknowledgement.
    for attempt in 1..=2 {
        let event = tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .unwrap_or_else(|_| panic!("no retried hop (attempt {attempt}) within 30 s"))
            .unwrap();
        assert!(
            matches!(
                event,
                Event::HopFailed(events::HopFailed {
                    outcome: HopFailure::Retried,
                    ..
                })
            ),
            "no event but retries before an acknowledgement: {event:?}"
        );
    }
    assert_eq!(
        tracker.lock().unwrap().in_flight(),
        1,
        "offset 7 is not done"
    );
    pending.close();
    assert!(!pending.is_empty(), "the hop still counts as pending");

    mock.broker_up(1).unwrap();
    let got = next_outcome(&mut events).await;
    assert_eq!(got, Event::Hop(hop::Outcome::DeadLetter(dead)));
    assert_eq!(tracker.lock().unwrap().in_flight(), 0, "offset 7 is done");
    tokio::time::timeout(Duration::from_secs(5), pending.wait())
        .await
        .expect("nothing is pending any more");

    // The record that arrived is the one sent: key, payload, headers and
    // timestamp survive being produced again.
    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", mock.bootstrap_servers())
        .set("group.id", "reader")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    reader.subscribe(&["out"]).unwrap();
    let record = tokio::time::timeout(Duration::from_secs(30), reader.recv())
        .await
        .expect("the record is on the topic")
        .unwrap();
    assert_eq!(record.key(), Some(&b"k"[..]));
    assert_eq!(record.payload(), Some(&b"payload"[..]));
    assert_eq!(
        record.timestamp(),
        rdkafka::Timestamp::CreateTime(1_700_000_000_000)
    );
    let header = record.headers().unwrap().get(0);
    assert_eq!((header.key, header.value), ("hopper-id", Some(&b"m-1"[..])));
}

/// The next event that is not a retried hop.
async fn next_outcome(events: &mut tokio::sync::broadcast::Receiver<Event>) -> Event {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .expect("an outcome within 30 s")
            .unwrap();
        if !matches!(
            event,
            Event::HopFailed(events::HopFailed {
                outcome: HopFailure::Retried,
                ..
            })
        ) {
            return event;
        }
    }
}

/// A producer on a one-broker mock cluster with topics `out` and `out.dlq`,
/// with at most `max_bytes` per record.
struct Bench {
    mock: MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    producer: Arc<HopProducer>,
    telemetry: Telemetry,
    pending: TaskTracker,
    halt: Arc<Halt>,
    tracker: Arc<Mutex<OffsetTracker>>,
}

impl Bench {
    fn new(max_bytes: usize) -> Bench {
        Bench::configured(&[("message.max.bytes", &max_bytes.to_string())])
    }

    /// The same with `properties` in `kafka.properties`.
    fn configured(properties: &[(&str, &str)]) -> Bench {
        let mock = MockCluster::new(1).unwrap();
        mock.create_topic("out", 1, 1).unwrap();
        mock.create_topic("out.dlq", 1, 1).unwrap();
        let cluster = Cluster::new(
            mock.bootstrap_servers(),
            KafkaConfig {
                properties: properties
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            },
        );
        let telemetry = Telemetry::new();
        let pending = TaskTracker::new();
        let halt = Arc::new(Halt::default());
        let producer = HopProducer::new(
            &cluster.producer_config(),
            cluster.hops_held().unwrap(),
            "orders",
            "out.dlq",
            telemetry.clone(),
            pending.clone(),
            halt.clone(),
        )
        .unwrap();
        Bench {
            mock,
            producer,
            telemetry,
            pending,
            halt,
            tracker: Arc::new(Mutex::new(OffsetTracker::default())),
        }
    }

    async fn send(&self, offset: i64, topic: &str, payload: Vec<u8>) {
        self.tracker.lock().unwrap().begin(offset);
        self.hop(offset, topic, payload).await;
    }

    /// [`Bench::send`] of an offset already begun.
    async fn hop(&self, offset: i64, topic: &str, payload: Vec<u8>) {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "hopper-id",
                value: Some("m-1"),
            })
            .insert(Header {
                key: "hopper-attempt",
                value: Some("2"),
            })
            .insert(Header {
                key: "hopper-trail",
                value: Some("input"),
            });
        let record = OutRecord {
            topic: topic.into(),
            key: Some(b"k".to_vec()),
            payload: Some(payload),
            headers,
            timestamp: 1_700_000_000_000,
        };
        let done = Completion::new(offset, self.tracker.clone());
        let outcome = Outcome::Emit(hop::Emit {
            route: "test".into(),
            id: "m-1".into(),
            topic: topic.into(),
            deliver_at: None,
            kind: hopper::types::EmitKind::Publish,
        });
        self.producer
            .send(PlannedHop { record, outcome }, done)
            .await;
    }

    async fn read(&self, topic: &str) -> rdkafka::message::OwnedMessage {
        let reader: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.mock.bootstrap_servers())
            .set("group.id", "reader")
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        reader.subscribe(&[topic]).unwrap();
        tokio::time::timeout(Duration::from_secs(30), reader.recv())
            .await
            .expect("a record on the topic")
            .unwrap()
            .detach()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hops_past_the_producers_bound_wait_for_room_and_none_is_lost() {
    use futures::StreamExt;
    let bench = Bench::configured(&[
        ("queue.buffering.max.messages", "3"),
        ("message.timeout.ms", "60000"),
    ]);
    bench.mock.broker_down(1).unwrap();
    for offset in 0..5 {
        bench.tracker.lock().unwrap().begin(offset);
    }
    let bench = &bench;
    let mut sends: futures::stream::FuturesUnordered<_> = (0..5)
        .map(|offset| async move {
            bench.hop(offset, "out", b"p".to_vec()).await;
            offset
        })
        .collect();
    // Three are taken in at once...
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(30), sends.next())
            .await
            .expect("a hop under the bound is taken in at once")
            .unwrap();
    }
    // ...and the other two wait: with the broker down nothing is
    // acknowledged, so no place frees. The same stream saw the three.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), sends.next())
            .await
            .is_err(),
        "a fourth hop was taken in while three were held"
    );
    bench.mock.broker_up(1).unwrap();
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(30), sends.next())
            .await
            .expect("a waiting hop is taken in once a place frees")
            .unwrap();
    }
    bench.pending.close();
    tokio::time::timeout(Duration::from_secs(30), bench.pending.wait())
        .await
        .expect("every hop is acknowledged");
    assert_eq!(
        bench.tracker.lock().unwrap().in_flight(),
        0,
        "all five are done"
    );
    assert_eq!(bench.tracker.lock().unwrap().position(), Some(5));
}

fn header(message: &rdkafka::message::OwnedMessage, name: &str) -> Option<String> {
    let headers = message.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_too_large_for_the_broker_is_dead_lettered_cut_with_its_size() {
    let bench = Bench::new(8_000);
    let mut events = bench.telemetry.subscribe();
    // Too large for message.max.bytes: librdkafka refuses it at once.
    bench.send(3, "out", vec![b'x'; 20_000]).await;
    match next_outcome(&mut events).await {
        Event::HopFailed(events::HopFailed { outcome, topic, .. }) => {
            assert_eq!((outcome, topic.as_str()), (HopFailure::DeadLettered, "out"))
        }
        other => panic!("expected the hop's failure, got {other:?}"),
    }
    match next_outcome(&mut events).await {
        Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter {
            reason, id, topic, ..
        })) => {
            assert_eq!(reason, Reason::RecordTooLarge);
            assert_eq!((id.as_str(), topic.as_str()), ("m-1", "out.dlq"));
        }
        other => panic!("expected the dead-letter record, got {other:?}"),
    }
    assert_eq!(
        bench.tracker.lock().unwrap().position(),
        Some(4),
        "offset 3 is done once its dead-letter record is acknowledged"
    );
    let dead = bench.read("out.dlq").await;
    assert_eq!(
        dead.payload().unwrap().len(),
        hopper::dlq::CUT_PAYLOAD_BYTES
    );
    assert_eq!(
        header(&dead, "hopper-payload-size").as_deref(),
        Some("20000")
    );
    assert_eq!(
        header(&dead, "hopper-reason").as_deref(),
        Some("RECORD_TOO_LARGE")
    );
    assert_eq!(header(&dead, "hopper-attempt").as_deref(), Some("2"));
    assert_eq!(header(&dead, "hopper-trail").as_deref(), Some("input,dlq"));
    let error = header(&dead, "hopper-last-error").unwrap();
    assert!(
        error.contains("`out`"),
        "the error names the topic: {error}"
    );
    let scrape = bench
        .telemetry
        .metrics()
        .encode(hopper::metrics::Format::Prometheus);
    // A family with no series is not exported: this one always has one.
    assert!(
        scrape.contains("hopper_trace_spans_dropped_total"),
        "{scrape}"
    );
    assert!(!scrape.contains("route="), "no route registered: {scrape}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_the_broker_refuses_for_good_is_dead_lettered_not_retried_forever() {
    use rdkafka::types::RDKafkaApiKey;
    use rdkafka::types::RDKafkaRespErr;
    let bench = Bench::new(1_000_000);
    let mut events = bench.telemetry.subscribe();
    // The first produce is refused as not authorized; the DLQ's is not.
    bench.mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    bench.send(9, "out", b"payload".to_vec()).await;
    let mut saw_failure = false;
    let reason = loop {
        match next_outcome(&mut events).await {
            Event::HopFailed(events::HopFailed { outcome, .. }) => {
                assert_eq!(outcome, HopFailure::DeadLettered);
                saw_failure = true;
            }
            Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter { reason, .. })) => break reason,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(saw_failure, "the refusal is reported");
    assert_eq!(reason, Reason::HopFailed);
    let dead = bench.read("out.dlq").await;
    assert_eq!(
        dead.payload(),
        Some(&b"payload"[..]),
        "the payload is whole"
    );
    assert_eq!(
        header(&dead, "hopper-reason").as_deref(),
        Some("HOP_FAILED")
    );
    assert_eq!(bench.tracker.lock().unwrap().position(), Some(10));
    assert!(bench.halt.reason().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_record_refused_for_good_halts_and_never_completes() {
    use rdkafka::types::RDKafkaApiKey;
    use rdkafka::types::RDKafkaRespErr;
    let bench = Bench::new(1_000_000);
    let denied = RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED;
    // Both the hop and its dead-letter record are refused.
    bench
        .mock
        .request_errors(RDKafkaApiKey::Produce, &[denied, denied]);
    bench.send(5, "out", b"payload".to_vec()).await;
    tokio::time::timeout(Duration::from_secs(30), bench.halt.failed())
        .await
        .expect("the pipeline is halted");
    let reason = bench.halt.reason().unwrap();
    assert!(
        reason.contains("dead-letter record") && reason.contains("out.dlq"),
        "the reason names what failed: {reason}"
    );
    assert_eq!(
        bench.tracker.lock().unwrap().position(),
        Some(5),
        "offset 5 is never done: it is read again after a restart"
    );
    bench.pending.close();
    tokio::time::timeout(Duration::from_secs(5), bench.pending.wait())
        .await
        .expect("the drain is not held up by the halted hop");
}
