//! The header contract: what hopper reads from and writes onto records.
//!
//! Every value is UTF-8 text; times are epoch milliseconds. Each hop
//! *replaces* the `hopper-` headers instead of appending to them, so a record
//! that went through ten retries carries one set, not ten. The full list is in
//! docs/headers.md.

use crate::traceparent;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use std::fmt;

/// The prefix of every header hopper owns.
pub const PREFIX: &str = "hopper-";

/// The prefix of the headers that mark a record of one of hopper's own
/// tables (the park topic's `hopper-park-by`). No record hopper forwards
/// for a producer carries one: the relay drops them ([`rewrite`]), a route's
/// hops keep no `hopper-` header they did not write, and an emit may not
/// set any.
pub const TABLE_PREFIX: &str = "hopper-park-";

/// Whether a header name is in hopper's namespace: it starts with
/// [`PREFIX`] in any case. Compares bytes, so any name, including one whose
/// seventh byte falls inside a multi-byte character, gets an answer.
pub fn is_hoppers(name: &str) -> bool {
    starts_with_ignore_case(name, PREFIX)
}

/// Whether `name` starts with `prefix` in any ASCII case, by bytes.
fn starts_with_ignore_case(name: &str, prefix: &str) -> bool {
    name.as_bytes()
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
}

pub const ID: &str = "hopper-id";
pub const ATTEMPT: &str = "hopper-attempt";
pub const ROUTE: &str = "hopper-route";
pub const ORIGIN_TOPIC: &str = "hopper-origin-topic";
pub const ORIGIN_PARTITION: &str = "hopper-origin-partition";
pub const ORIGIN_OFFSET: &str = "hopper-origin-offset";
pub const ORIGIN_TIMESTAMP: &str = "hopper-origin-timestamp";
pub const FIRST_FAILURE_AT: &str = "hopper-first-failure-at";
pub const LAST_FAILURE_AT: &str = "hopper-last-failure-at";
pub const LAST_ERROR: &str = "hopper-last-error";
pub const REASON: &str = "hopper-reason";
pub const HANDLER: &str = "hopper-handler";
pub const HANDLER_VERSION: &str = "hopper-handler-version";
pub const TRAIL: &str = "hopper-trail";
/// The full size in bytes of a payload cut to fit a dead-letter record.
pub const PAYLOAD_SIZE: &str = "hopper-payload-size";
pub const DUE_AT: &str = "hopper-due-at";
/// Delay relay: the topic a delayed message goes to.
pub const TARGET: &str = "hopper-target";
/// Delay relay: when to deliver, epoch ms (or RFC 3339).
pub const DELIVER_AT: &str = "hopper-deliver-at";
/// Delay relay: how long to wait, humantime, instead of `hopper-deliver-at`.
pub const DELAY: &str = "hopper-delay";
/// Delay relay: `true` cancels every pending schedule of the record's
/// `hopper-id` read before it (docs/headers.md).
pub const CANCEL: &str = "hopper-cancel";
/// Delay relay: `true` on a schedule cancels the earlier schedules of its
/// `hopper-id`, and the record takes their place.
pub const REPLACE: &str = "hopper-replace";
/// Delay relay, on tier records: where the inbox read the schedule,
/// `<partition>:<offset>`; what a cancel is compared against.
pub const INBOX_POSITION: &str = "hopper-inbox-position";
/// On a cancellation-topic entry: `cancel` or `replace`.
pub const CANCEL_KIND: &str = "hopper-cancel-kind";
/// On a cancellation-topic entry: the relay process that read the cancel
/// from the inbox (a random id per process), which counts it unmatched
/// when it expires having cancelled nothing there.
pub const CANCEL_BY: &str = "hopper-cancel-by";
/// How many times the message was replayed from a dead-letter topic. Its
/// presence on an input record marks a replay: the id, origin and trail are
/// kept, and attempts start over.
pub const REPLAY_COUNT: &str = "hopper-replay-count";
/// On a replayed record: the dead-letter record it was replayed from,
/// `topic:partition:offset`.
pub const REPLAYED_FROM: &str = "hopper-replayed-from";
/// On a `KEY_BLOCKED` dead letter: the `hopper-id` of the message whose
/// dead-lettering blocked the key.
pub const BLOCKED_BY: &str = "hopper-blocked-by";

