//! The admin server against a real broker: `/metrics` after a known mix of
//! outcomes, the bearer token, the `Host` check, and where it listens.

use hopper_tests::*;
use serde_json::json;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// `[admin]` on an ephemeral loopback port, with the test token.
fn admin() -> AdminTable {
    AdminTable::loopback().token(TOKEN)
}

/// `route` in a config with the admin server, for a test of it.
fn administered(route: RouteTable) -> TestRoute {
    ConfigBuilder::new()
        .route(route)
        .admin(admin())
        .test_route()
}

/// The scrape at `addr`, parsed by a Prometheus text parser: sample values
/// by metric name and labels (`name{k=v,...}`, labels sorted).
async fn scrape(addr: SocketAddr) -> HashMap<String, f64> {
    let (status, body) = http(addr, "GET", "/metrics", None, None).await;
    assert_eq!(status, 200, "{body}");
    for line in body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        // The parser below skips what it cannot read; check every line is a
        // sample: a metric name, optional labels, and a number.
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let name = series.split('{').next().unwrap();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        assert!(
            matches!(value, "+Inf" | "-Inf" | "NaN") || value.parse::<f64>().is_ok(),
            "bad value in {line:?}"
        );
    }
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text");
    scrape
        .samples
        .into_iter()
        .filter_map(|s| {
            let mut labels: Vec<String> =
                s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.sort();
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                // Their `_count` and `_sum` are samples of their own.
                prometheus_parse::Value::Histogram(_) | prometheus_parse::Value::Summary(_) => {
                    return None;
                }
            };
            Some((format!("{}{{{}}}", s.metric, labels.join(",")), value))
        })
        .collect()
}

