//! A dead-letter record as an operator sees it: where it is, what hopper's
//! headers say about it, and its key, headers and payload as they are.

use super::fingerprint;
use crate::headers::{self, Envelope, Incoming, Reason};
use rdkafka::message::{Headers, Message, OwnedMessage};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// Where a record is: `topic:partition:offset`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
pub struct RecordRef {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl fmt::Display for RecordRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.topic, self.partition, self.offset)
    }
}

impl FromStr for RecordRef {
    type Err = String;

    /// `topic:partition:offset`; a topic name cannot hold `:`.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not a record as topic:partition:offset");
        let mut parts = text.rsplitn(3, ':');
        let offset = parts.next().and_then(|o| o.parse().ok()).ok_or_else(bad)?;
        let partition = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let topic = parts.next().filter(|t| !t.is_empty()).ok_or_else(bad)?;
        Ok(RecordRef {
            topic: topic.to_string(),
            partition,
            offset,
        })
    }
}

/// Bytes as the console and the CLI show them: UTF-8 text when they are
/// text, and always hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bytes {
    /// The bytes as UTF-8, when they are valid UTF-8.
    pub text: Option<String>,
    pub hex: String,
    pub len: usize,
}

impl Bytes {
    pub fn of(bytes: &[u8]) -> Bytes {
        Bytes {
            text: std::str::from_utf8(bytes).ok().map(str::to_string),
            hex: hex::encode(bytes),
            len: bytes.len(),
        }
    }

    /// The bytes as text, with invalid UTF-8 replaced.
    pub fn lossy(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// One header, as it is on the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeaderValue {
    pub name: String,
    /// `None` for a null value.
    pub value: Option<Bytes>,
}

/// What hopper's headers say about a dead-letter record, in the short form
/// a list shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlqSummary {
    #[serde(flatten)]
    pub at: RecordRef,
    /// The record's timestamp, epoch ms.
    pub timestamp: Option<i64>,
    /// When it failed last (`hopper-last-failure-at`), else its timestamp.
    pub failed_at: Option<i64>,
    pub id: Option<String>,
    /// The route that gave up on it (`delay` for the delay relay).
    pub route: Option<String>,
    /// `hopper-reason`; `None` when absent or not one of hopper's classes
    /// (a record hopper did not write: its headers still show in full).
    pub reason: Option<Reason>,
    pub error: Option<String>,
    /// The last error with its variable parts taken out
    /// (dlq/fingerprint.rs), computed here, never read from a header.
    pub cause: String,
    /// The group of dead letters of one cause: route, reason and cause,
    /// hashed ([`fingerprint::group`]).
    pub group: String,
    pub attempt: Option<u32>,
    pub handler_version: Option<String>,
    /// The key as text (invalid UTF-8 replaced).
    pub key: Option<String>,
    pub payload_bytes: usize,
    /// Times its message had been replayed before it came here
    /// (`hopper-replay-count`).
    pub replays_before: u32,
    /// Times this record itself has been replayed (from the replay journal).
    pub replayed: u32,
}

/// A dead-letter record in full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlqRecord {
    #[serde(flatten)]
    pub summary: DlqSummary,
    pub trail: Option<String>,
    pub origin: Option<String>,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    /// Every header, in order, hopper's and the producer's.
    pub headers: Vec<HeaderValue>,
    /// The trace of the message, from its `traceparent` (docs/tracing.md).
    pub trace_id: Option<String>,
    /// The trace in the viewer of `tracing.ui`, when it is set.
    pub trace_url: Option<String>,
}

/// The headers a summary reads, each as its last value on the record (as
/// [`headers::text`] takes it), found in one pass over the headers: a
/// grouping reads millions of records, each with a dozen headers.
#[derive(Default)]
struct Fields<'a> {
    route: Option<Option<&'a [u8]>>,
    reason: Option<Option<&'a [u8]>>,
    error: Option<Option<&'a [u8]>>,
    failed_at: Option<Option<&'a [u8]>>,
    id: Option<Option<&'a [u8]>>,
    attempt: Option<Option<&'a [u8]>>,
    handler_version: Option<Option<&'a [u8]>>,
    replay_count: Option<Option<&'a [u8]>>,
}

