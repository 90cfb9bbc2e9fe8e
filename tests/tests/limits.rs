//! Each service's limits, held by hopper (`[route.http.hosts."ENTRY"]`):
//! the `acting` fixture, called in-process, against a loopback server that
//! records how many requests it answers at once and when each arrived.
//! Requests go through `fetch` and `wasi:http` alike; what the server saw
//! is the measure, never the client's own clock.

use hopper::metrics::series;
use hopper::plugin::{Handler, Verdict};
use hopper_tests::http_server::TestServer;
use hopper_tests::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The `acting` fixture's route, calling `server`, with `limit` (an inline
/// TOML table) on the server's entry.
fn limited(server: &TestServer, limit: &str, timeout: &str) -> InProcess {
    InProcess::new(
        RouteTable::new(&plugin("acting"))
            .allowed_hosts(&[server.origin()])
            .timeout(timeout)
            .http(
                "hosts",
                format!("{{ {} = {limit} }}", quoted(server.origin())),
            ),
    )
}

/// Runs `steps` in a call of `handler` with verdict `fatal`, and returns
/// the report.
async fn report(handler: &Handler, route: &InProcess, steps: Value) -> String {
    let script = json!({"steps": steps, "verdict": "fatal"});
    match handler
        .call(route.delivery("m-1", &script.to_string()))
        .await
    {
        Verdict::Fatal { reason } => reason,
        other => panic!("expected the report in a fatal verdict, got {other:?}"),
    }
}

fn limited_count(route: &InProcess) -> u64 {
    route.count(&series::HttpRequests {
        route: "inproc",
        result: "limited",
    })
}

