//! The delay relay: any producer schedules a message for an exact time by
//! producing it to the inbox with plain-text headers.
//!
//! A message cascades down a ladder of tier topics. Each hop uses the
//! largest tier that still fits the remaining time (less a small margin), so
//! a delay is never rounded to a tier. When less than the smallest tier
//! remains, the in-memory [`crate::scheduler`] holds it until its exact
//! deliver-at. Tiers wait through the same hold-until-due mechanism as retry
//! tiers ([`crate::hold`]), and the Kafka offset is the durable record until
//! the message is forwarded, so a crash loses nothing.

use crate::config::DelayRelay;
use crate::events::{Event, Telemetry};
use crate::headers::{self, Reason};
use crate::pipeline::{Action, OutRecord, PlannedHop, Processor, now_ms};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message, OwnedMessage};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A hop aims to land this much before the message's time, so the last
/// stretch is always timed by the in-memory scheduler, not by a tier's
/// poll latency.
pub const HOP_MARGIN: Duration = Duration::from_millis(250);

/// Headers the relay owns; each hop replaces them, and the forward to the
/// target removes them.
const SCHEDULING: [&str; 4] = [
    headers::TARGET,
    headers::DELIVER_AT,
    headers::DELAY,
    headers::DUE_AT,
];

/// The next step for a message with `remaining` ms to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Due now (or overdue): forward to the target.
    Forward,
    /// Less than the smallest tier (plus margin) remains: hold in memory.
    Schedule,
    /// Wait in the tier with this wait.
    Tier(Duration),
}

/// Picks the largest tier that fits `remaining_ms` less [`HOP_MARGIN`].
/// `tiers` is sorted, shortest first.
pub fn step(remaining_ms: i64, tiers: &[Duration]) -> Step {
    if remaining_ms <= 0 {
        return Step::Forward;
    }
    let budget = remaining_ms - HOP_MARGIN.as_millis() as i64;
    match tiers.iter().rev().find(|t| t.as_millis() as i64 <= budget) {
        Some(tier) => Step::Tier(*tier),
        None => Step::Schedule,
    }
}

/// Where and when a delayed message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub id: String,
    pub target: String,
    pub deliver_at: i64,
}

/// Why a message cannot be scheduled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub reason: Reason,
    pub error: String,
}

fn invalid(error: impl Into<String>) -> Rejected {
    Rejected {
        reason: Reason::InvalidEnvelope,
        error: error.into(),
    }
}

/// Reads the schedule of a message. `reference_ms` is when a relative
/// `hopper-delay` counts from (the record's timestamp, or now).
pub fn parse_schedule<H: Headers>(
    headers: Option<&H>,
    default_id: String,
    reference_ms: i64,
    now_ms: i64,
    max_delay: Duration,
) -> Result<Schedule, Rejected> {
    let text = |name| headers::text(headers, name).map_err(|e| invalid(e.to_string()));
    let target = text(headers::TARGET)?
        .filter(|t| !t.is_empty())
        .ok_or_else(|| invalid(format!("header {} is missing", headers::TARGET)))?;
    if let Some(bad) = target
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(invalid(format!(
            "header {}: `{}` is not a valid topic name (it has `{bad}`)",
            headers::TARGET,
            headers::shorten(target, 64)
        )));
    }
    let deliver_at = match (text(headers::DELIVER_AT)?, text(headers::DELAY)?) {
        (Some(_), Some(_)) => {
            return Err(invalid(format!(
                "set either {} or {}, not both",
                headers::DELIVER_AT,
                headers::DELAY
            )));
        }
        (None, None) => {
            return Err(invalid(format!(
                "header {} or {} is missing",
                headers::DELIVER_AT,
                headers::DELAY
            )));
        }
        (Some(at), None) => parse_instant(at)
            .map_err(|e| invalid(format!("header {}: {e}", headers::DELIVER_AT)))?,
        (None, Some(delay)) => {
            let delay = humantime::parse_duration(delay).map_err(|e| {
                invalid(format!(
                    "header {}: `{}` is not a duration ({e})",
                    headers::DELAY,
                    headers::shorten(delay, 64)
                ))
            })?;
            reference_ms.saturating_add(delay.as_millis().min(i64::MAX as u128) as i64)
        }
    };
    if deliver_at.saturating_sub(now_ms) > max_delay.as_millis() as i64 {
        return Err(Rejected {
            reason: Reason::DelayTooLong,
            error: format!(
                "deliver-at {deliver_at} is {} away; the maximum delay is {}",
                humantime::format_duration(Duration::from_millis(
                    (deliver_at - now_ms) as u64 / 1000 * 1000
                )),
                humantime::format_duration(max_delay)
            ),
        });
    }
    let id = match text(headers::ID)? {
        Some(id) if !id.is_empty() && id.len() <= headers::MAX_ID_BYTES => id.to_string(),
        Some(id) => {
            return Err(invalid(format!(
                "header {}: must be 1 to {} bytes, not {}",
                headers::ID,
                headers::MAX_ID_BYTES,
                id.len()
            )));
        }
        None => default_id,
    };
    Ok(Schedule {
        id,
        target: target.to_string(),
        deliver_at,
    })
}

