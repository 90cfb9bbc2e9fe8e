//! The consumer's context: it commits revoked partitions and reports
//! rebalances to the loop.

use super::{TopicPartition, Trackers};
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

/// Partitions gained or lost in a rebalance, sent from the consumer's
/// rebalance callback to the loop.
#[derive(Debug)]
pub enum Rebalanced {
    Assigned(Vec<TopicPartition>),
    Revoked(Vec<TopicPartition>),
}

/// Consumer context that commits revoked partitions and reports rebalances
/// to the loop.
pub struct PipelineContext {
    pub name: String,
    /// Dropped with the consumer; the loop's receiver then sees the end.
    pub rebalances: mpsc::UnboundedSender<Rebalanced>,
    pub trackers: Trackers,
}

impl ClientContext for PipelineContext {}

impl ConsumerContext for PipelineContext {
    /// On a revoke, commits each revoked partition's done prefix there and
    /// then, synchronously, before the partition can go to another member:
    /// the next owner re-delivers only what was still in flight here.
    fn pre_rebalance(&self, consumer: &rdkafka::consumer::BaseConsumer<Self>, r: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = r else { return };
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

    fn post_rebalance(&self, _: &rdkafka::consumer::BaseConsumer<Self>, r: &Rebalance<'_>) {
        match r {
            Rebalance::Assign(tpl) => {
                let _ = self.rebalances.send(Rebalanced::Assigned(partitions(tpl)));
            }
            Rebalance::Error(e) => {
                tracing::warn!(pipeline = self.name, error = %e, "Rebalance failed.")
            }
            Rebalance::Revoke(_) => {}
        }
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
