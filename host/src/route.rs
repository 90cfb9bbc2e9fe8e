//! One route's consumer loop: input topics and retry tiers in, handler
//! verdicts out.
//!
//! The loop owns the consumer. It gates tier messages through [`Hold`], and
//! hands every due message to the worker of its partition. Each partition has
//! one worker task, so a partition is handled in offset order while different
//! partitions run in parallel. A worker never waits for a hop's
//! acknowledgement: it enqueues the produce and moves on, and the ack task
//! marks the offset done in the partition's [`OffsetTracker`], which stores the
//! highest offset below which every message is done.

use crate::config::Route;
use crate::events::{Event, Telemetry};
use crate::headers::{self, Envelope, Hop, Incoming, Reason};
use crate::hold::{Gate, Hold, TopicPartition};
use crate::offsets::OffsetTracker;
use crate::plugin::{Delivery, Handler, Verdict};
use crate::retry::{Decision, decide};
use rdkafka::consumer::{Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Messages queued per partition worker before the poll loop waits.
const WORKER_QUEUE: usize = 1024;
/// How long shutdown waits for in-flight hops to be acknowledged.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Milliseconds since the Unix epoch, the unit of every time header.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The handler currently serving a route. Swapped whole on reload; a call
/// clones the `Handler` out, so calls in flight finish on the version they
/// started with.
pub struct HandlerSlot {
    // std RwLock: held only to clone an Arc, never across an .await.
    current: RwLock<Handler>,
}

impl HandlerSlot {
    pub fn new(handler: Handler) -> Self {
        Self {
            current: RwLock::new(handler),
        }
    }
    pub fn current(&self) -> Handler {
        self.current.read().unwrap().clone()
    }
    pub fn swap(&self, handler: Handler) -> Handler {
        std::mem::replace(&mut *self.current.write().unwrap(), handler)
    }
}

/// Partitions gained or lost in a rebalance, sent from the consumer's
/// rebalance callback to the loop.
#[derive(Debug)]
pub enum Rebalanced {
    Assigned(Vec<TopicPartition>),
    Revoked(Vec<TopicPartition>),
}

/// Consumer context that reports rebalances to the route loop.
pub struct RouteContext {
    pub route: String,
    /// Dropped with the consumer; the loop's receiver then sees the end.
    pub rebalances: mpsc::UnboundedSender<Rebalanced>,
}

impl ClientContext for RouteContext {}

impl ConsumerContext for RouteContext {
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
                tracing::warn!(route = self.route, error = %e, "Rebalance failed.")
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

pub type RouteConsumer = StreamConsumer<RouteContext>;

/// What the loop and the workers of one route share.
pub struct Shared {
    pub route: Arc<Route>,
    /// Retry tier topic → how long its messages wait.
    pub tiers: HashMap<String, Duration>,
    pub handler: Arc<HandlerSlot>,
    pub producer: FutureProducer,
    pub consumer: Arc<RouteConsumer>,
    pub telemetry: Telemetry,
    /// Ack tasks still waiting for their produce; shutdown waits on it.
    pub acks: TaskTracker,
}

/// A partition's worker, as the loop sees it.
struct Worker {
    /// Dropping it ends the worker after its current message.
    tx: mpsc::Sender<OwnedMessage>,
    tracker: Arc<Mutex<OffsetTracker>>,
    /// Set when the partition is revoked or hopper shuts down: queued
    /// messages are then left for the partition's next owner.
    cancelled: Arc<AtomicBool>,
    join: tokio::task::JoinHandle<()>,
}

/// Runs the loop until `shutdown`, then drains: the current message of each
/// partition finishes, in-flight hops are acknowledged, stored offsets are
/// committed.
pub async fn run(
    shared: Arc<Shared>,
    mut rebalances: mpsc::UnboundedReceiver<Rebalanced>,
    shutdown: CancellationToken,
) {
    let route = shared.route.name.clone();
    let consumer = shared.consumer.clone();
    let mut hold = Hold::default();
    let mut workers: HashMap<TopicPartition, Worker> = HashMap::new();

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
                        if let Some(worker) = workers.remove(&tp) {
                            worker.cancelled.store(true, Ordering::SeqCst);
                        }
                    }
                }
                Rebalanced::Assigned(tps) => {
                    tracing::info!(route, partitions = tps.len(), "Partitions assigned.");
                    for tp in tps {
                        // A partition paused under an earlier assignment
                        // must not stay paused.
                        let _ = consumer.resume(&tpl_of(&tp));
                    }
                }
            },
            _ = async { match wake { Some(sleep) => sleep.await, None => std::future::pending().await } } => {
                for tp in hold.take_due(now_ms()) {
                    if let Err(e) = consumer.resume(&tpl_of(&tp)) {
                        tracing::warn!(route, topic = tp.0, partition = tp.1, error = %e, "Cannot resume partition.");
                    }
                }
            }
            received = consumer.recv() => {
                let message = match received {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(route, error = %e, "Consumer error.");
                        continue;
                    }
                };
                let tp = (message.topic().to_string(), message.partition());
                let offset = message.offset();
                if let Some(delay) = shared.tiers.get(&tp.0) {
                    let due = due_at(&message, *delay);
                    match hold.gate(&tp, offset, due, now_ms()) {
                        Gate::Pass => {}
                        Gate::Discard => continue,
                        Gate::Hold { .. } => {
                            drop(message);
                            if let Err(e) = pause_at(&consumer, &tp, offset) {
                                tracing::warn!(route, topic = tp.0, partition = tp.1, error = %e, "Cannot hold partition.");
                                hold.release(&tp);
                            }
                            continue;
                        }
                    }
                }
                let owned = message.detach();
                let worker = workers
                    .entry(tp.clone())
                    .or_insert_with(|| spawn_worker(shared.clone(), tp.clone()));
                worker.tracker.lock().unwrap().begin(offset);
                if worker.tx.send(owned).await.is_err() {
                    tracing::error!(route, topic = tp.0, partition = tp.1, "Partition worker ended unexpectedly.");
                    workers.remove(&tp);
                }
            }
        }
    }

    // Drain: stop taking new messages, let each worker finish its current
    // one, wait for in-flight hops, then commit what was stored.
    tracing::info!(route, "Route stopping.");
    let mut joins = Vec::new();
    for (_, worker) in workers.drain() {
        worker.cancelled.store(true, Ordering::SeqCst);
        drop(worker.tx);
        joins.push(worker.join);
    }
    for join in joins {
        let _ = join.await;
    }
    shared.acks.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, shared.acks.wait())
        .await
        .is_err()
    {
        tracing::warn!(route, "Some hops were not acknowledged before shutdown; they will be redelivered.");
    }
    match consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => tracing::warn!(route, error = %e, "Final commit failed."),
    }
    consumer.unsubscribe();
    tracing::info!(route, "Route stopped.");
}

