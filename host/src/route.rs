//! A route's processing: read the envelope, call the handler, plan the next
//! hop from its verdict. The consumer loop around it is [`crate::pipeline`].

use crate::clock::now_ms;
use crate::config::Route;
use crate::dlq::{self, DeadLetter};
use crate::events::{Event, Telemetry};
use crate::headers::{self, Envelope, Hop, Incoming, Reason};
use crate::hold;
use crate::hop::{Action, Concurrency, OutRecord, PlannedHop, Processor};
use crate::metrics::RouteMetrics;
use crate::plugin::{Delivery, Emitted, Handler, HandlerSlot, Verdict};
use crate::retry::{Decision, decide};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders, OwnedMessage};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The processor of one route.
pub struct RouteProcessor {
    pub route: Arc<Route>,
    /// Retry tier topic → how long its messages wait.
    pub tiers: HashMap<String, Duration>,
    pub handler: Arc<HandlerSlot>,
    pub telemetry: Telemetry,
    /// This route's counters and call-duration histogram, held so no
    /// message looks one up.
    metrics: RouteMetrics,
    /// One permit per handler instance the route may have at once
    /// (`max_instances`): a call waits here, not in the consumer loop.
    instances: tokio::sync::Semaphore,
}

impl RouteProcessor {
    pub fn new(route: Arc<Route>, handler: Arc<HandlerSlot>, telemetry: Telemetry) -> Self {
        let tiers = route.tiers().into_iter().map(|(d, t)| (t, d)).collect();
        let metrics = telemetry.metrics().route(&route.name, &Verdict::LABELS);
        let instances = tokio::sync::Semaphore::new(route.max_instances);
        Self {
            route,
            tiers,
            handler,
            telemetry,
            metrics,
            instances,
        }
    }
}

impl Processor for RouteProcessor {
    fn name(&self) -> &str {
        &self.route.name
    }

    fn hop_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self.tiers.keys().cloned().collect();
        topics.push(self.route.dlq.clone());
        let grants = &self.route.grants;
        topics.extend(grants.emit_topics.iter().cloned());
        if let Some(relay) = grants
            .delay
            .as_ref()
            .filter(|_| !grants.emit_topics.is_empty())
        {
            topics.push(relay.inbox.clone());
        }
        topics
    }

    fn due_at(&self, message: &BorrowedMessage<'_>) -> Option<i64> {
        let wait = self.tiers.get(message.topic())?;
        Some(hold::due_at(message, *wait))
    }

    async fn process(&self, message: &OwnedMessage) -> Action {
        handle(self, message).await
    }

    fn dlq_topic(&self) -> &str {
        &self.route.dlq
    }

    fn concurrency(&self) -> Concurrency {
        self.route.concurrency
    }
}

/// Handles one message: reads its envelope, calls the handler, and plans
/// what to produce next: a retry or dead-letter record, or on `ok` the
/// records the handler emitted (the offset is done once all of them are
/// acknowledged), or nothing.
async fn handle(shared: &RouteProcessor, message: &OwnedMessage) -> Action {
    let route = &shared.route;
    if let Some(consumed) = &shared.metrics.consumed {
        consumed.inc();
    }
    let incoming = Incoming {
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        timestamp: message.timestamp().to_millis(),
        headers: message.headers(),
    };
    let from_tier = shared.tiers.contains_key(message.topic());
    let envelope = if from_tier {
        Envelope::from_tier(&incoming)
    } else {
        Envelope::from_input(&incoming)
    };
    let envelope = match envelope {
        Ok(envelope) => envelope,
        Err(problem) => {
            let mut envelope = Envelope {
                id: headers::default_id(incoming.topic, incoming.partition, incoming.offset),
                attempts_made: 0,
                origin: headers::Origin {
                    topic: incoming.topic.to_string(),
                    partition: incoming.partition,
                    offset: incoming.offset,
                    timestamp: incoming.timestamp,
                },
                first_failure_at: None,
                trail: Vec::new(),
                replays: headers::replay_count(message.headers()),
            };
            if let Ok(Some(id)) = headers::text(message.headers(), headers::ID) {
                envelope.id = headers::shorten(id, headers::MAX_ID_BYTES);
            }
            let decision = Decision::DeadLetter {
                reason: Reason::InvalidEnvelope,
                error: problem.to_string(),
            };
            return Action::Hop(plan(shared, message, &envelope, 0, None, decision));
        }
    };
    let attempt = envelope.attempts_made + 1;
    // Never closed, so acquiring only waits.
    let _instance = shared.instances.acquire().await.expect("never closed");
    let handler = shared.handler.current();
    let delivery = Delivery {
        id: envelope.id.clone(),
        topic: message.topic().to_string(),
        partition: message.partition(),
        offset: message.offset(),
        key: message.key().map(<[u8]>::to_vec),
        payload: message.payload().map(<[u8]>::to_vec),
        headers: message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default(),
        timestamp: incoming.timestamp,
        attempt,
        route: route.name.clone(),
    };
    let handled = match &shared.metrics.call_duration {
        Some(histogram) => {
            let started = std::time::Instant::now();
            let handled = handler.run(delivery).await;
            histogram.observe(started.elapsed());
            handled
        }
        None => handler.run(delivery).await,
    };
    let verdict = handled.verdict;
    let label = verdict.label();
    if let Some(counter) = shared.metrics.outcomes.get(label) {
        counter.inc();
    }
    tracing::debug!(
        route = route.name,
        id = envelope.id,
        version = crate::events::short(handler.version()),
        topic = message.topic(),
        partition = message.partition(),
        offset = message.offset(),
        attempt,
        verdict = label,
        "Message handled."
    );
    if shared.telemetry.has_observers() {
        shared.telemetry.publish(Event::Handled {
            route: route.name.clone(),
            id: envelope.id.clone(),
            topic: message.topic().to_string(),
            partition: message.partition(),
            offset: message.offset(),
            attempt,
            verdict: label,
            version: handler.version().to_string(),
            at_ms: now_ms(),
        });
    }
    if let Verdict::Failed { class, error } = &verdict {
        tracing::warn!(
            route = route.name,
            id = envelope.id,
            attempt,
            version = crate::events::short(handler.version()),
            class = class.as_str(),
            error,
            "Handler call failed."
        );
    }
    if handled.discarded > 0 {
        shared.telemetry.emit(Event::EmitsDiscarded {
            route: route.name.clone(),
            id: envelope.id.clone(),
            count: handled.discarded,
            verdict: label,
        });
    }
    let decision = decide(route, attempt, &verdict);
    if decision == Decision::Commit {
        if handled.emitted.is_empty() {
            return Action::Done;
        }
        let hops = handled.emitted.into_iter();
        return Action::Hops(hops.map(|e| emitted_hop(route, e)).collect());
    }
    Action::Hop(plan(
        shared,
        message,
        &envelope,
        attempt,
        Some(&handler),
        decision,
    ))
}

