//! The `emit` import: records a handler publishes during a call, and the
//! schedules and cancels it sends the delay relay. They are kept with the
//! call and handed to the route with its verdict, which produces them only
//! when the verdict is `ok` (docs/wit.md).

use super::GuestInfo;
use super::bindings::hopper::handler::emit::{EmitError, Outgoing, ScheduleError, Scheduled};
use super::bindings::hopper::handler::types::Header;
use crate::clock::now_ms;
use crate::headers;
use crate::types::EmitKind;
use std::time::Duration;

/// A record a handler emitted, accepted by the route's grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// `<message id>/emit/<index>` for a published record: stable across
    /// redeliveries of the same message, so a consumer can drop the copies
    /// a crash may produce. The handler's own id for a schedule or a
    /// cancel.
    pub id: String,
    /// The granted topic the record is for; for a cancel, the delay
    /// relay's inbox.
    pub topic: String,
    /// For a schedule or a cancel, the id: records of one id share a
    /// partition of the inbox.
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// When to deliver it, epoch ms, through the delay relay's inbox;
    /// `None`: at once (or, for a cancel, never).
    pub deliver_at: Option<i64>,
    /// Which import emitted it.
    pub kind: EmitKind,
}

/// The records of the call in progress.
#[derive(Default)]
pub(super) struct Emits {
    /// Its capacity kept from call to call: a call allocates no id.
    message_id: String,
    records: Vec<Emitted>,
    bytes: u64,
    /// Emits tried this call, refused ones included: each counts against
    /// `emit.max_records`, so a guest looping on a refused emit is cut off.
    attempts: u32,
}

/// Bytes of a topic name, an id or an error kept in a log line; a guest
/// may pass one of any length.
const MAX_LOGGED: usize = 256;

/// Why the host refused a record, whichever import it came through; each
/// import's error type is made from it.
#[derive(Debug)]
enum Refusal {
    TopicNotGranted(String),
    IdNotGranted(String),
    TooManyRecords(u32),
    TooLarge(u64),
    NoDelayRelay,
    Invalid(String),
}

impl From<Refusal> for EmitError {
    fn from(refusal: Refusal) -> EmitError {
        match refusal {
            Refusal::TopicNotGranted(topic) => EmitError::TopicNotGranted(topic),
            Refusal::TooManyRecords(limit) => EmitError::TooManyRecords(limit),
            Refusal::TooLarge(limit) => EmitError::TooLarge(limit),
            Refusal::NoDelayRelay => EmitError::NoDelayRelay,
            Refusal::Invalid(text) => EmitError::Invalid(text),
            // `publish` takes no id; 0.1.1's error has no case for one.
            Refusal::IdNotGranted(id) => EmitError::Invalid(format!("id `{id}` is not granted")),
        }
    }
}

impl From<Refusal> for ScheduleError {
    fn from(refusal: Refusal) -> ScheduleError {
        match refusal {
            Refusal::TopicNotGranted(topic) => ScheduleError::TopicNotGranted(topic),
            Refusal::IdNotGranted(id) => ScheduleError::IdNotGranted(id),
            Refusal::TooManyRecords(limit) => ScheduleError::TooManyRecords(limit),
            Refusal::TooLarge(limit) => ScheduleError::TooLarge(limit),
            Refusal::NoDelayRelay => ScheduleError::NoDelayRelay,
            Refusal::Invalid(text) => ScheduleError::Invalid(text),
        }
    }
}

/// What a refusal is logged with: the topic, the id, or both.
struct Subject<'a> {
    topic: Option<&'a str>,
    id: Option<&'a str>,
}

impl Emits {
    /// Starts a call on message `message_id`; whatever a previous call
    /// left is dropped.
    pub(super) fn begin(&mut self, message_id: &str) {
        self.message_id.clear();
        self.message_id.push_str(message_id);
        self.records.clear();
        self.bytes = 0;
        self.attempts = 0;
    }

    /// The call's records, leaving none behind.
    pub(super) fn take(&mut self) -> Vec<Emitted> {
        self.bytes = 0;
        std::mem::take(&mut self.records)
    }