/// Scrapes until `done` accepts the samples, for up to a minute.
async fn scrape_until(
    addr: SocketAddr,
    mut done: impl FnMut(&HashMap<String, f64>) -> bool,
) -> HashMap<String, f64> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let samples = scrape(addr).await;
        if done(&samples) {
            return samples;
        }
        assert!(
            Instant::now() < deadline,
            "metrics never settled: {samples:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_prometheus_text_and_count_a_known_mix_of_outcomes() {
    init_tracing();
    let handler = plugin("scripted");
    let route = administered(RouteTable::new(&handler).retry(&["1s"]).max_attempts(2));
    let hopper = route.start().await;
    let addr = hopper.admin_addr().expect("the admin server runs");
    let producer = producer();
    // 3 ok, 2 fatal, 1 always retryable: 8 calls in all (the retryable one
    // twice), 1 retry, 3 dead letters.
    for payload in ["ok", "ok", "ok", "fatal", "fatal", "retry"] {
        produce(&producer, &route.input, None, payload, &[]).await;
    }
    let r = route.name.as_str();
    let key = |name: &str, labels: &str| format!("{name}{{{labels}}}");
    let dead = |reason: &str| {
        key(
            "hopper_dead_lettered_total",
            &format!("reason={reason},route={r}"),
        )
    };
    let samples = scrape_until(addr, |s| {
        s.get(&dead("RETRIES_EXHAUSTED")) == Some(&1.0)
            && s.get(&dead("FATAL")) == Some(&2.0)
            && s.get(&key(
                "hopper_handler_outcomes_total",
                &format!("outcome=ok,route={r}"),
            )) == Some(&3.0)
    })
    .await;
    let outcome = |o: &str| {
        samples[&key(
            "hopper_handler_outcomes_total",
            &format!("outcome={o},route={r}"),
        )]
    };
    assert_eq!(outcome("ok"), 3.0);
    assert_eq!(outcome("fatal"), 2.0);
    assert_eq!(outcome("retryable"), 2.0);
    assert_eq!(outcome("trap"), 0.0);
    assert_eq!(
        samples[&key("hopper_messages_consumed_total", &format!("route={r}"))],
        7.0,
        "6 from the input, 1 from the retry tier"
    );
    assert_eq!(
        samples[&key(
            "hopper_retries_scheduled_total",
            &format!("route={r},tier={r}.retry.1s")
        )],
        1.0
    );
    assert_eq!(
        samples[&dead("HANDLER_TRAP")],
        0.0,
        "every reason exists from the start"
    );
    assert_eq!(
        samples[&key(
            "hopper_handler_duration_seconds_count",
            &format!("route={r}")
        )],
        7.0,
        "one observation per call"
    );
    let version = sha256_hex(&std::fs::read(&handler).unwrap());
    let info = samples
        .iter()
        .find(|(k, _)| k.starts_with("hopper_handler_info{") && k.contains(&format!("route={r}")))
        .expect("handler info");
    assert!(info.0.contains(&format!("version={version}")), "{info:?}");
    assert_eq!(
        samples[&key("hopper_pipeline_consuming", &format!("pipeline={r}"))],
        1.0
    );
    // No label is a key or an id.
    let (_, body) = http(addr, "GET", "/metrics", None, None).await;
    assert!(
        !body.contains(&format!("{}-0-", route.input)),
        "a message id leaked into a label"
    );

    // Lag: the input is drained, and the sampler says so.
    let pending = key(
        "hopper_pending_messages",
        &format!("kind=input,pipeline={r},topic={}", route.input),
    );
    scrape_until(addr, |s| s.get(&pending) == Some(&0.0)).await;

    // Prometheus text 0.0.4 unless the scraper asks for OpenMetrics.
    let (status, body) = http(addr, "GET", "/metrics", None, None).await;
    assert_eq!(status, 200);
    assert!(!body.contains("# EOF"), "plain Prometheus text by default");
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_retry_partition_reports_when_its_head_is_due() {
    init_tracing();
    let route = administered(RouteTable::new(&plugin("scripted")).retry(&["1h"]));
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    produce(&producer(), &route.input, None, "retry", &[]).await;
    let tier = format!("{}.retry.1h", route.name);
    let samples = scrape_until(addr, |s| {
        s.keys()
            .any(|k| k.starts_with("hopper_hold_head_due_seconds{") && k.contains(&tier))
    })
    .await;
    let (_, due) = samples
        .iter()
        .find(|(k, _)| k.starts_with("hopper_hold_head_due_seconds{"))
        .unwrap();
    assert!(*due > 3500.0 && *due <= 3600.0, "due in {due}s");
    let routes = get_json_as(addr, "/api/routes", Some(TOKEN)).await;
    let held = &routes[0]["held"][0];
    assert_eq!(held["topic"], tier.as_str());
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_call_needs_the_token_and_a_bad_request_names_the_field() {
    init_tracing();
    let route = administered(RouteTable::new(&plugin("scripted")));
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let body = r#"{"filter": {}, "dry_run": true}"#;
    let longer = format!("{TOKEN}X");
    for token in [
        None,
        Some("wrong"),
        Some(&TOKEN[..TOKEN.len() - 1]),
        Some(longer.as_str()),
    ] {
        let (status, answer) = http(addr, "POST", "/api/replay", token, Some(body)).await;
        assert_eq!(status, 401, "token {token:?}: {answer}");
        assert!(answer.contains("token"), "{answer}");
    }
    let (status, answer) = http(addr, "POST", "/api/replay", Some(TOKEN), Some(body)).await;
    assert_eq!(status, 202, "a filter's replay is a run: {answer}");
    let (status, answer) = http(
        addr,
        "POST",
        "/api/replay",
        Some(TOKEN),
        Some("{\"dry_run\": 1}"),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.contains("dry_run"),
        "a bad body names the field: {answer}"
    );
    // A reason that is not a class would select nothing: refused, named.
    let bad_reason = r#"{"filter": {"reason": "FATL"}, "dry_run": true}"#;
    let (status, answer) = http(addr, "POST", "/api/replay", Some(TOKEN), Some(bad_reason)).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("`FATL` is not a reason class"), "{answer}");
    let (status, answer) = http(addr, "GET", "/api/dlq?reason=FATL", Some(TOKEN), None).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.contains("FATAL"),
        "the known classes are listed: {answer}"
    );

    let health = get_json(addr, "/health").await;
    assert_eq!(health["status"], "ok");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, ready) = http(addr, "GET", "/ready", None, None).await;
        if status == 200 {
            assert!(ready.contains("consuming"), "{ready}");
            break;
        }
        assert_eq!(status, 503);
        assert!(Instant::now() < deadline, "never ready: {ready}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let handlers = get_json_as(addr, "/api/handlers", Some(TOKEN)).await;
    assert_eq!(handlers[0]["route"], route.name.as_str());
    assert!(handlers[0]["last_reload_error"].is_null());
    let (status, answer) = http(addr, "GET", "/api/dlq/some.topic/0/0", Some(TOKEN), None).await;
    assert_eq!(status, 404, "only dead-letter topics can be read: {answer}");
    assert!(
        answer.contains("`some.topic` is not a dead-letter topic"),
        "{answer}"
    );
    hopper.stop().await;
}

