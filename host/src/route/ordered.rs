//! What a route with ordered retries does with a message: call it, park
//! it, skip it or dead-letter it as its key's state says; and the jobs of
//! keys whose head resolved.

use super::{self as route, RouteProcessor};
use crate::headers;
use crate::hop::{Action, Outcome, PlannedHop, Written};
use crate::parked::{Admission, Lane, NotParked, Parked, Sent, Step, Stopping, Store, Unwritten};
use crate::spans::RouteSpans;
use crate::types::ReleaseCause;
use rdkafka::Timestamp;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use std::sync::Arc;

/// Handles a message of a route with ordered retries. A message without a
/// key is handled as on any route: it has no order to keep.
pub(crate) async fn process(
    processor: &RouteProcessor,
    store: &Arc<Store>,
    message: &OwnedMessage,
    spans: &mut RouteSpans,
) -> Action {
    let Some(key) = message.key() else {
        return route::handle(processor, message, spans).await;
    };
    if processor.tiers.contains_key(message.topic()) {
        return from_tier(processor, store, message, key, spans).await;
    }
    let lane = Lane {
        topic: message.topic().to_string(),
        partition: message.partition(),
        key: key.to_vec(),
    };
    let seq = message.offset();
    match store.table.admit(&lane, seq, &message_id(message)) {
        Admission::Call => {
            let action = route::handle(processor, message, spans).await;
            match retried(&action).map(str::to_string) {
                Some(id) => park_behind(processor, store, message, &id, action, spans),
                None => action,
            }
        }
        Admission::CallAsHead => {
            let action = route::handle(processor, message, spans).await;
            match (retried(&action), resolution(&action)) {
                (Some(id), _) => match store.hold(&lane, id, seq).await {
                    Ok(()) => action,
                    Err(Unwritten::Stopping(_)) => Action::GiveUp,
                    // Not parked: dead-lettered, and so its key released.
                    Err(Unwritten::Refused(refused)) => {
                        let dead = route::dead_letter_unparkable(
                            &processor.route,
                            message,
                            &refused,
                            true,
                        );
                        let id = message_id(message);
                        settle(store, &lane, &id, vec![dead], ReleaseCause::DeadLettered).await
                    }
                },
                // As from its tier: its hops acknowledged, then its release.
                (None, Some(cause)) => {
                    settle(store, &lane, &message_id(message), hops(action), cause).await
                }
                (None, None) => action,
            }
        }
        // Read again after a restart: it was handled before its key
        // parked, so it is not parked behind a later message; nor does its
        // retry park the key again.
        Admission::Redeliver => route::handle(processor, message, spans).await,
        Admission::Skip => Action::Done,
        // Its record is enqueued now, behind the key's earlier records,
        // and its offset is done once it is acknowledged: the key's turn
        // and the partition's call slot are not held for the round trip.
        // Refused for good (too large), it is dead-lettered instead.
        Admission::Park => {
            let waiting = parked(message);
            if store.table.over_share(&lane, waiting.size()) {
                return Action::Hop(route::dead_letter_key_park_full(
                    processor,
                    message,
                    store.table.key_share(),
                ));
            }
            let parking = store.park(&lane, seq, waiting);
            let (store, config) = (store.clone(), processor.route.clone());
            let written = Box::pin(async move {
                match parking.await {
                    Ok(()) => Written::Acknowledged,
                    Err(NotParked::Stopping(_)) => Written::GivenUp,
                    Err(NotParked::Refused(message, refused)) => {
                        let message = owned(&lane, seq, message);
                        let dead =
                            route::dead_letter_unparkable(&config, &message, &refused, false);
                        match store.send(dead).await {
                            Ok(_) => Written::Acknowledged,
                            Err(Stopping) => Written::GivenUp,
                        }
                    }
                }
            });
            Action::After {
                written,
                failed: false,
            }
        }
        Admission::Block { head } => {
            Action::Hop(route::dead_letter_blocked(processor, message, &head))
        }
    }
}

/// Whether `message`, of an input, is of a key the table surely has no
/// entry for ([`crate::parked::ParkTable::is_free`]): it is called as on
/// any route, and parks its key if it goes to a retry tier
/// ([`park_behind`]). What [`process`] does for a key in the table needs its
/// lane and id; a free key's message needs neither.
pub(crate) fn is_free(processor: &RouteProcessor, store: &Store, message: &OwnedMessage) -> bool {
    message.key().is_some_and(|key| {
        !processor.tiers.contains_key(message.topic())
            && store.table.is_free(message.partition(), key)
    })
}

