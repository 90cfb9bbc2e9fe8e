//! Kafka clients with hopper's delivery guarantees, and topic provisioning.
//!
//! Producers are idempotent with `acks=all`; consumers store offsets only when
//! hopper says so (`enable.auto.offset.store=false`) and commit what was
//! stored in the background, every 100 ms, and on shutdown. Together with "store after the
//! hop's produce is acknowledged" this gives at-least-once delivery.

pub mod compacted;
pub mod watch;

pub use watch::{CONNECT_DEADLINE, ConnectionWatch, WatchedContext};

use crate::config::{ConfigError, KafkaConfig};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::FutureProducer;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The prefetched bytes (in KiB) librdkafka keeps, at most, per assigned
/// partition: a partition's queue is its own once split off, and the
/// setting then applies to each.
pub const QUEUED_KBYTES: usize = 8 * 1024;
/// The messages librdkafka tries to keep prefetched per partition.
pub const QUEUED_MIN_MESSAGES: usize = 20_000;
/// How long librdkafka waits, once a partition's queue holds
/// `queued.min.messages` or `queued.max.messages.kbytes`, before it looks
/// at the queue again to fetch more. Its default, 1 s, idled a consumer
/// catching up a backlog for most of each second: the partition's task
/// emptied 20,000 queued messages in a fraction of it, then waited for the
/// next fetch (BENCHMARKS.md, the parked rows). A look costs no request.
pub const FETCH_QUEUE_BACKOFF_MS: usize = 10;

/// The hops a pipeline's producer holds, at most, before the broker
/// acknowledges them: a route that fails faster than the broker takes its
/// hops waits for room, instead of leaving a backlog that goes on costing
/// the producer's threads and the broker after it has stopped
/// (docs/scaling.md). `queue.buffering.max.messages` in `kafka.properties`
/// sets it otherwise; librdkafka's own queue is given twice as many, since
/// it frees its count of a batch of delivery reports only after hopper has
/// handled the whole batch.
pub const HOPS_HELD: usize = 5_000;

/// How often a failing connection is tried again, for `/ready`.
pub const RECOVERY_PROBE_EVERY: Duration = Duration::from_secs(5);

/// How long metadata and admin calls may take before startup gives up.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// librdkafka's own error.
pub use rdkafka::error::KafkaError as ClientError;

/// What went wrong talking to Kafka: each names the brokers, the topics or
/// what hopper was doing.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// No broker answered, or one refused the client's settings or
    /// credentials.
    #[error("cannot connect to Kafka at {brokers}: {cause}")]
    Connect { brokers: String, cause: String },
    /// The Kafka client refused its settings before it tried a broker: a
    /// property of `kafka.properties` it does not know, or a value it does
    /// not accept. `cause` is librdkafka's words, which name the property.
    #[error("the Kafka client refuses its settings: {cause}; check kafka.properties")]
    Settings { cause: String },
    #[error("cannot read topic metadata from {brokers}: {error}")]
    Metadata { brokers: String, error: ClientError },
    #[error("{} topic(s) are missing and kafka.create_topics is false: {}", missing.len(), missing.join(", "))]
    Missing { missing: Vec<String> },
    #[error("cannot create topics: {}", failures.join("; "))]
    CreateTopics { failures: Vec<String> },
    /// A compacted topic hopper keeps a table in (`what`: the cancellation
    /// topic, a park topic) could not be created.
    #[error("cannot create the {what} `{topic}`: {code}")]
    CreateTable {
        what: &'static str,
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("topics were created but never appeared in metadata: {}", topics.join(", "))]
    NotInMetadata { topics: Vec<String> },
    #[error("the {what} `{topic}` has no partitions")]
    NoPartitions { what: &'static str, topic: String },
    #[error("reading the {what} `{topic}`: {error}")]
    ReadTable {
        what: &'static str,
        topic: String,
        error: ClientError,
    },
    /// librdkafka refused a call; `doing` says what hopper was doing.
    #[error("{doing}")]
    Client {
        doing: String,
        #[source]
        source: ClientError,
    },
    #[error(transparent)]
    Librdkafka(#[from] ClientError),
    /// A route's pipeline (`route `name``) or the relay's (`the delay
    /// relay`) could not be built or started.
    #[error("starting {pipeline}")]
    Pipeline {
        pipeline: String,
        #[source]
        source: Box<KafkaError>,
    },
    #[error("loading the delay relay's cancellation table")]
    CancelTable(#[source] Box<KafkaError>),
    /// A route's park table (`retry_order = "key"`) could not be loaded.
    #[error("loading the park table of route `{route}`")]
    ParkTable {
        route: String,
        #[source]
        source: Box<KafkaError>,
    },
}

/// Says what hopper was doing when librdkafka refused a call.
pub trait Doing<T> {
    fn doing(self, doing: impl FnOnce() -> String) -> Result<T, KafkaError>;
}

impl<T> Doing<T> for Result<T, ClientError> {
    fn doing(self, doing: impl FnOnce() -> String) -> Result<T, KafkaError> {
        self.map_err(|source| KafkaError::Client {
            doing: doing(),
            source,
        })
    }
}

/// Where the clients connect, and the extra properties they carry.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub brokers: String,
    pub kafka: KafkaConfig,
    watch: Arc<ConnectionWatch>,
}

impl std::fmt::Debug for ConnectionWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionWatch")
            .field("failures", &self.failures())
            .field("failing", &self.failing())
            .finish()
    }
}

