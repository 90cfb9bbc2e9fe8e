//! Test harness: a real Kafka-protocol broker, random topic and group names,
//! handler fixtures by path, and small produce/consume helpers.
//!
//! `cargo xtask test` starts one nisshi broker for the whole run and passes
//! its address in `HOPPER_TEST_BROKERS`. Without it, each test binary starts
//! its own nisshi (it must be installed: `cargo install nisshi --locked`).

pub mod bench_server;
pub mod config;
pub mod crash_loop;
pub mod fleet;
pub mod http_server;
pub mod key_recorder;
pub mod logs;
pub mod secured;
pub mod track_server;

pub use config::{AdminTable, ConfigBuilder, DelayTable, RouteTable, quoted};

use hopper::config::Config;
use hopper::kafka::Cluster;
use hopper::metrics::series::Series;
use hopper::{Hopper, Options};
use rand::Rng;
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The broker for this test run.
pub fn brokers() -> String {
    static BROKERS: OnceLock<String> = OnceLock::new();
    BROKERS
        .get_or_init(|| {
            if let Ok(brokers) = std::env::var("HOPPER_TEST_BROKERS") {
                return brokers;
            }
            let broker = start_nisshi();
            let address = broker.address.clone();
            // Lives for the rest of the process; nisshi is killed with it
            // (see the parent-death signal below).
            std::mem::forget(broker);
            address
        })
        .clone()
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HOPPER_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

struct Nisshi {
    _child: Child,
    address: String,
}

fn start_nisshi() -> Nisshi {
    let home = std::env::var("HOME").unwrap_or_default();
    let binary = [PathBuf::from(&home).join(".cargo/bin/nisshi")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nisshi"));
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");
    let url = format!("tcp://{address}");
    let dir = tempfile::tempdir().unwrap().keep();
    let mut command = Command::new(&binary);
    command
        .current_dir(&dir)
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "memory://nisshi/"])
        .args(["--group-initial-rebalance-delay", "0s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(|| {
            // Killed when the thread that started it ends: that thread
            // lives as long as this process (below).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Started from a thread that never ends, so that the parent-death
    // signal comes when this process ends, not when the test or runtime
    // thread that first asked for a broker does.
    let (started, start) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("nisshi parent".into())
        .spawn(move || {
            started.send(command.spawn()).unwrap();
            loop {
                std::thread::park();
            }
        })
        .unwrap();
    let child = start.recv().unwrap().unwrap_or_else(|e| {
        panic!(
            "cannot start {} ({e}); run the suite with `cargo xtask test`, which installs it",
            binary.display()
        )
    });
    let addr: SocketAddr = address.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nisshi did not start on {address}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Nisshi {
        _child: child,
        address,
    }
}

/// A topic name no other test uses.
pub fn rand_name(prefix: &str) -> String {
    let n: u64 = rand::rng().random();
    format!("{prefix}-{n:016x}")
}

/// A built handler component, by file stem (`scripted`, `order_timeout`, ...).
pub fn plugin(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/dist")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask build-plugins` (or `cargo xtask test`)",
        path.display()
    );
    path.canonicalize().unwrap()
}

/// The four builds of the order-timeout handler (plugins/order-timeout*),
/// by file stem in plugins/dist; the Rust one, the reference, first.
pub const ORDER_TIMEOUT_BUILDS: [&str; 4] = [
    "order_timeout",
    "order_timeout_py",
    "order_timeout_js",
    "order_timeout_c",
];

/// Prefix of the order-timeout handlers' reason for a payload that is not an
/// order; the rest is the JSON parser's own words, which differ by language.
pub const NOT_AN_ORDER: &str = "payload is not an order: ";

/// A config file of one route (and maybe more tables) on the test broker,
/// written by [`ConfigBuilder::test_route`] or [`RouteTable::test_route`]:
/// the route's names, and the file.
pub struct TestRoute {
    pub name: String,
    pub input: String,
    pub dlq: String,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
}

impl TestRoute {
    pub fn config(&self) -> Config {
        load_config(&self.config_path)
    }

    pub async fn start(&self) -> Hopper {
        Hopper::start(self.config(), options())
            .await
            .expect("hopper starts")
    }
}

/// `route`, renamed `direct`, resolved from a config file the way
/// `hopper run` resolves it, for calling its handler without a broker.
pub fn resolve_route(route: RouteTable) -> hopper::config::Route {
    ConfigBuilder::new()
        .without_kafka()
        .route(route.rename("direct"))
        .write()
        .load()
        .routes
        .remove(0)
}

/// The compiled-handler cache every test shares. Entries are keyed by the
/// content of the `.wasm`, so sharing is safe, and it spares each test a
/// compile.
pub fn cache_dir() -> PathBuf {
    std::env::temp_dir().join("hopper-test-components")
}

pub fn client_config() -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers());
    for (key, value) in client_properties() {
        config.set(key, value);
    }
    config
}