/// When a tier message is due: its `hopper-due-at`, else its timestamp plus
/// the tier's wait, else now.
fn due_at<M: Message>(message: &M, delay: Duration) -> i64 {
    if let Ok(Some(due)) = headers::text(message.headers(), headers::DUE_AT)
        && let Ok(due) = due.parse::<i64>()
    {
        return due;
    }
    match message.timestamp().to_millis() {
        Some(ts) => ts + delay.as_millis() as i64,
        None => now_ms(),
    }
}

/// Pauses `tp` and rewinds it to `offset`, so that offset is fetched again
/// after the resume.
fn pause_at(consumer: &RouteConsumer, tp: &TopicPartition, offset: i64) -> Result<(), KafkaError> {
    consumer.pause(&tpl_of(tp))?;
    consumer.seek(&tp.0, tp.1, Offset::Offset(offset), Duration::from_secs(10))
}

fn spawn_worker(shared: Arc<Shared>, tp: TopicPartition) -> Worker {
    let (tx, rx) = mpsc::channel(WORKER_QUEUE);
    let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
    let cancelled = Arc::new(AtomicBool::new(false));
    let join = tokio::spawn(work(shared, tp, rx, tracker.clone(), cancelled.clone()));
    Worker {
        tx,
        tracker,
        cancelled,
        join,
    }
}

