//! The consumer loop shared by routes and the delay relay.
//!
//! Each assigned partition has a task of its own ([`partition`]) that reads
//! the partition's own queue, split off the consumer's main queue in the
//! assign callback ([`context`]), and runs up to `max_in_flight` calls in
//! the order the processor's [`Concurrency`] allows: one at a time
//! (`partition`), one per key (`key`), or any (`unordered`). A call never
//! waits for a hop's acknowledgement: it enqueues the produce and ends, and
//! the producer's delivery callback marks the offset done in the
//! partition's [`OffsetTracker`], which stores the highest offset below
//! which every message is done. So however calls overtake each other, only
//! the contiguous prefix of done offsets is ever committed.
//!
//! The loop owns the consumer and polls its main queue, which carries the
//! rebalances and errors, never a message. It starts and closes partition
//! tasks as partitions come and go, stores and commits the done offsets on
//! its tick, and does what pauses a partition ([`pauses`]): a hold's rewind
//! and the processor's suspension (a route's open breaker).
//! A partition task with no room simply stops reading its queue: nothing is
//! paused for backpressure, so nothing librdkafka prefetched is thrown
//! away. Nothing here blocks the loop: the blocking seek of a hold runs on a
//! blocking thread, and a failed pause, seek or resume is retried on the
//! next tick, never dropped.
//!
//! What happens to a message is the [`Processor`]'s business: a route calls
//! its handler, the delay relay moves the message one tier closer to its
//! time.

mod context;
mod in_flight;
mod key_queue;
mod partition;
mod pauses;
mod slice;

pub use context::{
    Connected, PartitionQueue, PipelineConsumer, PipelineContext, Rebalanced, connect,
};

use crate::clock::now_ms;
use crate::config::Concurrency;
use crate::events::Telemetry;
use crate::hop::{Halt, Processor};
use crate::offsets::OffsetTracker;
use crate::produce::HopProducer;
use crate::scheduler::{Scheduled, Scheduler};
use crate::types::TopicPartition;
use key_queue::KeyHasher;
use partition::{Control, Held, Partition};
use pauses::Pauses;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often done offsets are stored and committed (asynchronously), and
/// failed pauses, seeks and resumes retried. A done offset is so committed
/// within a tick and the commit's round trip: a kill -9 makes hopper do
/// again the calls in flight and about that much work. One store and commit
/// per tick for every partition that moved saves a call into librdkafka per
/// message.
const TICK: Duration = Duration::from_millis(50);
/// The longest a hold's seek may block its (blocking) thread.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// The offset trackers of the partitions a pipeline owns, shared with its
/// rebalance callback.
pub type Trackers = Arc<Mutex<HashMap<TopicPartition, Arc<Mutex<OffsetTracker>>>>>;

/// What the loop, the calls and the producer of one pipeline share.
pub struct Shared<P> {
    pub processor: P,
    pub producer: Arc<HopProducer>,
    pub consumer: Arc<PipelineConsumer>,
    pub telemetry: Telemetry,
    /// Hops not yet acknowledged; shutdown waits on it.
    pub acks: TaskTracker,
    /// Set when the pipeline must stop at once.
    pub halt: Arc<Halt>,
    /// The trackers the rebalance callback commits from.
    pub trackers: Trackers,
}

/// How a pipeline's loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Asked to stop: every call finished, every hop was acknowledged, and
    /// the done offsets were committed.
    Drained,
    /// Asked to stop, but the deadline came first: what was done is
    /// committed, the rest is re-delivered.
    Incomplete(String),
    /// Stopped on its own, for this reason; nothing past the failure was
    /// committed.
    Failed(String),
}

/// An assigned partition, as the loop sees it: its task and what it shares
/// with it.
struct Assigned {
    tp: Arc<TopicPartition>,
    tracker: Arc<Mutex<OffsetTracker>>,
    control: mpsc::UnboundedSender<Control>,
    task: JoinHandle<()>,
}

/// The loop's state: everything the consumer task owns.
struct Loop<P: Processor> {
    shared: Arc<Shared<P>>,
    name: String,
    concurrency: Concurrency,
    partitions: HashMap<TopicPartition, Assigned>,
    /// Tasks of revoked partitions, until a new task of the same partition
    /// takes them over (it waits for their end) or the drain waits for them.
    retired: HashMap<TopicPartition, JoinHandle<()>>,
    /// Which partitions are paused, and why: a hold, or a suspension.
    pauses: Pauses,
    held_tx: mpsc::UnboundedSender<Held>,
    scheduler: mpsc::UnboundedSender<Scheduled>,
    /// Hashes message keys for the key queues; seeded per pipeline.
    keys: KeyHasher,
}

