//! Ordered retries: keys parked behind a message in a retry tier, and
//! released.

use super::InternalEvent;
use crate::metrics::{Metrics, series};
use crate::types::{Lane, ReleaseCause};

/// A key was parked behind `head`, sent to a retry tier: the key's later
/// messages wait behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyParked {
    pub route: String,
    pub lane: Lane,
    pub head: String,
}

impl InternalEvent for KeyParked {
    fn record(&self, metrics: &Metrics) {
        let route = &self.route;
        tracing::info!(
            route,
            topic = self.lane.topic,
            partition = self.lane.partition,
            key = self.lane.key_text(),
            head = self.head,
            "Key parked behind a retried message."
        );
        metrics.inc(&series::ParkedKeys { route });
    }
}

/// A message of a parked key was written to the park topic, to wait behind
/// its key's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageParked {
    pub route: String,
    pub lane: Lane,
    /// Its input offset.
    pub offset: i64,
}

impl InternalEvent for MessageParked {
    fn record(&self, metrics: &Metrics) {
        let route = &self.route;
        tracing::debug!(
            route,
            topic = self.lane.topic,
            partition = self.lane.partition,
            key = self.lane.key_text(),
            offset = self.offset,
            "Message parked behind its key's head."
        );
        metrics.inc(&series::ParkedMessages { route });
    }
}

/// A parked key's head stopped holding it: its waiting messages are
/// handled next, in order; or, when `blocks`, they are dead-lettered until
/// an operator releases the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyReleased {
    pub route: String,
    pub lane: Lane,
    pub head: String,
    pub cause: ReleaseCause,
    /// The head was dead-lettered on a route with `on_key_dead_letter =
    /// "dead-letter-key"`: the key is blocked now.
    pub blocks: bool,
}

impl InternalEvent for KeyReleased {
    fn record(&self, metrics: &Metrics) {
        let route = &self.route;
        let cause = self.cause.as_str();
        let (topic, partition, key) = (&self.lane.topic, self.lane.partition, self.lane.key_text());
        if self.blocks {
            tracing::warn!(
                route,
                topic,
                partition,
                key,
                head = self.head,
                "Key blocked: its head was dead-lettered; its messages are dead-lettered as KEY_BLOCKED until an operator releases it."
            );
        } else {
            tracing::info!(
                route,
                topic,
                partition,
                key,
                head = self.head,
                cause,
                "Key released."
            );
        }
        metrics.inc(&series::KeyReleases { route, cause });
    }
}

/// Records read from a route's park topic were not taken into its table:
/// hopper could not have written them (docs/ordered-retries.md, "What the
/// table believes"). Logged at most once a second (`logged`), counted
/// always.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkRecordsRefused {
    pub route: String,
    pub topic: String,
    /// Why: [`crate::parked::Refusal::as_str`].
    pub reason: &'static str,
    /// How many.
    pub count: u64,
    /// Where the last one was read: partition and offset, when one record.
    pub at: Option<(i32, i64)>,
    /// Refusals not logged since the last line.
    pub unlogged: u64,
    /// Whether to log this one.
    pub logged: bool,
}

impl InternalEvent for ParkRecordsRefused {
    fn record(&self, metrics: &Metrics) {
        let route = &self.route;
        if self.logged {
            tracing::warn!(
                route,
                topic = self.topic,
                reason = self.reason,
                count = self.count,
                partition = self.at.map(|a| a.0),
                offset = self.at.map(|a| a.1),
                not_logged_before = self.unlogged,
                "Park-topic record refused: hopper could not have written it; it changes nothing."
            );
        }
        let reason = self.reason;
        metrics.inc_by(&series::ParkRefused { route, reason }, self.count);
    }
}
