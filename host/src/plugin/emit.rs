//! The `emit` import: records a handler publishes during a call. They are
//! kept with the call and handed to the route with its verdict, which
//! produces them only when the verdict is `ok` (docs/wit.md).

use super::GuestInfo;
use super::bindings::hopper::handler::emit::{EmitError, Outgoing};
use crate::clock::now_ms;
use crate::headers;
use std::sync::Arc;
use std::time::Duration;

/// A record a handler emitted, accepted by the route's grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// `<message id>/emit/<index>`: stable across redeliveries of the same
    /// message, so a consumer can drop the copies a crash may produce.
    pub id: String,
    /// The granted topic the record is for.
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// When to deliver it, epoch ms, through the delay relay's inbox;
    /// `None`: at once.
    pub deliver_at: Option<i64>,
}

/// The records of the call in progress.
#[derive(Default)]
pub(super) struct Emits {
    message_id: Arc<str>,
    records: Vec<Emitted>,
    bytes: u64,
    /// Emits tried this call, refused ones included: each counts against
    /// `emit.max_records`, so a guest looping on a refused emit is cut off.
    attempts: u32,
}

/// Bytes of a topic name or an error kept in a log line; a guest may name
/// a topic of any length.
const MAX_LOGGED: usize = 256;

impl Emits {
    /// Starts a call on message `message_id`; whatever a previous call
    /// left is dropped.
    pub(super) fn begin(&mut self, message_id: Arc<str>) {
        self.message_id = message_id;
        self.records.clear();
        self.bytes = 0;
        self.attempts = 0;
    }

    /// The call's records, leaving none behind.
    pub(super) fn take(&mut self) -> Vec<Emitted> {
        self.bytes = 0;
        std::mem::take(&mut self.records)
    }

    /// Accepts `record` under `guest`'s grants, or says why not. Every
    /// emit, refused or not, counts against `emit.max_records`. A refusal
    /// is counted, and logged within the handler's log budget with the
    /// topic and error cut short; the guest sees it as the import's error.
    pub(super) fn publish(
        &mut self,
        guest: &GuestInfo,
        record: Outgoing,
    ) -> Result<String, EmitError> {
        let max_records = guest.grants.config.emit.max_records;
        self.attempts = self.attempts.saturating_add(1);
        let result = if self.attempts > max_records {
            Err((EmitError::TooManyRecords(max_records), record.topic))
        } else {
            let topic = record.topic.clone();
            self.accept(guest, record).map_err(|e| (e, topic))
        };
        result.map_err(|(error, topic)| {
            guest.grants.counters.emits_refused.inc();
            if guest.budget.take() {
                let secrets = &guest.grants.config.secrets;
                let topic = headers::shorten(&secrets.redact(&topic), MAX_LOGGED);
                let error = headers::shorten(&secrets.redact(&format!("{error:?}")), MAX_LOGGED);
                tracing::warn!(
                    route = guest.route,
                    handler = guest.handler,
                    version = guest.short_version,
                    id = &*self.message_id,
                    topic,
                    error,
                    "Emit refused."
                );
            }
            error
        })
    }

    fn accept(&mut self, guest: &GuestInfo, record: Outgoing) -> Result<String, EmitError> {
        let grants = &guest.grants.config;
        if !grants.emit_topics.contains(&record.topic) {
            return Err(EmitError::TopicNotGranted(record.topic));
        }
        if let Some(header) = record.headers.iter().find(|h| headers::is_hoppers(&h.key)) {
            return Err(EmitError::Invalid(format!(
                "header `{}` starts with `{}`, which is hopper's own",
                header.key,
                headers::PREFIX
            )));
        }
        let deliver_at = match record.delay_ms {
            None => None,
            Some(ms) => {
                let Some(relay) = &grants.delay else {
                    return Err(EmitError::NoDelayRelay);
                };
                let delay = Duration::from_millis(ms);
                if delay > relay.max_delay {
                    return Err(EmitError::Invalid(format!(
                        "a delay of {ms} ms is longer than the delay relay's max_delay of {}",
                        humantime::format_duration(relay.max_delay)
                    )));
                }
                Some(now_ms().saturating_add(ms.min(i64::MAX as u64) as i64))
            }
        };
        let limits = grants.emit;
        if self.records.len() >= limits.max_records as usize {
            return Err(EmitError::TooManyRecords(limits.max_records));
        }
        let size = record.key.as_ref().map_or(0, Vec::len)
            + record.payload.as_ref().map_or(0, Vec::len)
            + record
                .headers
                .iter()
                .map(|h| h.key.len() + h.value.len())
                .sum::<usize>();
        if self.bytes + size as u64 > limits.max_bytes {
            return Err(EmitError::TooLarge(limits.max_bytes));
        }
        self.bytes += size as u64;
        let id = format!("{}/emit/{}", self.message_id, self.records.len());
        self.records.push(Emitted {
            id: id.clone(),
            topic: record.topic,
            key: record.key,
            payload: record.payload,
            headers: record
                .headers
                .into_iter()
                .map(|h| (h.key, h.value))
                .collect(),
            deliver_at,
        });
        Ok(id)
    }
}