/// Runs the loop until `shutdown` (or the pipeline's [`Halt`]), then drains
/// within `deadline`: fetching stops, waiting messages are left for the next
/// start, the calls running finish, their hops are acknowledged, and the
/// done offsets are committed. Messages held in memory for a later time are
/// not forwarded; their offsets were never stored, so they are read again.
pub async fn run<P: Processor>(
    shared: Arc<Shared<P>>,
    mut rebalances: mpsc::UnboundedReceiver<Rebalanced>,
    shutdown: CancellationToken,
    deadline: Duration,
) -> Ended {
    let name = shared.processor.name().to_string();
    let consumer = shared.consumer.clone();
    let concurrency = shared.processor.concurrency();
    let stop_scheduler = CancellationToken::new();
    let (held_tx, mut held) = mpsc::unbounded_channel();
    let (seeked_tx, mut seeked) = mpsc::unbounded_channel();
    let mut this = Loop {
        name: name.clone(),
        concurrency,
        partitions: HashMap::new(),
        retired: HashMap::new(),
        pauses: Pauses::new(
            name.clone(),
            consumer.clone(),
            shared.telemetry.health().held_heads(&name),
            seeked_tx,
        ),
        held_tx,
        scheduler: Scheduler::spawn(shared.producer.clone(), stop_scheduler.clone()),
        keys: KeyHasher::default(),
        shared: shared.clone(),
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let failure = loop {
        let wake = this.pauses.next_due().map(|due| {
            let wait = due.saturating_sub(now_ms()).max(0) as u64;
            tokio::time::sleep(Duration::from_millis(wait))
        });
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break None,
            _ = shared.halt.failed() => break shared.halt.reason(),
            Some(event) = rebalances.recv() => this.rebalanced(event),
            Some(hold) = held.recv() => this.held(hold),
            Some(seek) = seeked.recv() => {
                let tp = seek.tp.clone();
                if let Some(order) = this.pauses.seeked(seek) {
                    this.tell(&tp, order);
                }
            }
            _ = tick.tick() => this.tick(),
            _ = async { match wake { Some(sleep) => sleep.await, None => std::future::pending().await } } => {
                for tp in this.pauses.due(now_ms()) {
                    this.tell(&tp, Control::Release);
                }
            }
            received = consumer.recv() => match received {
                // Every assigned partition is split off before it is
                // assigned, so a message here means one was not: its
                // offsets would be out of its task's reach.
                Ok(message) => this.shared.halt.fail(format!(
                    "a message of {}[{}]@{} arrived on the consumer's main queue instead of its partition's; nothing past it is committed",
                    message.topic(), message.partition(), message.offset()
                )),
                Err(e) => tracing::warn!(pipeline = name, error = %e, "Consumer error."),
            },
        }
    };

    // Drain: stop fetching, leave waiting messages for the next start, let
    // the running calls finish, wait for their hops, commit what is done.
    tracing::info!(pipeline = name, "Stopping.");
    let until = Instant::now() + deadline;
    if let Ok(assigned) = consumer.assignment() {
        let _ = consumer.pause(&assigned);
    }
    let mut tasks: Vec<JoinHandle<()>> = this.retired.drain().map(|(_, task)| task).collect();
    let mut trackers = Vec::new();
    for (_, partition) in this.partitions.drain() {
        let _ = partition.control.send(Control::Close);
        tasks.push(partition.task);
        trackers.push((partition.tp, partition.tracker));
    }
    let ended = tokio::time::timeout_at(until.into(), futures::future::join_all(tasks.iter_mut()))
        .await
        .is_ok();
    for task in &tasks {
        task.abort();
    }
    stop_scheduler.cancel();
    shared.acks.close();
    let acked = tokio::time::timeout_at(until.into(), shared.acks.wait())
        .await
        .is_ok();
    store_positions(&consumer, trackers.iter().map(|(tp, t)| (&**tp, t)), &name);
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => tracing::warn!(pipeline = name, error = %e, "Final commit failed."),
    }
    consumer.unsubscribe();
    let failure = failure.or_else(|| shared.halt.reason());
    let in_flight: usize = trackers
        .iter()
        .map(|(_, t)| t.lock().unwrap().in_flight())
        .sum();
    let ended = match failure {
        Some(reason) => Ended::Failed(reason),
        None if ended && acked => Ended::Drained,
        None => Ended::Incomplete(format!(
            "{in_flight} message(s) still in flight (calls running or hops unacknowledged) after {deadline:?}; they will be re-delivered"
        )),
    };
    match &ended {
        Ended::Drained => tracing::info!(pipeline = name, "Stopped."),
        Ended::Incomplete(why) => {
            tracing::warn!(pipeline = name, "Stopped before draining: {why}.")
        }
        Ended::Failed(why) => tracing::error!(pipeline = name, "Stopped: {why}."),
    }
    ended
}

