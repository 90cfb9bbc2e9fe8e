//! Payloads and route configs at the edges of the order-timeout contract,
//! through each build of the handler directly (no broker), against a real
//! order service on loopback: every build must give the Rust handler's
//! verdict (its exact reason, unless the payload is not an order) and emit
//! the same records.

use hopper::config::Route;
use hopper::plugin::{Delivery, Runtime, Verdict};
use hopper_tests::{NOT_AN_ORDER, ORDER_TIMEOUT_BUILDS, RouteTable, plugin, resolve_route};
use order_service::{Order, OrderService, Status};
use std::path::Path;

/// How the route around the handler is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Setup {
    /// The service granted, `closed-topic` granted.
    Plain,
    /// The service's URL with a trailing slash.
    TrailingSlash,
    /// No `order-service` config value.
    NoService,
    /// An `order-service` that is not an http(s) URL.
    NotAUrl,
    /// A granted URL where nothing listens.
    Refused,
    /// The service's URL, but the route grants another port.
    HostNotGranted,
    /// A `closed-topic` the route does not grant.
    TopicNotGranted,
}

const SETUPS: [Setup; 7] = [
    Setup::Plain,
    Setup::TrailingSlash,
    Setup::NoService,
    Setup::NotAUrl,
    Setup::Refused,
    Setup::HostNotGranted,
    Setup::TopicNotGranted,
];

const CLOSED: &str = "orders.closed";

