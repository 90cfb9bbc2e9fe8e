//! Prometheus metrics: every family hopper exports, and the handles hot
//! paths hold. Which event bumps which counter is decided by the event's
//! own type (events.rs), through the lookups here.
//!
//! Hot paths never look a metric up by name and never format a label: a
//! route's processor holds its counters and histogram from the start, and
//! the counters events bump are registered for every route, tier and reason
//! when hopper starts and found again through a map that is never written
//! after that. Only registration (at start) and scrapes take a lock.
//!
//! Labels stay low-cardinality: route, tier topic, reason, outcome,
//! partition. Never a key or a message id.

mod histogram;
mod live;

pub use histogram::{CALL_BUCKETS, Histogram, LATENESS_BUCKETS};

use crate::config::{Config, RELAY_ROUTE};
use crate::headers::Reason;
use crate::health::Health;
use crate::types::{HopFailure, VerdictKind};
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};

/// The maps of counters, looked up by route, tier or reason as each
/// message is counted: foldhash, since SipHash of a route's name showed in
/// the profile of the dead-letter path.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A counter: one atomic, shared by its clones.
pub type Counter = PromCounter;
/// A gauge: one atomic, shared by its clones.
pub type Gauge = prometheus_client::metrics::gauge::Gauge;

type Labels = Vec<(&'static str, String)>;
/// A counter family, with the name it is registered under.
#[derive(Clone)]
struct Counters {
    name: &'static str,
    family: Family<Labels, Counter>,
}
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// The text format of a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Prometheus,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The counters an event bumps for one route, registered at start.
pub(crate) struct RouteCounters {
    /// By tier topic.
    pub(crate) retries: HashMap<String, Counter>,
    pub(crate) dead_lettered: HashMap<Reason, Counter>,
    pub(crate) reloads_ok: Counter,
    pub(crate) reloads_failed: Counter,
    pub(crate) replayed: Counter,
    pub(crate) looped: Counter,
    /// `hopper_emitted_records_total{result=produced}`.
    pub(crate) emitted: Counter,
    /// `hopper_emitted_records_total{result=discarded}`.
    pub(crate) emits_discarded: Counter,
    /// `hopper_hop_failures_total` by outcome.
    pub(crate) hop_failures: HashMap<HopFailure, Counter>,
    /// Registered only for a route with a circuit breaker.
    pub(crate) breaker: Option<BreakerCounters>,
}

/// The counters of a route's circuit breaker.
pub(crate) struct BreakerCounters {
    pub(crate) opened: Counter,
    pub(crate) probes: Counter,
    pub(crate) closed: Counter,
    pub(crate) deferred: Counter,
}

/// The delay relay's counters.
pub(crate) struct RelayCounters {
    pub(crate) delivered: Counter,
    pub(crate) early: Counter,
    /// `hopper_delay_target_lookups_failed_total`.
    pub(crate) lookups_failed: Counter,
    /// `hopper_delay_target_lookups_abandoned_total`.
    pub(crate) lookups_abandoned: Counter,
    pub(crate) lateness: Histogram,
    /// By tier topic.
    pub(crate) tier_hops: HashMap<String, Counter>,
    /// `hopper_delay_cancels_total{kind=cancel}` and `{kind=replace}`:
    /// cancel and replace records read from the inbox and recorded.
    pub(crate) cancels_recorded: Counter,
    pub(crate) replaces_recorded: Counter,
    /// Schedules dropped because a cancel covered them.
    pub(crate) cancelled: Counter,
    /// Schedules dropped because a replace covered them.
    pub(crate) replaced: Counter,
    pub(crate) too_late: Counter,
    pub(crate) unknown_id: Counter,
    /// `hopper_delay_cancels_refused_total{kind=cancel}` and
    /// `{kind=replace}`: refused by a full table, dead-lettered.
    pub(crate) cancels_refused: Counter,
    pub(crate) replaces_refused: Counter,
    /// `hopper_delay_cancellations_not_kept_total`.
    pub(crate) not_kept: Counter,
    /// `hopper_delay_cancellations`: entries in this process's table.
    pub(crate) cancellations: Gauge,
}

/// What one route's processor holds: bumped per message without a lookup.
#[derive(Clone)]
pub struct RouteMetrics {
    /// `None` with metrics off.
    pub consumed: Option<Counter>,
    /// By verdict kind, in the order of [`VerdictKind::ALL`]: see
    /// [`RouteMetrics::outcome`].
    outcomes: [Counter; VerdictKind::ALL.len()],
    /// `None` with metrics off: the call is then not timed at all.
    pub call_duration: Option<Histogram>,
}

impl RouteMetrics {
    /// The counter of calls that came to `kind`: an index, not a lookup.
    pub fn outcome(&self, kind: VerdictKind) -> &Counter {
        &self.outcomes[kind as usize]
    }
}

/// Every metric family, and the counters registered in them.
pub struct Metrics {
    registry: Registry,
    enabled: bool,
    consumed: Counters,
    outcomes: Counters,
    call_duration: Histograms,
    replays: Counters,
    http_requests: Counters,
    emits: Counters,
    /// `hopper_trace_spans_dropped`: spans never exported (docs/tracing.md).
    spans_dropped: Counter,
    /// Written only while [`Metrics::new`] runs.
    routes: HashMap<String, RouteCounters>,
    relay: Option<RelayCounters>,
    /// Every registered counter by `name{label=value,...}`, for
    /// [`Metrics::counters`]. Written at registration only.
    registered: Mutex<Vec<(String, Counter)>>,
}

impl Metrics {
    /// The families, with the counters of every route, tier and reason of
    /// `config` registered (so each series exists, at 0, from the start).
    /// With `enabled` false, nothing is timed and the consumed counters stay
    /// unregistered; the outcome, retry and dead-letter counters still count
    /// (hopper's own status reads them).
    pub fn new(config: Option<&Config>, health: Arc<Health>, enabled: bool) -> Metrics {
        let mut registry = Registry::default();
        let mut counters = |name: &'static str, help: &str| {
            let family = Family::default();
            registry.register(name, help, family.clone());
            Counters { name, family }
        };
        let consumed = counters(
            "hopper_messages_consumed",
            "Messages a route read from its input topics and retry tiers.",
        );
        let outcomes = counters(
            "hopper_handler_outcomes",
            "Handler calls by outcome: ok, retryable, fatal, trap, timeout, memory.",
        );
        let retries = counters(
            "hopper_retries_scheduled",
            "Messages sent up a retry tier (a backoff, not a failure).",
        );
        let dead_lettered = counters(
            "hopper_dead_lettered",
            "Records written to a dead-letter topic, by route and reason.",
        );
        let reloads = counters(
            "hopper_handler_reloads",
            "Handler reloads by result: ok (a new version serves) or failed (the old one keeps serving).",
        );
        let replays = counters(
            "hopper_replays",
            "DLQ records replayed through the admin API, by result: replayed or loop (sent back with REPLAY_LOOP).",
        );
        let http_requests = counters(
            "hopper_http_requests",
            "Outbound HTTP requests of handlers, by route and result.",
        );
        let emits = counters(
            "hopper_emitted_records",
            "Records handlers emitted, by route and result.",
        );
        let hop_failures = counters(
            "hopper_hop_failures",
            "Hops the broker did not acknowledge, by route and outcome: retried (a transient error), dead_lettered (refused for good, sent to the DLQ), halted (a DLQ record refused for good: the route stopped).",
        );
        let breaker_families = [
            (
                "hopper_breaker_opened",
                "Times a route's circuit breaker opened (from closed, or reopened by a failed probe).",
            ),
            (
                "hopper_breaker_probes",
                "Messages a half-open circuit breaker let through as probes.",
            ),
            (
                "hopper_breaker_closed",
                "Times a route's circuit breaker closed after its probes passed.",
            ),
            (
                "hopper_breaker_deferred",
                "Tier messages sent back to their tier, attempts unchanged, because the route's circuit breaker was open.",
            ),
        ]
        .map(|(name, help)| counters(name, help));
        let delivered = counters(
            "hopper_delay_delivered",
            "Delayed messages forwarded to their target.",
        );
        let early = counters(
            "hopper_delay_early",
            "Delayed messages forwarded before their deliver-at (never expected).",
        );
        let lookups_failed = counters(
            "hopper_delay_target_lookups_failed",
            "Target lookups of the delay relay that got no answer from the brokers, or an error for the topic that may clear (each is retried; the message waits).",
        );
        let lookups_abandoned = counters(
            "hopper_delay_target_lookups_abandoned",
            "Delayed messages dead-lettered as HOP_FAILED because the cluster answered their target's lookups with an error for the topic for [delay] target_lookup_timeout.",
        );
        let tier_hops = counters(
            "hopper_delay_tier_hops",
            "Delayed messages moved down to a delay tier.",
        );
        let cancels = counters(
            "hopper_delay_cancels",
            "Cancel and replace records the delay relay read from its inbox and recorded in its cancellation topic, by kind.",
        );
        let cancelled = counters(
            "hopper_delay_cancelled",
            "Delayed messages dropped, never delivered, because a cancel covered them.",
        );
        let replaced = counters(
            "hopper_delay_replaced",
            "Delayed messages dropped, never delivered, because a replace took their place.",
        );
        let too_late = counters(
            "hopper_delay_cancels_too_late",
            "Cancellations that arrived after this process had forwarded a schedule they cover (best effort: the message was delivered).",
        );
        let unknown_id = counters(
            "hopper_delay_cancels_unknown_id",
            "Cancellations read by this process that expired without having dropped a schedule here: an id that was never scheduled, or already delivered.",
        );
        let refused = counters(
            "hopper_delay_cancels_refused",
            "Cancel and replace records of a new id the delay relay refused, by kind, its cancellation table holding max_cancellations entries: dead-lettered as CANCEL_TABLE_FULL.",
        );
        let not_kept = counters(
            "hopper_delay_cancellations_not_kept",
            "Entries of the cancellation topic this process did not keep, its table past its ceiling (max_cancellations and a sixteenth more): what they cover may be delivered.",
        );
        let spans_dropped = counters(
            "hopper_trace_spans_dropped",
            "Spans dropped without being exported: the export queue was full, or the OTLP endpoint did not take their batch.",
        );
        let cancellations = Gauge::default();
        registry.register(
            "hopper_delay_cancellations",
            "Entries in this process's cancellation table (pending cancels and replaces).",
            cancellations.clone(),
        );
        let call_duration: Histograms =
            Family::new_with_constructor(|| Histogram::new(&CALL_BUCKETS));
        registry.register(
            "hopper_handler_duration_seconds",
            "Wall-clock time of handler calls.",
            call_duration.clone(),
        );
        let lateness = Histogram::new(&LATENESS_BUCKETS);
        registry.register(
            "hopper_delay_lateness_seconds",
            "How long after its deliver-at a delayed message was forwarded.",
            lateness.clone(),
        );
        registry.register_collector(Box::new(live::Live(health)));

        let mut metrics = Metrics {
            registry,
            enabled,
            consumed,
            outcomes,
            call_duration,
            replays,
            http_requests,
            emits,
            spans_dropped: Counter::default(),
            routes: HashMap::default(),
            relay: None,
            registered: Mutex::default(),
        };
        metrics.spans_dropped = metrics.register(&spans_dropped, Vec::new());
        let Some(config) = config else {
            return metrics;
        };
        let mut route_names: Vec<(&str, Vec<String>, bool)> = config
            .routes
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.tiers().into_iter().map(|t| t.1).collect(),
                    r.breaker.is_some(),
                )
            })
            .collect();
        if config.delay.is_some() {
            route_names.push((RELAY_ROUTE, Vec::new(), false));
        }
        for (route, tiers, has_breaker) in route_names {
            let breaker = has_breaker.then(|| {
                let [opened, probes, closed, deferred] = breaker_families
                    .each_ref()
                    .map(|family| metrics.register(family, vec![("route", route.into())]));
                BreakerCounters {
                    opened,
                    probes,
                    closed,
                    deferred,
                }
            });
            let counters = RouteCounters {
                retries: tiers
                    .into_iter()
                    .map(|tier| {
                        let labels = vec![("route", route.into()), ("tier", tier.clone())];
                        let counter = metrics.register(&retries, labels);
                        (tier, counter)
                    })
                    .collect(),
                dead_lettered: Reason::ALL
                    .into_iter()
                    .filter(|reason| *reason != Reason::Retryable)
                    .map(|reason| {
                        let labels = vec![("route", route.into()), ("reason", reason.to_string())];
                        let counter = metrics.register(&dead_lettered, labels);
                        (reason, counter)
                    })
                    .collect(),
                reloads_ok: metrics.register(
                    &reloads,
                    vec![("route", route.into()), ("result", "ok".into())],
                ),
                reloads_failed: metrics.register(
                    &reloads,
                    vec![("route", route.into()), ("result", "failed".into())],
                ),
                replayed: metrics.register(
                    &metrics.replays,
                    vec![("route", route.into()), ("result", "replayed".into())],
                ),
                looped: metrics.register(
                    &metrics.replays,
                    vec![("route", route.into()), ("result", "loop".into())],
                ),
                emitted: metrics.register(
                    &metrics.emits,
                    vec![("route", route.into()), ("result", "produced".into())],
                ),
                emits_discarded: metrics.register(
                    &metrics.emits,
                    vec![("route", route.into()), ("result", "discarded".into())],
                ),
                hop_failures: HopFailure::ALL
                    .into_iter()
                    .map(|outcome| {
                        let labels =
                            vec![("route", route.into()), ("outcome", outcome.to_string())];
                        let counter = metrics.register(&hop_failures, labels);
                        (outcome, counter)
                    })
                    .collect(),
                breaker,
            };
            metrics.routes.insert(route.to_string(), counters);
        }
        if let Some(relay) = &config.delay {
            metrics.relay = Some(RelayCounters {
                delivered: metrics.register(&delivered, vec![]),
                early: metrics.register(&early, vec![]),
                lookups_failed: metrics.register(&lookups_failed, vec![]),
                lookups_abandoned: metrics.register(&lookups_abandoned, vec![]),
                lateness,
                cancels_recorded: metrics.register(&cancels, vec![("kind", "cancel".into())]),
                replaces_recorded: metrics.register(&cancels, vec![("kind", "replace".into())]),
                cancelled: metrics.register(&cancelled, vec![]),
                replaced: metrics.register(&replaced, vec![]),
                too_late: metrics.register(&too_late, vec![]),
                unknown_id: metrics.register(&unknown_id, vec![]),
                cancels_refused: metrics.register(&refused, vec![("kind", "cancel".into())]),
                replaces_refused: metrics.register(&refused, vec![("kind", "replace".into())]),
                not_kept: metrics.register(&not_kept, vec![]),
                cancellations,
                tier_hops: relay
                    .tiers
                    .iter()
                    .map(|(_, tier)| {
                        let labels = vec![("tier", tier.clone())];
                        (tier.clone(), metrics.register(&tier_hops, labels))
                    })
                    .collect(),
            });
        }
        metrics
    }

    fn register(&self, family: &Counters, labels: Labels) -> Counter {
        let counter = family.family.get_or_create_owned(&labels);
        let name = family.name;
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let key = format!("{name}_total{{{}}}", labels.join(","));
        self.registered.lock().unwrap().push((key, counter.clone()));
        counter
    }

    /// Spans dropped without being exported.
    pub fn spans_dropped(&self) -> Counter {
        self.spans_dropped.clone()
    }

    /// Whether calls are timed and `/metrics` is served.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The handles of route `route`'s processor, registered now; called
    /// once per route, at start.
    pub fn route_handles(&self, route: &str) -> RouteMetrics {
        let label = || ("route", route.to_string());
        RouteMetrics {
            consumed: self
                .enabled
                .then(|| self.register(&self.consumed, vec![label()])),
            outcomes: VerdictKind::ALL.map(|kind| {
                let labels = vec![label(), ("outcome", kind.to_string())];
                self.register(&self.outcomes, labels)
            }),
            call_duration: self
                .enabled
                .then(|| self.call_duration.get_or_create_owned(&vec![label()])),
        }
    }

    /// Counts a replay of a record of `route` made through the admin API:
    /// sent back to its input, or, past the loop guard, to the DLQ.
    pub fn replayed(&self, route: &str, looped: bool) {
        if let Some(route) = self.routes.get(route) {
            match looped {
                false => route.replayed.inc(),
                true => route.looped.inc(),
            };
        }
    }

    /// The counter of `route`'s outbound HTTP requests with `result`: a
    /// status class (`2xx`, ...), `error` (no response) or `denied` (refused
    /// by the route's grants). For the route's grants to hold: registered
    /// once per route and result, when its handler is first loaded.
    pub fn http_requests(&self, route: &str, result: &str) -> Counter {
        let labels = vec![("route", route.to_string()), ("result", result.to_string())];
        self.register(&self.http_requests, labels)
    }

    /// The counter of records `route`'s handler tried to emit and the
    /// route's grants refused, for the route's grants to hold.
    pub fn emits_refused(&self, route: &str) -> Counter {
        let labels = vec![("route", route.to_string()), ("result", "refused".into())];
        self.register(&self.emits, labels)
    }

    /// The counters events of `route` bump, registered at start; `None`
    /// for a route hopper does not run. A lookup in a map never written
    /// after start: for events that are not on a message's path.
    pub(crate) fn route(&self, route: &str) -> Option<&RouteCounters> {
        self.routes.get(route)
    }

    /// The counters of `route`'s circuit breaker, when it has one.
    pub(crate) fn breaker(&self, route: &str) -> Option<&BreakerCounters> {
        self.routes.get(route)?.breaker.as_ref()
    }

    /// The delay relay's counters, when a relay runs.
    pub(crate) fn relay(&self) -> Option<&RelayCounters> {
        self.relay.as_ref()
    }

    /// Sets the gauge of the cancellation table's size.
    pub fn set_cancellations(&self, entries: usize) {
        if let Some(relay) = &self.relay {
            relay.cancellations.set(entries as i64);
        }
    }

    /// The gauge of the cancellation table's size, when a relay runs.
    pub fn cancellations(&self) -> Option<i64> {
        self.relay.as_ref().map(|r| r.cancellations.get())
    }

    /// The delay relay's lateness histogram, when a relay runs.
    pub fn lateness(&self) -> Option<&Histogram> {
        self.relay.as_ref().map(|r| &r.lateness)
    }

    /// Every registered counter's value, keyed `name_total{label=value,...}`.
    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        let registered = self.registered.lock().unwrap();
        let mut out = std::collections::BTreeMap::new();
        for (key, counter) in registered.iter() {
            out.insert(key.clone(), counter.get());
        }
        out
    }

    /// The exposition of every metric, for a scrape.
    pub fn encode(&self, format: Format) -> String {
        let mut out = String::new();
        let encoded = match format {
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
        };
        // Writing into a String cannot fail.
        encoded.expect("encoding metrics into a string");
        out
    }
}
