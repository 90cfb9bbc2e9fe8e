//! `hopper dlq try` and `POST /api/dlq/try` on a real broker: a broken
//! handler dead-letters 1,000 messages, a fixed candidate is tried on them,
//! the counts are the candidate's verdicts, and no topic gains a record.

use hopper_tests::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

const MESSAGES: usize = 1_000;

/// The high watermark of every partition of every topic on the broker.
/// The end offset of every partition of `topics`: every topic the test's
/// config reads, writes or may emit to, which is everywhere a try could
/// write. (Other tests of this binary write topics of their own at the
/// same time, so the broker's whole list would not hold still.)
fn end_offsets(topics: &std::collections::BTreeSet<String>) -> BTreeMap<(String, i32), i64> {
    let consumer: BaseConsumer = client_config().create().unwrap();
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap();
    let mut ends = BTreeMap::new();
    for topic in metadata
        .topics()
        .iter()
        .filter(|t| topics.contains(t.name()))
    {
        for p in topic.partitions() {
            let (_, high) = consumer
                .fetch_watermarks(topic.name(), p.id(), Duration::from_secs(10))
                .unwrap();
            ends.insert((topic.name().to_string(), p.id()), high);
        }
    }
    ends
}

/// Payload of message `i`: 7 in 10 the candidate handles, 2 it retries,
/// 1 it fails.
fn command(i: usize) -> &'static str {
    match i % 10 {
        0..=6 => "ok",
        7 | 8 => "retry",
        _ => "fatal",
    }
}

/// `POST /api/dlq/try?query` with the candidate's bytes as the body; again
/// while the server answers that another try runs (one runs at a time per
/// process, and the tests of this binary share one).
async fn post_candidate(
    addr: std::net::SocketAddr,
    query: &str,
    token: Option<&str>,
    wasm: &[u8],
) -> (u16, String) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = post_candidate_once(addr, query, token, wasm).await;
        if status != 429 || Instant::now() > deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn post_candidate_once(
    addr: std::net::SocketAddr,
    query: &str,
    token: Option<&str>,
    wasm: &[u8],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "POST /api/dlq/try?{query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/wasm\r\nContent-Length: {}\r\n",
        wasm.len()
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(wasm).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), stream.read_to_end(&mut response))
        .await
        .expect("the admin server answers")
        .unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// A route on the `fatal` handler (with an admin server) that has
