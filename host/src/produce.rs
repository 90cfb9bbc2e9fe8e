//! Producing hops, and completing their source offsets when they are
//! acknowledged.
//!
//! A pipeline's producer reports each delivery through librdkafka's delivery
//! callback, on the producer's own polling thread: the callback marks the
//! source offset done and reports the hop's event there and then. No task,
//! future or channel is made per hop; the record is handed to librdkafka
//! once, with its headers moved, not copied.
//!
//! A producer holds a bounded number of hops the broker has not
//! acknowledged (`Cluster::hops_held`, 5,000 unless configured): a hop past
//! that waits, and each delivery report frees a place and wakes one waiting
//! hop. A route that fails faster than the broker takes its hops so slows
//! to the broker's pace, instead of queueing a backlog that its producer's
//! threads and the broker go on writing after the route has stopped.
//!
//! A hop that is not acknowledged is classified ([`classify`]):
//! - a transient error (a broker down, a timeout, too few replicas) is
//!   produced again, with backoff, from the copy librdkafka hands back in the
//!   failed delivery report, so hopper keeps no copy of a record in flight.
//!   Its source offset stays unstored until some attempt succeeds: a produce
//!   that keeps failing never lets its source offset be committed;
//! - a hop the broker refuses for good (too large once hopper's headers are
//!   added, its topic deleted, not authorized) is dead-lettered instead,
//!   with reason `RECORD_TOO_LARGE` (payload cut, full size recorded) or
//!   `HOP_FAILED`;
//! - a dead-letter record refused for good has nowhere left to go: the
//!   pipeline is halted ([`Halt`]), its offset is never completed, and
//!   hopper exits non-zero;
//! - a producer that librdkafka has failed for good (a fatal error: the
//!   idempotent producer and the broker no longer agree on a partition's
//!   sequence numbers, which librdkafka does not repair) is replaced by a
//!   new one ([`Renewable::renew`]), and every hop it had not delivered
//!   is produced again on the new one. The hop was never the problem: it
//!   is not dead-lettered, and the pipeline goes on. The producers that
//!   await their records one by one outside a pipeline, the delay relay's
//!   cancellation entries and DLQ replays
//!   ([`crate::renewable::AwaitedProducer`]), are replaced the same way.

use crate::events::{self, Event, Telemetry};
use crate::headers::{self, Reason};
use crate::hop::{Completion, DeadLetter, Halt, OutRecord, Outcome, PlannedHop};
use crate::renewable::{Renewable, is_fatal};
use crate::types::HopFailure;
use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// Failures in a row after which a hop to a topic the broker does not know
/// is refused for good: a topic being created answers well within this
/// (100 ms + 200 ms + ... ≈ 3 s of backoff), a deleted one never does.
const UNKNOWN_TOPIC_TRIES: u32 = 5;

/// What a produce error means for the hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Try again after a backoff.
    Transient,
    /// The record is larger than the broker accepts: dead-letter it with its
    /// payload cut.
    TooLarge,
    /// The broker will never accept it: dead-letter it.
    Refused,
    /// The producer will never produce again: replace it, and produce the
    /// hop on the new one.
    Fatal,
}

/// Classifies librdkafka's error `code` for a hop that has now failed
/// `failures` times in a row.
pub fn classify(code: RDKafkaErrorCode, failures: u32) -> Failure {
    use RDKafkaErrorCode as E;
    match code {
        E::MessageSizeTooLarge | E::MessageBatchTooLarge => Failure::TooLarge,
        E::TopicAuthorizationFailed
        | E::ClusterAuthorizationFailed
        | E::InvalidArgument
        | E::InvalidRecord
        | E::InvalidTopic
        | E::PolicyViolation => Failure::Refused,
        E::Fatal => Failure::Fatal,
        E::UnknownTopic | E::UnknownTopicOrPartition | E::UnknownPartition
            if failures >= UNKNOWN_TOPIC_TRIES =>
        {
            Failure::Refused
        }
        _ => Failure::Transient,
    }
}

/// A hop on its way to the broker: what its acknowledgement completes.
pub struct Unacked {
    done: Completion,
    /// What the hop is: its event is made from it on the acknowledgement.
    outcome: Outcome,
    /// Failed deliveries in a row, for the backoff and [`classify`].
    failures: u32,
    /// The record's timestamp, which a failed delivery report lacks.
    timestamp: i64,
    /// Keeps the pipeline's drain waiting until the hop is acknowledged.
    _pending: TaskTrackerToken,
}

