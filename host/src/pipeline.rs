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
/// broker (or `MAX_QUEUE_BYTES` of keys and payloads, whichever comes
/// first); it is resumed when a quarter of them have started. A pause drops
/// what librdkafka prefetched and a resume waits on a fetch, so the queue
/// must hold more than a fast handler gets through in a fetch's time, or it
/// would wait on the broker after every resume.
const MIN_QUEUE: usize = 32_768;
/// The bytes (keys and payloads) queued on one partition before it is
/// paused.
const MAX_QUEUE_BYTES: usize = 16 << 20;
/// How often done offsets are stored for the next commit, and failed
/// pauses, seeks and resumes retried. Commits run every second, so this adds
/// nothing to commit latency, and it saves a call into librdkafka per
/// message.
const TICK: Duration = Duration::from_millis(100);
/// How long a runner with nothing to do waits for a message before it ends.
const RUNNER_IDLE: Duration = Duration::from_secs(1);
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

/// A partition's received, not yet started messages, shared by the loop
/// (which adds them) and the partition's runners (which take them).
#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// Keys with a call running.
    busy: HashSet<u64>,
    /// Runners working on the partition.
    running: usize,
    /// Revoked or stopping: runners take nothing more.
    closed: bool,
    /// Paused at the broker because `waiting` reached the queue size.
    full: bool,
    /// A runner asked the loop for more runners, not yet started.
    more_asked: bool,
    /// Key and payload bytes of `waiting`.
    bytes: usize,
    /// Runners waiting for a message to come free (counted in `running`).
    parked: usize,
}

impl Queue {
    /// The oldest waiting message that `ordering` lets start now, its key
    /// marked busy.
    fn take(&mut self, ordering: Ordering) -> Option<Waiting> {
        // Keys passed over in this scan: a later message of such a key must
        // not overtake it.
        let mut passed: HashSet<u64> = HashSet::new();
        for i in 0..self.waiting.len() {
            let key = self.waiting[i].key;
            let free = key.is_none_or(|k| !self.busy.contains(&k) && !passed.contains(&k));
            if free {
                let waiting = self.waiting.remove(i).expect("in range");
                self.bytes -= size_of(&waiting.message);
                if let Some(k) = waiting.key {
                    self.busy.insert(k);
                }
                return Some(waiting);
            }
            if ordering == Ordering::Partition {
                return None;
            }
            passed.extend(key);
        }
        None
    }
}

/// The bytes a queued message holds: its key and payload.
fn size_of(message: &OwnedMessage) -> usize {
    message.key().map_or(0, <[u8]>::len) + message.payload().map_or(0, <[u8]>::len)
}

/// What a partition's runners work with.
struct Lane<P> {
    shared: Arc<Shared<P>>,
    tp: Arc<TopicPartition>,
    tracker: Arc<Mutex<OffsetTracker>>,
    queue: Arc<Mutex<Queue>>,
    ordering: Ordering,
    /// Runners at once, at most: `max_in_flight`, 1 under `partition`.
    max: usize,
    /// A full queue is resumed at this length.
    half: usize,
    /// Wakes a parked runner.
    wake: tokio::sync::Notify,
    scheduler: mpsc::UnboundedSender<Scheduled>,
    notices: mpsc::UnboundedSender<Notice>,
}