/// librdkafka properties that every client of the test broker needs, and
/// every hopper the harness starts gets in `[kafka.properties]`: none,
/// unless [`set_client_properties`] named some (a benchmark over TLS).
pub fn client_properties() -> &'static [(String, String)] {
    CLIENT_PROPERTIES
        .get()
        .map(Vec::as_slice)
        .unwrap_or_default()
}

static CLIENT_PROPERTIES: OnceLock<Vec<(String, String)>> = OnceLock::new();

/// Sets [`client_properties`] for the rest of the process, before any
/// client is made.
///
/// # Panics
///
/// If they were set already.
pub fn set_client_properties(properties: Vec<(String, String)>) {
    CLIENT_PROPERTIES
        .set(properties)
        .expect("the client properties are set once, before any client");
}

/// A plain producer, configured like any application's.
pub fn producer() -> FutureProducer {
    client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .unwrap()
}

pub async fn produce(
    producer: &FutureProducer,
    topic: &str,
    key: Option<&str>,
    payload: &str,
    headers: &[(&str, &str)],
) -> (i32, i64) {
    let mut owned = OwnedHeaders::new();
    for (k, v) in headers {
        owned = owned.insert(Header {
            key: k,
            value: Some(*v),
        });
    }
    let mut record = FutureRecord::<str, str>::to(topic)
        .payload(payload)
        .headers(owned);
    if let Some(key) = key {
        record = record.key(key);
    }
    let delivery = producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
    (delivery.partition, delivery.offset)
}

/// A consumer of `topic` from the beginning, in a group of its own, that
/// commits nothing.
pub fn reader(topic: &str) -> StreamConsumer {
    let consumer: StreamConsumer = client_config()
        .set("group.id", rand_name("reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    consumer
}

/// Reads `count` records from `topic` from the beginning, failing after
/// `timeout`.
pub async fn consume(topic: &str, count: usize, timeout: Duration) -> Vec<OwnedMessage> {
    let mut consumer = reader(topic);
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while out.len() < count {
        match tokio::time::timeout_at(deadline, consumer.recv()).await {
            Ok(Ok(m)) => out.push(m.detach()),
            // Subscribed before its writer created it (a `hopper run` still
            // starting): subscribe again until it exists, within `timeout`.
            Ok(Err(rdkafka::error::KafkaError::MessageConsumption(
                rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition,
            ))) if out.is_empty() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                consumer = reader(topic);
            }
            Ok(Err(e)) => panic!("consuming {topic}: {e}"),
            Err(_) => panic!(
                "expected {count} records on {topic} within {timeout:?}, got {}",
                out.len()
            ),
        }
    }
    out
}

/// Reads `topic` from the beginning until `found` accepts a record; panics
/// after `timeout`.
pub async fn consume_until(
    topic: &str,
    timeout: Duration,
    mut found: impl FnMut(&OwnedMessage) -> bool,
) -> OwnedMessage {
    let consumer = reader(topic);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, consumer.recv()).await {
            Ok(Ok(m)) => {
                let m = m.detach();
                if found(&m) {
                    return m;
                }
            }
            Ok(Err(e)) => panic!("consuming {topic}: {e}"),
            Err(_) => panic!("no matching record on {topic} within {timeout:?}"),
        }
    }
}

/// Records on `topics` now: the sum of their partitions' high less low
/// watermarks on the test broker.
pub fn records_on(topics: &[String]) -> i64 {
    let consumer: rdkafka::consumer::BaseConsumer = client_config().create().unwrap();
    let mut sum = 0;
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("metadata of {topic}: {e}"));
        for p in metadata.topics()[0].partitions() {
            let (low, high) = consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("watermarks of {topic}[{}]: {e}", p.id()));
            sum += high - low;
        }
    }
    sum
}

