//! A route's processing: read the envelope, call the handler, plan the next
//! hop from its verdict. The consumer loop around it is [`crate::pipeline`].

use crate::breaker::{Admit, Breaker, Suspended, Transition};
use crate::clock::now_ms;
use crate::config::{Concurrency, Route, TrapPolicy};
use crate::dlq;
use crate::events::{self, Event, Telemetry};
use crate::headers::{self, Envelope, Hop, Incoming, Reason};
use crate::hold;
use crate::hop::{self, Action, OutRecord, Outcome, PlannedHop, Processor};
use crate::parked;

mod ordered;
use crate::plugin::{self, Emitted, Handler, HandlerSlot, Verdict};
use crate::retry::{self, Decision};
use crate::spans::RouteSpans;
use crate::types::{EmitKind, TopicPartition};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders, OwnedMessage};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The processor of one route.
pub struct RouteProcessor {
    pub route: Arc<Route>,
    /// Retry tier topic → how long its messages wait. Looked up twice per
    /// message by a topic name from the route's own config: foldhash, not
    /// SipHash, which showed in a no-op route's profile.
    pub tiers: HashMap<String, Duration, foldhash::fast::RandomState>,
    pub handler: Arc<HandlerSlot>,
    pub telemetry: Telemetry,
    /// This route's call counters and call-duration histogram, held so no
    /// message looks one up.
    calls: events::Calls,
    /// One permit per handler instance the route may have at once
    /// (`max_instances`): a call waits here, not in the consumer loop.
    instances: tokio::sync::Semaphore,
    /// The circuit breaker, with `[route.breaker]`; shared with health,
    /// which reads its state for readiness views and gauges.
    breaker: Option<Arc<Breaker>>,
    /// What an open breaker pauses: the tier topics only, or (with
    /// `pause_input`) the tier topics and the inputs.
    suspend_tiers: Vec<String>,
    suspend_all: Vec<String>,
    /// The park table and topic, with `retry_order = "key"`.
    parked: Option<Arc<parked::Store>>,
}

impl RouteProcessor {
    pub fn new(route: Arc<Route>, handler: Arc<HandlerSlot>, telemetry: Telemetry) -> Self {
        let tiers = route.tiers().into_iter().map(|(d, t)| (t, d)).collect();
        let calls = events::Calls::register(telemetry.metrics(), &route.name);
        let instances = tokio::sync::Semaphore::new(route.max_instances);
        let breaker = route.breaker.clone().map(|b| Arc::new(Breaker::new(b)));
        if let Some(breaker) = &breaker {
            let read = breaker.clone();
            let health = telemetry.health();
            health.set_breaker(&route.name, Box::new(move || read.state()));
        }
        let suspend_tiers: Vec<String> = route.tiers().into_iter().map(|(_, t)| t).collect();
        let suspend_all = suspend_tiers.iter().chain(&route.topics).cloned().collect();
        Self {
            route,
            tiers,
            handler,
            telemetry,
            calls,
            instances,
            breaker,
            suspend_tiers,
            suspend_all,
            parked: None,
        }
    }

    /// Keeps each key's order across retries with `store`, the route's
    /// loaded park table (`retry_order = "key"`).
    pub fn with_parking(mut self, store: Arc<parked::Store>) -> Self {
        let read = store.clone();
        let health = self.telemetry.health();
        health.set_parked(&self.route.name, Box::new(move || read.table.summary()));
        self.parked = Some(store);
        self
    }

