//! The consumer loop shared by routes and the delay relay.
//!
//! The loop owns the consumer. It gates messages of tier topics through
//! [`Hold`] and queues every due message on its partition. Up to
//! `max_in_flight` runner tasks per partition take messages from its queue
//! in the order the processor's [`Concurrency`] allows: one at a time
//! (`partition`), one per key (`key`), or any (`unordered`); a runner goes
//! from one message to the next without the loop, which only starts runners
//! when messages wait and a slot is free. A call never waits for a hop's
//! acknowledgement: it enqueues the produce and ends, and the producer's
//! delivery callback marks the offset done in the partition's
//! [`OffsetTracker`], which stores the highest offset below which every
//! message is done. So however calls overtake each other, only the
//! contiguous prefix of done offsets is ever committed.
//!
//! Nothing here blocks the loop: a partition whose queue is full is paused at
//! the broker (and resumed when a quarter of its queue has started), the
//! blocking seek of a hold runs on a blocking thread, and a failed pause, seek
//! or resume is retried on the next tick, never dropped. One slow partition
//! holds up only itself. A partition is paused only by a full queue, a hold
//! (`rewind.rs`) or the processor's suspension (`suspend.rs`: a route's open
//! breaker).
//!
//! What happens to a message is the [`Processor`]'s business: a route calls
//! its handler, the delay relay moves the message one tier closer to its
//! time.

mod context;
mod gate;
mod rewind;
mod runner;
mod suspend;

pub use context::{PipelineConsumer, PipelineContext, Rebalanced};

use crate::clock::now_ms;
use crate::events::Telemetry;
use crate::hold::{Gate, Hold, TopicPartition};
use crate::hop::{Concurrency, Halt, Ordering, Processor};
use crate::offsets::OffsetTracker;
use crate::produce::HopProducer;
use crate::scheduler::{Scheduled, Scheduler};
use context::tpl_of;
use gate::{KeyHasher, key_of};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use rewind::{Rewind, Seeked};
use runner::{Lane, Notice, Queue, run_lane};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Messages queued on one partition, at least, before it is paused at the
/// broker (or `MAX_QUEUE_BYTES` of keys and payloads, whichever comes
/// first); it is resumed when a quarter of them have started. A pause drops
/// what librdkafka prefetched and a resume waits on a fetch, so the queue
/// must hold more than a fast handler gets through in a fetch's time, or it
/// would wait on the broker after every resume.
const MIN_QUEUE: usize = 32_768;
/// The bytes (keys and payloads) queued on one partition before it is
/// paused.
const MAX_QUEUE_BYTES: usize = 16 << 20;
/// How often done offsets are stored and committed (asynchronously), and
/// failed pauses, seeks and resumes retried. A done offset is so committed
/// within a tick and the commit's round trip: a kill -9 makes hopper do
/// again the calls in flight and about that much work. One store and commit
/// per tick for every partition that moved saves a call into librdkafka per
/// message.
const TICK: Duration = Duration::from_millis(50);
/// How long a runner with nothing to do waits for a message before it ends.
const RUNNER_IDLE: Duration = Duration::from_secs(1);
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

/// A partition, as the loop sees it.
struct Partition<P> {
    lane: Arc<Lane<P>>,
    /// The queue of the partition's previous ownership while its runners
    /// finish: nothing starts before, so no two calls of one partition
    /// overlap across a rebalance.
    previous: Option<Arc<Mutex<Queue>>>,
    /// The backpressure pause failed; retried on the tick.
    pause_failed: bool,
}

