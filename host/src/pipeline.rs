//! The consumer loop shared by routes and the delay relay.
//!
//! The loop owns the consumer. It gates messages of tier topics through
//! [`Hold`] and hands every due message to the worker of its partition. Each
//! partition has one worker task, so a partition is processed in offset order
//! while different partitions run in parallel. A worker never waits for a
//! hop's acknowledgement: it enqueues the produce and moves on, and the ack
//! task marks the offset done in the partition's [`OffsetTracker`], which
//! stores the highest offset below which every message is done.
//!
//! What happens to a message is the [`Processor`]'s business: a route calls
//! its handler, the delay relay moves the message one tier closer to its
//! time.

use crate::clock::now_ms;
use crate::events::Telemetry;
use crate::hold::{Gate, Hold, TopicPartition};
use crate::hop::{Action, Completion, Processor};
use crate::offsets::OffsetTracker;
use crate::produce::HopProducer;
use crate::scheduler::{Scheduled, Scheduler};
use rdkafka::consumer::{Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Messages queued per partition worker before the poll loop waits.
const WORKER_QUEUE: usize = 1024;
/// How often done offsets are stored for the next commit. Commits run every
/// second, so this adds nothing to commit latency, and it saves a call into
/// librdkafka per message.
const STORE_EVERY: Duration = Duration::from_millis(100);
/// How long shutdown waits for in-flight hops to be acknowledged.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Partitions gained or lost in a rebalance, sent from the consumer's
/// rebalance callback to the loop.
#[derive(Debug)]
pub enum Rebalanced {
    Assigned(Vec<TopicPartition>),
    Revoked(Vec<TopicPartition>),
}

/// Consumer context that reports rebalances to the loop.
pub struct PipelineContext {
    pub name: String,
    /// Dropped with the consumer; the loop's receiver then sees the end.
    pub rebalances: mpsc::UnboundedSender<Rebalanced>,
}

impl ClientContext for PipelineContext {}

impl ConsumerContext for PipelineContext {
    fn pre_rebalance(&self, _: &rdkafka::consumer::BaseConsumer<Self>, r: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = r {
            let _ = self.rebalances.send(Rebalanced::Revoked(partitions(tpl)));
        }
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

/// What the loop, the workers and the producer of one pipeline share.
pub struct Shared<P> {
    pub processor: P,
    pub producer: Arc<HopProducer>,
    pub consumer: Arc<PipelineConsumer>,
    pub telemetry: Telemetry,
    /// Hops not yet acknowledged; shutdown waits on it.
    pub acks: TaskTracker,
}

/// A partition's worker, as the loop sees it.
struct Worker {
    tp: TopicPartition,
    /// Dropping it ends the worker after its current message.
    tx: mpsc::Sender<OwnedMessage>,
    tracker: Arc<Mutex<OffsetTracker>>,
    /// Set when the partition is revoked or the pipeline shuts down: queued
    /// messages are then left for the partition's next owner.
    cancelled: Arc<AtomicBool>,
    join: tokio::task::JoinHandle<()>,
}

/// The loop's partition workers, found by topic and partition without
/// allocating a key per message.
#[derive(Default)]
struct Workers {
    by_topic: HashMap<String, HashMap<i32, Worker>>,
}

impl Workers {
    fn get(&self, topic: &str, partition: i32) -> Option<&Worker> {
        self.by_topic.get(topic)?.get(&partition)
    }

    fn insert(&mut self, worker: Worker) -> &Worker {
        let (topic, partition) = worker.tp.clone();
        self.by_topic
            .entry(topic)
            .or_default()
            .entry(partition)
            .insert_entry(worker)
            .into_mut()
    }

    fn remove(&mut self, tp: &TopicPartition) -> Option<Worker> {
        self.by_topic.get_mut(&tp.0)?.remove(&tp.1)
    }

    fn iter(&self) -> impl Iterator<Item = (&TopicPartition, &Arc<Mutex<OffsetTracker>>)> {
        self.by_topic
            .values()
            .flat_map(|p| p.values())
            .map(|w| (&w.tp, &w.tracker))
    }

    fn drain(&mut self) -> impl Iterator<Item = Worker> + '_ {
        self.by_topic.drain().flat_map(|(_, p)| p.into_values())
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

/// Runs the loop until `shutdown`, then drains: the current message of each
/// partition finishes, in-flight hops are acknowledged, stored offsets are
/// committed. Messages held in memory for a later time are not forwarded;
/// their offsets were never stored, so they are read again on restart.
pub async fn run<P: Processor>(
    shared: Arc<Shared<P>>,
    mut rebalances: mpsc::UnboundedReceiver<Rebalanced>,
    shutdown: CancellationToken,
) {
    let name = shared.processor.name().to_string();
    let consumer = shared.consumer.clone();
    let mut hold = Hold::reporting(shared.telemetry.health().held_heads(&name));
    let mut workers = Workers::default();
    let scheduler = Scheduler::spawn(shared.producer.clone(), shutdown.clone());
    // Partitions paused because the processor suspends their topic.
    let mut suspended = HashSet::new();
    let mut store_tick = tokio::time::interval(STORE_EVERY);
    store_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        let wake = hold.next_due().map(|due| {
            let wait = (due - now_ms()).max(0) as u64;
            tokio::time::sleep(Duration::from_millis(wait))
        });
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(event) = rebalances.recv() => match event {
                Rebalanced::Revoked(tps) => {
                    for tp in tps {
                        hold.release(&tp);
                        suspended.remove(&tp);
                        if let Some(worker) = workers.remove(&tp) {
                            worker.cancelled.store(true, Ordering::SeqCst);
                        }
                    }
                }
                Rebalanced::Assigned(tps) => {
                    tracing::info!(pipeline = name, partitions = tps.len(), "Partitions assigned.");
                    for tp in tps {
                        // A partition paused under an earlier assignment
                        // must not stay paused.
                        let _ = consumer.resume(&tpl_of(&tp));
                    }
                }
            },
            _ = store_tick.tick() => {
                store_positions(&consumer, workers.iter(), &name);
                suspend(&shared, &hold, &mut suspended, &name);
            }
            _ = async { match wake { Some(sleep) => sleep.await, None => std::future::pending().await } } => {
                for tp in hold.take_due(now_ms()) {
                    if suspended.contains(&tp) {
                        continue; // resumed by `suspend` once no longer suspended
                    }
                    if let Err(e) = consumer.resume(&tpl_of(&tp)) {
                        tracing::warn!(pipeline = name, topic = tp.0, partition = tp.1, error = %e, "Cannot resume partition.");
                    }
                }
            }
            received = consumer.recv() => {
                let message = match received {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(pipeline = name, error = %e, "Consumer error.");
                        continue;
                    }
                };
                let offset = message.offset();
                if let Some(due) = shared.processor.due_at(&message) {
                    let tp = (message.topic().to_string(), message.partition());
                    match hold.gate(&tp, offset, due, now_ms()) {
                        Gate::Pass => {}
                        Gate::Discard => continue,
                        Gate::Hold { .. } => {
                            drop(message);
                            if let Err(e) = pause_at(&consumer, &tp, offset) {
                                tracing::warn!(pipeline = name, topic = tp.0, partition = tp.1, error = %e, "Cannot hold partition.");
                                hold.release(&tp);
                            }
                            continue;
                        }
                    }
                }
                let (topic, partition) = (message.topic(), message.partition());
                let worker = match workers.get(topic, partition) {
                    Some(worker) => worker,
                    None => {
                        let tp = (topic.to_string(), partition);
                        workers.insert(spawn_worker(shared.clone(), tp, scheduler.clone()))
                    }
                };
                worker.tracker.lock().unwrap().begin(offset);
                if worker.tx.send(message.detach()).await.is_err() {
                    let tp = worker.tp.clone();
                    tracing::error!(pipeline = name, topic = tp.0, partition = tp.1, "Partition worker ended unexpectedly.");
                    workers.remove(&tp);
                }
            }
        }
    }

    // Drain: stop taking new messages, let each worker finish its current
    // one, wait for in-flight hops, then commit what was stored.
    tracing::info!(pipeline = name, "Stopping.");
    let mut stopping = Vec::new();
    for worker in workers.drain() {
        worker.cancelled.store(true, Ordering::SeqCst);
        let Worker {
            tp,
            tx,
            tracker,
            join,
            ..
        } = worker;
        drop(tx);
        stopping.push((tp, tracker, join));
    }
    for (_, _, join) in &mut stopping {
        let _ = join.await;
    }
    shared.acks.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, shared.acks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            pipeline = name,
            "Some hops were not acknowledged before shutdown; they will be redelivered."
        );
    }
    store_positions(
        &consumer,
        stopping.iter().map(|(tp, tracker, _)| (tp, tracker)),
        &name,
    );
    match consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => tracing::warn!(pipeline = name, error = %e, "Final commit failed."),
    }
    consumer.unsubscribe();
    tracing::info!(pipeline = name, "Stopped.");
}

