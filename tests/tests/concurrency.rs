//! Many calls in flight per partition, in the order a route's `ordering`
//! allows, against the test broker. The `fetch` fixture calls a loopback
//! server (`TrackServer`) that records which message each call was for, the
//! order calls arrived in, and how many were open at once.

use futures::future::join_all;
use hopper_tests::track_server::TrackServer;
use hopper_tests::*;
use rand::Rng;
use rdkafka::producer::FutureRecord;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// A route around the `fetch` fixture calling `server`, on an input of
/// `partitions` partitions, a call timeout of 10 s, and what `more` adds
/// to the route.
async fn route(
    server: &TrackServer,
    partitions: i32,
    more: impl FnOnce(RouteTable) -> RouteTable,
) -> (TestConfig, String) {
    let name = rand_name("conc");
    let input = format!("{name}.in");
    create_topics_with(&[&input], partitions).await;
    let route = RouteTable::named(&name, &plugin("fetch"))
        .allowed_hosts(&[server.origin()])
        .timeout("10s")
        .config("url", server.url())
        .config("append-payload", "true");
    let config = ConfigBuilder::new().route(more(route)).write();
    (config, input)
}

/// Produces `(partition, key, payload)` records in order: records of one
/// partition land in the order given.
async fn produce_all(topic: &str, records: &[(Option<i32>, Option<String>, String)]) {
    let producer = producer();
    for chunk in records.chunks(500) {
        let sends = chunk.iter().map(|(partition, key, payload)| {
            let mut record = FutureRecord::<str, str>::to(topic).payload(payload);
            if let Some(key) = key {
                record = record.key(key);
            }
            if let Some(p) = partition {
                record = record.partition(*p);
            }
            producer.send(record, Duration::from_secs(30))
        });
        for sent in join_all(sends).await {
            sent.map_err(|(e, _)| e).expect("produce");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_order_is_offset_order_for_each_of_1000_keys_with_calls_in_flight() {
    init_tracing();
    let server = TrackServer::start();
    let (config, input) = route(&server, 3, |r| r.ordering("key").max_in_flight(64)).await;
    let hopper = config.start().await;
    // Three messages per key, each call 0-20 ms; `k.seq` names them.
    let mut rng = rand::rng();
    let records: Vec<_> = (0..3000)
        .map(|i| {
            let (key, seq) = (i % 1000, i / 1000);
            let wait = rng.random_range(0..=20);
            (
                None,
                Some(format!("k{key}")),
                format!("k{key}.{seq}/{wait}"),
            )
        })
        .collect();
    produce_all(&input, &records).await;
    server
        .wait_for("every call", Duration::from_secs(180), |s| {
            s.completed().len() >= 3000
        })
        .await;
    hopper.stop().await;

    let arrived = server.arrived();
    let unique: HashSet<&String> = arrived.iter().collect();
    assert_eq!(arrived.len(), 3000, "each message is handled once");
    assert_eq!(unique.len(), 3000);
    let mut seen: HashMap<&str, Vec<u32>> = HashMap::new();
    for id in &arrived {
        let (key, seq) = id.split_once('.').unwrap();
        seen.entry(key).or_default().push(seq.parse().unwrap());
    }
    assert_eq!(seen.len(), 1000);
    for (key, order) in &seen {
        assert_eq!(order, &[0, 1, 2], "key {key} was handled out of order");
    }
    assert_eq!(
        server.key_overlaps(),
        0,
        "no call started while another of its key was running"
    );
    let high_water = server.high_water();
    eprintln!("key ordering: {high_water} calls open at most, over 3 partitions");
    assert!(
        high_water > 3,
        "more than one call per partition ran at once (high-water {high_water})"
    );
}

/// Runs 200 messages of 50 ms through a one-partition route with
/// `ordering`, and returns the most calls open at once.
async fn high_water_of(ordering: &str, keyed: bool) -> usize {
    let server = TrackServer::start();
    let (config, input) = route(&server, 1, |r| r.ordering(ordering).max_in_flight(16)).await;
    let hopper = config.start().await;
    let records: Vec<_> = (0..200)
        .map(|i| (None, keyed.then(|| format!("k{i}")), format!("m{i}/50")))
        .collect();
    produce_all(&input, &records).await;
    server
        .wait_for("every call", Duration::from_secs(120), |s| {
            s.completed().len() >= 200
        })
        .await;
    hopper.stop().await;
    let unique: HashSet<String> = server.arrived().into_iter().collect();
    assert_eq!(unique.len(), 200, "every message was handled");
    server.high_water()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_and_key_run_many_calls_of_one_partition_at_once_and_partition_one() {
    init_tracing();
    let unordered = high_water_of("unordered", false).await;
    let keyed = high_water_of("key", true).await;
    let null_keys = high_water_of("key", false).await;
    let partition = high_water_of("partition", true).await;
    eprintln!(
        "calls open at once on one partition: unordered {unordered}, key {keyed}, key (null keys) {null_keys}, partition {partition}"
    );
    assert!(unordered > 1, "unordered: {unordered}");
    assert!(keyed > 1, "key: {keyed}");
    assert!(null_keys > 1, "a null key is a key of its own: {null_keys}");
    assert!(unordered <= 16 && keyed <= 16, "max_in_flight bounds them");
    assert_eq!(partition, 1, "partition: one at a time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_whose_handler_hangs_does_not_slow_the_others() {
    init_tracing();
    let server = TrackServer::start();
    let (config, input) = route(&server, 3, |r| {
        r.ordering("partition").max_attempts(1).timeout("8s")
    })
    .await;
    let hopper = config.start().await;
    // Partition 0 starts with a call that hangs until its timeout.
    let mut records = vec![(Some(0), None, "hung/hang".to_string())];
    for i in 0..20 {
        for p in 0..3 {
            records.push((Some(p), None, format!("p{p}-{i}/10")));
        }
    }
    produce_all(&input, &records).await;
    let started = Instant::now();
    server
        .wait_for("the other partitions' calls", PATIENCE, |s| {
            let done = s.completed();
            (0..20).all(|i| done.contains(&format!("p1-{i}")) && done.contains(&format!("p2-{i}")))
        })
        .await;
    let others_took = started.elapsed();
    let p0_done = server
        .completed()
        .iter()
        .filter(|id| id.starts_with("p0-"))
        .count();
    eprintln!(
        "partitions 1 and 2 finished in {others_took:?}; partition 0 had finished {p0_done} of 20 behind its hung call"
    );
    assert_eq!(
        p0_done, 0,
        "partitions 1 and 2 finished while partition 0 still waited on its hung call"
    );
    // Partition 0 goes on once the hung call times out: nothing is lost.
    server
        .wait_for("partition 0's calls", PATIENCE, |s| {
            let done = s.completed();
            (0..20).all(|i| done.contains(&format!("p0-{i}")))
        })
        .await;
    hopper.stop().await;
}
