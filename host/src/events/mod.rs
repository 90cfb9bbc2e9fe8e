//! Named events, one type each, as vector's `internal_events`: the type
//! holds what happened, and its [`InternalEvent::record`] writes its log line
//! and bumps its counter, through the counter family's type in
//! [`crate::metrics::series`]. [`Telemetry::emit`] records an event and
//! broadcasts it to observers (the demo's live view and tests).
//!
//! The events are grouped by area: a handler's ([`handler`]), a route's
//! hops ([`hops`]), a circuit breaker's ([`breaker`]), the delay relay's
//! ([`delay`]) and ordered retries' parked keys ([`parked`]). Adding an event is its type and its `impl InternalEvent` in
//! its area, its name in the `events!` list below, and one
//! `telemetry.emit(...)` where it happens. A hop's event is its
//! [`crate::hop::Outcome`] itself ([`Event::Hop`]), emitted when the broker
//! acknowledges the hop, never when it is planned; each kind of hop has its
//! `impl InternalEvent` in its area.
//!
//! The events on a message's path ([`Handled`], [`HttpRequest`],
//! [`HttpDenied`]) are reported through registered handles that hold their
//! counters ([`Calls`], [`HttpCounters`]).
//!
//! Counter labels stay low-cardinality: route, tier, reason, outcome, never
//! a key or an id. Ids appear only in log lines and broadcast events.

mod breaker;
mod delay;
mod handler;
mod hops;
mod parked;
mod telemetry;

pub use breaker::{
    BreakerClosed, BreakerHalfOpen, BreakerOpened, BreakerProbed, PartitionsReleased,
    PartitionsSuspended,
};
pub use delay::{
    CancelRefused, CancelTooLate, CancellationExpired, CancellationKnown, CancellationNotKept,
    ScheduleCancelled, TargetLookupAbandoned, TargetLookupFailed,
};
pub use handler::{
    Call, Calls, EmitsDiscarded, Handled, HandlerReloadFailed, HandlerReloaded, HttpCounters,
    HttpDenied, HttpLimited, HttpRequest, STATUS_CLASSES,
};
pub use hops::HopFailed;
pub use parked::{KeyParked, KeyReleased, MessageParked, ParkRecordsRefused};
pub use telemetry::Telemetry;

use crate::hop::{self, Outcome};
use crate::metrics::Metrics;

/// One kind of event: writes its log line and bumps its counter. A hop's
/// kind ([`hop::Retry`], ...) is emitted as its [`Outcome`], in
/// [`Event::Hop`].
pub trait InternalEvent {
    fn record(&self, metrics: &Metrics);

    /// Its span, for an event that ends one; called only with export on.
    fn trace(&self, _tracer: &crate::trace::Tracer) {}
}

/// The type a variant of [`Event`] holds: its own name, or the type given
/// (a hop's [`Outcome`]).
macro_rules! event_type {
    ($name:ident) => {
        $name
    };
    ($name:ident $ty:ty) => {
        $ty
    };
}

/// Declares [`Event`], one variant per event type, and its dispatch.
macro_rules! events {
    ($($name:ident $(($ty:ty))?),* $(,)?) => {
        /// Something that happened to one message, or to a route's handler,
        /// as observers receive it.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Event {
            $($name(event_type!($name $($ty)?)),)*
        }

        impl Event {
            /// Writes the event's log line and bumps its counter.
            pub fn record(&self, metrics: &Metrics) {
                match self {
                    $(Event::$name(event) => event.record(metrics),)*
                }
            }
        }

        $(impl From<event_type!($name $($ty)?)> for Event {
            fn from(event: event_type!($name $($ty)?)) -> Event {
                Event::$name(event)
            }
        })*
    };
}

/// A hop's event records as its kind does: the kind's log line, counter
/// and span.
impl InternalEvent for Outcome {
    fn record(&self, metrics: &Metrics) {
        kind(self).record(metrics)
    }

    fn trace(&self, tracer: &crate::trace::Tracer) {
        kind(self).trace(tracer)
    }
}

/// The kind of hop `outcome` is, as the event it records.
fn kind(outcome: &Outcome) -> &dyn InternalEvent {
    match outcome {
        Outcome::Retry(retry) => retry,
        Outcome::DeadLetter(dead) => dead,
        Outcome::Emit(emit) => emit,
        Outcome::Deferral(deferral) => deferral,
        Outcome::Forward(forward) => forward,
        Outcome::TierHop(hop) => hop,
        Outcome::CancelEntry(entry) => entry,
    }
}

/// An event in its broadcast form records as its type does: a hop's event
/// travels as an [`Event`] until the broker acknowledges the hop.
impl InternalEvent for Event {
    fn record(&self, metrics: &Metrics) {
        Event::record(self, metrics)
    }

    fn trace(&self, tracer: &crate::trace::Tracer) {
        if let Event::Hop(outcome) = self {
            outcome.trace(tracer);
        }
    }
}

