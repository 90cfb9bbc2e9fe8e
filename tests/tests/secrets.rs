//! Secrets: read by the host from the environment or a file, handed to the
//! handler through its import, and never written into a log line, a header
//! or an error text, even by a handler that tries.

use hopper_tests::http_server::TestServer;
use hopper_tests::*;
use rdkafka::Message;
use rdkafka::message::{Headers, OwnedMessage};
use serde_json::json;
use std::io::Read;
use std::process::{Command, Stdio};

fn script(steps: serde_json::Value, verdict: &str) -> String {
    json!({"steps": steps, "verdict": verdict}).to_string()
}

/// Every header value of `record`, as text.
fn header_values(record: &OwnedMessage) -> Vec<String> {
    record
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `hopper run` as its own process with the secret in its environment and
/// every log line at debug level captured. The handler sends the secret to
/// a server (which shows it arrived), then writes it to its log, stdout,
/// stderr and verdict reasons, as a careless handler would.
/// A child process killed and reaped when it goes out of scope, so a test
/// that fails part way leaves no `hopper run` behind.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_the_handler_and_never_the_log_or_a_header() {
    init_tracing();
    let server = TestServer::start();
    let secret = rand_name("s3cr3t");
    let route = RouteTable::new(&plugin("acting"))
        .allowed_hosts(&[server.origin()])
        .retry(&["1s"])
        .max_attempts(2)
        .secret("token", "env:HOPPER_TEST_TOKEN")
        .test_route();
    let tier = format!("{}.retry.1s", route.name);
    let mut child = KilledOnDrop(
        Command::new(hopper_bin())
            .args(["run", "--config"])
            .arg(&route.config_path)
            .arg("--cache-dir")
            .arg(cache_dir())
            .env("HOPPER_LOG", "debug")
            .env("HOPPER_TEST_TOKEN", &secret)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("hopper runs"),
    );
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.0.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.0.stderr.take().unwrap()));

    let producer = producer();
    let authorized = json!([
        {"get": server.url("/auth"), "auth": "token"},
        {"secret": "token"},
        {"secret": "other"},
        {"leak": "token"},
    ]);
    produce(
        &producer,
        &route.input,
        Some("k"),
        &script(authorized, "fatal"),
        &[("hopper-id", "fatal-1")],
    )
    .await;
    produce(
        &producer,
        &route.input,
        Some("k"),
        &script(json!([{"leak": "token"}]), "retry"),
        &[("hopper-id", "retry-1")],
    )
    .await;
    let dead = consume(&route.dlq, 2, PATIENCE).await;
    let retried = consume(&tier, 1, PATIENCE).await;
    drop(child);
    let log = format!("{}{}", stdout.join().unwrap(), stderr.join().unwrap());

    assert_eq!(
        server.authorizations(),
        vec![format!("Bearer {secret}")],
        "the secret reached the handler and went out with its request"
    );
    assert!(
        !log.contains(&secret),
        "the secret is in hopper's output:\n{log}"
    );
    assert!(
        log.contains("The secret is [secret token]."),
        "the handler's log line is there, redacted:\n{log}"
    );
    assert!(
        log.contains("stdout has the secret [secret token]"),
        "{log}"
    );
    for record in dead.iter().chain(&retried) {
        for value in header_values(record) {
            assert!(
                !value.contains(&secret),
                "a header holds the secret: {value}"
            );
        }
        assert_eq!(record.key(), Some(&b"k"[..]));
    }
    let (first, _) = header_map(&dead[0]);
    assert_eq!(
        first["hopper-last-error"],
        format!(
            "GET {} -> 200 seen | secret token: {} bytes | secret other: none | leaked [secret token]",
            server.url("/auth"),
            secret.len()
        )
    );
    let (second, _) = header_map(&dead[1]);
    assert_eq!(second["hopper-reason"], "RETRIES_EXHAUSTED");
    assert_eq!(second["hopper-last-error"], "leaked [secret token]");
}

#[test]
fn a_missing_secret_stops_startup_naming_the_route_and_the_secret() {
    let file = ConfigBuilder::new()
        .without_kafka()
        .route(
            RouteTable::named("orders", &plugin("acting"))
                .topics(&["orders"])
                .secret("api-token", "env:HOPPER_TEST_NEVER_SET")
                .secret("ca", "file:missing.pem"),
        )
        .write();
    let out = Command::new(hopper_bin())
        .args(["run", "--config"])
        .arg(&file.path)
        .env_remove("HOPPER_TEST_NEVER_SET")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(
            "route `orders`: secret `api-token`: environment variable HOPPER_TEST_NEVER_SET is not set"
        ),
        "{text}"
    );
    assert!(
        text.contains("route `orders`: secret `ca`: cannot read file"),
        "{text}"
    );
}
