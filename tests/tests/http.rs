//! Outbound HTTP from handlers: the `acting` fixture against a loopback
//! server this test starts. What only the HTTP path decides (grants,
//! redirects, guarded addresses, limits) is checked on the handler called
//! in-process; what a route does with it (the timeout retried, connections
//! per partition) runs against the broker.

use hopper::events::{self, Event};
use hopper::hop;
use hopper::metrics::series;
use hopper::plugin::Verdict;
use hopper::types::VerdictKind;
use hopper_tests::http_server::TestServer;
use hopper_tests::*;
use serde_json::json;

/// The `acting` fixture, called in-process under `grants` (TOML inside
/// the route table).
struct Acting(InProcess);

impl Acting {
    fn new(grants: impl FnOnce(RouteTable) -> RouteTable) -> Acting {
        Acting(InProcess::new(grants(RouteTable::new(&plugin("acting")))))
    }

    /// Runs `steps` with verdict `fatal`, and returns the report.
    async fn report(&self, steps: serde_json::Value) -> String {
        let script = json!({"steps": steps, "verdict": "fatal"});
        match self
            .0
            .handler
            .call(self.0.delivery("m-1", &script.to_string()))
            .await
        {
            Verdict::Fatal { reason } => reason,
            other => panic!("expected the report in a fatal verdict, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_is_not_granted_is_denied_and_the_handler_sees_the_denial() {
    let granted = TestServer::start();
    let other = TestServer::start();
    let acting = Acting::new(|r| r.allowed_hosts(&[granted.origin()]));
    let mut events = acting.0.telemetry.subscribe();

    let report = acting
        .report(json!([{"get": other.url("/hello")}, {"get": granted.url("/hello")}]))
        .await;
    assert_eq!(
        report,
        format!(
            "GET {} -> error ErrorCode::HttpRequestDenied at handle | GET {} -> 200 hello",
            other.url("/hello"),
            granted.url("/hello")
        )
    );
    assert_eq!(
        other.connections(),
        0,
        "a denied host is never connected to"
    );
    assert_eq!(
        acting.0.count(&series::HttpRequests {
            route: "inproc",
            result: "denied"
        }),
        1
    );
    let denied = wait_for_event(&mut events, "a denied request", |e| match e {
        Event::HttpDenied(events::HttpDenied { url, reason, .. }) => {
            Some((url.clone(), reason.clone()))
        }
        _ => None,
    })
    .await;
    assert_eq!(denied.0, other.url("/hello"));
    assert!(denied.1.contains("is not in allowed_hosts"), "{}", denied.1);

    // A route that grants nothing denies everything.
    let none = Acting::new(|r| r);
    let report = none.report(json!([{"get": granted.url("/hello")}])).await;
    assert!(
        report.ends_with("error ErrorCode::HttpRequestDenied at handle"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_a_host_that_is_not_granted_is_refused() {
    let granted = TestServer::start();
    let other = TestServer::start();
    let acting = Acting::new(|r| r.allowed_hosts(&[granted.origin()]));

    let inside = granted.url(&format!("/redirect?to={}", granted.url("/hello")));
    let outside = granted.url(&format!("/redirect?to={}", other.url("/hello")));
    let report = acting
        .report(json!([{"get": inside, "follow": 2}, {"get": outside, "follow": 2}]))
        .await;
    assert_eq!(
        report,
        format!(
            "GET {inside} -> 302 | GET {} -> 200 hello | GET {outside} -> 302 | GET {} -> error ErrorCode::HttpRequestDenied at handle",
            granted.url("/hello"),
            other.url("/hello"),
        )
    );
    assert_eq!(other.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_address_is_refused_even_under_a_wildcard() {
    let acting = Acting::new(|r| r.allowed_hosts(&["*://*:*"]));
    let report = acting
        .report(json!([
            {"get": "http://169.254.169.254/latest/meta-data/"},
            {"get": "http://[fd00:ec2::254]/latest/meta-data/"},
            {"get": "http://[::ffff:169.254.169.254]/"},
        ]))
        .await;
    assert_eq!(
        report
            .matches("error ErrorCode::HttpRequestDenied at handle")
            .count(),
        3,
        "{report}"
    );

    // Tests send traffic to loopback only, so an entry naming the address
    // (which lets it through) is checked in the allow-list's unit tests.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mb_response_is_cut_at_the_cap_with_the_error_the_handler_sees() {
    let server = TestServer::start();
    let acting = Acting::new(|r| r.allowed_hosts(&[server.origin()]));
    const HUNDRED_MB: u64 = 100_000_000;

    // Announced by its content-length: refused before the body is read.
    let report = acting
        .report(json!([{"get": server.url(&format!("/big/{HUNDRED_MB}"))}]))
        .await;
    assert!(
        report.ends_with("error ErrorCode::HttpResponseBodySize(Some(1048576))"),
        "{report}"
    );

    // Streamed without a length: the stream fails at the cap.
    let report = acting
        .report(json!([{"get": server.url(&format!("/chunked/{HUNDRED_MB}"))}]))
        .await;
    let (_, tail) = report.split_once("(read ").expect(&report);
    let read: u64 = tail.split(' ').next().unwrap().parse().unwrap();
    assert!(read <= 1 << 20, "{report}");
    assert!(
        report.ends_with("then HTTP response body size exceeds limit: 1048576 bytes)"),
        "{report}"
    );

    // The limit is the route's to choose.
    let small = Acting::new(|r| {
        r.allowed_hosts(&[server.origin()])
            .http("max_response_bytes", 1000)
    });
    let report = small
        .report(json!([{"get": server.url("/big/1001")}, {"get": server.url("/big/1000")}]))
        .await;
    assert!(
        report.contains("error ErrorCode::HttpResponseBodySize(Some(1000)) | GET"),
        "{report}"
    );
    assert!(
        report.ends_with(&"\0".repeat(200)),
        "the 1000 bytes are read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_per_call_have_their_documented_errors() {
    let server = TestServer::start();
    let acting = Acting::new(|r| {
        r.allowed_hosts(&[server.origin()])
            .timeout("5s")
            .http("max_requests", 2)
            .http("first_byte_timeout", quoted("200ms"))
    });
    let report = acting
        .report(json!([
            {"get": server.url("/slow/3000")},
            {"get": server.url("/hello")},
            {"get": server.url("/hello")},
        ]))
        .await;
    assert_eq!(
        report,
        format!(
            "GET {} -> error ErrorCode::HttpResponseTimeout | GET {} -> 200 hello | GET {} -> error ErrorCode::ConnectionLimitReached at handle",
            server.url("/slow/3000"),
            server.url("/hello"),
            server.url("/hello")
        )
    );
    // The count starts again with the next call.
    let report = acting.report(json!([{"get": server.url("/hello")}])).await;
    assert!(report.ends_with("200 hello"), "{report}");
}

/// A route around the `acting` fixture on the test broker, calling `server`.
fn route_calling(server: &TestServer, more: impl FnOnce(RouteTable) -> RouteTable) -> TestRoute {
    more(RouteTable::new(&plugin("acting")).allowed_hosts(&[server.origin()])).test_route()
}

fn script(steps: serde_json::Value, verdict: &str) -> String {
    json!({"steps": steps, "verdict": verdict}).to_string()
}

/// A request without a body is sent by the guest's own wait; one with a
/// body keeps a task of its own, because a guest may write the body after
/// `handle`. A 4 MiB body written that way, four times the body's buffer,
/// arrives whole; sent by the guest's wait alone, it would stall with the
/// guest blocked on its write until the call timed out. A GET beside it, in
/// the same call, is answered too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_written_after_handle_larger_than_its_buffer_arrives_whole() {
    init_tracing();
    let server = TestServer::start();
    let acting = Acting::new(|r| r.timeout("20s").allowed_hosts(&[server.origin()]));
    let post = server.url("/echo-length");
    let report = acting
        .report(json!([
            {"post": post, "bytes": 4 << 20},
            {"get": server.url("/hello")},
        ]))
        .await;
    assert_eq!(
        report,
        format!(
            "POST {post} -> 200 received 4194304 bytes | GET {} -> 200 hello",
            server.url("/hello")
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_host_is_called_and_the_handler_sees_its_status_and_body() {
    init_tracing();
    let server = TestServer::start();
    let route = route_calling(&server, |r| r);
    let hopper = route.start().await;
    let mut events = hopper.events();
    let payload = script(json!([{"get": server.url("/status/201")}]), "fatal");
    produce(
        &producer(),
        &route.input,
        None,
        &payload,
        &[("hopper-id", "g1")],
    )
    .await;

    let dlq = consume(&route.dlq, 1, PATIENCE).await;
    let (h, _) = header_map(&dlq[0]);
    assert_eq!(
        h["hopper-last-error"],
        format!("GET {} -> 201 status 201", server.url("/status/201"))
    );
    let (status, id, url) = wait_for_event(&mut events, "an HTTP request", |e| match e {
        Event::HttpRequest(events::HttpRequest {
            status, id, url, ..
        }) => Some((*status, id.clone(), url.clone())),
        _ => None,
    })
    .await;
    assert_eq!((status, id.as_str()), (Some(201), "g1"));
    assert_eq!(url, server.url("/status/201"));
    let answered = series::HttpRequests {
        route: &route.name,
        result: "2xx",
    };
    assert_eq!(count(hopper.telemetry(), &answered), 1);
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_ends_the_call_with_handler_timeout_and_the_message_is_retried() {
    init_tracing();
    let server = TestServer::start();
    let route = route_calling(&server, |r| {
        r.timeout("300ms").retry(&["1s"]).max_attempts(2)
    });
    let hopper = route.start().await;
    let mut events = hopper.events();
    let payload = script(json!([{"get": server.url("/slow/5000")}]), "ok");
    produce(
        &producer(),
        &route.input,
        None,
        &payload,
        &[("hopper-id", "s1")],
    )
    .await;

    let mut verdicts = Vec::new();
    let mut retried = None;
    while verdicts.len() < 2 {
        let event = wait_for_event(&mut events, "the call or retry of `s1`", |e| match e {
            Event::Handled(events::Handled { id, .. })
            | Event::Hop(hop::Outcome::Retry(hop::Retry { id, .. }))
                if id == "s1" =>
            {
                Some(e.clone())
            }
            _ => None,
        })
        .await;
        match event {
            Event::Handled(events::Handled {
                attempt, verdict, ..
            }) => verdicts.push((attempt, verdict)),
            Event::Hop(hop::Outcome::Retry(hop::Retry { reason, .. })) => retried = Some(reason),
            _ => unreachable!(),
        }
    }
    assert_eq!(
        verdicts,
        vec![(1, VerdictKind::Timeout), (2, VerdictKind::Timeout)]
    );
    assert_eq!(retried, Some(hopper::headers::Reason::HandlerTimeout));
    let dlq = consume(&route.dlq, 1, PATIENCE).await;
    let (h, _) = header_map(&dlq[0]);
    assert_eq!(h["hopper-reason"], "RETRIES_EXHAUSTED");
    assert!(
        h["hopper-last-error"].starts_with("HANDLER_TIMEOUT"),
        "{}",
        h["hopper-last-error"]
    );
    hopper.stop().await;
}

/// The server counts its TCP connections: a thousand messages, each making
/// one request, share the pooled connections of the calls that can run at
/// once (`max_in_flight` per partition, `max_instances` in all), not one
/// per request. A call that finds no idle connection opens one, and the
/// pool keeps that connection even when another call's connection came
/// back first and served the request: so each call that can run at once
/// accounts for two connections at most (a run here makes 33 or 34 for 32
/// such calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_requests_reuse_the_connections_of_the_calls_in_flight() {
    init_tracing();
    const MESSAGES: usize = 1000;
    let server = TestServer::start();
    let route = route_calling(&server, |r| r);
    let config = route.config();
    let partitions = config.kafka.partitions as usize;
    let calls_at_once = (partitions * config.routes[0].concurrency.max_in_flight)
        .min(config.routes[0].max_instances) as u64;
    let hopper = route.start().await;
    let mut events = hopper.events();
    let payload = script(json!([{"get": server.url("/hello")}]), "ok");
    let producer = producer();
    let pending: Vec<_> = (0..MESSAGES)
        .map(|i| {
            let key = i.to_string();
            let record = rdkafka::producer::FutureRecord::to(&route.input)
                .key(&key)
                .payload(&payload);
            producer.send_result(record).map_err(|(e, _)| e).unwrap()
        })
        .collect();
    for delivery in pending {
        delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
    }

    let mut ok = 0;
    while ok < MESSAGES {
        let verdict = wait_for_event(&mut events, "the next call", |e| match e {
            Event::Handled(events::Handled { verdict, .. }) => Some(*verdict),
            _ => None,
        })
        .await;
        assert_eq!(verdict, "ok");
        ok += 1;
    }
    assert_eq!(server.requests(), MESSAGES as u64);
    assert!(
        server.connections() <= 2 * calls_at_once,
        "{} connections for {MESSAGES} requests, with at most {calls_at_once} calls at once",
        server.connections()
    );
    hopper.stop().await;
}