/// Pauses the assigned partitions of the topics the processor suspends now,
/// and resumes those it paused once their topic is no longer suspended,
/// except a partition the hold keeps until its head is due: the hold resumes
/// that one at its time. A pause makes librdkafka fetch from the last
/// message the loop received once resumed, so nothing is skipped; a message
/// dispatched before the pause is processed as usual (a route's breaker
/// sends a tier message back to its tier).
fn suspend<P: Processor>(
    shared: &Shared<P>,
    hold: &Hold,
    paused: &mut HashSet<TopicPartition>,
    name: &str,
) {
    let topics = shared.processor.suspended(now_ms());
    if topics.is_empty() && paused.is_empty() {
        return;
    }
    let assigned: HashSet<TopicPartition> = match shared.consumer.assignment() {
        Ok(tpl) => partitions(&tpl).into_iter().collect(),
        Err(_) => return, // tried again on the next tick
    };
    let mut now_paused = HashSet::new();
    for tp in assigned.iter().filter(|tp| topics.contains(&tp.0)) {
        let done = match paused.contains(tp) {
            true => Ok(()),
            false => shared.consumer.pause(&tpl_of(tp)),
        };
        match done {
            Ok(()) => _ = now_paused.insert(tp.clone()),
            Err(e) => {
                tracing::warn!(pipeline = name, topic = tp.0, partition = tp.1, error = %e, "Cannot suspend partition; trying again.")
            }
        }
    }
    for tp in std::mem::take(paused) {
        if !now_paused.contains(&tp)
            && !hold.holds(&tp)
            && let Err(e) = shared.consumer.resume(&tpl_of(&tp))
            && assigned.contains(&tp)
        {
            tracing::warn!(pipeline = name, topic = tp.0, partition = tp.1, error = %e, "Cannot resume partition; trying again.");
            now_paused.insert(tp);
        }
    }
    *paused = now_paused;
}

