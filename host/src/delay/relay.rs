//! The relay's processor: moves each message one tier closer to its time,
//! holds its last stretch in memory, and forwards it to its target.

use super::cancel::{Intent, cancelled_id, entry_headers, entry_key, entry_value, parse_intent};
use super::schedule::{Rejected, SCHEDULING, Schedule, Step, invalid, parse_schedule, step};
use super::table::CancelTable;
use crate::clock::now_ms;
use crate::config::{DelayRelay, RELAY_ROUTE};
use crate::dlq;
use crate::events::{self, Telemetry};
use crate::headers;
use crate::hold;
use crate::hop::{self, Action, OutRecord, Outcome, PlannedHop, Processor};
use crate::renewable::AwaitedProducer;
use crate::traceparent;
use crate::types::{CancelKind, InboxPosition};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use rdkafka::producer::FutureRecord;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a target found to exist is trusted before it is looked up
/// again. Short, so that a target deleted while hopper runs is noticed
/// before the relay forwards to it for long (a produce to a deleted topic
/// does not succeed); one lookup per target per second costs nothing.
pub const TARGET_TRUSTED_FOR: Duration = Duration::from_secs(1);
/// How long one metadata lookup may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// The first and the longest wait between lookups that got no clear answer.
const LOOKUP_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// What a metadata lookup says about a target topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// It exists and has partitions: forward to it.
    Exists,
    /// The cluster says it is not there, or not ours to use: dead-letter.
    Missing(String),
    /// The cluster did not answer (the request failed or timed out): ask
    /// again, for as long as it takes. A cluster that cannot answer a
    /// metadata request could take neither the forward nor a dead letter.
    NoAnswer(String),
    /// The cluster answered with an error for this topic that may clear by
    /// itself (no leader during an election, no partitions yet, any other
    /// code): ask again, for `[delay] target_lookup_timeout` at most.
    Unsettled(String),
}

impl Lookup {
    /// Reads the cluster's answer for one topic: the request's failure, or
    /// the topic's error code and partition count as the metadata response
    /// had them (`None`: the topic was not in the response). A partition
    /// without a leader is the producer's to wait for, not a missing topic.
    pub fn of(
        topic: &str,
        answer: Result<Option<(Option<RDKafkaErrorCode>, usize)>, String>,
    ) -> Lookup {
        let (error, partitions) = match answer {
            Err(failure) => {
                return Lookup::NoAnswer(format!("metadata request failed: {failure}"));
            }
            Ok(None) => {
                return Lookup::Missing(format!(
                    "topic `{topic}` is not in the cluster's metadata"
                ));
            }
            Ok(Some(answer)) => answer,
        };
        match error {
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => {
                Lookup::Missing(format!("topic `{topic}` does not exist"))
            }
            Some(
                code
                @ (RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::InvalidTopic),
            ) => Lookup::Missing(format!("topic `{topic}` cannot be used: {code}")),
            Some(code) => Lookup::Unsettled(code.to_string()),
            None if partitions == 0 => Lookup::Unsettled("the topic has no partitions".into()),
            None => Lookup::Exists,
        }
    }
}

