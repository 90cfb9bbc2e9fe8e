//! A hold's rewind: pause a tier partition whose head is not due and seek
//! back to that head, so it is fetched again when due ([`crate::hold`]).

use super::partition::Control;
use super::{Loop, SEEK_TIMEOUT, context::tpl_of};
use crate::hold::TopicPartition;
use crate::hop::Processor;
use rdkafka::Offset;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;

/// A hold's rewind (pause, then seek back to `offset`) not yet done.
pub(super) struct Rewind {
    pub offset: i64,
    /// The pause is in place; the seek is running or must be retried.
    pub paused: bool,
    pub seeking: bool,
    /// The hold came due meanwhile: resume once the seek succeeds.
    pub resume_after: bool,
}

/// A seek's result, from its blocking thread.
pub(super) struct Seeked {
    pub tp: TopicPartition,
    pub offset: i64,
    pub result: Result<(), KafkaError>,
}

impl<P: Processor> Loop<P> {
    /// Pauses `tp` and seeks it back to `offset`, the held message, so that
    /// offset is fetched again after the resume. The seek blocks, so it runs
    /// on a blocking thread; until the hold is over, the partition's task
    /// reads nothing. A failed pause or seek is retried on the tick: the
    /// held message is never skipped.
    ///
    /// Ordering relies on librdkafka's op versions: pause, seek and resume
    /// each bump the partition's version, and messages fetched under an
    /// older version are dropped at poll time. So after the resume the first
    /// message of the partition is `offset` again, and offsets are queued in
    /// order, which [`OffsetTracker`] depends on.
    pub(super) fn rewind(&mut self, tp: TopicPartition, offset: i64) {
        let rewind = self.rewinds.entry(tp.clone()).or_insert(Rewind {
            offset,
            paused: false,
            seeking: false,
            resume_after: false,
        });
        if !rewind.paused {
            match self.shared.consumer.pause(&tpl_of(&tp)) {
                Ok(()) => rewind.paused = true,
                Err(e) => {
                    tracing::warn!(pipeline = self.name, topic = tp.topic, partition = tp.partition, error = %e, "Cannot pause partition; retrying.");
                    return;
                }
            }
        }
        if rewind.seeking {
            return;
        }
        rewind.seeking = true;
        let consumer = self.shared.consumer.clone();
        let seeked = self.seeked_tx.clone();
        tokio::task::spawn_blocking(move || {
            let result = consumer.seek(
                &tp.topic,
                tp.partition,
                Offset::Offset(offset),
                SEEK_TIMEOUT,
            );
            let _ = seeked.send(Seeked { tp, offset, result });
        });
    }

    pub(super) fn seeked(&mut self, seek: Seeked) {
        let Some(rewind) = self.rewinds.get_mut(&seek.tp) else {
            return; // revoked meanwhile
        };
        if rewind.offset != seek.offset {
            return;
        }
        rewind.seeking = false;
        if let Err(e) = seek.result {
            tracing::warn!(pipeline = self.name, topic = seek.tp.topic, partition = seek.tp.partition, error = %e, "Cannot seek partition back to its held message; retrying.");
            return;
        }
        let rewind = self.rewinds.remove(&seek.tp).expect("found above");
        if rewind.resume_after {
            self.release(&seek.tp);
        } else if let Some(partition) = self.partitions.get(&seek.tp) {
            // Held on: what was fetched before the seek can go now.
            let _ = partition.control.send(Control::Flush);
        }
    }
}