/// Pauses `tp` and rewinds it to `offset`, so that offset is fetched again
/// after the resume.
///
/// Ordering relies on librdkafka's op versions: pause, seek and resume each
/// bump the partition's version, and messages fetched under an older version
/// are dropped at poll time. Messages polled before the pause takes effect
/// are dropped by [`Hold`] (`Gate::Discard`). So after a resume the first
/// message of the partition is `offset` again, and offsets are dispatched in
/// order, which [`OffsetTracker`] depends on.
fn pause_at(
    consumer: &PipelineConsumer,
    tp: &TopicPartition,
    offset: i64,
) -> Result<(), KafkaError> {
    consumer.pause(&tpl_of(tp))?;
    consumer.seek(&tp.0, tp.1, Offset::Offset(offset), Duration::from_secs(10))
}

fn spawn_worker<P: Processor>(
    shared: Arc<Shared<P>>,
    tp: TopicPartition,
    scheduler: mpsc::UnboundedSender<Scheduled>,
) -> Worker {
    let (tx, rx) = mpsc::channel(WORKER_QUEUE);
    let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
    let cancelled = Arc::new(AtomicBool::new(false));
    let join = tokio::spawn(work(
        shared,
        rx,
        tracker.clone(),
        cancelled.clone(),
        scheduler,
    ));
    Worker {
        tp,
        tx,
        tracker,
        cancelled,
        join,
    }
}

/// One partition's worker: processes its messages one at a time, in order.
async fn work<P: Processor>(
    shared: Arc<Shared<P>>,
    mut rx: mpsc::Receiver<OwnedMessage>,
    tracker: Arc<Mutex<OffsetTracker>>,
    cancelled: Arc<AtomicBool>,
    scheduler: mpsc::UnboundedSender<Scheduled>,
) {
    while let Some(message) = rx.recv().await {
        if cancelled.load(Ordering::SeqCst) {
            return;
        }
        let done = Completion::new(message.offset(), tracker.clone());
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
                // The scheduler lives until shutdown; if it is gone, the
                // offset simply stays uncommitted.
                let _ = scheduler.send(Scheduled { at_ms, hop, done });
            }
        }
    }
}
