//! Named events, one type each, as vector's `internal_events`: the type
//! holds what happened, and its [`InternalEvent::record`] writes its log line
//! and bumps its counter. [`Telemetry::emit`] records an event and
//! broadcasts it to observers (the demo's live view and tests).
//!
//! Adding an event is its type and its `impl InternalEvent` here, its name
//! in the `events!` list below, and one `telemetry.emit(...)` where it
//! happens. A hop's event rides on its [`crate::hop::PlannedHop`] and is
//! emitted when the broker acknowledges the hop, never when it is planned.
//!
//! Three events happen on a message's path, so they follow the hot-path
//! rule (no lock, no lookup, no formatting per message): [`Handled`],
//! [`HttpRequest`] and [`HttpDenied`] are counted through handles their route
//! registered at start (`metrics::RouteMetrics`, the grants' counters, as
//! vector's registered events are) and logged where they happen; their
//! types are built only when someone observes.
//!
//! Counter labels stay low-cardinality: route, tier, reason, outcome, never
//! a key or an id. Ids appear only in log lines and broadcast events.

use crate::config::Config;
use crate::headers::Reason;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::types::{CancelKind, EmitKind, HopFailure, InboxPosition, TopicPartition, VerdictKind};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

pub use crate::metrics::Counter;

/// One kind of event: writes its log line and bumps its counter.
pub trait InternalEvent: Into<Event> {
    fn record(&self, metrics: &Metrics);

    /// Its span, for an event that ends one; called only with export on.
    fn trace(&self, _tracer: &crate::trace::Tracer) {}
}

/// Declares [`Event`], one variant per event type, and its dispatch.
macro_rules! events {
    ($($name:ident),* $(,)?) => {
        /// Something that happened to one message, or to a route's handler,
        /// as observers receive it.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Event {
            $($name($name),)*
        }

        impl Event {
            /// Writes the event's log line and bumps its counter.
            pub fn record(&self, metrics: &Metrics) {
                match self {
                    $(Event::$name(event) => event.record(metrics),)*
                }
            }
        }

        $(impl From<$name> for Event {
            fn from(event: $name) -> Event {
                Event::$name(event)
            }
        })*
    };
}

/// An event in its broadcast form records as its type does: a hop's event
/// travels as an [`Event`] until the broker acknowledges the hop.
impl InternalEvent for Event {
    fn record(&self, metrics: &Metrics) {
        Event::record(self, metrics)
    }

    fn trace(&self, tracer: &crate::trace::Tracer) {
        if let Event::Delivered(delivered) = self {
            delivered.trace(tracer);
        }
    }
}

events! {
    Handled,
    RetryScheduled,
    DeadLettered,
    Delivered,
    TierHop,
    HandlerReloaded,
    HandlerReloadFailed,
    HttpRequest,
    HttpDenied,
    Emitted,
    HopFailed,
    EmitsDiscarded,
    BreakerOpened,
    BreakerHalfOpen,
    BreakerProbed,
    BreakerClosed,
    BreakerDeferred,
    PartitionsSuspended,
    PartitionsReleased,
    TargetLookupFailed,
    TargetLookupAbandoned,
    CancelRecorded,
    CancellationKnown,
    ScheduleCancelled,
    CancelTooLate,
    CancellationExpired,
    CancelRefused,
    CancellationNotKept,
}

/// A handler call finished. Counted and logged in route.rs through the
/// route's registered handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    pub route: String,
    pub id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub attempt: u32,
    pub verdict: VerdictKind,
    /// sha256 of the handler version that ran.
    pub version: String,
    pub at_ms: i64,
}

impl InternalEvent for Handled {
    fn record(&self, _: &Metrics) {}
}

/// The message was produced to a retry tier and acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryScheduled {
    pub route: String,
    pub id: String,
    pub attempt: u32,
    pub topic: String,
    pub delay: Duration,
    pub reason: Reason,
    /// sha256 of the handler version that asked for the retry.
    pub version: Option<String>,
}

