//! A route's circuit breaker, and the partitions a pipeline suspends for
//! it.

use super::InternalEvent;
use crate::metrics::{Metrics, series};
use crate::types::{TopicPartition, VerdictKind};
use std::time::Duration;

/// A route's circuit breaker opened: its retry tiers (and its inputs, with
/// `pause_input`) are paused for `cool_down`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerOpened {
    pub route: String,
    /// Retryable verdicts among the last `calls` calls (1 of 1 when a
    /// half-open probe reopened it).
    pub retryable: u32,
    pub calls: u32,
    pub cool_down: Duration,
    /// Reopened by a retryable probe, rather than opened from closed.
    pub reopened: bool,
}

impl InternalEvent for BreakerOpened {
    fn record(&self, metrics: &Metrics) {
        let route = &self.route;
        let cool_down = humantime::format_duration(self.cool_down).to_string();
        if self.reopened {
            tracing::warn!(
                route,
                cool_down,
                "Circuit breaker reopened: a probe was retryable; retry tiers stay paused."
            );
        } else {
            tracing::warn!(
                route,
                rate = format!("{}/{}", self.retryable, self.calls),
                cool_down,
                "Circuit breaker opened: too many retryable verdicts; retry tiers paused."
            );
        }
        metrics.inc(&series::BreakerOpenings { route });
    }
}

/// The cool-down is over: the breaker lets `probes` messages through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerHalfOpen {
    pub route: String,
    pub probes: u32,
}

impl InternalEvent for BreakerHalfOpen {
    fn record(&self, _: &Metrics) {
        tracing::info!(
            route = self.route,
            probes = self.probes,
            "Circuit breaker half-open: letting probes through."
        );
    }
}

/// A half-open breaker's probe was handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerProbed {
    pub route: String,
    pub id: String,
    pub verdict: VerdictKind,
}

impl InternalEvent for BreakerProbed {
    fn record(&self, metrics: &Metrics) {
        tracing::info!(
            route = self.route,
            id = self.id,
            verdict = self.verdict.as_str(),
            "Circuit breaker probe handled."
        );
        let route = &self.route;
        metrics.inc(&series::BreakerProbes { route });
    }
}

/// Every probe passed: the route consumes its tiers again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerClosed {
    pub route: String,
    /// Since the breaker opened from closed.
    pub open_for: Duration,
}

impl InternalEvent for BreakerClosed {
    fn record(&self, metrics: &Metrics) {
        tracing::info!(
            route = self.route,
            open_for = %humantime::format_duration(self.open_for),
            "Circuit breaker closed: retry tiers resumed."
        );
        let route = &self.route;
        metrics.inc(&series::BreakerClosings { route });
    }
}

/// A pipeline paused these partitions at the broker because its processor
/// suspends their topics (a route's open circuit breaker): nothing more is
/// fetched from them until they are released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionsSuspended {
    pub pipeline: String,
    pub partitions: Vec<TopicPartition>,
}

impl InternalEvent for PartitionsSuspended {
    fn record(&self, _: &Metrics) {
        tracing::info!(
            pipeline = self.pipeline,
            partitions = %list(&self.partitions),
            "Partitions suspended: their topics are paused."
        );
    }
}

/// Partitions a pipeline had suspended are no longer: each resumes unless
/// a hold or a rewind keeps it paused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionsReleased {
    pub pipeline: String,
    pub partitions: Vec<TopicPartition>,
}

impl InternalEvent for PartitionsReleased {
    fn record(&self, _: &Metrics) {
        tracing::info!(
            pipeline = self.pipeline,
            partitions = %list(&self.partitions),
            "Suspended partitions released."
        );
    }
}

/// `topic[partition]` entries, comma-separated, for a log line.
fn list(partitions: &[TopicPartition]) -> String {
    let names: Vec<String> = partitions.iter().map(ToString::to_string).collect();
    names.join(",")
}