/// Parks the key of `message`, of an input, behind it: it went to a retry
/// tier as `id` (`action`). The key is parked in the table now, so its
/// later messages park behind it, and the head's record is enqueued
/// ([`Store::head`]); the retry is produced once the record is
/// acknowledged, and the message's offset is done once the retry is. Both
/// are awaited beside the partition's calls: the call slot is free at once.
/// The call's span ends here, with the retry it planned. Refused for good
/// (a key too large for a park record), the message is dead-lettered
/// instead and its key released behind it, as if it had not parked it:
/// what parked behind it meanwhile goes on in order.
pub(crate) fn park_behind(
    processor: &RouteProcessor,
    store: &Arc<Store>,
    message: &OwnedMessage,
    id: &str,
    action: Action,
    spans: &mut RouteSpans,
) -> Action {
    std::mem::take(spans).finish(processor.telemetry.tracer(), &action);
    let lane = Lane {
        topic: message.topic().to_string(),
        partition: message.partition(),
        key: message.key().unwrap_or_default().to_vec(),
    };
    let head = store.head(&lane, id, message.offset());
    let (store, config, message, id) = (
        store.clone(),
        processor.route.clone(),
        message.clone(),
        id.to_string(),
    );
    let written = Box::pin(async move {
        let (hops, unparked) = match head.await {
            Ok(()) => (hops(action), false),
            Err(Unwritten::Stopping(_)) => return Written::GivenUp,
            Err(Unwritten::Refused(refused)) => {
                let dead = route::dead_letter_unparkable(&config, &message, &refused, true);
                (vec![dead], true)
            }
        };
        let mut dead_lettered = false;
        for hop in hops {
            match store.send(hop).await {
                Ok(Sent::Written) => {}
                Ok(Sent::DeadLettered) => dead_lettered = true,
                Err(Stopping) => return Written::GivenUp,
            }
        }
        // Not parked, it is released as if it had never parked it; its
        // retry dead-lettered in its place, it waits in no tier, and is
        // released as a dead-lettered head is.
        let release = if unparked {
            Some(ReleaseCause::Resolved)
        } else {
            dead_lettered.then_some(ReleaseCause::DeadLettered)
        };
        if let Some(cause) = release
            && store.resolved(&lane, &id, cause).await.is_err()
        {
            return Written::GivenUp;
        }
        Written::Acknowledged
    });
    Action::After {
        written,
        failed: true,
    }
}

/// What becomes of `message`, which went to a retry tier (`action`), once
/// its key's head record was written (`held`), refused for good (the key is
/// not parked: the message is dead-lettered instead), or given up.
fn held(
    processor: &RouteProcessor,
    held: Result<(), Unwritten>,
    message: &OwnedMessage,
    action: Action,
) -> Action {
    match held {
        Ok(()) => action,
        Err(Unwritten::Stopping(_)) => Action::GiveUp,
        Err(Unwritten::Refused(refused)) => Action::Hop(route::dead_letter_unparkable(
            &processor.route,
            message,
            &refused,
            true,
        )),
    }
}

/// The head `id` of `lane` resolved (`cause`): its hops are produced and
/// acknowledged, then its release is written. Given up at the stop, the
/// message is left undone.
async fn settle(
    store: &Store,
    lane: &Lane,
    id: &str,
    hops: Vec<PlannedHop>,
    cause: ReleaseCause,
) -> Action {
    for hop in hops {
        if store.send(hop).await.is_err() {
            return Action::GiveUp;
        }
    }
    match store.resolved(lane, id, cause).await {
        Ok(()) => Action::Done,
        Err(Stopping) => Action::GiveUp,
    }
}

