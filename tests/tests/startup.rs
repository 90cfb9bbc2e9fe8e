//! What `hopper run` does before any message moves: a config without
//! brokers is refused unless the in-memory broker is asked for, topics
//! created with replication 1 are called out, a start that fails leaves
//! nothing running, and its error's kind says what failed.
//!
//! Regression: a config that forgot `kafka.brokers` silently ran on an
//! in-memory broker that loses everything on exit.

use hopper_tests::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A relay-only config (no handler needed) with `kafka` as its `[kafka]`
/// table, in a directory of its own.
fn config(kafka: &str) -> TestConfig {
    let inbox = rand_name("delay");
    TestConfig::raw(&format!(
        "[kafka]\n{kafka}\n\n[delay]\ninbox = \"{inbox}\"\ngroup = \"{inbox}\"\ntiers = [\"1s\"]\n"
    ))
}

/// Kills the child on drop, so a failed assertion leaves nothing running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `hopper run` with `args` and waits for a log line containing
/// `wanted`; returns every line read until then.
fn run_until_logged(args: &[&str], wanted: &str) -> Vec<String> {
    let child = Command::new(hopper_bin())
        .arg("run")
        .args(args)
        .env("HOPPER_LOG", "info")
        .env("HOPPER_LOG_FORMAT", "text")
        .env("NO_COLOR", "1")
        .env_remove("HOPPER_BROKERS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hopper runs");
    let mut child = Running(child);
    let (tx, rx) = mpsc::channel();
    for stream in [
        Box::new(child.0.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.0.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut lines = Vec::new();
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains(wanted);
                lines.push(line);
                if done {
                    return lines;
                }
            }
            Err(_) => panic!(
                "no line with {wanted:?} (exit: {:?}):\n{}",
                child.0.try_wait(),
                lines.join("\n")
            ),
        }
    }
}

#[test]
fn a_config_without_brokers_is_refused_and_says_how_to_fix_it() {
    let TestConfig { dir: _dir, path } = config("partitions = 1");
    let out = Command::new(hopper_bin())
        .args(["run", "--config"])
        .arg(&path)
        .env_remove("HOPPER_BROKERS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it ran:\n{stderr}");
    assert_ne!(out.status.code(), None, "it was killed:\n{stderr}");
    for expected in [
        "no brokers",
        "set kafka.brokers in the config",
        "--brokers",
        "pass --embedded or set kafka.embedded = true",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("Embedded broker listening"), "{stdout}");
}

#[test]
fn the_embedded_broker_starts_when_asked_for() {
    let TestConfig { dir: _dir, path } = config("partitions = 1");
    let path = path.to_str().unwrap();
    let lines = run_until_logged(&["--config", path, "--embedded"], "Delay relay started.");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Embedded broker listening on 127.0.0.1:")),
        "{lines:#?}"
    );

    let TestConfig { dir: _dir, path } = config("partitions = 1\nembedded = true");
    let lines = run_until_logged(
        &["--config", path.to_str().unwrap()],
        "Delay relay started.",
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Embedded broker listening on 127.0.0.1:")),
        "{lines:#?}"
    );
}

#[test]
fn embedded_and_brokers_together_are_refused() {
    let TestConfig { dir: _dir, path } = config("brokers = \"127.0.0.1:1\"\nembedded = true");
    let out = Command::new(hopper_bin())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("kafka.embedded = true and kafka.brokers are both set"),
        "{stderr}"
    );
}

#[test]
fn topics_created_with_replication_1_are_named_in_a_warning() {
    let TestConfig { dir: _dir, path } =
        config(&format!("brokers = \"{}\"\npartitions = 1", brokers()));
    let text = std::fs::read_to_string(&path).unwrap();
    let inbox = text
        .lines()
        .find_map(|l| l.strip_prefix("inbox = \""))
        .unwrap()
        .trim_end_matches('"')
        .to_string();
    let lines = run_until_logged(
        &["--config", path.to_str().unwrap()],
        "Delay relay started.",
    );
    let warning = lines
        .iter()
        .find(|l| l.contains("Topics created with replication 1"))
        .unwrap_or_else(|| panic!("no warning:\n{lines:#?}"));
    for topic in [inbox.clone(), format!("{inbox}.1s"), format!("{inbox}.dlq")] {
        assert!(warning.contains(&topic), "{topic} not named: {warning}");
    }
}

