//! Every counter family hopper exports, each named once, in [`counters!`]
//! below: its type, its Prometheus name and help, and its labels.
//!
//! A family's type is also the key of one of its series: a struct of its
//! label values (`Retries { route, tier }`). Events count through
//! it ([`super::Metrics::inc`]), hot paths hold the [`Counter`] it gives
//! ([`super::Metrics::handle`]), and tests read through it
//! ([`super::Metrics::get`]); so renaming a family, or a label, fails to
//! compile wherever it is used, never at run time.

use super::Counter;
use std::hash::{BuildHasher, Hasher};

/// One series of a counter family: the family, and its label values.
pub trait Series {
    /// The family's place in [`FAMILIES`].
    const FAMILY: usize;

    /// Feeds the label values to `state`, in the family's label order.
    fn hash_values(&self, state: &mut impl Hasher);

    /// Whether `values` are this series' label values.
    fn is(&self, values: &[String]) -> bool;

    /// The labels, named, for registering the series.
    fn labels(&self) -> Vec<(&'static str, String)>;
}

/// A counter family: its Prometheus name (`_total` is added on export) and
/// its help text.
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
}

/// Declares every counter family: its series type, and [`FAMILIES`] in the
/// order they are exported.
macro_rules! counters {
    (@each $index:expr; ) => {};
    (@each $index:expr; $(#[$doc:meta])* $ty:ident []; $($rest:tt)*) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $ty;

        impl Series for $ty {
            const FAMILY: usize = $index;

            fn hash_values(&self, _: &mut impl Hasher) {}

            fn is(&self, values: &[String]) -> bool {
                values.is_empty()
            }

            fn labels(&self) -> Vec<(&'static str, String)> {
                Vec::new()
            }
        }

        counters!(@each $index + 1usize; $($rest)*);
    };
    (@each $index:expr; $(#[$doc:meta])* $ty:ident [$($label:ident),+]; $($rest:tt)*) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $ty<'a> {
            $(pub $label: &'a str,)+
        }

        impl Series for $ty<'_> {
            const FAMILY: usize = $index;

            fn hash_values(&self, state: &mut impl Hasher) {
                $(
                    state.write(self.$label.as_bytes());
                    state.write_u8(0xff);
                )+
            }

            fn is(&self, values: &[String]) -> bool {
                let mut values = values.iter();
                $(
                    if values.next().map(String::as_str) != Some(self.$label) {
                        return false;
                    }
                )+
                values.next().is_none()
            }

            fn labels(&self) -> Vec<(&'static str, String)> {
                vec![$((stringify!($label), self.$label.to_string()),)+]
            }
        }

        counters!(@each $index + 1usize; $($rest)*);
    };
    ($(
        $(#[$doc:meta])*
        $ty:ident $name:literal [$($label:ident),*] $help:literal;
    )*) => {
        /// Every counter family, in the order of export.
        pub const FAMILIES: &[Family] = &[$(Family { name: $name, help: $help },)*];

        counters!(@each 0usize; $($(#[$doc])* $ty [$($label),*];)*);
    };
}

counters! {
    /// `hopper_messages_consumed_total{route}`.
    MessagesConsumed "hopper_messages_consumed" [route]
        "Messages a route read from its input topics and retry tiers.";
    /// `hopper_handler_outcomes_total{route,outcome}`.
    HandlerOutcomes "hopper_handler_outcomes" [route, outcome]
        "Handler calls by outcome: ok, retryable, fatal, trap, timeout, memory.";
    /// `hopper_retries_scheduled_total{route,tier}`.
    Retries "hopper_retries_scheduled" [route, tier]
        "Messages sent up a retry tier (a backoff, not a failure).";
    /// `hopper_dead_lettered_total{route,reason}`.
    DeadLetters "hopper_dead_lettered" [route, reason]
        "Records written to a dead-letter topic, by route and reason.";
    /// `hopper_handler_reloads_total{route,result}`.
    HandlerReloads "hopper_handler_reloads" [route, result]
        "Handler reloads by result: ok (a new version serves) or failed (the old one keeps serving).";
    /// `hopper_replays_total{route,result}`.
    Replays "hopper_replays" [route, result]
        "DLQ records replayed through the admin API, by result: replayed or loop (sent back with REPLAY_LOOP).";
    /// `hopper_http_requests_total{route,result}`.
    HttpRequests "hopper_http_requests" [route, result]
        "Outbound HTTP requests of handlers, by route and result.";
    /// `hopper_emitted_records_total{route,result}`.
    EmittedRecords "hopper_emitted_records" [route, result]
        "Records handlers emitted, by route and result.";
    /// `hopper_hop_failures_total{route,outcome}`.
    HopFailures "hopper_hop_failures" [route, outcome]
        "Hops the broker did not acknowledge, by route and outcome: retried (a transient error), dead_lettered (refused for good, sent to the DLQ), halted (a DLQ record refused for good: the route stopped).";
    /// `hopper_breaker_opened_total{route}`.
    BreakerOpenings "hopper_breaker_opened" [route]
        "Times a route's circuit breaker opened (from closed, or reopened by a failed probe).";
    /// `hopper_breaker_probes_total{route}`.
    BreakerProbes "hopper_breaker_probes" [route]
        "Messages a half-open circuit breaker let through as probes.";
    /// `hopper_breaker_closed_total{route}`.
    BreakerClosings "hopper_breaker_closed" [route]
        "Times a route's circuit breaker closed after its probes passed.";
    /// `hopper_breaker_deferred_total{route}`.
    BreakerDeferrals "hopper_breaker_deferred" [route]
        "Tier messages sent back to their tier, attempts unchanged, because the route's circuit breaker was open.";
    /// `hopper_delay_delivered_total`.
    DelayDeliveries "hopper_delay_delivered" []
        "Delayed messages forwarded to their target.";
    /// `hopper_delay_early_total`.
    EarlyDeliveries "hopper_delay_early" []
        "Delayed messages forwarded before their deliver-at (never expected).";
    /// `hopper_delay_target_lookups_failed_total`.
    FailedTargetLookups "hopper_delay_target_lookups_failed" []
        "Target lookups of the delay relay that got no answer from the brokers, or an error for the topic that may clear (each is retried; the message waits).";
    /// `hopper_delay_target_lookups_abandoned_total`.
    AbandonedTargetLookups "hopper_delay_target_lookups_abandoned" []
        "Delayed messages dead-lettered as HOP_FAILED because the cluster answered their target's lookups with an error for the topic for [delay] target_lookup_timeout.";
    /// `hopper_delay_tier_hops_total{tier}`.
    DelayTierHops "hopper_delay_tier_hops" [tier]
        "Delayed messages moved down to a delay tier.";
    /// `hopper_delay_cancels_total{kind}`.
    RecordedCancels "hopper_delay_cancels" [kind]
        "Cancel and replace records the delay relay read from its inbox and recorded in its cancellation topic, by kind.";
    /// `hopper_delay_cancelled_total`.
    CancelledSchedules "hopper_delay_cancelled" []
        "Delayed messages dropped, never delivered, because a cancel covered them.";
    /// `hopper_delay_replaced_total`.
    ReplacedSchedules "hopper_delay_replaced" []
        "Delayed messages dropped, never delivered, because a replace took their place.";
    /// `hopper_delay_cancels_too_late_total`.
    LateCancels "hopper_delay_cancels_too_late" []
        "Cancellations that arrived after this process had forwarded a schedule they cover (best effort: the message was delivered).";
    /// `hopper_delay_cancels_unknown_id_total`.
    UnknownIdCancels "hopper_delay_cancels_unknown_id" []
        "Cancellations read by this process that expired without having dropped a schedule here: an id that was never scheduled, or already delivered.";
    /// `hopper_delay_cancels_refused_total{kind}`.
    RefusedCancels "hopper_delay_cancels_refused" [kind]
        "Cancel and replace records of a new id the delay relay refused, by kind, its cancellation table holding max_cancellations entries: dead-lettered as CANCEL_TABLE_FULL.";
    /// `hopper_delay_cancellations_not_kept_total`.
    UnkeptCancellations "hopper_delay_cancellations_not_kept" []
        "Entries of the cancellation topic this process did not keep, its table past its ceiling (max_cancellations and a sixteenth more): what they cover may be delivered.";
    /// `hopper_keys_parked_total{route}`.
    ParkedKeys "hopper_keys_parked" [route]
        "Keys parked behind a message sent to a retry tier (retry_order = \"key\").";
    /// `hopper_parked_total{route}`.
    ParkedMessages "hopper_parked" [route]
        "Messages that waited in the park topic behind their key's head instead of being handled at once (retry_order = \"key\").";
    /// `hopper_key_releases_total{route,cause}`.
    KeyReleases "hopper_key_releases" [route, cause]
        "Parked keys whose head stopped holding them, by cause: resolved (its handler returned ok), dead-lettered, operator (released through the admin API or the CLI).";
    /// `hopper_parked_refused_total{route,reason}`.
    ParkRefused "hopper_parked_refused" [route, reason]
        "Records of a route's park topic its park table did not take in, by reason: unknown-lane, bad-offset, bad-time, no-head, over-ceiling, unreadable (records hopper could not have written).";
    /// `hopper_trace_spans_dropped_total`.
    DroppedSpans "hopper_trace_spans_dropped" []
        "Spans dropped without being exported: the export queue was full, or the OTLP endpoint did not take their batch.";
}

/// A registered series: found by its family and label values.
#[derive(Clone)]
struct Entry {
    hash: u64,
    family: usize,
    values: Box<[String]>,
    counter: Counter,
}

/// Every registered series, found without a lock or an allocation: the
/// table is replaced whole when a series is registered, which happens at
/// start (and when a route's grants are first built).
#[derive(Clone, Default)]
pub(super) struct Index {
    table: hashbrown::HashTable<Entry>,
}

/// The hash of a series: its family, then its label values. Fixed, so an
/// index and its lookups agree.
fn hash_of<S: Series>(series: &S) -> u64 {
    let mut state = foldhash::fast::FixedState::with_seed(0x686f70706572).build_hasher();
    state.write_usize(S::FAMILY);
    series.hash_values(&mut state);
    state.finish()
}

impl Index {
    pub(super) fn find<S: Series>(&self, series: &S) -> Option<&Counter> {
        let hash = hash_of(series);
        self.table
            .find(hash, |e| e.family == S::FAMILY && series.is(&e.values))
            .map(|e| &e.counter)
    }

    /// The sum of the series of `family` whose label values `keep` keeps.
    pub(super) fn sum(&self, family: usize, keep: impl Fn(&[String]) -> bool) -> u64 {
        self.table
            .iter()
            .filter(|e| e.family == family && keep(&e.values))
            .map(|e| e.counter.get())
            .sum()
    }

    /// Adds `series` with `counter`; it must not be in the index yet.
    pub(super) fn insert<S: Series>(&mut self, series: &S, counter: Counter) {
        let hash = hash_of(series);
        let values = series.labels().into_iter().map(|(_, v)| v).collect();
        self.table.insert_unique(
            hash,
            Entry {
                hash,
                family: S::FAMILY,
                values,
                counter,
            },
            |e| e.hash,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn a_series_is_found_by_its_family_and_every_label_value() {
        let metrics = Metrics::new(None, Default::default(), true);
        let orders = Retries {
            route: "orders",
            tier: "orders.retry.5s",
        };
        assert_eq!(metrics.get(&orders), None, "not registered yet");
        metrics.handle(&orders).inc();
        metrics.inc(&orders);
        assert_eq!(metrics.get(&orders), Some(2));
        // Same values, another family; same family, other values; values
        // that run together differently.
        let dead = DeadLetters {
            route: "orders",
            reason: "orders.retry.5s",
        };
        let other = Retries {
            route: "orders",
            tier: "orders.retry.1s",
        };
        let shifted = Retries {
            route: "ordersorders",
            tier: ".retry.5s",
        };
        for unknown in [other, shifted] {
            metrics.inc(&unknown);
            assert_eq!(metrics.get(&unknown), None, "{unknown:?}");
        }
        metrics.inc(&dead);
        assert_eq!(metrics.get(&dead), None);
        metrics.inc(&DroppedSpans);
        assert_eq!(metrics.get(&DroppedSpans), Some(1));
        assert_eq!(
            metrics.sum::<Retries>(|labels| labels[0] == "orders"),
            2,
            "{:?}",
            metrics.get(&orders)
        );
    }
}
