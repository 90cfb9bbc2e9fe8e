//! Compacted topics that hold a table every process reads whole, in no
//! consumer group, as a Kafka Streams GlobalKTable: the delay relay's
//! cancellation topic and a route's park topic. Each is created with its
//! settings before the check that creates the rest, read to its end before
//! anything depends on it, and then followed.

use super::{Cluster, Doing as _, KafkaError as Error};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// How long one metadata request may take.
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// A table reader's client: it asks for end-of-partition events to know
/// when it has read the whole topic, which are no error.
pub struct ReaderContext {
    watch: Arc<crate::kafka::ConnectionWatch>,
    /// Names the reader in the connection's log: `the cancellation
    /// table's reader`.
    name: String,
}

impl ClientContext for ReaderContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.watch.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let end_of_partition = matches!(
            error,
            KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
        );
        if !end_of_partition {
            self.watch.error(&self.name, &error, reason);
        }
    }
}

impl ConsumerContext for ReaderContext {}

/// A reader of a whole compacted table topic.
pub type TableReader = StreamConsumer<ReaderContext>;

/// Creates the compacted topic `topic` (`what` names it in errors: `the
/// park topic`) when it is missing and the config allows it; with
/// `retention`, what is older than it is deleted too. Returns whether it
/// created it. When it may not, the startup check of every topic names it
/// as missing.
pub async fn ensure_topic(
    cluster: &Cluster,
    what: &'static str,
    topic: &str,
    retention: Option<Duration>,
) -> Result<bool, Error> {
    if !cluster.kafka.create_topics || cluster.existing_topics()?.contains(topic) {
        return Ok(false);
    }
    let admin: AdminClient<crate::kafka::WatchedContext> = cluster
        .producer_config()
        .create_with_context(cluster.watched("admin"))
        .doing(|| "creating an admin client".into())?;
    let retention = retention.map(|r| r.as_millis().to_string());
    let mut new = NewTopic::new(
        topic,
        cluster.kafka.partitions,
        TopicReplication::Fixed(cluster.kafka.replication),
    );
    new = match &retention {
        Some(ms) => new
            .set("cleanup.policy", "compact,delete")
            .set("retention.ms", ms),
        None => new.set("cleanup.policy", "compact"),
    };
    let options = AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT));
    for result in admin.create_topics([&new], &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(Error::CreateTable { what, topic, code }),
        }
    }
    Ok(true)
}

/// A reader of the whole of `topic`, from its beginning, in no consumer
/// group. Returns it with the topic's partitions.
pub fn reader(
    cluster: &Cluster,
    what: &'static str,
    topic: &str,
) -> Result<(TableReader, Vec<i32>), Error> {
    let mut config = cluster.consumer_config(&crate::config::table_reader_group(topic));
    config
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "10");
    let context = ReaderContext {
        watch: cluster.watch().clone(),
        name: format!("the reader of the {what}"),
    };
    let consumer: TableReader = config
        .create_with_context(context)
        .doing(|| format!("creating the reader of `{topic}`"))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .doing(|| format!("reading the partitions of `{topic}`"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        return Err(Error::NoPartitions {
            what,
            topic: topic.to_string(),
        });
    }
    let mut assignment = TopicPartitionList::new();
    for partition in &partitions {
        assignment.add_partition_offset(topic, *partition, Offset::Beginning)?;
    }
    consumer
        .assign(&assignment)
        .doing(|| format!("reading `{topic}`"))?;
    Ok((consumer, partitions))
}

/// The high watermark of each partition of `topic` now.
pub fn ends(consumer: &TableReader, topic: &str) -> Result<Vec<(i32, i64)>, Error> {
    let assignment = consumer.assignment()?;
    let mut ends = Vec::new();
    for element in assignment.elements() {
        let partition = element.partition();
        let (_, high) = consumer
            .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
            .doing(|| format!("reading the end of `{topic}`[{partition}]"))?;
        ends.push((partition, high));
    }
    Ok(ends)
}

/// Hands every record of the topic to `each`, up to the end it had when
/// this started: each partition's high watermark then, or its
/// end-of-partition event (a compacted tail).
pub async fn read_to_end(
    consumer: &TableReader,
    what: &'static str,
    topic: &str,
    mut each: impl FnMut(&BorrowedMessage<'_>),
) -> Result<(), Error> {
    let assignment = consumer.assignment()?;
    let mut unread = HashSet::new();
    for element in assignment.elements() {
        let partition = element.partition();
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
            .doing(|| format!("reading the end of `{topic}`[{partition}]"))?;
        if high > low {
            unread.insert((partition, high));
        }
    }
    while !unread.is_empty() {
        match consumer.recv().await {
            Ok(record) => {
                each(&record);
                let partition = record.partition();
                unread.retain(|(p, high)| *p != partition || record.offset() + 1 < *high);
            }
            Err(KafkaError::PartitionEOF(partition)) => {
                unread.retain(|(p, _)| *p != partition);
            }
            Err(error) => {
                return Err(Error::ReadTable {
                    what,
                    topic: topic.to_string(),
                    error,
                });
            }
        }
    }
    Ok(())
}