    /// Logs, counts and broadcasts a change of the breaker's state.
    fn report(&self, transition: Option<Transition>) {
        let Some(transition) = transition else {
            return;
        };
        let route = self.route.name.clone();
        self.telemetry.emit(match transition {
            Transition::Opened {
                retryable,
                calls,
                cool_down,
            } => Event::BreakerOpened(events::BreakerOpened {
                route,
                retryable,
                calls,
                cool_down,
                reopened: false,
            }),
            Transition::Reopened { cool_down } => Event::BreakerOpened(events::BreakerOpened {
                route,
                retryable: 1,
                calls: 1,
                cool_down,
                reopened: true,
            }),
            Transition::HalfOpened { probes } => {
                Event::BreakerHalfOpen(events::BreakerHalfOpen { route, probes })
            }
            Transition::Closed { open_for } => {
                Event::BreakerClosed(events::BreakerClosed { route, open_for })
            }
        });
    }
}

/// Whether the breaker counts `verdict` as retryable: `retryable`, a
/// timeout (always retried), or a trap when the route retries traps.
fn counts_as_retryable(route: &Route, verdict: &Verdict) -> bool {
    match verdict {
        Verdict::Retryable { .. } => true,
        Verdict::Failed { class, .. } => match class {
            Reason::HandlerTimeout => true,
            Reason::HandlerTrap => route.on_trap == TrapPolicy::Retry,
            _ => false,
        },
        Verdict::Ok | Verdict::Fatal { .. } => false,
    }
}

impl Processor for RouteProcessor {
    /// A key whose head resolved.
    type Job = parked::Lane;

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
        let mut spans = RouteSpans::default();
        // A message of a key the park table surely has no entry for (every
        // message, on a route that parks nothing) is called as on any
        // route: no lock, no lane, no id.
        let free = self
            .parked
            .as_ref()
            .filter(|store| ordered::is_free(self, store, message));
        let mut action = match &self.parked {
            Some(store) if free.is_none() => {
                // Boxed: a route without ordered retries keeps its call's
                // future, which every message allocates and moves, as small
                // as it was.
                Box::pin(ordered::process(self, store, message, &mut spans)).await
            }
            _ => handle(self, message, &mut spans).await,
        };
        // As for a free key in `ordered::process`: a retry parks the key.
        if let Some(store) = free
            && let Some(id) = ordered::retried(&action).map(str::to_string)
        {
            action = ordered::park_behind(self, store, message, &id, action, &mut spans);
        }
        spans.finish(self.telemetry.tracer(), &action);
        action
    }

    async fn watch(&self, tp: &TopicPartition) -> Option<Arc<tokio::sync::Notify>> {
        // A tier's partitions have no keys of their own to park.
        let store = self
            .parked
            .as_ref()
            .filter(|_| !self.tiers.contains_key(&tp.topic))?;
        // What the partition's previous owner parked is read before any of
        // its messages is handled here.
        let mut failures = 0u32;
        while let Err(e) = store.caught_up().await {
            failures += 1;
            tracing::warn!(route = self.route.name, topic = tp.topic, partition = tp.partition, error = %e, failures, "Reading the park topic's end failed; the partition waits.");
            tokio::time::sleep(Duration::from_millis(100 << failures.min(5))).await;
        }
        let wake = Arc::new(tokio::sync::Notify::new());
        store.table.watch(tp, wake.clone());
        Some(wake)
    }

    fn full(&self, tp: &TopicPartition) -> bool {
        self.parked
            .as_ref()
            .is_some_and(|s| s.table.full() && !self.tiers.contains_key(&tp.topic))
    }

    async fn room(&self) {
        if let Some(store) = &self.parked {
            store.table.room().await;
        }
    }

    fn unwatch(&self, tp: &TopicPartition) {
        if let Some(store) = &self.parked {
            store.table.unwatch(tp);
        }
    }

    fn jobs(&self, tp: &TopicPartition) -> Vec<(Vec<u8>, parked::Lane)> {
        let Some(store) = &self.parked else {
            return Vec::new();
        };
        let lanes = store.table.jobs(tp);
        lanes.into_iter().map(|l| (l.key.clone(), l)).collect()
    }

    async fn run_job(&self, lane: parked::Lane) {
        if let Some(store) = &self.parked {
            Box::pin(ordered::run_job(self, store, lane)).await;
        }
    }

    fn dlq_topic(&self) -> &str {
        &self.route.dlq
    }

    fn halt(&self) -> Option<Arc<crate::hop::Halt>> {
        self.parked.as_ref().map(|store| store.halt.clone())
    }

    fn concurrency(&self) -> Concurrency {
        self.route.concurrency
    }

    fn suspended(&self, now_ms: i64) -> &[String] {
        let Some(breaker) = &self.breaker else {
            return &[];
        };
        let (suspended, transition) = breaker.suspended(now_ms);
        self.report(transition);
        match suspended {
            Suspended::None => &[],
            Suspended::Tiers => &self.suspend_tiers,
            Suspended::TiersAndInput => &self.suspend_all,
        }
    }
}

