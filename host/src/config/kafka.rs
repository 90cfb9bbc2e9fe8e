//! `[kafka]`: how hopper reaches Kafka, and the client properties it
//! guards.

use serde::Deserialize;
use std::collections::BTreeMap;

/// Properties hopper sets itself; a config that sets them is rejected,
/// because changing them would break the delivery guarantees.
pub const PROTECTED_PROPERTIES: [&str; 7] = [
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.idempotence",
    "acks",
    "isolation.level",
];

/// How hopper reaches Kafka.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers. When absent, hopper starts an embedded in-process
    /// broker on 127.0.0.1 (for demos and trials, not production).
    pub brokers: Option<String>,
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
        for key in self.properties.keys() {
            if PROTECTED_PROPERTIES.contains(&key.as_str()) {
                problems.push(format!(
                    "kafka.properties.\"{key}\" is set by hopper itself and cannot be overridden"
                ));
            }
        }
    }
}