/// `hopper-last-error` is cut to this many bytes (on a character boundary),
/// with `…` appended when cut.
pub const MAX_ERROR_BYTES: usize = 1024;
/// `hopper-trail` keeps this many most recent hops; older ones fold into a
/// leading `+N` count.
pub const MAX_TRAIL_HOPS: usize = 12;
/// Longest accepted `hopper-id`.
pub const MAX_ID_BYTES: usize = 256;

/// Why a record left the normal path. Written as `hopper-reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The handler returned `retryable` (retry records only).
    Retryable,
    /// The handler returned `fatal`.
    Fatal,
    /// The handler asked for a retry on the last allowed attempt.
    RetriesExhausted,
    /// The handler trapped (panic, `unreachable`, stack overflow, ...).
    HandlerTrap,
    /// The handler ran past the route's wall-clock limit.
    HandlerTimeout,
    /// The handler tried to grow its memory past the route's cap.
    HandlerMemory,
    /// Hopper's own headers on the record are missing or malformed.
    InvalidEnvelope,
    /// No handler could be loaded for the route.
    NoHandler,
    /// A delayed message asked for a time beyond the maximum delay.
    DelayTooLong,
    /// A replayed message came back to the dead-letter topic again.
    ReplayLoop,
    /// The broker refused the message's next hop for good (its topic is
    /// gone, hopper may not write to it, the producer failed fatally);
    /// `hopper-last-error` names the topic and the broker's error.
    HopFailed,
    /// The message's next hop was larger than the broker accepts once
    /// hopper's headers were added. Its payload is cut; its full size is in
    /// `hopper-payload-size`.
    RecordTooLarge,
    /// A delayed message's `hopper-target` is one of hopper's own topics, or
    /// not in the delay relay's `targets`.
    InvalidTarget,
    /// The consumer could not decode the batch that held these offsets (a
    /// corrupt batch, or a codec this build lacks), and an operator skipped
    /// it (`hopper skip`). The record has no key or payload: none could be
    /// read. `hopper-last-error` names the offsets skipped.
    Undecodable,
    /// A cancel or replace of an id the delay relay's cancellation table
    /// does not hold, read while the table held `[delay]
    /// max_cancellations` entries: nothing of it was applied.
    CancelTableFull,
    /// The message's key is blocked: an earlier message of the key was
    /// dead-lettered while it parked the key, on a route with
    /// `on_key_dead_letter = "dead-letter-key"`, and no operator has
    /// released the key yet. `hopper-blocked-by` names that message.
    KeyBlocked,
    /// The message's key held its share of the route's parked messages
    /// (`max_parked_key_mib`): it did not wait behind the key's head. Its
    /// handler was not called.
    KeyParkFull,
}

