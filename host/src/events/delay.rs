//! The delay relay's events: its forwards and tier moves, its target
//! lookups, and its cancellations.

use super::InternalEvent;
use crate::hop;
use crate::metrics::{Metrics, series};
use crate::types::{CancelKind, InboxPosition};
use std::time::Duration;

/// The delay relay forwarded a message to its target and it was acknowledged.
impl InternalEvent for hop::Forward {
    fn trace(&self, tracer: &crate::trace::Tracer) {
        if let Some(trace) = &self.trace {
            crate::trace::export::forwarded(tracer, trace, &self.target, self.deliver_at);
        }
    }

    fn record(&self, metrics: &Metrics) {
        let late_ms = crate::clock::now_ms() - self.deliver_at;
        let (id, target, deliver_at) = (&self.id, &self.target, self.deliver_at);
        tracing::debug!(
            id,
            target,
            deliver_at,
            late_ms,
            "Delayed message delivered."
        );
        if late_ms > 1000 {
            tracing::warn!(
                id,
                target,
                deliver_at,
                late_ms,
                "Delayed message delivered late."
            );
        }
        metrics.inc(&series::DelayDeliveries);
        if late_ms < 0 {
            metrics.inc(&series::EarlyDeliveries);
        } else if let Some(lateness) = metrics.lateness().filter(|_| metrics.enabled()) {
            lateness.observe(Duration::from_millis(late_ms as u64));
        }
    }
}

/// The delay relay moved a message down to a delay tier, and the tier's record was acknowledged.
impl InternalEvent for hop::TierHop {
    fn record(&self, metrics: &Metrics) {
        tracing::trace!(
            id = self.id,
            tier = self.tier,
            "Delayed message moved down a tier."
        );
        let tier = &self.tier;
        metrics.inc(&series::DelayTierHops { tier });
    }
}

/// The delay relay asked the brokers whether a target topic exists and got
/// no clear answer: no answer at all, or an error for the topic that may
/// clear by itself (no leader, no partitions). It asks again after
/// `retry_in`, and the message waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLookupFailed {
    pub target: String,
    pub error: String,
    pub retry_in: Duration,
    /// `Some`: the cluster answered with an error for the topic, and the
    /// relay dead-letters the message if it goes on doing so this much
    /// longer. `None`: the cluster did not answer, which is waited out for
    /// as long as it takes.
    pub gives_up_in: Option<Duration>,
}

impl InternalEvent for TargetLookupFailed {
    fn record(&self, metrics: &Metrics) {
        match self.gives_up_in {
            None => tracing::warn!(
                pipeline = crate::config::RELAY_ROUTE,
                topic = self.target,
                error = self.error,
                retry_in_ms = self.retry_in.as_millis() as u64,
                "Delay target lookup got no answer; retrying for as long as it takes."
            ),
            Some(gives_up_in) => tracing::warn!(
                pipeline = crate::config::RELAY_ROUTE,
                topic = self.target,
                error = self.error,
                retry_in_ms = self.retry_in.as_millis() as u64,
                gives_up_in_ms = gives_up_in.as_millis() as u64,
                "Delay target lookup got an error for the topic; retrying."
            ),
        }
        metrics.inc(&series::FailedTargetLookups);
    }
}

/// The cluster answered a target's lookups with an error for the topic for
/// `[delay] target_lookup_timeout`: the relay stops asking and dead-letters
/// the message as `HOP_FAILED`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLookupAbandoned {
    pub target: String,
    /// The last error the cluster answered for the topic.
    pub error: String,
    /// The time counted against the timeout: under errors for the topic,
    /// not the time the cluster did not answer at all.
    pub asked_for: Duration,
    /// The lookups the cluster answered with an error for the topic.
    pub lookups: u32,
}

impl InternalEvent for TargetLookupAbandoned {
    fn record(&self, metrics: &Metrics) {
        tracing::warn!(
            pipeline = crate::config::RELAY_ROUTE,
            topic = self.target,
            error = self.error,
            asked_for_ms = self.asked_for.as_millis() as u64,
            lookups = self.lookups,
            "Delay target lookup gave up; the message is dead-lettered."
        );
        metrics.inc(&series::AbandonedTargetLookups);
    }
}

/// The delay relay read a cancel (or a replace) from its inbox, and its entry in the cancellation topic was acknowledged.
impl InternalEvent for hop::CancelEntry {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            id = self.id,
            kind = self.kind.as_str(),
            inbox = %self.inbox,
            "Cancellation recorded."
        );
        let kind = self.kind.as_str();
        metrics.inc(&series::RecordedCancels { kind });
    }
}