/// dead-lettered `messages` messages, `command(i)` the payload of the
/// i-th, and hopper running it.
async fn dead_lettered(messages: usize) -> (TestRoute, hopper::Hopper) {
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("fatal")))
        .admin(AdminTable::loopback().token(TOKEN).allow_code_upload())
        .test_route();
    let running = route.start().await;
    let producer = producer();
    for chunk in (0..messages).collect::<Vec<_>>().chunks(1_000) {
        let sends = chunk.iter().map(|&i| {
            let key = format!("k-{i}");
            let producer = &producer;
            let input = &route.input;
            async move {
                producer
                    .send(
                        FutureRecord::to(input).key(&key).payload(command(i)),
                        Duration::from_secs(30),
                    )
                    .await
                    .map_err(|(e, _)| e)
                    .expect("produce")
            }
        });
        futures::future::join_all(sends).await;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    let dlq = [route.dlq.clone()];
    while records_on(&dlq) < messages as i64 {
        assert!(
            Instant::now() < deadline,
            "{} of {messages} dead-lettered in 300 s",
            records_on(&dlq)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (route, running)
}

/// `hopper dlq try` on the route's dead letters with the scripted
/// candidate, `extra` arguments after.
fn try_cli(route: &TestRoute, extra: &[&str]) -> std::process::Output {
    try_cli_with(route, "scripted", extra)
}

/// `hopper dlq try` on the route's dead letters with the `candidate`
/// fixture, `extra` arguments after.
fn try_cli_with(route: &TestRoute, candidate: &str, extra: &[&str]) -> std::process::Output {
    Command::new(hopper_bin())
        .args(["dlq", "try", "--config"])
        .arg(&route.config_path)
        .args(["--route", &route.name, "--handler"])
        .arg(plugin(candidate))
        .args(extra)
        .env("HOPPER_CACHE_DIR", cache_dir())
        .env_remove("HOPPER_BROKERS")
        .output()
        .unwrap()
}

/// The figure in BENCHMARKS.md: the rate of a try over 10,000 dead letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --ignored --nocapture"]
async fn bench_dlq_try_over_10000_dead_letters() {
    let (route, running) = dead_lettered(10_000).await;
    running.stop().await;
    let out = try_cli(&route, &["--quiet"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(
            "10000 tried: 7000 would succeed, 2000 would retry, 1000 would be dead-lettered again"
        ),
        "{stdout}"
    );
    println!("{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_candidate_is_tried_on_1000_dead_letters_and_nothing_is_written() {
    init_tracing();
    let (route, running) = dead_lettered(MESSAGES).await;
    let candidate = std::fs::read(plugin("scripted")).unwrap();
    let addr = running.admin_addr().expect("the admin server runs");

    // Through the API: the token is required, like replay's.
    let query = format!("route={}", route.name);
    let (status, body) = post_candidate(addr, &query, None, &candidate).await;
    assert_eq!(status, 401, "{body}");
    let topics = route.config().all_topics();
    let before = end_offsets(&topics);
    assert!(
        before.keys().any(|(t, _)| *t == route.dlq),
        "the DLQ is among the topics compared"
    );
    let (status, body) = post_candidate(addr, &query, Some(TOKEN), &candidate).await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (
            &report["total"],
            &report["ok"],
            &report["retry"],
            &report["dead"],
            &report["skipped"],
            &report["http"]
        ),
        (
            &serde_json::json!(MESSAGES),
            &serde_json::json!(700),
            &serde_json::json!(200),
            &serde_json::json!(100),
            &serde_json::json!(0),
            &serde_json::json!("deny")
        ),
        "{body}"
    );
    let records = report["records"].as_array().unwrap();
    assert_eq!(records.len(), MESSAGES);
    for r in records {
        assert_eq!(r["was"], "FATAL", "{r}");
    }
    let why = report["why"].as_array().unwrap();
    assert!(
        why.iter().any(|w| w["outcome"] == "dead"
            && w["reason_class"] == "FATAL"
            && w["reason"] == "told to fail"
            && w["count"] == 100),
        "{why:?}"
    );
    // A bad body is named.
    let (status, body) = post_candidate(addr, &query, Some(TOKEN), b"not wasm").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("is not a WebAssembly file"), "{body}");
    running.stop().await;
    let after_api = end_offsets(&topics);
    let grown: Vec<_> = before
        .iter()
        .filter(|((topic, _), _)| !topic.starts_with("__"))
        .filter(|(tp, end)| after_api.get(*tp) != Some(end))
        .collect();
    assert!(grown.is_empty(), "the API's try wrote to {grown:?}");

    // The CLI, with hopper stopped: every topic of the config is compared.
    let before = end_offsets(&topics);
    let out = try_cli(&route, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for text in [
        "HTTP denied: every request the candidate makes fails",
        "Nothing is written to any topic.",
        "1000 tried: 700 would succeed, 200 would retry, 100 would be dead-lettered again, 0 skipped; 0 records emitted (none produced).",
        " FATAL -> ok\n",
        " FATAL -> retry RETRYABLE: told to retry\n",
        " FATAL -> dead FATAL: told to fail\n",
    ] {
        assert!(stdout.contains(text), "no `{text}` in:\n{stdout}");
    }
    assert_eq!(end_offsets(&topics), before, "the CLI's try wrote a record");

    // Without --route, and with a route the config does not have: named.
    let out = Command::new(hopper_bin())
        .args(["dlq", "try", "--config"])
        .arg(&route.config_path)
        .args(["--route", "nope", "--handler"])
        .arg(plugin("scripted"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("route `nope` is not in "), "{stderr}");
}

/// The secret the route of [`a_candidate_reads_no_secret_unless_the_cli_grants_it`]
/// grants its handler.
const SECRET: &str = "pa55-w0rd+/=";

/// Regression: a candidate ran under the route's grants but HTTP, so one
/// uploaded with the admin token read every `[route.secrets]` value and
/// returned it in its reason, hex-encoded past redaction, in the answer.
/// Now the API's candidate gets no secret ("not granted", as a handler
/// without the grant), and the CLI grants them only with `--with-secrets`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_reads_no_secret_unless_the_cli_grants_it() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, SECRET).unwrap();
    let route = ConfigBuilder::new()
        .route(
            RouteTable::new(&plugin("fatal"))
                .secret("token", format!("file:{}", secret_file.display())),
        )
        .admin(AdminTable::loopback().token(TOKEN).allow_code_upload())
        .test_route();
    let running = route.start().await;
    let script = serde_json::json!({
        "steps": [{"leak": "token"}, {"secret": "token"}, {"reveal": "token"}],
        "verdict": "fatal",
    });
    produce(
        &producer(),
        &route.input,
        Some("k"),
        &script.to_string(),
        &[],
    )
    .await;
    consume(&route.dlq, 1, PATIENCE).await;
    let revealed: String = SECRET.bytes().map(|b| format!("{b:02x}")).collect();
    let denied = "leaked  | secret token: none | reveal token: none";

    let addr = running.admin_addr().unwrap();
    let candidate = std::fs::read(plugin("acting")).unwrap();
    let query = format!("route={}", route.name);
    let (status, body) = post_candidate(addr, &query, Some(TOKEN), &candidate).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains(&revealed), "the secret came back: {body}");
    assert!(
        !body.contains("[secret token]"),
        "the candidate read it: {body}"
    );
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["secrets"], false, "{body}");
    assert_eq!(report["records"][0]["reason"], denied, "{body}");
    running.stop().await;

    let out = try_cli_with(&route, "acting", &["--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !stdout.contains(&revealed),
        "the secret came back: {stdout}"
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["records"][0]["reason"], denied, "{stdout}");

    // Asked for, the candidate runs under the route's grants.
    let out = try_cli_with(&route, "acting", &["--json", "--with-secrets"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["secrets"], true, "{stdout}");
    assert_eq!(
        report["records"][0]["reason"],
        format!(
            "leaked [secret token] | secret token: {} bytes | reveal token: {revealed}",
            SECRET.len()
        ),
        "{stdout}"
    );
}

/// Uploading code to run is a permission of its own: without
/// `admin.allow_code_upload`, `POST /api/dlq/try` answers 403 naming the
/// key, even with the admin token, and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploading_a_candidate_is_refused_unless_the_config_allows_it() {
    init_tracing();
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("fatal")))
        .admin(AdminTable::loopback().token(TOKEN))
        .test_route();
    let running = route.start().await;
    let addr = running.admin_addr().unwrap();
    let candidate = std::fs::read(plugin("scripted")).unwrap();
    let query = format!("route={}", route.name);
    let (status, body) = post_candidate(addr, &query, Some(TOKEN), &candidate).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("admin.allow_code_upload = true"), "{body}");
    let (status, _) = post_candidate(addr, &query, None, &candidate).await;
    assert_eq!(status, 401, "the token is still asked for first");
    running.stop().await;
}

