//! `hopper:handler/http.fetch` (WIT 0.1.3) against `wasi:http`: the
//! `acting` fixture sends the same requests through both, each from a
//! handler of its own, against a loopback server. What the server saw, what
//! was counted, what was reported and what trace context went out must be
//! the same; and every hostile request `fetch` is given comes back as a
//! typed error that names the problem.

use hopper::events::{self, Event};
use hopper::metrics::series;
use hopper::plugin::Verdict;
use hopper::traceparent::Context;
use hopper_tests::http_server::{Echoed, TestServer};
use hopper_tests::*;
use serde_json::{Value, json};

/// The `acting` fixture, called in-process under `grants`.
struct Acting(InProcess);

impl Acting {
    fn new(grants: impl FnOnce(RouteTable) -> RouteTable) -> Acting {
        Acting(InProcess::new(grants(RouteTable::new(&plugin("acting")))))
    }

    /// Runs `steps` with verdict `fatal` in the trace context `trace`, and
    /// returns the report.
    async fn report_in(&self, trace: Context, steps: Value) -> String {
        let script = json!({"steps": steps, "verdict": "fatal"});
        let call = self
            .0
            .handler
            .call(self.0.delivery("m-1", &script.to_string()));
        match hopper::trace::in_call(trace, call).await {
            Verdict::Fatal { reason } => reason,
            other => panic!("expected the report in a fatal verdict, got {other:?}"),
        }
    }

    async fn report(&self, steps: Value) -> String {
        self.report_in(Context::root(), steps).await
    }

    fn count(&self, result: &str) -> u64 {
        self.0.count(&series::HttpRequests {
            route: "inproc",
            result,
        })
    }
}

