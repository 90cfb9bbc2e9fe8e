//! Producers librdkafka has failed for good, replaced by new ones.
//!
//! librdkafka puts an idempotent producer in a fatal state when it and the
//! broker no longer agree on a partition's sequence numbers, and does not
//! repair it: every later produce fails with `Fatal`. The record was never
//! the problem, so hopper replaces the producer with a new one made from the
//! same settings and produces the record again.
//!
//! [`Renewable`] holds the current producer for a pipeline's
//! [`crate::produce::HopProducer`] and for [`AwaitedProducer`], which the delay
//! relay's cancellation entries and DLQ replays use: records produced one by
//! one, each awaited.

use arc_swap::{ArcSwap, Guard};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{Message, ToBytes};
use rdkafka::producer::future_producer::Delivery;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, ProducerContext};
use rdkafka::types::{RDKafka, RDKafkaErrorCode};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A producer whose fatal state can be read, and raised for tests.
pub(crate) trait Client: Send + Sync + 'static {
    fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)>;
    fn native_ptr(&self) -> *mut RDKafka;
}

impl<C: ProducerContext + 'static> Client for rdkafka::producer::ThreadedProducer<C> {
    fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.client().fatal_error()
    }
    fn native_ptr(&self) -> *mut RDKafka {
        self.client().native_ptr()
    }
}

impl Client for FutureProducer {
    fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.client().fatal_error()
    }
    fn native_ptr(&self) -> *mut RDKafka {
        self.client().native_ptr()
    }
}

/// Whether `error` says the producer failed for good.
pub(crate) fn is_fatal(error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal)
}

type Make<P> = Box<dyn Fn() -> KafkaResult<P> + Send + Sync>;

/// The current producer, and how to make a new one.
pub(crate) struct Renewable<P> {
    current: ArcSwap<P>,
    make: Make<P>,
    /// Held while the producer is replaced, so that it is replaced once.
    renewing: Mutex<()>,
    /// How many times it was replaced.
    renewals: std::sync::atomic::AtomicU64,
    /// Names the producer in the log.
    name: String,
}

impl<P: Client> Renewable<P> {
    /// The first producer `make` makes.
    pub(crate) fn new(make: Make<P>, name: String) -> KafkaResult<Renewable<P>> {
        Ok(Renewable {
            current: ArcSwap::from_pointee(make()?),
            make,
            renewing: Mutex::new(()),
            renewals: std::sync::atomic::AtomicU64::new(0),
            name,
        })
    }

    pub(crate) fn load(&self) -> Guard<Arc<P>> {
        self.current.load()
    }

    /// The current producer, held for as long as a send awaits it.
    pub(crate) fn load_full(&self) -> Arc<P> {
        self.current.load_full()
    }

    /// Replaces the current producer when librdkafka has failed it for good,
    /// and logs librdkafka's reason. Does nothing when it has not, as when
    /// another caller replaced it first. The old producer is dropped on a
    /// thread of its own: dropping waits for its threads, and for up to
    /// 500 ms for what it purges to be reported.
    pub(crate) fn renew(&self) {
        let _one = self.renewing.lock().unwrap_or_else(PoisonError::into_inner);
        let failed = self.current.load_full();
        let Some((code, reason)) = failed.fatal_error() else {
            return;
        };
        match (self.make)() {
            Ok(new) => {
                self.current.store(Arc::new(new));
                self.renewals
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!(
                    producer = %self.name,
                    error = %format!("{code:?}: {reason}"),
                    "The producer failed for good; a new one produces every record it had not delivered."
                );
                let _ = std::thread::Builder::new()
                    .name("producer drop".into())
                    .spawn(move || drop(failed));
            }
            Err(e) => tracing::error!(
                producer = %self.name,
                error = %e,
                "The producer failed for good and no new one could be made; the next failed record tries again."
            ),
        }
    }