impl Reason {
    pub const ALL: [Reason; 17] = [
        Reason::Retryable,
        Reason::Fatal,
        Reason::RetriesExhausted,
        Reason::HandlerTrap,
        Reason::HandlerTimeout,
        Reason::HandlerMemory,
        Reason::InvalidEnvelope,
        Reason::NoHandler,
        Reason::DelayTooLong,
        Reason::ReplayLoop,
        Reason::HopFailed,
        Reason::RecordTooLarge,
        Reason::InvalidTarget,
        Reason::Undecodable,
        Reason::CancelTableFull,
        Reason::KeyBlocked,
        Reason::KeyParkFull,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Retryable => "RETRYABLE",
            Reason::Fatal => "FATAL",
            Reason::RetriesExhausted => "RETRIES_EXHAUSTED",
            Reason::HandlerTrap => "HANDLER_TRAP",
            Reason::HandlerTimeout => "HANDLER_TIMEOUT",
            Reason::HandlerMemory => "HANDLER_MEMORY",
            Reason::InvalidEnvelope => "INVALID_ENVELOPE",
            Reason::NoHandler => "NO_HANDLER",
            Reason::DelayTooLong => "DELAY_TOO_LONG",
            Reason::ReplayLoop => "REPLAY_LOOP",
            Reason::HopFailed => "HOP_FAILED",
            Reason::RecordTooLarge => "RECORD_TOO_LARGE",
            Reason::InvalidTarget => "INVALID_TARGET",
            Reason::Undecodable => "UNDECODABLE",
            Reason::CancelTableFull => "CANCEL_TABLE_FULL",
            Reason::KeyBlocked => "KEY_BLOCKED",
            Reason::KeyParkFull => "KEY_PARK_FULL",
        }
    }

    pub fn parse(text: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

/// Written as its header value, `FATAL`.
impl serde::Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A header that is present but unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header {name}: {problem}")]
pub struct HeaderError {
    pub name: &'static str,
    pub problem: String,
}

/// Where a message first entered hopper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
}

/// Hopper's state for one message, carried from hop to hop in headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub id: String,
    /// Handler attempts already made before this delivery. Below
    /// `u32::MAX` in every envelope read from a record, so the attempt
    /// number of this delivery (`attempts_made + 1`) cannot overflow.
    pub attempts_made: u32,
    pub origin: Origin,
    pub first_failure_at: Option<i64>,
    pub trail: Vec<String>,
    /// Times the message was replayed from a dead-letter topic.
    pub replays: u32,
    /// The trace the record belongs to and this hop's span: every record
    /// written from this envelope carries it as its one `traceparent`.
    pub trace: traceparent::Context,
}

/// The record being read, as far as the envelope cares.
pub struct Incoming<'a, H: Headers> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub headers: Option<&'a H>,
}

impl Envelope {
    /// The envelope of a record read from a route's input topic: the record
    /// itself is the origin and this is attempt 1. Only `hopper-id` is
    /// honoured, so a producer can choose the id; except on a replay (it has
    /// `hopper-replay-count`), which keeps its id, origin and trail.
    pub fn from_input<H: Headers>(rec: &Incoming<'_, H>) -> Result<Envelope, HeaderError> {
        let h = rec.headers;
        if let Some(replays) = optional_number(h, REPLAY_COUNT)? {
            return Ok(Envelope {
                id: check_id(required(h, ID)?)?,
                attempts_made: 0,
                origin: origin(h)?,
                first_failure_at: None,
                trail: trail(h)?,
                replays,
                trace: traceparent::Context::continue_from(h),
            });
        }
        let id = match text(rec.headers, ID)? {
            Some(id) => check_id(id)?,
            None => default_id(rec.topic, rec.partition, rec.offset),
        };
        Ok(Envelope::first(rec, id, 0))
    }

    /// Attempt 0 of the record `rec`, its own origin, with `id`.
    fn first<H: Headers>(rec: &Incoming<'_, H>, id: String, replays: u32) -> Envelope {
        Envelope {
            id,
            attempts_made: 0,
            origin: Origin {
                topic: rec.topic.to_string(),
                partition: rec.partition,
                offset: rec.offset,
                timestamp: rec.timestamp,
            },
            first_failure_at: None,
            trail: Vec::new(),
            replays,
            trace: traceparent::Context::continue_from(rec.headers),
        }
    }

