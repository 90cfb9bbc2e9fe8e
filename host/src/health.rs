//! What a running hopper knows about itself right now: whether each pipeline
//! consumes, which tier partitions are held and until when, how many
//! messages wait per topic, and which handler version serves each route.
//!
//! Everything here is written rarely (at start, on a rebalance-driven state
//! change, when a tier partition is held or released, every lag sample) and
//! read by `/ready`, the admin API and the scrape-time gauges. Each piece has
//! its own std `Mutex`, never held across an `.await`; no message's path
//! takes one.

use crate::breaker::BreakerState;
use crate::clock::now_ms;
use crate::kafka::ConnectionWatch;
use crate::types::TopicPartition;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

/// An undecodable partition is logged at most this often.
const UNDECODABLE_LOG_EVERY_MS: i64 = 60_000;

/// A partition whose next batch the consumer cannot decode (a corrupt
/// compressed batch, a codec this build lacks): it reads nothing more until
/// an operator skips the batch (`hopper skip`, docs/connecting.md).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Undecodable {
    pub pipeline: String,
    pub topic: String,
    pub partition: i32,
    /// The first offset not done here, when the partition read anything
    /// since it was assigned; else the group's committed offset is.
    pub at: Option<i64>,
    /// librdkafka's error.
    pub error: String,
    pub since_ms: i64,
    #[serde(skip)]
    logged_ms: i64,
}

/// How many partitions a pipeline's consumer has assigned now.
pub type AssignmentProbe = Box<dyn Fn() -> usize + Send + Sync>;

/// The state of a route's circuit breaker now.
pub type BreakerProbe = Box<dyn Fn() -> BreakerState + Send + Sync>;

/// A route's parked keys now (`retry_order = "key"`).
pub type ParkedProbe = Box<dyn Fn() -> crate::parked::Summary + Send + Sync>;

/// The handler serving a route, for the admin API and `hopper_handler_info`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HandlerInfo {
    pub route: String,
    /// The handler file.
    pub file: String,
    /// sha256 of the serving version.
    pub version: String,
    pub last_reload_error: Option<String>,
}

/// The state of one pipeline (a route, or `delay` for the relay).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PipelineState {
    /// Running, but its consumer has not joined its group yet.
    Starting,
    /// Joined its group, and given no partition: another process of the
    /// group holds them all. A ready standby, which takes partitions over
    /// when a member leaves (docs/scaling.md).
    Standby,
    /// Running with `partitions` assigned.
    Consuming { partitions: usize },
    /// Not consuming, for `reason`.
    Stopped { reason: String },
}

impl PipelineState {
    pub fn is_consuming(&self) -> bool {
        matches!(self, PipelineState::Consuming { .. })
    }

    /// Consuming, or a standby: what `/ready` asks of every pipeline.
    pub fn is_ready(&self) -> bool {
        matches!(
            self,
            PipelineState::Consuming { .. } | PipelineState::Standby
        )
    }
}

/// Held tier partitions of one pipeline: when each held head is due.
#[derive(Clone, Default, Debug)]
pub struct HeldHeads(Arc<Mutex<HashMap<TopicPartition, i64>>>);

impl HeldHeads {
    pub fn held(&self, tp: &TopicPartition, due_ms: i64) {
        self.0.lock().unwrap().insert(tp.clone(), due_ms);
    }

    pub fn released(&self, tp: &TopicPartition) {
        self.0.lock().unwrap().remove(tp);
    }

    /// Held partitions and when their heads are due, epoch ms.
    pub fn snapshot(&self) -> Vec<(TopicPartition, i64)> {
        let mut heads: Vec<_> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(tp, due)| (tp.clone(), *due))
            .collect();
        heads.sort();
        heads
    }
}

/// One pipeline's live state.
#[derive(Default)]
pub struct PipelineHealth {
    assigned: OnceLock<AssignmentProbe>,
    /// Set for a route with a circuit breaker.
    breaker: OnceLock<BreakerProbe>,
    /// Set for a route with ordered retries.
    parked: OnceLock<ParkedProbe>,
    stopped: Mutex<Option<String>>,
    heads: HeldHeads,
    /// Its consumer took part in a rebalance: it is in its group.
    joined: std::sync::atomic::AtomicBool,
}

/// Messages waiting in one topic for one pipeline's group.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pending {
    pub pipeline: String,
    pub topic: String,
    /// `input`, `tier` or `inbox`.
    pub kind: &'static str,
    pub messages: i64,
}

/// The last lag sample.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PendingSample {
    pub at_ms: i64,
    pub topics: Vec<Pending>,
    /// Why the last sample failed, if it did; `topics` then holds the one
    /// before.
    pub error: Option<String>,
}

