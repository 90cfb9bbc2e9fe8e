//! Why a partition is paused at the broker while the pipeline runs, and
//! every change of that: [`Pauses`].
//!
//! Two things pause a partition. A hold: a partition's task read a tier
//! message before it was due, so the partition is paused and sought back
//! to that message (its rewind), and resumed when the message is due
//! ([`crate::hold`]). A suspension: the processor suspends the partition's
//! topic (a route's open circuit breaker), and the partition stays paused
//! until it no longer does. A partition resumes only when neither keeps it
//! paused. A pause, seek or resume that fails is retried on the loop's
//! tick, never dropped; a revoke forgets the partition.
//!
//! Pausing for backpressure is not here: a task with no room stops reading
//! its queue instead, so nothing librdkafka prefetched is thrown away.

use super::SEEK_TIMEOUT;
use super::context::{PipelineConsumer, partitions, tpl_of};
use super::partition::Control;
use crate::events::{self, Telemetry};
use crate::health::HeldHeads;
use crate::hold::{DueCheck, Hold};
use crate::types::TopicPartition;
use rdkafka::Offset;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokio::sync::mpsc;

/// A hold's rewind (pause, then seek back to `offset`) not yet done.
struct Rewind {
    offset: i64,
    /// The pause is in place; the seek is running or must be retried.
    paused: bool,
    seeking: bool,
    /// The hold came due meanwhile: resume once the seek succeeds.
    resume_after: bool,
}

/// A seek's result, from its blocking thread.
pub(super) struct Seeked {
    pub tp: TopicPartition,
    pub offset: i64,
    pub result: Result<(), KafkaError>,
}

/// The paused partitions of one pipeline, and why each is paused. The
/// loop owns it; every change goes through its methods, which pause, seek
/// and resume at the consumer themselves.
pub(super) struct Pauses {
    pipeline: String,
    consumer: Arc<PipelineConsumer>,
    /// Where a seek's blocking thread reports; the loop reads the other
    /// end and hands each result to [`Pauses::seeked`].
    seeked: mpsc::UnboundedSender<Seeked>,
    /// Held tier partitions, until when.
    hold: Hold,
    /// Holds whose rewind is not done yet.
    rewinds: HashMap<TopicPartition, Rewind>,
    /// Partitions whose resume failed; retried on the tick.
    resume_failed: HashSet<TopicPartition>,
    /// Partitions paused because the processor suspends their topic.
    suspended: HashSet<TopicPartition>,
}

impl Pauses {
    pub(super) fn new(
        pipeline: String,
        consumer: Arc<PipelineConsumer>,
        heads: HeldHeads,
        seeked: mpsc::UnboundedSender<Seeked>,
    ) -> Pauses {
        Pauses {
            pipeline,
            consumer,
            seeked,
            hold: Hold::reporting(heads),
            rewinds: HashMap::new(),
            resume_failed: HashSet::new(),
            suspended: HashSet::new(),
        }
    }

    /// When the earliest hold is due, if any partition is held.
    pub(super) fn next_due(&self) -> Option<i64> {
        self.hold.next_due()
    }

    /// A partition's task read a tier message at `offset`, due at `due_ms`,
    /// before it was due: hold the partition until then, and rewind it to
    /// the message, so it is read again then.
    pub(super) fn hold(&mut self, tp: TopicPartition, offset: i64, due_ms: i64, now_ms: i64) {
        let check = self.hold.check(&tp, due_ms, now_ms);
        self.rewind(tp.clone(), offset);
        if check == DueCheck::Pass {
            // Due by now: read again as soon as the rewind is done.
            if let Some(rewind) = self.rewinds.get_mut(&tp) {
                rewind.resume_after = true;
            }
        }
    }

    /// Ends the holds due at `now_ms`. Returns the partitions resumed now,
    /// whose tasks may read again; a partition whose rewind is not done
    /// resumes when it is ([`Pauses::seeked`]).
    pub(super) fn due(&mut self, now_ms: i64) -> Vec<TopicPartition> {
        let mut released = Vec::new();
        for tp in self.hold.take_due(now_ms) {
            match self.rewinds.get_mut(&tp) {
                Some(rewind) => rewind.resume_after = true,
                None => {
                    self.resume(&tp);
                    released.push(tp);
                }
            }
        }
        released
    }

    /// A partition was assigned: one paused under an earlier assignment
    /// must not stay paused.
    pub(super) fn assigned(&mut self, tp: &TopicPartition) {
        self.resume(tp);
    }

    /// A partition was revoked: forget every reason it was paused.
    pub(super) fn revoked(&mut self, tp: &TopicPartition) {
        self.hold.release(tp);
        self.rewinds.remove(tp);
        self.resume_failed.remove(tp);
        self.suspended.remove(tp);
    }

