//! Broker faults, on librdkafka's mock cluster (the embedded broker), which
//! can fail produce, fetch and commit requests on demand and take its broker
//! down and up: hopper backs off and recovers, nothing is lost, and a
//! produce that keeps failing never lets its source offset be committed.

use hopper::Hopper;
use hopper::embedded::EmbeddedBroker;
use hopper::events::{self, Event};
use hopper::hop;
use hopper_tests::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// A one-route config named `name`, the `scripted` fixture as its handler,
/// with topics of `partitions` partitions and no brokers yet (the embedded
/// broker sets them).
fn config(name: &str, partitions: i32) -> (TestConfig, hopper::config::Config, String) {
    let input = format!("{name}.in");
    let file = ConfigBuilder::new()
        .unnamed_brokers()
        .partitions(partitions)
        .route(
            RouteTable::named(name, &plugin("scripted"))
                .topics(&[&input])
                .retry(&["1s"])
                .max_attempts(3),
        )
        .write();
    let config = file.load();
    (file, config, input)
}

async fn start(config: hopper::config::Config) -> Hopper {
    Hopper::start(config, options())
        .await
        .expect("hopper starts")
}

fn producer_to(broker: &EmbeddedBroker) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("enable.idempotence", "true")
        .create()
        .unwrap()
}

async fn send(producer: &FutureProducer, topic: &str, id: &str, payload: &str) {
    send_to(producer, topic, None, id, payload).await
}

/// Produces `payload` with hopper-id `id` to `partition` of `topic`, or to
/// the partition the producer picks.
async fn send_to(
    producer: &FutureProducer,
    topic: &str,
    partition: Option<i32>,
    id: &str,
    payload: &str,
) {
    let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
        key: "hopper-id",
        value: Some(id),
    });
    let mut record = FutureRecord::<str, str>::to(topic)
        .payload(payload)
        .headers(headers);
    if let Some(partition) = partition {
        record = record.partition(partition);
    }
    producer
        .send(record, PATIENCE)
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

