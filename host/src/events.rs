//! Named events: each one writes its log line, bumps its counter and is
//! broadcast to observers (the demo's live view and tests).
//!
//! Which metric an event bumps is decided in one place: the match in
//! [`Telemetry::emit`], one arm per event.
//! Counter labels stay low-cardinality: route, tier, reason, outcome — never a
//! key or an id. Ids appear only in log lines and broadcast events.

use crate::config::Config;
use crate::headers::Reason;
use crate::health::Health;
use crate::metrics::Metrics;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

/// Something that happened to one message, or to a route's handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A handler call finished.
    Handled {
        route: String,
        id: String,
        topic: String,
        partition: i32,
        offset: i64,
        attempt: u32,
        verdict: VerdictKind,
        /// sha256 of the handler version that ran.
        version: String,
        at_ms: i64,
    },
    /// The message was produced to a retry tier and acknowledged.
    RetryScheduled {
        route: String,
        id: String,
        attempt: u32,
        topic: String,
        delay: Duration,
        reason: Reason,
        /// sha256 of the handler version that asked for the retry.
        version: Option<String>,
    },
    /// The message was produced to a dead-letter topic and acknowledged.
    DeadLettered {
        route: String,
        id: String,
        attempt: u32,
        topic: String,
        reason: Reason,
        error: String,
        /// sha256 of the handler version whose verdict sent it there; `None`
        /// when no handler ran (the delay relay, a bad envelope).
        version: Option<String>,
    },
    /// The delay relay forwarded a message to its target and it was
    /// acknowledged.
    Delivered {
        id: String,
        target: String,
        deliver_at: i64,
    },
    /// A new handler version is serving the route. Calls already running
    /// finish on the old one.
    HandlerReloaded {
        route: String,
        handler: String,
        /// sha256 of the version that served until now.
        old_version: String,
        /// sha256 of the version that serves from now on.
        new_version: String,
        /// From the first file event of the change to the swap.
        took: Duration,
        /// The compiled artifact came from the cache; nothing was compiled.
        cached: bool,
    },
    /// A changed handler file could not be loaded; the old version keeps
    /// serving.
    HandlerReloadFailed {
        route: String,
        /// sha256 of the version that keeps serving.
        version: String,
        error: String,
    },
    /// A handler's HTTP request got a response head, or failed to.
    HttpRequest {
        route: String,
        /// The message being handled.
        id: String,
        /// sha256 of the handler version that sent it.
        version: String,
        method: String,
        /// `scheme://authority/path`: no query, secrets redacted.
        url: String,
        /// The response status; `None` when no response came.
        status: Option<u16>,
        /// Why no response came.
        error: Option<String>,
        /// From sending the request to its response head.
        took: Duration,
    },
    /// A handler's HTTP request was refused by the route's grants: a host
    /// not in `allowed_hosts`, a guarded address, or one request past
    /// `http.max_requests`.
    HttpDenied {
        route: String,
        id: String,
        version: String,
        method: String,
        url: String,
        reason: String,
    },
    /// A record a handler emitted was produced and acknowledged.
    Emitted {
        route: String,
        /// The emitted record's own id: `<message id>/emit/<index>`.
        id: String,
        /// The topic it is for (the delay relay's inbox holds it until
        /// `deliver_at` when delayed).
        topic: String,
        /// Epoch ms, for a delayed record.
        deliver_at: Option<i64>,
    },
    /// The broker did not acknowledge a hop. A transient error is retried
    /// with backoff; a hop refused for good is dead-lettered instead; a
    /// dead-letter record refused for good stops the pipeline.
    HopFailed {
        /// The route, or `delay` for the relay.
        route: String,
        /// The topic the hop was for.
        topic: String,
        error: String,
        outcome: HopFailure,
    },
    /// Records a handler emitted were dropped, because its verdict was not
    /// `ok`.
    EmitsDiscarded {
        route: String,
        /// The message whose call emitted them.
        id: String,
        count: usize,
        verdict: VerdictKind,
    },
    /// A route's circuit breaker opened: its retry tiers (and its inputs,
    /// with `pause_input`) are paused for `cool_down`.
    BreakerOpened {
        route: String,
        /// Retryable verdicts among the last `calls` calls (1 of 1 when a
        /// half-open probe reopened it).
        retryable: u32,
        calls: u32,
        cool_down: Duration,
        /// Reopened by a retryable probe, rather than opened from closed.
        reopened: bool,
    },
    /// The cool-down is over: the breaker lets `probes` messages through.
    BreakerHalfOpen { route: String, probes: u32 },
    /// A half-open breaker's probe was handled.
    BreakerProbed {
        route: String,
        id: String,
        verdict: VerdictKind,
    },
    /// Every probe passed: the route consumes its tiers again.
    BreakerClosed {
        route: String,
        /// Since the breaker opened from closed.
        open_for: Duration,
    },
    /// A tier message that reached an open breaker went back to its tier,
    /// attempts unchanged, and was acknowledged.
    BreakerDeferred {
        route: String,
        id: String,
        topic: String,
    },
}

pub use crate::metrics::Counter;
use crate::types::{HopFailure, VerdictKind};

/// Where events go, and where they are counted. Cheap to clone.
#[derive(Clone)]
pub struct Telemetry {
    events: broadcast::Sender<Event>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    /// Telemetry that counts no route: for a component used on its own.
    pub fn new() -> Self {
        let health = Arc::new(Health::default());
        Self::with(Metrics::new(None, health.clone(), true), health)
    }

    /// Telemetry with every counter of `config` registered. With `metrics`
    /// false nothing is timed (see [`Metrics::new`]).
    pub fn for_config(config: &Config, metrics: bool) -> Self {
        let health = Arc::new(Health::default());
        Self::with(Metrics::new(Some(config), health.clone(), metrics), health)
    }