/// A hop to produce again after a failed delivery, or to dead-letter.
struct Redo {
    record: OutRecord,
    hop: Box<Unacked>,
    /// Set when the broker refused the hop for good: why, and its error.
    refused: Option<(Reason, String)>,
    /// Set when the producer that failed it failed for good.
    fatal: bool,
}

/// The producer's context: completes acknowledged hops.
#[derive(Clone)]
pub struct HopContext {
    /// The route's name, or `delay` for the relay.
    route: String,
    telemetry: Telemetry,
    redo: mpsc::UnboundedSender<Redo>,
    room: Arc<Room>,
}

/// The hops a producer holds that the broker has not acknowledged yet, and
/// those waiting for one of them to be: a hop is enqueued only while fewer
/// than `limit` are held. Each delivery report frees its place at once and
/// wakes one waiting hop, so the bound does not leave the queue idle while
/// librdkafka frees its own count of a batch of reports.
struct Room {
    limit: usize,
    held: AtomicUsize,
    /// Hops waiting now; while none are, a delivery costs one load of this.
    waiting: AtomicUsize,
    notify: tokio::sync::Notify,
}

impl Room {
    fn new(limit: usize) -> Self {
        Room {
            limit: limit.max(1),
            held: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            notify: tokio::sync::Notify::new(),
        }
    }

    /// Takes a place for a hop, waiting while every place is held.
    async fn take(&self) {
        loop {
            let held = self.held.load(SeqCst);
            if held < self.limit {
                if self
                    .held
                    .compare_exchange_weak(held, held + 1, SeqCst, SeqCst)
                    .is_ok()
                {
                    return;
                }
                continue;
            }
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            self.waiting.fetch_add(1, SeqCst);
            // A place freed between the load above and `waiting` counting
            // this hop woke nobody: look again before sleeping.
            if self.held.load(SeqCst) >= self.limit {
                notified.await;
            }
            self.waiting.fetch_sub(1, SeqCst);
        }
    }

    /// Frees a hop's place (it was acknowledged, failed, or never
    /// enqueued), and wakes a waiting hop if there is one.
    fn free(&self) {
        self.held.fetch_sub(1, SeqCst);
        if self.waiting.load(SeqCst) > 0 {
            self.notify.notify_one();
        }
    }
}

impl ClientContext for HopContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.telemetry
            .health()
            .connection()
            .log(level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        let watch = self.telemetry.health().connection();
        watch.error(&self.route, &error, reason);
    }
}

impl ProducerContext for HopContext {
    type DeliveryOpaque = Box<Unacked>;

    fn delivery(&self, result: &DeliveryResult<'_>, mut hop: Box<Unacked>) {
        self.room.free();
        match result {
            Ok(_) => {
                // The token in `_pending` is dropped last: shutdown's drain
                // waits until the offset is marked done.
                let Unacked {
                    done,
                    outcome,
                    _pending,
                    ..
                } = *hop;
                done.complete();
                self.telemetry.emit(outcome);
            }
            Err((e, message)) => {
                hop.failures += 1;
                let record = OutRecord {
                    topic: message.topic().to_string(),
                    key: message.key().map(<[u8]>::to_vec),
                    payload: message.payload().map(<[u8]>::to_vec),
                    headers: message.headers().map(|h| h.detach()).unwrap_or_default(),
                    timestamp: hop.timestamp,
                };
                let refused = refusal(e, hop.failures, &record.topic);
                let fatal = is_fatal(e);
                if refused.is_none() {
                    self.telemetry.emit(events::HopFailed {
                        route: self.route.clone(),
                        topic: record.topic.clone(),
                        error: e.to_string(),
                        outcome: HopFailure::Retried,
                    });
                }
                // Only fails at shutdown; the offset then stays unstored and
                // the message is read again on restart.
                let _ = self.redo.send(Redo {
                    record,
                    hop,
                    refused,
                    fatal,
                });
            }
        }
    }
}

/// Why the broker refused a hop to `topic` for good, if it did.
fn refusal(error: &KafkaError, failures: u32, topic: &str) -> Option<(Reason, String)> {
    let reason = refused_for_good(error.rdkafka_error_code(), failures)?;
    Some((reason, format!("producing to `{topic}` failed: {error}")))
}

