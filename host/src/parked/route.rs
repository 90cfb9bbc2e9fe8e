//! What a route with ordered retries does with a message: call it, park
//! it, skip it or dead-letter it as its key's state says; and the jobs of
//! keys whose head resolved.

use super::records::{Cause, Lane, Parked};
use super::table::{Admission, Step};
use super::topic::Store;
use crate::headers;
use crate::hop::{Action, Outcome, PlannedHop};
use crate::route::{self, RouteProcessor};
use crate::spans::RouteSpans;
use rdkafka::Timestamp;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use std::sync::Arc;

/// Handles a message of a route with ordered retries. A message without a
/// key is handled as on any route: it has no order to keep.
pub(crate) async fn process(
    shared: &RouteProcessor,
    store: &Arc<Store>,
    message: &OwnedMessage,
    spans: &mut RouteSpans,
) -> Action {
    let Some(key) = message.key() else {
        return route::handle(shared, message, spans).await;
    };
    if shared.tiers.contains_key(message.topic()) {
        let action = route::handle(shared, message, spans).await;
        if let Some(cause) = resolution(&action) {
            resolve_from_tier(store, message, key, cause).await;
        }
        return action;
    }
    let lane = Lane {
        topic: message.topic().to_string(),
        partition: message.partition(),
        key: key.to_vec(),
    };
    let seq = message.offset();
    match store.table.admit(&lane, seq, &message_id(message)) {
        Admission::Call => {
            let action = route::handle(shared, message, spans).await;
            if let Some(id) = retried(&action) {
                store.hold(&lane, id, seq).await;
            }
            action
        }
        Admission::CallAsHead => {
            let action = route::handle(shared, message, spans).await;
            match (retried(&action), resolution(&action)) {
                (Some(id), _) => store.hold(&lane, id, seq).await,
                (None, Some(cause)) => store.resolved(&lane, &message_id(message), cause).await,
                (None, None) => {}
            }
            action
        }
        // Read again after a restart: it was handled before its key
        // parked, so it is not parked behind a later message; nor does its
        // retry park the key again.
        Admission::Redeliver => route::handle(shared, message, spans).await,
        Admission::Skip => Action::Done,
        // Its record is enqueued now, behind the key's earlier records,
        // and its offset is done once it is acknowledged: the key's turn
        // and the partition's call slot are not held for the round trip.
        Admission::Park => Action::After(store.park(&lane, seq, parked(message))),
        Admission::Block { head } => {
            Action::Hop(route::dead_letter_blocked(shared, message, &head))
        }
    }
}

/// Runs one step of the job of `lane`, whose head resolved: handles its
/// next waiting message (every hop acknowledged before its record is
/// deleted), dead-letters it when the key is blocked, or deletes the key's
/// records when nothing waits.
pub(crate) async fn run_job(shared: &RouteProcessor, store: &Store, lane: Lane) {
    match store.table.step(&lane) {
        Step::Nothing => {}
        Step::Handle { seq, message } => {
            let message = owned(&lane, seq, message);
            let mut spans = RouteSpans::default();
            let action = route::handle(shared, &message, &mut spans).await;
            spans.finish(shared.telemetry.tracer(), &action);
            if let Some(id) = retried(&action) {
                store.hold(&lane, id, seq).await;
            }
            let resolved = resolution(&action);
            for hop in hops(action) {
                store.send(hop).await;
            }
            // The key's head itself, handed on again after a crash
            // (`KeyState::Releasing`), that resolved this time.
            if let Some(cause) = resolved {
                let id = message_id(&message);
                if store.table.lane_of_head(&id).as_ref() == Some(&lane) {
                    store.resolved(&lane, &id, cause).await;
                }
            }
            store.forget(&lane, seq).await;
        }
        Step::DeadLetter { seq, message, head } => {
            let message = owned(&lane, seq, message);
            store
                .send(route::dead_letter_blocked(shared, &message, &head))
                .await;
            store.forget(&lane, seq).await;
        }
        Step::Close { head, releases } => store.close(&lane, head, releases).await,
    }
    store.table.job_done(&lane);
}

/// The id of a message read from the input: its `hopper-id`, or the
/// default built from where it was read.
fn message_id(message: &OwnedMessage) -> String {
    let given = message.headers().and_then(|h| {
        h.iter()
            .find(|h| h.key == headers::ID)
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_string)
    });
    given.unwrap_or_else(|| {
        headers::default_id(message.topic(), message.partition(), message.offset())
    })
}

/// The id of the message an action sends to a retry tier.
fn retried(action: &Action) -> Option<&str> {
    match action {
        Action::Hop(PlannedHop {
            outcome: Outcome::Retry(retry),
            ..
        }) => Some(&retry.id),
        _ => None,
    }
}

/// Whether an action resolves its message, and how: `None` while it waits
/// in a tier (a retry, or a deferral by an open breaker).
fn resolution(action: &Action) -> Option<Cause> {
    match action {
        Action::Hop(hop) => match &hop.outcome {
            Outcome::Retry(_) | Outcome::Deferral(_) => None,
            Outcome::DeadLetter(_) => Some(Cause::DeadLettered),
            _ => Some(Cause::Resolved),
        },
        _ => Some(Cause::Resolved),
    }
}

/// A tier message resolved: when it is its key's head, the key is
/// released. Its key is found by its id, or, when the table has not read
/// its head yet, from its origin.
async fn resolve_from_tier(store: &Store, message: &OwnedMessage, key: &[u8], cause: Cause) {
    let text = |name: &str| {
        message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_string)
    };
    let Some(id) = text(headers::ID) else {
        return; // dead-lettered as INVALID_ENVELOPE: no head of any key
    };
    let lane = store.table.lane_of_head(&id).or_else(|| {
        Some(Lane {
            topic: text(headers::ORIGIN_TOPIC)?,
            partition: text(headers::ORIGIN_PARTITION)?.parse().ok()?,
            key: key.to_vec(),
        })
    });
    if let Some(lane) = lane {
        store.resolved(&lane, &id, cause).await;
    }
}

fn hops(action: Action) -> Vec<PlannedHop> {
    match action {
        Action::Done | Action::After(_) => Vec::new(),
        Action::Hop(hop) | Action::HopAt { hop, .. } => vec![hop],
        Action::Hops(hops) => hops,
    }
}

/// What of a message waits in the park topic.
fn parked(message: &OwnedMessage) -> Parked {
    Parked {
        payload: message.payload().map(<[u8]>::to_vec),
        headers: message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default(),
        timestamp: message.timestamp().to_millis(),
    }
}

/// A waiting message as it was read from the input, to be handled.
fn owned(lane: &Lane, seq: i64, parked: Parked) -> OwnedMessage {
    let headers = (!parked.headers.is_empty()).then(|| {
        let mut owned = OwnedHeaders::new_with_capacity(parked.headers.len());
        for (key, value) in &parked.headers {
            owned = owned.insert(Header {
                key,
                value: value.as_deref(),
            });
        }
        owned
    });
    OwnedMessage::new(
        parked.payload,
        Some(lane.key.clone()),
        lane.topic.clone(),
        parked
            .timestamp
            .map_or(Timestamp::NotAvailable, Timestamp::CreateTime),
        lane.partition,
        seq,
        headers,
    )
}