    /// The envelope for the dead-letter record of a message whose own
    /// envelope or schedule could not be read: attempt 0, the message
    /// itself as the origin, and its replay count. The id is the one rule
    /// for a producer's `hopper-id` that hopper could not accept: kept when
    /// it is text, cut to [`MAX_ID_BYTES`] (ending in `…`) when longer, so
    /// the record can still be matched to what was sent; the default
    /// `<topic>-<partition>-<offset>` when it is absent, empty or not UTF-8.
    /// Routes and the delay relay both build it here.
    pub fn fallback<H: Headers>(rec: &Incoming<'_, H>) -> Envelope {
        let id = match text(rec.headers, ID) {
            Ok(Some(id)) if !id.is_empty() => shorten(id, MAX_ID_BYTES),
            _ => default_id(rec.topic, rec.partition, rec.offset),
        };
        Envelope::first(rec, id, replay_count(rec.headers))
    }

    /// The envelope of a record that hopper itself wrote onto a tier topic.
    /// Every field must be present and well-formed.
    pub fn from_tier<H: Headers>(rec: &Incoming<'_, H>) -> Result<Envelope, HeaderError> {
        let h = rec.headers;
        let id = check_id(required(h, ID)?)?;
        let attempts_made: u32 = number(h, ATTEMPT)?;
        if attempts_made.checked_add(1).is_none() {
            return Err(HeaderError {
                name: ATTEMPT,
                problem: format!("`{attempts_made}` is too large: there is no attempt after it"),
            });
        }
        Ok(Envelope {
            id,
            attempts_made,
            origin: origin(h)?,
            first_failure_at: optional_number(h, FIRST_FAILURE_AT)?,
            trail: trail(h)?,
            replays: replay_count(h),
            trace: traceparent::Context::continue_from(h),
        })
    }
}

fn origin<H: Headers>(h: Option<&H>) -> Result<Origin, HeaderError> {
    Ok(Origin {
        topic: required(h, ORIGIN_TOPIC)?.to_string(),
        partition: number(h, ORIGIN_PARTITION)?,
        offset: number(h, ORIGIN_OFFSET)?,
        timestamp: optional_number(h, ORIGIN_TIMESTAMP)?,
    })
}

/// `hopper-replay-count` of a record; 0 when absent or unreadable.
pub fn replay_count<H: Headers>(headers: Option<&H>) -> u32 {
    optional_number(headers, REPLAY_COUNT)
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// The id of a message that arrived without `hopper-id`:
/// `<topic>-<partition>-<offset>`. Built without `core::fmt`: every such
/// message gets one.
pub fn default_id(topic: &str, partition: i32, offset: i64) -> String {
    let (mut p, mut o) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (partition, offset) = (p.format(partition), o.format(offset));
    let mut id = String::with_capacity(topic.len() + partition.len() + offset.len() + 2);
    for part in [topic, "-", partition, "-", offset] {
        id.push_str(part);
    }
    id
}

fn check_id(id: &str) -> Result<String, HeaderError> {
    if id.is_empty() {
        return Err(HeaderError {
            name: ID,
            problem: "is empty".into(),
        });
    }
    if id.len() > MAX_ID_BYTES {
        return Err(HeaderError {
            name: ID,
            problem: format!("is {} bytes; the limit is {MAX_ID_BYTES}", id.len()),
        });
    }
    Ok(id.to_string())
}

/// The value of the *last* header called `name`, as UTF-8.
pub fn text<'a, H: Headers>(
    headers: Option<&'a H>,
    name: &'static str,
) -> Result<Option<&'a str>, HeaderError> {
    let Some(headers) = headers else {
        return Ok(None);
    };
    let mut found = None;
    for header in headers.iter() {
        if header.key == name {
            found = Some(header.value);
        }
    }
    match found {
        None => Ok(None),
        Some(None) => Err(HeaderError {
            name,
            problem: "has a null value".into(),
        }),
        Some(Some(bytes)) => std::str::from_utf8(bytes)
            .map(|s| Some(s.trim()))
            .map_err(|_| HeaderError {
                name,
                problem: "is not UTF-8 text".into(),
            }),
    }
}