    fn with(metrics: Metrics, health: Arc<Health>) -> Self {
        // Slow observers lose the oldest events rather than slowing hopper.
        let (events, _) = broadcast::channel(65_536);
        Self {
            events,
            metrics: Arc::new(metrics),
            health,
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Counter values, keyed `name_total{label=value,...}`.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        self.metrics.counters()
    }

    /// True when someone listens to [`Telemetry::subscribe`]; hot paths
    /// skip building events nobody reads.
    pub fn has_observers(&self) -> bool {
        self.events.receiver_count() > 0
    }

    /// Sends an event to observers only: for events whose log line and
    /// counter the caller has already taken care of.
    pub fn publish(&self, event: Event) {
        let _ = self.events.send(event);
    }

    /// A delayed message moved down one tier.
    pub fn count_tier_hop(&self, tier: &str) {
        self.metrics.tier_hop(tier);
    }

    /// Logs `event`, counts it in its metric family and sends it to
    /// observers. Each arm is the one place its event's log line and
    /// counter are decided.
    pub fn emit(&self, event: Event) {
        match &event {
            // Logged and counted where the call or the request is made
            // (route.rs, plugin/http.rs), which hold their counters; only
            // broadcast here.
            Event::Handled { .. } | Event::HttpRequest { .. } | Event::HttpDenied { .. } => {}
            Event::Emitted {
                route,
                id,
                topic,
                deliver_at,
            } => {
                tracing::debug!(route, id, topic, deliver_at, "Emitted record produced.");
                self.metrics.emitted(route);
            }
            Event::EmitsDiscarded {
                route,
                id,
                count,
                verdict,
            } => {
                tracing::debug!(
                    route,
                    id,
                    count,
                    verdict = verdict.as_str(),
                    "Emitted records discarded: the verdict is not ok."
                );
                self.metrics.emits_discarded(route, *count as u64);
            }
            Event::HopFailed {
                route,
                topic,
                error,
                outcome,
            } => {
                match outcome {
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
                self.metrics.hop_failed(route, *outcome);
            }
            Event::RetryScheduled {
                route,
                id,
                attempt,
                topic,
                delay,
                reason,
                version,
            } => {
                tracing::info!(
                    route,
                    id,
                    attempt,
                    version = version.as_deref().map(short),
                    tier = topic,
                    delay = %humantime::format_duration(*delay),
                    reason = reason.as_str(),
                    "Retry scheduled."
                );
                self.metrics.retry_scheduled(route, topic);
            }
            Event::DeadLettered {
                route,
                id,
                attempt,
                topic,
                reason,
                error,
                version,
            } => {
                tracing::warn!(
                    route,
                    id,
                    attempt,
                    version = version.as_deref().map(short),
                    dlq = topic,
                    reason = reason.as_str(),
                    error,
                    "Message dead-lettered."
                );
                self.metrics.dead_lettered(route, *reason);
            }
            Event::Delivered {
                id,
                target,
                deliver_at,
            } => {
                let late_ms = crate::clock::now_ms() - deliver_at;
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
                self.metrics.delivered(*deliver_at);
            }
            Event::HandlerReloaded {
                route,
                handler,
                old_version,
                new_version,
                took,
                cached,
            } => {
                tracing::info!(
                    route,
                    handler,
                    old_version = short(old_version),
                    new_version = short(new_version),
                    took_ms = took.as_secs_f64() * 1000.0,
                    cached,
                    "Handler reloaded."
                );
                self.metrics.reloaded(route, true);
            }
            Event::HandlerReloadFailed {
                route,
                version,
                error,
            } => {
                tracing::error!(
                    route,
                    serving_version = short(version),
                    error,
                    "Handler reload failed; the old version keeps serving."
                );
                self.metrics.reloaded(route, false);
            }
            Event::BreakerOpened {
                route,
                retryable,
                calls,
                cool_down,
                reopened,
            } => {
                let cool_down = humantime::format_duration(*cool_down).to_string();
                if *reopened {
                    tracing::warn!(
                        route,
                        cool_down,
                        "Circuit breaker reopened: a probe was retryable; retry tiers stay paused."
                    );
                } else {
                    tracing::warn!(
                        route,
                        rate = format!("{retryable}/{calls}"),
                        cool_down,
                        "Circuit breaker opened: too many retryable verdicts; retry tiers paused."
                    );
                }
                self.metrics.breaker_opened(route);
            }
            Event::BreakerHalfOpen { route, probes } => {
                tracing::info!(
                    route,
                    probes,
                    "Circuit breaker half-open: letting probes through."
                );
            }
            Event::BreakerProbed { route, id, verdict } => {
                tracing::info!(
                    route,
                    id,
                    verdict = verdict.as_str(),
                    "Circuit breaker probe handled."
                );
                self.metrics.breaker_probed(route);
            }
            Event::BreakerClosed { route, open_for } => {
                tracing::info!(
                    route,
                    open_for = %humantime::format_duration(*open_for),
                    "Circuit breaker closed: retry tiers resumed."
                );
                self.metrics.breaker_closed(route);
            }
            Event::BreakerDeferred { route, id, topic } => {
                tracing::debug!(
                    route,
                    id,
                    tier = topic,
                    "Message sent back to its tier: the circuit breaker is open."
                );
                self.metrics.breaker_deferred(route);
            }
        }
        // No subscribers is fine.
        let _ = self.events.send(event);
    }
}

/// The first 12 hex digits of a version, enough to tell versions apart in a
/// log line.
pub fn short(version: &str) -> &str {
    &version[..12.min(version.len())]
}
