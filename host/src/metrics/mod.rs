//! Prometheus metrics: every family hopper exports, and the handles hot
//! paths hold. Each counter family is named once, in [`series`], where its
//! type is also the key of one of its series; which event bumps which
//! series is decided by the event's own type (`events`).
//!
//! Hot paths never look a metric up by name and never format a label: a
//! route's processor and its grants hold their counters and histogram from
//! the start ([`Metrics::handle`]), and the series events bump are
//! registered for every route, tier and reason when hopper starts and found
//! again through an index that no lookup locks ([`Metrics::inc`]). Only
//! registration and scrapes take a lock.
//!
//! Labels stay low-cardinality: route, tier topic, reason, outcome,
//! partition. Never a key or a message id.

mod histogram;
mod live;
pub mod series;

pub use histogram::{CALL_BUCKETS, Histogram, LATENESS_BUCKETS, WAIT_BUCKETS};

use crate::config::{Config, RELAY_ROUTE};
use crate::headers::Reason;
use crate::health::Health;
use crate::types::{CancelKind, HopFailure};
use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use series::{FAMILIES, Index, Series};
use std::sync::{Arc, Mutex};

/// A counter: one atomic, shared by its clones.
pub type Counter = PromCounter;
/// A gauge: one atomic, shared by its clones.
pub type Gauge = prometheus_client::metrics::gauge::Gauge;

