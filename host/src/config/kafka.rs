//! `[kafka]`: how hopper reaches Kafka, and the client properties it
//! guards.

use serde::Deserialize;
use std::collections::BTreeMap;

/// Properties hopper sets itself; a config that sets them is rejected,
/// because changing them would break the delivery guarantees (with
/// `auto.offset.reset = latest`, a tier whose group offsets expired would
/// skip the messages waiting in it).
pub const PROTECTED_PROPERTIES: [&str; 8] = [
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.idempotence",
    "acks",
    "isolation.level",
    "auto.offset.reset",
];

/// The most hops a producer may be set to hold
/// (`queue.buffering.max.messages`): librdkafka's own queue is given twice
/// as many, and takes at most `i32::MAX`.
pub const MAX_HOPS_HELD: u64 = i32::MAX as u64 / 2;

/// How hopper reaches Kafka.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers. Required, unless `embedded` is set (or `hopper
    /// run --embedded` is given, or `--brokers` names them).
    pub brokers: Option<String>,
    /// Run on an embedded in-process broker on 127.0.0.1 that keeps
    /// everything in memory: for demos and trials, never production. Off by
    /// default, so that a config that forgot its brokers fails at startup
    /// instead of taking traffic that is lost on exit.
    #[serde(default)]
    pub embedded: bool,
    /// Create missing topics at startup. When false, startup fails naming
    /// every missing topic instead.
    #[serde(default = "default_true")]
    pub create_topics: bool,
    /// Partitions of each topic hopper creates.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Replication factor of each topic hopper creates.
    #[serde(default = "default_replication")]
    pub replication: i32,
    /// Extra librdkafka properties for every client, for example
    /// `"security.protocol" = "ssl"`. Hopper's own delivery guarantees
    /// (acks, idempotence, manual offset storage) cannot be overridden.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: None,
            embedded: false,
            create_topics: true,
            partitions: default_partitions(),
            replication: default_replication(),
            properties: BTreeMap::new(),
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_partitions() -> i32 {
    3
}
fn default_replication() -> i32 {
    1
}

impl KafkaConfig {
    /// Adds every problem of this table to `problems`.
    pub(super) fn check(&self, problems: &mut Vec<String>) {
        if self.partitions < 1 {
            problems.push(format!(
                "kafka.partitions must be at least 1, not {}",
                self.partitions
            ));
        }
        if self.replication < 1 {
            problems.push(format!(
                "kafka.replication must be at least 1, not {}",
                self.replication
            ));
        }
        if self.embedded && self.brokers.is_some() {
            problems.push(
                "kafka.embedded = true and kafka.brokers are both set: remove one (the embedded broker is for trials only)"
                    .to_string(),
            );
        }
        for key in self.properties.keys() {
            if PROTECTED_PROPERTIES.contains(&key.as_str()) {
                problems.push(format!(
                    "kafka.properties.\"{key}\" is set by hopper itself and cannot be overridden"
                ));
            }
        }
        if let Some(held) = self.properties.get("queue.buffering.max.messages")
            && !held
                .trim()
                .parse::<u64>()
                .is_ok_and(|n| (1..=MAX_HOPS_HELD).contains(&n))
        {
            problems.push(format!(
                "kafka.properties.\"queue.buffering.max.messages\" must be a whole number of hops from 1 to {MAX_HOPS_HELD}, not {held:?}"
            ));
        }
    }
}
