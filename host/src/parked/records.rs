//! The records of a park topic (docs/ordered-retries.md, "The park
//! topic"). Every record's key names its kind and its lane, the input
//! partition and Kafka key it belongs to, the Kafka key by its sha256
//! digest (64 hex digits, whatever the key's size):
//!
//! | Key | Value | Means |
//! |---|---|---|
//! | `h␀topic␀partition␀digest` | `{"head","seq","since"}` | the key is parked behind the message `head` (input offset `seq`) |
//! | `p␀topic␀partition␀digest␀seq` | a marker byte, then the payload | a message of the key waits, with its headers and timestamp |
//! | `r␀topic␀partition␀digest␀head` | `{"cause","at"}` | the head `head` resolved, or an operator released it |
//!
//! A null value deletes its key's record (compaction keeps only the last
//! record of each key). A parked message's own null payload is the marker
//! byte 0 alone, so it is never mistaken for a deletion. The first header of
//! every record is `hopper-park-by`, the process that wrote it; the second,
//! `hopper-park-key`, holds the Kafka key itself, deletions included, and a
//! record whose key header does not hash to its digest is refused. A
//! parked message's own headers follow.

use serde::{Deserialize, Serialize};

/// The header naming the process that wrote a park-topic record.
pub const BY: &str = "hopper-park-by";

/// The header holding the Kafka key a park-topic record belongs to, the
/// one its record key names by digest.
pub const KEY: &str = "hopper-park-key";

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

use crate::types::ReleaseCause;

/// A release of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    pub cause: ReleaseCause,
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

/// The digest naming a Kafka key in a record key: sha256, in hex.
fn digest(key: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(key))
}