fn required<'a, H: Headers>(
    headers: Option<&'a H>,
    name: &'static str,
) -> Result<&'a str, HeaderError> {
    text(headers, name)?.ok_or(HeaderError {
        name,
        problem: "is missing".into(),
    })
}

fn number<T: std::str::FromStr, H: Headers>(
    headers: Option<&H>,
    name: &'static str,
) -> Result<T, HeaderError> {
    let value = required(headers, name)?;
    value.parse().map_err(|_| HeaderError {
        name,
        problem: format!("`{}` is not a valid number", shorten(value, 64)),
    })
}

fn optional_number<T: std::str::FromStr, H: Headers>(
    headers: Option<&H>,
    name: &'static str,
) -> Result<Option<T>, HeaderError> {
    match text(headers, name)? {
        None => Ok(None),
        Some(value) => value.parse().map(Some).map_err(|_| HeaderError {
            name,
            problem: format!("`{}` is not a valid number", shorten(value, 64)),
        }),
    }
}

/// `hopper-trail`, checked: its `+N` counts of folded hops must add up
/// to a number, so that appending a hop cannot overflow.
fn trail<H: Headers>(h: Option<&H>) -> Result<Vec<String>, HeaderError> {
    let Some(text) = text(h, TRAIL)? else {
        return Ok(Vec::new());
    };
    let trail = parse_trail(text);
    let mut folded: u64 = 0;
    for entry in &trail {
        // The same reading as `push_trail`'s: anything else is a hop name.
        let Some(count) = entry.strip_prefix('+').and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        folded = folded.checked_add(count).ok_or_else(|| HeaderError {
            name: TRAIL,
            problem: format!(
                "the folded hop counts add up to more than {} (at `{}`)",
                u64::MAX,
                shorten(entry, 64)
            ),
        })?;
    }
    Ok(trail)
}

fn parse_trail(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// A trail with one more hop, as its header value: the oldest hops are
/// folded into a leading `+N` count so the header stays bounded however many
/// hops a message makes. The count saturates at `u64::MAX` (a trail read
/// from a record is checked against that already). Written straight into
/// one string: every hop of every message builds one.
pub fn trail_text(trail: &[String], hop: &str) -> String {
    let fold = |entry: &str| entry.strip_prefix('+').and_then(|n| n.parse::<u64>().ok());
    let mut folded: u64 = 0;
    let mut hops = 1usize;
    for entry in trail {
        match fold(entry) {
            Some(n) => folded = folded.saturating_add(n),
            None => hops += 1,
        }
    }
    let excess = hops.saturating_sub(MAX_TRAIL_HOPS - 1);
    folded = folded.saturating_add(excess as u64);
    let mut out =
        String::with_capacity(trail.iter().map(|e| e.len() + 1).sum::<usize>() + hop.len() + 22);
    if folded > 0 {
        out.push('+');
        out.push_str(itoa::Buffer::new().format(folded));
        out.push(',');
    }
    for entry in trail.iter().filter(|e| fold(e).is_none()).skip(excess) {
        out.push_str(entry);
        out.push(',');
    }
    out.push_str(hop);
    out
}

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut.
pub fn shorten(text: &str, max: usize) -> String {
    cut(text, max).into_owned()
}

/// [`shorten`], borrowing `text` when it fits.
pub fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…", &text[..end]))
}

/// What the next hop's record says about the handler and the failure.
pub struct Hop<'a> {
    pub route: &'a str,
    pub attempts_made: u32,
    pub reason: Option<Reason>,
    pub error: Option<&'a str>,
    pub failed_at: Option<i64>,
    pub handler: Option<(&'a str, &'a str)>,
    /// Trail entry for this hop, such as `retry.5s` or `dlq`.
    pub trail_entry: &'a str,
    pub due_at: Option<i64>,
    /// `hopper-` headers of the record to carry over unchanged.
    pub keep: &'a [&'a str],
}