/// The record of one emitted record: its own headers, then `hopper-id` and
/// `hopper-route`; a delayed one goes to the delay relay's inbox with
/// `hopper-target` and `hopper-deliver-at` (docs/headers.md).
fn emitted_hop(route: &Route, emitted: Emitted) -> PlannedHop {
    let Emitted {
        id,
        topic,
        key,
        payload,
        headers: own,
        deliver_at,
    } = emitted;
    let mut out = Vec::with_capacity(own.len() + 4);
    out.extend(own);
    out.push((headers::ID.to_string(), id.clone().into_bytes()));
    out.push((headers::ROUTE.to_string(), route.name.clone().into_bytes()));
    let destination = match (deliver_at, &route.grants.delay) {
        (Some(at), Some(relay)) => {
            out.push((headers::TARGET.to_string(), topic.clone().into_bytes()));
            out.push((headers::DELIVER_AT.to_string(), at.to_string().into_bytes()));
            relay.inbox.clone()
        }
        // The emit import refuses a delay without a relay.
        _ => topic.clone(),
    };
    let mut owned = OwnedHeaders::new_with_capacity(out.len());
    for (key, value) in &out {
        owned = owned.insert(Header {
            key,
            value: Some(value),
        });
    }
    PlannedHop {
        record: OutRecord {
            topic: destination,
            key,
            payload,
            headers: owned,
            timestamp: now_ms(),
        },
        event: Some(Event::Emitted {
            route: route.name.clone(),
            id,
            topic,
            deliver_at,
        }),
    }
}

/// Builds the record of the next hop and the event that reports it.
fn plan(
    shared: &RouteProcessor,
    message: &OwnedMessage,
    envelope: &Envelope,
    attempt: u32,
    handler: Option<&Handler>,
    decision: Decision,
) -> PlannedHop {
    let route = &shared.route;
    let handler = handler.map(|h| (h.name(), h.version()));
    let (topic, delay, reason, error) = match decision {
        Decision::Commit => unreachable!("a committed message has no hop"),
        Decision::DeadLetter { reason, error } => {
            return dlq::plan(
                message,
                DeadLetter {
                    topic: &route.dlq,
                    route: &route.name,
                    envelope,
                    attempts_made: attempt,
                    reason,
                    error: &error,
                    handler,
                    keep: &[],
                },
            );
        }
        Decision::Retry {
            topic,
            delay,
            reason,
            error,
        } => (topic, delay, reason, error),
    };
    let now = now_ms();
    let trail_entry = Decision::retry_trail_entry(delay);
    let headers = headers::next_hop_headers(
        message.headers(),
        envelope,
        &Hop {
            route: &route.name,
            attempts_made: attempt,
            reason: Some(reason),
            error: Some(&error),
            failed_at: Some(now),
            handler,
            trail_entry: &trail_entry,
            due_at: Some(now + delay.as_millis() as i64),
            keep: &[],
        },
    );
    let mut record = OutRecord::like(message, topic.clone(), headers);
    record.timestamp = now;
    PlannedHop {
        record,
        event: Some(Event::RetryScheduled {
            route: route.name.clone(),
            id: envelope.id.clone(),
            attempt,
            topic,
            delay,
            reason,
            version: handler.map(|(_, version)| version.to_string()),
        }),
    }
}
