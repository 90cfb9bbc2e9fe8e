//! What a processed message turns into: the records to produce next, and the
//! offset they complete once acknowledged.
//!
//! This is the vocabulary shared by the layers below the processors: a
//! [`Processor`] (a route or the delay relay) returns an [`Action`]; the
//! pipeline hands its [`PlannedHop`]s to the producer or the scheduler; the
//! producer's delivery callback calls [`Completion::complete`], which marks
//! the source offset done in its partition's [`OffsetTracker`].
//!
//! Each planned hop says what it is, in an [`Outcome`]: a retry up a tier,
//! a dead letter with its reason, an emitted record, a deferral, the relay's
//! forward with its id and inbox position, a move down a delay tier, a
//! cancellation entry. The pipeline, the relay's cancellation check and the
//! tests read the outcome; it is also the hop's event (`events::Event::Hop`),
//! emitted only when the broker acknowledges the hop, and nothing reads an
//! event to decide anything.

use crate::clock::now_ms;
use crate::config::Concurrency;
use crate::headers::Reason;
use crate::offsets::OffsetTracker;
use crate::types::{CancelKind, EmitKind, InboxPosition, TopicPartition};
use rdkafka::message::{BorrowedMessage, Message, OwnedHeaders, OwnedMessage};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

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

    /// The halt its pipeline stops on, when the processor writes records of
    /// its own that may need to stop it (a route's park store, whose dead
    /// letters are its own); `None`: the pipeline makes one.
    fn halt(&self) -> Option<Arc<Halt>> {
        None
    }

    /// How many messages of one partition may be processed at once, and in
    /// what order.
    fn concurrency(&self) -> Concurrency {
        Concurrency::ONE_AT_A_TIME
    }

    /// Whether the processor holds as much as it may for `tp`: the
    /// partition's task reads nothing more until [`Processor::room`] (an
    /// input of a route with ordered retries whose park table is at its
    /// bound; never a tier, whose heads free room).
    fn full(&self, _tp: &TopicPartition) -> bool {
        false
    }

    /// Waits until the processor is no longer [`Processor::full`].
    fn room(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Work the processor gives a partition's task for one key, run in the
    /// key's turn ([`Processor::run_job`]): a route with ordered retries
    /// hands out keys whose head resolved.
    type Job: Send + 'static;

    /// Called when a partition's task starts, before it reads anything;
    /// the task runs [`Processor::jobs`] whenever the returned notify
    /// wakes it. `None`: the processor has no jobs.
    fn watch(&self, _tp: &TopicPartition) -> impl Future<Output = Option<Arc<Notify>>> + Send {
        async { None }
    }

    /// Called when a partition's task ends.
    fn unwatch(&self, _tp: &TopicPartition) {}

    /// The jobs for `tp` now, each with the Kafka key whose turn it takes.
    fn jobs(&self, _tp: &TopicPartition) -> Vec<(Vec<u8>, Self::Job)> {
        Vec::new()
    }

    /// Runs one job. Its offsets are not the partition's: nothing is
    /// committed for it.
    fn run_job(&self, _job: Self::Job) -> impl Future<Output = ()> + Send {
        async {}
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
    /// Done once `written` ends [`Written::Acknowledged`]: records
    /// written apart from the pipeline's producer (a route's parked
    /// message; a parked key's head record, then its retry) and
    /// acknowledged there. It is awaited beside the partition's calls, not
    /// as one. `failed`: the message went to a retry tier or a dead-letter
    /// topic, as a failed [`Action::Hop`]'s did.
    After {
        written: std::pin::Pin<Box<dyn Future<Output = Written> + Send>>,
        failed: bool,
    },
    /// Never done: hopper began to stop before what the message needed was
    /// acknowledged, and gave it up. Nothing at or past its offset is
    /// committed, so it is read again after a restart, as after a crash.
    GiveUp,
}

/// How the record of an [`Action::After`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Acknowledged: the message's offset is done.
    Acknowledged,
    /// Given up as hopper stops ([`Action::GiveUp`]).
    GivenUp,
}

/// A record to produce, and what it is.
pub struct PlannedHop {
    pub record: OutRecord,
    pub outcome: Outcome,
}

/// What a planned hop is, and, once the broker acknowledges the hop, its
/// event (`events::Event::Hop`): each kind's data is what the event reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The message goes up one of its route's retry tiers.
    Retry(Retry),
    /// The message goes to a dead-letter topic.
    DeadLetter(DeadLetter),
    /// A record the handler emitted, on a verdict of `ok`.
    Emit(Emit),
    /// A tier message an open circuit breaker sends back to its tier.
    Deferral(Deferral),
    /// The delay relay delivers a due message to its target.
    Forward(Forward),
    /// The delay relay moves a message down to a delay tier.
    TierHop(TierHop),
    /// The delay relay records a cancel or a replace in its cancellation
    /// topic.
    CancelEntry(CancelEntry),
}

impl Outcome {
    /// Whether the handler's call failed: the message is retried or
    /// dead-lettered.
    pub fn is_failure(&self) -> bool {
        matches!(self, Outcome::Retry(_) | Outcome::DeadLetter(_))
    }

    /// The forward, when this hop delivers a due message to its target.
    pub fn forward(&self) -> Option<&Forward> {
        match self {
            Outcome::Forward(forward) => Some(forward),
            _ => None,
        }
    }
}

/// A message sent up a retry tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    pub route: String,
    pub id: String,
    pub attempt: u32,
    /// The tier topic.
    pub topic: String,
    pub delay: Duration,
    pub reason: Reason,
    /// sha256 of the handler version that asked for the retry.
    pub version: Option<String>,
}

/// A message sent to a dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub route: String,
    pub id: String,
    pub attempt: u32,
    pub topic: String,
    pub reason: Reason,
    pub error: String,
    /// sha256 of the handler version whose verdict sent it there; `None`
    /// when no handler ran (the delay relay, a bad envelope, a hop the
    /// broker refused for good).
    pub version: Option<String>,
}

/// A record a handler emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emit {
    pub route: String,
    /// The emitted record's own id: `<message id>/emit/<index>`, or the
    /// handler's for a schedule or a cancel.
    pub id: String,
    /// The topic it is for (the delay relay's inbox holds it until
    /// `deliver_at` when delayed); for a cancel, the inbox.
    pub topic: String,
    /// Epoch ms, for a delayed record.
    pub deliver_at: Option<i64>,
    /// Which import emitted it: `publish`, `schedule` (or a replace) or
    /// `cancel`.
    pub kind: EmitKind,
}

/// A tier message sent back to its tier, attempts unchanged, because its
/// route's circuit breaker is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferral {
    pub route: String,
    pub id: String,
    /// The tier topic.
    pub topic: String,
}

/// A due message the delay relay delivers to its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub id: String,
    pub target: String,
    pub deliver_at: i64,
    /// Where the inbox read the schedule: what the cancellation table
    /// checks the forward against just before it is produced. `None` for a
    /// tier record written before hopper stamped positions.
    pub inbox: Option<InboxPosition>,
    /// The forward's trace context: its span is reported on the
    /// acknowledgement, with the lateness.
    pub trace: Option<crate::traceparent::Context>,
}

/// A delayed message moved down to a delay tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierHop {
    pub id: String,
    /// The tier topic.
    pub tier: String,
}

/// A cancel or replace the delay relay read from its inbox, recorded in its
/// cancellation topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelEntry {
    pub id: String,
    pub kind: CancelKind,
    pub inbox: InboxPosition,
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