/// Handles one message: reads its envelope, asks the breaker, calls the
/// handler, and decides what to produce next: a retry or dead-letter
/// record, or on `ok` the records the handler emitted (the offset is done
/// once all of them are acknowledged), or nothing. `spans` gets the call's
/// span (when the trace is exported).
pub(crate) async fn handle(
    processor: &RouteProcessor,
    message: &OwnedMessage,
    spans: &mut RouteSpans,
) -> Action {
    processor.calls.consumed();
    let from_tier = processor.tiers.contains_key(message.topic());
    let envelope = match envelope(processor, message, from_tier, spans) {
        Ok(envelope) => envelope,
        Err(dead_letter) => return Action::Hop(*dead_letter),
    };
    let admit = admit(processor, from_tier);
    if admit == Admit::Defer {
        return Action::Hop(defer(processor, message, &envelope));
    }
    // `from_tier` refuses an attempt count with no next attempt.
    let attempt = envelope.attempts_made.saturating_add(1);
    let (handler, handled) = call(processor, message, &envelope, attempt, spans).await;
    let verdict = &handled.verdict;
    if let Some(breaker) = &processor.breaker {
        if let Admit::Probe { .. } = admit {
            processor.telemetry.emit(events::BreakerProbed {
                route: processor.route.name.clone(),
                id: envelope.id.clone(),
                verdict: verdict.kind(),
            });
        }
        let retryable = counts_as_retryable(&processor.route, verdict);
        processor.report(breaker.record(admit, retryable, now_ms()));
    }
    decide(processor, message, &envelope, attempt, &handler, handled)
}

/// The message's envelope, its trace decided and its span begun; for an
/// envelope that cannot be read, its dead-letter hop (`INVALID_ENVELOPE`),
/// boxed: the rare path pays for the size.
fn envelope(
    processor: &RouteProcessor,
    message: &OwnedMessage,
    from_tier: bool,
    spans: &mut RouteSpans,
) -> Result<Envelope, Box<PlannedHop>> {
    let incoming = Incoming {
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        timestamp: message.timestamp().to_millis(),
        headers: message.headers(),
    };
    let read = if from_tier {
        Envelope::from_tier(&incoming)
    } else {
        Envelope::from_input(&incoming)
    };
    let tracer = processor.telemetry.tracer();
    let (mut envelope, problem) = match read {
        Ok(envelope) => (envelope, None),
        Err(problem) => (Envelope::fallback(&incoming), Some(problem)),
    };
    tracer.decide(&mut envelope.trace);
    spans.read(tracer, &envelope.trace, message, &processor.route.group);
    match problem {
        None => Ok(envelope),
        Some(problem) => {
            let decision = Decision::DeadLetter {
                reason: Reason::InvalidEnvelope,
                error: problem.to_string(),
            };
            Err(Box::new(plan(
                processor, message, &envelope, 0, None, decision,
            )))
        }
    }
}

/// What the route's circuit breaker lets this message do; every message is
/// called on a route without one.
fn admit(processor: &RouteProcessor, from_tier: bool) -> Admit {
    match &processor.breaker {
        None => Admit::Call,
        Some(breaker) => {
            let (admit, transition) = breaker.admit(now_ms(), from_tier);
            processor.report(transition);
            admit
        }
    }
}