/// Runs one step of the job of `lane`, whose head resolved: handles its
/// next waiting message (every hop acknowledged before its record is
/// deleted), dead-letters it when the key is blocked, or deletes the key's
/// records when nothing waits.
pub(crate) async fn run_job(processor: &RouteProcessor, store: &Store, lane: Lane) {
    match store.table.step(&lane) {
        Step::Nothing => {}
        // Given up at the stop, a waiting message is left in the park
        // topic, and handled again after a restart.
        Step::Handle { seq, message } => {
            if store.written(&lane, seq).await.is_err() {
                return;
            }
            if !store.table.waits(&lane, seq) {
                // Its record refused for good while the job waited for
                // it, it is dead-lettered instead: not handed on as well.
                store.table.job_done(&lane);
                return;
            }
            let message = owned(&lane, seq, message);
            let mut spans = RouteSpans::default();
            let mut action = route::handle(processor, &message, &mut spans).await;
            spans.finish(processor.telemetry.tracer(), &action);
            // The key's head now, when it goes to a retry tier.
            let mut head = None;
            if let Some(id) = retried(&action).map(str::to_string) {
                let held_now = store.hold(&lane, &id, seq).await;
                if held_now.is_ok() {
                    // The key is parked behind this message now, not behind
                    // its copy waiting here, whose record is deleted only
                    // once the retry is written (below): its retry, read
                    // from the tier however soon, finds it holding the key.
                    let _ = store.table.take(&lane, seq);
                    head = Some(id);
                }
                action = held(processor, held_now, &message, action);
            }
            if let Action::GiveUp = action {
                return;
            }
            let resolved = resolution(&action);
            let mut dead_lettered = false;
            for hop in hops(action) {
                match store.send(hop).await {
                    Ok(Sent::Written) => {}
                    Ok(Sent::DeadLettered) => dead_lettered = true,
                    Err(Stopping) => return,
                }
            }
            // Its retry dead-lettered in its place, it waits in no tier:
            // it releases its key as a dead-lettered head does.
            if dead_lettered
                && let Some(id) = &head
                && store
                    .resolved(&lane, id, ReleaseCause::DeadLettered)
                    .await
                    .is_err()
            {
                return;
            }
            // The key's head itself, handed on again after a crash
            // (`KeyState::Releasing`), that resolved this time.
            if let Some(cause) = resolved {
                let id = message_id(&message);
                if store.table.is_head(&lane, &id, seq)
                    && store.resolved(&lane, &id, cause).await.is_err()
                {
                    return;
                }
            }
            store.forget(&lane, seq).await;
        }
        Step::DeadLetter { seq, message, head } => {
            if store.written(&lane, seq).await.is_err() {
                return;
            }
            if !store.table.waits(&lane, seq) {
                store.table.job_done(&lane);
                return;
            }
            let message = owned(&lane, seq, message);
            let dead = route::dead_letter_blocked(processor, &message, &head);
            if store.send(dead).await.is_ok() {
                store.forget(&lane, seq).await;
            }
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
pub(crate) fn retried(action: &Action) -> Option<&str> {
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
fn resolution(action: &Action) -> Option<ReleaseCause> {
    match action {
        Action::Hop(hop) => match &hop.outcome {
            Outcome::Retry(_) | Outcome::Deferral(_) => None,
            Outcome::DeadLetter(_) => Some(ReleaseCause::DeadLettered),
            _ => Some(ReleaseCause::Resolved),
        },
        _ => Some(ReleaseCause::Resolved),
    }
}

/// A message read from a retry tier. When it is its key's head:
///
/// - resolved already (read again after a crash, its release written),
///   it is not called again, after the key's later messages;
/// - when it resolves now, its next hops are produced and acknowledged,
///   and only then is its release written, which lets the key's waiting
///   messages go on. So a released head's hops are never lost, and the
///   check above may skip it.
///
/// Its key is the one it was read with, in the input partition its origin
/// headers name, and it is its key's head only with the head's id and
/// input offset: an id alone is the producer's to choose. When the table
/// has not read the key's head yet, it is taken for one: a release of a
/// message that was none changes nothing.
async fn from_tier(
    processor: &RouteProcessor,
    store: &Store,
    message: &OwnedMessage,
    key: &[u8],
    spans: &mut RouteSpans,
) -> Action {
    let text = |name: &str| {
        message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_string)
    };
    let head = (|| {
        let lane = Lane {
            topic: text(headers::ORIGIN_TOPIC)?,
            partition: text(headers::ORIGIN_PARTITION)?.parse().ok()?,
            key: key.to_vec(),
        };
        let origin = text(headers::ORIGIN_OFFSET)?.parse::<i64>().ok()?;
        Some((lane, text(headers::ID)?, origin))
    })();
    let Some((lane, id, origin)) = head else {
        // Dead-lettered as INVALID_ENVELOPE: no head of any key.
        return route::handle(processor, message, spans).await;
    };
    if store.table.settled(&lane, &id, origin) {
        tracing::debug!(
            route = processor.route.name,
            id,
            "A head read again from its tier resolved before: not called again."
        );
        return Action::Done;
    }
    let action = route::handle(processor, message, spans).await;
    let Some(cause) = resolution(&action) else {
        return action;
    };
    if !store.table.holds(&lane, &id, origin).unwrap_or(true) {
        return action;
    }
    settle(store, &lane, &id, hops(action), cause).await
}

fn hops(action: Action) -> Vec<PlannedHop> {
    match action {
        Action::Done | Action::After { .. } | Action::GiveUp => Vec::new(),
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
