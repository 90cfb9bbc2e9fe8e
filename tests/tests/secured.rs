//! Secured clusters (docs/connecting.md): the core loop over SASL_SSL with
//! SCRAM, TLS with a CA file, mutual TLS, OAUTHBEARER's token request, each
//! way a connection can fail and what hopper says of it, a credential
//! rotated away after start, and no secret in anything hopper prints or
//! serves. Every broker here is started by the test itself on 127.0.0.1.

use hopper_tests::secured::{
    MtlsBroker, PASSWORD, SecuredBroker, TokenEndpoint, USER_256, USER_512, free_port,
};
use hopper_tests::{
    ConfigBuilder, DelayTable, PATIENCE, RouteTable, TOKEN, cache_dir, header_map, hopper_bin,
    plugin, rand_name,
};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The environment variable the configs read the password from.
const PASSWORD_ENV: &str = "HOPPER_TEST_KAFKA_PASSWORD";

/// A config on `brokers` with `properties`, one partition a topic.
fn on_brokers(brokers: &str, properties: &[(&str, String)]) -> ConfigBuilder {
    properties.iter().fold(
        ConfigBuilder::new().brokers(brokers).partitions(1),
        |config, (key, value)| config.kafka_property(key, value),
    )
}

/// The SCRAM-SHA-512 properties of `broker`, the password read from the
/// environment.
fn scram(broker: &SecuredBroker) -> Vec<(&'static str, String)> {
    broker
        .client_properties()
        .into_iter()
        .map(|(k, v)| {
            if k == "sasl.password" {
                (k, format!("env:{PASSWORD_ENV}"))
            } else {
                (k, v)
            }
        })
        .collect()
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("hopper.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `hopper ARGS` with the password in its environment.
fn hopper(args: &[&str]) -> Output {
    Command::new(hopper_bin())
        .args(args)
        .env(PASSWORD_ENV, PASSWORD)
        .env("HOPPER_CACHE_DIR", cache_dir())
        .env_remove("HOPPER_LOG")
        .env_remove("HOPPER_BROKERS")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `hopper run`, its stdout and stderr collected line by line.
struct Run {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Run {
    fn start(config: &Path) -> Run {
        let mut child = Command::new(hopper_bin())
            .args(["run", "--config"])
            .arg(config)
            .env(PASSWORD_ENV, PASSWORD)
            .env("HOPPER_CACHE_DIR", cache_dir())
            .env(
                "HOPPER_LOG",
                std::env::var("HOPPER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env_remove("HOPPER_BROKERS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Run { child, lines }
    }

    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Waits for the process to exit on its own: its status and how long
    /// it took from `since`.
    fn exit(&mut self, since: Instant) -> (std::process::ExitStatus, Duration) {
        let deadline = since + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The reader threads have the last lines once the pipes close.
                std::thread::sleep(Duration::from_millis(100));
                return (status, since.elapsed());
            }
            assert!(
                Instant::now() < deadline,
                "hopper run did not exit within {PATIENCE:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then the exit.
    fn stop(&mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-s", "TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.exit(Instant::now()).0
    }

    async fn wait_for_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(line) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no line with {needle:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn producer(config: &rdkafka::ClientConfig) -> FutureProducer {
    let mut config = config.clone();
    config.set("message.timeout.ms", "30000");
    config.create().unwrap()
}

async fn produce(producer: &FutureProducer, topic: &str, id: &str, payload: &[u8]) {
    let headers = OwnedHeaders::new().insert(Header {
        key: "hopper-id",
        value: Some(id),
    });
    producer
        .send(
            FutureRecord::to(topic)
                .key(id)
                .payload(payload)
                .headers(headers),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

/// Reads `count` records of `topic` from its start, within [`PATIENCE`].
async fn consume(config: &rdkafka::ClientConfig, topic: &str, count: usize) -> Vec<OwnedMessage> {
    let mut config = config.clone();
    config
        .set("group.id", rand_name("reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false");
    let consumer: StreamConsumer = config.create().unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while out.len() < count {
        match tokio::time::timeout_at(deadline, consumer.recv()).await {
            Ok(Ok(m)) => out.push(m.detach()),
            Ok(Err(e)) => eprintln!("reading {topic}: {e}"),
            Err(_) => panic!("{} of {count} records on {topic}", out.len()),
        }
    }
    out
}

/// Creates `topic` (one partition) through a client with `config`.
async fn create_topic(config: &rdkafka::ClientConfig, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = config.create().unwrap();
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    for result in results {
        result.unwrap();
    }
    // It is in the metadata before anything is sent to it.
    let deadline = Instant::now() + PATIENCE;
    let consumer: rdkafka::consumer::BaseConsumer = config.create().unwrap();
    while consumer
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .map_or(true, |m| {
            m.topics()
                .iter()
                .all(|t| t.error().is_some() || t.partitions().is_empty())
        })
    {
        assert!(Instant::now() < deadline, "{topic} never showed up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_no_secret(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "the password is in {what}:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_core_loop_runs_over_sasl_ssl_with_scram_sha_512() {
    let broker = SecuredBroker::start();
    let dir = tempfile::tempdir().unwrap();
    let (input, inbox, target) = (rand_name("in"), rand_name("inbox"), rand_name("target"));
    let config = write_config(
        dir.path(),
        &on_brokers(&broker.address, &scram(&broker))
            .route(
                RouteTable::named("secured", &plugin("scripted"))
                    .topics(&[&input])
                    .retry(&["1s"])
                    .max_attempts(2),
            )
            .delay(DelayTable::default().inbox(&inbox).tiers(&["1s"]))
            .toml(),
    );
    let client = broker.client_config();
    let mut run = Run::start(&config);
    run.wait_for_line("Delay relay started").await;
    // The target must exist for the relay to forward to it.
    create_topic(&client, &target).await;
    let producer = producer(&client);
    produce(&producer, &input, "s-ok", b"ok").await;
    produce(&producer, &input, "s-retry", b"retry").await;
    produce(&producer, &input, "s-fatal", b"fatal").await;
    let dlq = consume(&client, "secured.dlq", 2).await;
    let reasons: Vec<(String, String)> = dlq
        .iter()
        .map(|m| {
            let (h, _) = header_map(m);
            (h["hopper-id"].clone(), h["hopper-reason"].clone())
        })
        .collect();
    assert!(
        reasons.contains(&("s-fatal".into(), "FATAL".into())),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("s-retry".into(), "RETRIES_EXHAUSTED".into())),
        "{reasons:?}"
    );

    let path = config.to_str().unwrap();
    let ls = hopper(&["dlq", "ls", "--config", path]);
    assert!(ls.status.success(), "{}", text(&ls));
    assert!(
        text(&ls).contains("s-fatal") && text(&ls).contains("s-retry"),
        "{}",
        text(&ls)
    );
    let replay = hopper(&["dlq", "replay", "--config", path, "--reason", "FATAL"]);
    assert!(replay.status.success(), "{}", text(&replay));
    assert!(
        text(&replay).contains("Replayed 1 of 1"),
        "{}",
        text(&replay)
    );
    // The replayed record is handled again, and dead-lettered again.
    let dlq = consume(&client, "secured.dlq", 3).await;
    assert_eq!(header_map(&dlq[2]).0["hopper-id"], "s-fatal");

    // A delayed message, and one cancelled before it is due: the first is
    // forwarded, then a later one; the cancelled one, due between them,
    // never is.
    let send = |id: &str, delay: &str| {
        hopper(&[
            "send",
            "--config",
            path,
            "--topic",
            target.as_str(),
            "--delay",
            delay,
            "--id",
            id,
            "--payload",
            id,
        ])
    };
    let sent = send("d-1", "1s");
    assert!(sent.status.success(), "{}", text(&sent));
    assert!(
        text(&sent).contains(&format!("via {inbox}[")),
        "{}",
        text(&sent)
    );
    assert!(send("d-cancelled", "3s").status.success());
    let cancel = hopper(&["delay", "cancel", "--config", path, "--id", "d-cancelled"]);
    assert!(cancel.status.success(), "{}", text(&cancel));
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(send("d-2", "1s").status.success());
    let forwarded = consume(&client, &target, 2).await;
    let payloads: Vec<String> = forwarded
        .iter()
        .map(|m| String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned())
        .collect();
    assert_eq!(payloads, ["d-1", "d-2"]);

    let status = hopper(&["status", "--config", path]);
    assert!(status.status.success(), "{}", text(&status));
    assert!(text(&status).contains(&input), "{}", text(&status));
    assert!(run.stop().success(), "{}", run.log());
    for (what, said) in [
        ("the log of hopper run", run.log()),
        ("dlq ls", text(&ls)),
        ("dlq replay", text(&replay)),
        ("status", text(&status)),
        ("send", text(&sent)),
    ] {
        assert_no_secret(what, &said);
    }
}

/// The config of a delay relay on `brokers` with `properties`, and its
/// inbox and target.
fn relay_config(dir: &Path, brokers: &str, properties: &[(&str, String)]) -> (PathBuf, String) {
    let inbox = rand_name("inbox");
    let config = write_config(
        dir,
        &on_brokers(brokers, properties)
            .delay(DelayTable::default().inbox(&inbox).tiers(&["1s"]))
            .toml(),
    );
    (config, inbox)
}

/// A relay on `brokers` forwards a message sent with `hopper send`, read
/// back by a client with `client` properties.
async fn a_delayed_message_goes_through(brokers: &str, properties: &[(&str, String)]) {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = relay_config(dir.path(), brokers, properties);
    let path = config.to_str().unwrap();
    let mut run = Run::start(&config);
    run.wait_for_line("Delay relay started").await;
    let target = rand_name("target");
    let mut client = rdkafka::ClientConfig::new();
    client.set("bootstrap.servers", brokers);
    for (key, value) in properties {
        let value = if value.starts_with("env:") {
            PASSWORD.to_string()
        } else if let Some(file) = value.strip_prefix("file:") {
            std::fs::read_to_string(dir.path().join(file)).unwrap()
        } else {
            value.clone()
        };
        client.set(*key, value);
    }
    create_topic(&client, &target).await;
    let sent = hopper(&[
        "send",
        "--config",
        path,
        "--topic",
        &target,
        "--delay",
        "1s",
        "--payload",
        "over TLS",
    ]);
    assert!(sent.status.success(), "{}", text(&sent));
    let got = consume(&client, &target, 1).await;
    assert_eq!(got[0].payload(), Some(&b"over TLS"[..]));
    assert!(run.stop().success(), "{}", run.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_file_and_mutual_tls_with_a_client_certificate() {
    // Server verification only: the CA file, no client certificate.
    let tls = MtlsBroker::start(false).await;
    a_delayed_message_goes_through(
        &tls.address,
        &[
            ("security.protocol", "ssl".into()),
            ("ssl.ca.location", tls.pki.ca.display().to_string()),
        ],
    )
    .await;

    let mtls = MtlsBroker::start(true).await;
    a_delayed_message_goes_through(
        &mtls.address,
        &[
            ("security.protocol", "ssl".into()),
            ("ssl.ca.location", mtls.pki.ca.display().to_string()),
            (
                "ssl.certificate.location",
                mtls.pki.client_cert.display().to_string(),
            ),
            (
                "ssl.key.location",
                mtls.pki.client_key.display().to_string(),
            ),
        ],
    )
    .await;
    // The key as PEM text, read from a file by hopper (`file:`).
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&mtls.pki.client_key, dir.path().join("client.key")).unwrap();
    let key = std::fs::read_to_string(&mtls.pki.client_key).unwrap();
    let (config, _) = relay_config(
        dir.path(),
        &mtls.address,
        &[
            ("security.protocol", "ssl".into()),
            ("ssl.ca.location", mtls.pki.ca.display().to_string()),
            (
                "ssl.certificate.location",
                mtls.pki.client_cert.display().to_string(),
            ),
            ("ssl.key.pem", "file:client.key".into()),
        ],
    );
    let mut run = Run::start(&config);
    run.wait_for_line("Delay relay started").await;
    assert!(run.stop().success(), "{}", run.log());
    let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(!run.log().contains(&body[..40]), "{}", run.log());
    assert!(
        mtls.refused.lock().unwrap().is_empty(),
        "{:?}",
        mtls.refused
    );
}

/// `hopper run` on `properties` at `brokers` exits non-zero within 30 s,
/// its last line naming the connection and `cause`.
async fn refused(brokers: &str, properties: &[(&str, String)], cause: &str) -> String {
    let expected = format!("error: cannot connect to Kafka at {brokers}");
    refused_with(brokers, properties, &expected, cause).await
}

/// `hopper run` on `properties` exits non-zero within 30 s, its last line
/// starting with `expected` and naming `cause`.
async fn refused_with(
    brokers: &str,
    properties: &[(&str, String)],
    expected: &str,
    cause: &str,
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = relay_config(dir.path(), brokers, properties);
    let started = Instant::now();
    let mut run = Run::start(&config);
    let (status, took) = run.exit(started);
    let log = run.log();
    assert!(!status.success(), "{log}");
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{log}");
    let last = log.lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with(expected), "{log}");
    assert!(
        last.contains(cause),
        "expected {cause:?} in {last:?}:\n{log}"
    );
    assert_no_secret("a refused start", &log);
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_a_connection_fails_ends_the_start_quickly_and_says_why() {
    let broker = SecuredBroker::start();
    let mut wrong = broker.client_properties();
    wrong[3].1 = "not-the-password".into();
    refused(&broker.address, &wrong, "authentication failed").await;

    let mut mechanism = broker.client_properties();
    mechanism[1].1 = "SCRAM-SHA-999".into();
    // Refused by the client itself, before it tries the broker.
    let settings =
        "error: the Kafka client refuses its settings: Unsupported hash function: SCRAM-SHA-999";
    refused_with(&broker.address, &mechanism, settings, "sasl.mechanism").await;

    let mut ca = broker.client_properties();
    ca[4].1 = broker.pki.other_ca.display().to_string();
    refused(&broker.address, &ca, "ssl.ca.location").await;

    let plaintext = [("security.protocol", "sasl_plaintext".to_string())]
        .into_iter()
        .chain(broker.client_properties().into_iter().skip(1).take(3))
        .collect::<Vec<_>>();
    refused(&broker.address, &plaintext, "security.protocol").await;

    let mtls = MtlsBroker::start(true).await;
    let no_cert = [
        ("security.protocol", "ssl".to_string()),
        ("ssl.ca.location", mtls.pki.ca.display().to_string()),
    ];
    refused(&mtls.address, &no_cert, "TLS failed").await;
    let expired = [
        ("security.protocol", "ssl".to_string()),
        ("ssl.ca.location", mtls.pki.ca.display().to_string()),
        (
            "ssl.certificate.location",
            mtls.pki.expired_cert.display().to_string(),
        ),
        (
            "ssl.key.location",
            mtls.pki.expired_key.display().to_string(),
        ),
    ];
    refused(&mtls.address, &expired, "TLS failed").await;
    let seen = mtls.refused.lock().unwrap().join("\n");
    assert!(
        seen.contains("Expired") || seen.contains("expired"),
        "{seen}"
    );

    // A CLI command says the same, as quickly.
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = relay_config(dir.path(), &broker.address, &wrong);
    let started = Instant::now();
    let out = hopper(&["dlq", "ls", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        text(&out).contains("authentication failed"),
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_rotated_away_after_start_is_counted_logged_once_and_unready() {
    let mut broker = SecuredBroker::start();
    let dir = tempfile::tempdir().unwrap();
    let admin = free_port();
    let mut properties = scram(&broker);
    properties[1].1 = "SCRAM-SHA-256".into();
    properties[2].1 = USER_256.into();
    let (config, _) = {
        let inbox = rand_name("inbox");
        let config = write_config(
            dir.path(),
            &on_brokers(&broker.address, &properties)
                .delay(DelayTable::default().inbox(&inbox).tiers(&["1s"]))
                .admin(hopper_tests::AdminTable::listen(format!(
                    "127.0.0.1:{admin}"
                )))
                .toml(),
        );
        (config, inbox)
    };
    let run = Run::start(&config);
    run.wait_for_line("Delay relay started").await;
    let address: std::net::SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    let ready = || async move {
        let (status, body) = hopper_tests::http(address, "GET", "/ready", None, None).await;
        (
            status,
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        )
    };
    let deadline = Instant::now() + PATIENCE;
    while ready().await.0 != 200 {
        assert!(Instant::now() < deadline, "never ready:\n{}", run.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The broker restarts without the user: while it is away, `/ready`
    // may say other things (no broker, a connection closed). The fact
    // needed is the refused credential, so that is what is waited for.
    broker.delete_user(USER_256, "scram256");
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    let body = loop {
        let (status, body) = ready().await;
        let kafka = body["kafka"].as_str().unwrap_or_default().to_string();
        if status == 503 && kafka.contains("authentication failed") {
            break body;
        }
        if !seen.contains(&body) {
            seen.push(body);
        }
        assert!(
            Instant::now() < deadline,
            "/ready never named the refused credential; it said {seen:#?}\n{}",
            run.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Whatever it said on the way, it never blamed the client's protocol:
    // the broker going away during a TLS session is not a plaintext client.
    assert!(
        !seen
            .iter()
            .chain([&body])
            .any(|b| b.to_string().contains("plaintext client")),
        "{seen:#?}"
    );
    assert!(!run.log().contains("plaintext client"), "{}", run.log());
    let failures = || async move {
        let (_, metrics) = hopper_tests::http(address, "GET", "/metrics", None, None).await;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("hopper_kafka_auth_failures_total "))
            .map(|v| v.trim().parse::<u64>().unwrap())
            .unwrap_or(0)
    };
    // Every client fails on its own: more failures than lines logged.
    let deadline = Instant::now() + PATIENCE;
    while failures().await < 2 {
        assert!(Instant::now() < deadline, "{}", run.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logged = run
        .log()
        .lines()
        .filter(|l| l.contains("Cannot connect to Kafka"))
        .count();
    assert_eq!(logged, 1, "{}", run.log());
    assert_no_secret("the log", &run.log());
    assert_no_secret("/ready", &body.to_string());
    drop(broker);
    let _ = USER_512;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauthbearer_asks_the_token_endpoint_with_the_client_credentials() {
    let broker = SecuredBroker::start();
    let endpoint = TokenEndpoint::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("client-secret"), format!("{PASSWORD}\n")).unwrap();
    let properties = [
        ("security.protocol", "sasl_ssl".to_string()),
        ("ssl.ca.location", broker.pki.ca.display().to_string()),
        ("sasl.mechanism", "OAUTHBEARER".into()),
        ("sasl.oauthbearer.method", "oidc".into()),
        ("sasl.oauthbearer.client.id", "hopper-client".into()),
        (
            "sasl.oauthbearer.client.secret",
            "file:client-secret".into(),
        ),
        ("sasl.oauthbearer.token.endpoint.url", endpoint.url.clone()),
        ("sasl.oauthbearer.scope", "kafka".into()),
    ];
    let (config, _) = relay_config(dir.path(), &broker.address, &properties);
    let started = Instant::now();
    let mut run = Run::start(&config);
    let (status, took) = run.exit(started);
    // The broker here speaks SCRAM only: the token is fetched, then refused.
    assert!(!status.success(), "{}", run.log());
    assert!(took < Duration::from_secs(30), "{took:?}");
    let requests = endpoint.requests.lock().unwrap().clone();
    let request = requests
        .first()
        .unwrap_or_else(|| panic!("no token request:\n{}", run.log()));
    assert!(request.starts_with("POST /oauth2/token"), "{request}");
    assert!(
        request.contains("grant_type=client_credentials"),
        "{request}"
    );
    assert!(request.contains("scope=kafka"), "{request}");
    let basic = hopper_tests::secured::base64url(format!("hopper-client:{PASSWORD}").as_bytes());
    let basic = basic.replace('-', "+").replace('_', "/");
    assert!(
        request.contains(&basic[..basic.len() - 2]),
        "no Basic credentials of hopper-client in {request}"
    );
    let log = run.log();
    assert!(
        log.lines()
            .last()
            .unwrap()
            .starts_with("error: cannot connect to Kafka"),
        "{log}"
    );
    assert_no_secret("the log", &log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_every_codec_are_read_and_hops_are_compressed_byte_for_byte() {
    hopper_tests::init_tracing();
    let input = rand_name("codecs");
    let route = format!("codecs-{}", &input[input.len() - 6..]);
    let (inbox, target) = (rand_name("codec-inbox"), rand_name("codec-target"));
    hopper_tests::create_topics(&[&target]).await;
    // The route's own hops (its dead letters here) and the relay's are
    // compressed too.
    let config = ConfigBuilder::new()
        .kafka_property("compression.type", "zstd")
        .route(
            RouteTable::named(&route, &plugin("fatal"))
                .topics(&[&input])
                .max_attempts(1),
        )
        .delay(DelayTable::default().inbox(&inbox).tiers(&["1s"]))
        .write();
    let hopper_run = config.start().await;
    let mut sent = Vec::new();
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let mut client = hopper_tests::client_config();
        client.set("compression.type", codec);
        let producer: FutureProducer = client.create().unwrap();
        // Compressible text, then bytes that are not UTF-8.
        let mut payload = format!("{codec} ").repeat(200).into_bytes();
        payload.extend((0..=255u8).rev());
        produce(&producer, &input, codec, &payload).await;
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "hopper-target",
                value: Some(target.as_str()),
            })
            .insert(Header {
                key: "hopper-delay",
                value: Some("1s"),
            });
        producer
            .send(
                FutureRecord::to(&inbox)
                    .key(codec)
                    .payload(&payload)
                    .headers(headers),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        sent.push((codec.to_string(), payload));
    }
    let dead = hopper_tests::consume(&format!("{route}.dlq"), 4, PATIENCE).await;
    let delivered = hopper_tests::consume(&target, 4, PATIENCE).await;
    for (codec, payload) in &sent {
        let record = dead
            .iter()
            .find(|m| header_map(m).0["hopper-id"] == *codec)
            .unwrap_or_else(|| panic!("no dead letter of {codec}"));
        assert_eq!(record.payload(), Some(&payload[..]), "{codec}");
        assert_eq!(header_map(record).0["hopper-reason"], "FATAL");
        let forwarded = delivered
            .iter()
            .find(|m| m.key() == Some(codec.as_bytes()))
            .unwrap_or_else(|| panic!("the relay delivered nothing of {codec}"));
        assert_eq!(
            forwarded.payload(),
            Some(&payload[..]),
            "{codec} through the relay"
        );
    }
    hopper_run.stop().await;
}

/// A corrupt batch cannot be written to Nisshi, which decodes every batch
/// it is sent and stores records, not batches: so this test runs on
/// librdkafka's mock cluster (hopper's embedded broker), which keeps each
/// batch as it was sent, as a broker whose disk corrupted one would serve
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_cannot_be_decoded_is_shown_counted_logged_once_and_skipped() {
    let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
    let brokers = mock.bootstrap_servers();
    let input = rand_name("corrupt");
    let route = format!("undecodable-{}", &input[input.len() - 6..]);
    let dlq = format!("{route}.dlq");
    for topic in [
        input.clone(),
        dlq.clone(),
        format!("{dlq}.replays"),
        format!("{route}.retry.1s"),
    ] {
        mock.create_topic(&topic, 1, 1).unwrap();
    }
    let mut client = rdkafka::ClientConfig::new();
    client.set("bootstrap.servers", &brokers);
    let producer = producer(&client);
    produce(&producer, &input, "before-1", b"fatal").await;
    produce(&producer, &input, "before-2", b"fatal").await;
    // Offsets 2 to 6: five records, compressed (zstd) into bytes that are
    // not zstd.
    assert_eq!(
        hopper_tests::secured::produce_corrupt_batch(&brokers, &input, 0, 5, 4),
        0
    );
    produce(&producer, &input, "after", b"fatal").await;

    let dir = tempfile::tempdir().unwrap();
    let admin = free_port();
    let config = write_config(
        dir.path(),
        &format!(
            "[kafka]\nbrokers = \"{brokers}\"\ncreate_topics = false\n\n[[route]]\nname = \"{route}\"\ntopics = [\"{input}\"]\nhandler = \"{}\"\nretry = [\"1s\"]\nmax_attempts = 1\n\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n",
            plugin("scripted").display()
        ),
    );
    let mut run = Run::start(&config);
    let dead = consume(&client, &dlq, 2).await;
    let ids: Vec<String> = dead
        .iter()
        .map(|m| header_map(m).0["hopper-id"].clone())
        .collect();
    assert_eq!(ids, ["before-1", "before-2"]);
    let address: std::net::SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    // librdkafka fetches the batch again and again: counted every time.
    let deadline = Instant::now() + PATIENCE;
    let metrics = loop {
        let (_, metrics) = hopper_tests::http(address, "GET", "/metrics", None, None).await;
        let errors = metrics
            .lines()
            .find_map(|l| l.strip_prefix("hopper_undecodable_batches_total "))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap());
        if errors >= 3 {
            break metrics;
        }
        assert!(Instant::now() < deadline, "{metrics}\n{}", run.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let gauge = format!(
        "hopper_partition_undecodable{{pipeline=\"{route}\",topic=\"{input}\",partition=\"0\"}} 1"
    );
    assert!(metrics.contains(&gauge), "{metrics}");
    let (_, ready) = hopper_tests::http(address, "GET", "/ready", None, None).await;
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready["undecodable"][0]["topic"], input.as_str(), "{ready}");
    assert_eq!(ready["undecodable"][0]["at"], 2, "{ready}");
    let logged = run
        .log()
        .lines()
        .filter(|l| l.contains("cannot be decoded"))
        .count();
    assert_eq!(
        logged,
        1,
        "logged once, fetched at least three times:\n{}",
        run.log()
    );
    assert!(run.stop().success(), "{}", run.log());

    let path = config.to_str().unwrap();
    let skip = |dry: bool| {
        let mut args = vec![
            "skip",
            "--config",
            path,
            "--route",
            &route,
            "--topic",
            &input,
            "--partition",
            "0",
        ];
        if dry {
            args.push("--dry-run");
        }
        hopper(&args)
    };
    let dry = skip(true);
    assert!(dry.status.success(), "{}", text(&dry));
    assert!(
        text(&dry).contains(&format!("Would skip {input}[0] offsets 2 to 6")),
        "{}",
        text(&dry)
    );
    let done = skip(false);
    assert!(done.status.success(), "{}", text(&done));
    assert!(text(&done).contains("Skipped"), "{}", text(&done));
    // Nothing is stuck there any more.
    let again = skip(false);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(text(&again).contains("nothing to skip"), "{}", text(&again));

    let run = Run::start(&config);
    let dead = consume(&client, &dlq, 4).await;
    let (skipped, _) = header_map(&dead[2]);
    assert_eq!(skipped["hopper-reason"], "UNDECODABLE", "{skipped:?}");
    assert_eq!(skipped["hopper-origin-offset"], "2");
    assert!(
        skipped["hopper-last-error"].contains("offsets 2 to 6"),
        "{skipped:?}"
    );
    assert_eq!(dead[2].payload(), None);
    assert_eq!(header_map(&dead[3]).0["hopper-id"], "after");
    drop(run);
}

/// The lines of a command's output that a reader takes for a failure:
/// logged at ERROR or WARN.
fn alarming(out: &Output) -> Vec<String> {
    text(out)
        .lines()
        .filter(|l| l.contains(" ERROR ") || l.contains(" WARN "))
        .map(str::to_string)
        .collect()
}

/// Every CLI command that talks to Kafka, run against a SASL_SSL broker
/// and succeeding, says nothing false: no ERROR or WARN line. librdkafka's
/// own lines about a connection it set up and tore down (a group
/// coordinator's authentication cut short as a short-lived reader closes)
/// are not failures of the command, and a candidate tried with HTTP denied
/// is denied by the try's own mode, not by the route's grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cli_command_that_succeeds_over_sasl_ssl_logs_no_error_or_warning() {
    let broker = SecuredBroker::start();
    let dir = tempfile::tempdir().unwrap();
    let admin = free_port();
    let (input, ordered, inbox, target) = (
        rand_name("in"),
        rand_name("ordered"),
        rand_name("inbox"),
        rand_name("target"),
    );
    let config = write_config(
        dir.path(),
        &on_brokers(&broker.address, &scram(&broker))
            .route(
                RouteTable::named("quiet", &plugin("scripted"))
                    .topics(&[&input])
                    .retry(&["1s"])
                    .max_attempts(2),
            )
            .route(
                RouteTable::named("ordered", &plugin("scripted"))
                    .topics(&[&ordered])
                    .retry(&["1h"])
                    .key("retry_order", "\"key\""),
            )
            .delay(DelayTable::default().inbox(&inbox).tiers(&["1s"]))
            .admin(hopper_tests::AdminTable::listen(format!("127.0.0.1:{admin}")).token(TOKEN))
            .toml(),
    );
    let client = broker.client_config();
    let mut run = Run::start(&config);
    run.wait_for_line("Delay relay started").await;
    create_topic(&client, &target).await;
    let producer = producer(&client);
    produce(&producer, &input, "q-fatal", b"fatal").await;
    // A GET nothing answers: retried, then dead-lettered.
    produce(&producer, &input, "q-get", b"get:http://127.0.0.1:9/").await;
    let dlq = consume(&client, "quiet.dlq", 2).await;
    assert_eq!(dlq.len(), 2);
    // The admin server's live groups follow the DLQ over SASL_SSL too.
    let address: std::net::SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    let deadline = Instant::now() + PATIENCE;
    let groups = loop {
        let (status, body) = hopper_tests::http(
            address,
            "GET",
            "/api/dlq/groups?route=quiet",
            Some(TOKEN),
            None,
        )
        .await;
        let page: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && page["caught_up"] == true && page["total"] == 2 {
            break page;
        }
        assert!(
            Instant::now() < deadline,
            "the live groups never counted the 2 dead letters: {status} {body}\n{}",
            run.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        groups["groups"].as_array().is_some_and(|g| !g.is_empty()),
        "{groups:#}"
    );
    let exported = dir.path().join("dead.jsonl");

    let path = config.to_str().unwrap();
    let candidate = plugin("scripted");
    let candidate = candidate.to_str().unwrap();
    let try_args = [
        "dlq",
        "try",
        "--config",
        path,
        "--route",
        "quiet",
        "--handler",
        candidate,
    ];
    let commands: Vec<Vec<&str>> = vec![
        vec!["dlq", "ls", "--config", path],
        vec!["dlq", "show", "--config", path, "quiet.dlq:0:0"],
        vec!["dlq", "groups", "--config", path, "--json"],
        vec![
            "dlq",
            "export",
            "--config",
            path,
            "--route",
            "quiet",
            "--out",
            exported.to_str().unwrap(),
        ],
        try_args.to_vec(),
        vec![
            "dlq",
            "replay",
            "--config",
            path,
            "--reason",
            "FATAL",
            "--dry-run",
        ],
        vec![
            "send",
            "--config",
            path,
            "--topic",
            target.as_str(),
            "--delay",
            "1h",
            "--id",
            "q-later",
            "--payload",
            "later",
        ],
        vec!["delay", "cancel", "--config", path, "--id", "q-later"],
        vec!["delay", "show", "--config", path, "--id", "q-later"],
        vec!["parked", "list", "--config", path, "--route", "ordered"],
        vec!["status", "--config", path],
        vec!["topics", "--config", path],
        vec!["acls", "--config", path, "--principal", "User:hopper"],
    ];
    let mut said = Vec::new();
    for args in &commands {
        let out = hopper(args);
        assert!(out.status.success(), "hopper {args:?}:\n{}", text(&out));
        let lines = alarming(&out);
        if !lines.is_empty() {
            said.push(format!("hopper {}:\n{}", args.join(" "), lines.join("\n")));
        }
        assert_no_secret(&args.join(" "), &text(&out));
    }
    assert!(
        said.is_empty(),
        "successful commands printed ERROR or WARN lines:\n{}",
        said.join("\n\n")
    );
    // The export read both dead letters over SASL_SSL.
    let lines = std::fs::read_to_string(&exported).unwrap();
    assert_eq!(lines.lines().count(), 2, "{lines}");
    assert_no_secret("the export", &lines);

    // The try's candidate did make a request, and what refused it was the
    // try's own mode: said once on stdout, and per request at debug only.
    let out = Command::new(hopper_bin())
        .args(try_args)
        .env(PASSWORD_ENV, PASSWORD)
        .env("HOPPER_CACHE_DIR", cache_dir())
        .env("HOPPER_LOG", "hopper=debug")
        .env_remove("HOPPER_BROKERS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let all = text(&out);
    assert!(
        all.contains("HTTP denied: every request the candidate makes fails"),
        "{all}"
    );
    let denied: Vec<&str> = all
        .lines()
        .filter(|l| l.contains("HTTP request denied."))
        .collect();
    assert!(!denied.is_empty(), "no request was denied:\n{all}");
    for line in denied {
        assert!(line.contains(" DEBUG "), "{line}");
        assert!(line.contains("this try denies every request"), "{line}");
        assert!(!line.contains("the route grants no hosts"), "{line}");
    }
    assert!(run.stop().success(), "{}", run.log());
}
