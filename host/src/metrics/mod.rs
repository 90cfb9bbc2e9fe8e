//! Prometheus metrics: every family hopper exports, and the handles hot
//! paths hold. Which event bumps which family is decided in one place,
//! `Telemetry::emit` (events.rs), through the methods here.
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

use crate::clock::now_ms;
use crate::config::{Config, RELAY_ROUTE};
use crate::headers::Reason;
use crate::health::Health;
use crate::types::{HopFailure, VerdictKind};
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A counter: one atomic, shared by its clones.
pub type Counter = PromCounter;

type Labels = Vec<(&'static str, String)>;
type Counters = Family<Labels, Counter>;
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
struct RouteCounters {
    /// By tier topic.
    retries: HashMap<String, Counter>,
    dead_lettered: HashMap<Reason, Counter>,
    reloads_ok: Counter,
    reloads_failed: Counter,
    replayed: Counter,
    looped: Counter,
    /// `hopper_emitted_records_total{result=produced}`.
    emitted: Counter,
    /// `hopper_emitted_records_total{result=discarded}`.
    emits_discarded: Counter,
    /// `hopper_hop_failures_total` by outcome.
    hop_failures: HashMap<HopFailure, Counter>,
    /// Registered only for a route with a circuit breaker.
    breaker: Option<BreakerCounters>,
}

/// The counters of a route's circuit breaker.
struct BreakerCounters {
    opened: Counter,
    probes: Counter,
    closed: Counter,
    deferred: Counter,
}

/// The delay relay's counters.
struct RelayCounters {
    delivered: Counter,
    early: Counter,
    lateness: Histogram,
    /// By tier topic.
    tier_hops: HashMap<String, Counter>,
}

/// What one route's processor holds: bumped per message without a lookup.
#[derive(Clone)]
pub struct RouteMetrics {
    /// `None` with metrics off.
    pub consumed: Option<Counter>,
    /// By verdict kind.
    pub outcomes: HashMap<VerdictKind, Counter>,
    /// `None` with metrics off: the call is then not timed at all.
    pub call_duration: Option<Histogram>,
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
        let mut counters = |name: &str, help: &str| {
            let family = Counters::default();
            registry.register(name, help, family.clone());
            family
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
        .map(|(name, help)| (name, counters(name, help)));
        let delivered = counters(
            "hopper_delay_delivered",
            "Delayed messages forwarded to their target.",
        );
        let early = counters(
            "hopper_delay_early",
            "Delayed messages forwarded before their deliver-at (never expected).",
        );
        let tier_hops = counters(
            "hopper_delay_tier_hops",
            "Delayed messages moved down to a delay tier.",
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
            routes: HashMap::new(),
            relay: None,
            registered: Mutex::default(),
        };
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
                let [opened, probes, closed, deferred] =
                    breaker_families.each_ref().map(|(name, family)| {
                        metrics.register(family, name, vec![("route", route.into())])
                    });
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
                        let counter =
                            metrics.register(&retries, "hopper_retries_scheduled", labels);
                        (tier, counter)
                    })
                    .collect(),
                dead_lettered: Reason::ALL
                    .into_iter()
                    .filter(|reason| *reason != Reason::Retryable)
                    .map(|reason| {
                        let labels = vec![("route", route.into()), ("reason", reason.to_string())];
                        let counter =
                            metrics.register(&dead_lettered, "hopper_dead_lettered", labels);
                        (reason, counter)
                    })
                    .collect(),
                reloads_ok: metrics.register(
                    &reloads,
                    "hopper_handler_reloads",
                    vec![("route", route.into()), ("result", "ok".into())],
                ),
                reloads_failed: metrics.register(
                    &reloads,
                    "hopper_handler_reloads",
                    vec![("route", route.into()), ("result", "failed".into())],
                ),
                replayed: metrics.register(
                    &metrics.replays,
                    "hopper_replays",
                    vec![("route", route.into()), ("result", "replayed".into())],
                ),
                looped: metrics.register(
                    &metrics.replays,
                    "hopper_replays",
                    vec![("route", route.into()), ("result", "loop".into())],
                ),
                emitted: metrics.register(
                    &metrics.emits,
                    "hopper_emitted_records",
                    vec![("route", route.into()), ("result", "produced".into())],
                ),
                emits_discarded: metrics.register(
                    &metrics.emits,
                    "hopper_emitted_records",
                    vec![("route", route.into()), ("result", "discarded".into())],
                ),
                hop_failures: HopFailure::ALL
                    .into_iter()
                    .map(|outcome| {
                        let labels =
                            vec![("route", route.into()), ("outcome", outcome.to_string())];
                        let counter =
                            metrics.register(&hop_failures, "hopper_hop_failures", labels);
                        (outcome, counter)
                    })
                    .collect(),
                breaker,
            };
            metrics.routes.insert(route.to_string(), counters);
        }
        if let Some(relay) = &config.delay {
            metrics.relay = Some(RelayCounters {
                delivered: metrics.register(&delivered, "hopper_delay_delivered", vec![]),
                early: metrics.register(&early, "hopper_delay_early", vec![]),
                lateness,
                tier_hops: relay
                    .tiers
                    .iter()
                    .map(|(_, tier)| {
                        let labels = vec![("tier", tier.clone())];
                        (
                            tier.clone(),
                            metrics.register(&tier_hops, "hopper_delay_tier_hops", labels),
                        )
                    })
                    .collect(),
            });
        }
        metrics
    }

    fn register(&self, family: &Counters, name: &str, labels: Labels) -> Counter {
        let counter = family.get_or_create_owned(&labels);
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let key = format!("{name}_total{{{}}}", labels.join(","));
        self.registered.lock().unwrap().push((key, counter.clone()));
        counter
    }

    /// Whether calls are timed and `/metrics` is served.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The handles of route `route`'s processor, registered now; called
    /// once per route, at start.
    pub fn route(&self, route: &str) -> RouteMetrics {
        let label = || ("route", route.to_string());
        RouteMetrics {
            consumed: self
                .enabled
                .then(|| self.register(&self.consumed, "hopper_messages_consumed", vec![label()])),
            outcomes: VerdictKind::ALL
                .into_iter()
                .map(|kind| {
                    let labels = vec![label(), ("outcome", kind.to_string())];
                    let counter = self.register(&self.outcomes, "hopper_handler_outcomes", labels);
                    (kind, counter)
                })
                .collect(),
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
        self.register(&self.http_requests, "hopper_http_requests", labels)
    }

    /// The counter of records `route`'s handler tried to emit and the
    /// route's grants refused, for the route's grants to hold.
    pub fn emits_refused(&self, route: &str) -> Counter {
        let labels = vec![("route", route.to_string()), ("result", "refused".into())];
        self.register(&self.emits, "hopper_emitted_records", labels)
    }

    /// A record `route`'s handler emitted was produced and acknowledged.
    pub fn emitted(&self, route: &str) {
        if let Some(route) = self.routes.get(route) {
            route.emitted.inc();
        }
    }

    /// `count` records `route`'s handler emitted were dropped: the verdict
    /// was not `ok`.
    pub fn emits_discarded(&self, route: &str, count: u64) {
        if let Some(route) = self.routes.get(route) {
            route.emits_discarded.inc_by(count);
        }
    }

    /// `route`'s circuit breaker opened, or reopened.
    pub fn breaker_opened(&self, route: &str) {
        self.breaker(route, |b| &b.opened);
    }

    /// `route`'s half-open breaker let a probe through.
    pub fn breaker_probed(&self, route: &str) {
        self.breaker(route, |b| &b.probes);
    }

    /// `route`'s circuit breaker closed.
    pub fn breaker_closed(&self, route: &str) {
        self.breaker(route, |b| &b.closed);
    }

    /// `route`'s open breaker sent a tier message back to its tier.
    pub fn breaker_deferred(&self, route: &str) {
        self.breaker(route, |b| &b.deferred);
    }

    fn breaker(&self, route: &str, counter: impl Fn(&BreakerCounters) -> &Counter) {
        if let Some(breaker) = self.routes.get(route).and_then(|r| r.breaker.as_ref()) {
            counter(breaker).inc();
        }
    }

    /// A message went up retry tier `tier` of `route`.
    pub fn retry_scheduled(&self, route: &str, tier: &str) {
        if let Some(counter) = self.routes.get(route).and_then(|r| r.retries.get(tier)) {
            counter.inc();
        }
    }

    /// A hop of `route` was not acknowledged.
    pub fn hop_failed(&self, route: &str, outcome: HopFailure) {
        if let Some(counter) = self
            .routes
            .get(route)
            .and_then(|r| r.hop_failures.get(&outcome))
        {
            counter.inc();
        }
    }

    /// A message of `route` was dead-lettered for `reason`.
    pub fn dead_lettered(&self, route: &str, reason: Reason) {
        if let Some(counter) = self
            .routes
            .get(route)
            .and_then(|r| r.dead_lettered.get(&reason))
        {
            counter.inc();
        }
    }

    /// The relay forwarded a message due at `deliver_at` (epoch ms), now.
    pub fn delivered(&self, deliver_at: i64) {
        if let Some(relay) = &self.relay {
            relay.delivered.inc();
            let late_ms = now_ms() - deliver_at;
            if late_ms < 0 {
                relay.early.inc();
            } else if self.enabled {
                relay
                    .lateness
                    .observe(Duration::from_millis(late_ms as u64));
            }
        }
    }

    /// A reload of `route`'s handler succeeded (`ok`) or failed.
    pub fn reloaded(&self, route: &str, ok: bool) {
        if let Some(route) = self.routes.get(route) {
            match ok {
                true => route.reloads_ok.inc(),
                false => route.reloads_failed.inc(),
            };
        }
    }

    /// A delayed message moved down to tier topic `tier`.
    pub fn tier_hop(&self, tier: &str) {
        if let Some(counter) = self.relay.as_ref().and_then(|r| r.tier_hops.get(tier)) {
            counter.inc();
        }
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