/// The headers of the next hop: the record's own non-hopper headers (and
/// those of its hopper headers that `hop.keep` names), in order, followed by
/// one fresh set of hopper headers.
pub fn next_hop_headers<H: Headers>(
    original: Option<&H>,
    envelope: &Envelope,
    hop: &Hop<'_>,
) -> OwnedHeaders {
    let kept = original.map_or(0, |h| h.count());
    let mut out = HeaderWriter::new(kept + 17);
    out.own_headers(original, &envelope.trace, hop.keep);
    out.text(ID, &envelope.id);
    out.number(ATTEMPT, hop.attempts_made);
    out.text(ROUTE, hop.route);
    out.text(ORIGIN_TOPIC, &envelope.origin.topic);
    out.number(ORIGIN_PARTITION, envelope.origin.partition);
    out.number(ORIGIN_OFFSET, envelope.origin.offset);
    if let Some(ts) = envelope.origin.timestamp {
        out.number(ORIGIN_TIMESTAMP, ts);
    }
    if let Some(failed_at) = hop.failed_at {
        out.number(
            FIRST_FAILURE_AT,
            envelope.first_failure_at.unwrap_or(failed_at),
        );
        out.number(LAST_FAILURE_AT, failed_at);
    }
    if let Some(error) = hop.error {
        out.text(LAST_ERROR, &cut(error, MAX_ERROR_BYTES));
    }
    if let Some(reason) = hop.reason {
        out.text(REASON, reason.as_str());
    }
    if let Some((name, version)) = hop.handler {
        out.text(HANDLER, name);
        out.text(HANDLER_VERSION, version);
    }
    out.text(TRAIL, &trail_text(&envelope.trail, hop.trail_entry));
    if envelope.replays > 0 {
        out.number(REPLAY_COUNT, envelope.replays);
    }
    if let Some(due) = hop.due_at {
        out.number(DUE_AT, due);
    }
    out.finish()
}

/// The headers of a dead-letter record replayed to its input: its own
/// non-hopper headers (and the hopper headers `keep` names), then its id,
/// origin and trail with `replay` added, `replays` as `hopper-replay-count`
/// and where it came from. Attempts, failure times, reason and error are
/// dropped: the replay starts over.
pub fn replay_headers<H: Headers>(
    original: Option<&H>,
    envelope: &Envelope,
    replays: u32,
    replayed_from: &str,
    keep: &[&str],
) -> OwnedHeaders {
    let kept = original.map_or(0, |h| h.count());
    let mut out = HeaderWriter::new(kept + 9);
    out.own_headers(original, &envelope.trace, keep);
    out.text(ID, &envelope.id);
    out.text(ORIGIN_TOPIC, &envelope.origin.topic);
    out.number(ORIGIN_PARTITION, envelope.origin.partition);
    out.number(ORIGIN_OFFSET, envelope.origin.offset);
    if let Some(ts) = envelope.origin.timestamp {
        out.number(ORIGIN_TIMESTAMP, ts);
    }
    out.text(TRAIL, &trail_text(&envelope.trail, "replay"));
    out.number(REPLAY_COUNT, replays);
    out.text(REPLAYED_FROM, replayed_from);
    out.finish()
}

/// Builds a record's headers, formatting numbers on the stack.
struct HeaderWriter {
    // `OwnedHeaders::insert` takes and returns the headers; `None` only
    // while an insert runs.
    headers: Option<OwnedHeaders>,
}

impl HeaderWriter {
    fn new(capacity: usize) -> Self {
        Self {
            headers: Some(OwnedHeaders::new_with_capacity(capacity)),
        }
    }

    fn raw(&mut self, key: &str, value: Option<&[u8]>) {
        let headers = self
            .headers
            .take()
            .expect("headers are put back after each insert");
        self.headers = Some(headers.insert(Header { key, value }));
    }