impl InternalEvent for RetryScheduled {
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
        if let Some(counter) = metrics
            .route(&self.route)
            .and_then(|r| r.retries.get(&self.topic))
        {
            counter.inc();
        }
    }
}

/// The message was produced to a dead-letter topic and acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLettered {
    pub route: String,
    pub id: String,
    pub attempt: u32,
    pub topic: String,
    pub reason: Reason,
    pub error: String,
    /// sha256 of the handler version whose verdict sent it there; `None`
    /// when no handler ran (the delay relay, a bad envelope).
    pub version: Option<String>,
}

impl InternalEvent for DeadLettered {
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
        if let Some(counter) = metrics
            .route(&self.route)
            .and_then(|r| r.dead_lettered.get(&self.reason))
        {
            counter.inc();
        }
    }
}

/// The delay relay forwarded a message to its target and it was
/// acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    pub id: String,
    pub target: String,
    pub deliver_at: i64,
    /// Where the inbox read the schedule: what the cancellation table
    /// checks the forward against just before it is produced. `None` for a
    /// tier record written before hopper stamped positions.
    pub inbox: Option<InboxPosition>,
    /// The forward's trace context: its span is reported on the
    /// acknowledgement, with the lateness.
    pub trace: Option<crate::trace::Context>,
}

impl InternalEvent for Delivered {
    fn trace(&self, tracer: &crate::trace::Tracer) {
        if let Some(trace) = &self.trace {
            crate::trace::export::forwarded(tracer, trace, &self.target, self.deliver_at);
        }
    }

    fn record(&self, metrics: &Metrics) {
        let late_ms = crate::clock::now_ms() - self.deliver_at;
        let (id, target, deliver_at) = (&self.id, &self.target, self.deliver_at);
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
        if let Some(relay) = metrics.relay() {
            relay.delivered.inc();
            if late_ms < 0 {
                relay.early.inc();
            } else if metrics.enabled() {
                relay
                    .lateness
                    .observe(Duration::from_millis(late_ms as u64));
            }
        }
    }
}

/// The delay relay moved a message down to a delay tier, and the tier's
/// record was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierHop {
    pub id: String,
    /// The tier topic.
    pub tier: String,
}

impl InternalEvent for TierHop {
    fn record(&self, metrics: &Metrics) {
        tracing::trace!(
            id = self.id,
            tier = self.tier,
            "Delayed message moved down a tier."
        );
        if let Some(counter) = metrics.relay().and_then(|r| r.tier_hops.get(&self.tier)) {
            counter.inc();
        }
    }
}

/// A new handler version is serving the route. Calls already running
/// finish on the old one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerReloaded {
    pub route: String,
    pub handler: String,
    /// sha256 of the version that served until now.
    pub old_version: String,
    /// sha256 of the version that serves from now on.
    pub new_version: String,
    /// From the first file event of the change to the swap.
    pub took: Duration,
    /// The compiled artifact came from the cache; nothing was compiled.
    pub cached: bool,
}

impl InternalEvent for HandlerReloaded {
    fn record(&self, metrics: &Metrics) {
        tracing::info!(
            route = self.route,
            handler = self.handler,
            old_version = short(&self.old_version),
            new_version = short(&self.new_version),
            took_ms = self.took.as_secs_f64() * 1000.0,
            cached = self.cached,
            "Handler reloaded."
        );
        if let Some(route) = metrics.route(&self.route) {
            route.reloads_ok.inc();
        }
    }
}

/// A changed handler file could not be loaded; the old version keeps
/// serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerReloadFailed {
    pub route: String,
    /// sha256 of the version that keeps serving.
    pub version: String,
    pub error: String,
}

impl InternalEvent for HandlerReloadFailed {
    fn record(&self, metrics: &Metrics) {
        tracing::error!(
            route = self.route,
            serving_version = short(&self.version),
            error = self.error,
            "Handler reload failed; the old version keeps serving."
        );
        if let Some(route) = metrics.route(&self.route) {
            route.reloads_failed.inc();
        }
    }
}