impl<P: Processor> Loop<P> {
    /// Starts the task of a newly assigned partition, after the task of its
    /// previous ownership, if that one has not ended yet.
    fn assign(&mut self, tp: TopicPartition, queue: PartitionQueue) {
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        self.shared
            .trackers
            .lock()
            .unwrap()
            .insert(tp.clone(), tracker.clone());
        let tp = Arc::new(tp);
        let (control, orders) = mpsc::unbounded_channel();
        let partition = Partition {
            shared: self.shared.clone(),
            tp: tp.clone(),
            tracker: tracker.clone(),
            concurrency: self.concurrency,
            keys: self.keys.clone(),
            scheduler: self.scheduler.clone(),
            held: self.held_tx.clone(),
            stuck: Default::default(),
        };
        let previous = match self.partitions.remove(&tp) {
            // Assigned again without a revoke: the old task ends first.
            Some(old) => {
                let _ = old.control.send(Control::Close);
                Some(old.task)
            }
            None => self.retired.remove(&tp),
        };
        let task = tokio::spawn(slice::Sliced::new(|slice| {
            partition::run(partition, slice, queue, orders, previous)
        }));
        self.partitions.insert(
            (*tp).clone(),
            Assigned {
                tp,
                tracker,
                control,
                task,
            },
        );
    }

    /// A partition's task read a tier message before it was due, and took
    /// nothing from then on: hold the partition until the message is due,
    /// and rewind it to the message, so it is read again then.
    fn held(&mut self, held: Held) {
        let Held { tp, offset, due_ms } = held;
        if !self.partitions.contains_key(&tp) {
            return; // revoked meanwhile
        }
        self.pauses.hold(tp, offset, due_ms, now_ms());
    }

    /// Sends `order` to the task of `tp`, if the partition is still ours.
    fn tell(&self, tp: &TopicPartition, order: Control) {
        if let Some(partition) = self.partitions.get(tp) {
            let _ = partition.control.send(order);
        }
    }

    fn rebalanced(&mut self, event: Rebalanced) {
        match event {
            Rebalanced::Revoked(tps) => {
                for tp in tps {
                    self.pauses.revoked(&tp);
                    self.shared.trackers.lock().unwrap().remove(&tp);
                    let Some(partition) = self.partitions.remove(&tp) else {
                        continue;
                    };
                    // Waiting messages are left for the partition's next
                    // owner; running calls finish, uncommitted.
                    let _ = partition.control.send(Control::Close);
                    self.retired.insert(tp, partition.task);
                }
                self.retired.retain(|_, task| !task.is_finished());
            }
            Rebalanced::Assigned(assigned) => {
                self.shared.telemetry.health().joined(&self.name);
                tracing::info!(
                    pipeline = self.name,
                    partitions = assigned.len(),
                    "Partitions assigned."
                );
                for (tp, queue) in assigned {
                    let Some(queue) = queue else {
                        self.shared.halt.fail(format!(
                            "librdkafka has no queue for the assigned partition {}[{}]",
                            tp.topic, tp.partition
                        ));
                        continue;
                    };
                    self.pauses.assigned(&tp);
                    self.assign(tp, queue);
                }
            }
        }
    }

    fn tick(&mut self) {
        if let Some(p) = self.partitions.values().find(|p| p.task.is_finished()) {
            // A task ends only when closed: this one panicked.
            self.shared.halt.fail(format!(
                "the task of partition {}[{}] ended on its own; nothing past its last commit is committed",
                p.tp.topic, p.tp.partition
            ));
        }
        store_positions(
            &self.shared.consumer,
            self.partitions.values().map(|p| (&*p.tp, &p.tracker)),
            &self.name,
        );
        let suspended = self.shared.processor.suspended(now_ms());
        self.pauses.suspend(suspended, &self.shared.telemetry);
        self.pauses.tick();
    }
}

/// Stores, in one call, the committable position of every partition whose
/// position moved since the last store.
fn store_positions<'a>(
    consumer: &PipelineConsumer,
    partitions: impl Iterator<Item = (&'a TopicPartition, &'a Arc<Mutex<OffsetTracker>>)>,
    pipeline: &str,
) {
    let mut tpl = TopicPartitionList::new();
    for (tp, tracker) in partitions {
        if let Some(position) = tracker.lock().unwrap().take_unstored() {
            let _ = tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(position));
        }
    }
    if tpl.count() == 0 {
        return;
    }
    if let Err(e) = consumer.store_offsets(&tpl) {
        // Expected after a revoke: the partition's next owner redelivers.
        tracing::debug!(pipeline, error = %e, "Offsets not stored.");
        return;
    }
    // Committed at once, asynchronously, rather than on librdkafka's next
    // auto-commit: a kill -9 then re-handles one tick of done work and the
    // commit's round trip, not a commit interval more. At most one commit
    // per tick, whatever the load; auto-commit stays on as a backstop.
    if let Err(e) = consumer.commit_consumer_state(CommitMode::Async) {
        tracing::debug!(pipeline, error = %e, "Stored offsets not committed; the next tick tries again.");
    }
}