type Labels = Vec<(&'static str, String)>;
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

/// Every metric family, and the series registered in them.
pub struct Metrics {
    registry: Registry,
    enabled: bool,
    /// The counter families, in the order of [`series::FAMILIES`].
    families: Vec<Family<Labels, Counter>>,
    /// Every registered series; replaced whole by a registration.
    index: ArcSwap<Index>,
    /// Held while a series is registered.
    registering: Mutex<()>,
    call_duration: Histograms,
    /// `hopper_http_wait_seconds`, by route: the series of a route with
    /// `http.hosts` limits, made when its grants are.
    http_wait: Histograms,
    /// `hopper_delay_lateness_seconds`, when a relay runs.
    lateness: Option<Histogram>,
    /// `hopper_delay_cancellations`: entries in this process's table, when
    /// a relay runs.
    cancellations: Option<Gauge>,
}

impl Metrics {
    /// The families, with the series of every route, tier and reason of
    /// `config` registered (so each exists, at 0, from the start). With
    /// `enabled` false, nothing is timed and the consumed counters stay
    /// unregistered; the outcome, retry and dead-letter counters still count
    /// (hopper's own status reads them).
    pub fn new(config: Option<&Config>, health: Arc<Health>, enabled: bool) -> Metrics {
        let mut registry = Registry::default();
        let families: Vec<Family<Labels, Counter>> = FAMILIES
            .iter()
            .map(|family| {
                let counters = Family::default();
                registry.register(family.name, family.help, counters.clone());
                counters
            })
            .collect();
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
        let http_wait: Histograms = Family::new_with_constructor(|| Histogram::new(&WAIT_BUCKETS));
        registry.register(
            "hopper_http_wait_seconds",
            "Time handlers' outbound HTTP requests waited for their host's limits (http.hosts).",
            http_wait.clone(),
        );
        let lateness = Histogram::new(&LATENESS_BUCKETS);
        registry.register(
            "hopper_delay_lateness_seconds",
            "How long after its deliver-at a delayed message was forwarded.",
            lateness.clone(),
        );
        // Both read as absent where no relay runs.
        let relay = config.is_some_and(|c| c.delay.is_some());
        let (lateness, cancellations) = (relay.then_some(lateness), relay.then_some(cancellations));
        registry.register_collector(Box::new(live::Live(health)));
        let metrics = Metrics {
            registry,
            enabled,
            families,
            index: ArcSwap::default(),
            registering: Mutex::default(),
            call_duration,
            http_wait,
            lateness,
            cancellations,
        };
        metrics.handle(&series::DroppedSpans);
        if let Some(config) = config {
            metrics.register_config(config);
        }
        metrics
    }

    /// Registers the series events of `config`'s routes and relay bump.
    fn register_config(&self, config: &Config) {
        let mut routes: Vec<(&str, Vec<String>, bool)> = config
            .routes
            .iter()
            .map(|r| {
                let tiers = r.tiers().into_iter().map(|t| t.1).collect();
                (r.name.as_str(), tiers, r.breaker.is_some())
            })
            .collect();
        for route in config.routes.iter().filter(|r| r.parking.is_some()) {
            let route = route.name.as_str();
            self.handle(&series::ParkedKeys { route });
            self.handle(&series::ParkedMessages { route });
            for cause in crate::types::ReleaseCause::ALL {
                let cause = cause.as_str();
                self.handle(&series::KeyReleases { route, cause });
            }
            for reason in crate::types::ParkRefusal::ALL {
                let reason = reason.as_str();
                self.handle(&series::ParkRefused { route, reason });
            }
        }
        if config.delay.is_some() {
            routes.push((RELAY_ROUTE, Vec::new(), false));
        }
        for (route, tiers, breaker) in routes {
            for tier in &tiers {
                self.handle(&series::Retries { route, tier });
            }
            for reason in Reason::ALL.into_iter().filter(|r| *r != Reason::Retryable) {
                let reason = reason.as_str();
                self.handle(&series::DeadLetters { route, reason });
            }
            for result in ["ok", "failed"] {
                self.handle(&series::HandlerReloads { route, result });
            }
            for result in ["replayed", "loop"] {
                self.handle(&series::Replays { route, result });
            }
            for result in ["produced", "discarded"] {
                self.handle(&series::EmittedRecords { route, result });
            }
            for outcome in HopFailure::ALL {
                let outcome = outcome.as_str();
                self.handle(&series::HopFailures { route, outcome });
            }
            if breaker {
                self.handle(&series::BreakerOpenings { route });
                self.handle(&series::BreakerProbes { route });
                self.handle(&series::BreakerClosings { route });
                self.handle(&series::BreakerDeferrals { route });
            }
        }
        if let Some(relay) = &config.delay {
            self.handle(&series::DelayDeliveries);
            self.handle(&series::EarlyDeliveries);
            self.handle(&series::FailedTargetLookups);
            self.handle(&series::AbandonedTargetLookups);
            for kind in [CancelKind::Cancel, CancelKind::Replace] {
                let kind = kind.as_str();
                self.handle(&series::RecordedCancels { kind });
            }
            self.handle(&series::CancelledSchedules);
            self.handle(&series::ReplacedSchedules);
            self.handle(&series::LateCancels);
            self.handle(&series::UnknownIdCancels);
            for kind in [CancelKind::Cancel, CancelKind::Replace] {
                let kind = kind.as_str();
                self.handle(&series::RefusedCancels { kind });
            }
            self.handle(&series::UnkeptCancellations);
            for (_, tier) in &relay.tiers {
                self.handle(&series::DelayTierHops { tier });
            }
        }
    }

    /// The counter of `series`, registered now if it is not yet: for a hot
    /// path to hold, so that it never looks one up.
    pub fn handle<S: Series>(&self, series: &S) -> Counter {
        if let Some(counter) = self.index.load().find(series) {
            return counter.clone();
        }
        let _registering = self.registering.lock().unwrap();
        let mut index = Index::clone(&self.index.load());
        if let Some(counter) = index.find(series) {
            return counter.clone();
        }
        let counter = self.families[S::FAMILY].get_or_create_owned(&series.labels());
        index.insert(series, counter.clone());
        self.index.store(Arc::new(index));
        counter
    }

    /// Counts one in `series`, if it is registered: the series of a route
    /// or a relay hopper does not run count nothing.
    pub fn inc<S: Series>(&self, series: &S) {
        self.inc_by(series, 1);
    }

    /// Counts `by` in `series`, if it is registered.
    pub fn inc_by<S: Series>(&self, series: &S, by: u64) {
        if let Some(counter) = self.index.load().find(series) {
            counter.inc_by(by);
        }
    }

    /// The value of `series`; `None` when it is not registered.
    pub fn get<S: Series>(&self, series: &S) -> Option<u64> {
        self.index.load().find(series).map(Counter::get)
    }

    /// The sum of every registered series of family `S` whose label values
    /// `keep` keeps: a route's dead letters of any reason, say.
    pub fn sum<S: Series>(&self, keep: impl Fn(&[String]) -> bool) -> u64 {
        self.index.load().sum(S::FAMILY, keep)
    }

    /// Whether calls are timed and `/metrics` is served.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The histogram of `route`'s call durations; `None` with metrics off,
    /// when calls are not timed at all.
    pub fn call_duration(&self, route: &str) -> Option<Histogram> {
        self.enabled.then(|| {
            self.call_duration
                .get_or_create_owned(&vec![("route", route.to_string())])
        })
    }

    /// The histogram of the waits of `route`'s HTTP requests for their
    /// host's limits. Made whether or not calls are timed: only a route
    /// with limits asks, and a wait is timed anyway.
    pub fn http_wait(&self, route: &str) -> Histogram {
        self.http_wait
            .get_or_create_owned(&vec![("route", route.to_string())])
    }

    /// Sets the gauge of the cancellation table's size.
    pub fn set_cancellations(&self, entries: usize) {
        if let Some(gauge) = &self.cancellations {
            gauge.set(entries as i64);
        }
    }

    /// The gauge of the cancellation table's size, when a relay runs.
    pub fn cancellations(&self) -> Option<i64> {
        self.cancellations.as_ref().map(Gauge::get)
    }

    /// The delay relay's lateness histogram, when a relay runs.
    pub fn lateness(&self) -> Option<&Histogram> {
        self.lateness.as_ref()
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