/// `GET path` at `addr` naming `host` in the `Host` header: the status.
async fn get_as_host(addr: SocketAddr, host: &str, path: &str, token: Option<&str>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{authorization}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response))
        .await
        .expect("the admin server answers")
        .unwrap();
    let text = String::from_utf8_lossy(&response);
    text.split(' ').nth(1).unwrap().parse().unwrap()
}

/// Regressions: with a token configured, `/api` reads needed none on
/// loopback; any `Host` was answered (a page rebinding its name to
/// 127.0.0.1 could read `/api/dlq`); and a handler granted `*://*:*` could
/// GET the admin server. The handler's GET of `/health`, which answers
/// anyone, shows it would have been reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_the_token_and_a_known_host_and_handlers_never_reach_it() {
    init_tracing();
    let route = administered(RouteTable::new(&plugin("acting")).allowed_hosts(&["*://*:*"]));
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    for path in ["/api/routes", "/api/status", "/api/handlers", "/api/dlq"] {
        let (status, answer) = http(addr, "GET", path, None, None).await;
        assert_eq!(status, 401, "{path} without the token: {answer}");
        let (status, answer) = http(addr, "GET", path, Some(TOKEN), None).await;
        assert_eq!(status, 200, "{path} with the token: {answer}");
    }
    for path in ["/health", "/metrics"] {
        let (status, _) = http(addr, "GET", path, None, None).await;
        assert_eq!(status, 200, "{path} stays open");
    }
    let port = addr.port();
    for (host, expected) in [
        (format!("127.0.0.1:{port}"), 200),
        (format!("localhost:{port}"), 200),
        ("localhost:8080".to_string(), 200),
        (format!("[::1]:{port}"), 200),
        (format!("rebound.example:{port}"), 403),
        (format!("localhost.rebound.example:{port}"), 403),
    ] {
        let status = get_as_host(addr, &host, "/api/dlq", Some(TOKEN)).await;
        assert_eq!(status, expected, "Host: {host}");
        let status = get_as_host(addr, &host, "/", None).await;
        assert_eq!(status, expected, "the console, Host: {host}");
    }
    assert_eq!(
        get_as_host(addr, "rebound.example", "/health", None).await,
        200,
        "probes answer whatever name they use"
    );

    let steps = json!({"steps": [
        {"get": format!("http://{addr}/health")},
        {"get": format!("http://localhost:{port}/health")},
    ], "verdict": "fatal"});
    produce(&producer(), &route.input, None, &steps.to_string(), &[]).await;
    let dead = consume(&route.dlq, 1, PATIENCE).await;
    let (headers, _) = header_map(&dead[0]);
    assert_eq!(
        headers["hopper-last-error"],
        format!(
            "GET http://{addr}/health -> error ErrorCode::HttpRequestDenied at handle | GET http://localhost:{port}/health -> error ErrorCode::HttpRequestDenied"
        )
    );
    hopper.stop().await;
}