/// Messages waiting on a route's input before hopper starts.
const WAITING: i64 = 5;

/// A route that reads its own input with the no-op handler, and a delay
/// relay with the default cancellation topic, `extra` after them.
struct RouteAndRelay {
    file: TestConfig,
    input: String,
    group: String,
    cancels: String,
}

impl RouteAndRelay {
    fn new(extra: &str) -> RouteAndRelay {
        let name = rand_name("start");
        let input = format!("{name}.in");
        let inbox = format!("{name}.delay");
        let file = TestConfig::new(&format!(
            "{}\n[delay]\ninbox = \"{inbox}\"\ngroup = \"{inbox}\"\ntiers = [\"1s\"]\n\n{extra}",
            route_table(&name, &plugin("noop"))
        ));
        let group = file.config().routes[0].group.clone();
        RouteAndRelay {
            file,
            input,
            group,
            cancels: format!("{inbox}.cancels"),
        }
    }

    /// Puts [`WAITING`] messages on the route's input.
    async fn fill(&self) {
        create_topics(&[&self.input]).await;
        let producer = producer();
        for i in 0..WAITING {
            produce(&producer, &self.input, None, &format!("m{i}"), &[]).await;
        }
    }

    /// Starts hopper, which must fail; returns its error, with its causes.
    async fn start_failing(&self) -> String {
        start_failing(self.file.config()).await.1
    }
}

/// Starts hopper with `config`, which must fail; returns the error and its
/// text with every cause, which reads as `anyhow` reads the chain.
async fn start_failing(config: hopper::config::Config) -> (hopper::Error, String) {
    match hopper::Hopper::start(config, options()).await {
        Ok(hopper) => {
            hopper.stop().await;
            panic!("hopper started");
        }
        Err(e) => {
            let text = format!("{e:#}");
            let mut chain = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                chain.push_str(&format!(": {c}"));
                cause = c.source();
            }
            assert_eq!(text, chain, "`{{:#}}` and the error's causes differ");
            (e, text)
        }
    }
}

/// The tasks alive on the test's runtime.
fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// A subscriber that deletes `topic` from the test broker when hopper logs
/// `message`, before hopper goes on: the log line is written on the task
/// that starts hopper, which waits for the deletion.
fn delete_topic_on(message: &'static str, topic: String) -> impl tracing::Subscriber {
    use tracing_subscriber::layer::SubscriberExt as _;
    struct Hook {
        message: &'static str,
        topic: String,
    }
    struct Message(bool, &'static str);
    impl tracing::field::Visit for Message {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" && format!("{value:?}") == self.1 {
                self.0 = true;
            }
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Hook {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut seen = Message(false, self.message);
            event.record(&mut seen);
            if !seen.0 {
                return;
            }
            let topic = self.topic.clone();
            std::thread::spawn(move || delete_topic(&topic))
                .join()
                .unwrap();
        }
    }
    tracing_subscriber::registry().with(Hook { message, topic })
}