/// Asked just before a hop is produced whether it still should be. The
/// delay relay's cancellation table is one: it drops a forward that a
/// cancel read meanwhile covers, however long the forward waited in memory.
pub trait Veto: Send + Sync + 'static {
    /// `None`: produce the hop. `Some(event)`: drop it; its source offset
    /// is done at once, and `event` says why.
    fn veto(&self, record: &OutRecord, outcome: &Outcome) -> Option<Event>;
}

/// A pipeline's producer: idempotent, `acks=all`, completing hops from its
/// delivery callback.
pub struct HopProducer {
    /// Replaced by a new one when librdkafka fails it for good.
    producer: Renewable<ThreadedProducer<HopContext>>,
    pending: TaskTracker,
    /// The route's name, or `delay` for the relay.
    route: String,
    /// Where hops refused for good go.
    dlq: String,
    telemetry: Telemetry,
    /// Set when a dead-letter record is refused for good.
    halt: Arc<Halt>,
    /// Set once, before the pipeline starts, for the delay relay.
    veto: std::sync::OnceLock<Arc<dyn Veto>>,
    /// The places for hops not yet acknowledged.
    room: Arc<Room>,
}

/// A second veto was offered to a hop producer ([`HopProducer::set_veto`]).
#[derive(Debug, thiserror::Error)]
#[error("the hop producer already has a veto")]
pub struct VetoTaken;

impl HopProducer {
    /// Wraps a producer created from `config`, and starts the task that
    /// produces failed hops again. It holds at most `hops_held` hops the
    /// broker has not acknowledged; `pending` counts hops in flight; hops
    /// refused for good go to `dlq`, and a dead-letter record refused for
    /// good sets `halt`.
    pub fn new(
        config: &rdkafka::ClientConfig,
        hops_held: usize,
        route: &str,
        dlq: &str,
        telemetry: Telemetry,
        pending: TaskTracker,
        halt: Arc<Halt>,
    ) -> rdkafka::error::KafkaResult<Arc<HopProducer>> {
        let (redo, redos) = mpsc::unbounded_channel();
        let room = Arc::new(Room::new(hops_held));
        let context = HopContext {
            route: route.to_string(),
            telemetry: telemetry.clone(),
            redo,
            room: room.clone(),
        };
        let config = config.clone();
        let make = Box::new(move || config.create_with_context(context.clone()));
        let producer = Arc::new(HopProducer {
            producer: Renewable::new(make, format!("pipeline `{route}`"))?,
            pending,
            route: route.to_string(),
            dlq: dlq.to_string(),
            telemetry,
            halt,
            veto: std::sync::OnceLock::new(),
            room,
        });
        tokio::spawn(produce_again(Arc::downgrade(&producer), redos));
        Ok(producer)
    }

    /// Fetches the metadata of `topics`, the topics this producer will
    /// produce to, so the first hop to each does not wait for it. Blocks up
    /// to 5 s per topic; a topic that does not answer is looked up again on
    /// its first hop. Run it on a blocking thread.
    pub fn warm_up(&self, topics: &[String]) {
        for topic in topics {
            if let Err(e) = self
                .producer
                .load()
                .client()
                .fetch_metadata(Some(topic), Duration::from_secs(5))
            {
                tracing::debug!(topic, error = %e, "Metadata not fetched ahead of the first hop.");
            }
        }
    }

    /// Has `veto` look at every hop before it is produced. Set once, before
    /// the first hop; a second one is refused.
    pub fn set_veto(&self, veto: Arc<dyn Veto>) -> Result<(), VetoTaken> {
        self.veto.set(veto).map_err(|_| VetoTaken)
    }

    /// Enqueues `hop`'s record; once it is acknowledged, `done` is completed
    /// and the event of its outcome emitted. Waits only while the producer
    /// holds as many hops not yet acknowledged as it may (`hops_held`),
    /// while its queue is full, or while it refuses to enqueue for a
    /// transient reason. A hop the veto stops is not produced: `done`
    /// completes at once.
    pub async fn send(&self, hop: PlannedHop, done: Completion) {
        let PlannedHop { record, outcome } = hop;
        if let Some(veto) = self.veto.get()
            && let Some(why) = veto.veto(&record, &outcome)
        {
            done.complete();
            self.telemetry.emit(why);
            return;
        }
        let hop = Box::new(Unacked {
            done,
            outcome,
            failures: 0,
            timestamp: record.timestamp,
            _pending: self.pending.token(),
        });
        self.enqueue(record, hop).await;
    }