impl Cluster {
    /// The cluster at `brokers`, reached with the `[kafka]` table's
    /// properties (`kafka.brokers` is not read).
    pub fn new(brokers: impl Into<String>, kafka: KafkaConfig) -> Cluster {
        let watch = Arc::new(ConnectionWatch::default());
        watch.set_secrets(kafka.secrets.clone());
        watch.set_tls(kafka.speaks_tls());
        Cluster {
            brokers: brokers.into(),
            kafka,
            watch,
        }
    }

    /// What this cluster's clients report about the connection.
    pub fn watch(&self) -> &Arc<ConnectionWatch> {
        &self.watch
    }

    /// The context of a short-lived client called `name`.
    pub fn watched(&self, name: &'static str) -> WatchedContext {
        WatchedContext {
            name,
            watch: self.watch.clone(),
            quiet: false,
        }
    }

    /// Checks that a broker answers and accepts hopper's credentials, before
    /// anything starts. Fails at once on an authentication or TLS failure,
    /// and after [`CONNECT_DEADLINE`] when no broker answers, with the cause
    /// in words an operator can act on. Blocks: call it off the runtime.
    pub fn check_connection(&self) -> Result<(), KafkaError> {
        let failure: Arc<Mutex<Option<watch::Failure>>> = Arc::default();
        let last: Arc<Mutex<Option<String>>> = Arc::default();
        let probe = Probe {
            failure: failure.clone(),
            closed_early: Default::default(),
            last: last.clone(),
            watch: self.watch.clone(),
        };
        let client: BaseConsumer<Probe> = self
            .base()
            // Its broker failures are logged at info (a connection closed
            // during the first request), not reported as errors.
            .set_log_level(rdkafka::config::RDKafkaLogLevel::Info)
            .create_with_context(probe)
            .map_err(|e| self.refused_settings(&e))?;
        let started = Instant::now();
        loop {
            let answer = client.fetch_metadata(None, Duration::from_millis(500));
            // A consumer's errors reach its context only when it is polled.
            while client.poll(Duration::ZERO).is_some() {}
            if let Some(failure) = failure.lock().unwrap().take() {
                return Err(self.cannot_connect(failure.cause));
            }
            match answer {
                Ok(_) => return Ok(()),
                Err(e) if started.elapsed() >= CONNECT_DEADLINE => {
                    let last = last
                        .lock()
                        .unwrap()
                        .clone()
                        .unwrap_or_else(|| e.to_string());
                    return Err(self.cannot_connect(format!(
                        "no broker answered within {}s: {last}; check kafka.brokers and that the brokers are reachable",
                        CONNECT_DEADLINE.as_secs()
                    )));
                }
                Err(_) => {}
            }
        }
    }

