//! Kafka clients with hopper's delivery guarantees, and topic provisioning.
//!
//! Producers are idempotent with `acks=all`; consumers store offsets only when
//! hopper says so (`enable.auto.offset.store=false`) and commit what was
//! stored in the background, every 100 ms, and on shutdown. Together with "store after the
//! hop's produce is acknowledged" this gives at-least-once delivery.

use crate::config::KafkaConfig;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::FutureProducer;
use std::collections::BTreeSet;
use std::time::Duration;

/// The prefetched bytes (in KiB) librdkafka keeps, at most, per assigned
/// partition: a partition's queue is its own once split off, and the
/// setting then applies to each.
pub const QUEUED_KBYTES: usize = 8 * 1024;
/// The messages librdkafka tries to keep prefetched per partition.
pub const QUEUED_MIN_MESSAGES: usize = 20_000;

/// The hops a pipeline's producer holds, at most, before the broker
/// acknowledges them: a route that fails faster than the broker takes its
/// hops waits for room, instead of leaving a backlog that goes on costing
/// the producer's threads and the broker after it has stopped
/// (docs/scaling.md). `queue.buffering.max.messages` in `kafka.properties`
/// sets it otherwise; librdkafka's own queue is given twice as many, since
/// it frees its count of a batch of delivery reports only after hopper has
/// handled the whole batch.
pub const HOPS_HELD: usize = 5_000;

/// How long metadata and admin calls may take before startup gives up.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the clients connect, and the extra properties they carry.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub brokers: String,
    pub kafka: KafkaConfig,
}

impl Cluster {
    /// The cluster `kafka.brokers` names. Fails when it names none: the
    /// embedded broker is started only when asked for
    /// ([`crate::embedded::EmbeddedBroker::serve`]).
    pub fn of(kafka: &KafkaConfig) -> anyhow::Result<Cluster> {
        let brokers = kafka
            .brokers
            .clone()
            .filter(|b| !b.trim().is_empty())
            .ok_or_else(|| {
                anyhow::anyhow!("no brokers: set kafka.brokers in the config or pass --brokers")
            })?;
        Ok(Cluster {
            brokers,
            kafka: kafka.clone(),
        })
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
    pub fn producer(&self) -> anyhow::Result<FutureProducer> {
        Ok(self.producer_config().create()?)
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
        ] {
            if !self.kafka.properties.contains_key(key) {
                config.set(key, default.to_string());
            }
        }
        config
    }

    /// Topics that exist on the cluster.
    pub fn existing_topics(&self) -> anyhow::Result<BTreeSet<String>> {
        let consumer: BaseConsumer = self.base().create()?;
        let metadata = consumer.fetch_metadata(None, ADMIN_TIMEOUT).map_err(|e| {
            anyhow::anyhow!("cannot read topic metadata from {}: {e}", self.brokers)
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
    pub async fn ensure_topics(&self, wanted: &BTreeSet<String>) -> anyhow::Result<Vec<String>> {
        let existing = self.existing_topics()?;
        let missing: Vec<String> = wanted.difference(&existing).cloned().collect();
        if missing.is_empty() {
            return Ok(missing);
        }
        if !self.kafka.create_topics {
            anyhow::bail!(
                "{} topic(s) are missing and kafka.create_topics is false: {}",
                missing.len(),
                missing.join(", ")
            );
        }
        let admin: AdminClient<DefaultClientContext> = self.base().create()?;
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
            anyhow::bail!("cannot create topics: {}", failures.join("; "));
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
    async fn wait_for_topics(&self, topics: &[String]) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + ADMIN_TIMEOUT;
        loop {
            let existing = self.existing_topics()?;
            let pending: Vec<&String> = topics.iter().filter(|t| !existing.contains(*t)).collect();
            if pending.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(
                    "topics were created but never appeared in metadata: {}",
                    pending
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(properties: &[(&str, &str)]) -> Cluster {
        let mut kafka = KafkaConfig::default();
        for (key, value) in properties {
            kafka.properties.insert(key.to_string(), value.to_string());
        }
        Cluster {
            brokers: "127.0.0.1:9092".into(),
            kafka,
        }
    }

    #[test]
    fn each_partitions_prefetch_is_bounded_unless_the_config_says_otherwise() {
        let defaults = cluster(&[]).consumer_config("g");
        assert_eq!(defaults.get("queued.max.messages.kbytes"), Some("8192"));
        assert_eq!(defaults.get("queued.min.messages"), Some("20000"));
        let chosen = cluster(&[("queued.max.messages.kbytes", "1024")]).consumer_config("g");
        assert_eq!(chosen.get("queued.max.messages.kbytes"), Some("1024"));
        assert_eq!(chosen.get("queued.min.messages"), Some("20000"));
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
}