/// (payload, setup).
const CASES: &[(Option<&[u8]>, Setup)] = &[
    (Some(br#"{"order_id":"o-1"}"#), Setup::Plain),
    // Closing is idempotent: the second close is announced too.
    (Some(br#"{"order_id":"o-1"}"#), Setup::Plain),
    // Other fields, whatever their type, are not the handler's business.
    (
        Some(br#" { "status" : 5 , "order_id" : "o-2" } "#),
        Setup::Plain,
    ),
    (Some(br#"{"order_id":"o-c"}"#), Setup::Plain),
    (Some(br#"{"order_id":"o-r"}"#), Setup::Plain),
    (Some(br#"{"order_id":"o-d"}"#), Setup::Plain),
    (Some(br#"{"order_id":"o-404"}"#), Setup::Plain),
    // Percent-encoding: UTF-8 and reserved characters reach the service as
    // the one path segment they are.
    (
        Some(br#"{"order_id":"o-\u00e9\ud83d\ude00"}"#),
        Setup::Plain,
    ),
    (Some(br#"{"order_id":"o/1 ?#%"}"#), Setup::Plain),
    (Some(br#"{"order_id":""}"#), Setup::Plain),
    (
        Some(br#"{"order_id":"o-2","x":{"y":[1,2.5e3,-0,true,false,null,"z"]}}"#),
        Setup::Plain,
    ),
    (Some(br#"{"order_id":"o-1"}"#), Setup::TrailingSlash),
    (Some(br#"{"order_id":"o-1"}"#), Setup::NoService),
    (Some(br#"{"order_id":"o-1"}"#), Setup::NotAUrl),
    (Some(br#"{"order_id":"o-1"}"#), Setup::Refused),
    (Some(br#"{"order_id":"o-1"}"#), Setup::HostNotGranted),
    (Some(br#"{"order_id":"o-1"}"#), Setup::TopicNotGranted),
    // Not an order.
    (Some(br#"{"status":"paid"}"#), Setup::Plain),
    (Some(br#"{"order_id":1}"#), Setup::Plain),
    (Some(br#"{"order_id":null}"#), Setup::Plain),
    (Some(br#"{"order_id":"o-\ud800"}"#), Setup::Plain),
    (Some(br#"{"order_id":"o-1"} trailing"#), Setup::Plain),
    (Some(br#"{"order_id":"o-1",}"#), Setup::Plain),
    (Some(br#"{"order_id":"o-1""#), Setup::Plain),
    (Some(b"[]"), Setup::Plain),
    (Some(b"\"o-1\""), Setup::Plain),
    (Some(b"null"), Setup::Plain),
    (Some(b""), Setup::Plain),
    (Some(b"\xfe\xff{}"), Setup::Plain),
    (None, Setup::Plain),
];

fn service_orders() -> Vec<Order> {
    vec![
        Order::new("o-1", Status::Pending),
        Order::new("o-2", Status::Paid),
        Order::new("o-c", Status::Cancelled),
        Order::new("o-r", Status::Refunded),
        Order::new("o-d", Status::Pending).down(),
        Order::new("o-é😀", Status::Pending),
        Order::new("o/1 ?#%", Status::Pending),
    ]
}

/// A route around `handler` set up as `setup`.
fn route(handler: &Path, setup: Setup, service: &str, nowhere: &str) -> Route {
    let (allowed, url, topic) = match setup {
        Setup::Plain => (service, Some(service.to_string()), CLOSED),
        Setup::TrailingSlash => (service, Some(format!("{service}/")), CLOSED),
        Setup::NoService => (service, None, CLOSED),
        Setup::NotAUrl => (service, Some("orders.internal:80".into()), CLOSED),
        Setup::Refused => (nowhere, Some(nowhere.to_string()), CLOSED),
        Setup::HostNotGranted => (nowhere, Some(service.to_string()), CLOSED),
        Setup::TopicNotGranted => (service, Some(service.to_string()), "elsewhere"),
    };
    let mut route = RouteTable::new(handler)
        .retry(&["1s"])
        .max_attempts(3)
        .timeout("5s")
        .memory_mib(256)
        .allowed_hosts(&[allowed])
        .emit_topics(&[CLOSED]);
    if let Some(url) = url {
        route = route.config("order-service", url);
    }
    resolve_route(route.config("closed-topic", topic))
}

/// What a call came to: the verdict, with the reason for a payload that is
/// not an order cut to its prefix, and the records to produce as
/// (id, topic, key, payload, headers).
type Outcome = (Verdict, Vec<Emitted>);
type Emitted = (
    String,
    String,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(String, Vec<u8>)>,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_cases_get_the_rust_verdict_and_emits_in_every_language() {
    hopper_tests::init_tracing();
    let service = OrderService::start(service_orders()).await.unwrap();
    // A port where nothing listens: bound, then let go.
    let nowhere = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let runtime = Runtime::new(256 << 20)
        .unwrap()
        .with_cache(hopper_tests::cache_dir())
        .unwrap();

    let mut outcomes: Vec<Vec<Outcome>> = Vec::new();
    for stem in ORDER_TIMEOUT_BUILDS {
        let file = plugin(stem);
        // One handler per setup; compiled once (the cache has it after).
        let handlers: Vec<_> = SETUPS
            .iter()
            .map(|&setup| {
                let route = route(&file, setup, &service.url(), &nowhere);
                (setup, runtime.load(&file, &route).unwrap())
            })
            .collect();
        let mut got = Vec::new();
        for (payload, setup) in CASES {
            let handler = &handlers.iter().find(|(s, _)| s == setup).unwrap().1;
            let before = service.served().len();
            let handled = handler
                .run(Delivery {
                    id: "edge-1".into(),
                    topic: "direct.in".into(),
                    partition: 0,
                    offset: 0,
                    key: None,
                    payload: payload.map(<[u8]>::to_vec),
                    headers: Vec::new(),
                    timestamp: None,
                    attempt: 1,
                    route: "direct".into(),
                })
                .await;
            if *setup == Setup::HostNotGranted {
                assert_eq!(
                    service.served().len(),
                    before,
                    "{stem}: a request the route does not grant reached the service"
                );
            }
            let verdict = match handled.verdict {
                Verdict::Fatal { reason } if reason.starts_with(NOT_AN_ORDER) => Verdict::Fatal {
                    reason: NOT_AN_ORDER.into(),
                },
                other => other,
            };
            let emitted = handled
                .emitted
                .into_iter()
                .map(|e| (e.id, e.topic, e.key, e.payload, e.headers))
                .collect();
            got.push((verdict, emitted));
        }
        outcomes.push(got);
    }

    let reference = &outcomes[0];
    check_reference(reference);
    for (stem, got) in ORDER_TIMEOUT_BUILDS.iter().zip(&outcomes).skip(1) {
        for ((case, rust), other) in CASES.iter().zip(reference).zip(got) {
            assert_eq!(other, rust, "{stem} on {case:?}");
        }
    }
}

/// The Rust handler's outcomes that pin the contract, so that four builds
/// wrong the same way do not pass.
fn check_reference(reference: &[Outcome]) {
    let by_case = |payload: &str, setup: Setup| {
        let index = CASES
            .iter()
            .position(|(p, s)| *p == Some(payload.as_bytes()) && *s == setup)
            .unwrap_or_else(|| panic!("no case {payload} {setup:?}"));
        &reference[index]
    };
    let closed = |order: &str| {
        let body = serde_json::json!({"order_id": order, "status": "closed"}).to_string();
        (
            Verdict::Ok,
            vec![(
                "edge-1/emit/0".to_string(),
                CLOSED.to_string(),
                Some(order.as_bytes().to_vec()),
                Some(body.into_bytes()),
                vec![("content-type".to_string(), b"application/json".to_vec())],
            )],
        )
    };
    let retryable = |reason: &str| Verdict::Retryable {
        reason: reason.into(),
        retry_after: None,
    };
    let fatal = |reason: &str| Verdict::Fatal {
        reason: reason.into(),
    };
    assert_eq!(reference[0], closed("o-1"));
    assert_eq!(reference[1], closed("o-1"));
    assert_eq!(
        *by_case(r#"{"order_id":"o-\u00e9\ud83d\ude00"}"#, Setup::Plain),
        closed("o-é😀")
    );
    assert_eq!(
        *by_case(r#"{"order_id":"o/1 ?#%"}"#, Setup::Plain),
        closed("o/1 ?#%")
    );
    assert_eq!(
        *by_case(r#"{"order_id":"o-1"}"#, Setup::TrailingSlash),
        closed("o-1")
    );
    let plain = [
        ("o-c", (Verdict::Ok, vec![])),
        (
            "o-r",
            (fatal("order o-r has unknown status `refunded`"), vec![]),
        ),
        (
            "o-d",
            (retryable("order service unavailable (HTTP 503)"), vec![]),
        ),
        (
            "o-404",
            (fatal("order o-404 is unknown to the order service"), vec![]),
        ),
    ];
    for (order, outcome) in plain {
        let payload = format!(r#"{{"order_id":"{order}"}}"#);
        assert_eq!(*by_case(&payload, Setup::Plain), outcome, "{order}");
    }
    let o1 = r#"{"order_id":"o-1"}"#;
    let setups = [
        (
            Setup::NoService,
            fatal("route config sets no `order-service` URL"),
        ),
        (
            Setup::NotAUrl,
            fatal("`order-service` is not an http(s) URL: `orders.internal:80`"),
        ),
        (Setup::Refused, retryable("order service unreachable")),
        (
            Setup::HostNotGranted,
            retryable("order service unreachable"),
        ),
        (
            Setup::TopicNotGranted,
            fatal("cannot announce order o-1 on elsewhere: topic elsewhere is not granted"),
        ),
    ];
    for (setup, verdict) in setups {
        assert_eq!(*by_case(o1, setup), (verdict, vec![]), "{setup:?}");
    }
    assert_eq!(*by_case("[]", Setup::Plain), (fatal(NOT_AN_ORDER), vec![]));
}
