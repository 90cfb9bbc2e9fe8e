//! How many messages wait: per topic, the high watermark less the offset a
//! consumer group committed, read straight from the brokers. Used by the
//! running hopper's lag sampler (`hopper_pending_messages`) and by
//! `hopper status`, which needs no running hopper.
//!
//! Every call here blocks on broker round trips; async callers run it on
//! the blocking pool.

use crate::config::Config;
use crate::health::Pending;
use crate::kafka::{Cluster, WatchedContext};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;

/// How long one broker round trip may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why the lag of a topic could not be read. Names the topic and group.
#[derive(Debug, thiserror::Error)]
pub enum LagError {
    #[error("cannot create a client for group `{group}`: {source}")]
    Client {
        group: String,
        source: rdkafka::error::KafkaError,
    },
    #[error("cannot read the metadata of topic `{topic}`: {source}")]
    Metadata {
        topic: String,
        source: rdkafka::error::KafkaError,
    },
    #[error("topic `{topic}` does not exist")]
    Missing { topic: String },
    #[error("cannot read the offsets group `{group}` committed: {source}")]
    Committed {
        group: String,
        source: rdkafka::error::KafkaError,
    },
    #[error("cannot read the watermarks of `{topic}` partition {partition}: {source}")]
    Watermarks {
        topic: String,
        partition: i32,
        source: rdkafka::error::KafkaError,
    },
}

/// One topic a pipeline reads, and its kind (`input`, `tier`, `inbox`).
pub struct Watched {
    pub pipeline: String,
    pub group: String,
    pub topic: String,
    pub kind: &'static str,
}

/// Every topic the pipelines of `config` read, with its group.
pub fn watched(config: &Config) -> Vec<Watched> {
    let mut out = Vec::new();
    for route in &config.routes {
        let mut push = |topic: &str, kind| {
            out.push(Watched {
                pipeline: route.name.clone(),
                group: route.group.clone(),
                topic: topic.to_string(),
                kind,
            })
        };
        route.topics.iter().for_each(|t| push(t, "input"));
        route.tiers().iter().for_each(|(_, t)| push(t, "tier"));
    }
    if let Some(relay) = &config.delay {
        let mut push = |topic: &str, kind| {
            out.push(Watched {
                pipeline: crate::config::RELAY_ROUTE.to_string(),
                group: relay.group.clone(),
                topic: topic.to_string(),
                kind,
            })
        };
        push(&relay.inbox, "inbox");
        relay.tiers.iter().for_each(|(_, t)| push(t, "tier"));
    }
    out
}

/// Reads lag, keeping one client per consumer group between samples.
#[derive(Default)]
pub struct Sampler {
    clients: std::collections::HashMap<String, BaseConsumer<WatchedContext>>,
}

impl Sampler {
    /// Pending messages of every watched topic.
    pub fn pending(
        &mut self,
        cluster: &Cluster,
        watched: &[Watched],
    ) -> Result<Vec<Pending>, LagError> {
        watched
            .iter()
            .map(|w| {
                Ok(Pending {
                    pipeline: w.pipeline.clone(),
                    topic: w.topic.clone(),
                    kind: w.kind,
                    messages: self.topic_lag(cluster, &w.group, &w.topic)?,
                })
            })
            .collect()
    }

    /// Messages of `topic` that `group` has not committed yet, summed over
    /// its partitions. A partition the group never committed counts from
    /// its low watermark, as `auto.offset.reset = earliest` reads it.
    pub fn topic_lag(
        &mut self,
        cluster: &Cluster,
        group: &str,
        topic: &str,
    ) -> Result<i64, LagError> {
        let consumer =
            match self.clients.entry(group.to_string()) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let mut config = cluster.consumer_config(group);
                    // Reads committed offsets without joining the group.
                    config.set("enable.auto.commit", "false");
                    e.insert(config.create_with_context(cluster.watched("lag")).map_err(
                        |source| LagError::Client {
                            group: group.to_string(),
                            source,
                        },
                    )?)
                }
            };
        let partitions = partitions(consumer, topic)?;
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            tpl.add_partition(topic, *p);
        }
        let committed =
            consumer
                .committed_offsets(tpl, TIMEOUT)
                .map_err(|source| LagError::Committed {
                    group: group.to_string(),
                    source,
                })?;
        let mut pending = 0;
        for p in partitions {
            let (low, high) = watermarks(consumer, topic, p)?;
            let from = match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(committed)) => committed.max(low),
                _ => low,
            };
            pending += (high - from).max(0);
        }
        Ok(pending)
    }
}

/// Records in `topic` now: the sum of high less low watermarks.
pub fn topic_size(cluster: &Cluster, topic: &str) -> Result<i64, LagError> {
    let consumer: BaseConsumer<WatchedContext> = cluster
        .consumer_config(crate::config::STATUS_GROUP)
        .create_with_context(cluster.watched("status"))
        .map_err(|source| LagError::Client {
            group: crate::config::STATUS_GROUP.into(),
            source,
        })?;
    let mut size = 0;
    for p in partitions(&consumer, topic)? {
        let (low, high) = watermarks(&consumer, topic, p)?;
        size += high - low;
    }
    Ok(size)
}

/// The partitions of `topic`.
pub fn partitions(
    consumer: &BaseConsumer<WatchedContext>,
    topic: &str,
) -> Result<Vec<i32>, LagError> {
    let metadata = consumer
        .fetch_metadata(Some(topic), TIMEOUT)
        .map_err(|source| LagError::Metadata {
            topic: topic.to_string(),
            source,
        })?;
    let found = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        .ok_or_else(|| LagError::Missing {
            topic: topic.to_string(),
        })?;
    Ok(found.partitions().iter().map(|p| p.id()).collect())
}

/// (low, high) watermarks of one partition.
pub fn watermarks(
    consumer: &BaseConsumer<WatchedContext>,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64), LagError> {
    consumer
        .fetch_watermarks(topic, partition, TIMEOUT)
        .map_err(|source| LagError::Watermarks {
            topic: topic.to_string(),
            partition,
            source,
        })
}

/// How often a running hopper samples lag for `hopper_pending_messages`.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Samples the lag of `watched` into `health` every [`SAMPLE_EVERY`], on
/// the blocking pool, until `shutdown`.
pub fn spawn_sampler(
    cluster: Cluster,
    watched: Vec<Watched>,
    health: std::sync::Arc<crate::health::Health>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    tokio::spawn(async move {
        let mut sampler = Sampler::default();
        let watched = std::sync::Arc::new(watched);
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (cluster, watched) = (cluster.clone(), watched.clone());
            let sampled = tokio::task::spawn_blocking(move || {
                let result = sampler.pending(&cluster, &watched);
                (sampler, result)
            })
            .await;
            let Ok((back, result)) = sampled else { return };
            sampler = back;
            if let Err(e) = &result {
                tracing::debug!(error = %e, "Lag not sampled.");
            }
            health.record_pending(result.map_err(|e| e.to_string()));
        }
    });
}