    async fn enqueue(&self, record: OutRecord, mut hop: Box<Unacked>) {
        let OutRecord {
            topic,
            key,
            payload,
            mut headers,
            timestamp,
        } = record;
        loop {
            self.room.take().await;
            let mut base = BaseRecord::<[u8], [u8], Box<Unacked>>::with_opaque_to(&topic, hop)
                .timestamp(timestamp)
                .headers(headers);
            if let Some(key) = &key {
                base = base.key(key.as_slice());
            }
            if let Some(payload) = &payload {
                base = base.payload(payload.as_slice());
            }
            let (e, back) = match self.producer.load().send(base) {
                Ok(()) => return,
                Err(failed) => failed,
            };
            if is_fatal(&e) {
                // Whatever the old producer had not delivered is reported
                // failed when it is dropped (purged), and produced again.
                self.producer.renew();
            }
            self.room.free();
            hop = back.delivery_opaque;
            headers = back.headers.unwrap_or_else(OwnedHeaders::new);
            if let KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) = e {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            hop.failures += 1;
            if let Some((reason, error)) = refusal(&e, hop.failures, &topic) {
                let record = OutRecord {
                    topic,
                    key,
                    payload,
                    headers,
                    timestamp,
                };
                Box::pin(self.refused(record, hop, reason, error)).await;
                return;
            }
            self.telemetry.emit(events::HopFailed {
                route: self.route.clone(),
                topic: topic.clone(),
                error: e.to_string(),
                outcome: HopFailure::Retried,
            });
            tokio::time::sleep(backoff(hop.failures)).await;
        }
    }

    /// Raises a fatal error in the current producer through librdkafka's
    /// test interface, as a broker's answers can. For tests of the
    /// replacement.
    #[doc(hidden)]
    pub fn raise_fatal(&self, reason: &str) {
        self.producer.raise_fatal(reason);
    }

    /// A hop the broker refused for good: its dead-letter record takes its
    /// place (same completion, so the source offset is done once the DLQ
    /// record is acknowledged). A dead-letter record refused for good halts
    /// the pipeline, and its source offset is never completed.
    async fn refused(&self, record: OutRecord, hop: Box<Unacked>, reason: Reason, error: String) {
        let topic = record.topic.clone();
        let dead = match instead_of_refused(&self.route, &self.dlq, record, reason, &error) {
            Ok(dead) => dead,
            Err(_) => {
                self.telemetry.emit(events::HopFailed {
                    route: self.route.clone(),
                    topic,
                    error: error.clone(),
                    outcome: HopFailure::Halted,
                });
                self.halt.fail(format!(
                    "a dead-letter record of `{}` was refused for good: {error}",
                    self.route
                ));
                // Dropping the hop releases the drain without completing the
                // offset: it is read again after a restart.
                drop(hop);
                return;
            }
        };
        self.telemetry.emit(events::HopFailed {
            route: self.route.clone(),
            topic,
            error,
            outcome: HopFailure::DeadLettered,
        });
        let Unacked {
            done, _pending: p, ..
        } = *hop;
        let hop = Box::new(Unacked {
            done,
            outcome: dead.outcome,
            failures: 0,
            timestamp: dead.record.timestamp,
            _pending: p,
        });
        self.enqueue(dead.record, hop).await;
    }
}

/// The dead letter that takes the place of `record`, a hop of `route` the
/// broker refused for good (`reason`, `error`). `Err(record)` when it is
/// itself a dead letter to `dlq` with nowhere left to go: one too large
/// with its payload whole is tried once more, cut; one refused otherwise
/// never goes anywhere.
pub fn instead_of_refused(
    route: &str,
    dlq: &str,
    record: OutRecord,
    reason: Reason,
    error: &str,
) -> Result<PlannedHop, OutRecord> {
    let cuttable = reason == Reason::RecordTooLarge
        && record
            .payload
            .as_ref()
            .is_some_and(|p| p.len() > crate::dlq::CUT_PAYLOAD_BYTES);
    if record.topic == dlq && !cuttable {
        return Err(record);
    }
    let text = |name| {
        record
            .headers
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let id = text(headers::ID).unwrap_or_default();
    let attempt = text(headers::ATTEMPT)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    Ok(PlannedHop {
        record: crate::dlq::of_failed_hop(record, dlq, reason, error),
        outcome: Outcome::DeadLetter(DeadLetter {
            route: route.to_string(),
            id,
            attempt,
            topic: dlq.to_string(),
            reason,
            error: error.to_string(),
            version: None,
        }),
    })
}

/// Why the broker refused a hop to `topic` for good, if it did, by
/// librdkafka's error `code` after `failures` in a row.
pub fn refused_for_good(code: Option<RDKafkaErrorCode>, failures: u32) -> Option<Reason> {
    match classify(code?, failures) {
        Failure::Transient | Failure::Fatal => None,
        Failure::TooLarge => Some(Reason::RecordTooLarge),
        Failure::Refused => Some(Reason::HopFailed),
    }
}

/// 100 ms after the first failure, doubling up to 10 s.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100)
        .saturating_mul(1 << failures.saturating_sub(1).min(7))
        .min(Duration::from_secs(10))
}