/// Epoch milliseconds, or an RFC 3339 time.
pub fn parse_instant(text: &str) -> Result<i64, String> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(text)
        .map(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0)
        })
        .map_err(|_| {
            format!(
                "`{}` is neither epoch milliseconds nor an RFC 3339 time",
                headers::shorten(text, 64)
            )
        })
}

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

    fn reject(&self, message: &OwnedMessage, id: String, rejected: Rejected) -> Action {
        let now = now_ms();
        let add = [
            (headers::ID, id.clone()),
            (headers::REASON, rejected.reason.as_str().to_string()),
            (
                headers::LAST_ERROR,
                headers::shorten(&rejected.error, headers::MAX_ERROR_BYTES),
            ),
            (headers::LAST_FAILURE_AT, now.to_string()),
            (headers::ORIGIN_TOPIC, message.topic().to_string()),
            (headers::ORIGIN_PARTITION, message.partition().to_string()),
            (headers::ORIGIN_OFFSET, message.offset().to_string()),
            (headers::TRAIL, "dlq".to_string()),
        ];
        let record = OutRecord::like(
            message,
            self.relay.dlq.clone(),
            headers::rewrite(message.headers(), &[headers::DUE_AT], &add),
        );
        Action::Hop(PlannedHop {
            record,
            event: Some(Event::DeadLettered {
                route: "delay".into(),
                id,
                attempt: 0,
                topic: self.relay.dlq.clone(),
                reason: rejected.reason,
                error: rejected.error,
            }),
        })
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

    fn due_at(&self, message: &BorrowedMessage<'_>) -> Option<i64> {
        let wait = self.tier_of.get(message.topic())?;
        Some(crate::pipeline::due_at(message, *wait))
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

/// A message to deliver later: the library side of `hopper send`. Any Kafka
/// client can do the same by producing to the inbox with these headers.
#[derive(Debug, Clone, Default)]
pub struct DelayedMessage {
    pub target: String,
    /// When to deliver, epoch ms. Wins over `delay`.
    pub deliver_at: Option<i64>,
    /// How long to wait, counted from the record's timestamp.
    pub delay: Option<Duration>,
    pub id: Option<String>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// Extra headers, delivered to the target unchanged.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl DelayedMessage {
    /// Produces the message to `inbox` and waits for the acknowledgement.
    /// Returns the inbox partition and offset.
    pub async fn send(
        &self,
        producer: &rdkafka::producer::FutureProducer,
        inbox: &str,
    ) -> anyhow::Result<(i32, i64)> {
        use rdkafka::message::{Header, OwnedHeaders};
        let mut owned = OwnedHeaders::new();
        for (key, value) in &self.headers {
            owned = owned.insert(Header {
                key,
                value: Some(value),
            });
        }
        let put = |owned: OwnedHeaders, key: &str, value: String| {
            owned.insert(Header {
                key,
                value: Some(value.as_bytes()),
            })
        };
        owned = put(owned, headers::TARGET, self.target.clone());
        owned = match (self.deliver_at, self.delay) {
            (Some(at), _) => put(owned, headers::DELIVER_AT, at.to_string()),
            (None, Some(delay)) => put(owned, headers::DELAY, format!("{}ms", delay.as_millis())),
            (None, None) => put(owned, headers::DELIVER_AT, now_ms().to_string()),
        };
        if let Some(id) = &self.id {
            owned = put(owned, headers::ID, id.clone());
        }
        let mut record = rdkafka::producer::FutureRecord::<[u8], [u8]>::to(inbox).headers(owned);
        if let Some(key) = &self.key {
            record = record.key(key.as_slice());
        }
        if let Some(payload) = &self.payload {
            record = record.payload(payload.as_slice());
        }
        let delivery = producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("cannot produce to {inbox}: {e}"))?;
        Ok((delivery.partition, delivery.offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, OwnedHeaders};

    const TIERS: [Duration; 3] = [
        Duration::from_secs(1),
        Duration::from_secs(5),
        Duration::from_secs(30),
    ];

    #[test]
    fn picks_the_largest_tier_that_fits_with_margin() {
        assert_eq!(step(0, &TIERS), Step::Forward);
        assert_eq!(step(-5, &TIERS), Step::Forward);
        assert_eq!(step(1, &TIERS), Step::Schedule);
        assert_eq!(step(1_249, &TIERS), Step::Schedule);
        assert_eq!(step(1_250, &TIERS), Step::Tier(Duration::from_secs(1)));
        assert_eq!(step(5_249, &TIERS), Step::Tier(Duration::from_secs(1)));
        assert_eq!(step(5_250, &TIERS), Step::Tier(Duration::from_secs(5)));
        assert_eq!(
            step(86_400_000, &TIERS),
            Step::Tier(Duration::from_secs(30))
        );
    }

    /// Walks a delay down the ladder on tokio's paused clock, hop by hop,
    /// and checks it lands exactly at its time, never early, through the
    /// tiers the ladder implies.
    #[tokio::test(start_paused = true)]
    async fn the_cascade_lands_exactly_on_time() {
        let cases: [(i64, &[&str]); 9] = [
            (0, &[]),
            (40, &["memory"]),
            (999, &["memory"]),
            (1_000, &["memory"]),
            (1_234, &["memory"]),
            (1_300, &["1s", "memory"]),
            (7_777, &["5s", "1s", "1s", "memory"]),
            (36_500, &["30s", "5s", "1s", "memory"]),
            (
                123_456,
                &["30s", "30s", "30s", "30s", "1s", "1s", "1s", "memory"],
            ),
        ];
        for (deliver_at, expected) in cases {
            let start = tokio::time::Instant::now();
            let clock = || start.elapsed().as_millis() as i64;
            let mut hops = Vec::new();
            loop {
                match step(deliver_at - clock(), &TIERS) {
                    Step::Forward => break,
                    Step::Schedule => {
                        let at = start + Duration::from_millis(deliver_at as u64);
                        tokio::time::sleep_until(at).await;
                        hops.push("memory".to_string());
                    }
                    Step::Tier(wait) => {
                        // A tier hop: the tier's wait, plus a few ms of poll
                        // and produce latency.
                        tokio::time::advance(wait + Duration::from_millis(7)).await;
                        assert!(clock() < deliver_at, "a tier overshot {deliver_at}");
                        hops.push(format!("{}s", wait.as_secs()));
                    }
                }
                assert!(
                    hops.len() < 50,
                    "runaway cascade for {deliver_at}: {hops:?}"
                );
            }
            assert_eq!(clock(), deliver_at, "delay {deliver_at}ms via {hops:?}");
            assert_eq!(hops, expected, "delay {deliver_at}ms");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> OwnedHeaders {
        let mut h = OwnedHeaders::new();
        for (k, v) in pairs {
            h = h.insert(Header {
                key: k,
                value: Some(*v),
            });
        }
        h
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<Schedule, Rejected> {
        let h = headers(pairs);
        parse_schedule(
            Some(&h),
            "in-0-7".into(),
            1_000,
            2_000,
            Duration::from_secs(3600),
        )
    }

    #[test]
    fn schedules_from_deliver_at_or_delay() {
        let s = parse(&[("hopper-target", "orders"), ("hopper-deliver-at", "5000")]).unwrap();
        assert_eq!(
            s,
            Schedule {
                id: "in-0-7".into(),
                target: "orders".into(),
                deliver_at: 5_000
            }
        );
        let s = parse(&[
            ("hopper-target", "orders"),
            ("hopper-delay", "90s"),
            ("hopper-id", "x"),
        ])
        .unwrap();
        assert_eq!(
            (s.deliver_at, s.id.as_str()),
            (91_000, "x"),
            "relative to the record time"
        );
        let s = parse(&[
            ("hopper-target", "t"),
            ("hopper-deliver-at", "1970-01-01T00:00:03Z"),
        ])
        .unwrap();
        assert_eq!(s.deliver_at, 3_000);
    }

    #[test]
    fn bad_schedules_name_the_problem() {
        let cases: [(&[(&str, &str)], &str); 6] = [
            (
                &[("hopper-deliver-at", "5000")],
                "header hopper-target is missing",
            ),
            (
                &[("hopper-target", "a b"), ("hopper-delay", "1s")],
                "is not a valid topic name",
            ),
            (
                &[("hopper-target", "t")],
                "header hopper-deliver-at or hopper-delay is missing",
            ),
            (
                &[("hopper-target", "t"), ("hopper-delay", "soon")],
                "header hopper-delay: `soon` is not a duration",
            ),
            (
                &[("hopper-target", "t"), ("hopper-deliver-at", "tomorrow")],
                "neither epoch milliseconds nor an RFC 3339 time",
            ),
            (
                &[
                    ("hopper-target", "t"),
                    ("hopper-delay", "1s"),
                    ("hopper-deliver-at", "1"),
                ],
                "not both",
            ),
        ];
        for (pairs, expected) in cases {
            let err = parse(pairs).unwrap_err();
            assert_eq!(err.reason, Reason::InvalidEnvelope);
            assert!(err.error.contains(expected), "{pairs:?}: {}", err.error);
        }
        let err = parse(&[("hopper-target", "t"), ("hopper-delay", "2h")]).unwrap_err();
        assert_eq!(err.reason, Reason::DelayTooLong);
        assert!(
            err.error.contains("the maximum delay is 1h"),
            "{}",
            err.error
        );
    }
}