events! {
    Handled,
    Hop(hop::Outcome),
    HandlerReloaded,
    HandlerReloadFailed,
    HttpRequest,
    HttpDenied,
    HttpLimited,
    HopFailed,
    EmitsDiscarded,
    BreakerOpened,
    BreakerHalfOpen,
    BreakerProbed,
    BreakerClosed,
    PartitionsSuspended,
    PartitionsReleased,
    TargetLookupFailed,
    TargetLookupAbandoned,
    CancellationKnown,
    ScheduleCancelled,
    CancelTooLate,
    CancellationExpired,
    CancelRefused,
    CancellationNotKept,
    KeyParked,
    MessageParked,
    KeyReleased,
    ParkRecordsRefused,
}

/// The first 12 hex digits of a version, enough to tell versions apart in a
/// log line.
pub fn short(version: &str) -> &str {
    &version[..12.min(version.len())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{orders_text, resolve_with_handler};
    use crate::headers::Reason;
    use crate::metrics::series;
    use crate::types::{HopFailure, VerdictKind};
    use std::time::Duration;

    fn telemetry() -> Telemetry {
        let text = orders_text("retry = [\"5s\"]\n\n[delay]\ntiers = [\"1s\"]\n");
        let config = resolve_with_handler(&text).unwrap();
        Telemetry::for_config(&config, true)
    }

    /// A hop's event is planned with the hop and counted only when it is
    /// emitted, which the producer does on the broker's acknowledgement.
    #[test]
    fn a_planned_hop_counts_nothing_until_its_event_is_emitted() {
        let telemetry = telemetry();
        let metrics = telemetry.metrics();
        let tier = series::DelayTierHops {
            tier: "hopper.delay.1s",
        };
        assert_eq!(metrics.get(&tier), Some(0));
        let planned = Outcome::TierHop(hop::TierHop {
            id: "m-1".into(),
            tier: "hopper.delay.1s".into(),
        });
        assert_eq!(metrics.get(&tier), Some(0), "planning counts nothing");
        telemetry.emit(planned);
        assert_eq!(metrics.get(&tier), Some(1));
    }

    /// Each event type bumps the series it names, for its route and
    /// labels, and no other.
    #[test]
    fn each_event_bumps_its_own_counter() {
        let telemetry = telemetry();
        let metrics = telemetry.metrics();
        let route = "orders";
        let retries = series::Retries {
            route,
            tier: "orders.retry.5s",
        };
        let fatal = series::DeadLetters {
            route,
            reason: "FATAL",
        };
        let trap = series::DeadLetters {
            route,
            reason: "HANDLER_TRAP",
        };
        let retried = series::HopFailures {
            route,
            outcome: "retried",
        };
        let halted = series::HopFailures {
            route,
            outcome: "halted",
        };
        let discarded = series::EmittedRecords {
            route,
            result: "discarded",
        };
        let produced = series::EmittedRecords {
            route,
            result: "produced",
        };
        let read = |m: &Metrics| {
            [
                m.get(&retries),
                m.get(&fatal),
                m.get(&trap),
                m.get(&retried),
                m.get(&halted),
                m.get(&discarded),
                m.get(&produced),
            ]
        };
        assert_eq!(read(metrics), [Some(0); 7], "every series is registered");
        telemetry.emit(Outcome::Retry(hop::Retry {
            route: "orders".into(),
            id: "m-1".into(),
            attempt: 1,
            topic: "orders.retry.5s".into(),
            delay: Duration::from_secs(5),
            reason: Reason::Retryable,
            version: None,
        }));
        telemetry.emit(Outcome::DeadLetter(hop::DeadLetter {
            route: "orders".into(),
            id: "m-2".into(),
            attempt: 3,
            topic: "orders.dlq".into(),
            reason: Reason::Fatal,
            error: "no".into(),
            version: None,
        }));
        telemetry.emit(HopFailed {
            route: "orders".into(),
            topic: "orders.retry.5s".into(),
            error: "timed out".into(),
            outcome: HopFailure::Retried,
        });
        telemetry.emit(EmitsDiscarded {
            route: "orders".into(),
            id: "m-3".into(),
            count: 4,
            verdict: VerdictKind::Fatal,
        });
        let counted = read(metrics).map(Option::unwrap);
        assert_eq!(counted, [1, 1, 0, 1, 0, 4, 0]);
    }

    /// Every counter family is exported, once the series a config, a
    /// route's calls and its grants register exist.
    #[test]
    fn every_family_is_exported_under_its_one_name() {
        let text =
            orders_text("retry = [\"5s\"]\nretry_order = \"key\"\n[route.breaker]\n\n[delay]\n");
        let config = resolve_with_handler(&text).unwrap();
        let metrics = Metrics::new(Some(&config), Default::default(), true);
        // What the route registers when it starts and its grants are built.
        Calls::register(&metrics, "orders");
        HttpCounters::register(&metrics, "orders");
        let scrape = metrics.encode(crate::metrics::Format::Prometheus);
        for family in series::FAMILIES {
            let kind = format!("# TYPE {}_total counter", family.name);
            assert!(scrape.contains(&kind), "{} is not exported", family.name);
        }
        let mut names: Vec<&str> = series::FAMILIES.iter().map(|f| f.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(
            names.len(),
            series::FAMILIES.len(),
            "a name is declared twice"
        );
    }
}
