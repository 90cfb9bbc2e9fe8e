//! The events of a route's hops, reported when the broker acknowledges
//! them (each kind of [`hop::Outcome`], emitted as [`super::Event::Hop`]),
//! and of hops it does not.

use super::{InternalEvent, short};
use crate::hop;
use crate::metrics::{Metrics, series};
use crate::types::HopFailure;

/// The message was produced to a retry tier and acknowledged.
impl InternalEvent for hop::Retry {
    fn record(&self, metrics: &Metrics) {
        tracing::info!(
            route = self.route,
            id = self.id,
            attempt = self.attempt,
            version = self.version.as_deref().map(short),
            tier = self.topic,
            delay = %humantime::format_duration(self.delay),
            reason = self.reason.as_str(),
            "Retry scheduled."
        );
        let (route, tier) = (&self.route, &self.topic);
        metrics.inc(&series::Retries { route, tier });
    }
}

/// The message was produced to a dead-letter topic and acknowledged.
impl InternalEvent for hop::DeadLetter {
    fn record(&self, metrics: &Metrics) {
        tracing::warn!(
            route = self.route,
            id = self.id,
            attempt = self.attempt,
            version = self.version.as_deref().map(short),
            dlq = self.topic,
            reason = self.reason.as_str(),
            error = self.error,
            "Message dead-lettered."
        );
        let (route, reason) = (&self.route, self.reason.as_str());
        metrics.inc(&series::DeadLetters { route, reason });
    }
}

/// A record a handler emitted was produced and acknowledged.
impl InternalEvent for hop::Emit {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            route = self.route,
            id = self.id,
            topic = self.topic,
            deliver_at = self.deliver_at,
            kind = self.kind.as_str(),
            "Emitted record produced."
        );
        let route = &self.route;
        metrics.inc(&series::EmittedRecords {
            route,
            result: "produced",
        });
    }
}

/// The broker did not acknowledge a hop. A transient error is retried with
/// backoff; a hop refused for good is dead-lettered instead; a dead-letter
/// record refused for good stops the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HopFailed {
    /// The route, or `delay` for the relay.
    pub route: String,
    /// The topic the hop was for.
    pub topic: String,
    pub error: String,
    pub outcome: HopFailure,
}

impl InternalEvent for HopFailed {
    fn record(&self, metrics: &Metrics) {
        let (route, topic, error) = (&self.route, &self.topic, &self.error);
        match self.outcome {
            HopFailure::Retried => tracing::warn!(
                route,
                topic,
                error,
                "Hop was not acknowledged; producing it again."
            ),
            HopFailure::DeadLettered => tracing::error!(
                route,
                topic,
                error,
                "Hop was refused for good; dead-lettering its message."
            ),
            HopFailure::Halted => tracing::error!(
                route,
                topic,
                error,
                "Dead-letter record was refused for good; stopping."
            ),
        }
        let outcome = self.outcome.as_str();
        metrics.inc(&series::HopFailures { route, outcome });
    }
}

/// A tier message that reached an open breaker went back to its tier, attempts unchanged, and was acknowledged.
impl InternalEvent for hop::Deferral {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            route = self.route,
            id = self.id,
            tier = self.topic,
            "Message sent back to its tier: the circuit breaker is open."
        );
        let route = &self.route;
        metrics.inc(&series::BreakerDeferrals { route });
    }
}