fn lane_key(kind: u8, lane: &Lane) -> Vec<u8> {
    let mut key = Vec::with_capacity(lane.topic.len() + 64 + 16);
    key.push(kind);
    key.push(0);
    key.extend_from_slice(lane.topic.as_bytes());
    key.push(0);
    key.extend_from_slice(lane.partition.to_string().as_bytes());
    key.push(0);
    key.extend_from_slice(digest(&lane.key).as_bytes());
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

/// A record as written: its key, value (`None` deletes), headers (the
/// `hopper-park-key` header first) and timestamp.
pub struct Encoded {
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: Option<i64>,
}

/// How `record` is written.
pub fn encode(record: &Record) -> Encoded {
    let mut encoded = encode_body(record);
    encoded
        .headers
        .insert(0, (KEY.to_string(), Some(record.lane().key.clone())));
    encoded
}

fn encode_body(record: &Record) -> Encoded {
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
/// header already taken off, the `hopper-park-key` header first) and
/// timestamp.
pub fn read(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    mut headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp: Option<i64>,
) -> Result<Record, BadRecord> {
    let key = key.ok_or_else(|| bad("has no key"))?;
    let kafka_key = match headers.first() {
        Some((name, _)) if name == KEY => headers.remove(0).1.unwrap_or_default(),
        _ => return Err(bad(format!("has no `{KEY}` header after `{BY}`"))),
    };
    let mut parts = key.splitn(5, |b| *b == 0);
    let kind = parts.next().unwrap_or_default();
    let topic = parts.next().ok_or_else(|| bad("key has no topic"))?;
    let topic = std::str::from_utf8(topic).map_err(|_| bad("key's topic is not UTF-8"))?;
    let partition = parts
        .next()
        .and_then(|p| std::str::from_utf8(p).ok())
        .and_then(|p| p.parse::<i32>().ok())
        .ok_or_else(|| bad("key's partition is not a number"))?;
    let named = parts.next().ok_or_else(|| bad("key has no message key"))?;
    if named != digest(&kafka_key).as_bytes() {
        return Err(bad(format!(
            "key's digest is not the sha256 of its `{KEY}` header"
        )));
    }
    let lane = Lane {
        topic: topic.to_string(),
        partition,
        key: kafka_key,
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

    /// `record` written and read back.
    fn round_trip(record: &Record) -> Result<Record, BadRecord> {
        let Encoded {
            key,
            value,
            headers,
            timestamp,
        } = encode(record);
        read(Some(&key), value.as_deref(), headers, timestamp)
    }

    #[test]
    fn every_kind_reads_back_for_any_key() {
        for key in [&b"acct-7"[..], b"", &[0, 0xff, 0, 1]] {
            let lane = lane(key);
            let head = Record::Head {
                lane: lane.clone(),
                head: Some(Head {
                    head: "orders-3-17".into(),
                    seq: 17,
                    since: 1_000,
                }),
            };
            assert_eq!(round_trip(&head), Ok(head));
            let headers = vec![
                ("h".to_string(), Some(b"v".to_vec())),
                (KEY.to_string(), Some(b"a producer's own".to_vec())),
            ];
            for payload in [None, Some(&b""[..]), Some(b"\0\x01")] {
                let parked = Record::Parked {
                    lane: lane.clone(),
                    seq: 42,
                    message: Some(Parked {
                        payload: payload.map(<[u8]>::to_vec),
                        headers: headers.clone(),
                        timestamp: Some(5),
                    }),
                };
                assert_eq!(round_trip(&parked), Ok(parked));
            }
            let deletion = Record::Parked {
                lane: lane.clone(),
                seq: 42,
                message: None,
            };
            assert_eq!(
                round_trip(&deletion),
                Ok(deletion),
                "a null value deletes; a null payload does not"
            );
            let release = Record::Release {
                lane,
                head: "id\0with nul".into(),
                release: Some(Release {
                    cause: ReleaseCause::DeadLettered,
                    at: 9,
                }),
            };
            assert_eq!(round_trip(&release), Ok(release));
        }
    }

    #[test]
    fn a_record_key_names_the_kafka_key_by_digest_whatever_its_size() {
        let big = lane(&vec![7u8; 500 * 1024]);
        for key in [
            head_key(&big),
            parked_key(&big, i64::MAX),
            release_key(&big, "h"),
        ] {
            assert!(key.len() < 128, "{} bytes", key.len());
        }
        let Encoded { headers, .. } = encode(&Record::Head {
            lane: big.clone(),
            head: None,
        });
        assert_eq!(
            headers,
            vec![(KEY.to_string(), Some(big.key.clone()))],
            "a deletion names its key too"
        );
    }

    #[test]
    fn a_key_header_that_is_not_the_digests_key_is_refused() {
        let record = Record::Head {
            lane: lane(b"acct-7"),
            head: None,
        };
        let Encoded {
            key, mut headers, ..
        } = encode(&record);
        headers[0].1 = Some(b"acct-8".to_vec());
        let error = read(Some(&key), None, headers, None).unwrap_err();
        assert!(error.to_string().contains("digest"), "{error}");
    }

    #[test]
    fn a_malformed_record_is_named() {
        let digest = digest(b"k");
        let key = |rest: &str| rest.replace("D", &digest).into_bytes();
        // Record key, value, whether it has a `hopper-park-key` header, and
        // what the error names.
        type Case<'a> = (Option<Vec<u8>>, Option<&'a [u8]>, bool, &'a str);
        let cases: [Case<'_>; 10] = [
            (None, Some(b"x"), true, "has no key"),
            (
                Some(key("h\0t\x001\0D")),
                None,
                false,
                "has no `hopper-park-key` header",
            ),
            (Some(key("h")), None, true, "key has no topic"),
            (
                Some(key("h\0t\0x\0D")),
                None,
                true,
                "partition is not a number",
            ),
            (Some(key("h\0t\x001")), None, true, "key has no message key"),
            (Some(key("h\0t\x001\0aa")), None, true, "not the sha256"),
            (Some(key("h\0t\x001\0D")), Some(b"{"), true, "head value"),
            (
                Some(key("p\0t\x001\0D\0x")),
                None,
                true,
                "offset is not a number",
            ),
            (
                Some(key("p\0t\x001\0D\x001")),
                Some(b"\x07"),
                true,
                "no payload marker",
            ),
            (Some(key("q\0t\x001\0D")), None, true, "unknown kind `q`"),
        ];
        for (record_key, value, with_key, problem) in cases {
            let headers = if with_key {
                vec![(KEY.to_string(), Some(b"k".to_vec()))]
            } else {
                vec![("other".to_string(), Some(b"k".to_vec()))]
            };
            let error = read(record_key.as_deref(), value, headers, None).unwrap_err();
            assert!(
                error.to_string().contains(problem),
                "{record_key:?}: `{error}` should name `{problem}`"
            );
        }
    }
}