/// Asks `lookup` about `topic` until the cluster gives a clear answer: `Ok`
/// when the topic exists, the rejection of the message when it does not,
/// or when the cluster has answered with an error for the topic for
/// `patience`. Between lookups it waits with backoff.
///
/// Only time under errors for the topic is counted against `patience`:
/// the time between two answers counts unless neither of them was an
/// answer, that is from the first error for the topic on, less every
/// stretch between two lookups that both got no answer. Errors that
/// alternate with no answer are so bounded as errors alone are, and a
/// cluster that does not answer at all is waited out, for as long as it
/// takes: its relay is stalled anyway, and could not dead-letter either.
/// The wait after an error never runs past what is left of `patience`, so
/// the last lookup is made as it runs out.
async fn settle<F>(
    topic: &str,
    patience: Duration,
    telemetry: &Telemetry,
    mut lookup: impl FnMut() -> F,
) -> Result<(), Rejected>
where
    F: std::future::Future<Output = Lookup>,
{
    let mut backoff = LOOKUP_BACKOFF.0;
    let mut counted = Duration::ZERO;
    let mut unsettled = 0u32;
    let mut last_answer = tokio::time::Instant::now();
    // Whether the previous lookup was answered with an error for the topic.
    let mut answered = false;
    loop {
        let answer = lookup().await;
        let now = tokio::time::Instant::now();
        let since_last = now - last_answer;
        last_answer = now;
        let (error, gives_up_in) = match answer {
            Lookup::Exists => return Ok(()),
            Lookup::Missing(why) => {
                return Err(invalid(format!("header {}: {why}", headers::TARGET)));
            }
            Lookup::NoAnswer(why) => {
                if std::mem::take(&mut answered) {
                    counted += since_last;
                }
                (why, None)
            }
            Lookup::Unsettled(why) => {
                counted += since_last;
                answered = true;
                unsettled += 1;
                if counted >= patience {
                    telemetry.emit(events::TargetLookupAbandoned {
                        target: topic.to_string(),
                        error: why.clone(),
                        asked_for: counted,
                        lookups: unsettled,
                    });
                    return Err(Rejected {
                        reason: headers::Reason::HopFailed,
                        error: format!(
                            "header {}: topic `{topic}` could not be used: the cluster answered {unsettled} lookups over {} with an error for it ([delay] target_lookup_timeout = {}), the last: {why}",
                            headers::TARGET,
                            humantime::format_duration(whole_ms(counted)),
                            humantime::format_duration(patience),
                        ),
                    });
                }
                (why, Some(patience - counted))
            }
        };
        let wait = gives_up_in.map_or(backoff, |left| backoff.min(left));
        telemetry.emit(events::TargetLookupFailed {
            target: topic.to_string(),
            error,
            retry_in: wait,
            gives_up_in,
        });
        tokio::time::sleep(wait).await;
        backoff = (backoff * 2).min(LOOKUP_BACKOFF.1);
    }
}

/// `d` without its part below a millisecond, for a message.
fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// Target topics and when each was last found to exist.
struct KnownTopics {
    metadata: Arc<BaseConsumer<crate::kafka::WatchedContext>>,
    // std Mutex: no .await while it is held.
    known: Mutex<HashMap<String, Instant>>,
    /// `[delay] target_lookup_timeout`.
    patience: Duration,
    telemetry: Telemetry,
}

impl KnownTopics {
    /// Whether `topic` exists, or why the message cannot go to it. A lookup
    /// that gets no clear answer is made again with backoff ([`settle`]): a
    /// valid message is never dead-lettered because the cluster could not
    /// answer, and only an error for the topic that lasts
    /// `target_lookup_timeout` dead-letters it, as `HOP_FAILED`.
    async fn check(&self, topic: &str) -> Result<(), Rejected> {
        if let Some(at) = self.known.lock().unwrap().get(topic)
            && at.elapsed() < TARGET_TRUSTED_FOR
        {
            return Ok(());
        }
        let settled = settle(topic, self.patience, &self.telemetry, || self.lookup(topic)).await;
        let mut known = self.known.lock().unwrap();
        match settled {
            Ok(()) => known.insert(topic.to_string(), Instant::now()),
            Err(_) => known.remove(topic),
        };
        settled
    }

    async fn lookup(&self, topic: &str) -> Lookup {
        let metadata = self.metadata.clone();
        let name = topic.to_string();
        let answer = tokio::task::spawn_blocking(move || {
            let m = metadata
                .fetch_metadata(Some(&name), LOOKUP_TIMEOUT)
                .map_err(|e| e.to_string())?;
            Ok(m.topics()
                .iter()
                .find(|t| t.name() == name)
                .map(|t| (t.error().map(RDKafkaErrorCode::from), t.partitions().len())))
        })
        .await
        .unwrap_or_else(|e| Err(format!("lookup task failed: {e}")));
        Lookup::of(topic, answer)
    }
}