/// Live state of every pipeline. Cheap to share (`Arc`).
#[derive(Default)]
pub struct Health {
    pipelines: Mutex<BTreeMap<String, Arc<PipelineHealth>>>,
    pending: Mutex<PendingSample>,
    handlers: OnceLock<Box<dyn Fn() -> Vec<HandlerInfo> + Send + Sync>>,
    connection: OnceLock<Arc<ConnectionWatch>>,
    undecodable: Mutex<BTreeMap<(String, TopicPartition), Undecodable>>,
    undecodable_errors: AtomicU64,
}

impl Health {
    /// The pipeline called `name`, registered on first use.
    pub fn pipeline(&self, name: &str) -> Arc<PipelineHealth> {
        self.pipelines
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// Where the consumer loop of `name` reports its held tier partitions.
    pub fn held_heads(&self, name: &str) -> HeldHeads {
        self.pipeline(name).heads.clone()
    }

    /// Tells how to read the consumer assignment of `name`; set once, when
    /// its consumer is created.
    pub fn set_assignment_probe(&self, name: &str, probe: AssignmentProbe) {
        let _ = self.pipeline(name).assigned.set(probe);
    }

    /// Tells how to read the circuit breaker of route `name`; set once, when
    /// its processor is created.
    pub fn set_breaker(&self, name: &str, probe: BreakerProbe) {
        let _ = self.pipeline(name).breaker.set(probe);
    }

    /// Tells how to read the parked keys of route `name`; set once, when
    /// its park table is loaded.
    pub fn set_parked(&self, name: &str, probe: ParkedProbe) {
        let _ = self.pipeline(name).parked.set(probe);
    }

    /// Every route's parked keys, for the routes with ordered retries.
    pub fn parked(&self) -> Vec<(String, crate::parked::Summary)> {
        let pipelines = self.pipelines.lock().unwrap().clone();
        pipelines
            .into_iter()
            .filter_map(|(name, p)| p.parked.get().map(|read| (name, read())))
            .collect()
    }

    /// The state of route `name`'s circuit breaker, when it has one.
    pub fn breaker(&self, name: &str) -> Option<BreakerState> {
        let pipeline = self.pipelines.lock().unwrap().get(name).cloned()?;
        pipeline.breaker.get().map(|read| read())
    }

    /// Every circuit breaker's state, by route.
    pub fn breakers(&self) -> Vec<(String, BreakerState)> {
        let pipelines = self.pipelines.lock().unwrap().clone();
        pipelines
            .into_iter()
            .filter_map(|(name, p)| p.breaker.get().map(|read| (name, read())))
            .collect()
    }

    /// `name`'s consumer was given an assignment, maybe empty: it joined
    /// its group.
    pub fn joined(&self, name: &str) {
        self.pipeline(name).joined.store(true, Relaxed);
    }

    /// Marks `name` as no longer consuming, for `reason` (its loop ended, or
    /// a hop it cannot make stopped it). Readiness fails from now on.
    pub fn stop(&self, name: &str, reason: impl Into<String>) {
        let reason = reason.into();
        tracing::warn!(pipeline = name, reason, "Pipeline stopped consuming.");
        *self.pipeline(name).stopped.lock().unwrap() = Some(reason);
    }

    /// Follows the connection that `watch` reports on; set once, at start.
    pub fn set_connection(&self, watch: Arc<ConnectionWatch>) {
        let _ = self.connection.set(watch);
    }

    /// What the clients report about the connection to Kafka.
    pub fn connection(&self) -> Arc<ConnectionWatch> {
        self.connection.get_or_init(Default::default).clone()
    }

    /// The consumer of `pipeline` could not decode what `tp` holds at `at`:
    /// counted, shown, and logged at most once a minute per partition.
    pub fn undecodable(&self, pipeline: &str, tp: &TopicPartition, at: Option<i64>, error: &str) {
        self.undecodable_errors.fetch_add(1, Relaxed);
        let now = now_ms();
        let mut all = self.undecodable.lock().unwrap();
        let entry = all
            .entry((pipeline.to_string(), tp.clone()))
            .or_insert_with(|| Undecodable {
                pipeline: pipeline.to_string(),
                topic: tp.topic.clone(),
                partition: tp.partition,
                at,
                error: error.to_string(),
                since_ms: now,
                logged_ms: 0,
            });
        entry.at = at.or(entry.at);
        entry.error = error.to_string();
        if entry.logged_ms == 0 || now - entry.logged_ms >= UNDECODABLE_LOG_EVERY_MS {
            entry.logged_ms = now;
            let at = entry
                .at
                .map_or("the group's committed offset".to_string(), |a| {
                    format!("offset {a}")
                });
            tracing::error!(
                pipeline,
                topic = tp.topic,
                partition = tp.partition,
                error,
                "A batch at {at} cannot be decoded: this partition reads nothing more until it is skipped (`hopper skip`, docs/connecting.md). Logged at most once a minute."
            );
        }
    }

    /// `pipeline` read a record of `tp` again (or let it go): it is no
    /// longer stuck.
    pub fn decoded(&self, pipeline: &str, tp: &TopicPartition) {
        let key = (pipeline.to_string(), tp.clone());
        if self.undecodable.lock().unwrap().remove(&key).is_some() {
            tracing::info!(
                pipeline,
                topic = tp.topic,
                partition = tp.partition,
                "The partition reads again."
            );
        }
    }

    /// Every partition stuck on a batch it cannot decode.
    pub fn undecodables(&self) -> Vec<Undecodable> {
        self.undecodable.lock().unwrap().values().cloned().collect()
    }

    /// How often a consumer reported a batch it could not decode.
    pub fn undecodable_errors(&self) -> u64 {
        self.undecodable_errors.load(Relaxed)
    }

    /// Every pipeline's state, by name.
    pub fn states(&self) -> Vec<(String, PipelineState)> {
        let pipelines = self.pipelines.lock().unwrap().clone();
        pipelines
            .into_iter()
            .map(|(name, p)| {
                let state = if let Some(reason) = p.stopped.lock().unwrap().clone() {
                    PipelineState::Stopped { reason }
                } else {
                    match p.assigned.get().map(|probe| probe()) {
                        Some(n) if n > 0 => PipelineState::Consuming { partitions: n },
                        _ if p.joined.load(Relaxed) => PipelineState::Standby,
                        _ => PipelineState::Starting,
                    }
                };
                (name, state)
            })
            .collect()
    }

    /// Ready: at least one pipeline, and every one consuming or a standby. An open
    /// circuit breaker does not make a route unready: the route still holds
    /// its partitions and is doing what it should while the service it calls
    /// is down; restarting hopper, or sending its traffic elsewhere, would
    /// not bring that service back.
    pub fn ready(&self) -> bool {
        let states = self.states();
        !states.is_empty()
            && states.iter().all(|(_, s)| s.is_ready())
            && self.connection().failing().is_none()
    }

    /// Every held tier partition: (pipeline, partition, due at epoch ms).
    pub fn held(&self) -> Vec<(String, TopicPartition, i64)> {
        let pipelines = self.pipelines.lock().unwrap().clone();
        pipelines
            .into_iter()
            .flat_map(|(name, p)| {
                p.heads
                    .snapshot()
                    .into_iter()
                    .map(move |(tp, due)| (name.clone(), tp, due))
            })
            .collect()
    }

    pub fn record_pending(&self, result: Result<Vec<Pending>, String>) {
        let mut sample = self.pending.lock().unwrap();
        match result {
            Ok(topics) => {
                *sample = PendingSample {
                    at_ms: now_ms(),
                    topics,
                    error: None,
                }
            }
            Err(error) => sample.error = Some(error),
        }
    }

    pub fn pending(&self) -> PendingSample {
        self.pending.lock().unwrap().clone()
    }

    /// Tells where handler versions are read; set once, at start.
    pub fn set_handlers(&self, read: Box<dyn Fn() -> Vec<HandlerInfo> + Send + Sync>) {
        let _ = self.handlers.set(read);
    }

    pub fn handlers(&self) -> Vec<HandlerInfo> {
        self.handlers.get().map(|read| read()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_pipeline_consumes() {
        let health = Health::default();
        assert!(!health.ready(), "nothing runs yet");
        health.set_assignment_probe("a", Box::new(|| 2));
        health.set_assignment_probe("b", Box::new(|| 0));
        assert!(!health.ready(), "b has no partitions");
        assert_eq!(health.states()[1].1, PipelineState::Starting);
        let health = Health::default();
        health.set_assignment_probe("a", Box::new(|| 2));
        assert!(health.ready());
        health.stop("a", "the DLQ is not writable");
        assert!(!health.ready());
        assert_eq!(
            health.states()[0].1,
            PipelineState::Stopped {
                reason: "the DLQ is not writable".into()
            }
        );
    }

    #[test]
    fn held_heads_come_and_go() {
        let health = Health::default();
        let heads = health.held_heads("orders");
        let tp = TopicPartition::new("orders.retry.5s", 1);
        heads.held(&tp, 5_000);
        assert_eq!(
            health.held(),
            vec![("orders".to_string(), tp.clone(), 5_000)]
        );
        heads.released(&tp);
        assert!(health.held().is_empty());
    }
}
