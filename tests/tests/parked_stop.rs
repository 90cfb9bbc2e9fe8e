//! A route with ordered retries gives up, once hopper begins to stop, a
//! park-topic record its broker has not acknowledged: what needed it is
//! left undone, as after a crash, instead of being tried until the drain's
//! deadline (docs/ordered-retries.md, "At the stop").
//!
//! The broker is a Nisshi of the test's own, stopped with SIGSTOP: its
//! connections stay open and nothing it is sent is ever answered.

use hopper::events::Telemetry;
use hopper::kafka::Cluster;
use hopper::parked::{self, Lane, NotParked, Parked, Unwritten};
use hopper_tests::*;
use std::process::Command;
use tokio_util::sync::CancellationToken;

/// Sends `signal` (`STOP`, `CONT`) to the process `pid`.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn park_records_not_acknowledged_are_given_up_when_hopper_stops() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let port = secured::free_port();
    let broker = secured::Nisshi::start(dir.path(), port, port, "memory://nisshi/", &[]);
    let route = RouteTable::new(&plugin("scripted"))
        .retry(&["1s"])
        .key("retry_order", quoted("key"));
    let input = route.input().to_string();
    let written = ConfigBuilder::new()
        .brokers(format!("127.0.0.1:{port}"))
        .partitions(1)
        .route(route)
        .write();
    let config = hopper::config::Config::load(&written.path).unwrap();
    let route = &config.routes[0];
    let cluster = Cluster::of(&config.kafka).unwrap();
    cluster
        .ensure_topics(&[input.clone()].into())
        .await
        .expect("the input created");
    parked::ensure_topic(&cluster, route.parking.as_ref().unwrap())
        .await
        .expect("the park topic created");
    let loaded = parked::load(&cluster, route, Telemetry::new())
        .await
        .expect("the park table loads");
    let shutdown = CancellationToken::new();
    let store = loaded.follow(shutdown.clone());
    let lane = |key: &str| Lane {
        topic: input.clone(),
        partition: 0,
        key: key.as_bytes().to_vec(),
    };

    // The broker up: a head record is acknowledged, and applied.
    store
        .hold(&lane("a"), "a/0", 0)
        .await
        .expect("the head record acknowledged");
    assert!(store.table.head_of(&lane("a")).is_some());

    // The broker answers nothing from now on.
    signal(broker.pid(), "STOP");
    let head = tokio::spawn({
        let (store, lane) = (store.clone(), lane("b"));
        async move { store.hold(&lane, "b/0", 1).await }
    });
    let waiting = Parked {
        payload: Some(b"x".to_vec()),
        headers: Vec::new(),
        timestamp: None,
    };
    let parking = tokio::spawn(store.park(&lane("a"), 2, waiting));
    let job = tokio::spawn({
        let (store, lane) = (store.clone(), lane("a"));
        async move { store.written(&lane, 2).await }
    });

    shutdown.cancel();
    let head = tokio::time::timeout(PATIENCE, head)
        .await
        .expect("the head record given up, not tried until a deadline")
        .unwrap();
    assert!(matches!(head, Err(Unwritten::Stopping(_))), "{head:?}");
    assert!(
        store.table.head_of(&lane("b")).is_none(),
        "a head record given up parks nothing"
    );
    let parking = tokio::time::timeout(PATIENCE, parking)
        .await
        .expect("the waiting message's record given up")
        .unwrap();
    assert!(
        matches!(parking, Err(NotParked::Stopping(_))),
        "{parking:?}"
    );
    let job = tokio::time::timeout(PATIENCE, job)
        .await
        .expect("the job waiting for that record gives up too")
        .unwrap();
    assert!(
        job.is_err(),
        "the job must not handle a message not written"
    );

    signal(broker.pid(), "CONT");
}
