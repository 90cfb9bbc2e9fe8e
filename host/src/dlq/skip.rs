//! Getting a partition past a batch its consumer cannot decode (a corrupt
//! batch, or one compressed with a codec this build lacks): `hopper skip`.
//!
//! librdkafka fetches such a batch again and again and never moves past it,
//! and it does not say where the batch ends. So, with every hopper of the
//! pipeline stopped (its group empty), this:
//! 1. reads the group's committed offset `S` on the partition: the first
//!    offset not done, which is where the pipeline is stuck;
//! 2. checks that `S` cannot be decoded, with a consumer of its own;
//! 3. finds the first offset after `S` that can be read (or the end), by
//!    bisection: an offset inside the bad batch fails as `S` does, one past
//!    it does not;
//! 4. writes one dead-letter record (reason `UNDECODABLE`, origin `S`,
//!    `hopper-last-error` naming the skipped range and librdkafka's error:
//!    the records themselves cannot be read);
//! 5. commits the first readable offset for the group, as its only member.

use crate::config::{Config, RELAY_ROUTE};
use crate::dlq::{Plan, plan};
use crate::headers::{Envelope, Incoming, Reason};
use crate::kafka::{Cluster, Doing as _, WatchedContext};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{OwnedHeaders, OwnedMessage, Timestamp};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// How long one look at an offset may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Whether a consumer error means the fetched batch cannot be decoded: it
/// is corrupt, or compressed with a codec this build lacks. librdkafka does
/// not move past such a batch.
pub fn is_undecodable(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        error.rdkafka_error_code(),
        Some(Code::BadCompression | Code::NotImplemented | Code::BadMessage | Code::InvalidMessage)
    )
}

/// What a skip found, and did unless it was a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub group: String,
    /// The first undecodable offset, and the first readable one after it
    /// (or the partition's end).
    pub from: i64,
    pub to: i64,
    /// librdkafka's error at `from`.
    pub error: String,
    /// The dead-letter record written, as `topic:partition:offset`.
    pub dead_letter: Option<String>,
}

/// What reading from one offset gives.
#[derive(Debug, PartialEq, Eq)]
enum Look {
    Readable,
    End,
    Undecodable(String),
}

/// Why a skip changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum SkipError {
    #[error("route `{0}` is not in the config")]
    UnknownRoute(String),
    #[error(
        "group `{group}` is {state} with {members} member(s): stop every hopper that runs `{route}` first (the skip commits for the group, which Kafka allows only while it is empty)"
    )]
    GroupActive {
        group: String,
        state: String,
        members: usize,
        route: String,
    },
    #[error(
        "{topic}[{partition}] reads fine at offset {from}, where group `{group}` stands: nothing to skip"
    )]
    Readable {
        topic: String,
        partition: i32,
        from: i64,
        group: String,
    },
    #[error(
        "{topic}[{partition}] has nothing at offset {from}, where group `{group}` stands: nothing to skip"
    )]
    End {
        topic: String,
        partition: i32,
        from: i64,
        group: String,
    },
    #[error("{topic}[{partition}] gave nothing at offset {offset} within {PROBE_TIMEOUT:?}")]
    Silent {
        topic: String,
        partition: i32,
        offset: i64,
    },
    #[error(
        "group `{group}` never assigned {topic}[{partition}] to the skip: is a hopper of it still running?"
    )]
    NotAssigned {
        group: String,
        topic: String,
        partition: i32,
    },
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaError),
}

impl From<KafkaError> for SkipError {
    fn from(e: KafkaError) -> SkipError {
        SkipError::Kafka(e.into())
    }
}