/// The offset `group` committed on `partition` of `topic`, read from the
/// broker.
fn committed(broker: &EmbeddedBroker, group: &str, topic: &str, partition: i32) -> Option<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("group.id", group)
        .create()
        .unwrap();
    let mut wanted = TopicPartitionList::new();
    wanted.add_partition(topic, partition);
    let got = consumer
        .committed_offsets(wanted, Duration::from_secs(10))
        .ok()?;
    match got.elements()[0].offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_fetch_and_commit_errors_and_a_broker_restart_lose_nothing() {
    init_tracing();
    let name = rand_name("faults");
    let (_file, mut config, input) = config(&name, 1);
    let broker = EmbeddedBroker::serve(&mut config).unwrap();
    let dlq = config.routes[0].dlq.clone();
    let hopper = start(config).await;
    let mut events = hopper.events();
    let producer = producer_to(&broker);
    let mock = broker.mock();

    // 300 messages: ok, retried once, fatal; faults injected as they flow.
    let script = ["ok", "retry-until:2", "fatal"];
    let mut expected: HashMap<String, &str> = HashMap::new();
    for i in 0..300 {
        let payload = script[i % 3];
        let id = format!("m{i}");
        expected.insert(id.clone(), payload);
        match i {
            50 => mock.request_errors(
                RDKafkaApiKey::Produce,
                &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 5],
            ),
            100 => mock.request_errors(
                RDKafkaApiKey::Fetch,
                &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 5],
            ),
            150 => mock.request_errors(
                RDKafkaApiKey::OffsetCommit,
                &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 5],
            ),
            _ => {}
        }
        if i == 200 {
            mock.broker_down(1).unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
            mock.broker_up(1).unwrap();
        }
        send(&producer, &input, &id, payload).await;
    }

    // Every message reaches its end: ok (at once or on attempt 2), or the
    // DLQ. Duplicates may come; losses may not.
    let mut finished: HashSet<String> = HashSet::new();
    let mut dead: HashSet<String> = HashSet::new();
    let mut calls = 0;
    let until = Instant::now() + Duration::from_secs(180);
    while finished.len() + dead.len() < 300 {
        let left = until.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, events.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "timed out: {} ok, {} dead-lettered of 300",
                    finished.len(),
                    dead.len()
                )
            })
            .unwrap();
        match event {
            Event::Handled(events::Handled { id, verdict, .. }) => {
                calls += 1;
                if verdict == "ok" {
                    finished.insert(id);
                }
            }
            Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter { id, .. })) => {
                dead.insert(id);
            }
            _ => {}
        }
    }
    for (id, payload) in &expected {
        match *payload {
            "fatal" => assert!(dead.contains(id), "{id} is dead-lettered"),
            _ => assert!(finished.contains(id), "{id} is handled ok"),
        }
    }
    let reader: rdkafka::consumer::StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("group.id", rand_name("reader"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    reader.subscribe(&[&dlq]).unwrap();
    let mut ids: HashSet<String> = HashSet::new();
    while ids.len() < 100 {
        let record = tokio::time::timeout(PATIENCE, reader.recv())
            .await
            .expect("the DLQ holds every fatal message")
            .unwrap()
            .detach();
        ids.insert(header_map(&record).0["hopper-id"].clone());
    }
    assert_eq!(
        ids.len(),
        100,
        "every fatal message is on the DLQ once at least"
    );
    eprintln!(
        "300 messages through produce, fetch and commit errors and a broker restart: {calls} calls (200 needed)"
    );
    hopper.stop().await;
}

/// Waits until `group` has committed `offset` on `partition` of `topic`.
async fn until_committed(
    broker: &EmbeddedBroker,
    group: &str,
    topic: &str,
    partition: i32,
    offset: i64,
    what: &str,
) {
    let until = Instant::now() + PATIENCE;
    while committed(broker, group, topic, partition) != Some(offset) {
        assert!(
            Instant::now() < until,
            "{what}: {topic}[{partition}] committed {:?}, not {offset}, after {PATIENCE:?}",
            committed(broker, group, topic, partition)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_that_keeps_failing_never_commits_its_source_offset() {
    init_tracing();
    let name = rand_name("stuck");
    let (_file, mut config, input) = config(&name, 2);
    let broker = EmbeddedBroker::serve(&mut config).unwrap();
    let group = config.routes[0].group.clone();
    let dlq = config.routes[0].dlq.clone();
    let again = config.clone();
    let hopper = start(config).await;
    let producer = producer_to(&broker);

    // Offsets 0 and 1 of partition 0 are ok; they are committed.
    send_to(&producer, &input, Some(0), "a", "ok").await;
    send_to(&producer, &input, Some(0), "b", "ok").await;
    until_committed(&broker, &group, &input, 0, 2, "offsets 0 and 1 are ok").await;
    hopper.stop().await;
    // Offset 2 is fatal, and, once hopper runs again, its dead-letter record
    // cannot be produced: the DLQ's partitions have no leader, so no
    // produce to them is acknowledged until they get one back.
    send_to(&producer, &input, Some(0), "c", "fatal").await;
    send_to(&producer, &input, Some(0), "d", "ok").await;
    for partition in 0..2 {
        broker
            .mock()
            .partition_leader(&dlq, partition, None)
            .unwrap();
    }
    let hopper = start(again).await;
    let mut events = hopper.events();
    let mut seen = Vec::new();
    wait_for_event(&mut events, "the call of `d`", |e| {
        seen.push(e.clone());
        matches!(e, Event::Handled(events::Handled { id, .. }) if id == "d").then_some(())
    })
    .await;
    // Offset 3 is done. A message of partition 1, handled after it, is
    // committed: the pipeline has committed since offset 3 was done.
    send_to(&producer, &input, Some(1), "e", "ok").await;
    wait_for_event(&mut events, "the call of `e`", |e| {
        seen.push(e.clone());
        matches!(e, Event::Handled(events::Handled { id, .. }) if id == "e").then_some(())
    })
    .await;
    until_committed(
        &broker,
        &group,
        &input,
        1,
        1,
        "offset 0 of partition 1 is ok",
    )
    .await;
    for event in &seen {
        assert!(
            !matches!(event, Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter { id, .. })) if id == "c"),
            "c's dead-letter record was acknowledged by a leaderless DLQ"
        );
    }
    assert_eq!(
        committed(&broker, &group, &input, 0),
        Some(2),
        "nothing from offset 2 on is committed while its hop fails"
    );
    // Once the DLQ has a leader again, the hop is acknowledged and offsets
    // 2 and 3 are committed.
    for partition in 0..2 {
        broker
            .mock()
            .partition_leader(&dlq, partition, Some(1))
            .unwrap();
    }
    wait_for_event(&mut events, "`c` dead-lettered", |e| {
        matches!(e, Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter { id, .. })) if id == "c")
            .then_some(())
    })
    .await;
    until_committed(&broker, &group, &input, 0, 4, "c is dead-lettered").await;
    hopper.stop().await;
}

