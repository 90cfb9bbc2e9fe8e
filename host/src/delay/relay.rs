//! The relay's processor: moves each message one tier closer to its time,
//! holds its last stretch in memory, and forwards it to its target.

use super::schedule::{Rejected, SCHEDULING, Schedule, Step, invalid, parse_schedule, step};
use crate::clock::now_ms;
use crate::config::DelayRelay;
use crate::dlq;
use crate::events::{Event, Telemetry};
use crate::headers;
use crate::hold;
use crate::hop::{Action, OutRecord, PlannedHop, Processor};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Topics known to exist, so each target is looked up once.
struct KnownTopics {
    metadata: Arc<BaseConsumer>,
    // std Mutex: no .await while it is held.
    known: Mutex<HashSet<String>>,
}

impl KnownTopics {
    async fn exists(&self, topic: &str) -> bool {
        if self.known.lock().unwrap().contains(topic) {
            return true;
        }
        let metadata = self.metadata.clone();
        let name = topic.to_string();
        let found = tokio::task::spawn_blocking(move || {
            metadata
                .fetch_metadata(Some(&name), Duration::from_secs(10))
                .map(|m| {
                    m.topics().iter().any(|t| {
                        t.name() == name && t.error().is_none() && !t.partitions().is_empty()
                    })
                })
                .unwrap_or(false)
        })
        .await
        .unwrap_or(false);
        if found {
            self.known.lock().unwrap().insert(topic.to_string());
        }
        found
    }
}

/// The relay's processor.
pub struct DelayProcessor {
    relay: Arc<DelayRelay>,
    waits: Vec<Duration>,
    tier_of: HashMap<String, Duration>,
    topic_of: HashMap<Duration, String>,
    topics: KnownTopics,
    telemetry: Telemetry,
}

impl DelayProcessor {
    pub fn new(
        relay: Arc<DelayRelay>,
        metadata: BaseConsumer,
        telemetry: Telemetry,
    ) -> DelayProcessor {
        DelayProcessor {
            waits: relay.tiers.iter().map(|(d, _)| *d).collect(),
            tier_of: relay.tiers.iter().map(|(d, t)| (t.clone(), *d)).collect(),
            topic_of: relay.tiers.iter().map(|(d, t)| (*d, t.clone())).collect(),
            topics: KnownTopics {
                metadata: Arc::new(metadata),
                known: Mutex::new(HashSet::new()),
            },
            relay,
            telemetry,
        }
    }

    /// Dead-letters a message that cannot be scheduled. The record keeps
    /// the scheduling headers as the producer sent them, so once the cause is
    /// fixed it can be produced to the inbox again.
    fn reject(&self, message: &OwnedMessage, id: String, rejected: Rejected) -> Action {
        let envelope = headers::Envelope {
            id,
            attempts_made: 0,
            origin: headers::Origin {
                topic: message.topic().to_string(),
                partition: message.partition(),
                offset: message.offset(),
                timestamp: message.timestamp().to_millis(),
            },
            first_failure_at: None,
            trail: Vec::new(),
            replays: headers::replay_count(message.headers()),
        };
        Action::Hop(dlq::plan(
            message,
            dlq::DeadLetter {
                topic: &self.relay.dlq,
                route: "delay",
                envelope: &envelope,
                attempts_made: 0,
                reason: rejected.reason,
                error: &rejected.error,
                handler: None,
                keep: &[headers::TARGET, headers::DELIVER_AT, headers::DELAY],
            },
        ))
    }
}

impl Processor for DelayProcessor {
    fn name(&self) -> &str {
        "delay"
    }

    fn hop_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self.topic_of.values().cloned().collect();
        topics.push(self.relay.dlq.clone());
        topics
    }

    fn dlq_topic(&self) -> &str {
        &self.relay.dlq
    }

    fn due_at(&self, message: &BorrowedMessage<'_>) -> Option<i64> {
        let wait = self.tier_of.get(message.topic())?;
        Some(hold::due_at(message, *wait))
    }

    async fn process(&self, message: &OwnedMessage) -> Action {
        let now = now_ms();
        let from_inbox = !self.tier_of.contains_key(message.topic());
        let default_id =
            headers::default_id(message.topic(), message.partition(), message.offset());
        let reference = message
            .timestamp()
            .to_millis()
            .filter(|_| from_inbox)
            .unwrap_or(now);
        let schedule = match parse_schedule(
            message.headers(),
            default_id.clone(),
            reference,
            now,
            self.relay.max_delay,
        ) {
            Ok(schedule) => schedule,
            Err(rejected) => {
                // Keep the producer's id when it is usable, so the DLQ record
                // can be matched to what was sent.
                let id = match headers::text(message.headers(), headers::ID) {
                    Ok(Some(id)) if !id.is_empty() && id.len() <= headers::MAX_ID_BYTES => {
                        id.to_string()
                    }
                    _ => default_id,
                };
                return self.reject(message, id, rejected);
            }
        };
        if from_inbox && !self.topics.exists(&schedule.target).await {
            let error = format!(
                "header {}: topic `{}` does not exist",
                headers::TARGET,
                schedule.target
            );
            return self.reject(message, schedule.id, invalid(error));
        }
        let now = now_ms();
        match step(schedule.deliver_at - now, &self.waits) {
            Step::Forward => Action::Hop(forward(message, &schedule)),
            Step::Schedule => Action::HopAt {
                at_ms: schedule.deliver_at,
                hop: forward(message, &schedule),
            },
            Step::Tier(wait) => {
                let add = [
                    (headers::ID, schedule.id.clone()),
                    (headers::TARGET, schedule.target.clone()),
                    (headers::DELIVER_AT, schedule.deliver_at.to_string()),
                    (headers::DUE_AT, (now + wait.as_millis() as i64).to_string()),
                ];
                let topic = self.topic_of[&wait].clone();
                let record = OutRecord::like(
                    message,
                    topic,
                    headers::rewrite(message.headers(), &SCHEDULING, &add),
                );
                self.telemetry.count_tier_hop(&record.topic);
                Action::Hop(PlannedHop {
                    record,
                    event: None,
                })
            }
        }
    }
}

/// The record delivered to the target: key, payload and every header as the
/// producer sent them, less the scheduling headers, plus `hopper-id`.
fn forward(message: &OwnedMessage, schedule: &Schedule) -> PlannedHop {
    let record = OutRecord::like(
        message,
        schedule.target.clone(),
        headers::rewrite(
            message.headers(),
            &SCHEDULING,
            &[(headers::ID, schedule.id.clone())],
        ),
    );
    PlannedHop {
        record,
        event: Some(Event::Delivered {
            id: schedule.id.clone(),
            target: schedule.target.clone(),
            deliver_at: schedule.deliver_at,
        }),
    }
}