    /// `publish`: accepts `record` under `guest`'s grants and returns its
    /// id, or says why not.
    pub(super) fn publish(
        &mut self,
        guest: &GuestInfo,
        record: Outgoing,
    ) -> Result<String, EmitError> {
        let topic = record.topic.clone();
        let subject = Subject {
            topic: Some(&topic),
            id: None,
        };
        self.guarded(guest, subject, |emits| emits.accept(guest, record))
    }

    /// `schedule`: accepts a delayed record with the handler's id, or says
    /// why not.
    pub(super) fn schedule(
        &mut self,
        guest: &GuestInfo,
        record: Scheduled,
    ) -> Result<(), ScheduleError> {
        let (topic, id) = (record.topic.clone(), record.id.clone());
        let subject = Subject {
            topic: Some(&topic),
            id: Some(&id),
        };
        self.guarded(guest, subject, |emits| emits.accept_schedule(guest, record))
    }

    /// `cancel`: accepts a cancel of every pending schedule of `id`, or
    /// says why not.
    pub(super) fn cancel(&mut self, guest: &GuestInfo, id: String) -> Result<(), ScheduleError> {
        let logged = id.clone();
        let subject = Subject {
            topic: None,
            id: Some(&logged),
        };
        self.guarded(guest, subject, |emits| emits.accept_cancel(guest, id))
    }

    /// Runs one emit under the call's limit of attempts: every emit,
    /// refused or not, counts against `emit.max_records`. A refusal is
    /// counted, and logged within the handler's log budget with the topic,
    /// the id and the error cut short; the guest sees it as the import's
    /// error.
    fn guarded<T, E: From<Refusal>>(
        &mut self,
        guest: &GuestInfo,
        subject: Subject<'_>,
        accept: impl FnOnce(&mut Emits) -> Result<T, Refusal>,
    ) -> Result<T, E> {
        let max_records = guest.grants.config.emit.max_records;
        self.attempts = self.attempts.saturating_add(1);
        let result = if self.attempts > max_records {
            Err(Refusal::TooManyRecords(max_records))
        } else {
            accept(self)
        };
        result.map_err(|error| {
            guest.grants.emits_refused.inc();
            if guest.budget.take() {
                let secrets = &guest.grants.config.secrets;
                let cut = |text: &str| secrets.redact_within(text, MAX_LOGGED).into_owned();
                let topic = subject.topic.map(cut);
                let schedule = subject.id.map(cut);
                let reason = cut(&format!("{error:?}"));
                tracing::warn!(
                    route = guest.route,
                    handler = guest.handler,
                    version = guest.short_version,
                    id = &*self.message_id,
                    topic,
                    schedule,
                    error = reason,
                    "Emit refused."
                );
            }
            E::from(error)
        })
    }

    fn accept(&mut self, guest: &GuestInfo, record: Outgoing) -> Result<String, Refusal> {
        let grants = &guest.grants.config;
        if !grants.emit_topics.contains(&record.topic) {
            return Err(Refusal::TopicNotGranted(record.topic));
        }
        check_headers(&record.headers)?;
        let deliver_at = match record.delay_ms {
            None => None,
            Some(ms) => Some(deliver_at(guest, ms)?),
        };
        let size = len(&record.key) + len(&record.payload) + headers_len(&record.headers);
        self.fits(guest, size)?;
        let id = format!("{}/emit/{}", self.message_id, self.records.len());
        self.push(
            size,
            Emitted {
                id: id.clone(),
                topic: record.topic,
                key: record.key,
                payload: record.payload,
                headers: own_headers(record.headers),
                deliver_at,
                kind: EmitKind::Publish,
            },
        );
        Ok(id)
    }