/// The relay's processor.
pub struct DelayProcessor {
    relay: Arc<DelayRelay>,
    waits: Vec<Duration>,
    tier_of: HashMap<String, Duration>,
    topic_of: HashMap<Duration, String>,
    topics: KnownTopics,
    /// The cancellations of the whole relay group.
    table: Arc<CancelTable>,
    /// Writes the entry of a replace whose new time is too close for a
    /// tier, before the replace waits in memory (see `process`).
    entries: Arc<AwaitedProducer>,
    telemetry: Telemetry,
}

impl DelayProcessor {
    /// `table` must be loaded ([`CancelTable::load`]) before the relay
    /// forwards anything.
    pub fn new(
        relay: Arc<DelayRelay>,
        metadata: BaseConsumer<crate::kafka::WatchedContext>,
        telemetry: Telemetry,
        table: Arc<CancelTable>,
        entries: Arc<AwaitedProducer>,
    ) -> DelayProcessor {
        DelayProcessor {
            table,
            entries,
            telemetry: telemetry.clone(),
            waits: relay.tiers.iter().map(|(d, _)| *d).collect(),
            tier_of: relay.tiers.iter().map(|(d, t)| (t.clone(), *d)).collect(),
            topic_of: relay.tiers.iter().map(|(d, t)| (*d, t.clone())).collect(),
            topics: KnownTopics {
                metadata: Arc::new(metadata),
                known: Mutex::new(HashMap::new()),
                patience: relay.target_lookup_timeout,
                telemetry,
            },
            relay,
        }
    }

    /// Dead-letters a message that cannot be scheduled. The record keeps
    /// the scheduling headers as the producer sent them, so once the cause is
    /// fixed it can be produced to the inbox again. Its id follows
    /// [`headers::Envelope::fallback`], as a route's does.
    fn reject(
        &self,
        message: &OwnedMessage,
        trace: &traceparent::Context,
        rejected: Rejected,
    ) -> Action {
        let mut envelope = headers::Envelope::fallback(&headers::Incoming {
            topic: message.topic(),
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp().to_millis(),
            headers: message.headers(),
        });
        // The hop's own trace, sampled or not as decided for it.
        envelope.trace = *trace;
        Action::Hop(dlq::plan(
            message,
            dlq::Plan {
                topic: &self.relay.dlq,
                route: RELAY_ROUTE,
                envelope: &envelope,
                attempts_made: 0,
                reason: rejected.reason,
                error: &rejected.error,
                handler: None,
                keep: &[
                    headers::TARGET,
                    headers::DELIVER_AT,
                    headers::DELAY,
                    headers::CANCEL,
                    headers::REPLACE,
                ],
            },
        ))
    }

    /// The entry a cancel or replace read at `at` writes to the
    /// cancellation topic: key `<partition>:<id>`, value the position, in
    /// the trace of the record that asked for it.
    fn entry(
        &self,
        id: &str,
        kind: CancelKind,
        at: InboxPosition,
        trace: &traceparent::Context,
    ) -> PlannedHop {
        PlannedHop {
            record: OutRecord {
                topic: self.relay.cancels.clone(),
                key: Some(entry_key(at.partition, id)),
                payload: Some(entry_value(at)),
                headers: entry_headers(kind, self.table.me(), trace),
                timestamp: now_ms(),
            },
            outcome: Outcome::CancelEntry(hop::CancelEntry {
                id: id.to_string(),
                kind,
                inbox: at,
            }),
        }
    }

    /// Dead-letters a cancel or replace of an id the cancellation table
    /// has no room for: nothing of it is applied, and the record is kept
    /// whole for a replay once entries have expired.
    fn refuse(
        &self,
        message: &OwnedMessage,
        id: &str,
        kind: CancelKind,
        at: InboxPosition,
        entries: usize,
        trace: &traceparent::Context,
    ) -> Action {
        let max = self.table.max();
        self.telemetry.emit(events::CancelRefused {
            id: id.to_string(),
            kind,
            inbox: at,
            entries,
            max,
        });
        self.reject(
            message,
            trace,
            Rejected {
                reason: headers::Reason::CancelTableFull,
                error: format!(
                    "the cancellation table holds {entries} entries, its bound ([delay] max_cancellations = {max}): a {kind} of an id it does not hold is refused until entries expire",
                    kind = kind.as_str()
                ),
            },
        )
    }