/// Produces failed hops again, each after its own backoff, and dead-letters
/// refused ones. Ends when the producer is dropped.
async fn produce_again(
    producer: std::sync::Weak<HopProducer>,
    mut redos: mpsc::UnboundedReceiver<Redo>,
) {
    while let Some(Redo {
        record,
        hop,
        refused,
        fatal,
    }) = redos.recv().await
    {
        let producer = producer.clone();
        tokio::spawn(async move {
            if fatal && let Some(producer) = producer.upgrade() {
                producer.producer.renew();
            }
            if refused.is_none() {
                tokio::time::sleep(backoff(hop.failures)).await;
            }
            let Some(producer) = producer.upgrade() else {
                return;
            };
            match refused {
                Some((reason, error)) => producer.refused(record, hop, reason, error).await,
                None => producer.enqueue(record, hop).await,
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_the_broker_repeats_forever_are_not_retried_forever() {
        use RDKafkaErrorCode as E;
        assert_eq!(classify(E::MessageSizeTooLarge, 1), Failure::TooLarge);
        assert_eq!(classify(E::TopicAuthorizationFailed, 1), Failure::Refused);
        assert_eq!(classify(E::Fatal, 1), Failure::Fatal);
        assert_eq!(classify(E::MessageTimedOut, 50), Failure::Transient);
        assert_eq!(classify(E::AllBrokersDown, 50), Failure::Transient);
        assert_eq!(classify(E::NotEnoughReplicas, 50), Failure::Transient);
        assert_eq!(
            classify(E::UnknownTopicOrPartition, 1),
            Failure::Transient,
            "a topic just created may not be known yet"
        );
        assert_eq!(
            classify(E::UnknownTopicOrPartition, UNKNOWN_TOPIC_TRIES),
            Failure::Refused
        );
    }

    #[tokio::test]
    async fn a_hop_waits_for_a_place_and_each_freed_place_lets_one_in() {
        let room = Arc::new(Room::new(2));
        room.take().await;
        room.take().await;
        assert_eq!(room.held.load(SeqCst), 2);
        let (tx, mut rx) = mpsc::unbounded_channel();
        for i in 0..3 {
            let (room, tx) = (room.clone(), tx.clone());
            tokio::spawn(async move {
                room.take().await;
                tx.send(i).unwrap();
            });
        }
        // All three wait: every place is held.
        while room.waiting.load(SeqCst) < 3 {
            tokio::task::yield_now().await;
        }
        assert!(rx.try_recv().is_err());
        room.free();
        rx.recv().await.unwrap();
        room.free();
        rx.recv().await.unwrap();
        // The third waits still, and would have been seen: one more place
        // lets it in.
        while room.waiting.load(SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        assert!(rx.try_recv().is_err());
        assert_eq!(room.held.load(SeqCst), 2);
        room.free();
        rx.recv().await.unwrap();
        assert_eq!(room.held.load(SeqCst), 2);
    }

    #[test]
    fn no_place_freed_from_another_thread_is_missed() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let room = Arc::new(Room::new(4));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        // As librdkafka's poll thread does: free one place per report.
        let freer = {
            let room = room.clone();
            std::thread::spawn(move || {
                while rx.recv().is_ok() {
                    room.free();
                }
            })
        };
        runtime.block_on(async {
            let hops = (0..8).map(|_| {
                let (room, tx) = (room.clone(), tx.clone());
                tokio::spawn(async move {
                    for _ in 0..2_000 {
                        room.take().await;
                        assert!(room.held.load(SeqCst) <= 4);
                        tx.send(()).unwrap();
                    }
                })
            });
            for hop in hops.collect::<Vec<_>>() {
                tokio::time::timeout(Duration::from_secs(60), hop)
                    .await
                    .expect("a hop waited for a place freed long before")
                    .unwrap();
            }
        });
        drop(tx);
        freer.join().unwrap();
        assert_eq!(room.held.load(SeqCst), 0);
    }
}
