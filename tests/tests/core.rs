//! The core loop against a real broker: ok, retry, dead-letter, traps, bad
//! envelopes, restarts.

use hopper::events::{self, Event};
use hopper_tests::*;
use rdkafka::Message;
use tokio::sync::broadcast::Receiver;

/// Collects what `pick` takes from the events until `done` accepts the
/// collection; returns it.
async fn collect<T>(
    events: &mut Receiver<Event>,
    what: &str,
    mut pick: impl FnMut(&Event) -> Option<T>,
    mut done: impl FnMut(&[T]) -> bool,
) -> Vec<T> {
    let mut out = Vec::new();
    wait_for_event(events, what, |e| {
        out.extend(pick(e));
        done(&out).then_some(())
    })
    .await;
    out
}

fn handled_id(id: &str) -> impl FnMut(&Event) -> Option<(u32, &'static str, i64)> + '_ {
    move |e| match e {
        Event::Handled(events::Handled {
            id: got,
            attempt,
            verdict,
            at_ms,
            ..
        }) if got == id => Some((*attempt, verdict.as_str(), *at_ms)),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_commits_and_is_not_handled_again_after_restart() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted"))
        .retry(&["1s"])
        .test_route();
    let producer = producer();
    produce(
        &producer,
        &route.input,
        Some("a"),
        "ok",
        &[("hopper-id", "first")],
    )
    .await;

    let hopper = route.start().await;
    let mut events = hopper.events();
    let seen = collect(
        &mut events,
        "the call of `first`",
        handled_id("first"),
        |v| !v.is_empty(),
    )
    .await;
    assert_eq!(seen[0].1, "ok");
    hopper.stop().await;

    // Same group again: only the new message may be handled.
    let hopper = route.start().await;
    let mut events = hopper.events();
    produce(
        &producer,
        &route.input,
        Some("a"),
        "ok",
        &[("hopper-id", "second")],
    )
    .await;
    let ids = collect(
        &mut events,
        "the call of `second`",
        |e| match e {
            Event::Handled(events::Handled { id, .. }) => Some(id.clone()),
            _ => None,
        },
        |v| v.iter().any(|id| id == "second"),
    )
    .await;
    assert_eq!(ids, vec!["second"], "the committed message came back");
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_twice_then_ok_is_called_three_times_and_never_early() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted"))
        .retry(&["1s", "2s"])
        .max_attempts(5)
        .test_route();
    let hopper = route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    produce(
        &producer,
        &route.input,
        None,
        "retry-until:3",
        &[("hopper-id", "r3")],
    )
    .await;

    let calls = collect(&mut events, "`r3` to end ok", handled_id("r3"), |v| {
        v.last().is_some_and(|c| c.1 == "ok")
    })
    .await;
    let attempts: Vec<u32> = calls.iter().map(|c| c.0).collect();
    assert_eq!(attempts, vec![1, 2, 3]);
    assert_eq!(calls[0].1, "retryable");
    assert_eq!(calls[1].1, "retryable");

    // Each retry record says when it is due; the next call came no earlier.
    for (tier, delay_ms, next_call) in [
        (format!("{}.retry.1s", route.name), 1000, calls[1].2),
        (format!("{}.retry.2s", route.name), 2000, calls[2].2),
    ] {
        let records = consume(&tier, 1, PATIENCE).await;
        let (h, _) = header_map(&records[0]);
        let failed: i64 = h["hopper-last-failure-at"].parse().unwrap();
        let due: i64 = h["hopper-due-at"].parse().unwrap();
        assert_eq!(due - failed, delay_ms, "{tier}");
        assert!(
            next_call >= due,
            "{tier}: handled at {next_call}, due at {due}"
        );
    }
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_retryable_goes_to_the_dlq_after_max_attempts_with_every_header() {
    init_tracing();
    let handler = plugin("scripted");
    let route = RouteTable::new(&handler)
        .retry(&["1s"])
        .max_attempts(3)
        .test_route();
    let hopper = route.start().await;
    let producer = producer();
    let before = now_ms();
    let (partition, offset) = produce(
        &producer,
        &route.input,
        Some("key-1"),
        "retry",
        &[("x-trace", "abc"), ("x-tenant", "t1")],
    )
    .await;

    let dlq = consume(&route.dlq, 1, PATIENCE).await;
    let record = &dlq[0];
    assert_eq!(record.key(), Some(&b"key-1"[..]));
    assert_eq!(record.payload(), Some(&b"retry"[..]));
    let (h, counts) = header_map(record);
    for (key, count) in &counts {
        assert_eq!(*count, 1, "header {key} appears {count} times");
    }
    assert_eq!(h["x-trace"], "abc");
    assert_eq!(h["x-tenant"], "t1");
    assert_eq!(
        h["hopper-id"],
        format!("{}-{partition}-{offset}", route.input)
    );
    assert_eq!(h["hopper-attempt"], "3");
    assert_eq!(h["hopper-route"], route.name);
    assert_eq!(h["hopper-origin-topic"], route.input);
    assert_eq!(h["hopper-origin-partition"], partition.to_string());
    assert_eq!(h["hopper-origin-offset"], offset.to_string());
    let origin_ts: i64 = h["hopper-origin-timestamp"].parse().unwrap();
    assert!(origin_ts >= before - 1000 && origin_ts <= now_ms());
    assert_eq!(h["hopper-reason"], "RETRIES_EXHAUSTED");
    assert_eq!(h["hopper-last-error"], "told to retry");
    let first: i64 = h["hopper-first-failure-at"].parse().unwrap();
    let last: i64 = h["hopper-last-failure-at"].parse().unwrap();
    assert!(
        first >= before && last >= first + 2000,
        "first {first}, last {last}"
    );
    assert_eq!(h["hopper-handler"], "scripted");
    assert_eq!(
        h["hopper-handler-version"],
        sha256_hex(&std::fs::read(&handler).unwrap())
    );
    assert_eq!(h["hopper-trail"], "retry.1s,retry.1s,dlq");
    assert!(!h.contains_key("hopper-due-at"), "a DLQ record is not held");
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fatal_goes_to_the_dlq_at_once() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted")).test_route();
    let hopper = route.start().await;
    let mut events = hopper.events();
    produce(
        &producer(),
        &route.input,
        None,
        "fatal",
        &[("hopper-id", "f1")],
    )
    .await;
    let dlq = consume(&route.dlq, 1, PATIENCE).await;
    let (h, _) = header_map(&dlq[0]);
    assert_eq!(h["hopper-reason"], "FATAL");
    assert_eq!(h["hopper-attempt"], "1");
    assert_eq!(h["hopper-last-error"], "told to fail");
    assert_eq!(h["hopper-trail"], "dlq");
    assert_eq!(h["hopper-id"], "f1");
    let calls = collect(&mut events, "the call of `f1`", handled_id("f1"), |v| {
        !v.is_empty()
    })
    .await;
    assert_eq!(calls, vec![(1, "fatal", calls[0].2)]);
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_get_their_outcome_and_the_partition_moves_on() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted"))
        .retry(&["1s"])
        .max_attempts(1)
        .timeout("300ms")
        .memory_mib(16)
        .test_route();
    let hopper = route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    // One key, so one partition: each hostile message is followed by a
    // well-behaved one that must still be handled.
    let script = [
        "trap", "ok", "loop", "ok", "oom", "ok", "recurse", "ok", "spam", "ok",
    ];
    for (i, command) in script.iter().enumerate() {
        let id = format!("h{i}");
        produce(
            &producer,
            &route.input,
            Some("same"),
            command,
            &[("hopper-id", &id)],
        )
        .await;
    }
    let calls = collect(
        &mut events,
        "a call of every message of the script",
        |e| match e {
            Event::Handled(events::Handled {
                id,
                verdict,
                partition,
                offset,
                ..
            }) => Some((id.clone(), *verdict, *partition, *offset)),
            _ => None,
        },
        |v| v.len() == script.len(),
    )
    .await;
    let verdicts: Vec<&str> = calls.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(
        verdicts,
        vec![
            "trap", "ok", "timeout", "ok", "memory", "ok", "trap", "ok", "ok", "ok"
        ]
    );
    let offsets: Vec<i64> = calls.iter().map(|c| c.3).collect();
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "handled in offset order: {offsets:?}"
    );

    let dlq = consume(&route.dlq, 4, PATIENCE).await;
    let mut by_id: std::collections::HashMap<String, std::collections::HashMap<String, String>> =
        Default::default();
    for record in &dlq {
        let (h, _) = header_map(record);
        by_id.insert(h["hopper-id"].clone(), h);
    }
    assert_eq!(by_id["h0"]["hopper-reason"], "HANDLER_TRAP");
    assert!(
        by_id["h0"]["hopper-last-error"].contains("told to trap"),
        "{:?}",
        by_id["h0"]
    );
    assert_eq!(by_id["h2"]["hopper-reason"], "RETRIES_EXHAUSTED");
    assert!(
        by_id["h2"]["hopper-last-error"].starts_with("HANDLER_TIMEOUT"),
        "{:?}",
        by_id["h2"]
    );
    assert_eq!(by_id["h4"]["hopper-reason"], "HANDLER_MEMORY");
    assert_eq!(by_id["h6"]["hopper-reason"], "HANDLER_TRAP");
    // A Rust guest's stack lives in linear memory: overflowing it is an
    // out-of-bounds access rather than wasm's own call-stack limit.
    let overflow = &by_id["h6"]["hopper-last-error"];
    assert!(
        overflow.contains("out of bounds memory access")
            || overflow.contains("call stack exhausted"),
        "{overflow}"
    );
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trap_policy_retry_sends_a_trap_up_the_ladder() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted"))
        .retry(&["1s"])
        .max_attempts(2)
        .on_trap("retry")
        .test_route();
    let hopper = route.start().await;
    produce(
        &producer(),
        &route.input,
        None,
        "trap",
        &[("hopper-id", "t1")],
    )
    .await;
    let dlq = consume(&route.dlq, 1, PATIENCE).await;
    let (h, _) = header_map(&dlq[0]);
    assert_eq!(h["hopper-reason"], "RETRIES_EXHAUSTED");
    assert!(h["hopper-last-error"].starts_with("HANDLER_TRAP"), "{h:?}");
    assert_eq!(h["hopper-trail"], "retry.1s,dlq");
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_envelopes_are_dead_lettered_with_the_header_named() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted"))
        .retry(&["1s"])
        .test_route();
    let hopper = route.start().await;
    let producer = producer();
    let long_id = "x".repeat(300);
    produce(
        &producer,
        &route.input,
        None,
        "ok",
        &[("hopper-id", &long_id)],
    )
    .await;
    // Someone writes straight into a retry tier with a broken attempt count.
    let tier = format!("{}.retry.1s", route.name);
    produce(
        &producer,
        &tier,
        None,
        "ok",
        &[
            ("hopper-id", "bad-attempt"),
            ("hopper-attempt", "three"),
            ("hopper-origin-topic", &route.input),
            ("hopper-origin-partition", "0"),
            ("hopper-origin-offset", "0"),
        ],
    )
    .await;
    produce(
        &producer,
        &tier,
        None,
        "ok",
        &[("hopper-id", "no-origin"), ("hopper-attempt", "1")],
    )
    .await;

    let dlq = consume(&route.dlq, 3, PATIENCE).await;
    let mut errors: Vec<(String, String)> = dlq
        .iter()
        .map(|r| {
            let (h, _) = header_map(r);
            assert_eq!(h["hopper-reason"], "INVALID_ENVELOPE");
            assert_eq!(r.payload(), Some(&b"ok"[..]), "the payload is kept");
            (h["hopper-id"].clone(), h["hopper-last-error"].clone())
        })
        .collect();
    errors.sort();
    assert_eq!(
        errors[0],
        (
            "bad-attempt".into(),
            "header hopper-attempt: `three` is not a valid number".into()
        )
    );
    assert_eq!(
        errors[1],
        (
            "no-origin".into(),
            "header hopper-origin-topic: is missing".into()
        )
    );
    assert!(
        errors[2].0.starts_with("xxx")
            && errors[2].1 == "header hopper-id: is 300 bytes; the limit is 256",
        "{:?}",
        errors[2]
    );
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_config_values_reach_the_guest() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted"))
        .config("colour", "blue")
        .test_route();
    let hopper = route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    produce(
        &producer,
        &route.input,
        None,
        "config:colour=blue",
        &[("hopper-id", "c1")],
    )
    .await;
    produce(
        &producer,
        &route.input,
        None,
        "config:colour=red",
        &[("hopper-id", "c2")],
    )
    .await;
    let mut calls = collect(
        &mut events,
        "the calls of `c1` and `c2`",
        |e| match e {
            Event::Handled(events::Handled { id, verdict, .. }) => {
                Some((id.clone(), verdict.as_str()))
            }
            _ => None,
        },
        |v| v.len() == 2,
    )
    .await;
    calls.sort();
    assert_eq!(
        calls,
        vec![("c1".to_string(), "ok"), ("c2".to_string(), "fatal")]
    );
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_that_do_not_fit_fail_at_startup_naming_the_file() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let core = dir.path().join("core-module.wasm");
    // The smallest valid core module: magic and version 1, no sections.
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let truncated = dir.path().join("truncated.wasm");
    let whole = std::fs::read(plugin("scripted")).unwrap();
    std::fs::write(&truncated, &whole[..whole.len() / 2]).unwrap();
    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, b"hello").unwrap();
    let cases = [
        (
            plugin("wrong_world"),
            "does not fit the hopper:handler/handler@0.1.3 world",
        ),
        (core, "is a core WebAssembly module, not a component"),
        (truncated, "does not compile"),
        (text, "is not a WebAssembly file"),
    ];
    for (path, expected) in cases {
        let route = RouteTable::new(&path).test_route();
        let error = match hopper::Hopper::start(route.config(), options()).await {
            Ok(_) => panic!("{} was accepted", path.display()),
            Err(e) => format!("{e:#}"),
        };
        assert!(error.contains(&path.display().to_string()), "{error}");
        assert!(error.contains(expected), "{error}");
        assert!(
            error.contains(&format!("route `{}`", route.name)),
            "{error}"
        );
    }
}