/// Regression: without a configured token, API reads answered anyone on
/// loopback, so a handler granted loopback read another hopper's dead
/// letters. Now every read needs a token, and without a configured one the
/// server makes a session token no handler can obtain. Hopper B holds a dead
/// letter; hopper A's handler, granted every address, reaches B's `/health`
/// (so it would have read `/api/dlq`), and gets 401 there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_handler_reads_another_hoppers_dead_letters_without_a_token_it_cannot_obtain() {
    init_tracing();
    if std::env::var_os("HOPPER_ADMIN_TOKEN").is_some() {
        return; // the environment gives a token; this case cannot be set up
    }
    let other = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")))
        .admin(AdminTable::loopback())
        .test_route();
    let other_run = other.start().await;
    let b = other_run.admin_addr().unwrap();
    let session = other_run
        .admin_session_token()
        .expect("no configured token: a session token")
        .to_string();
    produce(
        &producer(),
        &other.input,
        Some("k"),
        "fatal",
        &[("hopper-id", "secret-letter")],
    )
    .await;
    consume(&other.dlq, 1, PATIENCE).await;
    let listed = get_json_as(b, &format!("/api/dlq?route={}", other.name), Some(&session)).await;
    assert_eq!(listed["total"], 1, "the session token reads: {listed}");

    let route = RouteTable::new(&plugin("acting"))
        .allowed_hosts(&["*://*:*"])
        .test_route();
    let hopper = route.start().await;
    let steps = json!({"steps": [
        {"get": format!("http://{b}/health")},
        {"get": format!("http://{b}/api/dlq?route={}", other.name)},
        {"get": format!("http://{b}/api/dlq/{}/0/0", other.dlq)},
    ], "verdict": "fatal"});
    produce(&producer(), &route.input, None, &steps.to_string(), &[]).await;
    let dead = consume(&route.dlq, 1, PATIENCE).await;
    let (headers, _) = header_map(&dead[0]);
    let error = &headers["hopper-last-error"];
    assert!(
        error.contains(&format!("GET http://{b}/health -> 200")),
        "{error}"
    );
    assert!(
        error.contains(&format!(
            "GET http://{b}/api/dlq?route={} -> 401",
            other.name
        )),
        "{error}"
    );
    assert!(
        error.contains(&format!("GET http://{b}/api/dlq/{}/0/0 -> 401", other.dlq)),
        "{error}"
    );
    assert!(!error.contains("secret-letter"), "{error}");
    // The session token reads, and never writes.
    let (status, answer) = http(
        b,
        "POST",
        "/api/replay",
        Some(&session),
        Some(r#"{"filter": {}, "dry_run": true}"#),
    )
    .await;
    assert_eq!(status, 401, "{answer}");
    assert!(answer.contains("none is configured"), "{answer}");
    hopper.stop().await;
    other_run.stop().await;
}