    /// How many times the producer was replaced.
    pub(crate) fn renewals(&self) -> u64 {
        self.renewals.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Raises a fatal error in the current producer through librdkafka's
    /// test interface, as a broker's answers can.
    pub(crate) fn raise_fatal(&self, reason: &str) {
        let reason = std::ffi::CString::new(reason).expect("a reason without NUL");
        let producer = self.current.load();
        // SAFETY: the client pointer is live while `producer` is held, and
        // librdkafka copies the reason.
        unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                producer.native_ptr(),
                rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                reason.as_ptr(),
            );
        }
    }
}

/// An idempotent, `acks=all` producer whose records are produced one by one
/// and awaited, outside a pipeline: the delay relay's cancellation entries
/// and DLQ replays. When librdkafka fails it for good, it is replaced and
/// the record that met the failure is produced once more on the new one.
pub struct AwaitedProducer {
    producer: Renewable<FutureProducer>,
}

impl AwaitedProducer {
    /// A producer made from `config`; `name` names it in the log.
    pub fn new(config: ClientConfig, name: &str) -> KafkaResult<AwaitedProducer> {
        let make: Make<FutureProducer> = Box::new(move || config.create());
        Ok(AwaitedProducer {
            producer: Renewable::new(make, name.to_string())?,
        })
    }

    /// The current producer.
    pub fn current(&self) -> Arc<FutureProducer> {
        self.producer.load_full()
    }

    /// Enqueues `record` without waiting: its acknowledgement is the
    /// future returned. Records enqueued to one partition are written in
    /// the order they were enqueued, with those [`AwaitedProducer::send`]
    /// produces (the producer is idempotent).
    pub fn enqueue<K, V>(
        &self,
        record: FutureRecord<'_, K, V>,
    ) -> Result<rdkafka::producer::DeliveryFuture, KafkaError>
    where
        K: ToBytes + ?Sized,
        V: ToBytes + ?Sized,
    {
        self.producer.load().send_result(record).map_err(|(e, _)| e)
    }

    /// Replaces the current producer when librdkafka has failed it for
    /// good; does nothing otherwise. [`AwaitedProducer::enqueue`] does not:
    /// its caller sees the failures, in the record's acknowledgement.
    pub fn renew_if_failed(&self) {
        self.producer.renew();
    }

    /// Produces `record` and waits for the broker's acknowledgement, or for
    /// `timeout` in librdkafka's queue.
    pub async fn send<K, V>(
        &self,
        record: FutureRecord<'_, K, V>,
        timeout: Duration,
    ) -> Result<Delivery, KafkaError>
    where
        K: ToBytes + ?Sized,
        V: ToBytes + ?Sized,
    {
        let producer = self.producer.load_full();
        let mut back = match producer.send(record, timeout).await {
            Ok(delivery) => return Ok(delivery),
            Err((e, _)) if !is_fatal(&e) => return Err(e),
            Err((_, back)) => back,
        };
        // Let go of the failed producer before the renewal, so that its
        // drop, which waits for its threads, runs on the renewal's thread
        // rather than this task's.
        drop(producer);
        self.producer.renew();
        let headers = back.detach_headers();
        let mut again = FutureRecord::<[u8], [u8]>::to(back.topic());
        if let Some(headers) = headers {
            again = again.headers(headers);
        }
        if let Some(at) = back.timestamp().to_millis() {
            again = again.timestamp(at);
        }
        if let Some(key) = back.key() {
            again = again.key(key);
        }
        if let Some(payload) = back.payload() {
            again = again.payload(payload);
        }
        let producer = self.producer.load_full();
        producer.send(again, timeout).await.map_err(|(e, _)| e)
    }

    /// Raises a fatal error in the current producer through librdkafka's
    /// test interface. For tests of the replacement.
    #[doc(hidden)]
    pub fn raise_fatal(&self, reason: &str) {
        self.producer.raise_fatal(reason);
    }

    /// How many times the producer was replaced, failed for good.
    pub fn renewals(&self) -> u64 {
        self.producer.renewals()
    }

    /// The current producer's fatal error, if librdkafka has failed it for
    /// good and it has not been replaced yet.
    pub fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.producer.load().fatal_error()
    }
}
