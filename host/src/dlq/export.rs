//! `hopper dlq export`: dead letters as JSON lines for incident reports and
//! offline analysis, one object per record with its key, payload and every
//! header, byte for byte. Bytes that are UTF-8 are written as text, the
//! rest as base64, so a line can be turned back into the record exactly.
//! Reading never writes to Kafka.

use super::record::DlqSummary;
use crate::headers::Reason;
use rdkafka::message::{Headers, Message, OwnedMessage};
use serde::Serialize;

/// Bytes as they were: `{"text": ...}` when they are UTF-8, else
/// `{"base64": ...}` (standard alphabet, padded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Data {
    Text(String),
    Base64(String),
}

impl Data {
    pub fn of(bytes: &[u8]) -> Data {
        use base64::Engine as _;
        match std::str::from_utf8(bytes) {
            Ok(text) => Data::Text(text.to_string()),
            Err(_) => Data::Base64(base64::engine::general_purpose::STANDARD.encode(bytes)),
        }
    }
}

/// One header as it is on the record; a null value is `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportedHeader {
    pub name: String,
    pub value: Option<Data>,
}

/// One dead letter as `hopper dlq export` writes it: where it is, what
/// hopper reads from it (as `dlq ls` shows it), and the record itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exported {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The record's timestamp, epoch ms.
    pub timestamp: Option<i64>,
    pub failed_at: Option<i64>,
    pub route: Option<String>,
    pub reason: Option<Reason>,
    /// The last error, cut to the bound hopper writes; the header itself
    /// is in `headers` in full.
    pub error: Option<String>,
    pub group: String,
    pub cause: String,
    /// Times this record has been replayed (the replay journal).
    pub replayed: u32,
    pub key: Option<Data>,
    pub payload: Option<Data>,
    pub headers: Vec<ExportedHeader>,
}

impl Exported {
    pub fn of(message: &OwnedMessage, summary: DlqSummary) -> Exported {
        Exported {
            topic: summary.at.topic,
            partition: summary.at.partition,
            offset: summary.at.offset,
            timestamp: summary.timestamp,
            failed_at: summary.failed_at,
            route: summary.route,
            reason: summary.reason,
            error: summary.error,
            group: summary.group,
            cause: summary.cause,
            replayed: summary.replayed,
            key: message.key().map(Data::of),
            payload: message.payload().map(Data::of),
            headers: message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|header| ExportedHeader {
                            name: header.key.to_string(),
                            value: header.value.map(Data::of),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_stays_text_and_other_bytes_are_base64() {
        assert_eq!(
            serde_json::to_string(&Data::of(b"o-1 \"quoted\"")).unwrap(),
            r#"{"text":"o-1 \"quoted\""}"#
        );
        assert_eq!(
            serde_json::to_string(&Data::of(b"\xff\x00a")).unwrap(),
            r#"{"base64":"/wBh"}"#
        );
        assert_eq!(
            serde_json::to_string(&Data::of(b"")).unwrap(),
            r#"{"text":""}"#
        );
    }
}
