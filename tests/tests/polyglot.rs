//! One scenario, four handlers: the order-timeout handler in Rust, Python,
//! JavaScript and C, on the real broker, must route every message the same
//! way and write the same dead-letter records.

use hopper::events::Event;
use hopper_tests::*;
use rdkafka::Message;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long any one route may take to settle. Loading the Python and
/// JavaScript components compiles 12-18 MB of Wasm in the dev profile.
const PATIENCE: Duration = Duration::from_secs(240);

/// The four builds of plugins/order-timeout, by file stem in plugins/dist.
const HANDLERS: [&str; 4] = [
    "order_timeout",
    "order_timeout_py",
    "order_timeout_js",
    "order_timeout_c",
];

/// (key and hopper-id, payload).
const ORDERS: [(&str, &str); 6] = [
    ("o-1", r#"{"order_id":"o-1","status":"pending"}"#),
    (
        "o-2",
        r#"{"order_id":"o-2","status":"paid","note":[1,{"x":null}]}"#,
    ),
    (
        "o-3",
        r#"{"order_id":"o-3","status":"unpaid","downstream":"flaky"}"#,
    ),
    ("o-4", r#"{"order_id":"o-4","status":"refunded"}"#),
    (
        "o-5",
        r#"{"order_id":"o-5","status":"pending","downstream":"down"}"#,
    ),
    ("o-6", "this is not json"),
];

/// Prefix of the reason for a payload that is not an order; the rest is
/// the JSON parser's own words, which differ by language.
const NOT_AN_ORDER: &str = "payload is not an order: ";

/// What one handler did with the scenario.
#[derive(Debug, PartialEq)]
struct Run {
    /// Per message id: every (attempt, verdict), in order.
    calls: BTreeMap<String, Vec<(u32, &'static str)>>,
    /// Per DLQ record key: the headers and payload that must match.
    dead: BTreeMap<String, DeadLetter>,
}

#[derive(Debug, PartialEq)]
struct DeadLetter {
    payload: String,
    reason: String,
    attempt: String,
    last_error: String,
    trail: String,
}

/// Runs the scenario through one handler and returns what came of it.
async fn run_scenario(stem: &'static str) -> Run {
    let handler = plugin(stem);
    let route = TestRoute::new(
        &handler,
        "retry = [\"1s\"]\nmax_attempts = 3\ntimeout = \"5s\"\nmemory_mib = 256\n\n[route.config]\norder-service = \"orders-api\"",
    );
    let hopper = route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    for (id, payload) in ORDERS {
        produce(
            &producer,
            &route.input,
            Some(id),
            payload,
            &[("hopper-id", id)],
        )
        .await;
    }

    // Settled: every message reached ok or the DLQ.
    let mut calls: BTreeMap<String, Vec<(u32, &'static str)>> = BTreeMap::new();
    let mut settled = 0;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while settled < ORDERS.len() {
        let event = match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(event)) => event,
            Ok(Err(e)) => panic!("{stem}: event stream: {e}"),
            Err(_) => panic!("{stem}: timed out; calls so far {calls:?}"),
        };
        match event {
            Event::Handled {
                id,
                attempt,
                verdict,
                ..
            } => {
                if verdict == "ok" {
                    settled += 1;
                }
                calls.entry(id).or_default().push((attempt, verdict));
            }
            Event::DeadLettered { .. } => settled += 1,
            _ => {}
        }
    }

    let mut dead = BTreeMap::new();
    for record in consume(&route.dlq, 3, PATIENCE).await {
        let (h, counts) = header_map(&record);
        for (key, count) in &counts {
            assert_eq!(*count, 1, "{stem}: header {key} appears {count} times");
        }
        assert_eq!(h["hopper-handler"], stem);
        assert_eq!(
            h["hopper-handler-version"],
            sha256_hex(&std::fs::read(&handler).unwrap())
        );
        let key = String::from_utf8(record.key().unwrap().to_vec()).unwrap();
        let mut last_error = h["hopper-last-error"].clone();
        if let Some(rest) = last_error.strip_prefix(NOT_AN_ORDER) {
            assert!(!rest.is_empty(), "{stem}: {last_error:?} gives no detail");
            last_error.truncate(NOT_AN_ORDER.len());
        }
        dead.insert(
            key,
            DeadLetter {
                payload: String::from_utf8(record.payload().unwrap().to_vec()).unwrap(),
                reason: h["hopper-reason"].clone(),
                attempt: h["hopper-attempt"].clone(),
                last_error,
                trail: h["hopper-trail"].clone(),
            },
        );
    }
    hopper.stop().await;
    Run { calls, dead }
}

/// What the Rust handler, the reference, does with the scenario.
fn expected() -> Run {
    let calls = [
        ("o-1", vec![(1, "ok")]),
        ("o-2", vec![(1, "ok")]),
        ("o-3", vec![(1, "retryable"), (2, "retryable"), (3, "ok")]),
        ("o-4", vec![(1, "fatal")]),
        (
            "o-5",
            vec![(1, "retryable"), (2, "retryable"), (3, "retryable")],
        ),
        ("o-6", vec![(1, "fatal")]),
    ]
    .into_iter()
    .map(|(id, c)| (id.to_string(), c))
    .collect();
    let dead_letter = |key: &str, reason: &str, attempt: &str, error: &str, trail: &str| {
        let payload = ORDERS.iter().find(|(k, _)| *k == key).unwrap().1;
        (
            key.to_string(),
            DeadLetter {
                payload: payload.to_string(),
                reason: reason.into(),
                attempt: attempt.into(),
                last_error: error.into(),
                trail: trail.into(),
            },
        )
    };
    let dead = [
        dead_letter(
            "o-4",
            "FATAL",
            "1",
            "order o-4 has unknown status `refunded`",
            "dlq",
        ),
        dead_letter(
            "o-5",
            "RETRIES_EXHAUSTED",
            "3",
            "orders-api service unavailable",
            "retry.1s,retry.1s,dlq",
        ),
        dead_letter("o-6", "FATAL", "1", NOT_AN_ORDER, "dlq"),
    ]
    .into_iter()
    .collect();
    Run { calls, dead }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_scenario_routes_the_same_in_rust_python_javascript_and_c() {
    init_tracing();
    let runs = futures_join_all(HANDLERS.map(run_scenario)).await;
    let expected = expected();
    for (stem, run) in HANDLERS.iter().zip(&runs) {
        assert_eq!(run, &expected, "{stem} differs from the reference");
    }
}

/// Runs the scenarios side by side: each one spends most of its time
/// waiting for retry tiers and compiling its component.
async fn futures_join_all(runs: [impl Future<Output = Run> + Send + 'static; 4]) -> Vec<Run> {
    let handles: Vec<_> = runs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.expect("scenario task"));
    }
    out
}

/// Payloads at the edges of "an order", through each handler directly
/// (no broker): every build must give the Rust handler's verdict, and its
/// exact reason unless the payload is not an order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_case_payloads_get_the_rust_verdict_in_every_language() {
    use hopper::config::{Route, TrapPolicy};
    use hopper::plugin::{Delivery, Runtime, Verdict};

    // (payload, attempt, config order-service).
    let cases: &[(Option<&str>, u32, Option<&str>)] = &[
        (Some(r#"{"order_id":"o-1","status":"closed"}"#), 1, None),
        (Some(r#"{"order_id":"o-1","status":"cancelled"}"#), 1, None),
        (
            Some(r#" { "status" : "unpaid" , "order_id" : "o-1" } "#),
            1,
            None,
        ),
        (Some(r#"{"order_id":"o-1","status":"p\u0061id"}"#), 1, None),
        (
            Some(r#"{"order_id":"o-\u00e9\ud83d\ude00","status":"Paid"}"#),
            1,
            None,
        ),
        (
            Some(r#"{"order_id":"o-1","status":"pending","downstream":null}"#),
            1,
            None,
        ),
        (
            Some(r#"{"order_id":"o-1","status":"pending","downstream":"flaky"}"#),
            2,
            None,
        ),
        (
            Some(r#"{"order_id":"o-1","status":"pending","downstream":"flaky"}"#),
            3,
            None,
        ),
        (
            Some(r#"{"order_id":"o-1","status":"pending","downstream":"down"}"#),
            9,
            None,
        ),
        (
            Some(r#"{"order_id":"o-1","status":"unpaid","downstream":"down"}"#),
            1,
            Some("billing"),
        ),
        (
            Some(r#"{"order_id":"o-1","status":"pending","downstream":"elsewhere"}"#),
            1,
            None,
        ),
        (
            Some(r#"{"order_id":"o-1","status":"refunded","downstream":"down"}"#),
            1,
            None,
        ),
        (Some(r#"{"order_id":"o-1","status":""}"#), 1, None),
        (
            Some(
                r#"{"order_id":"o-1","status":"paid","x":{"y":[1,2.5e3,-0,true,false,null,"z"]}}"#,
            ),
            1,
            None,
        ),
        (Some(r#"{"order_id":"o-1"}"#), 1, None),
        (Some(r#"{"status":"paid"}"#), 1, None),
        (Some(r#"{"order_id":1,"status":"paid"}"#), 1, None),
        (
            Some(r#"{"order_id":"o-1","status":"paid","downstream":5}"#),
            1,
            None,
        ),
        (
            Some(r#"{"order_id":"o-1","status":"paid"} trailing"#),
            1,
            None,
        ),
        (Some(r#"{"order_id":"o-1","status":"paid",}"#), 1, None),
        (Some(r#"{"order_id":"o-1","status":"paid""#), 1, None),
        (Some("[]"), 1, None),
        (Some("\"paid\""), 1, None),
        (Some("null"), 1, None),
        (Some(""), 1, None),
        (None, 1, None),
    ];

    let runtime = Runtime::new(256 << 20)
        .unwrap()
        .with_cache(hopper_tests::cache_dir())
        .unwrap();
    let route = |service: Option<&str>| Route {
        name: "edge".into(),
        topics: vec!["edge.in".into()],
        handler: "unused".into(),
        retry_ladder: vec![Duration::from_secs(1)],
        max_attempts: 3,
        dlq: "edge.dlq".into(),
        group: "edge".into(),
        retry_topic_prefix: "edge.retry".into(),
        on_trap: TrapPolicy::DeadLetter,
        timeout: Duration::from_secs(5),
        memory_bytes: 256 << 20,
        instance: hopper::config::InstancePolicy::Warm { max_calls: 1000 },
        config: service
            .map(|s| BTreeMap::from([("order-service".to_string(), s.to_string())]))
            .unwrap_or_default(),
        grants: Default::default(),
    };
    let mut verdicts: Vec<Vec<Verdict>> = Vec::new();
    for stem in HANDLERS {
        // Compiled once per config: Python and JavaScript take seconds.
        let plain = runtime.load(&plugin(stem), &route(None)).unwrap();
        let billing = runtime
            .load(&plugin(stem), &route(Some("billing")))
            .unwrap();
        let mut got = Vec::new();
        for (payload, attempt, service) in cases {
            let handler = if service.is_some() { &billing } else { &plain };
            let verdict = handler
                .call(Delivery {
                    id: "edge-1".into(),
                    topic: "edge.in".into(),
                    partition: 0,
                    offset: 0,
                    key: None,
                    payload: payload.map(|p| p.as_bytes().to_vec()),
                    headers: Vec::new(),
                    timestamp: None,
                    attempt: *attempt,
                    route: "edge".into(),
                })
                .await;
            got.push(match verdict {
                Verdict::Fatal { reason } if reason.starts_with(NOT_AN_ORDER) => Verdict::Fatal {
                    reason: NOT_AN_ORDER.into(),
                },
                other => other,
            });
        }
        verdicts.push(got);
    }
    for (stem, got) in HANDLERS.iter().zip(&verdicts).skip(1) {
        for ((case, rust), other) in cases.iter().zip(&verdicts[0]).zip(got) {
            assert_eq!(other, rust, "{stem} on {case:?}");
        }
    }
}