/// Calls the route's handler on the message, within one of the route's
/// instances, and reports the call: the handler version that ran, and what
/// the call came to.
async fn call(
    processor: &RouteProcessor,
    message: &OwnedMessage,
    envelope: &Envelope,
    attempt: u32,
    spans: &mut RouteSpans,
) -> (Arc<Handler>, plugin::Answer) {
    let route = &processor.route;
    // Never closed, so acquiring only waits; a free permit is taken
    // without the wait's future.
    let _instance = match processor.instances.try_acquire() {
        Ok(permit) => permit,
        Err(_) => processor.instances.acquire().await.expect("never closed"),
    };
    let handler = processor.handler.current();
    let headers: Vec<plugin::Header<'_>> = message
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| plugin::Header {
                    key: h.key,
                    value: h.value.unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    let delivery = plugin::Message {
        id: &envelope.id,
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        key: message.key(),
        payload: message.payload(),
        headers: &headers,
        timestamp: message.timestamp().to_millis(),
        attempt,
        route: &route.name,
    };
    // One await of the call, not one per arm: each await point keeps its
    // own copy of the call's state in this future, which every message
    // allocates and moves.
    let started = processor.calls.started();
    let context = spans.call_context(&envelope.trace);
    let handled = crate::trace::in_call(context, handler.run_message(&delivery)).await;
    let verdict = &handled.verdict;
    spans.handled(
        &route.name,
        &envelope.id,
        attempt,
        verdict,
        handler.version(),
    );
    let failure = match verdict {
        Verdict::Failed { class, error } => Some((class.as_str(), error.as_str())),
        _ => None,
    };
    let call = events::Call {
        id: &envelope.id,
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        attempt,
        verdict: verdict.kind(),
        failure,
        version: handler.version(),
        trace_id: envelope.trace.trace_id,
    };
    processor.calls.handled(&processor.telemetry, started, call);
    (handler, handled)
}

/// What to produce after a call: on `ok`, the records the handler emitted
/// (nothing if none); else the retry or dead-letter hop its verdict and
/// attempt come to, the emits discarded.
fn decide(
    processor: &RouteProcessor,
    message: &OwnedMessage,
    envelope: &Envelope,
    attempt: u32,
    handler: &Handler,
    handled: plugin::Answer,
) -> Action {
    let route = &processor.route;
    let verdict = &handled.verdict;
    if handled.discarded > 0 {
        processor.telemetry.emit(events::EmitsDiscarded {
            route: route.name.clone(),
            id: envelope.id.clone(),
            count: handled.discarded,
            verdict: verdict.kind(),
        });
    }
    let decision = retry::decide(route, attempt, verdict);
    if decision == Decision::Commit {
        if handled.emitted.is_empty() {
            return Action::Done;
        }
        let hops = handled.emitted.into_iter();
        let trace = &envelope.trace;
        return Action::Hops(hops.map(|e| emitted_hop(route, e, trace)).collect());
    }
    let handler = Some(handler);
    Action::Hop(plan(
        processor, message, envelope, attempt, handler, decision,
    ))
}

/// The record of one emitted record: its own headers (less any
/// `traceparent`: it continues the call's trace, `trace`), then
/// `traceparent`, `hopper-id` and `hopper-route`; a delayed one goes to the delay relay's inbox with
/// `hopper-target` and `hopper-deliver-at` (and `hopper-replace` for a
/// replacing schedule), a cancel with `hopper-cancel` (docs/headers.md).
fn emitted_hop(route: &Route, emitted: Emitted, trace: &crate::traceparent::Context) -> PlannedHop {
    let Emitted {
        id,
        topic,
        key,
        payload,
        headers: own,
        deliver_at,
        kind,
    } = emitted;
    let mut out = Vec::with_capacity(own.len() + 6);
    out.extend(
        own.into_iter()
            .filter(|(key, _)| !key.eq_ignore_ascii_case(crate::traceparent::TRACEPARENT)),
    );
    out.push((
        crate::traceparent::TRACEPARENT.to_string(),
        trace.traceparent().to_vec(),
    ));
    out.push((headers::ID.to_string(), id.clone().into_bytes()));
    out.push((headers::ROUTE.to_string(), route.name.clone().into_bytes()));
    let destination = match (kind, deliver_at, &route.grants.delay) {
        // A cancel's topic is the inbox already.
        (EmitKind::Cancel, ..) => {
            out.push((headers::CANCEL.to_string(), b"true".to_vec()));
            topic.clone()
        }
        (_, Some(at), Some(relay)) => {
            out.push((headers::TARGET.to_string(), topic.clone().into_bytes()));
            out.push((headers::DELIVER_AT.to_string(), at.to_string().into_bytes()));
            if kind == (EmitKind::Schedule { replace: true }) {
                out.push((headers::REPLACE.to_string(), b"true".to_vec()));
            }
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
        outcome: Outcome::Emit(hop::Emit {
            route: route.name.clone(),
            id,
            topic,
            deliver_at,
            kind,
        }),
    }
}

/// Sends a tier message that reached an open breaker back to its tier,
/// without calling the handler: its attempts, last error and failure times
/// stay as they are, its trail gets `breaker`, and it waits the tier's time
/// again behind the messages already there.
fn defer(processor: &RouteProcessor, message: &OwnedMessage, envelope: &Envelope) -> PlannedHop {
    let route = &processor.route;
    let topic = message.topic().to_string();
    let wait = processor.tiers.get(&topic).copied().unwrap_or_default();
    let now = now_ms();
    let headers = headers::next_hop_headers(
        message.headers(),
        envelope,
        &Hop {
            route: &route.name,
            attempts_made: envelope.attempts_made,
            reason: None,
            error: None,
            failed_at: None,
            handler: None,
            trail_entry: "breaker",
            due_at: Some(now + wait.as_millis() as i64),
            keep: &[
                headers::FIRST_FAILURE_AT,
                headers::LAST_FAILURE_AT,
                headers::LAST_ERROR,
                headers::REASON,
                headers::HANDLER,
                headers::HANDLER_VERSION,
            ],
        },
    );
    let mut record = OutRecord::like(message, topic.clone(), headers);
    record.timestamp = now;
    PlannedHop {
        record,
        outcome: Outcome::Deferral(hop::Deferral {
            route: route.name.clone(),
            id: envelope.id.clone(),
            topic,
        }),
    }
}

/// The dead-letter hop of a message whose key is blocked behind the
/// dead-lettered `head` (`KEY_BLOCKED`, with `hopper-blocked-by`); its
/// handler is not called.
pub(crate) fn dead_letter_blocked(
    processor: &RouteProcessor,
    message: &OwnedMessage,
    head: &str,
) -> PlannedHop {
    let incoming = Incoming {
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        timestamp: message.timestamp().to_millis(),
        headers: message.headers(),
    };
    let envelope =
        Envelope::from_input(&incoming).unwrap_or_else(|_| Envelope::fallback(&incoming));
    let route = &processor.route;
    let error = format!(
        "its key is blocked: the key's earlier message `{head}` was dead-lettered, and no operator has released the key"
    );
    let mut hop = dlq::plan(
        message,
        dlq::Plan {
            topic: &route.dlq,
            route: &route.name,
            envelope: &envelope,
            attempts_made: 0,
            reason: Reason::KeyBlocked,
            error: &error,
            handler: None,
            keep: &[],
        },
    );
    let headers = std::mem::replace(&mut hop.record.headers, OwnedHeaders::new());
    hop.record.headers = headers.insert(Header {
        key: headers::BLOCKED_BY,
        value: Some(head.as_bytes()),
    });
    hop
}

/// The dead-letter hop of a message of `route` that could not wait in its
/// park topic, the broker refusing its record for good (its key or
/// payload too large): `RECORD_TOO_LARGE`, instead of a retry (`called`:
/// its handler was just called) or a place behind its key's head.
pub(crate) fn dead_letter_unparkable(
    route: &Route,
    message: &OwnedMessage,
    refused: &crate::parked::Refused,
    called: bool,
) -> PlannedHop {
    let incoming = Incoming {
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        timestamp: message.timestamp().to_millis(),
        headers: message.headers(),
    };
    let envelope =
        Envelope::from_input(&incoming).unwrap_or_else(|_| Envelope::fallback(&incoming));
    let topic = route.parking.as_ref().map_or(&route.name, |p| &p.topic);
    let error = format!("its key could not be parked in `{topic}`: {refused}");
    let attempts_made = envelope.attempts_made.saturating_add(u32::from(called));
    dlq::plan(
        message,
        dlq::Plan {
            topic: &route.dlq,
            route: &route.name,
            envelope: &envelope,
            attempts_made,
            reason: Reason::RecordTooLarge,
            error: &error,
            handler: None,
            keep: &[],
        },
    )
}

/// The dead-letter hop of a message whose key holds its share of the
/// route's parked messages (`KEY_PARK_FULL`); its handler is not called.
pub(crate) fn dead_letter_key_park_full(
    processor: &RouteProcessor,
    message: &OwnedMessage,
    share: usize,
) -> PlannedHop {
    let incoming = Incoming {
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        timestamp: message.timestamp().to_millis(),
        headers: message.headers(),
    };
    let envelope =
        Envelope::from_input(&incoming).unwrap_or_else(|_| Envelope::fallback(&incoming));
    let route = &processor.route;
    let error = format!(
        "its key holds its share of the parked messages ({share} bytes, max_parked_key_mib) behind its head"
    );
    dlq::plan(
        message,
        dlq::Plan {
            topic: &route.dlq,
            route: &route.name,
            envelope: &envelope,
            attempts_made: 0,
            reason: Reason::KeyParkFull,
            error: &error,
            handler: None,
            keep: &[],
        },
    )
}

/// Builds the record of the next hop and its outcome.
fn plan(
    processor: &RouteProcessor,
    message: &OwnedMessage,
    envelope: &Envelope,
    attempt: u32,
    handler: Option<&Handler>,
    decision: Decision,
) -> PlannedHop {
    let route = &processor.route;
    let handler = handler.map(|h| (h.name(), h.version()));
    let (topic, delay, reason, error) = match decision {
        Decision::Commit => unreachable!("a committed message has no hop"),
        Decision::DeadLetter { reason, error } => {
            return dlq::plan(
                message,
                dlq::Plan {
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
        outcome: Outcome::Retry(hop::Retry {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::orders_route;

    fn failed(class: Reason) -> Verdict {
        Verdict::Failed {
            class,
            error: "x".into(),
        }
    }

    #[test]
    fn the_breaker_counts_what_the_route_retries_as_retryable() {
        let dead_letter = orders_route("");
        let retry = orders_route("on_trap = \"retry\"");
        let retryable = Verdict::Retryable {
            reason: "503".into(),
            retry_after: None,
        };
        assert!(counts_as_retryable(&dead_letter, &retryable));
        assert!(counts_as_retryable(
            &dead_letter,
            &failed(Reason::HandlerTimeout)
        ));
        assert!(!counts_as_retryable(
            &dead_letter,
            &failed(Reason::HandlerTrap)
        ));
        assert!(counts_as_retryable(&retry, &failed(Reason::HandlerTrap)));
        assert!(!counts_as_retryable(&retry, &failed(Reason::HandlerMemory)));
        assert!(!counts_as_retryable(&retry, &Verdict::Ok));
        let fatal = Verdict::Fatal {
            reason: "no".into(),
        };
        assert!(!counts_as_retryable(&retry, &fatal));
    }
}