/// Regression: `hopper dlq try` printed the reason class a dead letter
/// claimed (`hopper-reason`) as it was, so a record written with an OSC
/// sequence there wrote to the operator's terminal. Every field it prints
/// from a record or a candidate (id, key, claimed reason, the candidate's
/// reason) is cleaned as `hopper dlq ls` cleans it, one line per record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_try_prints_a_records_control_characters_escaped() {
    init_tracing();
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("fatal")))
        .test_route();
    let running = route.start().await;
    let producer = producer();
    // Dead-lettered by the route: its id and key are the producer's, and
    // the candidate's reason echoes what the payload asks.
    let script = serde_json::json!({
        "steps": [{"trace": "\u{1b}]0;reason-title\u{7}\r"}],
        "verdict": "fatal",
    });
    produce(
        &producer,
        &route.input,
        Some("key\u{1b}]0;key-title\u{7}"),
        &script.to_string(),
        &[("hopper-id", "id\u{1b}]8;;http://evil.example/\u{7}\r\nnext")],
    )
    .await;
    consume(&route.dlq, 1, PATIENCE).await;
    // Written straight to the DLQ, claiming the route and a reason.
    produce(
        &producer,
        &route.dlq,
        Some("raw\u{1b}[2J"),
        "x",
        &[
            ("hopper-route", route.name.as_str()),
            ("hopper-reason", "FATAL\u{1b}]0;was-title\u{7}"),
            ("hopper-id", "raw\u{9b}31m"),
        ],
    )
    .await;
    consume(&route.dlq, 2, PATIENCE).await;
    running.stop().await;

    let out = try_cli_with(&route, "acting", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for raw in ['\u{1b}', '\u{7}', '\r', '\u{9b}'] {
        assert!(!stdout.contains(raw), "{raw:?} printed as is:\n{stdout}");
    }
    for shown in [
        "id\\u{1b}]8;;http://evil.example/\\u{7}\\u{d}\\nnext key",
        "key key\\u{1b}]0;key-title\\u{7}",
        "traced \\u{1b}]0;reason-title\\u{7}\\u{d}",
        "raw\\u{9b}31m key raw\\u{1b}[2J FATAL\\u{1b}]0;was-title\\u{7} -> skipped",
    ] {
        assert!(stdout.contains(shown), "no `{shown}` in:\n{stdout}");
    }
    // Two records, two lines each way: no field broke a line.
    assert_eq!(
        stdout.lines().filter(|l| l.contains(" -> ")).count(),
        2,
        "{stdout}"
    );
}