/// This process's cancellation table took in an entry from the
/// cancellation topic: from now on it drops what the entry covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancellationKnown {
    /// The id, lossily decoded (the topic's keys are bytes).
    pub id: String,
    pub kind: CancelKind,
    pub inbox: InboxPosition,
    /// The record time of the entry, epoch ms.
    pub recorded_at: i64,
}

impl InternalEvent for CancellationKnown {
    fn record(&self, _: &Metrics) {
        tracing::trace!(
            id = self.id,
            kind = self.kind.as_str(),
            inbox = %self.inbox,
            "Cancellation known."
        );
    }
}

/// A delayed message was dropped, never delivered: a cancel or a replace
/// read after it covers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleCancelled {
    pub id: String,
    pub target: String,
    pub deliver_at: i64,
    /// What dropped it.
    pub kind: CancelKind,
    /// Where the inbox read the dropped schedule.
    pub inbox: InboxPosition,
}

impl InternalEvent for ScheduleCancelled {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            id = self.id,
            target = self.target,
            deliver_at = self.deliver_at,
            kind = self.kind.as_str(),
            inbox = %self.inbox,
            "Delayed message cancelled."
        );
        match self.kind {
            CancelKind::Cancel => metrics.inc(&series::CancelledSchedules),
            CancelKind::Replace => metrics.inc(&series::ReplacedSchedules),
        }
    }
}

/// A cancellation arrived after this process had forwarded a schedule it
/// covers: the message was delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelTooLate {
    pub id: String,
    pub kind: CancelKind,
}

impl InternalEvent for CancelTooLate {
    fn record(&self, metrics: &Metrics) {
        tracing::warn!(
            id = self.id,
            kind = self.kind.as_str(),
            "Cancellation too late: the message was already delivered."
        );
        metrics.inc(&series::LateCancels);
    }
}

/// The delay relay refused a cancel (or a replace) of an id its
/// cancellation table does not hold, the table being full: the record went
/// to the relay's dead-letter topic as `CANCEL_TABLE_FULL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRefused {
    pub id: String,
    pub kind: CancelKind,
    pub inbox: InboxPosition,
    /// Entries in the table when it was refused.
    pub entries: usize,
    /// `[delay] max_cancellations`.
    pub max: usize,
}

impl InternalEvent for CancelRefused {
    fn record(&self, metrics: &Metrics) {
        tracing::warn!(
            id = self.id,
            kind = self.kind.as_str(),
            inbox = %self.inbox,
            entries = self.entries,
            max_cancellations = self.max,
            "Cancellation refused: the cancellation table is full; dead-lettered as CANCEL_TABLE_FULL."
        );
        let kind = self.kind.as_str();
        metrics.inc(&series::RefusedCancels { kind });
    }
}

/// An entry read from the cancellation topic was not kept: the table held
/// its ceiling (`max_cancellations` and a sixteenth more), which entries
/// written by relays of this config do not reach. What it covers may be
/// delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancellationNotKept {
    pub id: String,
    pub inbox: InboxPosition,
    pub entries: usize,
}

impl InternalEvent for CancellationNotKept {
    fn record(&self, metrics: &Metrics) {
        tracing::error!(
            id = self.id,
            inbox = %self.inbox,
            entries = self.entries,
            "Cancellation table past its ceiling; entry not kept."
        );
        metrics.inc(&series::UnkeptCancellations);
    }
}

/// A cancellation entry expired: nothing it covers can still be due, and
/// this process forgot it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancellationExpired {
    pub id: String,
    pub kind: CancelKind,
    /// Schedules this process dropped because of it.
    pub dropped: u32,
    /// Whether this process read the cancel from the inbox and, having
    /// dropped nothing and seen no delivery it came too late for, counts it
    /// as a cancel for an unknown id.
    pub unknown_id: bool,
}

impl InternalEvent for CancellationExpired {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            id = self.id,
            kind = self.kind.as_str(),
            dropped = self.dropped,
            unknown_id = self.unknown_id,
            "Cancellation expired."
        );
        if self.unknown_id {
            tracing::debug!(
                id = self.id,
                kind = self.kind.as_str(),
                "Cancellation expired without cancelling anything: unknown id, or already delivered."
            );
            metrics.inc(&series::UnknownIdCancels);
        }
    }
}