/// Every event the handler's HTTP requests made, as text without the time
/// they took: what a log line or an observer sees of each.
fn reported(events: &mut tokio::sync::broadcast::Receiver<Event>) -> Vec<String> {
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        match event {
            Event::HttpRequest(events::HttpRequest {
                method,
                url,
                status,
                error,
                ..
            }) => seen.push(format!("{method} {url} -> {status:?} {error:?}")),
            Event::HttpDenied(events::HttpDenied {
                method,
                url,
                reason,
                ..
            }) => seen.push(format!("{method} {url} denied: {reason}")),
            _ => {}
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_and_wasi_http_send_the_same_requests_and_are_counted_and_traced_alike() {
    init_tracing();
    let requests = |server: &TestServer| {
        json!([
            {"method": "GET", "url": server.url("/echo?order=o-1"),
             "headers": [["x-one", "1"], ["x-two", "a b"], ["x-one", "again"]]},
            {"method": "POST", "url": server.url("/echo"),
             "headers": [["content-type", "application/json"]],
             "body": "{\"order\":\"o-1\"}"},
            {"method": "DELETE", "url": server.url("/status/503")},
            {"method": "GET", "url": "http://not-granted.example/x"},
            {"method": "GET", "url": "http://169.254.169.254/latest/meta-data/"},
        ])
    };
    let mut outcomes = Vec::new();
    for (step, tag) in [("send", "SEND"), ("fetch", "FETCH")] {
        let server = TestServer::start();
        let acting = Acting::new(|r| r.allowed_hosts(&[server.origin()]));
        let mut events = acting.0.telemetry.subscribe();
        let steps: Vec<Value> = requests(&server)
            .as_array()
            .unwrap()
            .iter()
            .map(|r| json!({ step: r }))
            .collect();
        let trace = Context::root();
        let report = acting.report_in(trace, Value::Array(steps)).await;
        // The port differs between the two servers; the rest may not.
        let port = server.addr.port().to_string();
        let report = report.replace(tag, "REQUEST").replace(&port, "PORT");
        let mut echoed = server.echoed();
        let traceparent = String::from_utf8(trace.traceparent().to_vec()).unwrap();
        for request in &mut echoed {
            for (name, value) in &mut request.headers {
                if name == "host" {
                    *value = value.replace(&port, "PORT");
                }
                if name == "traceparent" {
                    assert_eq!(*value, traceparent, "{step}: the call's context goes out");
                    *value = "the call's".into();
                }
            }
        }
        let counts: Vec<(&str, u64)> = ["2xx", "5xx", "error", "denied"]
            .into_iter()
            .map(|result| (result, acting.count(result)))
            .collect();
        let events: Vec<String> = reported(&mut events)
            .into_iter()
            .map(|line| line.replace(&port, "PORT"))
            .collect();
        outcomes.push((step, report, echoed, counts, events));
    }
    let (_, wasi_report, wasi_seen, wasi_counts, wasi_events) = &outcomes[0];
    let (_, fetch_report, fetch_seen, fetch_counts, fetch_events) = &outcomes[1];

    assert_eq!(
        wasi_seen.len(),
        2,
        "both /echo requests reached the server: {wasi_seen:?}"
    );
    assert_eq!(
        fetch_seen, wasi_seen,
        "the server saw the same requests from both"
    );
    let get = &fetch_seen[0];
    assert_eq!(get.method, "GET");
    assert_eq!(get.target, "/echo?order=o-1");
    let names: Vec<&str> = get.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["host", "x-one", "x-one", "x-two", "traceparent"],
        "a repeated header stays repeated"
    );
    assert_eq!(
        fetch_seen[1],
        Echoed {
            method: "POST".into(),
            target: "/echo".into(),
            headers: vec![
                ("host".into(), "127.0.0.1:PORT".into()),
                ("content-type".into(), "application/json".into()),
                ("content-length".into(), "15".into()),
                ("traceparent".into(), "the call's".into()),
            ],
            body: b"{\"order\":\"o-1\"}".to_vec(),
        }
    );

    assert_eq!(
        fetch_counts, wasi_counts,
        "counted the same: {fetch_counts:?}"
    );
    assert_eq!(
        fetch_counts,
        &vec![("2xx", 2), ("5xx", 1), ("error", 0), ("denied", 2)]
    );
    assert_eq!(fetch_events, wasi_events, "reported the same");
    assert_eq!(fetch_events.len(), 5, "{fetch_events:?}");
    assert!(
        fetch_events[3].contains("is not in allowed_hosts"),
        "{fetch_events:?}"
    );

    // What each guest saw: the same statuses and bodies; a denial is
    // `HTTP-request-denied` from `handle` to one and `denied` with the
    // reason to the other.
    let wasi: Vec<&str> = wasi_report.split(" | ").collect();
    let fetch: Vec<&str> = fetch_report.split(" | ").collect();
    assert_eq!(fetch[..3], wasi[..3], "{fetch_report}");
    assert_eq!(
        fetch[0],
        "REQUEST GET http://127.0.0.1:PORT/echo?order=o-1 -> 200 "
    );
    assert_eq!(
        fetch[1],
        "REQUEST POST http://127.0.0.1:PORT/echo -> 200 {\"order\":\"o-1\"}"
    );
    assert_eq!(
        fetch[2],
        "REQUEST DELETE http://127.0.0.1:PORT/status/503 -> 503 status 503"
    );
    assert_eq!(
        wasi[3],
        "REQUEST GET http://not-granted.example/x -> error ErrorCode::HttpRequestDenied at handle"
    );
    assert_eq!(
        fetch[3],
        "REQUEST GET http://not-granted.example/x -> error FetchError::Denied(\"http://not-granted.example:80 is not in allowed_hosts\")"
    );
    assert_eq!(
        fetch[4],
        "REQUEST GET http://169.254.169.254/latest/meta-data/ -> error FetchError::Denied(\"http://169.254.169.254:80 is not in allowed_hosts\")"
    );
}

/// One `fetch` step's report line, the request given as JSON.
async fn fetch_error(acting: &Acting, request: Value) -> String {
    let report = acting.report(json!([{ "fetch": request }])).await;
    report
        .split_once(" -> ")
        .map(|(_, outcome)| outcome.to_string())
        .unwrap_or(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_a_typed_error_that_names_the_problem() {
    let server = TestServer::start();
    let acting = Acting::new(|r| {
        r.allowed_hosts(&[server.origin()])
            .timeout("5s")
            .http("max_response_bytes", 1000)
            .http("first_byte_timeout", quoted("200ms"))
    });
    let cases = [
        (
            json!({"url": "not a url"}),
            "error FetchError::InvalidRequest(\"URL \\\"not a url\\\" does not parse: invalid uri character\")",
        ),
        (
            json!({"url": "/relative"}),
            "error FetchError::InvalidRequest(\"URL \\\"/relative\\\" is not an absolute http:// or https:// URL\")",
        ),
        (
            json!({"url": "ftp://127.0.0.1/x"}),
            "error FetchError::InvalidRequest(\"URL \\\"ftp://127.0.0.1/x\\\" is not an absolute http:// or https:// URL\")",
        ),
        (
            json!({"url": format!("http://user:pass@{}/hello", server.addr)}),
            "error FetchError::InvalidRequest(\"the URL has user information: credentials go in a header\")",
        ),
        (
            json!({"method": "GE T", "url": server.url("/hello")}),
            "error FetchError::InvalidRequest(\"method \\\"GE T\\\" is not an HTTP method\")",
        ),
        (
            json!({"url": server.url("/hello"), "headers": [["bad name", "v"]]}),
            "error FetchError::InvalidRequest(\"header name \\\"bad name\\\" is not a valid name\")",
        ),
        (
            json!({"url": server.url("/hello"), "headers": [["x-a", "line\nbreak"]]}),
            "error FetchError::InvalidRequest(\"the value of header x-a has a byte a header may not carry (a newline, say)\")",
        ),
        (
            json!({"url": server.url("/hello"), "headers": [["Host", "elsewhere.example"]]}),
            "error FetchError::InvalidRequest(\"header host is set by the transport, not the handler\")",
        ),
        (
            json!({"url": server.url("/hello"), "headers": [["transfer-encoding", "chunked"]]}),
            "error FetchError::InvalidRequest(\"header transfer-encoding is set by the transport, not the handler\")",
        ),
        (
            json!({"method": "POST", "url": server.url("/echo"), "headers": [["content-length", "99"]], "body": "short"}),
            "error FetchError::InvalidRequest(\"header content-length does not match the body's 5 bytes\")",
        ),
        (
            json!({"url": "http://elsewhere.example/x"}),
            "error FetchError::Denied(\"http://elsewhere.example:80 is not in allowed_hosts\")",
        ),
        (
            json!({"url": server.url("/big/100000000")}),
            "error FetchError::TooLarge(1000)",
        ),
        (
            json!({"url": server.url("/chunked/100000")}),
            "error FetchError::TooLarge(1000)",
        ),
        (
            json!({"url": server.url("/slow/3000")}),
            "error FetchError::Timeout(\"no response head within 200ms (http.first_byte_timeout, or what was left of the call's timeout)\")",
        ),
    ];
    let before = server.requests();
    for (request, expected) in cases {
        assert_eq!(
            fetch_error(&acting, request.clone()).await,
            expected,
            "{request}"
        );
    }
    assert_eq!(
        server.requests() - before,
        3,
        "only the over-size and the slow requests reached the server"
    );
    // A body of the limit exactly is read whole.
    let report = fetch_error(&acting, json!({"url": server.url("/big/1000")})).await;
    assert!(report.starts_with("200 "), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_may_fetch_max_requests_times_denied_ones_included() {
    let server = TestServer::start();
    let acting = Acting::new(|r| r.allowed_hosts(&[server.origin()]).http("max_requests", 2));
    let report = acting
        .report(json!([
            {"fetch": {"url": "http://elsewhere.example/x"}},
            {"fetch": {"url": server.url("/hello")}},
            {"fetch": {"url": server.url("/hello")}},
            {"send": {"url": server.url("/hello")}},
        ]))
        .await;
    let hello = server.url("/hello");
    assert_eq!(
        report,
        format!(
            "FETCH GET http://elsewhere.example/x -> error FetchError::Denied(\"http://elsewhere.example:80 is not in allowed_hosts\") \
             | FETCH GET {hello} -> 200 hello \
             | FETCH GET {hello} -> error FetchError::TooManyRequests(2) \
             | SEND GET {hello} -> error ErrorCode::ConnectionLimitReached at handle"
        )
    );
    assert_eq!(server.requests(), 1);
}

/// Past the call's `timeout` the call ends as a `wasi:http` call does:
/// `HANDLER_TIMEOUT`, whatever the guest was waiting for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_that_outlasts_the_call_ends_it_with_handler_timeout() {
    let server = TestServer::start();
    let acting = Acting::new(|r| r.allowed_hosts(&[server.origin()]).timeout("300ms"));
    for step in ["send", "fetch"] {
        let script =
            json!({"steps": [{ step: {"url": server.url("/slow/5000")} }], "verdict": "ok"});
        let verdict = acting
            .0
            .handler
            .call(acting.0.delivery("m-1", &script.to_string()))
            .await;
        assert!(
            matches!(
                verdict,
                Verdict::Failed {
                    class: hopper::headers::Reason::HandlerTimeout,
                    ..
                }
            ),
            "{step}: {verdict:?}"
        );
    }
}