/// Regression: `GET /api/dlq` opened a consumer and scanned on a blocking
/// thread for every call, with no cap on calls in flight. Past
/// `MAX_DLQ_READS` (2), a read is answered 429 with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_reads_in_flight_are_capped() {
    init_tracing();
    let route = administered(RouteTable::new(&plugin("scripted")));
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let path = format!("/api/dlq?route={}", route.name);
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let path = path.clone();
            tokio::spawn(async move { http(addr, "GET", &path, Some(TOKEN), None).await })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    let ok = answers.iter().filter(|(status, _)| *status == 200).count();
    let refused: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status == 429)
        .collect();
    assert_eq!(ok + refused.len(), answers.len(), "{answers:?}");
    assert!(ok >= 1, "some reads are answered: {answers:?}");
    assert!(
        !refused.is_empty(),
        "16 reads at once, none refused: {answers:?}"
    );
    assert!(
        refused[0]
            .1
            .contains("reads of the dead-letter topics are already in flight"),
        "{}",
        refused[0].1
    );
    // Once they are done, a read is answered again.
    let (status, answer) = http(addr, "GET", &path, Some(TOKEN), None).await;
    assert_eq!(status, 200, "{answer}");
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_configured_token_nothing_can_change_state() {
    init_tracing();
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")))
        .admin(AdminTable::loopback())
        .test_route();
    if std::env::var_os("HOPPER_ADMIN_TOKEN").is_some() {
        return; // the environment gives a token; this case cannot be set up
    }
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    // Not even with the session token, which reads.
    let session = hopper.admin_session_token().unwrap().to_string();
    for token in ["anything", &session] {
        let (status, answer) = http(
            addr,
            "POST",
            "/api/replay",
            Some(token),
            Some(r#"{"filter": {}, "dry_run": true}"#),
        )
        .await;
        assert_eq!(status, 401);
        let expected = if token == session {
            "none is configured"
        } else {
            "token is wrong"
        };
        assert!(answer.contains(expected), "{token}: {answer}");
    }
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_server_is_not_reachable_off_loopback_unless_configured() {
    init_tracing();
    // Bound to 127.0.0.1: another loopback address of this host, 127.0.0.2,
    // finds nothing at the port. Bound to every address (as configured
    // below), it does.
    let route = administered(RouteTable::new(&plugin("scripted")));
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    let elsewhere = SocketAddr::new("127.0.0.2".parse().unwrap(), addr.port());
    assert!(
        tokio::net::TcpStream::connect(elsewhere).await.is_err(),
        "reachable at {elsewhere}"
    );
    hopper.stop().await;

    let open = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")))
        .admin(AdminTable::listen("0.0.0.0:0").token(TOKEN))
        .test_route();
    let hopper = open.start().await;
    let port = hopper.admin_addr().unwrap().port();
    let elsewhere = SocketAddr::new("127.0.0.2".parse().unwrap(), port);
    let (status, _) = http(elsewhere, "GET", "/health", None, None).await;
    assert_eq!(status, 200);
    // Reachable from elsewhere: reads need the token too.
    let (status, _) = http(elsewhere, "GET", "/api/routes", None, None).await;
    assert_eq!(status, 401);
    let (status, _) = http(elsewhere, "GET", "/api/routes", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    hopper.stop().await;
}

#[test]
fn a_non_loopback_listen_without_a_token_is_refused_at_load() {
    let config = ConfigBuilder::new()
        .delay(DelayTable::default())
        .admin(AdminTable::listen("0.0.0.0:9464"))
        .write();
    if std::env::var_os("HOPPER_ADMIN_TOKEN").is_some() {
        return;
    }
    let error = hopper::config::Config::load(&config.path)
        .unwrap_err()
        .to_string();
    assert!(
        error
            .contains("admin.listen `0.0.0.0:9464` is reachable from other hosts; set admin.token"),
        "{error}"
    );
}

/// A config that turns off the verification of the brokers' certificates
/// (legal: hopper starts, and is ready) says so in `/ready`, one warning
/// per property, whoever probes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_names_what_the_config_turns_off_of_kafka_security() {
    init_tracing();
    let route = ConfigBuilder::new()
        .kafka_property("enable.ssl.certificate.verification", "false")
        .kafka_property("ssl.endpoint.identification.algorithm", "none")
        .route(RouteTable::new(&plugin("scripted")))
        .admin(admin())
        .test_route();
    let hopper = route.start().await;
    let addr = hopper.admin_addr().unwrap();
    let deadline = Instant::now() + PATIENCE;
    let ready = loop {
        let (status, ready) = http(addr, "GET", "/ready", None, None).await;
        if status == 200 {
            break ready;
        }
        assert!(Instant::now() < deadline, "never ready: {ready}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready["ready"], true, "{ready}");
    let warnings: Vec<&str> = ready["warnings"]
        .as_array()
        .unwrap_or_else(|| panic!("no warnings in {ready}"))
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0]
            .starts_with("kafka.properties.\"enable.ssl.certificate.verification\" is false"),
        "{warnings:?}"
    );
    assert!(
        warnings[1]
            .starts_with("kafka.properties.\"ssl.endpoint.identification.algorithm\" is none"),
        "{warnings:?}"
    );
    hopper.stop().await;
}