    /// Retries the rewinds and resumes that failed.
    pub(super) fn tick(&mut self) {
        let retry_rewinds: Vec<(TopicPartition, i64)> = self
            .rewinds
            .iter()
            .filter(|(_, r)| !r.seeking)
            .map(|(tp, r)| (tp.clone(), r.offset))
            .collect();
        for (tp, offset) in retry_rewinds {
            self.rewind(tp, offset);
        }
        for tp in self.resume_failed.clone() {
            if !self.hold.is_held(&tp) && !self.rewinds.contains_key(&tp) {
                self.resume(&tp);
            }
        }
    }

    /// Resumes `tp`, unless the processor suspends it (it resumes when no
    /// longer suspended); a failure is retried on the tick.
    fn resume(&mut self, tp: &TopicPartition) {
        if self.suspended.contains(tp) {
            return;
        }
        match self.consumer.resume(&tpl_of(tp)) {
            Ok(()) => {
                self.resume_failed.remove(tp);
            }
            Err(e) => {
                if self.resume_failed.insert(tp.clone()) {
                    tracing::warn!(pipeline = self.pipeline, topic = tp.topic, partition = tp.partition, error = %e, "Cannot resume partition; retrying.");
                }
            }
        }
    }

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
    /// order, which [`OffsetTracker`](crate::offsets::OffsetTracker)
    /// depends on.
    fn rewind(&mut self, tp: TopicPartition, offset: i64) {
        let rewind = self.rewinds.entry(tp.clone()).or_insert(Rewind {
            offset,
            paused: false,
            seeking: false,
            resume_after: false,
        });
        if !rewind.paused {
            match self.consumer.pause(&tpl_of(&tp)) {
                Ok(()) => rewind.paused = true,
                Err(e) => {
                    tracing::warn!(pipeline = self.pipeline, topic = tp.topic, partition = tp.partition, error = %e, "Cannot pause partition; retrying.");
                    return;
                }
            }
        }
        if rewind.seeking {
            return;
        }
        rewind.seeking = true;
        let consumer = self.consumer.clone();
        let seeked = self.seeked.clone();
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

    /// A rewind's seek ended. Returns what the partition's task is told:
    /// to read again (the hold is over, and the partition resumed), or to
    /// drop what it fetched before the seek (still held); nothing when the
    /// seek failed (retried on the tick) or is outdated.
    pub(super) fn seeked(&mut self, seek: Seeked) -> Option<Control> {
        let rewind = self.rewinds.get_mut(&seek.tp)?; // revoked meanwhile
        if rewind.offset != seek.offset {
            return None;
        }
        rewind.seeking = false;
        if let Err(e) = seek.result {
            tracing::warn!(pipeline = self.pipeline, topic = seek.tp.topic, partition = seek.tp.partition, error = %e, "Cannot seek partition back to its held message; retrying.");
            return None;
        }
        let rewind = self.rewinds.remove(&seek.tp).expect("found above");
        if rewind.resume_after {
            self.resume(&seek.tp);
            Some(Control::Release)
        } else {
            Some(Control::Flush)
        }
    }

    /// Pauses the assigned partitions of `topics`, the topics the processor
    /// suspends now, and resumes those it paused once their topic is no
    /// longer suspended, unless a hold keeps them paused. A pause makes
    /// librdkafka fetch from the last message the partition's task received
    /// once resumed, so nothing is skipped; a message received before the
    /// pause is processed as usual (a route's breaker sends a tier message
    /// back to its tier).
    pub(super) fn suspend(&mut self, topics: &[String], telemetry: &Telemetry) {
        if topics.is_empty() && self.suspended.is_empty() {
            return;
        }
        let assigned: HashSet<TopicPartition> = match self.consumer.assignment() {
            Ok(tpl) => partitions(&tpl).into_iter().collect(),
            Err(_) => return, // tried again on the next tick
        };
        let mut now_suspended = HashSet::new();
        let mut paused = Vec::new();
        for tp in assigned.iter().filter(|tp| topics.contains(&tp.topic)) {
            if self.suspended.contains(tp) {
                now_suspended.insert(tp.clone());
                continue;
            }
            match self.consumer.pause(&tpl_of(tp)) {
                Ok(()) => {
                    now_suspended.insert(tp.clone());
                    paused.push(tp.clone());
                }
                Err(e) => {
                    tracing::warn!(pipeline = self.pipeline, topic = tp.topic, partition = tp.partition, error = %e, "Cannot suspend partition; trying again.")
                }
            }
        }
        let released: Vec<TopicPartition> = std::mem::replace(&mut self.suspended, now_suspended)
            .into_iter()
            .filter(|tp| !self.suspended.contains(tp) && assigned.contains(tp))
            .collect();
        if !paused.is_empty() {
            paused.sort();
            telemetry.emit(events::PartitionsSuspended {
                pipeline: self.pipeline.clone(),
                partitions: paused,
            });
        }
        for tp in &released {
            if !self.hold.is_held(tp) && !self.rewinds.contains_key(tp) {
                self.resume(tp);
            }
        }
        if !released.is_empty() {
            let mut partitions = released;
            partitions.sort();
            telemetry.emit(events::PartitionsReleased {
                pipeline: self.pipeline.clone(),
                partitions,
            });
        }
    }
}
