//! Gauges read at scrape time from [`Health`]: pending messages per topic,
//! time until each held tier partition's head is due, whether each pipeline
//! consumes, and which handler version serves each route.

use crate::clock::now_ms;
use crate::health::Health;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue};
use prometheus_client::metrics::MetricType;
use std::sync::Arc;

/// The scrape-time gauges of one hopper.
pub(super) struct Live(pub(super) Arc<Health>);

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Live")
    }
}

/// One gauge family: its name, help and samples.
fn gauge<V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Vec<(&'static str, String)>, V)],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        family.encode_family(labels)?.encode_gauge(value)?;
    }
    Ok(())
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let health = &self.0;
        let pending: Vec<_> = health
            .pending()
            .topics
            .into_iter()
            .map(|p| {
                let labels = vec![
                    ("pipeline", p.pipeline),
                    ("topic", p.topic),
                    ("kind", p.kind.to_string()),
                ];
                (labels, p.messages)
            })
            .collect();
        gauge(
            &mut encoder,
            "hopper_pending_messages",
            "Messages not yet committed by the pipeline's group, per topic (high watermark minus committed offset), sampled every few seconds.",
            &pending,
        )?;

        let now = now_ms();
        let held: Vec<_> = health
            .held()
            .into_iter()
            .map(|(pipeline, tp, due)| {
                let labels = vec![
                    ("pipeline", pipeline),
                    ("topic", tp.topic),
                    ("partition", tp.partition.to_string()),
                ];
                (labels, (due - now) as f64 / 1000.0)
            })
            .collect();
        gauge(
            &mut encoder,
            "hopper_hold_head_due_seconds",
            "Seconds until the head of a held tier partition is due (negative: due, about to resume).",
            &held,
        )?;

        let states: Vec<_> = health
            .states()
            .into_iter()
            .map(|(pipeline, state)| (vec![("pipeline", pipeline)], state.is_consuming() as i64))
            .collect();
        gauge(
            &mut encoder,
            "hopper_pipeline_consuming",
            "1 when the pipeline's consumer has partitions and is not stopped.",
            &states,
        )?;
        let standby: Vec<_> = health
            .states()
            .into_iter()
            .map(|(pipeline, state)| {
                let standby = state == crate::health::PipelineState::Standby;
                (vec![("pipeline", pipeline)], standby as i64)
            })
            .collect();
        gauge(
            &mut encoder,
            "hopper_pipeline_standby",
            "1 when the pipeline's consumer is in its group with no partition: a ready standby while other processes hold them.",
            &standby,
        )?;

        let breakers: Vec<_> = health
            .breakers()
            .into_iter()
            .map(|(route, state)| (vec![("route", route)], state.gauge()))
            .collect();
        gauge(
            &mut encoder,
            "hopper_breaker_state",
            "A route's circuit breaker: 0 closed, 1 open (retry tiers paused), 2 half-open (probing).",
            &breakers,
        )?;

        let parked = health.parked();
        let now_s = now as f64 / 1000.0;
        for (name, help, value) in [
            (
                "hopper_parked_keys",
                "Keys parked behind a message in a retry tier, or releasing (their waiting messages being handled), per route with retry_order = \"key\".",
                &(|s: &crate::parked::Summary| s.parked_keys as f64)
                    as &dyn Fn(&crate::parked::Summary) -> f64,
            ),
            (
                "hopper_blocked_keys",
                "Keys blocked behind a dead-lettered head until an operator releases them (on_key_dead_letter = \"dead-letter-key\").",
                &|s: &crate::parked::Summary| s.blocked_keys as f64,
            ),
            (
                "hopper_parked_messages",
                "Messages waiting in the park topic behind their key's head.",
                &|s: &crate::parked::Summary| s.messages as f64,
            ),
            (
                "hopper_parked_oldest_seconds",
                "Seconds since the oldest parked or blocked key was parked (0 when none is).",
                &|s: &crate::parked::Summary| {
                    s.oldest_since
                        .map_or(0.0, |since| (now_s - since as f64 / 1000.0).max(0.0))
                },
            ),
        ] {
            let samples: Vec<_> = parked
                .iter()
                .map(|(route, summary)| (vec![("route", route.clone())], value(summary)))
                .collect();
            gauge(&mut encoder, name, help, &samples)?;
        }

        let failures = health.connection().failures();
        let mut family = encoder.encode_descriptor(
            "hopper_kafka_auth_failures",
            "Authentication and TLS failures the Kafka clients reported since start (a wrong or rotated credential, a certificate not verified or expired).",
            None,
            MetricType::Counter,
        )?;
        family
            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&failures, None)?;

        let errors = health.undecodable_errors();
        let mut family = encoder.encode_descriptor(
            "hopper_undecodable_batches",
            "Times a consumer reported a batch it could not decode (corrupt, or a codec this build lacks).",
            None,
            MetricType::Counter,
        )?;
        family.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&errors, None)?;
        let stuck: Vec<_> = health
            .undecodables()
            .into_iter()
            .map(|u| {
                let labels = vec![
                    ("pipeline", u.pipeline),
                    ("topic", u.topic),
                    ("partition", u.partition.to_string()),
                ];
                (labels, 1i64)
            })
            .collect();
        gauge(
            &mut encoder,
            "hopper_partition_undecodable",
            "1 while a partition is stuck on a batch it cannot decode; `hopper skip` gets past it.",
            &stuck,
        )?;

        let handlers = health.handlers();
        let info: Vec<_> = handlers
            .iter()
            .map(|h| {
                let labels = vec![
                    ("route", h.route.clone()),
                    ("file", h.file.clone()),
                    ("version", h.version.clone()),
                ];
                (labels, 1i64)
            })
            .collect();
        gauge(
            &mut encoder,
            "hopper_handler_info",
            "The handler version (sha256 of the .wasm) serving each route.",
            &info,
        )?;
        let errors: Vec<_> = handlers
            .iter()
            .map(|h| {
                let labels = vec![("route", h.route.clone())];
                (labels, h.last_reload_error.is_some() as i64)
            })
            .collect();
        gauge(
            &mut encoder,
            "hopper_handler_reload_error",
            "1 while the handler file on disk could not be loaded and an older version serves.",
            &errors,
        )
    }
}