/// Every record of `topic` (one partition), from its first offset to the
/// end it has now.
fn read_to_end(broker: &EmbeddedBroker, topic: &str) -> Vec<rdkafka::message::OwnedMessage> {
    use rdkafka::Message;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("group.id", rand_name("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let (_, end) = consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap();
    let mut wanted = TopicPartitionList::new();
    wanted
        .add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&wanted).unwrap();
    let mut records = Vec::new();
    let until = Instant::now() + PATIENCE;
    while records
        .last()
        .map_or(0, |m: &rdkafka::message::OwnedMessage| m.offset() + 1)
        < end
    {
        assert!(
            Instant::now() < until,
            "{topic}: read {} of {end} records in {PATIENCE:?}",
            records.len()
        );
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            records.push(message.unwrap().detach());
        }
    }
    records
}

/// The broker goes down in the middle of a `hopper dlq replay` and comes
/// back: the replay waits it out, and every dead letter reaches the input
/// once, none twice (the CLI's producer is idempotent, so a produce retried
/// across the restart is not written again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_replay_replays_each_dead_letter_once() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    init_tracing();
    let name = rand_name("replay-restart");
    let (file, mut config, input) = config(&name, 1);
    let broker = EmbeddedBroker::serve(&mut config).unwrap();
    let dlq = config.routes[0].dlq.clone();
    let hopper = start(config).await;
    let producer = producer_to(&broker);
    const N: usize = 200;
    for i in 0..N {
        send(&producer, &input, &format!("r{i}"), "fatal").await;
    }
    let until = Instant::now() + PATIENCE;
    let watermarks: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap_servers())
        .create()
        .unwrap();
    loop {
        let (_, end) = watermarks
            .fetch_watermarks(&dlq, 0, Duration::from_secs(10))
            .unwrap();
        if end as usize >= N {
            break;
        }
        assert!(Instant::now() < until, "{end} of {N} dead letters");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stopped, so that only the replays are added to the input.
    hopper.stop().await;

    let mut child = Command::new(hopper_bin())
        .args(["dlq", "replay", "--config"])
        .arg(&file.path)
        .args(["--all", "--rate", "50"])
        .env("HOPPER_BROKERS", broker.bootstrap_servers())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let printed = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap());
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut before = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let at_40 = line.starts_with("[40] ");
        before.push(line);
        if at_40 {
            break;
        }
    }
    assert!(
        before.last().is_some_and(|l| l.starts_with("[40] ")),
        "the replay reached its 40th record: {before:#?}"
    );
    // Down for a while, then up: the replay's produces wait for it.
    let mock = broker.mock();
    mock.broker_down(1).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    mock.broker_up(1).unwrap();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = child.wait().unwrap();
    let printed = printed.join().unwrap();
    assert!(
        status.success(),
        "the replay finishes: {status}\n{printed}\n{before:#?}\n{rest:#?}"
    );
    assert!(
        printed.contains(&format!("Replayed {N} of {N}")),
        "{printed}"
    );

    // Each dead letter is in the input once as a replay, none twice.
    let mut replays: HashMap<String, usize> = HashMap::new();
    for record in read_to_end(&broker, &input) {
        let (headers, _) = header_map(&record);
        if headers.contains_key("hopper-replay-count") {
            *replays.entry(headers["hopper-id"].clone()).or_insert(0) += 1;
        }
    }
    assert_eq!(replays.len(), N, "every dead letter replayed: {replays:?}");
    let twice: Vec<_> = replays.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "replayed more than once: {twice:?}");
}