/// A handler's HTTP request got a response head, or failed to. Counted and
/// logged in plugin/http.rs through the route's grant counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub route: String,
    /// The message being handled.
    pub id: String,
    /// sha256 of the handler version that sent it.
    pub version: String,
    pub method: String,
    /// `scheme://authority/path`: no query, secrets redacted.
    pub url: String,
    /// The response status; `None` when no response came.
    pub status: Option<u16>,
    /// Why no response came.
    pub error: Option<String>,
    /// From sending the request to its response head.
    pub took: Duration,
}

impl InternalEvent for HttpRequest {
    fn record(&self, _: &Metrics) {}
}

/// A handler's HTTP request was refused by the route's grants: a host not
/// in `allowed_hosts`, a guarded address, or one request past
/// `http.max_requests`. Counted and logged (within the handler's log
/// budget) in plugin/http.rs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpDenied {
    pub route: String,
    pub id: String,
    pub version: String,
    pub method: String,
    pub url: String,
    pub reason: String,
}

impl InternalEvent for HttpDenied {
    fn record(&self, _: &Metrics) {}
}

/// A record a handler emitted was produced and acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    pub route: String,
    /// The emitted record's own id: `<message id>/emit/<index>`, or the
    /// handler's for a schedule or a cancel.
    pub id: String,
    /// The topic it is for (the delay relay's inbox holds it until
    /// `deliver_at` when delayed); for a cancel, the inbox.
    pub topic: String,
    /// Epoch ms, for a delayed record.
    pub deliver_at: Option<i64>,
    /// Which import emitted it: `publish`, `schedule` (or a replace) or
    /// `cancel`.
    pub kind: EmitKind,
}

impl InternalEvent for Emitted {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            route = self.route,
            id = self.id,
            topic = self.topic,
            deliver_at = self.deliver_at,
            kind = self.kind.as_str(),
            "Emitted record produced."
        );
        if let Some(route) = metrics.route(&self.route) {
            route.emitted.inc();
        }
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
        if let Some(counter) = metrics
            .route(route)
            .and_then(|r| r.hop_failures.get(&self.outcome))
        {
            counter.inc();
        }
    }
}

/// Records a handler emitted were dropped, because its verdict was not
/// `ok`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmitsDiscarded {
    pub route: String,
    /// The message whose call emitted them.
    pub id: String,
    pub count: usize,
    pub verdict: VerdictKind,
}

impl InternalEvent for EmitsDiscarded {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            route = self.route,
            id = self.id,
            count = self.count,
            verdict = self.verdict.as_str(),
            "Emitted records discarded: the verdict is not ok."
        );
        if let Some(route) = metrics.route(&self.route) {
            route.emits_discarded.inc_by(self.count as u64);
        }
    }
}

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
        if let Some(breaker) = metrics.breaker(route) {
            breaker.opened.inc();
        }
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
        if let Some(breaker) = metrics.breaker(&self.route) {
            breaker.probes.inc();
        }
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
        if let Some(breaker) = metrics.breaker(&self.route) {
            breaker.closed.inc();
        }
    }
}

/// A tier message that reached an open breaker went back to its tier,
/// attempts unchanged, and was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerDeferred {
    pub route: String,
    pub id: String,
    pub topic: String,
}

impl InternalEvent for BreakerDeferred {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            route = self.route,
            id = self.id,
            tier = self.topic,
            "Message sent back to its tier: the circuit breaker is open."
        );
        if let Some(breaker) = metrics.breaker(&self.route) {
            breaker.deferred.inc();
        }
    }
}

/// Where events go, and where they are counted. Cheap to clone.
#[derive(Clone)]
pub struct Telemetry {
    events: broadcast::Sender<Event>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// Builds and exports spans; off unless `[tracing]` has an endpoint.
    tracer: crate::trace::Tracer,
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
            tracer: crate::trace::Tracer::default(),
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