/// The loop's state: everything the consumer task owns.
struct Loop<P: Processor> {
    shared: Arc<Shared<P>>,
    name: String,
    concurrency: Concurrency,
    queue: usize,
    partitions: HashMap<String, HashMap<i32, Partition<P>>>,
    /// Queues of revoked partitions whose runners have not ended yet.
    retired: HashMap<TopicPartition, Arc<Mutex<Queue>>>,
    hold: Hold,
    rewinds: HashMap<TopicPartition, Rewind>,
    /// Partitions whose resume failed; retried on the tick.
    resume_failed: HashSet<TopicPartition>,
    /// Partitions paused because the processor suspends their topic (a
    /// route's open circuit breaker).
    suspended: HashSet<TopicPartition>,
    notices_tx: mpsc::UnboundedSender<Notice>,
    seeked_tx: mpsc::UnboundedSender<Seeked>,
    scheduler: mpsc::UnboundedSender<Scheduled>,
    /// Hashes message keys for the key gate; seeded per pipeline.
    keys: KeyHasher,
}

/// Runs the loop until `shutdown` (or the pipeline's [`Halt`]), then drains
/// within `deadline`: fetching stops, queued messages are left for the next
/// start, the calls running finish, their hops are acknowledged, and the done
/// offsets are committed. Messages held in memory for a later time are not
/// forwarded; their offsets were never stored, so they are read again.
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
    let (notices_tx, mut notices) = mpsc::unbounded_channel();
    let (seeked_tx, mut seeked) = mpsc::unbounded_channel();
    let mut this = Loop {
        name: name.clone(),
        concurrency,
        queue: MIN_QUEUE.max(concurrency.max_in_flight.saturating_mul(4)),
        partitions: HashMap::new(),
        retired: HashMap::new(),
        hold: Hold::reporting(shared.telemetry.health().held_heads(&name)),
        rewinds: HashMap::new(),
        resume_failed: HashSet::new(),
        suspended: HashSet::new(),
        notices_tx,
        seeked_tx,
        scheduler: Scheduler::spawn(shared.producer.clone(), stop_scheduler.clone()),
        keys: KeyHasher::default(),
        shared: shared.clone(),
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let failure = loop {
        let wake = this.hold.next_due().map(|due| {
            let wait = due.saturating_sub(now_ms()).max(0) as u64;
            tokio::time::sleep(Duration::from_millis(wait))
        });
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break None,
            _ = shared.halt.failed() => break shared.halt.reason(),
            Some(event) = rebalances.recv() => this.rebalanced(event),
            Some(notice) = notices.recv() => this.noticed(notice),
            Some(seek) = seeked.recv() => this.seeked(seek),
            _ = tick.tick() => this.tick(),
            _ = async { match wake { Some(sleep) => sleep.await, None => std::future::pending().await } } => {
                for tp in this.hold.take_due(now_ms()) {
                    // A suspended partition resumes when no longer suspended.
                    match this.rewinds.get_mut(&tp) {
                        Some(rewind) => rewind.resume_after = true,
                        None => this.resume(&tp),
                    }
                }
            }
            received = consumer.recv() => match received {
                Ok(message) => this.received(message),
                Err(e) => tracing::warn!(pipeline = name, error = %e, "Consumer error."),
            },
        }
    };

    // Drain: stop fetching, leave queued messages for the next start, let
    // the running calls finish, wait for their hops, commit what is done.
    tracing::info!(pipeline = name, "Stopping.");
    let until = Instant::now() + deadline;
    if let Ok(assigned) = consumer.assignment() {
        let _ = consumer.pause(&assigned);
    }
    let mut queues: Vec<Arc<Mutex<Queue>>> = this.retired.values().cloned().collect();
    for partition in this.partitions.values().flat_map(|p| p.values()) {
        queues.push(partition.lane.queue.clone());
        queues.extend(partition.previous.clone());
    }
    for queue in &queues {
        let mut queue = queue.lock().unwrap();
        queue.closed = true;
        queue.clear();
    }
    for partition in this.partitions.values().flat_map(|p| p.values()) {
        partition.lane.wake.notify_waiters();
    }
    let running = runners_ended(&queues, &mut notices, until.into()).await;
    stop_scheduler.cancel();
    shared.acks.close();
    let acked = tokio::time::timeout_at(until.into(), shared.acks.wait())
        .await
        .is_ok();
    store_positions(&consumer, &this.partitions, &name);
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => tracing::warn!(pipeline = name, error = %e, "Final commit failed."),
    }
    consumer.unsubscribe();
    let failure = failure.or_else(|| shared.halt.reason());
    let ended = match failure {
        Some(reason) => Ended::Failed(reason),
        None if running == 0 && acked => Ended::Drained,
        None => Ended::Incomplete(format!(
            "{running} call(s) still running and {} hop(s) unacknowledged after {deadline:?}; their messages will be re-delivered",
            shared.acks.len()
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

/// Waits until the runners of `queues` (all closed) have ended, or until
/// `until`; returns how many still run. The last runner of a closed queue
/// reports [`Notice::Idle`] as it ends, so this wakes on those reports, not
/// on a timer.
async fn runners_ended(
    queues: &[Arc<Mutex<Queue>>],
    notices: &mut mpsc::UnboundedReceiver<Notice>,
    until: tokio::time::Instant,
) -> usize {
    let running = || -> usize { queues.iter().map(|q| q.lock().unwrap().running).sum() };
    let _ = tokio::time::timeout_at(until, async {
        while running() > 0 {
            if notices.recv().await.is_none() {
                break;
            }
        }
    })
    .await;
    running()
}

impl<P: Processor> Loop<P> {
    fn received(&mut self, message: rdkafka::message::BorrowedMessage<'_>) {
        let offset = message.offset();
        let (topic, partition) = (message.topic(), message.partition());
        if !self.rewinds.is_empty() {
            let tp = TopicPartition::new(topic, partition);
            if self.rewinds.contains_key(&tp) {
                // Fetched before the rewind took hold: read again after it.
                return;
            }
        }
        if let Some(due) = self.shared.processor.due_at(&message) {
            let tp = TopicPartition::new(topic, partition);
            match self.hold.gate(&tp, due, now_ms()) {
                Gate::Pass => {}
                Gate::Discard => return,
                Gate::Hold { .. } => {
                    drop(message);
                    self.rewind(tp, offset);
                    return;
                }
            }
        }
        let key = key_of(self.concurrency.ordering, message.key(), &self.keys);
        let message = message.detach();
        let queue_size = self.queue;
        let partition = self.partition(message.topic(), message.partition());
        partition.lane.tracker.lock().unwrap().begin(offset);
        let full = {
            let mut queue = partition.lane.queue.lock().unwrap();
            queue.push(key, message);
            let full = !queue.full && (queue.len() >= queue_size || queue.bytes >= MAX_QUEUE_BYTES);
            queue.full |= full;
            full
        };
        let tp = partition.lane.tp.clone();
        self.start(&tp);
        if full {
            self.pause_full(&tp);
        }
    }

    /// The partition `(topic, partition)`, created on its first message.
    fn partition(&mut self, topic: &str, partition: i32) -> &mut Partition<P> {
        if self.get_by(topic, partition).is_none() {
            let tp = TopicPartition::new(topic, partition);
            let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
            self.shared
                .trackers
                .lock()
                .unwrap()
                .insert(tp.clone(), tracker.clone());
            let previous = self.retired.remove(&tp);
            let Concurrency {
                ordering,
                max_in_flight,
            } = self.concurrency;
            let lane = Lane {
                shared: self.shared.clone(),
                tp: Arc::new(tp.clone()),
                tracker,
                queue: Arc::default(),
                max: match ordering {
                    Ordering::Partition => 1,
                    _ => max_in_flight.max(1),
                },
                resume_at: self.queue / 4 * 3,
                wake: tokio::sync::Notify::new(),
                scheduler: self.scheduler.clone(),
                notices: self.notices_tx.clone(),
            };
            self.partitions.entry(tp.topic).or_default().insert(
                partition,
                Partition {
                    lane: Arc::new(lane),
                    previous,
                    pause_failed: false,
                },
            );
        }
        self.get_by(topic, partition).expect("inserted above")
    }

    fn get_by(&mut self, topic: &str, partition: i32) -> Option<&mut Partition<P>> {
        self.partitions.get_mut(topic)?.get_mut(&partition)
    }

    fn get(&mut self, tp: &TopicPartition) -> Option<&mut Partition<P>> {
        self.get_by(&tp.topic, tp.partition)
    }

    /// Starts runners for `tp`'s waiting messages, as many as its
    /// `max_in_flight` leaves room for; each runner takes the next message
    /// its ordering allows until none is left. Nothing starts while the
    /// runners of the partition's previous ownership are still working.
    fn start(&mut self, tp: &TopicPartition) {
        let Some(partition) = self.get(tp) else {
            return;
        };
        if let Some(previous) = &partition.previous {
            if previous.lock().unwrap().running > 0 {
                return;
            }
            partition.previous = None;
        }
        let lane = partition.lane.clone();
        let mut queue = lane.queue.lock().unwrap();
        queue.more_asked = false;
        if queue.parked > 0 {
            lane.wake.notify_one();
            return;
        }
        let room = lane.max.saturating_sub(queue.running);
        let wanted = room.min(queue.len());
        queue.running += wanted;
        drop(queue);
        for _ in 0..wanted {
            tokio::spawn(run_lane(lane.clone()));
        }
    }

    fn noticed(&mut self, notice: Notice) {
        match notice {
            Notice::Drained(tp) => {
                if !self.hold.is_held(&tp) && !self.rewinds.contains_key(&tp) {
                    self.resume(&tp);
                }
            }
            Notice::More(tp) => self.start(&tp),
            Notice::Idle(tp) => {
                if self
                    .retired
                    .get(&tp)
                    .is_some_and(|q| q.lock().unwrap().running == 0)
                {
                    self.retired.remove(&tp);
                }
                self.start(&tp);
            }
        }
    }

    fn rebalanced(&mut self, event: Rebalanced) {
        match event {
            Rebalanced::Revoked(tps) => {
                for tp in tps {
                    self.hold.release(&tp);
                    self.rewinds.remove(&tp);
                    self.resume_failed.remove(&tp);
                    self.suspended.remove(&tp);
                    self.shared.trackers.lock().unwrap().remove(&tp);
                    let removed = self
                        .partitions
                        .get_mut(&tp.topic)
                        .and_then(|p| p.remove(&tp.partition));
                    let Some(partition) = removed else { continue };
                    // Queued messages are left for the partition's next
                    // owner; running calls finish, uncommitted.
                    let mut queue = partition.lane.queue.lock().unwrap();
                    queue.closed = true;
                    queue.clear();
                    let running = queue.running;
                    drop(queue);
                    partition.lane.wake.notify_waiters();
                    let previous = partition.previous.filter(|q| q.lock().unwrap().running > 0);
                    if running > 0 {
                        self.retired.insert(tp, partition.lane.queue.clone());
                    } else if let Some(previous) = previous {
                        self.retired.insert(tp, previous);
                    }
                }
            }
            Rebalanced::Assigned(tps) => {
                tracing::info!(
                    pipeline = self.name,
                    partitions = tps.len(),
                    "Partitions assigned."
                );
                for tp in tps {
                    // A partition paused under an earlier assignment must
                    // not stay paused.
                    self.resume(&tp);
                }
            }
        }
    }

    /// Resumes `tp`, unless its queue is full (it resumes when the queue
    /// drains) or the processor suspends it (it resumes when no longer
    /// suspended); a failure is retried on the tick.
    fn resume(&mut self, tp: &TopicPartition) {
        if self.suspended.contains(tp)
            || self
                .get(tp)
                .is_some_and(|p| p.lane.queue.lock().unwrap().full)
        {
            return;
        }
        match self.shared.consumer.resume(&tpl_of(tp)) {
            Ok(()) => {
                self.resume_failed.remove(tp);
            }
            Err(e) => {
                if self.resume_failed.insert(tp.clone()) {
                    tracing::warn!(pipeline = self.name, topic = tp.topic, partition = tp.partition, error = %e, "Cannot resume partition; retrying.");
                }
            }
        }
    }

    /// Pauses a partition whose queue is full; retried on the tick.
    fn pause_full(&mut self, tp: &TopicPartition) {
        let result = self.shared.consumer.pause(&tpl_of(tp));
        let name = self.name.clone();
        if let Some(p) = self.get(tp) {
            p.pause_failed = result.is_err();
            if let Err(e) = result {
                tracing::warn!(pipeline = name, topic = tp.topic, partition = tp.partition, error = %e, "Cannot pause a full partition; retrying.");
            }
        }
    }

    fn tick(&mut self) {
        store_positions(&self.shared.consumer, &self.partitions, &self.name);
        self.suspend();
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
        let pause: Vec<Arc<TopicPartition>> = self
            .partitions
            .values()
            .flat_map(|p| p.values())
            .filter(|p| p.pause_failed && p.lane.queue.lock().unwrap().full)
            .map(|p| p.lane.tp.clone())
            .collect();
        for tp in pause {
            self.pause_full(&tp);
        }
    }
}

/// Stores, in one call, the committable position of every partition whose
/// position moved since the last store.
fn store_positions<P>(
    consumer: &PipelineConsumer,
    partitions: &HashMap<String, HashMap<i32, Partition<P>>>,
    pipeline: &str,
) {
    let mut tpl = TopicPartitionList::new();
    for partition in partitions.values().flat_map(|p| p.values()) {
        if let Some(position) = partition.lane.tracker.lock().unwrap().take_unstored() {
            let tp = &partition.lane.tp;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn running(n: usize) -> Arc<Mutex<Queue>> {
        let queue = Arc::new(Mutex::new(Queue::default()));
        let mut q = queue.lock().unwrap();
        q.closed = true;
        q.running = n;
        drop(q);
        queue
    }

    /// The drain wakes when the last runner reports, at that instant: a
    /// poll on a timer would wake at the next multiple of its period.
    #[tokio::test(start_paused = true)]
    async fn the_drain_ends_when_the_last_runner_reports() {
        let queues = vec![running(1), running(2)];
        let (tx, mut rx) = mpsc::unbounded_channel();
        let tp = Arc::new(TopicPartition::new("in", 0));
        let start = tokio::time::Instant::now();
        let ending = queues.clone();
        tokio::spawn(async move {
            for (queue, at_ms) in [(0, 1_003), (1, 2_001), (1, 3_007)] {
                tokio::time::sleep_until(start + Duration::from_millis(at_ms)).await;
                let mut q = ending[queue].lock().unwrap();
                q.running -= 1;
                if q.running == 0 {
                    let _ = tx.send(Notice::Idle(tp.clone()));
                }
            }
        });
        let left = runners_ended(&queues, &mut rx, start + Duration::from_secs(60)).await;
        assert_eq!(left, 0);
        assert_eq!(start.elapsed(), Duration::from_millis(3_007));
    }

    /// A runner that never ends holds the drain up to its deadline, and no
    /// longer; it is counted as still running.
    #[tokio::test(start_paused = true)]
    async fn the_drain_gives_up_at_its_deadline() {
        let queues = vec![running(1), running(1)];
        let (tx, mut rx) = mpsc::unbounded_channel();
        let start = tokio::time::Instant::now();
        let ending = queues.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            ending[0].lock().unwrap().running = 0;
            let _ = tx.send(Notice::Idle(Arc::new(TopicPartition::new("in", 0))));
            // Keeps the channel open: the drain must not end on its close.
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        let left = runners_ended(&queues, &mut rx, start + Duration::from_secs(5)).await;
        assert_eq!(left, 1, "the first queue's runner ended and was seen");
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }
}
