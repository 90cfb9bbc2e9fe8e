//! Instance policies against a real broker: warm instances are reused,
//! retired and dropped after a failure; fresh ones never share state.

use hopper::events::{self, Event};
use hopper::hop;
use hopper_tests::*;
use std::collections::HashMap;

/// An instance policy: `instance`, and `warm_max_calls` if set.
#[derive(Debug, Clone, Copy)]
struct Policy(&'static str, Option<u32>);

impl Policy {
    fn on(self, route: RouteTable) -> RouteTable {
        let route = route.instance(self.0);
        match self.1 {
            Some(calls) => route.key("warm_max_calls", calls),
            None => route,
        }
    }
}

/// The hostile sequence of core.rs's
/// `hostile_guests_get_their_outcome_and_the_partition_moves_on`, under an
/// explicit instance policy.
async fn hostile_sequence(policy: Policy) {
    let route = policy
        .on(RouteTable::new(&plugin("scripted"))
            .max_attempts(1)
            .timeout("300ms")
            .memory_mib(16))
        .test_route();
    let hopper = route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    let script = [
        "trap", "ok", "loop", "ok", "oom", "ok", "recurse", "ok", "spam", "ok", "ok",
    ];
    for (i, command) in script.iter().enumerate() {
        produce(
            &producer,
            &route.input,
            Some("same"),
            command,
            &[("hopper-id", &format!("h{i}"))],
        )
        .await;
    }
    let mut verdicts = Vec::new();
    while verdicts.len() < script.len() {
        let verdict = wait_for_event(&mut events, "the next call", |e| match e {
            Event::Handled(events::Handled { verdict, .. }) => Some(*verdict),
            _ => None,
        })
        .await;
        verdicts.push(verdict);
    }
    assert_eq!(
        verdicts,
        vec![
            "trap", "ok", "timeout", "ok", "memory", "ok", "trap", "ok", "ok", "ok", "ok"
        ],
        "{policy:?}"
    );
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_instances_survive_hostile_guests_and_the_partition_moves_on() {
    init_tracing();
    hostile_sequence(Policy("warm", Some(1000))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_instances_survive_hostile_guests_and_the_partition_moves_on() {
    init_tracing();
    hostile_sequence(Policy("fresh", None)).await;
}

/// What a `count` call said ("call N": the calls its instance served), or
/// the trap, for each message of `script`, sent on one partition.
async fn instance_calls(policy: Policy, script: &[&str]) -> Vec<String> {
    let route = policy
        .on(RouteTable::new(&plugin("scripted")).max_attempts(1))
        .test_route();
    let hopper = route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    for (i, command) in script.iter().enumerate() {
        produce(
            &producer,
            &route.input,
            Some("same"),
            command,
            &[("hopper-id", &format!("c{i}"))],
        )
        .await;
    }
    let mut errors: HashMap<String, String> = HashMap::new();
    while errors.len() < script.len() {
        let (id, error) = wait_for_event(&mut events, "the next dead letter", |e| match e {
            Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter { id, error, .. })) => {
                Some((id.clone(), error.clone()))
            }
            _ => None,
        })
        .await;
        errors.insert(id, error);
    }
    hopper.stop().await;
    (0..script.len())
        .map(|i| {
            let error = &errors[&format!("c{i}")];
            if error.contains("told to trap") {
                "trap".to_string()
            } else {
                error.clone()
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_instance_is_reused_retired_after_max_calls_and_dropped_after_a_trap() {
    init_tracing();
    let script = [
        "count", "count", "trap", "count", "count", "count", "count", "count",
    ];
    let warm = instance_calls(Policy("warm", Some(3)), &script).await;
    assert_eq!(
        warm,
        [
            "call 1", "call 2", "trap", "call 1", "call 2", "call 3", "call 1", "call 2"
        ],
        "a trapped instance is never entered again; a retired one is replaced"
    );
    let fresh = instance_calls(Policy("fresh", None), &script).await;
    assert_eq!(
        fresh,
        [
            "call 1", "call 1", "trap", "call 1", "call 1", "call 1", "call 1", "call 1"
        ]
    );
}