    fn accept_schedule(&mut self, guest: &GuestInfo, record: Scheduled) -> Result<(), Refusal> {
        let grants = &guest.grants.config;
        if !grants.emit_topics.contains(&record.topic) {
            return Err(Refusal::TopicNotGranted(record.topic));
        }
        check_id(&record.id)?;
        if record.replace && !grants.cancel_ids.allows(&record.id) {
            return Err(Refusal::IdNotGranted(record.id));
        }
        check_headers(&record.headers)?;
        let deliver_at = deliver_at(guest, record.delay_ms)?;
        // The id is written twice: as the key and as `hopper-id`.
        let size = 2 * record.id.len() + len(&record.payload) + headers_len(&record.headers);
        self.fits(guest, size)?;
        self.push(
            size,
            Emitted {
                key: Some(record.id.clone().into_bytes()),
                id: record.id,
                topic: record.topic,
                payload: record.payload,
                headers: own_headers(record.headers),
                deliver_at: Some(deliver_at),
                kind: EmitKind::Schedule {
                    replace: record.replace,
                },
            },
        );
        Ok(())
    }

    fn accept_cancel(&mut self, guest: &GuestInfo, id: String) -> Result<(), Refusal> {
        let grants = &guest.grants.config;
        check_id(&id)?;
        if !grants.cancel_ids.allows(&id) {
            return Err(Refusal::IdNotGranted(id));
        }
        let Some(relay) = &grants.delay else {
            return Err(Refusal::NoDelayRelay);
        };
        let size = 2 * id.len();
        self.fits(guest, size)?;
        self.push(
            size,
            Emitted {
                key: Some(id.clone().into_bytes()),
                id,
                topic: relay.inbox.clone(),
                payload: None,
                headers: Vec::new(),
                deliver_at: None,
                kind: EmitKind::Cancel,
            },
        );
        Ok(())
    }

    /// Whether one more record of `size` bytes fits the call's limits.
    fn fits(&self, guest: &GuestInfo, size: usize) -> Result<(), Refusal> {
        let limits = guest.grants.config.emit;
        if self.records.len() >= limits.max_records as usize {
            return Err(Refusal::TooManyRecords(limits.max_records));
        }
        if self.bytes + size as u64 > limits.max_bytes {
            return Err(Refusal::TooLarge(limits.max_bytes));
        }
        Ok(())
    }

    fn push(&mut self, size: usize, record: Emitted) {
        self.bytes += size as u64;
        self.records.push(record);
    }
}

/// The deliver-at of a record delayed `ms` from now, when the route has a
/// delay relay whose `max_delay` allows it.
fn deliver_at(guest: &GuestInfo, ms: u64) -> Result<i64, Refusal> {
    let Some(relay) = &guest.grants.config.delay else {
        return Err(Refusal::NoDelayRelay);
    };
    let delay = Duration::from_millis(ms);
    if delay > relay.max_delay {
        return Err(Refusal::Invalid(format!(
            "a delay of {ms} ms is longer than the delay relay's max_delay of {}",
            humantime::format_duration(relay.max_delay)
        )));
    }
    Ok(now_ms().saturating_add(ms.min(i64::MAX as u64) as i64))
}

/// A handler's id for a schedule or a cancel: what the relay accepts as a
/// `hopper-id`, 1 to [`headers::MAX_ID_BYTES`] bytes. (A string is UTF-8:
/// the canonical ABI traps a guest that passes anything else.)
fn check_id(id: &str) -> Result<(), Refusal> {
    if id.is_empty() || id.len() > headers::MAX_ID_BYTES {
        return Err(Refusal::Invalid(format!(
            "an id must be 1 to {} bytes, not {}",
            headers::MAX_ID_BYTES,
            id.len()
        )));
    }
    Ok(())
}

/// Refuses a header in hopper's namespace: hopper writes those.
fn check_headers(own: &[Header]) -> Result<(), Refusal> {
    match own.iter().find(|h| headers::is_hoppers(&h.key)) {
        Some(header) => Err(Refusal::Invalid(format!(
            "header `{}` starts with `{}`, which is hopper's own",
            header.key,
            headers::PREFIX
        ))),
        None => Ok(()),
    }
}

fn len(bytes: &Option<Vec<u8>>) -> usize {
    bytes.as_ref().map_or(0, Vec::len)
}

fn headers_len(own: &[Header]) -> usize {
    own.iter().map(|h| h.key.len() + h.value.len()).sum()
}

fn own_headers(own: Vec<Header>) -> Vec<(String, Vec<u8>)> {
    own.into_iter().map(|h| (h.key, h.value)).collect()
}