/// The offsets `group` has committed on `topic`, summed over the topic's
/// partitions (a partition without a commit counts 0), read from the test
/// broker.
pub fn committed_on(group: &str, topic: &str) -> i64 {
    let consumer: rdkafka::consumer::BaseConsumer = client_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("metadata of {topic}: {e}"));
    let mut wanted = rdkafka::TopicPartitionList::new();
    for p in metadata.topics()[0].partitions() {
        wanted.add_partition(topic, p.id());
    }
    let got = consumer
        .committed_offsets(wanted, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("offsets {group} committed on {topic}: {e}"));
    got.elements()
        .iter()
        .map(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => o,
            _ => 0,
        })
        .sum()
}

/// Waits until `group` has committed `offsets` on `topic` (summed over its
/// partitions, see [`committed_on`]), within `PATIENCE`.
pub async fn until_committed_on(group: &str, topic: &str, offsets: i64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = committed_on(group, topic);
        if now == offsets {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{group} committed {now} offsets on {topic}, not {offsets}, within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Headers of a record as a map of UTF-8 text (the last value wins), plus
/// the raw count per key so tests can check nothing was appended twice.
pub fn header_map(message: &OwnedMessage) -> (HashMap<String, String>, HashMap<String, usize>) {
    let mut values = HashMap::new();
    let mut counts = HashMap::new();
    if let Some(headers) = message.headers() {
        for h in headers.iter() {
            values.insert(
                h.key.to_string(),
                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
            );
            *counts.entry(h.key.to_string()).or_default() += 1;
        }
    }
    (values, counts)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    hopper::clock::now_ms()
}

/// sha256 of `bytes` in hex, computed independently of hopper.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A config file in a directory of its own, written by
/// [`ConfigBuilder::write`] (or as text, by [`TestConfig::raw`]).
pub struct TestConfig {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TestConfig {
    /// `body` after a `[kafka]` table on the test broker, two partitions a
    /// topic: for the benchmarks, whose routes come as TOML text (tests
    /// build theirs with [`ConfigBuilder`]).
    pub fn new(body: &str) -> TestConfig {
        Self::raw(&format!("{}\n{body}\n", ConfigBuilder::new().toml()))
    }

    /// A config file holding `text` and nothing else: for a `[kafka]` table
    /// of the test's own, or none.
    pub fn raw(text: &str) -> TestConfig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hopper.toml");
        std::fs::write(&path, text).unwrap();
        TestConfig { dir, path }
    }

    /// The config, pointed at the test broker.
    pub fn config(&self) -> Config {
        load_config(&self.path)
    }

    /// The config as written, brokers included (or not).
    pub fn load(&self) -> Config {
        Config::load(&self.path).unwrap_or_else(|e| panic!("{}: {e:#}", self.path.display()))
    }

    pub async fn start(&self) -> Hopper {
        Hopper::start(self.config(), options())
            .await
            .expect("hopper starts")
    }
}

/// Loads a test config the way `hopper run` does, against the test broker.
fn load_config(path: &Path) -> Config {
    let mut config = Config::load(path).unwrap();
    config.kafka.brokers = Some(brokers());
    config
        .kafka
        .properties
        .extend(client_properties().iter().cloned());
    config
}

/// A route, renamed `inproc`, loaded as `hopper run` loads it, and its
/// handler loaded in-process: for what only a handler call decides, no
/// broker needed.
pub struct InProcess {
    pub route: hopper::config::Route,
    pub handler: hopper::plugin::Handler,
    /// Where the handler's HTTP requests and refused emits are reported.
    pub telemetry: hopper::events::Telemetry,
    /// What loaded the handler, for [`InProcess::reload`].
    runtime: hopper::plugin::Runtime,
    _file: TestConfig,
}

impl InProcess {
    pub fn new(route: RouteTable) -> InProcess {
        Self::with_config(route, ConfigBuilder::new())
    }

    /// Like [`InProcess::new`], in `config` (a `[delay]` table, say); its
    /// `[kafka]` table is left out.
    pub fn with_config(route: RouteTable, config: ConfigBuilder) -> InProcess {
        Self::with_runtime(route, config, |runtime| runtime)
    }

    /// Like [`InProcess::with_config`], with host names resolved by
    /// `resolver`.
    pub fn with_resolver(
        route: RouteTable,
        config: ConfigBuilder,
        resolver: std::sync::Arc<dyn hopper::egress::Resolve>,
    ) -> InProcess {
        Self::with_runtime(route, config, |runtime| runtime.with_resolver(resolver))
    }

    fn with_runtime(
        route: RouteTable,
        config: ConfigBuilder,
        adapt: impl FnOnce(hopper::plugin::Runtime) -> hopper::plugin::Runtime,
    ) -> InProcess {
        let file = config.without_kafka().route(route.rename("inproc")).write();
        let mut config = file.load();
        let telemetry = hopper::events::Telemetry::new();
        let runtime = hopper::plugin::Runtime::new(64 << 20)
            .unwrap()
            .with_cache(cache_dir())
            .unwrap()
            .with_telemetry(telemetry.clone());
        let runtime = adapt(runtime);
        let route = config.routes.remove(0);
        let handler = runtime.load(&route.handler, &route).unwrap();
        InProcess {
            route,
            handler,
            telemetry,
            runtime,
            _file: file,
        }
    }

    /// The handler loaded again through the same runtime, as a hot reload
    /// loads a new version: it shares the route's grants with the first.
    pub fn reload(&self) -> hopper::plugin::Handler {
        self.runtime.load(&self.route.handler, &self.route).unwrap()
    }

    /// A delivery of `payload` to this route, with message id `id`.
    pub fn delivery(&self, id: &str, payload: &str) -> hopper::plugin::Delivery {
        hopper::plugin::Delivery {
            id: id.into(),
            topic: "inproc.in".into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: Some(payload.as_bytes().to_vec()),
            headers: Vec::new(),
            timestamp: None,
            attempt: 1,
            route: self.route.name.clone(),
        }
    }

    /// The value of counter series `series`, which is registered when the
    /// handler's grants are built.
    pub fn count<S: Series + std::fmt::Debug>(&self, series: &S) -> u64 {
        count(&self.telemetry, series)
    }
}

/// How tests run hopper: with the shared compiled-handler cache.
pub fn options() -> Options {
    Options {
        cache_dir: Some(cache_dir()),
        ..Options::default()
    }
}

/// Creates topics on the test broker.
pub async fn create_topics(topics: &[&str]) {
    create_topics_with(topics, 2).await
}

/// Creates topics of `partitions` partitions on the test broker.
pub async fn create_topics_with(topics: &[&str], partitions: i32) {
    let cluster = Cluster::new(
        brokers(),
        hopper::config::KafkaConfig {
            partitions,
            properties: client_properties().iter().cloned().collect(),
            ..Default::default()
        },
    );
    let wanted = topics.iter().map(|t| t.to_string()).collect();
    cluster
        .ensure_topics(&wanted)
        .await
        .expect("topics created");
}

/// The `hopper` binary built next to this test binary.
pub fn hopper_bin() -> PathBuf {
    // Test binaries live in target/<profile>/deps, other binaries in
    // target/<profile>, next to `hopper`.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let bin = [dir.join("hopper"), dir.parent().unwrap().join("hopper")]
        .into_iter()
        .find(|b| b.is_file())
        .unwrap_or_else(|| dir.join("hopper"));
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build -p hopper`",
        bin.display()
    );
    bin
}
/// `component` with one more top-level custom section (id 0, LEB128 size,
/// name, bytes) appended. The result is still a valid component with the
/// same behaviour, but a different sha256: a new handler version.
pub fn with_custom_section(component: &[u8], name: &str, data: &[u8]) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut body = Vec::new();
    leb128(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(data);
    let mut out = component.to_vec();
    out.push(0);
    leb128(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

/// Replaces `path` the way build tools do: write a temp file beside it,
/// then rename it over, so no reader ever sees half a file.
pub fn write_atomically(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The value of counter series `series` of `telemetry`; a series that is not
/// registered fails the test, naming it.
pub fn count<S: Series + std::fmt::Debug>(
    telemetry: &hopper::events::Telemetry,
    series: &S,
) -> u64 {
    telemetry
        .metrics()
        .get(series)
        .unwrap_or_else(|| panic!("{series:?} is not registered"))
}

/// The admin token of the tests' admin servers ([`AdminTable::token`]).
pub const TOKEN: &str = "test-admin-token";

/// How long any one expectation of a test (a record on a topic, an event,
/// a commit) may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// [`PATIENCE`] for a route whose handler is a Python or JavaScript
/// component: loading one compiles 12-21 MB of Wasm in the dev profile.
pub const COMPILE_PATIENCE: Duration = Duration::from_secs(240);

/// Reads hopper's events until `found` returns a value, and returns it;
/// panics after [`PATIENCE`], saying it waited for `what`. `found` sees
/// every event, so it may also count or collect on the way.
pub async fn wait_for_event<T>(
    events: &mut tokio::sync::broadcast::Receiver<hopper::events::Event>,
    what: &str,
    found: impl FnMut(&hopper::events::Event) -> Option<T>,
) -> T {
    wait_for_event_within(events, PATIENCE, what, found).await
}

/// [`wait_for_event`], failing after `patience`.
pub async fn wait_for_event_within<T>(
    events: &mut tokio::sync::broadcast::Receiver<hopper::events::Event>,
    patience: Duration,
    what: &str,
    mut found: impl FnMut(&hopper::events::Event) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(event)) => {
                if let Some(value) = found(&event) {
                    return value;
                }
            }
            Ok(Err(e)) => panic!("waiting for {what}: the event stream failed: {e}"),
            Err(_) => panic!("waited {patience:?} for {what}, in vain"),
        }
    }
}

/// One HTTP/1.1 exchange with hopper's admin server, over a plain TCP
/// connection (no client library of hopper's own): the status code and the
/// body.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    let body = body.unwrap_or_default();
    if !body.is_empty() {
        request.push_str("Content-Type: application/json\r\n");
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response))
        .await
        .expect("the admin server answers within 60s")
        .unwrap();
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP response");
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let body = &response[split + 4..];
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_vec()
    };
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The body of a chunked HTTP response.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line) = body.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&body[..line]).unwrap_or("0");
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let rest = &body[line + 2..];
        out.extend_from_slice(&rest[..size]);
        body = &rest[(size + 2).min(rest.len())..];
    }
    out
}

/// `GET path` as JSON, expecting 200.
pub async fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    get_json_as(addr, path, None).await
}

/// `GET path` as JSON with the admin `token`, expecting 200: a server with
/// a token configured answers no API call without it.
pub async fn get_json_as(addr: SocketAddr, path: &str, token: Option<&str>) -> serde_json::Value {
    let (status, body) = http(addr, "GET", path, token, None).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// The languages `hopper plugin new` has templates for.
pub const TEMPLATES: [&str; 4] = ["rust", "python", "js", "c"];

/// The cargo target dir the test binaries were built in: its `tools`
/// holds the toolchains `cargo xtask build-plugins` installed.
pub fn target_dir() -> PathBuf {
    hopper_bin()
        .parent()
        .and_then(Path::parent)
        .expect("hopper lives in <target>/<profile>/")
        .to_path_buf()
}

/// Runs `run` for every template language side by side, each on a thread
/// of its own (each spends most of its time in one single-threaded tool),
/// in a directory of its own under `root`; the results in the order of
/// [`TEMPLATES`].
pub fn per_template<T: Send + 'static>(root: &Path, run: fn(&'static str, PathBuf) -> T) -> Vec<T> {
    let runs: Vec<_> = TEMPLATES
        .into_iter()
        .map(|lang| {
            let root = root.to_path_buf();
            std::thread::spawn(move || run(lang, root))
        })
        .collect();
    runs.into_iter().map(|r| r.join().unwrap()).collect()
}

/// `POST /api/replay` with `body`, a filter's selection: a run of the
/// admin server, answered 202. Waits until the run is no longer `running`
/// and returns its status.
pub async fn replay_run(
    addr: SocketAddr,
    token: Option<&str>,
    body: &serde_json::Value,
) -> serde_json::Value {
    let (status, answer) = http(addr, "POST", "/api/replay", token, Some(&body.to_string())).await;
    assert_eq!(status, 202, "{answer}");
    let started: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let run = started["run"].as_str().expect("the answer names the run");
    assert_eq!(started["status"], format!("/api/replay/runs/{run}"));
    run_ended(addr, token, run).await
}

/// The status of replay run `run` once it is no longer `running`, read
/// every 50 ms for at most [`PATIENCE`].
pub async fn run_ended(addr: SocketAddr, token: Option<&str>, run: &str) -> serde_json::Value {
    let path = format!("/api/replay/runs/{run}");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = get_json_as(addr, &path, token).await;
        if status["state"] != "running" {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "run {run} still runs after {PATIENCE:?}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