/// One partition's worker: handles its messages one at a time, in order.
async fn work(
    shared: Arc<Shared>,
    tp: TopicPartition,
    mut rx: mpsc::Receiver<OwnedMessage>,
    tracker: Arc<Mutex<OffsetTracker>>,
    cancelled: Arc<AtomicBool>,
) {
    while let Some(message) = rx.recv().await {
        if cancelled.load(Ordering::SeqCst) {
            return;
        }
        let offset = message.offset();
        match handle(&shared, &message).await {
            None => mark_done(&shared, &tp, &tracker, offset),
            Some(hop) => {
                let delivery = enqueue(&shared.producer, &hop.record).await;
                let (shared, tp, tracker) = (shared.clone(), tp.clone(), tracker.clone());
                shared.acks.clone().spawn(async move {
                    acknowledge(&shared, delivery, &hop.record).await;
                    shared.telemetry.emit(hop.event);
                    mark_done(&shared, &tp, &tracker, offset);
                });
            }
        }
    }
}

fn mark_done(shared: &Shared, tp: &TopicPartition, tracker: &Mutex<OffsetTracker>, offset: i64) {
    let position = tracker.lock().unwrap().complete(offset);
    if let Some(position) = position {
        let mut tpl = TopicPartitionList::new();
        if tpl
            .add_partition_offset(&tp.0, tp.1, Offset::Offset(position))
            .is_ok()
            && let Err(e) = shared.consumer.store_offsets(&tpl)
        {
            // Expected after a revoke: the partition's next owner redelivers.
            tracing::debug!(route = shared.route.name, topic = tp.0, partition = tp.1, error = %e, "Offset not stored.");
        }
    }
}

/// A record to produce, owned so it can be produced again after a failure.
pub struct OutRecord {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: OwnedHeaders,
    pub timestamp: i64,
}

struct PlannedHop {
    record: OutRecord,
    /// Emitted once the hop is acknowledged.
    event: Event,
}

type DeliveryFuture = rdkafka::producer::DeliveryFuture;