/// Deletes `topic` and waits until the broker's metadata no longer has it.
fn delete_topic(topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::consumer::Consumer as _;
    let admin: AdminClient<DefaultClientContext> = client_config().create().unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let deleted = futures::executor::block_on(admin.delete_topics(&[topic], &options)).unwrap();
    assert!(deleted.iter().all(Result::is_ok), "{deleted:?}");
    let metadata: rdkafka::consumer::BaseConsumer = client_config().create().unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    while std::time::Instant::now() < deadline {
        let topics = metadata
            .fetch_metadata(None, Duration::from_secs(10))
            .unwrap();
        if !topics.topics().iter().any(|t| t.name() == topic) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{topic} is still in the metadata");
}

/// Regression: a delay relay whose cancellation table could not be loaded
/// failed `Hopper::start` after every route's pipeline had been spawned,
/// and those routes went on consuming and committing in a process that had
/// been told hopper did not start.
#[tokio::test]
async fn a_cancellation_table_that_cannot_load_leaves_no_route_committing() {
    // The same setup with a working relay: the route commits what waits on
    // its input, and this is how long that takes.
    let working = RouteAndRelay::new("");
    working.fill().await;
    let began = std::time::Instant::now();
    let hopper = working.file.start().await;
    until_committed_on(&working.group, &working.input, WAITING).await;
    let took = began.elapsed();
    hopper.stop().await;

    // The cancellation topic goes once every topic exists, so the table's
    // load finds no topic to read.
    let broken = RouteAndRelay::new("");
    broken.fill().await;
    let tasks = alive_tasks();
    let hooked = tracing::subscriber::set_default(delete_topic_on(
        "Topics created.",
        broken.cancels.clone(),
    ));
    let error = broken.start_failing().await;
    drop(hooked);
    assert!(
        error.contains("loading the delay relay's cancellation table"),
        "{error}"
    );
    assert!(error.contains(&broken.cancels), "{error}");
    // Twice the time the working route took to commit, and more.
    tokio::time::sleep(took * 2 + Duration::from_secs(2)).await;
    assert_eq!(
        committed_on(&broken.group, &broken.input),
        0,
        "the route committed after the failed start"
    );
    assert!(alive_tasks() <= tasks, "tasks were left running");
}

/// A part that fails to build after every route was built (the admin
/// server, whose address is taken) leaves nothing running: the routes
/// consume and commit nothing, and no task of the start is left.
#[tokio::test]
async fn a_part_failing_after_the_routes_were_built_leaves_nothing_running() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let setup = RouteAndRelay::new(&format!("[admin]\nlisten = \"{addr}\"\n"));
    setup.fill().await;
    let tasks = alive_tasks();
    let error = setup.start_failing().await;
    assert!(
        error.contains(&format!("cannot listen on {addr}")),
        "{error}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(committed_on(&setup.group, &setup.input), 0);
    assert!(alive_tasks() <= tasks, "tasks were left running");
}

/// An embedder tells what failed from the error's kind: a config that
/// cannot run, a broker that does not answer, a handler that does not
/// load.
#[tokio::test]
async fn an_embedder_tells_what_failed_from_the_errors_kind() {
    use hopper::config::ConfigError;
    use hopper::kafka::KafkaError;
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("notes.wasm");
    std::fs::write(&broken, b"hello").unwrap();
    let name = rand_name("kinds");
    let route = |handler: &std::path::Path| TestConfig::new(&route_table(&name, handler));

    let mut config = route(&plugin("noop")).config();
    config.kafka.brokers = Some(" ".into());
    let (error, text) = start_failing(config).await;
    assert!(
        matches!(error, hopper::Error::Config(ConfigError::NoBrokers)),
        "{text}"
    );

    let config = route(&plugin("noop")).config();
    let options = hopper::Options {
        shutdown_timeout: hopper::MAX_SHUTDOWN_TIMEOUT * 2,
        ..options()
    };
    let error = hopper::Hopper::start(config, options).await.err().unwrap();
    assert!(
        matches!(
            error,
            hopper::Error::Config(ConfigError::ShutdownTimeout { .. })
        ),
        "{error:#}"
    );

    let (error, text) = start_failing(route(&broken).config()).await;
    let hopper::Error::Handler(hopper::HandlerError::Load(failures)) = &error else {
        panic!("not a handler error: {text}");
    };
    assert_eq!(failures.len(), 1, "{text}");
    assert_eq!(failures[0].0, name);
    assert!(
        matches!(failures[0].1, hopper::plugin::LoadError::NotWasm { .. }),
        "{text}"
    );
    assert!(text.contains(&format!("route `{name}`")), "{text}");

    // Nothing listens on port 1: after the connection deadline.
    let mut config = route(&plugin("noop")).config();
    config.kafka.brokers = Some("127.0.0.1:1".into());
    let (error, text) = start_failing(config).await;
    assert!(
        matches!(error, hopper::Error::Kafka(KafkaError::Connect { .. })),
        "{text}"
    );
    assert!(
        text.starts_with("cannot connect to Kafka at 127.0.0.1:1"),
        "{text}"
    );
}

/// The `[[route]]` table of route `name` around `handler`, reading
/// `NAME.in`, for a config with more after it.
fn route_table(name: &str, handler: &std::path::Path) -> String {
    ConfigBuilder::new()
        .without_kafka()
        .route(RouteTable::named(name, handler))
        .toml()
}
