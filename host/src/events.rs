//! Named events: each one writes its log line, bumps its counter and is
//! broadcast to observers (the demo's live view and tests).
//!
//! Counter labels stay low-cardinality: route, tier, reason, outcome — never a
//! key or an id. Ids appear only in log lines and broadcast events.

use crate::headers::Reason;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
        /// `ok`, `retryable`, `fatal`, `trap`, `timeout` or `memory`.
        verdict: &'static str,
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
    },
    /// The message was produced to a dead-letter topic and acknowledged.
    DeadLettered {
        route: String,
        id: String,
        attempt: u32,
        topic: String,
        reason: Reason,
        error: String,
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
    /// Records a handler emitted were dropped, because its verdict was not
    /// `ok`.
    EmitsDiscarded {
        route: String,
        /// The message whose call emitted them.
        id: String,
        count: usize,
        /// The verdict label (`retryable`, `fatal`, `timeout`, ...).
        verdict: &'static str,
    },
}

/// One counter, registered once and bumped without a lookup: hot paths
/// hold their counters.
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

/// Where events go. Cheap to clone.
#[derive(Clone)]
pub struct Telemetry {
    events: broadcast::Sender<Event>,
    // std Mutex: held to register or read counters, never across an .await.
    counters: Arc<Mutex<BTreeMap<String, Counter>>>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    pub fn new() -> Self {
        // Slow observers lose the oldest events rather than slowing hopper.
        let (events, _) = broadcast::channel(65_536);
        Self {
            events,
            counters: Arc::default(),
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Counter values, keyed `name{label=value,...}`.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        self.counters
            .lock()
            .unwrap()
            .iter()
            .map(|(k, c)| (k.clone(), c.0.load(Ordering::Relaxed)))
            .collect()
    }

    /// The counter `name{labels}`, registered on first use.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Counter {
        thread_local! {
            // The key is built here, and allocated only for a new counter.
            static KEY: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        KEY.with_borrow_mut(|key| {
            key.clear();
            key.push_str(name);
            key.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    key.push(',');
                }
                key.push_str(k);
                key.push('=');
                key.push_str(v);
            }
            key.push('}');
            let mut counters = self.counters.lock().unwrap();
            if let Some(counter) = counters.get(key.as_str()) {
                return counter.clone();
            }
            counters.entry(key.clone()).or_default().clone()
        })
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
        self.count("hopper_delay_hops_total", &[("tier", tier)]);
    }

    fn count(&self, name: &str, labels: &[(&str, &str)]) {
        self.counter(name, labels).inc();
    }

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
                self.count(
                    "hopper_emitted_total",
                    &[("route", route), ("topic", topic)],
                );
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
                    verdict,
                    "Emitted records discarded: the verdict is not ok."
                );
                self.counter("hopper_emits_discarded_total", &[("route", route)])
                    .add(*count as u64);
            }
            Event::RetryScheduled {
                route,
                id,
                attempt,
                topic,
                delay,
                reason,
            } => {
                tracing::info!(
                    route,
                    id,
                    attempt,
                    tier = topic,
                    delay = %humantime::format_duration(*delay),
                    reason = reason.as_str(),
                    "Retry scheduled."
                );
                self.count("hopper_retries_total", &[("route", route), ("tier", topic)]);
            }
            Event::DeadLettered {
                route,
                id,
                attempt,
                topic,
                reason,
                error,
            } => {
                tracing::warn!(
                    route,
                    id,
                    attempt,
                    dlq = topic,
                    reason = reason.as_str(),
                    error,
                    "Message dead-lettered."
                );
                self.count(
                    "hopper_dead_lettered_total",
                    &[("route", route), ("reason", reason.as_str())],
                );
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
                    self.count("hopper_delay_late_total", &[("target", target)]);
                }
                self.count("hopper_delay_delivered_total", &[("target", target)]);
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
                self.count("hopper_reloads_total", &[("route", route)]);
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
                self.count("hopper_reload_failures_total", &[("route", route)]);
            }
        }
        // No subscribers is fine.
        let _ = self.events.send(event);
    }
}

/// The first 12 hex digits of a version, enough to tell versions apart in a
/// log line.
fn short(version: &str) -> &str {
    &version[..12.min(version.len())]
}