    /// The record's own headers, in order: every non-hopper header and
    /// the hopper headers `keep` names, then one `traceparent` for `trace`
    /// in place of any it had (its `tracestate` is kept only when the
    /// trace continues).
    fn own_headers<H: Headers>(
        &mut self,
        original: Option<&H>,
        trace: &traceparent::Context,
        keep: &[&str],
    ) {
        if let Some(original) = original {
            for header in original.iter() {
                if traceparent::is_trace_header(header.key) {
                    if trace.continued() && header.key.eq_ignore_ascii_case(traceparent::TRACESTATE)
                    {
                        self.raw(header.key, header.value);
                    }
                } else if !header.key.starts_with(PREFIX) || keep.contains(&header.key) {
                    self.raw(header.key, header.value);
                }
            }
        }
        self.raw(traceparent::TRACEPARENT, Some(&trace.traceparent()));
    }

    fn text(&mut self, key: &str, value: &str) {
        self.raw(key, Some(value.as_bytes()));
    }

    fn number(&mut self, key: &str, value: impl itoa::Integer) {
        let mut digits = itoa::Buffer::new();
        self.text(key, digits.format(value));
    }

    fn finish(self) -> OwnedHeaders {
        self.headers
            .expect("headers are put back after each insert")
    }
}

/// `original`'s headers without those named in `drop` and those of
/// hopper's tables ([`TABLE_PREFIX`]), in order, then one `traceparent` for
/// `trace` in place of any it had (its `tracestate` kept only when the trace
/// continues), followed by `add`. How the delay relay replaces its own
/// headers on each hop.
pub fn rewrite<H: Headers>(
    original: Option<&H>,
    drop: &[&str],
    add: &[(&str, String)],
    trace: &traceparent::Context,
) -> OwnedHeaders {
    let kept = original.map_or(0, |h| h.count());
    let mut out = HeaderWriter::new(kept + add.len() + 1);
    if let Some(original) = original {
        for header in original.iter() {
            let replaced = add.iter().any(|(k, _)| *k == header.key);
            if traceparent::is_trace_header(header.key) {
                if trace.continued() && header.key.eq_ignore_ascii_case(traceparent::TRACESTATE) {
                    out.raw(header.key, header.value);
                }
            } else if !replaced
                && !drop.contains(&header.key)
                && !starts_with_ignore_case(header.key, TABLE_PREFIX)
            {
                out.raw(header.key, header.value);
            }
        }
    }
    out.raw(traceparent::TRACEPARENT, Some(&trace.traceparent()));
    for (key, value) in add {
        out.text(key, value);
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_id_is_topic_partition_offset_at_every_extreme() {
        for (topic, partition, offset) in [
            ("orders", 0, 0),
            ("orders", 3, 1_234),
            ("a-b", i32::MAX, i64::MAX),
            ("", i32::MIN, i64::MIN),
            ("ünïcode.topic_1", -1, -1),
        ] {
            assert_eq!(
                default_id(topic, partition, offset),
                format!("{topic}-{partition}-{offset}")
            );
        }
    }

    #[test]
    fn trail_stays_bounded() {
        let mut text = String::new();
        for i in 0..40 {
            // Each hop reads the trail its record carries.
            text = trail_text(&parse_trail(&text), &format!("retry.{i}s"));
            let trail = parse_trail(&text);
            assert!(trail.len() <= MAX_TRAIL_HOPS, "{text}");
            if i < MAX_TRAIL_HOPS - 1 {
                assert_eq!(trail.len(), i + 1, "nothing folded yet: {text}");
            }
        }
        let trail = parse_trail(&text);
        assert_eq!(trail.len(), MAX_TRAIL_HOPS);
        assert_eq!(trail[0], "+29");
        assert_eq!(trail[1], "retry.29s");
        assert_eq!(trail.last().unwrap(), "retry.39s");
    }

    #[test]
    fn a_trail_adds_its_fold_counts_and_keeps_its_order() {
        let trail: Vec<String> = ["+3", "retry.5s", "+2", "delay"].map(String::from).to_vec();
        assert_eq!(trail_text(&trail, "dlq"), "+5,retry.5s,delay,dlq");
        assert_eq!(trail_text(&[], "dlq"), "dlq");
        let full: Vec<String> = (0..11).map(|i| format!("h{i}")).collect();
        assert_eq!(
            trail_text(&full, "dlq"),
            "+1,h1,h2,h3,h4,h5,h6,h7,h8,h9,h10,dlq"
        );
        let saturated = vec![format!("+{}", u64::MAX), "x".to_string()];
        assert_eq!(
            trail_text(&saturated, "dlq"),
            format!("+{},x,dlq", u64::MAX)
        );
    }

    /// Regression: emit sliced a header name at byte 7, which panicked the
    /// host when that byte fell inside a multi-byte character.
    #[test]
    fn any_header_name_is_in_or_out_of_hoppers_namespace() {
        assert!(is_hoppers("hopper-id"));
        assert!(is_hoppers("HOPPER-Route"));
        assert!(!is_hoppers("abcdefé"));
        assert!(!is_hoppers("hoppeŕ-x"));
        assert!(!is_hoppers("hopper"));
        assert!(!is_hoppers(""));
        assert!(!is_hoppers("x-hopper-id"));
    }

    #[test]
    fn shorten_respects_char_boundaries() {
        let text = "é".repeat(600);
        let cut = shorten(&text, MAX_ERROR_BYTES);
        assert!(cut.len() <= MAX_ERROR_BYTES);
        assert!(cut.ends_with('…'));
        assert_eq!(shorten("short", 10), "short");
    }

    #[test]
    fn reasons_round_trip() {
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(reason));
        }
    }

    /// One rule for an id hopper could not accept, for routes and the relay
    /// alike: text is kept, cut when too long; anything else is replaced by
    /// the default id.
    #[test]
    fn a_fallback_envelope_keeps_what_it_can_of_the_producers_id() {
        let id_of = |value: Option<&[u8]>| {
            let mut h = OwnedHeaders::new();
            if let Some(value) = value {
                h = h.insert(Header {
                    key: ID,
                    value: Some(value),
                });
            }
            let rec = Incoming {
                topic: "orders",
                partition: 2,
                offset: 41,
                timestamp: Some(7),
                headers: Some(&h),
            };
            let envelope = Envelope::fallback(&rec);
            assert_eq!((envelope.attempts_made, envelope.origin.offset), (0, 41));
            envelope.id
        };
        assert_eq!(id_of(Some(b"order-1")), "order-1");
        let long = "é".repeat(200);
        let cut = id_of(Some(long.as_bytes()));
        assert!(cut.len() <= MAX_ID_BYTES && cut.ends_with('…'), "{cut}");
        assert!(long.starts_with(cut.trim_end_matches('…')));
        for unusable in [None, Some(&b""[..]), Some(&b"\xff\xfe"[..])] {
            assert_eq!(id_of(unusable), "orders-2-41", "{unusable:?}");
        }
    }

    /// A producer's record may carry the marker of a park record; the
    /// relay never forwards it, in any case, so what it delivers to a park
    /// topic of another config is not one hopper could have written.
    #[test]
    fn the_relays_rewrite_drops_the_headers_of_hoppers_tables_in_any_case() {
        let mut h = OwnedHeaders::new();
        for (key, value) in [
            ("kept", "1"),
            ("hopper-park-by", "forged"),
            ("HOPPER-PARK-BY", "forged"),
            ("Hopper-Park-Anything", "forged"),
            (TARGET, "orders"),
        ] {
            h = h.insert(Header {
                key,
                value: Some(value),
            });
        }
        let out = rewrite(
            Some(&h),
            &[TARGET],
            &[(ID, "x".into())],
            &traceparent::Context::root(),
        );
        let keys: Vec<&str> = out.iter().map(|h| h.key).collect();
        assert_eq!(keys, ["kept", traceparent::TRACEPARENT, ID]);
    }
}
