//! What a processed message turns into: the records to produce next, and the
//! offset they complete once acknowledged.
//!
//! This is the vocabulary shared by the layers below the processors: a
//! [`Processor`] (a route or the delay relay) returns an [`Action`]; the
//! pipeline hands its [`PlannedHop`]s to the producer or the scheduler; the
//! producer's delivery callback calls [`Completion::complete`], which marks
//! the source offset done in its partition's [`OffsetTracker`].

use crate::clock::now_ms;
pub use crate::config::Concurrency;
use crate::events::Event;
use crate::offsets::OffsetTracker;
use rdkafka::message::{BorrowedMessage, Message, OwnedHeaders, OwnedMessage};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

/// Decides what happens to each message of a pipeline.
pub trait Processor: Send + Sync + 'static {
    /// A short name for logs: the route name, or `delay`.
    fn name(&self) -> &str;

    /// The topics its hops go to, known in advance (a delayed message's
    /// target is not).
    fn hop_topics(&self) -> Vec<String>;

    /// When a message read from a tier topic is due, or `None` when its
    /// topic is not a tier (it is processed at once).
    fn due_at(&self, message: &BorrowedMessage<'_>) -> Option<i64>;

    /// Processes one due message.
    fn process(&self, message: &OwnedMessage) -> impl Future<Output = Action> + Send;

    /// The dead-letter topic a hop that can never be produced goes to.
    fn dlq_topic(&self) -> &str;

    /// How many messages of one partition may be processed at once, and in
    /// what order.
    fn concurrency(&self) -> Concurrency {
        Concurrency::ONE_AT_A_TIME
    }

    /// The topics whose partitions must stay paused at `now_ms` (a route's
    /// open circuit breaker pauses its retry tiers, and maybe its inputs);
    /// empty when every topic may be consumed. Asked every store tick.
    fn suspended(&self, _now_ms: i64) -> &[String] {
        &[]
    }
}

/// Why a pipeline must stop at once: something that can never succeed and
/// must not be skipped (a dead-letter record the broker refuses for good, a
/// processing task that panicked). Set once; the pipeline's loop watches it.
#[derive(Default)]
pub struct Halt {
    token: tokio_util::sync::CancellationToken,
    reason: Mutex<Option<String>>,
}

impl Halt {
    /// Stops the pipeline; the first reason given is the one reported.
    pub fn fail(&self, reason: impl Into<String>) {
        let mut slot = self.reason.lock().unwrap();
        if slot.is_none() {
            *slot = Some(reason.into());
        }
        drop(slot);
        self.token.cancel();
    }

    pub fn reason(&self) -> Option<String> {
        self.reason.lock().unwrap().clone()
    }

    pub async fn failed(&self) {
        self.token.cancelled().await
    }
}

/// What to do with a processed message.
pub enum Action {
    /// Done: the offset may be committed.
    Done,
    /// Produce this record; the offset is done once it is acknowledged.
    Hop(PlannedHop),
    /// Produce these records; the offset is done once every one of them is
    /// acknowledged (none: done at once).
    Hops(Vec<PlannedHop>),
    /// Keep this record in memory and produce it at `at_ms` (epoch ms). Used
    /// only for the last stretch of a delay, shorter than the smallest tier.
    HopAt { at_ms: i64, hop: PlannedHop },
}

/// A record to produce, and the event that reports it once acknowledged.
pub struct PlannedHop {
    pub record: OutRecord,
    pub event: Option<Event>,
}

/// A record to produce.
pub struct OutRecord {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: OwnedHeaders,
    pub timestamp: i64,
}

impl OutRecord {
    /// A record with the key and payload of `message`, stamped now.
    pub fn like(message: &OwnedMessage, topic: String, headers: OwnedHeaders) -> OutRecord {
        OutRecord {
            topic,
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
            headers,
            timestamp: now_ms(),
        }
    }
}

/// Where a message's offset is reported done.
pub struct Completion {
    offset: i64,
    tracker: Arc<Mutex<OffsetTracker>>,
    /// When the offset waits for several hops: how many have not completed.
    /// The last one to complete marks the offset done.
    remaining: Option<Arc<AtomicUsize>>,
}

impl Completion {
    pub fn new(offset: i64, tracker: Arc<Mutex<OffsetTracker>>) -> Completion {
        Completion {
            offset,
            tracker,
            remaining: None,
        }
    }

    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// One completion per hop of a message with `n` hops (`n` ≥ 1): the
    /// offset is done once all of them have completed.
    pub fn split(self, n: usize) -> Vec<Completion> {
        assert!(n >= 1, "a split completion needs at least one hop");
        let remaining = Arc::new(AtomicUsize::new(n));
        (0..n)
            .map(|_| Completion {
                offset: self.offset,
                tracker: self.tracker.clone(),
                remaining: Some(remaining.clone()),
            })
            .collect()
    }

    /// Marks the offset done, or, for one of a split, counts this hop done.
    /// The pipeline loop stores the partition's new committable position for
    /// the next commit.
    pub fn complete(self) {
        if let Some(remaining) = &self.remaining
            && remaining.fetch_sub(1, AtomicOrdering::AcqRel) != 1
        {
            return;
        }
        self.tracker.lock().unwrap().complete(self.offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_completion_marks_the_offset_done_after_its_last_hop() {
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        tracker.lock().unwrap().begin(4);
        let mut parts = Completion::new(4, tracker.clone()).split(3).into_iter();
        parts.next().unwrap().complete();
        parts.next().unwrap().complete();
        assert_eq!(
            tracker.lock().unwrap().in_flight(),
            1,
            "one hop is still out"
        );
        parts.next().unwrap().complete();
        assert_eq!(tracker.lock().unwrap().in_flight(), 0);
        assert_eq!(tracker.lock().unwrap().take_unstored(), Some(5));
    }
}