    /// Starts span export for `[tracing]` when it has an endpoint (on the
    /// current tokio runtime); called before the telemetry is shared.
    pub fn with_tracing(
        mut self,
        tracing: Option<&crate::config::TracingConfig>,
    ) -> Result<Self, crate::trace::ExportError> {
        if let Some(config) = tracing.filter(|t| t.endpoint.is_some()) {
            self.tracer = crate::trace::Tracer::start(config, self.metrics.spans_dropped())?;
        }
        Ok(self)
    }

    pub fn tracer(&self) -> &crate::trace::Tracer {
        &self.tracer
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

    /// Sends an event to observers only: for the hot-path events, whose log
    /// line and counter the caller has already taken care of.
    pub fn publish(&self, event: impl Into<Event>) {
        let _ = self.events.send(event.into());
    }

    /// Records `event` (its log line and its counter) and sends it to
    /// observers.
    pub fn emit(&self, event: impl InternalEvent) {
        event.record(&self.metrics);
        if self.tracer.is_on() {
            event.trace(&self.tracer);
        }
        // Fails, cheaply, when nobody observes.
        let _ = self.events.send(event.into());
    }
}

/// The first 12 hex digits of a version, enough to tell versions apart in a
/// log line.
pub fn short(version: &str) -> &str {
    &version[..12.min(version.len())]
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

/// The delay relay asked the brokers whether a target topic exists and got
/// no clear answer: no answer at all, or an error for the topic that may
/// clear by itself (no leader, no partitions). It asks again after
/// `retry_in`, and the message waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLookupFailed {
    pub target: String,
    pub error: String,
    pub retry_in: Duration,
    /// `Some`: the cluster answered with an error for the topic, and the
    /// relay dead-letters the message if it goes on doing so this much
    /// longer. `None`: the cluster did not answer, which is waited out for
    /// as long as it takes.
    pub gives_up_in: Option<Duration>,
}

impl InternalEvent for TargetLookupFailed {
    fn record(&self, metrics: &Metrics) {
        match self.gives_up_in {
            None => tracing::warn!(
                pipeline = crate::config::RELAY_ROUTE,
                topic = self.target,
                error = self.error,
                retry_in_ms = self.retry_in.as_millis() as u64,
                "Delay target lookup got no answer; retrying for as long as it takes."
            ),
            Some(gives_up_in) => tracing::warn!(
                pipeline = crate::config::RELAY_ROUTE,
                topic = self.target,
                error = self.error,
                retry_in_ms = self.retry_in.as_millis() as u64,
                gives_up_in_ms = gives_up_in.as_millis() as u64,
                "Delay target lookup got an error for the topic; retrying."
            ),
        }
        if let Some(relay) = metrics.relay() {
            relay.lookups_failed.inc();
        }
    }
}

/// The cluster answered a target's lookups with an error for the topic for
/// `[delay] target_lookup_timeout`: the relay stops asking and dead-letters
/// the message as `HOP_FAILED`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLookupAbandoned {
    pub target: String,
    /// The last error the cluster answered for the topic.
    pub error: String,
    /// The time counted against the timeout: under errors for the topic,
    /// not the time the cluster did not answer at all.
    pub asked_for: Duration,
    /// The lookups the cluster answered with an error for the topic.
    pub lookups: u32,
}

impl InternalEvent for TargetLookupAbandoned {
    fn record(&self, metrics: &Metrics) {
        tracing::warn!(
            pipeline = crate::config::RELAY_ROUTE,
            topic = self.target,
            error = self.error,
            asked_for_ms = self.asked_for.as_millis() as u64,
            lookups = self.lookups,
            "Delay target lookup gave up; the message is dead-lettered."
        );
        if let Some(relay) = metrics.relay() {
            relay.lookups_abandoned.inc();
        }
    }
}

/// The delay relay read a cancel (or a replace) from its inbox and its
/// entry in the cancellation topic was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRecorded {
    pub id: String,
    pub kind: CancelKind,
    pub inbox: InboxPosition,
}