/// Puts a record on the producer's queue, waiting while the queue is full.
pub async fn enqueue(producer: &FutureProducer, record: &OutRecord) -> DeliveryFuture {
    loop {
        let mut r = FutureRecord::<[u8], [u8]>::to(&record.topic)
            .headers(record.headers.clone())
            .timestamp(record.timestamp);
        if let Some(key) = &record.key {
            r = r.key(key.as_slice());
        }
        if let Some(payload) = &record.payload {
            r = r.payload(payload.as_slice());
        }
        match producer.send_result(r) {
            Ok(delivery) => return delivery,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((e, _)) => {
                tracing::warn!(topic = record.topic, error = %e, "Cannot enqueue hop; retrying.");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Waits until the record is acknowledged, producing it again after each
/// failure: the source offset must not be stored before the hop is durable.
pub async fn acknowledge(shared: &Shared, mut delivery: DeliveryFuture, record: &OutRecord) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match delivery.await {
            Ok(Ok(_)) => return,
            Ok(Err((e, _))) => {
                tracing::warn!(route = shared.route.name, topic = record.topic, error = %e, "Hop was not acknowledged; producing again.");
            }
            Err(_) => {
                tracing::warn!(route = shared.route.name, topic = record.topic, "Producer dropped a hop; producing again.");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
        delivery = enqueue(&shared.producer, record).await;
    }
}

/// Handles one message: reads its envelope, calls the handler, and plans the
/// next hop. `None` means the message is done and needs no hop.
async fn handle(shared: &Shared, message: &OwnedMessage) -> Option<PlannedHop> {
    let route = &shared.route;
    let incoming = Incoming {
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        timestamp: message.timestamp().to_millis(),
        headers: message.headers(),
    };
    let from_tier = shared.tiers.contains_key(message.topic());
    let envelope = if from_tier {
        Envelope::from_tier(&incoming)
    } else {
        Envelope::from_input(&incoming)
    };
    let envelope = match envelope {
        Ok(envelope) => envelope,
        Err(problem) => {
            let mut envelope = Envelope {
                id: headers::default_id(incoming.topic, incoming.partition, incoming.offset),
                attempts_made: 0,
                origin: headers::Origin {
                    topic: incoming.topic.to_string(),
                    partition: incoming.partition,
                    offset: incoming.offset,
                    timestamp: incoming.timestamp,
                },
                first_failure_at: None,
                trail: Vec::new(),
            };
            if let Ok(Some(id)) = headers::text(message.headers(), headers::ID) {
                envelope.id = headers::shorten(id, headers::MAX_ID_BYTES);
            }
            let decision = Decision::DeadLetter {
                reason: Reason::InvalidEnvelope,
                error: problem.to_string(),
            };
            return Some(plan(shared, message, &envelope, 0, None, decision));
        }
    };
    let attempt = envelope.attempts_made + 1;
    let handler = shared.handler.current();
    let delivery = Delivery {
        id: envelope.id.clone(),
        topic: message.topic().to_string(),
        partition: message.partition(),
        offset: message.offset(),
        key: message.key().map(<[u8]>::to_vec),
        payload: message.payload().map(<[u8]>::to_vec),
        headers: message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default(),
        timestamp: incoming.timestamp,
        attempt,
        route: route.name.clone(),
    };
    let verdict = handler.call(delivery).await;
    shared.telemetry.emit(Event::Handled {
        route: route.name.clone(),
        id: envelope.id.clone(),
        topic: message.topic().to_string(),
        partition: message.partition(),
        offset: message.offset(),
        attempt,
        verdict: verdict.label(),
        version: handler.version().to_string(),
        at_ms: now_ms(),
    });
    if let Verdict::Failed { class, error } = &verdict {
        tracing::warn!(route = route.name, id = envelope.id, attempt, class = class.as_str(), error, "Handler call failed.");
    }
    let decision = decide(route, attempt, &verdict);
    if decision == Decision::Commit {
        return None;
    }
    Some(plan(shared, message, &envelope, attempt, Some(&handler), decision))
}

/// Builds the record of the next hop and the event that reports it.
fn plan(
    shared: &Shared,
    message: &OwnedMessage,
    envelope: &Envelope,
    attempt: u32,
    handler: Option<&Handler>,
    decision: Decision,
) -> PlannedHop {
    let route = &shared.route;
    let now = now_ms();
    let trail_entry = decision.trail_entry();
    let (topic, reason, error, due_at, event) = match decision {
        Decision::Commit => unreachable!("a committed message has no hop"),
        Decision::Retry {
            topic,
            delay,
            reason,
            error,
        } => {
            let event = Event::RetryScheduled {
                route: route.name.clone(),
                id: envelope.id.clone(),
                attempt,
                topic: topic.clone(),
                delay,
                reason,
            };
            (topic, reason, error, Some(now + delay.as_millis() as i64), event)
        }
        Decision::DeadLetter { reason, error } => {
            let event = Event::DeadLettered {
                route: route.name.clone(),
                id: envelope.id.clone(),
                attempt,
                topic: route.dlq.clone(),
                reason,
                error: error.clone(),
            };
            (route.dlq.clone(), reason, error, None, event)
        }
    };
    let headers = headers::next_hop_headers(
        message.headers(),
        envelope,
        &Hop {
            route: &route.name,
            attempts_made: attempt,
            reason: Some(reason),
            error: Some(&error),
            failed_at: Some(now),
            handler: handler.map(|h| (h.name(), h.version())),
            trail_entry: &trail_entry,
            due_at,
        },
    );
    PlannedHop {
        record: OutRecord {
            topic,
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
            headers,
            timestamp: now,
        },
        event,
    }
}