    /// Writes a replace's entry and waits for the acknowledgement: for a
    /// replace that waits in memory next, which no hop can follow.
    async fn write_entry(
        &self,
        id: &str,
        at: InboxPosition,
        trace: &traceparent::Context,
    ) -> Result<(), String> {
        let hop = self.entry(id, CancelKind::Replace, at, trace);
        let record = FutureRecord::<[u8], [u8]>::to(&hop.record.topic)
            .key(hop.record.key.as_deref().unwrap_or_default())
            .payload(hop.record.payload.as_deref().unwrap_or_default())
            .headers(hop.record.headers)
            .timestamp(hop.record.timestamp);
        self.entries
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|e| format!("writing to `{}`: {e}", self.relay.cancels))?;
        self.telemetry.emit(hop.outcome);
        Ok(())
    }
}

impl Processor for DelayProcessor {
    type Job = std::convert::Infallible;

    fn name(&self) -> &str {
        RELAY_ROUTE
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
        let mut trace = traceparent::Context::continue_from(message.headers());
        self.telemetry.tracer().decide(&mut trace);
        let action = self.relay(message, &trace).await;
        crate::spans::relay_hop(self.telemetry.tracer(), &trace, message, &action);
        action
    }
}

impl DelayProcessor {
    /// Plans the next hop of `message`, in `trace`.
    async fn relay(&self, message: &OwnedMessage, trace: &traceparent::Context) -> Action {
        let now = now_ms();
        let from_inbox = !self.tier_of.contains_key(message.topic());
        // Where the inbox read the schedule: this record, or the stamp its
        // first hop put on it.
        let inbox = if from_inbox {
            Some(InboxPosition {
                partition: message.partition(),
                offset: message.offset(),
            })
        } else {
            headers::text(message.headers(), headers::INBOX_POSITION)
                .ok()
                .flatten()
                .and_then(InboxPosition::parse)
        };
        let intent = match from_inbox {
            true => match parse_intent(message.headers()) {
                Ok(intent) => intent,
                Err(rejected) => return self.reject(message, trace, rejected),
            },
            false => Intent::Schedule { replace: false },
        };
        let replace = match (intent, inbox) {
            (Intent::Cancel, Some(at)) => {
                let kind = CancelKind::Cancel;
                return match cancelled_id(message.headers(), message.key(), kind) {
                    Ok(id) => match self.table.admits(at.partition, &id) {
                        Ok(()) => Action::Hop(self.entry(&id, kind, at, trace)),
                        Err(entries) => self.refuse(message, &id, kind, at, entries, trace),
                    },
                    Err(rejected) => self.reject(message, trace, rejected),
                };
            }
            (Intent::Schedule { replace: true }, Some(at)) => {
                let kind = CancelKind::Replace;
                match cancelled_id(message.headers(), message.key(), kind) {
                    Ok(id) => match self.table.admits(at.partition, &id) {
                        Ok(()) => Some(at),
                        Err(entries) => return self.refuse(message, &id, kind, at, entries, trace),
                    },
                    Err(rejected) => return self.reject(message, trace, rejected),
                }
            }
            _ => None,
        };
        let default_id =
            headers::default_id(message.topic(), message.partition(), message.offset());
        let reference = message
            .timestamp()
            .to_millis()
            .filter(|_| from_inbox)
            .unwrap_or(now);
        let schedule = match parse_schedule(
            message.headers(),
            default_id,
            reference,
            now,
            self.relay.max_delay,
        ) {
            Ok(schedule) => schedule,
            Err(rejected) => return self.reject(message, trace, rejected),
        };
        // A tier record a cancel read since covers, or an inbox record read
        // again after a restart: dropped here, before any further hop. Only
        // a schedule keyed by its id can be cancelled.
        if let Some(at) = inbox
            && message.key() == Some(schedule.id.as_bytes())
            && let Some(kind) = self.table.covering(&schedule.id, at)
        {
            self.telemetry.emit(events::ScheduleCancelled {
                id: schedule.id.clone(),
                target: schedule.target.clone(),
                deliver_at: schedule.deliver_at,
                kind,
                inbox: at,
            });
            return Action::Done;
        }
        // hopper's own topics, and those outside `[delay] targets`, are
        // refused on every pass: a rule may have changed since the inbox.
        if let Err(why) = self.relay.check_target(&schedule.target) {
            return self.reject(
                message,
                trace,
                Rejected {
                    reason: headers::Reason::InvalidTarget,
                    error: format!("header {}: {why}", headers::TARGET),
                },
            );
        }
        // The target is checked when a message arrives, so a typo is
        // dead-lettered at once rather than after its delay, and again
        // before it is forwarded, in case the topic was deleted meanwhile.
        let mut now = now_ms();
        let mut next = step(schedule.deliver_at.saturating_sub(now), &self.waits);
        if from_inbox || !matches!(next, Step::Tier(_)) {
            if let Err(rejected) = self.topics.check(&schedule.target).await {
                return self.reject(message, trace, rejected);
            }
            // The lookup may have waited for an answer: time has moved on.
            now = now_ms();
            next = step(schedule.deliver_at.saturating_sub(now), &self.waits);
        }
        let planned = match next {
            Step::Forward => forward(message, &schedule, inbox, trace),
            Step::Schedule => {
                // A replace's entry must be written before its offset can be
                // committed; a message waiting in memory has no hop to wait
                // for it, so it is written here first.
                if let Some(at) = replace
                    && let Err(why) = self.write_entry(&schedule.id, at, trace).await
                {
                    return self.reject(
                        message,
                        trace,
                        Rejected {
                            reason: headers::Reason::HopFailed,
                            error: why,
                        },
                    );
                }
                return Action::HopAt {
                    at_ms: schedule.deliver_at,
                    hop: forward(message, &schedule, inbox, trace),
                };
            }
            Step::Tier(wait) => {
                let mut add = vec![
                    (headers::ID, schedule.id.clone()),
                    (headers::TARGET, schedule.target.clone()),
                    (headers::DELIVER_AT, schedule.deliver_at.to_string()),
                    (
                        headers::DUE_AT,
                        now.saturating_add(wait.as_millis() as i64).to_string(),
                    ),
                ];
                if let Some(at) = inbox {
                    add.push((headers::INBOX_POSITION, at.to_string()));
                }
                let topic = self.topic_of[&wait].clone();
                let record = OutRecord::like(
                    message,
                    topic,
                    headers::rewrite(message.headers(), &SCHEDULING, &add, trace),
                );
                let outcome = Outcome::TierHop(hop::TierHop {
                    id: schedule.id.clone(),
                    tier: record.topic.clone(),
                });
                PlannedHop { record, outcome }
            }
        };
        match replace {
            Some(at) => Action::Hops(vec![
                self.entry(&schedule.id, CancelKind::Replace, at, trace),
                planned,
            ]),
            None => Action::Hop(planned),
        }
    }
}

