//! Where events go: their log lines and counters, their spans, and the
//! observers they are broadcast to.

use super::{Event, InternalEvent};
use crate::config::Config;
use crate::health::Health;
use crate::metrics::Metrics;
use std::sync::Arc;
use tokio::sync::broadcast;

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
            self.tracer = crate::trace::Tracer::start(
                config,
                self.metrics.handle(&crate::metrics::series::DroppedSpans),
            )?;
        }
        Ok(self)
    }

    pub fn tracer(&self) -> &crate::trace::Tracer {
        &self.tracer
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
    pub fn emit(&self, event: impl InternalEvent + Into<Event>) {
        event.record(&self.metrics);
        if self.tracer.is_on() {
            event.trace(&self.tracer);
        }
        // Fails, cheaply, when nobody observes.
        let _ = self.events.send(event.into());
    }
}
