//! A hop whose produce fails is produced again, and its source offset is
//! completed only once some attempt is acknowledged. Runs on librdkafka's
//! mock cluster, whose broker can be taken down and brought back.

use hopper::config::KafkaConfig;
use hopper::events::{Event, Telemetry};
use hopper::headers::Reason;
use hopper::hop::{Completion, OutRecord};
use hopper::kafka::Cluster;
use hopper::offsets::OffsetTracker;
use hopper::produce::HopProducer;
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
    let cluster = Cluster {
        brokers: mock.bootstrap_servers(),
        kafka: KafkaConfig {
            // A produce the broker never answers fails after 500 ms.
            properties: [("message.timeout.ms".to_string(), "500".to_string())].into(),
            ..Default::default()
        },
    };
    let telemetry = Telemetry::new();
    let mut events = telemetry.subscribe();
    let pending = TaskTracker::new();
    let producer = HopProducer::new(
        &cluster.producer_config(),
        "test",
        telemetry.clone(),
        pending.clone(),
    )
    .unwrap();

    let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
    tracker.lock().unwrap().begin(7);
    let done = Completion::new(7, tracker.clone());
    let event = Event::DeadLettered {
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
    producer
        .send(
            OutRecord {
                topic: "out".into(),
                key: Some(b"k".to_vec()),
                payload: Some(b"payload".to_vec()),
                headers,
                timestamp: 1_700_000_000_000,
            },
            done,
            Some(event.clone()),
        )
        .await;

    // Two timeouts' worth with the broker down: nothing may complete.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        events.try_recv().is_err(),
        "no event before an acknowledgement"
    );
    assert_eq!(
        tracker.lock().unwrap().in_flight(),
        1,
        "offset 7 is not done"
    );
    pending.close();
    assert!(!pending.is_empty(), "the hop still counts as pending");

    mock.broker_up(1).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), events.recv())
        .await
        .expect("the hop is acknowledged once the broker is back")
        .unwrap();
    assert_eq!(got, event);
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