/// Skips the undecodable batch where `route` (a route's name, or
/// `delay`) is stuck on `topic`[`partition`]. Fails, changing nothing,
/// while a member of the route's group runs, or when the partition
/// reads fine there. Blocks: call it off the runtime.
pub fn skip_undecodable(
    cluster: &Cluster,
    config: &Config,
    route: &str,
    topic: &str,
    partition: i32,
    dry_run: bool,
) -> Result<Skipped, SkipError> {
    let (group, dlq) = if route == RELAY_ROUTE
        && let Some(relay) = &config.delay
    {
        (relay.group.clone(), relay.dlq.clone())
    } else {
        let configured = config
            .routes
            .iter()
            .find(|r| r.name == route)
            .ok_or_else(|| SkipError::UnknownRoute(route.to_string()))?;
        (configured.group.clone(), configured.dlq.clone())
    };
    let consumer: BaseConsumer<WatchedContext> = cluster
        .consumer_config(&group)
        .set("enable.auto.commit", "false")
        .create_with_context(cluster.watched("skip").quiet())?;
    // A broker that cannot describe groups (librdkafka's mock cluster) is
    // taken at the operator's word; Kafka refuses the commit below anyway
    // while the group has members.
    let groups = consumer
        .fetch_group_list(Some(&group), PROBE_TIMEOUT)
        .inspect_err(|e| {
            tracing::warn!(group, error = %e, "Cannot read the group's state: make sure no hopper of it runs.")
        })
        .ok();
    if let Some(state) = groups.as_ref().and_then(|g| g.groups().first())
        && !matches!(state.state(), "Empty" | "Dead" | "")
    {
        return Err(SkipError::GroupActive {
            group,
            state: state.state().to_string(),
            members: state.members().len(),
            route: route.to_string(),
        });
    }
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, PROBE_TIMEOUT)
        .doing(|| format!("reading the watermarks of {topic}[{partition}]"))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let committed = consumer
        .committed_offsets(tpl, PROBE_TIMEOUT)
        .doing(|| "reading the group's committed offset".into())?;
    let from = match committed
        .find_partition(topic, partition)
        .map(|e| e.offset())
    {
        Some(Offset::Offset(offset)) => offset.max(low),
        _ => low,
    };
    let error = match look(cluster, topic, partition, from)? {
        Look::Undecodable(error) => error,
        Look::Readable => {
            return Err(SkipError::Readable {
                topic: topic.to_string(),
                partition,
                from,
                group,
            });
        }
        Look::End => {
            return Err(SkipError::End {
                topic: topic.to_string(),
                partition,
                from,
                group,
            });
        }
    };
    // The first offset in (from, high] that does not fail as `from` does.
    let (mut bad, mut good) = (from, high);
    while good - bad > 1 {
        let middle = bad + (good - bad) / 2;
        match look(cluster, topic, partition, middle)? {
            Look::Undecodable(_) => bad = middle,
            Look::Readable | Look::End => good = middle,
        }
    }
    let mut skipped = Skipped {
        group: group.clone(),
        from,
        to: good,
        error,
        dead_letter: None,
    };
    if dry_run {
        return Ok(skipped);
    }
    let message = OwnedMessage::new(
        None,
        None,
        topic.to_string(),
        Timestamp::NotAvailable,
        partition,
        from,
        None,
    );
    let envelope = Envelope::fallback(&Incoming::<OwnedHeaders> {
        topic,
        partition,
        offset: from,
        timestamp: None,
        headers: None,
    });
    let reason = format!(
        "offsets {from} to {} of {topic}[{partition}] could not be decoded and were skipped: {}",
        good - 1,
        skipped.error
    );
    let hop = plan(
        &message,
        Plan {
            topic: &dlq,
            route,
            envelope: &envelope,
            attempts_made: 0,
            reason: Reason::Undecodable,
            error: &reason,
            handler: None,
            keep: &[],
        },
    );
    let producer = cluster.producer()?;
    let record = hop.record;
    let runtime = tokio::runtime::Handle::current();
    let delivered = runtime
        .block_on(
            producer.send(
                FutureRecord::<(), ()>::to(&record.topic)
                    .headers(record.headers)
                    .timestamp(record.timestamp),
                Duration::from_secs(30),
            ),
        )
        .map_err(|(e, _)| e)
        .doing(|| format!("writing the dead-letter record to `{dlq}`"))?;
    skipped.dead_letter = Some(format!(
        "{dlq}:{}:{}",
        delivered.partition, delivered.offset
    ));
    commit_as_member(&consumer, &group, topic, partition, good)?;
    Ok(skipped)
}

/// Commits `offset` for `group` on `topic`[`partition`] as a member of the
/// group: it joins (the only member, with every hopper of it stopped),
/// waits for the partition to be assigned, commits, and leaves. A commit
/// from outside the group is refused by brokers that keep the group's
/// members (librdkafka's mock cluster, and Kafka while any member is left).
fn commit_as_member(
    consumer: &BaseConsumer<WatchedContext>,
    group: &str,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<(), SkipError> {
    consumer.subscribe(&[topic])?;
    let deadline = Instant::now() + PROBE_TIMEOUT * 2;
    loop {
        let _ = consumer.poll(Duration::from_millis(100));
        let assigned = consumer
            .assignment()
            .map(|a| a.find_partition(topic, partition).is_some())
            .unwrap_or(false);
        if assigned {
            break;
        }
        if Instant::now() > deadline {
            return Err(SkipError::NotAssigned {
                group: group.to_string(),
                topic: topic.to_string(),
                partition,
            });
        }
    }
    let mut commit = TopicPartitionList::new();
    commit.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    consumer
        .commit(&commit, CommitMode::Sync)
        .doing(|| format!("committing offset {offset} for group `{group}`"))?;
    consumer.unsubscribe();
    Ok(())
}

/// Reads `topic`[`partition`] from `offset` with a consumer of its own, in
/// no group, until it gives a record, the partition's end, or an error it
/// cannot decode past.
fn look(cluster: &Cluster, topic: &str, partition: i32, offset: i64) -> Result<Look, SkipError> {
    let consumer: BaseConsumer<WatchedContext> = cluster
        .consumer_config("hopper-skip-probe")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create_with_context(cluster.watched("skip probe").quiet())?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(_)) => return Ok(Look::Readable),
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(Look::End),
            Some(Err(e)) if is_undecodable(&e) => return Ok(Look::Undecodable(e.to_string())),
            Some(Err(_)) | None => {}
        }
    }
    Err(SkipError::Silent {
        topic: topic.to_string(),
        partition,
        offset,
    })
}