impl<'a> Fields<'a> {
    fn of<H: Headers>(h: Option<&'a H>) -> Fields<'a> {
        let mut f = Fields::default();
        for header in h.into_iter().flat_map(|h| h.iter()) {
            let slot = match header.key {
                headers::ROUTE => &mut f.route,
                headers::REASON => &mut f.reason,
                headers::LAST_ERROR => &mut f.error,
                headers::LAST_FAILURE_AT => &mut f.failed_at,
                headers::ID => &mut f.id,
                headers::ATTEMPT => &mut f.attempt,
                headers::HANDLER_VERSION => &mut f.handler_version,
                headers::REPLAY_COUNT => &mut f.replay_count,
                _ => continue,
            };
            *slot = Some(header.value);
        }
        f
    }

    /// A value as [`headers::text`] reads it: UTF-8, trimmed; a null or
    /// non-UTF-8 value is no value.
    fn text(value: Option<Option<&'a [u8]>>) -> Option<&'a str> {
        std::str::from_utf8(value??).ok().map(str::trim)
    }

    /// The last error as text, cut to the bound the host writes. Bytes that
    /// are not UTF-8 (a forged or foreign record) show as U+FFFD rather than
    /// hiding the error.
    fn error(&self) -> Option<String> {
        let text = String::from_utf8_lossy(self.error??);
        Some(headers::shorten(text.trim(), headers::MAX_ERROR_BYTES))
    }
}

impl DlqSummary {
    pub fn of<M: Message>(message: &M, replayed: u32) -> DlqSummary {
        let f = Fields::of(message.headers());
        let owned = |value| Fields::text(value).map(str::to_string);
        let timestamp = message.timestamp().to_millis();
        let (route, reason, error) = (
            owned(f.route),
            Fields::text(f.reason).and_then(Reason::parse),
            f.error(),
        );
        let cause = fingerprint::cause(error.as_deref().unwrap_or_default());
        let group = fingerprint::group(
            route.as_deref().unwrap_or_default(),
            reason.map_or("", Reason::as_str),
            &cause,
        );
        DlqSummary {
            at: RecordRef {
                topic: message.topic().to_string(),
                partition: message.partition(),
                offset: message.offset(),
            },
            timestamp,
            failed_at: Fields::text(f.failed_at)
                .and_then(|t| t.parse::<i64>().ok())
                .or(timestamp),
            id: owned(f.id),
            route,
            reason,
            error,
            cause,
            group,
            attempt: Fields::text(f.attempt).and_then(|a| a.parse().ok()),
            handler_version: owned(f.handler_version),
            key: message.key().map(Bytes::lossy),
            payload_bytes: message.payload().map_or(0, <[u8]>::len),
            replays_before: Fields::text(f.replay_count)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
            replayed,
        }
    }
}

impl DlqRecord {
    pub fn of(message: &OwnedMessage, replayed: u32) -> DlqRecord {
        let h = message.headers();
        let text = |name| headers::text(h, name).ok().flatten().map(str::to_string);
        let origin = match (
            text(headers::ORIGIN_TOPIC),
            text(headers::ORIGIN_PARTITION),
            text(headers::ORIGIN_OFFSET),
        ) {
            (Some(t), Some(p), Some(o)) => Some(format!("{t}:{p}:{o}")),
            _ => None,
        };
        DlqRecord {
            summary: DlqSummary::of(message, replayed),
            trail: text(headers::TRAIL),
            origin,
            key: message.key().map(Bytes::of),
            payload: message.payload().map(Bytes::of),
            headers: h
                .map(|h| {
                    h.iter()
                        .map(|header| HeaderValue {
                            name: header.key.to_string(),
                            value: header.value.map(Bytes::of),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            trace_id: h.and_then(|h| {
                let value = h
                    .iter()
                    .filter(|h| h.key.eq_ignore_ascii_case(crate::traceparent::TRACEPARENT))
                    .last()?
                    .value?;
                Some(
                    crate::traceparent::parse_traceparent(value)?
                        .trace_id
                        .to_string(),
                )
            }),
            trace_url: None,
        }
    }
}

/// The envelope hopper wrote on a dead-letter record, or why the record is
/// not one of hopper's.
pub fn envelope_of(message: &OwnedMessage) -> Result<Envelope, headers::HeaderError> {
    Envelope::from_tier(&Incoming {
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        timestamp: message.timestamp().to_millis(),
        headers: message.headers(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_refs_parse_and_print() {
        let r: RecordRef = "orders.dlq:2:17".parse().unwrap();
        assert_eq!(r.topic, "orders.dlq");
        assert_eq!((r.partition, r.offset), (2, 17));
        assert_eq!(r.to_string(), "orders.dlq:2:17");
        for bad in ["orders.dlq", "orders.dlq:x:1", ":1:2", "t:1:"] {
            let e = bad.parse::<RecordRef>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn bytes_show_text_only_when_it_is_text() {
        assert_eq!(Bytes::of(b"hi").text.as_deref(), Some("hi"));
        let binary = Bytes::of(&[0xff, 0x00]);
        assert_eq!((binary.text, binary.hex.as_str()), (None, "ff00"));
    }
}
