//! Each partition is read from its own queue, split off the consumer's main
//! queue in the assign callback. The known traps of split queues, against
//! the test broker: messages already waiting when a partition is assigned
//! must reach its queue, not the main one; every assignment must split
//! again (an assignment undoes the splits before it); and a partition given
//! up and assigned again must be read again although its old queue was
//! dropped; and a task that waited idle past its wake-up fallback still
//! reads its next message.

use hopper::Stopped;
use hopper::events::{self, Event};
use hopper_tests::*;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::broadcast::Receiver;

const PARTITIONS: i32 = 4;

/// Produces `count` messages with keys spread over every partition.
async fn produce_batch(topic: &str, from: usize, count: usize) {
    let producer = producer();
    for i in from..from + count {
        produce(&producer, topic, Some(&format!("k{i}")), "ok", &[]).await;
    }
}

/// The partitions of `topic` that the route behind `events` handles
/// messages of, collected until `enough` says so.
async fn handled_partitions(
    events: &mut Receiver<Event>,
    topic: &str,
    mut enough: impl FnMut(&BTreeSet<i32>) -> bool,
) -> BTreeSet<i32> {
    let mut seen = BTreeSet::new();
    let what = format!("calls of messages of enough partitions of {topic}");
    wait_for_event(events, &what, |e| {
        if let Event::Handled(events::Handled {
            topic: t,
            partition,
            ..
        }) = e
            && t == topic
        {
            seen.insert(*partition);
        }
        enough(&seen).then_some(())
    })
    .await;
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_split_before_assignment_and_again_after_every_rebalance_lose_nothing() {
    init_tracing();
    let name = rand_name("split");
    let input = format!("{name}.in");
    let group = format!("hopper.{name}");
    let config = ConfigBuilder::new()
        .partitions(PARTITIONS)
        .route(RouteTable::named(&name, &plugin("noop")).ordering("key"))
        .write();
    create_topics_with(&[&input], PARTITIONS).await;

    // Waiting before the first assignment: each partition's first fetch
    // lands in its own queue. One on the main queue would halt the route.
    produce_batch(&input, 0, 200).await;
    let first = config.start().await;
    until_committed_on(&group, &input, records_on(std::slice::from_ref(&input))).await;

    // Idle for a few of the tasks' wake-up fallbacks (100 ms), with no call
    // running: the next messages are still read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    produce_batch(&input, 200, 20).await;
    until_committed_on(&group, &input, records_on(std::slice::from_ref(&input))).await;

    // A second member joins: every partition is revoked and assigned again
    // (the first member keeps some, and splits them again), and the second
    // member reads the others.
    let second = config.start().await;
    let mut second_events = second.events();
    let mut produced = 220;
    let joined = async {
        loop {
            produce_batch(&input, produced, 20).await;
            produced += 20;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        _ = handled_partitions(&mut second_events, &input, |seen| !seen.is_empty()) => {}
        _ = tokio::time::timeout(PATIENCE, joined) => panic!("the second member never handled a message"),
    }
    until_committed_on(&group, &input, records_on(std::slice::from_ref(&input))).await;

    // It leaves: the first member is assigned all four again, two of them
    // for the second time since its start. Each must be read again.
    let mut first_events = first.events();
    assert_eq!(second.stop().await, Stopped::Cleanly);
    let left = async {
        loop {
            produce_batch(&input, produced, 20).await;
            produced += 20;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    tokio::select! {
        seen = handled_partitions(&mut first_events, &input, |seen| seen.len() == all.len()) => {
            assert_eq!(seen, all);
        }
        _ = tokio::time::timeout(PATIENCE, left) => panic!("the first member never read every partition again"),
    }
    until_committed_on(&group, &input, records_on(std::slice::from_ref(&input))).await;
    assert_eq!(
        first.stop().await,
        Stopped::Cleanly,
        "no message reached the main queue, and no partition task ended on its own"
    );
}
