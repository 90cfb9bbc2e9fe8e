//! Producing hops, and completing their source offsets when they are
//! acknowledged.
//!
//! A pipeline's producer reports each delivery through librdkafka's delivery
//! callback, on the producer's own polling thread: the callback marks the
//! source offset done and reports the hop's event there and then. No task,
//! future or channel is made per hop; the record is handed to librdkafka
//! once, with its headers moved, not copied.
//!
//! A hop that fails to be acknowledged is produced again, with backoff, from
//! the copy librdkafka hands back in the failed delivery report, so hopper
//! keeps no copy of a record in flight. Its source offset stays unstored
//! until some attempt succeeds.

use crate::events::{Event, Telemetry};
use crate::hop::{Completion, OutRecord};
use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// A hop on its way to the broker: what its acknowledgement completes.
pub struct InFlight {
    done: Completion,
    event: Option<Event>,
    /// Failed deliveries so far, for the backoff.
    failures: u32,
    /// The record's timestamp, which a failed delivery report lacks.
    timestamp: i64,
    /// Keeps the pipeline's drain waiting until the hop is acknowledged.
    _pending: TaskTrackerToken,
}

/// A hop to produce again after a failed delivery.
struct Redo {
    record: OutRecord,
    hop: Box<InFlight>,
}

/// The producer's context: completes acknowledged hops.
pub struct HopContext {
    pipeline: String,
    telemetry: Telemetry,
    redo: mpsc::UnboundedSender<Redo>,
}

impl ClientContext for HopContext {}

impl ProducerContext for HopContext {
    type DeliveryOpaque = Box<InFlight>;

    fn delivery(&self, result: &DeliveryResult<'_>, mut hop: Box<InFlight>) {
        match result {
            Ok(_) => {
                // The token in `_pending` is dropped last: shutdown's drain
                // waits until the offset is marked done.
                let InFlight {
                    done,
                    event,
                    _pending,
                    ..
                } = *hop;
                done.complete();
                if let Some(event) = event {
                    self.telemetry.emit(event);
                }
            }
            Err((e, message)) => {
                tracing::warn!(
                    pipeline = self.pipeline,
                    topic = message.topic(),
                    error = %e,
                    "Hop was not acknowledged; producing again."
                );
                hop.failures += 1;
                let record = OutRecord {
                    topic: message.topic().to_string(),
                    key: message.key().map(<[u8]>::to_vec),
                    payload: message.payload().map(<[u8]>::to_vec),
                    headers: message.headers().map(|h| h.detach()).unwrap_or_default(),
                    timestamp: hop.timestamp,
                };
                // Only fails at shutdown; the offset then stays unstored and
                // the message is read again on restart.
                let _ = self.redo.send(Redo { record, hop });
            }
        }
    }
}

/// A pipeline's producer: idempotent, `acks=all`, completing hops from its
/// delivery callback.
pub struct HopProducer {
    producer: ThreadedProducer<HopContext>,
    pending: TaskTracker,
}

impl HopProducer {
    /// Wraps a producer created from `config`, and starts the task that
    /// produces failed hops again. `pending` counts hops in flight.
    pub fn new(
        config: &rdkafka::ClientConfig,
        pipeline: &str,
        telemetry: Telemetry,
        pending: TaskTracker,
    ) -> anyhow::Result<Arc<HopProducer>> {
        let (redo, redos) = mpsc::unbounded_channel();
        let context = HopContext {
            pipeline: pipeline.to_string(),
            telemetry,
            redo,
        };
        let producer = Arc::new(HopProducer {
            producer: config.create_with_context(context)?,
            pending,
        });
        tokio::spawn(produce_again(Arc::downgrade(&producer), redos));
        Ok(producer)
    }

    /// Fetches the metadata of `topics`, the topics this producer will
    /// produce to, so the first hop to each does not wait for it. Blocks up
    /// to 5 s per topic; a topic that does not answer is looked up again on
    /// its first hop.
    pub fn warm_up(&self, topics: &[String]) {
        for topic in topics {
            if let Err(e) = self
                .producer
                .client()
                .fetch_metadata(Some(topic), Duration::from_secs(5))
            {
                tracing::debug!(topic, error = %e, "Metadata not fetched ahead of the first hop.");
            }
        }
    }

    /// Enqueues `record`; once it is acknowledged, `event` is emitted and
    /// `done` completed. Waits only while the producer's queue is full.
    pub async fn send(&self, record: OutRecord, done: Completion, event: Option<Event>) {
        let hop = Box::new(InFlight {
            done,
            event,
            failures: 0,
            timestamp: record.timestamp,
            _pending: self.pending.token(),
        });
        self.enqueue(record, hop).await;
    }

    async fn enqueue(&self, record: OutRecord, hop: Box<InFlight>) {
        let OutRecord {
            topic,
            key,
            payload,
            headers,
            timestamp,
        } = record;
        let mut base = BaseRecord::<[u8], [u8], Box<InFlight>>::with_opaque_to(&topic, hop)
            .timestamp(timestamp)
            .headers(headers);
        if let Some(key) = &key {
            base = base.key(key.as_slice());
        }
        if let Some(payload) = &payload {
            base = base.payload(payload.as_slice());
        }
        loop {
            match self.producer.send(base) {
                Ok(()) => return,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    base = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, back)) => {
                    tracing::warn!(topic, error = %e, "Cannot enqueue hop; retrying.");
                    base = back;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
}

/// Produces failed hops again, each after its own backoff: 100 ms, doubling
/// up to 10 s. Ends when the producer is dropped.
async fn produce_again(
    producer: std::sync::Weak<HopProducer>,
    mut redos: mpsc::UnboundedReceiver<Redo>,
) {
    while let Some(Redo { record, hop }) = redos.recv().await {
        let backoff = Duration::from_millis(100)
            .saturating_mul(1 << hop.failures.saturating_sub(1).min(7))
            .min(Duration::from_secs(10));
        let producer = producer.clone();
        tokio::spawn(async move {
            tokio::time::sleep(backoff).await;
            if let Some(producer) = producer.upgrade() {
                producer.enqueue(record, hop).await;
            }
        });
    }
}