    /// While the clients report a failing connection, tries one every
    /// [`RECOVERY_PROBE_EVERY`] with a client of its own, and tells the
    /// watch when one succeeds: `/ready` is true again. Ends on `shutdown`.
    pub fn follow_recovery(&self, shutdown: tokio_util::sync::CancellationToken) {
        let cluster = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(RECOVERY_PROBE_EVERY) => {}
                }
                if cluster.watch.failing().is_none() {
                    continue;
                }
                let probe = cluster.clone();
                let answered = tokio::task::spawn_blocking(move || probe.answers())
                    .await
                    .unwrap_or(false);
                if answered {
                    cluster.watch.recovered();
                }
            }
        });
    }

    /// Whether a new client reads the cluster's metadata: it connected and
    /// authenticated. Blocks.
    fn answers(&self) -> bool {
        let Ok(client) = self
            .base()
            .create_with_context::<_, BaseConsumer<WatchedContext>>(
                self.watched("connection probe"),
            )
        else {
            return false;
        };
        client.fetch_metadata(None, Duration::from_secs(5)).is_ok()
    }

    /// librdkafka refused the client's settings.
    fn refused_settings(&self, e: &ClientError) -> KafkaError {
        let cause = match e {
            // librdkafka's description, then the entry as set. Its value is
            // left out wherever it stands: a misspelt secret's name is not
            // known to be a secret.
            ClientError::ClientConfig(_, description, key, value) => {
                // `value 99 is outside allowed range`, `Invalid value "x"`.
                let mut cause = if value.is_empty() {
                    description.clone()
                } else {
                    description
                        .replace(&format!("value {value} "), "value … ")
                        .replace(&format!("\"{value}\""), "\"…\"")
                };
                if !cause.contains(&format!("\"{key}\"")) {
                    cause.push_str(&format!(" (set as {key})"));
                }
                cause
            }
            ClientError::ClientCreation(text) => text.clone(),
            other => other.to_string(),
        };
        let mut cause = self.kafka.redact(&cause).into_owned();
        // "Unsupported SASL mechanism: X", "Unsupported hash function: X
        // (try SCRAM-SHA-512)" for SCRAM-SHA-999, a `sasl.*` property.
        let lower = cause.to_ascii_lowercase();
        if lower.contains("sasl") || lower.contains("hash function") {
            cause.push_str(
                " (sasl.mechanism is one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, GSSAPI)",
            );
        }
        KafkaError::Settings { cause }
    }

    fn cannot_connect(&self, cause: String) -> KafkaError {
        KafkaError::Connect {
            brokers: self.brokers.clone(),
            cause: self.kafka.redact(&cause).into_owned(),
        }
    }

    /// The cluster `kafka.brokers` names. Fails when it names none: the
    /// embedded broker is started only when asked for
    /// ([`crate::embedded::EmbeddedBroker::serve`]).
    pub fn of(kafka: &KafkaConfig) -> Result<Cluster, ConfigError> {
        let brokers = kafka
            .brokers
            .clone()
            .filter(|b| !b.trim().is_empty())
            .ok_or(ConfigError::NoBrokers)?;
        Ok(Cluster::new(brokers, kafka.clone()))
    }

    fn base(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (key, value) in &self.kafka.properties {
            config.set(key, value);
        }
        config
    }

    /// An idempotent, acks=all producer.
    pub fn producer(&self) -> Result<FutureProducer, ClientError> {
        self.producer_config().create()
    }

    /// Settings of an idempotent, acks=all producer. `kafka.properties`
    /// may set its batching and queue otherwise, not its guarantees.
    pub fn producer_config(&self) -> ClientConfig {
        let mut config = self.base();
        config.set("enable.idempotence", "true").set("acks", "all");
        if !self.kafka.properties.contains_key("linger.ms") {
            config.set("linger.ms", "2");
        }
        // A value that is not a number goes to librdkafka as it is, which
        // refuses it by name. Twice a bound near librdkafka's own limit is
        // its limit.
        if let Ok(held) = self.hops_held() {
            let queue = held.saturating_mul(2).min(i32::MAX as usize);
            config.set("queue.buffering.max.messages", queue.to_string());
        }
        config
    }

    /// The hops a pipeline's producer holds before the broker acknowledges
    /// them: `queue.buffering.max.messages` from `kafka.properties`, or
    /// [`HOPS_HELD`].
    pub fn hops_held(&self) -> Result<usize, std::num::ParseIntError> {
        self.kafka
            .properties
            .get("queue.buffering.max.messages")
            .map_or(Ok(HOPS_HELD), |v| v.trim().parse())
    }

    /// Consumer settings for a group whose offsets hopper stores by hand.
    pub fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut config = self.base();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "true")
            // With the pipeline's 50 ms store tick, a done offset is
            // committed within ~150 ms (plus the commit's round trip): what a
            // kill -9 makes hopper do again is the calls in flight and about
            // that much work, not the second a 1 s interval left. A commit
            // carries only partitions whose stored offset moved, and is
            // asynchronous: never a commit per message.
            .set("auto.commit.interval.ms", "100")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            // A resumed tier partition is fetched in the broker's next fetch
            // request; a long-polling fetch would hold it up to this long.
            .set("fetch.wait.max.ms", "20")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000");
        // Each partition's queue is split off the main queue, so these bound
        // every assigned partition's prefetch on its own: memory for
        // prefetched messages is at most partitions × QUEUED_KBYTES
        // (docs/scaling.md). `kafka.properties` may set them otherwise.
        for (key, default) in [
            ("queued.max.messages.kbytes", QUEUED_KBYTES),
            ("queued.min.messages", QUEUED_MIN_MESSAGES),
            ("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS),
        ] {
            if !self.kafka.properties.contains_key(key) {
                config.set(key, default.to_string());
            }
        }
        // Round-robin spreads a route's input and tiers over the members
        // (range gives partition 0 of every topic to the same one);
        // `range` second, so a group still running an older hopper agrees
        // on it until the last of those leaves (docs/scaling.md).
        if !self
            .kafka
            .properties
            .contains_key("partition.assignment.strategy")
        {
            config.set("partition.assignment.strategy", "roundrobin,range");
        }
        config
    }

    /// Topics that exist on the cluster.
    pub fn existing_topics(&self) -> Result<BTreeSet<String>, KafkaError> {
        let consumer: BaseConsumer<WatchedContext> =
            self.base().create_with_context(self.watched("metadata"))?;
        let metadata = consumer
            .fetch_metadata(None, ADMIN_TIMEOUT)
            .map_err(|error| KafkaError::Metadata {
                brokers: self.brokers.clone(),
                error,
            })?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| t.name().to_string())
            .collect())
    }

    /// Makes sure every topic in `wanted` exists: creates the missing ones
    /// when the config allows it, and otherwise fails naming all of them.
    pub async fn ensure_topics(
        &self,
        wanted: &BTreeSet<String>,
    ) -> Result<Vec<String>, KafkaError> {
        let existing = self.existing_topics()?;
        let missing: Vec<String> = wanted.difference(&existing).cloned().collect();
        if missing.is_empty() {
            return Ok(missing);
        }
        if !self.kafka.create_topics {
            return Err(KafkaError::Missing { missing });
        }
        let admin: AdminClient<WatchedContext> =
            self.base().create_with_context(self.watched("admin"))?;
        let new: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|name| {
                NewTopic::new(
                    name,
                    self.kafka.partitions,
                    TopicReplication::Fixed(self.kafka.replication),
                )
            })
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let results = admin.create_topics(&new, &options).await?;
        let mut failures = Vec::new();
        for result in results {
            match result {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => failures.push(format!("{topic}: {code}")),
            }
        }
        if !failures.is_empty() {
            return Err(KafkaError::CreateTopics { failures });
        }
        self.wait_for_topics(&missing).await?;
        if self.kafka.replication == 1 {
            // One broker's disk is then the only copy of every message
            // waiting in these topics (docs/scaling.md).
            tracing::warn!(
                topics = missing.join(", "),
                "Topics created with replication 1: a broker lost loses their messages; set kafka.replication (3 in production) or create them beforehand."
            );
        }
        Ok(missing)
    }

    /// New topics take a moment to show up in metadata with leaders.
    async fn wait_for_topics(&self, topics: &[String]) -> Result<(), KafkaError> {
        let deadline = tokio::time::Instant::now() + ADMIN_TIMEOUT;
        loop {
            let existing = self.existing_topics()?;
            let pending: Vec<&String> = topics.iter().filter(|t| !existing.contains(*t)).collect();
            if pending.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(KafkaError::NotInMetadata {
                    topics: pending.into_iter().cloned().collect(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The context of [`Cluster::check_connection`]'s client: it keeps the
/// first failure that retrying does not heal, and the last error of any
/// kind, for the line that says why it could not connect.
struct Probe {
    failure: Arc<Mutex<Option<watch::Failure>>>,
    /// Connections the broker closed at the first request.
    closed_early: std::sync::atomic::AtomicU32,
    last: Arc<Mutex<Option<String>>>,
    watch: Arc<ConnectionWatch>,
}

impl rdkafka::ClientContext for Probe {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        // The failure is told once, by the check's error; what librdkafka
        // logs about it meanwhile would say it again. A broker's failure
        // that librdkafka only logs (a plaintext client on a TLS listener)
        // is kept as the last error, and classified as one.
        if fac != "FAIL" {
            self.watch.log(level, fac, message);
            return;
        }
        let message = self.watch.redact(message);
        tracing::debug!(fac, "{message}");
        *self.last.lock().unwrap() = Some(message.to_string());
        let transport = rdkafka::error::KafkaError::Global(
            rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure,
        );
        // Twice: a broker that is starting may close one connection early.
        if let Some(failure) = watch::failure_of(&transport, &message, self.watch.tls())
            && self
                .closed_early
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                >= 1
        {
            self.failure.lock().unwrap().get_or_insert(failure);
        }
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        let reason = self.watch.redact(reason);
        tracing::debug!(error = %error, "{reason}");
        *self.last.lock().unwrap() = Some(reason.to_string());
        if let Some(failure) = watch::failure_of(&error, &reason, self.watch.tls()) {
            self.failure.lock().unwrap().get_or_insert(failure);
        }
    }
}

impl rdkafka::consumer::ConsumerContext for Probe {}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(properties: &[(&str, &str)]) -> Cluster {
        let mut kafka = KafkaConfig::default();
        for (key, value) in properties {
            kafka.properties.insert(key.to_string(), value.to_string());
        }
        Cluster::new("127.0.0.1:9092", kafka)
    }

    #[test]
    fn each_partitions_prefetch_is_bounded_unless_the_config_says_otherwise() {
        let defaults = cluster(&[]).consumer_config("g");
        assert_eq!(defaults.get("queued.max.messages.kbytes"), Some("8192"));
        assert_eq!(defaults.get("queued.min.messages"), Some("20000"));
        assert_eq!(defaults.get("fetch.queue.backoff.ms"), Some("10"));
        let chosen = cluster(&[
            ("queued.max.messages.kbytes", "1024"),
            ("fetch.queue.backoff.ms", "500"),
        ])
        .consumer_config("g");
        assert_eq!(chosen.get("queued.max.messages.kbytes"), Some("1024"));
        assert_eq!(chosen.get("queued.min.messages"), Some("20000"));
        assert_eq!(chosen.get("fetch.queue.backoff.ms"), Some("500"));
    }

    #[test]
    fn the_producers_queue_is_bounded_and_its_guarantees_kept_whatever_the_config_says() {
        let defaults = cluster(&[]).producer_config();
        assert_eq!(cluster(&[]).hops_held(), Ok(5000));
        assert_eq!(defaults.get("queue.buffering.max.messages"), Some("10000"));
        assert_eq!(defaults.get("linger.ms"), Some("2"));
        let chosen = cluster(&[
            ("queue.buffering.max.messages", "100000"),
            ("linger.ms", "20"),
            ("acks", "1"),
            ("enable.idempotence", "false"),
        ]);
        assert_eq!(chosen.hops_held(), Ok(100000));
        let chosen = chosen.producer_config();
        assert_eq!(chosen.get("queue.buffering.max.messages"), Some("200000"));
        assert_eq!(chosen.get("linger.ms"), Some("20"));
        assert_eq!(chosen.get("acks"), Some("all"));
        assert_eq!(chosen.get("enable.idempotence"), Some("true"));
        // Near librdkafka's limit, its limit: not a value it refuses.
        let most = cluster(&[("queue.buffering.max.messages", "2000000000")]).producer_config();
        assert_eq!(most.get("queue.buffering.max.messages"), Some("2147483647"));
        assert!(most.create::<FutureProducer>().is_ok());
        // Not a number: librdkafka is given it, and refuses it by name.
        let wrong = cluster(&[("queue.buffering.max.messages", "many")]);
        assert!(wrong.hops_held().is_err());
        let refused = wrong.producer_config().create::<FutureProducer>().err();
        let refused = refused.expect("librdkafka refuses it").to_string();
        assert!(
            refused.contains("queue.buffering.max.messages"),
            "{refused}"
        );
    }

    /// What `check_connection` says of settings librdkafka refuses, before
    /// it tries a broker (none listens on the address).
    fn refused(properties: &[(&str, &str)]) -> String {
        match cluster(properties).check_connection() {
            Err(e @ KafkaError::Settings { .. }) => e.to_string(),
            other => panic!("not refused as settings: {other:?}"),
        }
    }

    #[test]
    fn settings_the_client_refuses_are_named_without_their_values() {
        let unknown = refused(&[("no.such.property", "1")]);
        assert_eq!(
            unknown,
            "the Kafka client refuses its settings: No such configuration property: \"no.such.property\"; check kafka.properties"
        );
        let alias = refused(&[("linger.ms", "soon")]);
        assert!(
            alias.contains("\"queue.buffering.max.ms\" (set as linger.ms)"),
            "{alias}"
        );
        assert!(!alias.contains("soon"), "{alias}");
        let range = refused(&[("linger.ms", "99999999999999999999")]);
        assert!(range.contains("outside allowed range 0..900000"), "{range}");
        assert!(!range.contains("9999999999"), "{range}");
        assert!(range.contains("(set as linger.ms)"), "{range}");
        // A misspelt secret is not known to be one: its value stays out.
        let typo = refused(&[("sasl.pasword", "hunter2-secret")]);
        assert!(typo.contains("\"sasl.pasword\""), "{typo}");
        assert!(!typo.contains("hunter2"), "{typo}");
        let mechanism = refused(&[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanism", "NOPE"),
            ("sasl.username", "user"),
            ("sasl.password", "a-long-password"),
        ]);
        assert!(
            mechanism.contains("Unsupported SASL mechanism: NOPE"),
            "{mechanism}"
        );
        assert!(mechanism.contains("SCRAM-SHA-512"), "{mechanism}");
    }
}
