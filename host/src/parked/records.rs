//! The records of a park topic (docs/ordered-retries.md, "The park
//! topic"). Every record's key names its kind and its lane, the input
//! partition and Kafka key it belongs to:
//!
//! | Key | Value | Means |
//! |---|---|---|
//! | `h␀topic␀partition␀hexkey` | `{"head","seq","since"}` | the key is parked behind the message `head` (input offset `seq`) |
//! | `p␀topic␀partition␀hexkey␀seq` | a marker byte, then the payload | a message of the key waits, with its headers and timestamp |
//! | `r␀topic␀partition␀hexkey␀head` | `{"cause","at"}` | the head `head` resolved, or an operator released it |
//!
//! A null value deletes its key's record (compaction keeps only the last
//! record of each key). A parked message's own null payload is the marker
//! byte 0 alone, so it is never mistaken for a deletion. The first header of
//! every record is `hopper-park-by`, the process that wrote it.

use serde::{Deserialize, Serialize};

/// The header naming the process that wrote a park-topic record.
pub const BY: &str = "hopper-park-by";

pub use crate::types::Lane;

/// The message a key is parked behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    /// Its `hopper-id`.
    pub head: String,
    /// Its offset in the input partition.
    pub seq: i64,
    /// When it parked the key, epoch ms.
    pub since: i64,
}

pub use crate::types::ReleaseCause as Cause;

/// A release of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    pub cause: Cause,
    /// When, epoch ms.
    pub at: i64,
}

/// A message waiting behind its key's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    pub payload: Option<Vec<u8>>,
    /// Its headers, as read from the input.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Its timestamp in the input, epoch ms.
    pub timestamp: Option<i64>,
}

impl Parked {
    /// The bytes it holds in memory, roughly: its payload, headers and the
    /// fixed part of its entry.
    pub fn size(&self) -> usize {
        const ENTRY: usize = 96;
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len) + 56)
            .sum();
        ENTRY + self.payload.as_ref().map_or(0, Vec::len) + headers
    }
}

/// One record of a park topic, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// `None`: the key is no longer parked behind anything.
    Head { lane: Lane, head: Option<Head> },
    /// `None`: the message no longer waits.
    Parked {
        lane: Lane,
        seq: i64,
        message: Option<Parked>,
    },
    /// `None`: the release is forgotten.
    Release {
        lane: Lane,
        head: String,
        release: Option<Release>,
    },
}

impl Record {
    /// The lane it belongs to.
    pub fn lane(&self) -> &Lane {
        match self {
            Record::Head { lane, .. }
            | Record::Parked { lane, .. }
            | Record::Release { lane, .. } => lane,
        }
    }
}

/// Why a park-topic record could not be read; the record is skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("park-topic record {what}")]
pub struct BadRecord {
    pub what: String,
}

fn bad(what: impl Into<String>) -> BadRecord {
    BadRecord { what: what.into() }
}

fn lane_key(kind: u8, lane: &Lane) -> Vec<u8> {
    let mut key = Vec::with_capacity(lane.topic.len() + lane.key.len() * 2 + 16);
    key.push(kind);
    key.push(0);
    key.extend_from_slice(lane.topic.as_bytes());
    key.push(0);
    key.extend_from_slice(lane.partition.to_string().as_bytes());
    key.push(0);
    key.extend_from_slice(hex::encode(&lane.key).as_bytes());
    key
}

/// The key of a lane's head record.
pub fn head_key(lane: &Lane) -> Vec<u8> {
    lane_key(b'h', lane)
}

/// The key of a parked message's record.
pub fn parked_key(lane: &Lane, seq: i64) -> Vec<u8> {
    let mut key = lane_key(b'p', lane);
    key.push(0);
    key.extend_from_slice(seq.to_string().as_bytes());
    key
}

/// The key of a head's release record.
pub fn release_key(lane: &Lane, head: &str) -> Vec<u8> {
    let mut key = lane_key(b'r', lane);
    key.push(0);
    key.extend_from_slice(head.as_bytes());
    key
}

/// The value of a parked message's record.
pub fn parked_value(payload: Option<&[u8]>) -> Vec<u8> {
    match payload {
        None => vec![0],
        Some(payload) => {
            let mut value = Vec::with_capacity(payload.len() + 1);
            value.push(1);
            value.extend_from_slice(payload);
            value
        }
    }
}

/// A record as written: its key, value (`None` deletes), headers and
/// timestamp.
pub struct Encoded {
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: Option<i64>,
}

/// How `record` is written.
pub fn encode(record: &Record) -> Encoded {
    match record {
        Record::Head { lane, head } => Encoded {
            key: head_key(lane),
            value: head.as_ref().map(json),
            headers: Vec::new(),
            timestamp: None,
        },
        Record::Parked { lane, seq, message } => Encoded {
            key: parked_key(lane, *seq),
            value: message.as_ref().map(|m| parked_value(m.payload.as_deref())),
            headers: message
                .as_ref()
                .map(|m| m.headers.clone())
                .unwrap_or_default(),
            timestamp: message.as_ref().and_then(|m| m.timestamp),
        },
        Record::Release {
            lane,
            head,
            release,
        } => Encoded {
            key: release_key(lane, head),
            value: release.as_ref().map(json),
            headers: Vec::new(),
            timestamp: None,
        },
    }
}

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("plain structs serialize")
}

