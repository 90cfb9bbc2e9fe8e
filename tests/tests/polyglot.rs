//! One scenario, four handlers: the order-timeout handler in Rust, Python,
//! JavaScript and C, on the real broker and against a real order service
//! (order-service, over loopback HTTP), must route every message the same
//! way, send the service the same requests, write the same dead-letter
//! records and announce the same closed orders.

use hopper::events::{self, Event};
use hopper::hop;
use hopper_tests::*;
use order_service::{Order, OrderService, Served, Status};
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use std::collections::BTreeMap;
use std::time::Duration;

/// (key and hopper-id, payload).
const ORDERS: [(&str, &str); 7] = [
    ("o-1", r#"{"order_id":"o-1"}"#),
    ("o-2", r#"{"order_id":"o-2","note":[1,{"x":null}]}"#),
    ("o-3", r#"{"order_id":"o-3"}"#),
    ("o-4", r#"{"order_id":"o-4"}"#),
    ("o-5", r#"{"order_id":"o-5"}"#),
    ("o-6", "this is not json"),
    ("o-7", r#"{"order_id":"o-7"}"#),
];

/// What the service knows: o-1 is closed at once, o-2 is paid, o-3 closes
/// after two 503s, o-4 is refunded (unknown to v1), o-5's requests always
/// get 503; o-6 is not an order and o-7 is unknown to it.
fn service_orders() -> Vec<Order> {
    vec![
        Order::new("o-1", Status::Pending),
        Order::new("o-2", Status::Paid),
        Order::new("o-3", Status::Pending).flaky(2),
        Order::new("o-4", Status::Refunded),
        Order::new("o-5", Status::Pending).down(),
    ]
}

/// What one handler did with the scenario.
#[derive(Debug, PartialEq)]
struct Run {
    /// Per message id: every (attempt, verdict), in order.
    calls: BTreeMap<String, Vec<(u32, &'static str)>>,
    /// Per DLQ record key: the headers and payload that must match.
    dead: BTreeMap<String, DeadLetter>,
    /// Per emitted record key: what a consumer of the closed topic reads.
    announced: BTreeMap<String, Announced>,
    /// Per order path: the status of every request the service answered.
    requests: BTreeMap<String, Vec<u16>>,
    /// Where the service's orders stand at the end.
    statuses: BTreeMap<String, Status>,
}

#[derive(Debug, PartialEq)]
struct DeadLetter {
    payload: String,
    reason: String,
    attempt: String,
    last_error: String,
    trail: String,
}

#[derive(Debug, PartialEq)]
struct Announced {
    payload: String,
    content_type: String,
    id: String,
    /// Every header name, hopper's own included.
    header_names: Vec<String>,
}

/// Runs the scenario through one handler and returns what came of it.
async fn run_scenario(stem: &'static str) -> Run {
    let service = OrderService::start(service_orders()).await.unwrap();
    let url = service.url();
    let closed = rand_name("closed");
    let handler = plugin(stem);
    let route = RouteTable::new(&handler)
        .retry(&["1s"])
        .max_attempts(3)
        .timeout("5s")
        .memory_mib(256)
        .allowed_hosts(&[&url])
        .emit_topics(&[&closed])
        .config("order-service", &url)
        .config("closed-topic", &closed)
        .test_route();
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
    let what = format!("{stem}: every order to end ok or in the DLQ");
    wait_for_event_within(&mut events, COMPILE_PATIENCE, &what, |event| {
        match event {
            Event::Handled(events::Handled {
                id,
                attempt,
                verdict,
                ..
            }) => {
                if *verdict == "ok" {
                    settled += 1;
                }
                calls
                    .entry(id.clone())
                    .or_default()
                    .push((*attempt, verdict.as_str()));
            }
            Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter { .. })) => settled += 1,
            _ => {}
        }
        (settled == ORDERS.len()).then_some(())
    })
    .await;

    let mut dead = BTreeMap::new();
    for record in consume(&route.dlq, 4, COMPILE_PATIENCE).await {
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

    let mut announced = BTreeMap::new();
    for record in consume(&closed, 2, COMPILE_PATIENCE).await {
        let (h, _) = header_map(&record);
        let mut header_names: Vec<String> = h.keys().cloned().collect();
        header_names.sort();
        announced.insert(
            String::from_utf8(record.key().unwrap().to_vec()).unwrap(),
            Announced {
                payload: String::from_utf8(record.payload().unwrap().to_vec()).unwrap(),
                content_type: h.get("content-type").cloned().unwrap_or_default(),
                id: h.get("hopper-id").cloned().unwrap_or_default(),
                header_names,
            },
        );
    }
    assert_eq!(
        records_on(&closed).await,
        2,
        "{stem}: the closed topic holds more than the two closed orders"
    );
    hopper.stop().await;

    let mut requests: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for Served {
        method,
        path,
        status,
    } in service.served()
    {
        assert_eq!(method, "POST", "{stem}: {path}");
        requests.entry(path).or_default().push(status);
    }
    let statuses = service_orders()
        .into_iter()
        .map(|o| (o.id.clone(), service.status(&o.id).unwrap()))
        .collect();
    Run {
        calls,
        dead,
        announced,
        requests,
        statuses,
    }
}

/// How many records `topic` holds, over all its partitions.
async fn records_on(topic: &str) -> i64 {
    let consumer = reader(topic);
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut total = 0;
    for partition in metadata.topics()[0].partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition.id(), Duration::from_secs(10))
            .unwrap();
        total += high - low;
    }
    total
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
        ("o-7", vec![(1, "fatal")]),
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
            "order service unavailable (HTTP 503)",
            "retry.1s,retry.1s,dlq",
        ),
        dead_letter("o-6", "FATAL", "1", NOT_AN_ORDER, "dlq"),
        dead_letter(
            "o-7",
            "FATAL",
            "1",
            "order o-7 is unknown to the order service",
            "dlq",
        ),
    ]
    .into_iter()
    .collect();
    let announced = ["o-1", "o-3"]
        .into_iter()
        .map(|order| {
            (
                order.to_string(),
                Announced {
                    payload: format!(r#"{{"order_id":"{order}","status":"closed"}}"#),
                    content_type: "application/json".into(),
                    id: format!("{order}/emit/0"),
                    header_names: vec![
                        "content-type".into(),
                        "hopper-id".into(),
                        "hopper-route".into(),
                        "traceparent".into(),
                    ],
                },
            )
        })
        .collect();
    let requests = [
        ("o-1", vec![200]),
        ("o-2", vec![409]),
        ("o-3", vec![503, 503, 200]),
        ("o-4", vec![409]),
        ("o-5", vec![503, 503, 503]),
        ("o-7", vec![404]),
    ]
    .into_iter()
    .map(|(order, statuses)| (format!("/orders/{order}/close"), statuses))
    .collect();
    let statuses = [
        ("o-1", Status::Closed),
        ("o-2", Status::Paid),
        ("o-3", Status::Closed),
        ("o-4", Status::Refunded),
        ("o-5", Status::Pending),
    ]
    .into_iter()
    .map(|(id, s)| (id.to_string(), s))
    .collect();
    Run {
        calls,
        dead,
        announced,
        requests,
        statuses,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_scenario_against_the_order_service_goes_the_same_in_rust_python_javascript_and_c() {
    init_tracing();
    let runs = join_all(ORDER_TIMEOUT_BUILDS.map(run_scenario)).await;
    let expected = expected();
    for (stem, run) in ORDER_TIMEOUT_BUILDS.iter().zip(&runs) {
        assert_eq!(run, &expected, "{stem} differs from the reference");
    }
}

/// Runs the scenarios side by side: each one spends most of its time
/// waiting for retry tiers and compiling its component.
async fn join_all(runs: [impl Future<Output = Run> + Send + 'static; 4]) -> Vec<Run> {
    let handles: Vec<_> = runs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.expect("scenario task"));
    }
    out
}