impl InternalEvent for CancelRecorded {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            id = self.id,
            kind = self.kind.as_str(),
            inbox = %self.inbox,
            "Cancellation recorded."
        );
        if let Some(relay) = metrics.relay() {
            match self.kind {
                CancelKind::Cancel => relay.cancels_recorded.inc(),
                CancelKind::Replace => relay.replaces_recorded.inc(),
            };
        }
    }
}

/// This process's cancellation table took in an entry from the
/// cancellation topic: from now on it drops what the entry covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancellationKnown {
    /// The id, lossily decoded (the topic's keys are bytes).
    pub id: String,
    pub kind: CancelKind,
    pub inbox: InboxPosition,
    /// The record time of the entry, epoch ms.
    pub recorded_at: i64,
}

impl InternalEvent for CancellationKnown {
    fn record(&self, _: &Metrics) {
        tracing::trace!(
            id = self.id,
            kind = self.kind.as_str(),
            inbox = %self.inbox,
            "Cancellation known."
        );
    }
}

/// A delayed message was dropped, never delivered: a cancel or a replace
/// read after it covers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleCancelled {
    pub id: String,
    pub target: String,
    pub deliver_at: i64,
    /// What dropped it.
    pub kind: CancelKind,
    /// Where the inbox read the dropped schedule.
    pub inbox: InboxPosition,
}

impl InternalEvent for ScheduleCancelled {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            id = self.id,
            target = self.target,
            deliver_at = self.deliver_at,
            kind = self.kind.as_str(),
            inbox = %self.inbox,
            "Delayed message cancelled."
        );
        if let Some(relay) = metrics.relay() {
            match self.kind {
                CancelKind::Cancel => relay.cancelled.inc(),
                CancelKind::Replace => relay.replaced.inc(),
            };
        }
    }
}

/// A cancellation arrived after this process had forwarded a schedule it
/// covers: the message was delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelTooLate {
    pub id: String,
    pub kind: CancelKind,
}

impl InternalEvent for CancelTooLate {
    fn record(&self, metrics: &Metrics) {
        tracing::warn!(
            id = self.id,
            kind = self.kind.as_str(),
            "Cancellation too late: the message was already delivered."
        );
        if let Some(relay) = metrics.relay() {
            relay.too_late.inc();
        }
    }
}

/// The delay relay refused a cancel (or a replace) of an id its
/// cancellation table does not hold, the table being full: the record went
/// to the relay's dead-letter topic as `CANCEL_TABLE_FULL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRefused {
    pub id: String,
    pub kind: CancelKind,
    pub inbox: InboxPosition,
    /// Entries in the table when it was refused.
    pub entries: usize,
    /// `[delay] max_cancellations`.
    pub max: usize,
}

impl InternalEvent for CancelRefused {
    fn record(&self, metrics: &Metrics) {
        tracing::warn!(
            id = self.id,
            kind = self.kind.as_str(),
            inbox = %self.inbox,
            entries = self.entries,
            max_cancellations = self.max,
            "Cancellation refused: the cancellation table is full; dead-lettered as CANCEL_TABLE_FULL."
        );
        if let Some(relay) = metrics.relay() {
            match self.kind {
                CancelKind::Cancel => relay.cancels_refused.inc(),
                CancelKind::Replace => relay.replaces_refused.inc(),
            };
        }
    }
}

/// An entry read from the cancellation topic was not kept: the table held
/// its ceiling (`max_cancellations` and a sixteenth more), which entries
/// written by relays of this config do not reach. What it covers may be
/// delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancellationNotKept {
    pub id: String,
    pub inbox: InboxPosition,
    pub entries: usize,
}

impl InternalEvent for CancellationNotKept {
    fn record(&self, metrics: &Metrics) {
        tracing::error!(
            id = self.id,
            inbox = %self.inbox,
            entries = self.entries,
            "Cancellation table past its ceiling; entry not kept."
        );
        if let Some(relay) = metrics.relay() {
            relay.not_kept.inc();
        }
    }
}

