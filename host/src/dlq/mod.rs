//! Dead-lettering: every record hopper writes to a dead-letter topic is
//! built here, by routes and by the delay relay alike, so every DLQ record
//! carries the same context headers (docs/headers.md). Reading them back
//! ([`browse`]), replaying them ([`replay`], resumably: [`run`], a selection
//! of any size: [`stream`]), trying a new handler on them
//! ([`candidate`]) and exporting them ([`export`]) live beside it.

pub mod browse;
pub mod candidate;
pub mod export;
pub mod fingerprint;
pub mod live;
pub mod record;
pub mod replay;
pub mod run;
pub mod skip;
pub mod stream;

pub use browse::{Dlq, DlqError, DlqFilter, DlqPage};
pub use candidate::{HttpMode, TryReport, try_candidate};
pub use record::{DlqRecord, DlqSummary, RecordRef};
pub use replay::{Pacer, ReplayReport};
pub use skip::{SkipError, Skipped, is_undecodable, skip_undecodable};

use crate::clock::now_ms;
use crate::headers::{self, Envelope, Hop, Reason};
use crate::hop::{DeadLetter, OutRecord, Outcome, PlannedHop};
use rdkafka::message::{Message, OwnedMessage};

/// What dead-lettering a message takes: where it goes, why, and the
/// message's state so far.
pub struct Plan<'a> {
    /// The dead-letter topic.
    pub topic: &'a str,
    /// The route that gives up on the message, or `delay` for the relay.
    pub route: &'a str,
    /// The message's state so far.
    pub envelope: &'a Envelope,
    /// Handler attempts made, this one included (0 when no handler ran).
    pub attempts_made: u32,
    pub reason: Reason,
    pub error: &'a str,
    /// The handler name and version that gave the verdict, when one ran.
    pub handler: Option<(&'a str, &'a str)>,
    /// `hopper-` headers of the message carried over as they are. The delay
    /// relay keeps its scheduling headers, so a fixed record can be
    /// produced to the inbox again.
    pub keep: &'a [&'a str],
}

/// The dead-letter record of `message`, and its outcome. The record has the message's key and payload, its own
/// non-hopper headers, and one fresh set of hopper headers.
pub fn plan(message: &OwnedMessage, dead: Plan<'_>) -> PlannedHop {
    let now = now_ms();
    let headers = headers::next_hop_headers(
        message.headers(),
        dead.envelope,
        &Hop {
            route: dead.route,
            attempts_made: dead.attempts_made,
            reason: Some(dead.reason),
            error: Some(dead.error),
            failed_at: Some(now),
            handler: dead.handler,
            trail_entry: "dlq",
            due_at: None,
            keep: dead.keep,
        },
    );
    let mut record = OutRecord::like(message, dead.topic.to_string(), headers);
    record.timestamp = now;
    PlannedHop {
        record,
        outcome: Outcome::DeadLetter(DeadLetter {
            route: dead.route.to_string(),
            id: dead.envelope.id.clone(),
            attempt: dead.attempts_made,
            topic: dead.topic.to_string(),
            reason: dead.reason,
            error: dead.error.to_string(),
            version: dead.handler.map(|(_, version)| version.to_string()),
        }),
    }
}

/// How much of a payload a dead-letter record keeps when the record was
/// too large: enough to recognise the message; `hopper-payload-size` has
/// its full size.
pub const CUT_PAYLOAD_BYTES: usize = 1024;

