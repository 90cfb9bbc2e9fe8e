//! The consumer loop shared by routes and the delay relay.
//!
//! The loop owns the consumer. It gates messages of tier topics through
//! [`Hold`] and queues every due message on its partition. From each
//! partition's queue it starts up to `max_in_flight` calls at once, in the
//! order the processor's [`Concurrency`] allows: one at a time
//! (`partition`), one per key (`key`), or any (`unordered`). Each call is a
//! task of its own; it never waits for a hop's acknowledgement: it enqueues
//! the produce and ends, and the producer's delivery callback marks the
//! offset done in the partition's [`OffsetTracker`], which stores the highest
//! offset below which every message is done. So however calls overtake each
//! other, only the contiguous prefix of done offsets is ever committed.
//!
//! Nothing here blocks the loop: a partition whose queue is full is paused at
//! the broker (and resumed at half), the blocking seek of a hold runs on a
//! blocking thread, and a failed pause, seek or resume is retried on the next
//! tick, never dropped. One slow partition holds up only itself.
//!
//! What happens to a message is the [`Processor`]'s business: a route calls
//! its handler, the delay relay moves the message one tier closer to its
//! time.

use crate::clock::now_ms;
use crate::events::Telemetry;
use crate::hold::{Gate, Hold, TopicPartition};
use crate::hop::{Action, Completion, Concurrency, Halt, Ordering, Processor};
use crate::offsets::OffsetTracker;
use crate::produce::HopProducer;
use crate::scheduler::{Scheduled, Scheduler};
use futures::FutureExt as _;
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Messages queued on one partition, at least, before it is paused at the
/// broker; it is resumed when half of them have started. Enough that a
/// partition of a fast handler does not wait on a fetch after each resume.
const MIN_QUEUE: usize = 1024;
/// How often done offsets are stored for the next commit, and failed
/// pauses, seeks and resumes retried. Commits run every second, so this adds
/// nothing to commit latency, and it saves a call into librdkafka per
/// message.
const TICK: Duration = Duration::from_millis(100);
/// The longest a hold's seek may block its (blocking) thread.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// Partitions gained or lost in a rebalance, sent from the consumer's
/// rebalance callback to the loop.
#[derive(Debug)]
pub enum Rebalanced {
    Assigned(Vec<TopicPartition>),
    Revoked(Vec<TopicPartition>),
}

/// The offset trackers of the partitions a pipeline owns, shared with its
/// rebalance callback.
pub type Trackers = Arc<Mutex<HashMap<TopicPartition, Arc<Mutex<OffsetTracker>>>>>;

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
                    let _ = commit.add_partition_offset(&tp.0, tp.1, Offset::Offset(position));
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

fn partitions(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

fn tpl_of(tp: &TopicPartition) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.0, tp.1);
    tpl
}

pub type PipelineConsumer = StreamConsumer<PipelineContext>;

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

/// A message waiting for its turn.
struct Waiting {
    /// Calls of the same key run one at a time; `None` runs whenever a slot
    /// is free.
    key: Option<u64>,
    message: OwnedMessage,
}

/// A partition, as the loop sees it.
struct Partition {
    tp: Arc<TopicPartition>,
    /// Tells this ownership of the partition from a later one.
    generation: u64,
    tracker: Arc<Mutex<OffsetTracker>>,
    /// Received and due, not started.
    waiting: VecDeque<Waiting>,
    /// Keys with a call running.
    busy: HashSet<u64>,
    running: usize,
    /// Paused at the broker because `waiting` is full.
    full: bool,
    /// The backpressure pause failed; retried on the tick.
    pause_failed: bool,
}

/// A call that ended, reported to the loop.
struct Finished {
    tp: Arc<TopicPartition>,
    generation: u64,
    key: Option<u64>,
    offset: i64,
    panicked: bool,
}

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
struct Seeked {
    tp: TopicPartition,
    offset: i64,
    result: Result<(), KafkaError>,
}