/// A cancellation entry expired: nothing it covers can still be due, and
/// this process forgot it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancellationExpired {
    pub id: String,
    pub kind: CancelKind,
    /// Schedules this process dropped because of it.
    pub dropped: u32,
    /// Whether this process read the cancel from the inbox and, having
    /// dropped nothing and seen no delivery it came too late for, counts it
    /// as a cancel for an unknown id.
    pub unknown_id: bool,
}

impl InternalEvent for CancellationExpired {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            id = self.id,
            kind = self.kind.as_str(),
            dropped = self.dropped,
            unknown_id = self.unknown_id,
            "Cancellation expired."
        );
        if self.unknown_id {
            tracing::debug!(
                id = self.id,
                kind = self.kind.as_str(),
                "Cancellation expired without cancelling anything: unknown id, or already delivered."
            );
            if let Some(relay) = metrics.relay() {
                relay.unknown_id.inc();
            }
        }
    }
}

/// `topic[partition]` entries, comma-separated, for a log line.
fn list(partitions: &[TopicPartition]) -> String {
    let names: Vec<String> = partitions.iter().map(ToString::to_string).collect();
    names.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigFile;

    fn telemetry() -> (Telemetry, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("h.wasm"), b"not loaded here").unwrap();
        let config = ConfigFile::parse(
            "[[route]]\nname = \"orders\"\ntopics = [\"orders\"]\nhandler = \"h.wasm\"\n\
             retry = [\"5s\"]\n\n[delay]\ntiers = [\"1s\"]\n",
        )
        .unwrap()
        .resolve(dir.path())
        .unwrap();
        (Telemetry::for_config(&config, true), dir)
    }

    /// A hop's event is planned with the hop and counted only when it is
    /// emitted, which the producer does on the broker's acknowledgement.
    #[test]
    fn a_planned_hop_counts_nothing_until_its_event_is_emitted() {
        let (telemetry, _dir) = telemetry();
        let key = "hopper_delay_tier_hops_total{tier=hopper.delay.1s}";
        assert_eq!(telemetry.counters()[key], 0);
        let planned: Event = TierHop {
            id: "m-1".into(),
            tier: "hopper.delay.1s".into(),
        }
        .into();
        assert_eq!(telemetry.counters()[key], 0, "planning counts nothing");
        telemetry.emit(planned);
        assert_eq!(telemetry.counters()[key], 1);
    }

    /// Each event type bumps the counter it names, for its route and
    /// labels, and no other.
    #[test]
    fn each_event_bumps_its_own_counter() {
        let (telemetry, _dir) = telemetry();
        let before = telemetry.counters();
        telemetry.emit(RetryScheduled {
            route: "orders".into(),
            id: "m-1".into(),
            attempt: 1,
            topic: "orders.retry.5s".into(),
            delay: Duration::from_secs(5),
            reason: Reason::Retryable,
            version: None,
        });
        telemetry.emit(DeadLettered {
            route: "orders".into(),
            id: "m-2".into(),
            attempt: 3,
            topic: "orders.dlq".into(),
            reason: Reason::Fatal,
            error: "no".into(),
            version: None,
        });
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
        let after = telemetry.counters();
        let moved: BTreeMap<&str, u64> = after
            .iter()
            .filter(|(k, v)| before[*k] != **v)
            .map(|(k, v)| (k.as_str(), v - before[k]))
            .collect();
        assert_eq!(
            moved,
            BTreeMap::from([
                ("hopper_dead_lettered_total{route=orders,reason=FATAL}", 1),
                (
                    "hopper_emitted_records_total{route=orders,result=discarded}",
                    4
                ),
                ("hopper_hop_failures_total{route=orders,outcome=retried}", 1),
                (
                    "hopper_retries_scheduled_total{route=orders,tier=orders.retry.5s}",
                    1
                ),
            ])
        );
    }
}