/// The record delivered to the target: key, payload and every header as the
/// producer sent them, less the scheduling headers, plus `hopper-id`.
fn forward(
    message: &OwnedMessage,
    schedule: &Schedule,
    inbox: Option<InboxPosition>,
    trace: &traceparent::Context,
) -> PlannedHop {
    let record = OutRecord::like(
        message,
        schedule.target.clone(),
        headers::rewrite(
            message.headers(),
            &SCHEDULING,
            &[(headers::ID, schedule.id.clone())],
            trace,
        ),
    );
    PlannedHop {
        record,
        outcome: Outcome::Forward(hop::Forward {
            id: schedule.id.clone(),
            target: schedule.target.clone(),
            deliver_at: schedule.deliver_at,
            inbox,
            trace: Some(*trace),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Event;
    use std::collections::VecDeque;

    const PATIENCE: Duration = Duration::from_secs(120);

    #[test]
    fn a_lookup_tells_a_missing_topic_from_no_answer_and_from_an_error_for_the_topic() {
        let of = |answer| Lookup::of("orders", answer);
        assert_eq!(of(Ok(Some((None, 3)))), Lookup::Exists);
        assert_eq!(
            of(Ok(Some((
                Some(RDKafkaErrorCode::UnknownTopicOrPartition),
                0
            )))),
            Lookup::Missing("topic `orders` does not exist".into())
        );
        assert!(matches!(
            of(Ok(Some((Some(RDKafkaErrorCode::TopicAuthorizationFailed), 0)))),
            Lookup::Missing(why) if why.contains("cannot be used")
        ));
        assert!(matches!(of(Ok(None)), Lookup::Missing(_)));
        assert!(matches!(
            of(Err(
                "Meta data fetch error: OperationTimedOut (Local: Timed out)".to_string()
            )),
            Lookup::NoAnswer(_)
        ));
        for unsettled in [
            Ok(Some((Some(RDKafkaErrorCode::LeaderNotAvailable), 3))),
            Ok(Some((Some(RDKafkaErrorCode::BrokerNotAvailable), 0))),
            Ok(Some((None, 0))),
        ] {
            assert!(
                matches!(of(unsettled.clone()), Lookup::Unsettled(_)),
                "{unsettled:?}"
            );
        }
    }

    fn leaderless() -> Lookup {
        Lookup::of(
            "orders",
            Ok(Some((Some(RDKafkaErrorCode::LeaderNotAvailable), 1))),
        )
    }

    fn no_answer() -> Lookup {
        Lookup::NoAnswer("metadata request failed: Local: Timed out".into())
    }

    /// Runs [`settle`] on scripted answers, the last repeated for ever, each
    /// lookup taking `takes`. Bounded by ten times the patience, so that a
    /// relay that never gives up fails the test instead of hanging it.
    /// Returns the outcome, the time it took, how many lookups were made,
    /// and the events emitted.
    async fn settle_on(
        script: Vec<(Lookup, Duration)>,
    ) -> (Result<(), Rejected>, Duration, usize, Vec<Event>) {
        let telemetry = Telemetry::new();
        let mut events = telemetry.subscribe();
        let script = Mutex::new(VecDeque::from(script));
        let made = Mutex::new(0usize);
        let started = tokio::time::Instant::now();
        let settled = tokio::time::timeout(
            PATIENCE * 10,
            settle("orders", PATIENCE, &telemetry, || async {
                *made.lock().unwrap() += 1;
                let (answer, takes) = {
                    let mut script = script.lock().unwrap();
                    match script.len() {
                        1 => script[0].clone(),
                        _ => script.pop_front().unwrap(),
                    }
                };
                tokio::time::sleep(takes).await;
                answer
            }),
        )
        .await
        .expect("the lookups came to an end within ten times target_lookup_timeout");
        let mut seen = Vec::new();
        while let Ok(event) = events.try_recv() {
            seen.push(event);
        }
        let made = *made.lock().unwrap();
        (settled, started.elapsed(), made, seen)
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_for_the_topic_is_asked_about_for_target_lookup_timeout_then_hop_failed() {
        let (settled, took, made, events) =
            settle_on(vec![(leaderless(), Duration::from_millis(3))]).await;
        let rejected = settled.expect_err("the relay gave up");
        assert_eq!(rejected.reason, headers::Reason::HopFailed);
        assert!(
            rejected.error.starts_with("header hopper-target: topic `orders` could not be used: the cluster answered ")
                && rejected.error.ends_with(
                    "with an error for it ([delay] target_lookup_timeout = 2m), the last: LeaderNotAvailable (Broker: Leader not available)"
                ),
            "{}",
            rejected.error
        );
        // Its last wait was cut to what was left, so it gave up as the
        // timeout ran out, give or take the last lookup.
        assert!(
            took >= PATIENCE && took <= PATIENCE + Duration::from_millis(3),
            "{took:?}"
        );
        assert!(
            rejected
                .error
                .contains(&format!("answered {made} lookups over 2m ")),
            "{made}: {}",
            rejected.error
        );
        let failed: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::TargetLookupFailed(failed) => Some(failed),
                _ => None,
            })
            .collect();
        assert_eq!(
            failed.len(),
            made - 1,
            "each lookup but the last is retried"
        );
        assert!(failed.iter().all(|f| f.gives_up_in.is_some()), "{failed:?}");
        assert!(
            failed.iter().all(|f| f.retry_in <= LOOKUP_BACKOFF.1),
            "{failed:?}"
        );
        let abandoned: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::TargetLookupAbandoned(a) => Some(a),
                _ => None,
            })
            .collect();
        assert_eq!(abandoned.len(), 1, "{events:?}");
        assert_eq!(abandoned[0].lookups as usize, made);
        assert_eq!(
            abandoned[0].error,
            "LeaderNotAvailable (Broker: Leader not available)"
        );
        assert!(abandoned[0].asked_for >= PATIENCE);
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_is_waited_out_past_target_lookup_timeout_as_an_error_for_the_topic_is_not() {
        // The same script twice: ten minutes of lookups, then the topic.
        // Under no answer the relay waits and forwards; under an error for
        // the topic it gives up, so the first would have been seen.
        let script = |answer: Lookup| {
            let mut script = vec![(answer, LOOKUP_TIMEOUT); 60];
            script.push((Lookup::Exists, Duration::ZERO));
            script
        };
        let (settled, took, made, events) = settle_on(script(no_answer())).await;
        assert_eq!(settled, Ok(()));
        assert!(took > PATIENCE * 4, "{took:?}");
        assert_eq!(made, 61);
        assert!(
            events.iter().all(|e| matches!(
                e,
                Event::TargetLookupFailed(events::TargetLookupFailed {
                    gives_up_in: None,
                    ..
                })
            )),
            "{events:?}"
        );
        let (settled, took, _, _) = settle_on(script(leaderless())).await;
        assert_eq!(settled.unwrap_err().reason, headers::Reason::HopFailed);
        assert!(took < PATIENCE + LOOKUP_TIMEOUT, "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn errors_for_the_topic_alternating_with_no_answer_are_still_bounded() {
        // The slowest alternation: each lookup without an answer takes its
        // whole timeout.
        let mut alternating = Vec::new();
        for _ in 0..1_000 {
            alternating.push((leaderless(), Duration::from_millis(3)));
            alternating.push((no_answer(), LOOKUP_TIMEOUT));
        }
        let (settled, took, _, events) = settle_on(alternating).await;
        let rejected = settled.expect_err("the relay gave up");
        assert_eq!(rejected.reason, headers::Reason::HopFailed);
        let abandoned = events
            .iter()
            .find_map(|e| match e {
                Event::TargetLookupAbandoned(a) => Some(a),
                _ => None,
            })
            .expect("an abandoned lookup was emitted");
        assert!(abandoned.asked_for >= PATIENCE, "{abandoned:?}");
        // Every stretch touching an error for the topic counts: the relay
        // gives up at the first error past the timeout.
        assert!(
            took >= PATIENCE && took <= PATIENCE + 2 * (LOOKUP_BACKOFF.1 + LOOKUP_TIMEOUT),
            "{took:?}"
        );

        // Ten minutes without any answer between two errors for the topic
        // are not counted: an outage is waited out, and the errors after
        // it have the whole timeout.
        let mut outage = vec![(leaderless(), Duration::from_millis(3))];
        outage.extend(vec![(no_answer(), LOOKUP_TIMEOUT); 60]);
        outage.push((leaderless(), Duration::from_millis(3)));
        let (settled, took, _, _) = settle_on(outage).await;
        assert_eq!(settled.unwrap_err().reason, headers::Reason::HopFailed);
        assert!(took > PATIENCE * 5, "{took:?}");
    }
}