struct Loop<P: Processor> {
    shared: Arc<Shared<P>>,
    name: String,
    concurrency: Concurrency,
    queue: usize,
    partitions: HashMap<String, HashMap<i32, Partition>>,
    /// Calls still running from an earlier ownership of a partition: a
    /// re-assigned partition starts nothing until they end, so no two calls
    /// of one partition ever overlap across a rebalance.
    draining: HashMap<TopicPartition, usize>,
    generation: u64,
    hold: Hold,
    rewinds: HashMap<TopicPartition, Rewind>,
    /// Partitions whose resume failed; retried on the tick.
    resume_failed: HashSet<TopicPartition>,
    /// Partitions paused because the processor suspends their topic (a
    /// route's open circuit breaker).
    suspended: HashSet<TopicPartition>,
    finished_tx: mpsc::UnboundedSender<Finished>,
    seeked_tx: mpsc::UnboundedSender<Seeked>,
    scheduler: mpsc::UnboundedSender<Scheduled>,
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
    let (finished_tx, mut finished) = mpsc::unbounded_channel();
    let (seeked_tx, mut seeked) = mpsc::unbounded_channel();
    let mut this = Loop {
        name: name.clone(),
        concurrency,
        queue: MIN_QUEUE.max(concurrency.max_in_flight.saturating_mul(4)),
        partitions: HashMap::new(),
        draining: HashMap::new(),
        generation: 0,
        hold: Hold::reporting(shared.telemetry.health().held_heads(&name)),
        rewinds: HashMap::new(),
        resume_failed: HashSet::new(),
        suspended: HashSet::new(),
        finished_tx,
        seeked_tx,
        scheduler: Scheduler::spawn(shared.producer.clone(), stop_scheduler.clone()),
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
            Some(done) = finished.recv() => this.finished(done),
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
    let mut running = 0;
    for partition in this.partitions.values_mut().flat_map(|p| p.values_mut()) {
        partition.waiting.clear();
        running += partition.running;
    }
    running += this.draining.values().sum::<usize>();
    while running > 0 {
        match tokio::time::timeout_at(until.into(), finished.recv()).await {
            Ok(Some(done)) => {
                running -= 1;
                if done.panicked {
                    this.panicked(&done);
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
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

impl<P: Processor> Loop<P> {
    fn received(&mut self, message: rdkafka::message::BorrowedMessage<'_>) {
        let offset = message.offset();
        let (topic, partition) = (message.topic(), message.partition());
        if !self.rewinds.is_empty() {
            let tp = (topic.to_string(), partition);
            if self.rewinds.contains_key(&tp) {
                // Fetched before the rewind took hold: read again after it.
                return;
            }
        }
        if let Some(due) = self.shared.processor.due_at(&message) {
            let tp = (topic.to_string(), partition);
            match self.hold.gate(&tp, offset, due, now_ms()) {
                Gate::Pass => {}
                Gate::Discard => return,
                Gate::Hold { .. } => {
                    drop(message);
                    self.rewind(tp, offset);
                    return;
                }
            }
        }
        let key = match self.concurrency.ordering {
            Ordering::Partition => Some(0),
            Ordering::Key => message.key().map(|k| {
                let mut h = DefaultHasher::new();
                k.hash(&mut h);
                h.finish()
            }),
            Ordering::Unordered => None,
        };
        let message = message.detach();
        let queue = self.queue;
        let partition = self.partition(message.topic(), message.partition());
        partition.tracker.lock().unwrap().begin(offset);
        partition.waiting.push_back(Waiting { key, message });
        let tp = partition.tp.clone();
        self.start(&tp);
        let partition = self.get(&tp).expect("created above");
        if partition.waiting.len() >= queue && !partition.full {
            partition.full = true;
            let tp = partition.tp.clone();
            self.pause_full(&tp);
        }
    }

    /// The partition `(topic, partition)`, created on its first message.
    fn partition(&mut self, topic: &str, partition: i32) -> &mut Partition {
        if self.get_by(topic, partition).is_none() {
            self.generation += 1;
            let tp = (topic.to_string(), partition);
            let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
            self.shared
                .trackers
                .lock()
                .unwrap()
                .insert(tp.clone(), tracker.clone());
            self.partitions.entry(tp.0.clone()).or_default().insert(
                partition,
                Partition {
                    tp: Arc::new(tp),
                    generation: self.generation,
                    tracker,
                    waiting: VecDeque::new(),
                    busy: HashSet::new(),
                    running: 0,
                    full: false,
                    pause_failed: false,
                },
            );
        }
        self.get_by(topic, partition).expect("inserted above")
    }

    fn get_by(&mut self, topic: &str, partition: i32) -> Option<&mut Partition> {
        self.partitions.get_mut(topic)?.get_mut(&partition)
    }

    fn get(&mut self, tp: &TopicPartition) -> Option<&mut Partition> {
        self.get_by(&tp.0, tp.1)
    }

    /// Starts as many of `tp`'s waiting messages as its ordering and
    /// `max_in_flight` allow, oldest first.
    fn start(&mut self, tp: &TopicPartition) {
        if self.draining.contains_key(tp) {
            return;
        }
        let (ordering, max) = (
            self.concurrency.ordering,
            self.concurrency.max_in_flight.max(1),
        );
        let shared = self.shared.clone();
        let (finished, scheduler) = (self.finished_tx.clone(), self.scheduler.clone());
        let Some(partition) = self.get(tp) else {
            return;
        };
        // Keys passed over in this scan: a later message of such a key must
        // not overtake it.
        let mut passed: HashSet<u64> = HashSet::new();
        let mut i = 0;
        while partition.running < max && i < partition.waiting.len() {
            let key = partition.waiting[i].key;
            let free = key.is_none_or(|k| !partition.busy.contains(&k) && !passed.contains(&k));
            if !free {
                if ordering == Ordering::Partition {
                    break;
                }
                passed.extend(key);
                i += 1;
                continue;
            }
            let Waiting { key, message } = partition.waiting.remove(i).expect("in range");
            if let Some(k) = key {
                partition.busy.insert(k);
            }
            partition.running += 1;
            let offset = message.offset();
            let done = Completion::new(offset, partition.tracker.clone());
            let report = Finished {
                tp: partition.tp.clone(),
                generation: partition.generation,
                key,
                offset,
                panicked: false,
            };
            let call = call(shared.clone(), message, done, scheduler.clone());
            let finished = finished.clone();
            tokio::spawn(async move {
                let panicked = AssertUnwindSafe(call).catch_unwind().await.is_err();
                let _ = finished.send(Finished { panicked, ..report });
            });
        }
    }

    fn finished(&mut self, done: Finished) {
        if done.panicked {
            self.panicked(&done);
        }
        let queue = self.queue;
        let current = match self.get(&done.tp) {
            Some(p) if p.generation == done.generation => {
                p.running -= 1;
                if let Some(k) = done.key {
                    p.busy.remove(&k);
                }
                true
            }
            _ => false,
        };
        if !current {
            // A call of an earlier ownership of the partition.
            if let Some(left) = self.draining.get_mut(&done.tp) {
                *left -= 1;
                if *left == 0 {
                    self.draining.remove(&done.tp);
                    self.start(&done.tp);
                }
            }
            return;
        }
        self.start(&done.tp);
        if let Some(p) = self.get(&done.tp)
            && p.full
            && p.waiting.len() <= queue / 2
        {
            p.full = false;
            p.pause_failed = false;
            let tp = p.tp.clone();
            if !self.hold.is_held(&tp) && !self.rewinds.contains_key(&tp) {
                self.resume(&tp);
            }
        }
    }

    /// A call panicked: its offset is never done, so nothing past it is
    /// committed, and the pipeline stops rather than run on around it.
    fn panicked(&self, done: &Finished) {
        let (topic, partition) = (&done.tp.0, done.tp.1);
        self.shared.halt.fail(format!(
            "processing {topic}[{partition}]@{} panicked; nothing from that offset on is committed",
            done.offset
        ));
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
                    let removed = self.partitions.get_mut(&tp.0).and_then(|p| p.remove(&tp.1));
                    if let Some(partition) = removed
                        && partition.running > 0
                    {
                        *self.draining.entry(tp).or_default() += partition.running;
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

    /// Pauses `tp` and seeks it back to `offset`, the held message, so that
    /// offset is fetched again after the resume. The seek blocks, so it runs
    /// on a blocking thread; until it is done, messages of `tp` are dropped
    /// (they are fetched again after it). A failed pause or seek is retried
    /// on the tick: the held message is never skipped.
    ///
    /// Ordering relies on librdkafka's op versions: pause, seek and resume
    /// each bump the partition's version, and messages fetched under an
    /// older version are dropped at poll time. So after the resume the first
    /// message of the partition is `offset` again, and offsets are queued in
    /// order, which [`OffsetTracker`] depends on.
    fn rewind(&mut self, tp: TopicPartition, offset: i64) {
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
                    tracing::warn!(pipeline = self.name, topic = tp.0, partition = tp.1, error = %e, "Cannot pause partition; retrying.");
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
            let result = consumer.seek(&tp.0, tp.1, Offset::Offset(offset), SEEK_TIMEOUT);
            let _ = seeked.send(Seeked { tp, offset, result });
        });
    }

    fn seeked(&mut self, seek: Seeked) {
        let Some(rewind) = self.rewinds.get_mut(&seek.tp) else {
            return; // revoked meanwhile
        };
        if rewind.offset != seek.offset {
            return;
        }
        rewind.seeking = false;
        if let Err(e) = seek.result {
            tracing::warn!(pipeline = self.name, topic = seek.tp.0, partition = seek.tp.1, error = %e, "Cannot seek partition back to its held message; retrying.");
            return;
        }
        let rewind = self.rewinds.remove(&seek.tp).expect("found above");
        if rewind.resume_after {
            self.resume(&seek.tp);
        }
    }

    /// Resumes `tp`, unless its queue is full (it resumes when the queue
    /// drains) or the processor suspends it (it resumes when no longer
    /// suspended); a failure is retried on the tick.
    fn resume(&mut self, tp: &TopicPartition) {
        if self.suspended.contains(tp) || self.get(tp).is_some_and(|p| p.full) {
            return;
        }
        match self.shared.consumer.resume(&tpl_of(tp)) {
            Ok(()) => {
                self.resume_failed.remove(tp);
            }
            Err(e) => {
                if self.resume_failed.insert(tp.clone()) {
                    tracing::warn!(pipeline = self.name, topic = tp.0, partition = tp.1, error = %e, "Cannot resume partition; retrying.");
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
                tracing::warn!(pipeline = name, topic = tp.0, partition = tp.1, error = %e, "Cannot pause a full partition; retrying.");
            }
        }
    }

    /// Pauses the assigned partitions of the topics the processor suspends
    /// now, and resumes those it paused once their topic is no longer
    /// suspended, unless the hold, a rewind or a full queue keeps them
    /// paused. A pause makes librdkafka fetch from the last message the loop
    /// received once resumed, so nothing is skipped; a message received
    /// before the pause is processed as usual (a route's breaker sends a
    /// tier message back to its tier).
    fn suspend(&mut self) {
        let topics = self.shared.processor.suspended(now_ms());
        if topics.is_empty() && self.suspended.is_empty() {
            return;
        }
        let assigned: HashSet<TopicPartition> = match self.shared.consumer.assignment() {
            Ok(tpl) => partitions(&tpl).into_iter().collect(),
            Err(_) => return, // tried again on the next tick
        };
        let mut now_suspended = HashSet::new();
        for tp in assigned.iter().filter(|tp| topics.contains(&tp.0)) {
            if self.suspended.contains(tp) {
                now_suspended.insert(tp.clone());
                continue;
            }
            match self.shared.consumer.pause(&tpl_of(tp)) {
                Ok(()) => _ = now_suspended.insert(tp.clone()),
                Err(e) => {
                    tracing::warn!(pipeline = self.name, topic = tp.0, partition = tp.1, error = %e, "Cannot suspend partition; trying again.")
                }
            }
        }
        let released: Vec<TopicPartition> = std::mem::replace(&mut self.suspended, now_suspended)
            .into_iter()
            .filter(|tp| !self.suspended.contains(tp) && assigned.contains(tp))
            .collect();
        for tp in released {
            if !self.hold.is_held(&tp) && !self.rewinds.contains_key(&tp) {
                self.resume(&tp);
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
            .filter(|p| p.full && p.pause_failed)
            .map(|p| p.tp.clone())
            .collect();
        for tp in pause {
            self.pause_full(&tp);
        }
    }
}

/// Stores, in one call, the committable position of every partition whose
/// position moved since the last store.
fn store_positions(
    consumer: &PipelineConsumer,
    partitions: &HashMap<String, HashMap<i32, Partition>>,
    pipeline: &str,
) {
    let mut tpl = TopicPartitionList::new();
    for partition in partitions.values().flat_map(|p| p.values()) {
        if let Some(position) = partition.tracker.lock().unwrap().take_unstored() {
            let tp = &partition.tp;
            let _ = tpl.add_partition_offset(&tp.0, tp.1, Offset::Offset(position));
        }
    }
    if tpl.count() == 0 {
        return;
    }
    if let Err(e) = consumer.store_offsets(&tpl) {
        // Expected after a revoke: the partition's next owner redelivers.
        tracing::debug!(pipeline, error = %e, "Offsets not stored.");
    }
}

/// One call: processes `message` and hands its hops to the producer (or the
/// scheduler). Its offset is done when they are acknowledged.
async fn call<P: Processor>(
    shared: Arc<Shared<P>>,
    message: OwnedMessage,
    done: Completion,
    scheduler: mpsc::UnboundedSender<Scheduled>,
) {
    match shared.processor.process(&message).await {
        Action::Done => done.complete(),
        Action::Hop(hop) => shared.producer.send(hop.record, done, hop.event).await,
        Action::Hops(hops) if hops.is_empty() => done.complete(),
        Action::Hops(hops) => {
            let dones = done.split(hops.len());
            for (hop, done) in hops.into_iter().zip(dones) {
                shared.producer.send(hop.record, done, hop.event).await;
            }
        }
        Action::HopAt { at_ms, hop } => {
            // The scheduler lives until shutdown; if it is gone, the offset
            // simply stays uncommitted.
            let _ = scheduler.send(Scheduled { at_ms, hop, done });
        }
    }
}