/// The dead-letter record of a hop the broker refused for good: the hop's
/// own record (a retry or forward carries the message's full context
/// already), with `hopper-reason`, `hopper-last-error` and
/// `hopper-last-failure-at` replaced, `dlq` added to its trail and its
/// `hopper-due-at` dropped. With [`Reason::RecordTooLarge`] its payload is
/// cut to [`CUT_PAYLOAD_BYTES`] and its full size recorded in
/// `hopper-payload-size`.
pub fn of_failed_hop(record: OutRecord, dlq: &str, reason: Reason, error: &str) -> OutRecord {
    use rdkafka::message::{Header, Headers, OwnedHeaders};
    let now = now_ms();
    let OutRecord {
        key,
        mut payload,
        headers: old,
        ..
    } = record;
    let replaced = [
        headers::REASON,
        headers::LAST_ERROR,
        headers::LAST_FAILURE_AT,
        headers::DUE_AT,
        headers::TRAIL,
        headers::PAYLOAD_SIZE,
    ];
    let mut kept: Vec<(String, Option<Vec<u8>>)> = Vec::with_capacity(old.count() + 5);
    let mut trail = Vec::new();
    let (mut before_reason, mut before_error) = (None, None);
    for header in old.iter() {
        let text = || {
            header
                .value
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        if header.key == headers::REASON {
            before_reason = text();
        } else if header.key == headers::LAST_ERROR {
            before_error = text();
        }
        if header.key == headers::TRAIL {
            let text = header
                .value
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            trail = text
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
        }
        if replaced.contains(&header.key) {
            continue;
        }
        kept.push((header.key.to_string(), header.value.map(<[u8]>::to_vec)));
    }
    if reason == Reason::RecordTooLarge
        && let Some(bytes) = &mut payload
    {
        kept.push((
            headers::PAYLOAD_SIZE.to_string(),
            Some(bytes.len().to_string().into_bytes()),
        ));
        bytes.truncate(CUT_PAYLOAD_BYTES);
    }
    // A retry or dead-letter record says why it was on its way; keep that.
    let error = match (before_reason, before_error) {
        (Some(reason), Some(before)) => format!("{error} (it was sent for {reason}: {before})"),
        (Some(reason), None) => format!("{error} (it was sent for {reason})"),
        _ => error.to_string(),
    };
    let error = headers::shorten(&error, headers::MAX_ERROR_BYTES);
    kept.push((headers::REASON.into(), Some(reason.as_str().into())));
    kept.push((headers::LAST_ERROR.into(), Some(error.into_bytes())));
    kept.push((
        headers::LAST_FAILURE_AT.into(),
        Some(now.to_string().into_bytes()),
    ));
    kept.push((
        headers::TRAIL.into(),
        Some(headers::trail_text(&trail, "dlq").into_bytes()),
    ));
    let mut out = OwnedHeaders::new_with_capacity(kept.len());
    for (key, value) in &kept {
        out = out.insert(Header {
            key,
            value: value.as_deref(),
        });
    }
    OutRecord {
        topic: dlq.to_string(),
        key,
        payload,
        headers: out,
        timestamp: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, Headers, OwnedHeaders};

    fn header<'a>(headers: &'a OwnedHeaders, name: &str) -> Option<&'a [u8]> {
        headers.iter().find(|h| h.key == name).and_then(|h| h.value)
    }

    #[test]
    fn a_refused_hop_is_dead_lettered_with_its_context_and_a_cut_payload() {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "trace",
                value: Some("t-1"),
            })
            .insert(Header {
                key: headers::ID,
                value: Some("m-1"),
            })
            .insert(Header {
                key: headers::REASON,
                value: Some("RETRYABLE"),
            })
            .insert(Header {
                key: headers::TRAIL,
                value: Some("input,retry.5s"),
            })
            .insert(Header {
                key: headers::DUE_AT,
                value: Some("123"),
            });
        let record = OutRecord {
            topic: "orders.retry.5s".into(),
            key: Some(b"k".to_vec()),
            payload: Some(vec![b'x'; 5000]),
            headers,
            timestamp: 1,
        };
        let dead = of_failed_hop(
            record,
            "orders.dlq",
            Reason::RecordTooLarge,
            "producing to `orders.retry.5s` failed: Broker: Message size too large",
        );
        assert_eq!(dead.topic, "orders.dlq");
        assert_eq!(dead.payload.as_ref().unwrap().len(), CUT_PAYLOAD_BYTES);
        let h = &dead.headers;
        assert_eq!(header(h, headers::PAYLOAD_SIZE), Some(&b"5000"[..]));
        assert_eq!(header(h, headers::REASON), Some(&b"RECORD_TOO_LARGE"[..]));
        assert_eq!(header(h, "trace"), Some(&b"t-1"[..]));
        assert_eq!(header(h, headers::ID), Some(&b"m-1"[..]));
        assert_eq!(header(h, headers::DUE_AT), None);
        assert_eq!(header(h, headers::TRAIL), Some(&b"input,retry.5s,dlq"[..]));
        let reasons = h.iter().filter(|x| x.key == headers::REASON).count();
        assert_eq!(reasons, 1, "one hopper-reason, the new one");
    }
}