fn waits(route: &InProcess) -> u64 {
    route.telemetry.metrics().http_wait("inproc").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_max_concurrent_requests_at_once() {
    let server = TestServer::start();
    let route = limited(&server, "{ max_concurrent = 2 }", "10s");
    // Eight calls at once, half through each API, each request held 100
    // ms by the server.
    let calls = (0..8).map(|n| {
        let step = if n % 2 == 0 { "send" } else { "fetch" };
        let steps = json!([{ step: {"url": server.url("/slow/100")} }]);
        let (handler, route) = (route.handler.clone(), &route);
        async move { report(&handler, route, steps).await }
    });
    let reports = futures::future::join_all(calls).await;
    for report in &reports {
        assert!(report.ends_with("-> 200 slow"), "{report}");
    }
    assert_eq!(server.requests(), 8);
    assert_eq!(
        server.max_in_flight(),
        2,
        "the limit was reached and never passed"
    );
    assert_eq!(waits(&route), 8, "every request's wait is timed");
    assert_eq!(limited_count(&route), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_that_comes_while_waiting_gives_the_documented_error() {
    for (step, expected) in [
        (
            "send",
            "error ErrorCode::ConnectionLimitReached".to_string(),
        ),
        ("fetch", "error FetchError::Timeout(\"waited ".to_string()),
    ] {
        let server = TestServer::start();
        let route = limited(&server, "{ max_concurrent = 1 }", "2s");
        // The waiting call: one request 300 ms in, then one 800 ms later,
        // when the other call holds the only slot; its deadline is 2 s
        // after it started.
        let waiting = {
            let steps = json!([
                {"sleep_ms": 300},
                { step: {"url": server.url("/hello")} },
                {"sleep_ms": 800},
                { step: {"url": server.url("/hello")} },
            ]);
            let (handler, route) = (route.handler.clone(), &route);
            async move { report(&handler, route, steps).await }
        };
        // The holding call starts once the waiting call's first request
        // has arrived (at least 300 ms after the waiting call started) and
        // holds the slot for 1.85 s: past the waiting call's deadline, and
        // within its own.
        let holding = async {
            let started = Instant::now();
            while server.requests() == 0 {
                assert!(started.elapsed() < Duration::from_secs(10));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let steps = json!([{ step: {"url": server.url("/slow/1850")} }]);
            report(&route.handler, &route, steps).await
        };
        let (waited, held) = tokio::join!(waiting, holding);
        let last = waited.rsplit(" | ").next().unwrap();
        assert!(last.contains(&expected), "{step}: {waited}");
        if step == "fetch" {
            assert!(
                last.contains(&format!(
                    "for http.hosts.\\\"{}\\\" (max_concurrent = 1), and the call's timeout came first",
                    server.origin()
                )),
                "the text names the entry and the limit: {last}"
            );
        }
        assert!(held.ends_with("-> 200 slow"), "{held}");
        assert_eq!(
            server.requests(),
            2,
            "{step}: the waiting request was never sent"
        );
        assert_eq!(limited_count(&route), 1, "{step}");
        assert_eq!(waits(&route), 3, "{step}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_is_held_within_ten_percent_over_ten_seconds() {
    const RATE: f64 = 40.0;
    const BURST: usize = 8;
    let server = TestServer::start_with_threads(1);
    let route = limited(
        &server,
        &format!("{{ rate = {RATE}, burst = {BURST} }}"),
        "5s",
    );
    // Six callers in a loop offer as much as they can, far above the rate.
    let started = Instant::now();
    let run = Duration::from_secs(10);
    let callers = (0..6).map(|n| {
        let step = if n % 2 == 0 { "send" } else { "fetch" };
        let steps = json!([{ step: {"url": server.url("/hello")} }]);
        let (handler, route) = (route.handler.clone(), &route);
        async move {
            let mut sent = 0;
            while started.elapsed() < run {
                let report = report(&handler, route, steps.clone()).await;
                assert!(report.ends_with("-> 200 hello"), "{report}");
                sent += 1;
            }
            sent
        }
    });
    let sent: usize = futures::future::join_all(callers).await.into_iter().sum();
    let arrivals = server.arrivals();
    assert_eq!(arrivals.len(), sent);
    assert_eq!(limited_count(&route), 0, "every turn came within its call");

    // After the first burst, one request each 1/RATE s: measured from the
    // end of the burst to the last arrival.
    let first = arrivals[BURST - 1];
    let last = *arrivals.last().unwrap();
    let span = last.duration_since(first).as_secs_f64();
    assert!(span > 9.0, "the callers ran 10 s: {span}");
    let measured = (arrivals.len() - BURST) as f64 / span;
    assert!(
        (measured - RATE).abs() <= RATE * 0.1,
        "{measured:.2}/s against {RATE}/s over {span:.2}s"
    );
    // And never above it in any window: at most the burst and the window's
    // share, give or take one request whose arrival the network moved.
    for (i, from) in arrivals.iter().enumerate() {
        for (j, to) in arrivals.iter().enumerate().skip(i + 1) {
            let window = to.duration_since(*from).as_secs_f64();
            let allowed = BURST as f64 + RATE * window + 1.0;
            assert!(
                (j - i + 1) as f64 <= allowed,
                "{} requests within {window:.3}s, at most {allowed:.1} allowed",
                j - i + 1
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_handler_waits_in_the_same_line_as_the_version_before() {
    let server = TestServer::start();
    let route = limited(&server, "{ max_concurrent = 1 }", "10s");
    // A reload loads the new version through the same runtime: its calls
    // share the route's grants, limiters included.
    let reloaded = route.reload();
    let old = async {
        let steps = json!([{"fetch": {"url": server.url("/slow/300")}}]);
        report(&route.handler, &route, steps).await
    };
    let new = async {
        let started = Instant::now();
        while server.requests() == 0 {
            assert!(started.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let steps = json!([{"send": {"url": server.url("/slow/100")}}]);
        report(&reloaded, &route, steps).await
    };
    let (old, new) = tokio::join!(old, new);
    assert!(
        old.ends_with("-> 200 slow") && new.ends_with("-> 200 slow"),
        "{old} {new}"
    );
    assert_eq!(server.max_in_flight(), 1, "one line for both versions");
}
