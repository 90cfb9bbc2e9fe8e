//! The consumer's context: it splits each assigned partition's queue off
//! the consumer's main queue, commits revoked partitions, and reports
//! rebalances to the loop.
//!
//! The split happens inside the rebalance callback, before librdkafka
//! assigns the partitions: a partition split before its assignment is never
//! forwarded to the main queue, so none of its messages can reach it. It
//! happens on every assignment, since an assignment undoes the splits of the
//! one before.

use super::Trackers;
use crate::types::TopicPartition;
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use std::sync::{Arc, OnceLock, Weak};
use tokio::sync::mpsc;

/// A partition's own queue, split off the consumer's main queue.
pub type PartitionQueue = StreamPartitionQueue<PipelineContext>;

/// Partitions gained or lost in a rebalance, sent from the consumer's
/// rebalance callback to the loop.
pub enum Rebalanced {
    /// Assigned partitions, each with its queue (`None` when librdkafka had
    /// no queue for it, which the loop reports as a failure).
    Assigned(Vec<(TopicPartition, Option<PartitionQueue>)>),
    Revoked(Vec<TopicPartition>),
}

/// Consumer context that splits assigned partitions, commits revoked ones
/// and reports rebalances to the loop.
pub struct PipelineContext {
    name: String,
    /// Dropped with the consumer; the loop's receiver then sees the end.
    rebalances: mpsc::UnboundedSender<Rebalanced>,
    trackers: Trackers,
    /// The consumer this context belongs to, for the splits: set once it
    /// exists, weak so that the context does not keep it alive.
    consumer: OnceLock<Weak<PipelineConsumer>>,
    /// Where the consumer's errors and log lines go.
    watch: Arc<crate::kafka::ConnectionWatch>,
}

/// A pipeline's consumer, its rebalance events, and the offset trackers
/// its rebalance callback commits from.
pub struct Connected {
    pub consumer: Arc<PipelineConsumer>,
    pub rebalances: mpsc::UnboundedReceiver<Rebalanced>,
    pub trackers: Trackers,
}

/// Creates a pipeline's consumer from `config` (see
/// [`crate::kafka::Cluster::consumer_config`]); `name` is the pipeline's,
/// for logs.
pub fn connect(
    config: &ClientConfig,
    name: &str,
    watch: Arc<crate::kafka::ConnectionWatch>,
) -> rdkafka::error::KafkaResult<Connected> {
    let (tx, rebalances) = mpsc::unbounded_channel();
    let trackers = Trackers::default();
    let consumer: PipelineConsumer = config.create_with_context(PipelineContext {
        name: name.to_string(),
        rebalances: tx,
        trackers: trackers.clone(),
        consumer: OnceLock::new(),
        watch,
    })?;
    let consumer = Arc::new(consumer);
    let _ = consumer.context().consumer.set(Arc::downgrade(&consumer));
    Ok(Connected {
        consumer,
        rebalances,
        trackers,
    })
}

impl ClientContext for PipelineContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.watch.log(level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.watch.error(&self.name, &error, reason);
    }
}

impl ConsumerContext for PipelineContext {
    /// On a revoke, commits each revoked partition's done prefix there and
    /// then, synchronously, before the partition can go to another member:
    /// the next owner re-delivers only what was still in flight here. On an
    /// assignment, splits each partition's queue off before it is assigned.
    fn pre_rebalance(&self, consumer: &rdkafka::consumer::BaseConsumer<Self>, r: &Rebalance<'_>) {
        match r {
            Rebalance::Revoke(tpl) => self.revoke(consumer, tpl),
            Rebalance::Assign(tpl) => {
                let Some(stream) = self.consumer.get().and_then(Weak::upgrade) else {
                    return; // the consumer is being dropped
                };
                let assigned = partitions(tpl)
                    .into_iter()
                    .map(|tp| {
                        let queue = stream.split_partition_queue(&tp.topic, tp.partition);
                        (tp, queue)
                    })
                    .collect();
                let _ = self.rebalances.send(Rebalanced::Assigned(assigned));
            }
            Rebalance::Error(_) => {}
        }
    }

    fn post_rebalance(&self, _: &rdkafka::consumer::BaseConsumer<Self>, r: &Rebalance<'_>) {
        if let Rebalance::Error(e) = r {
            tracing::warn!(pipeline = self.name, error = %e, "Rebalance failed.")
        }
    }
}

impl PipelineContext {
    fn revoke(&self, consumer: &rdkafka::consumer::BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let revoked = partitions(tpl);
        let mut commit = TopicPartitionList::new();
        {
            let trackers = self.trackers.lock().unwrap();
            for tp in &revoked {
                if let Some(position) = trackers.get(tp).and_then(|t| t.lock().unwrap().position())
                {
                    let _ = commit.add_partition_offset(
                        &tp.topic,
                        tp.partition,
                        Offset::Offset(position),
                    );
                }
            }
        }
        if commit.count() > 0 {
            match consumer.commit(&commit, CommitMode::Sync) {
                Ok(()) => tracing::debug!(
                    pipeline = self.name,
                    partitions = commit.count(),
                    "Revoked partitions committed."
                ),
                Err(e) => tracing::warn!(
                    pipeline = self.name,
                    error = %e,
                    "Revoked partitions not committed; their next owner re-delivers from the last commit."
                ),
            }
        }
        let _ = self.rebalances.send(Rebalanced::Revoked(revoked));
    }
}

pub(super) fn partitions(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| TopicPartition::new(e.topic(), e.partition()))
        .collect()
}

pub(super) fn tpl_of(tp: &TopicPartition) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.topic, tp.partition);
    tpl
}

pub type PipelineConsumer = StreamConsumer<PipelineContext>;
