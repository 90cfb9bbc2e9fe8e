//! Trace context against a real broker (docs/tracing.md): every record
//! hopper writes, on every topic, carries exactly one `traceparent`, in the
//! trace of the record it came from, through retry tiers, the DLQ, a replay
//! and the delay relay; a record without one (or with a malformed one)
//! starts a trace of its own.

use hopper::trace::{self, Traceparent};
use hopper_tests::*;
use rdkafka::Message;
use rdkafka::message::{Headers, OwnedMessage};
use serde_json::{Value, json};
use std::collections::HashSet;

const TOKEN: &str = "tracing-token";
/// The producer's context: trace `4bf9…4736`, its own span `00f0…02b7`.
const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// The one `traceparent` of a record hopper wrote, read; fails on none, on
/// two (in any spelling) and on an invalid one.
fn the_traceparent(m: &OwnedMessage) -> Traceparent {
    let values: Vec<&[u8]> = m
        .headers()
        .map(|h| {
            h.iter()
                .filter(|h| h.key.eq_ignore_ascii_case(trace::TRACEPARENT))
                .map(|h| h.value.unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        values.len(),
        1,
        "{}:{}:{} has {} traceparent headers",
        m.topic(),
        m.partition(),
        m.offset(),
        values.len()
    );
    trace::parse_traceparent(values[0]).unwrap_or_else(|| {
        panic!(
            "invalid traceparent `{}`",
            String::from_utf8_lossy(values[0])
        )
    })
}

fn id_of(m: &OwnedMessage) -> String {
    header_map(m)
        .0
        .get("hopper-id")
        .cloned()
        .unwrap_or_default()
}

async fn replay(addr: std::net::SocketAddr, body: Value) -> Value {
    let (status, answer) = http(
        addr,
        "POST",
        "/api/replay",
        Some(TOKEN),
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    serde_json::from_str(&answer).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_dead_lettered_and_replayed_message_keeps_one_trace_on_every_record() {
    init_tracing();
    let route = TestRoute::new(
        &plugin("scripted"),
        &format!(
            "retry = [\"1s\"]\nmax_attempts = 3\n\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n"
        ),
    );
    let tier = format!("{}.retry.1s", route.name);
    let journal = format!("{}.replays", route.dlq);
    let hopper = route.start().await;
    let producer = producer();
    // `traced` continues the producer's trace (with vendor state, and a
    // second spelling hopper must not copy); `fresh` has none, and
    // `malformed` an unusable one: each of those starts a trace.
    produce(
        &producer,
        &route.input,
        Some("traced"),
        "retry",
        &[
            ("hopper-id", "traced"),
            ("traceparent", PRODUCER),
            ("tracestate", "vendor=1"),
        ],
    )
    .await;
    produce(
        &producer,
        &route.input,
        Some("fresh"),
        "retry",
        &[("hopper-id", "fresh")],
    )
    .await;
    produce(
        &producer,
        &route.input,
        Some("malformed"),
        "retry",
        &[
            ("hopper-id", "malformed"),
            (
                "traceparent",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("tracestate", "stale=1"),
        ],
    )
    .await;
    // Three attempts each: two retries, then the DLQ.
    consume(&route.dlq, 3, PATIENCE).await;
    let report = replay(hopper.admin_addr().unwrap(), json!({ "filter": {} })).await;
    assert_eq!(report["replayed"], 3, "{report}");
    // Replayed, each is retried twice and dead-lettered again.
    let input = consume(&route.input, 6, PATIENCE).await;
    let retries = consume(&tier, 12, PATIENCE).await;
    let dead = consume(&route.dlq, 6, PATIENCE).await;
    let journal = consume(&journal, 3, PATIENCE).await;
    hopper.stop().await;

    // Everything hopper wrote: the tiers, the DLQ, the replays and their
    // journal entries.
    let replays: Vec<&OwnedMessage> = input
        .iter()
        .filter(|m| header_map(m).0.contains_key("hopper-replay-count"))
        .collect();
    let written: Vec<&OwnedMessage> = retries
        .iter()
        .chain(&dead)
        .chain(replays.iter().copied())
        .collect();
    assert_eq!(written.len(), 12 + 6 + 3);
    let mut spans = HashSet::new();
    let mut traces = std::collections::HashMap::new();
    for m in &written {
        let tp = the_traceparent(m);
        assert!(spans.insert(tp.span_id), "each hop has a span of its own");
        let trace = traces.entry(id_of(m)).or_insert(tp.trace_id);
        assert_eq!(
            *trace,
            tp.trace_id,
            "{} changed trace on {}",
            id_of(m),
            m.topic()
        );
    }
    assert_eq!(traces.len(), 3, "{traces:?}");
    assert_eq!(
        traces["traced"].to_string(),
        TRACE,
        "the producer's trace continues"
    );
    let new: HashSet<_> = [traces["fresh"], traces["malformed"]].into();
    assert_eq!(
        new.len(),
        2,
        "each record without a usable context starts its own trace"
    );
    assert!(!new.iter().any(|t| t.to_string() == TRACE));
    for m in &written {
        let (h, counts) = header_map(m);
        // The producer's span is a link, never a second header.
        assert!(
            !m.headers().unwrap().iter().any(|h| h
                .value
                .is_some_and(|v| v.windows(16).any(|w| w == b"00f067aa0ba902b7"))),
            "the producer's span is not carried on"
        );
        match id_of(m).as_str() {
            "traced" => {
                assert_eq!(h["tracestate"], "vendor=1");
                assert_eq!(counts["tracestate"], 1);
            }
            other => assert!(
                !h.contains_key("tracestate"),
                "{other}: a new trace drops the old vendor state"
            ),
        }
    }
    // A journal entry is in the trace of the record it replayed.
    for m in &journal {
        let tp = the_traceparent(m);
        assert_eq!(tp.trace_id, traces[&id_of(m)]);
    }
    // The producer's own record is untouched, and would have failed the
    // checks above on its span: the check sees what it looks for.
    let original = input.iter().find(|m| id_of(m) == "traced").unwrap();
    assert_eq!(
        the_traceparent(original).span_id.to_string(),
        "00f067aa0ba902b7"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_keeps_its_trace_through_the_tiers_to_its_target() {
    init_tracing();
    let inbox = rand_name("delay");
    let config = TestConfig::new(&format!(
        "[delay]\ninbox = \"{inbox}\"\ngroup = \"{inbox}\"\ntiers = [\"1s\"]\nmax_delay = \"1h\"\n"
    ));
    let tier = config.config().delay.unwrap().tiers[0].1.clone();
    let target = rand_name("target");
    create_topics(&[&target]).await;
    let hopper = config.start().await;
    let producer = producer();
    produce(
        &producer,
        &inbox,
        Some("d1"),
        "later",
        &[
            ("hopper-id", "d1"),
            ("hopper-target", &target),
            ("hopper-delay", "2500ms"),
            ("traceparent", PRODUCER),
        ],
    )
    .await;
    let forwarded = consume(&target, 1, PATIENCE).await;
    let tiers = consume(&tier, 1, PATIENCE).await;
    hopper.stop().await;
    let (hop, out) = (the_traceparent(&tiers[0]), the_traceparent(&forwarded[0]));
    assert_eq!(hop.trace_id.to_string(), TRACE);
    assert_eq!(out.trace_id.to_string(), TRACE);
    assert_ne!(hop.span_id, out.span_id, "the forward is a hop of its own");
    assert_ne!(out.span_id.to_string(), "00f067aa0ba902b7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_a_handler_emits_continue_the_calls_trace() {
    init_tracing();
    let closed = rand_name("closed");
    let route = TestRoute::new(
        &plugin("acting"),
        &format!("emit_topics = [\"{closed}\"]\n"),
    );
    let hopper = route.start().await;
    // The guest sets a traceparent of its own on one of them: hopper's
    // replaces it, so the record still has exactly one.
    let forged = "00-11111111111111111111111111111111-2222222222222222-01";
    let steps = json!([
        {"emit": {"topic": closed, "payload": "a", "headers": {"traceparent": forged}}},
        {"emit": {"topic": closed, "payload": "b"}},
    ]);
    produce(
        &producer(),
        &route.input,
        None,
        &json!({"steps": steps, "verdict": "ok"}).to_string(),
        &[("traceparent", PRODUCER)],
    )
    .await;
    let emitted = consume(&closed, 2, PATIENCE).await;
    hopper.stop().await;
    let (a, b) = (the_traceparent(&emitted[0]), the_traceparent(&emitted[1]));
    assert_eq!(a.trace_id.to_string(), TRACE);
    assert_eq!(b.trace_id.to_string(), TRACE);
    assert_eq!(a.span_id, b.span_id, "both are written by the one call");
    assert_ne!(a.span_id.to_string(), "00f067aa0ba902b7");
}