/// What runners tell the loop.
enum Notice {
    /// A full partition's queue is down to half: resume it.
    Drained(Arc<TopicPartition>),
    /// The last runner of a closed (revoked) queue ended.
    Idle(Arc<TopicPartition>),
    /// More messages wait than runners run, with room for more.
    More(Arc<TopicPartition>),
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
        queue.waiting.clear();
        queue.bytes = 0;
    }
    for partition in this.partitions.values().flat_map(|p| p.values()) {
        partition.lane.wake.notify_waiters();
    }
    let running = || -> usize { queues.iter().map(|q| q.lock().unwrap().running).sum() };
    while running() > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let running = running();
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
        let bytes = size_of(&message);
        let queue_size = self.queue;
        let partition = self.partition(message.topic(), message.partition());
        partition.lane.tracker.lock().unwrap().begin(offset);
        let full = {
            let mut queue = partition.lane.queue.lock().unwrap();
            queue.waiting.push_back(Waiting { key, message });
            queue.bytes += bytes;
            let full = !queue.full
                && (queue.waiting.len() >= queue_size || queue.bytes >= MAX_QUEUE_BYTES);
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
            let tp = (topic.to_string(), partition);
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
                ordering,
                max: match ordering {
                    Ordering::Partition => 1,
                    _ => max_in_flight.max(1),
                },
                half: self.queue / 4 * 3,
                wake: tokio::sync::Notify::new(),
                scheduler: self.scheduler.clone(),
                notices: self.notices_tx.clone(),
            };
            self.partitions.entry(tp.0).or_default().insert(
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
        self.get_by(&tp.0, tp.1)
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
        let wanted = room.min(queue.waiting.len());
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
                    let removed = self.partitions.get_mut(&tp.0).and_then(|p| p.remove(&tp.1));
                    let Some(partition) = removed else { continue };
                    // Queued messages are left for the partition's next
                    // owner; running calls finish, uncommitted.
                    let mut queue = partition.lane.queue.lock().unwrap();
                    queue.closed = true;
                    queue.waiting.clear();
                    queue.bytes = 0;
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

/// A runner of one partition: takes the next message its ordering allows
/// and calls it, until none is left (or the queue is closed). While it has a
/// message and more wait, it asks the loop for more runners, up to the
/// lane's `max`. A call that panics halts the pipeline: its offset never
/// completes, so nothing past it is committed.
async fn run_lane<P: Processor>(lane: Arc<Lane<P>>) {
    /// What a runner does next, decided under the queue's lock.
    enum Step {
        Run(Waiting),
        Park,
        Exit,
    }
    let mut done_key: Option<u64> = None;
    loop {
        let step = {
            let mut queue = lane.queue.lock().unwrap();
            if let Some(k) = done_key.take() {
                queue.busy.remove(&k);
            }
            let next = match queue.closed {
                true => None,
                false => queue.take(lane.ordering),
            };
            match next {
                None if queue.closed => {
                    queue.running -= 1;
                    if queue.running == 0 {
                        let _ = lane.notices.send(Notice::Idle(lane.tp.clone()));
                    }
                    Step::Exit
                }
                None => {
                    queue.parked += 1;
                    Step::Park
                }
                Some(waiting) => {
                    if !queue.waiting.is_empty() {
                        if queue.parked > 0 {
                            lane.wake.notify_one();
                        } else if queue.running < lane.max && !queue.more_asked {
                            queue.more_asked = true;
                            let _ = lane.notices.send(Notice::More(lane.tp.clone()));
                        }
                    }
                    if queue.full
                        && queue.waiting.len() <= lane.half
                        && queue.bytes <= MAX_QUEUE_BYTES / 4 * 3
                    {
                        queue.full = false;
                        let _ = lane.notices.send(Notice::Drained(lane.tp.clone()));
                    }
                    Step::Run(waiting)
                }
            }
        };
        let Waiting { key, message } = match step {
            Step::Exit => return,
            Step::Park => {
                // Wait for a message (or a key) to come free: the loop wakes
                // a parked runner before it starts a new one.
                let woken = tokio::time::timeout(RUNNER_IDLE, lane.wake.notified())
                    .await
                    .is_ok();
                let mut queue = lane.queue.lock().unwrap();
                queue.parked -= 1;
                if !woken && queue.waiting.is_empty() {
                    queue.running -= 1;
                    if queue.closed && queue.running == 0 {
                        let _ = lane.notices.send(Notice::Idle(lane.tp.clone()));
                    }
                    return;
                }
                continue;
            }
            Step::Run(waiting) => waiting,
        };
        let offset = message.offset();
        let done = Completion::new(offset, lane.tracker.clone());
        let call = call(lane.shared.clone(), message, done, lane.scheduler.clone());
        if AssertUnwindSafe(call).catch_unwind().await.is_err() {
            let (topic, partition) = (&lane.tp.0, lane.tp.1);
            lane.shared.halt.fail(format!(
                "processing {topic}[{partition}]@{offset} panicked; nothing from that offset on is committed"
            ));
            lane.queue.lock().unwrap().running -= 1;
            return;
        }
        done_key = key;
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