/// Reads a park-topic record from its key, value, headers (the `by`
/// header already taken off) and timestamp.
pub fn read(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp: Option<i64>,
) -> Result<Record, BadRecord> {
    let key = key.ok_or_else(|| bad("has no key"))?;
    let mut parts = key.splitn(5, |b| *b == 0);
    let kind = parts.next().unwrap_or_default();
    let topic = parts.next().ok_or_else(|| bad("key has no topic"))?;
    let topic = std::str::from_utf8(topic).map_err(|_| bad("key's topic is not UTF-8"))?;
    let partition = parts
        .next()
        .and_then(|p| std::str::from_utf8(p).ok())
        .and_then(|p| p.parse::<i32>().ok())
        .ok_or_else(|| bad("key's partition is not a number"))?;
    let hexkey = parts.next().ok_or_else(|| bad("key has no message key"))?;
    let lane = Lane {
        topic: topic.to_string(),
        partition,
        key: hex::decode(hexkey).map_err(|_| bad("key's message key is not hex"))?,
    };
    let rest = parts.next();
    match (kind, rest) {
        (b"h", None) => {
            let head = value
                .map(|v| serde_json::from_slice(v).map_err(|e| bad(format!("head value: {e}"))))
                .transpose()?;
            Ok(Record::Head { lane, head })
        }
        (b"p", Some(seq)) => {
            let seq = std::str::from_utf8(seq)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| bad("key's offset is not a number"))?;
            let message = match value {
                None => None,
                Some([0]) => Some(None),
                Some([1, payload @ ..]) => Some(Some(payload.to_vec())),
                Some(_) => return Err(bad("value has no payload marker")),
            }
            .map(|payload| Parked {
                payload,
                headers,
                timestamp,
            });
            Ok(Record::Parked { lane, seq, message })
        }
        (b"r", Some(head)) => {
            let head = std::str::from_utf8(head)
                .map_err(|_| bad("key's head id is not UTF-8"))?
                .to_string();
            let release = value
                .map(|v| serde_json::from_slice(v).map_err(|e| bad(format!("release value: {e}"))))
                .transpose()?;
            Ok(Record::Release {
                lane,
                head,
                release,
            })
        }
        _ => Err(bad(format!(
            "key of unknown kind `{}`",
            String::from_utf8_lossy(kind)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(key: &[u8]) -> Lane {
        Lane {
            topic: "orders".into(),
            partition: 3,
            key: key.to_vec(),
        }
    }

    #[test]
    fn every_kind_reads_back_for_any_key() {
        for key in [&b"acct-7"[..], b"", &[0, 0xff, 0, 1]] {
            let lane = lane(key);
            let head = Head {
                head: "orders-3-17".into(),
                seq: 17,
                since: 1_000,
            };
            let value = serde_json::to_vec(&head).unwrap();
            assert_eq!(
                read(Some(&head_key(&lane)), Some(&value), vec![], None),
                Ok(Record::Head {
                    lane: lane.clone(),
                    head: Some(head)
                })
            );
            let headers = vec![("h".to_string(), Some(b"v".to_vec()))];
            for payload in [None, Some(&b""[..]), Some(b"\0\x01")] {
                let record = read(
                    Some(&parked_key(&lane, 42)),
                    Some(&parked_value(payload)),
                    headers.clone(),
                    Some(5),
                );
                let Ok(Record::Parked {
                    seq: 42,
                    message: Some(parked),
                    ..
                }) = record
                else {
                    panic!("{record:?}");
                };
                assert_eq!(parked.payload.as_deref(), payload);
                assert_eq!(parked.headers, headers);
            }
            assert_eq!(
                read(Some(&parked_key(&lane, 42)), None, vec![], None),
                Ok(Record::Parked {
                    lane: lane.clone(),
                    seq: 42,
                    message: None
                }),
                "a null value deletes; a null payload does not"
            );
            let release = Release {
                cause: Cause::DeadLettered,
                at: 9,
            };
            let value = serde_json::to_vec(&release).unwrap();
            assert_eq!(
                read(
                    Some(&release_key(&lane, "id\0with nul")),
                    Some(&value),
                    vec![],
                    None
                ),
                Ok(Record::Release {
                    lane,
                    head: "id\0with nul".into(),
                    release: Some(release)
                })
            );
        }
    }

    #[test]
    fn a_malformed_record_is_named() {
        type Case<'a> = (Option<&'a [u8]>, Option<&'a [u8]>, &'a str);
        let cases: [Case<'_>; 8] = [
            (None, Some(b"x"), "has no key"),
            (Some(b"h"), None, "key has no topic"),
            (Some(b"h\0t\0x\0aa"), None, "partition is not a number"),
            (Some(b"h\0t\x001\0zz"), None, "message key is not hex"),
            (Some(b"h\0t\x001\0aa"), Some(b"{"), "head value"),
            (Some(b"p\0t\x001\0aa\0x"), None, "offset is not a number"),
            (
                Some(b"p\0t\x001\0aa\x001"),
                Some(b"\x07"),
                "no payload marker",
            ),
            (Some(b"q\0t\x001\0aa"), None, "unknown kind `q`"),
        ];
        for (key, value, problem) in cases {
            let error = read(key, value, vec![], None).unwrap_err();
            assert!(
                error.to_string().contains(problem),
                "{key:?}: `{error}` should name `{problem}`"
            );
        }
    }
}
