//! Dead-lettering: every record hopper writes to a dead-letter topic is
//! built here, by routes and by the delay relay alike, so every DLQ record
//! carries the same context headers (docs/headers.md). Reading them back
//! ([`browse`]) and replaying them ([`replay`]) live beside it.

pub mod browse;
pub mod record;
pub mod replay;

pub use browse::{Dlq, DlqError, DlqFilter, DlqPage};
pub use record::{DlqRecord, DlqSummary, RecordRef};
pub use replay::{Pacer, Report as ReplayReport};

use crate::clock::now_ms;
use crate::events::Event;
use crate::headers::{self, Envelope, Hop, Reason};
use crate::hop::{OutRecord, PlannedHop};
use rdkafka::message::{Message, OwnedMessage};

/// Why and where a message is dead-lettered.
pub struct DeadLetter<'a> {
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

/// The dead-letter record of `message`, and the event that reports it once
/// acknowledged. The record has the message's key and payload, its own
/// non-hopper headers, and one fresh set of hopper headers.
pub fn plan(message: &OwnedMessage, dead: DeadLetter<'_>) -> PlannedHop {
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
        event: Some(Event::DeadLettered {
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
