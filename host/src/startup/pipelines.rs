//! A pipeline (a route's, or the delay relay's) in two steps: built, with
//! its consumer and producer created but nothing subscribed, and started,
//! its loop spawned under a supervisor.

use crate::events::Telemetry;
use crate::hop::Processor;
use crate::kafka::{self, Cluster, Doing as _, KafkaError};
use crate::{pipeline, produce};
use rdkafka::consumer::Consumer;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What every pipeline's supervisor shares with the running hopper.
#[derive(Clone, Default)]
pub(crate) struct Supervision {
    /// Cancelled when a pipeline fails.
    pub failed: CancellationToken,
    /// How each pipeline ended, by name.
    pub ends: Arc<std::sync::Mutex<Vec<(String, pipeline::Ended)>>>,
}

/// What every pipeline is started with.
pub(crate) struct Start<'a> {
    pub telemetry: &'a Telemetry,
    /// Cancelled to stop every pipeline.
    pub shutdown: &'a CancellationToken,
    /// Every pipeline's supervisor; waited for when hopper stops.
    pub loops: &'a TaskTracker,
    pub supervision: &'a Supervision,
    /// How long a pipeline may take to drain.
    pub deadline: std::time::Duration,
}

/// A pipeline whose consumer and producer exist, but whose consumer has
/// subscribed to nothing: it joins no group, so it consumes and commits
/// nothing. Dropped, it goes with everything it holds (the producer's
/// retry task ends with the producer).
pub(crate) struct Built<P: Processor> {
    topics: Vec<String>,
    shared: Arc<pipeline::Shared<P>>,
    rebalances: tokio::sync::mpsc::UnboundedReceiver<pipeline::Rebalanced>,
}

/// Creates the consumer and producer of a pipeline that will read `topics`
/// in `group`.
pub(crate) fn build<P: Processor>(
    cluster: &Cluster,
    telemetry: &Telemetry,
    group: &str,
    topics: &[String],
    processor: P,
    veto: Option<Arc<dyn produce::Veto>>,
) -> Result<Built<P>, KafkaError> {
    let pipeline::Connected {
        consumer,
        rebalances,
        trackers,
    } = pipeline::connect(
        &cluster.consumer_config(group),
        processor.name(),
        cluster.watch().clone(),
    )
    .doing(|| "creating the consumer".into())?;
    let acks = TaskTracker::new();
    let halt = processor.halt().unwrap_or_default();
    let producer = produce::HopProducer::new(
        &cluster.producer_config(),
        cluster.hops_held().unwrap_or(kafka::HOPS_HELD),
        processor.name(),
        processor.dlq_topic(),
        telemetry.clone(),
        acks.clone(),
        halt.clone(),
    )
    .doing(|| "creating the producer".into())?;
    if let Some(veto) = veto {
        // A producer just made has no veto yet.
        producer
            .set_veto(veto)
            .expect("a new producer takes its veto");
    }
    Ok(Built {
        topics: topics.to_vec(),
        shared: Arc::new(pipeline::Shared {
            processor,
            producer,
            consumer,
            telemetry: telemetry.clone(),
            acks,
            halt,
            trackers,
        }),
        rebalances,
    })
}

impl<P: Processor> Built<P> {
    pub fn processor(&self) -> &P {
        &self.shared.processor
    }

    /// The topics it will subscribe to.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// Subscribes the consumer and spawns the loop, under a supervisor that
    /// notices when it ends: a pipeline that fails (or whose loop panics)
    /// stops the whole hopper, non-zero.
    pub fn start(self, start: &Start<'_>) -> Result<(), KafkaError> {
        let Built {
            topics,
            shared,
            rebalances,
        } = self;
        let subscription: Vec<&str> = topics.iter().map(String::as_str).collect();
        shared
            .consumer
            .subscribe(&subscription)
            .doing(|| "subscribing".into())?;
        let name = shared.processor.name().to_string();
        let assigned = Arc::downgrade(&shared.consumer);
        start.telemetry.health().set_assignment_probe(
            &name,
            Box::new(move || {
                assigned
                    .upgrade()
                    .and_then(|c| c.assignment().ok())
                    .map_or(0, |a| a.count())
            }),
        );
        // Metadata for the topics it will produce to, fetched off the async
        // start (it may block seconds per topic); a hop before it is done
        // fetches its own.
        let warming = shared.producer.clone();
        let hop_topics = shared.processor.hop_topics();
        tokio::task::spawn_blocking(move || warming.warm_up(&hop_topics));
        let health = start.telemetry.health().clone();
        let (shutdown, deadline) = (start.shutdown.clone(), start.deadline);
        let supervision = start.supervision.clone();
        start.loops.spawn(async move {
            let run = tokio::spawn(pipeline::run(
                shared,
                rebalances,
                shutdown.clone(),
                deadline,
            ));
            let ended = match run.await {
                Ok(ended) => ended,
                Err(e) if e.is_panic() => pipeline::Ended::Failed(format!(
                    "the consumer loop of `{name}` panicked; nothing past its last commit was committed"
                )),
                Err(_) => pipeline::Ended::Failed(format!(
                    "the consumer loop of `{name}` was cancelled"
                )),
            };
            if let pipeline::Ended::Failed(why) = &ended {
                health.stop(&name, why.clone());
                supervision.failed.cancel();
            } else if !shutdown.is_cancelled() {
                health.stop(&name, "its consumer loop ended");
                supervision.failed.cancel();
            }
            supervision.ends.lock().unwrap().push((name, ended));
        });
        Ok(())
    }
}
