//! Reading a cancel or a replace from an inbox record's headers
//! (docs/headers.md, "Cancelling or replacing a delayed message").

use super::schedule::{Rejected, invalid};
use crate::headers;
use crate::types::{CancelKind, InboxPosition};
use rdkafka::message::{Header, Headers, OwnedHeaders};

/// What an inbox record asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// A schedule; with `replace`, it also cancels the earlier schedules of
    /// its id.
    Schedule { replace: bool },
    /// Cancel the earlier schedules of its id; nothing is delivered.
    Cancel,
}

/// `true`, `false` or absent; anything else names the header.
fn flag<H: Headers>(headers: Option<&H>, name: &'static str) -> Result<bool, Rejected> {
    match headers::text(headers, name).map_err(|e| invalid(e.to_string()))? {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(invalid(format!(
            "header {name}: `{}` is neither `true` nor `false`",
            headers::shorten(other, 64)
        ))),
    }
}

/// Whether an inbox record is a schedule, a replace or a cancel, or which
/// rule it breaks. A cancel carries nothing to schedule.
pub fn parse_intent<H: Headers>(headers: Option<&H>) -> Result<Intent, Rejected> {
    let cancel = flag(headers, headers::CANCEL)?;
    let replace = flag(headers, headers::REPLACE)?;
    if cancel && replace {
        return Err(invalid(format!(
            "set either {} or {}, not both",
            headers::CANCEL,
            headers::REPLACE
        )));
    }
    if !cancel {
        return Ok(Intent::Schedule { replace });
    }
    for scheduling in [headers::TARGET, headers::DELIVER_AT, headers::DELAY] {
        let present = headers.is_some_and(|h| h.iter().any(|header| header.key == scheduling));
        if present {
            return Err(invalid(format!(
                "a cancel ({}: true) cannot carry {scheduling}: it schedules nothing",
                headers::CANCEL
            )));
        }
    }
    Ok(Intent::Cancel)
}

/// The id a cancel or replace names, checked: present, one hopper accepts
/// as a message id, and equal to the record's key, so that every record of
/// the id is in one inbox partition.
pub fn cancelled_id<H: Headers>(
    headers: Option<&H>,
    key: Option<&[u8]>,
    kind: CancelKind,
) -> Result<String, Rejected> {
    let what = match kind {
        CancelKind::Cancel => "a cancel",
        CancelKind::Replace => "a replace",
    };
    let id = headers::text(headers, headers::ID)
        .map_err(|e| invalid(format!("{what}: {e}")))?
        .ok_or_else(|| invalid(format!("{what} needs {}", headers::ID)))?;
    if id.is_empty() || id.len() > headers::MAX_ID_BYTES {
        return Err(invalid(format!(
            "header {}: must be 1 to {} bytes, not {}",
            headers::ID,
            headers::MAX_ID_BYTES,
            id.len()
        )));
    }
    if key != Some(id.as_bytes()) {
        let key = match key {
            None => "no key".to_string(),
            Some(key) => format!(
                "key `{}`",
                headers::shorten(&String::from_utf8_lossy(key), 64)
            ),
        };
        return Err(invalid(format!(
            "{what}'s key must be its {} (`{}`), so that every record of the id is in one inbox partition; it has {key}",
            headers::ID,
            headers::shorten(id, 64)
        )));
    }
    Ok(id.to_string())
}

/// The headers of a cancellation-topic entry: its kind, the relay
/// process that read it, and the `traceparent` of the hop that wrote it.
pub fn entry_headers(
    kind: CancelKind,
    by: &str,
    trace: &crate::traceparent::Context,
) -> OwnedHeaders {
    OwnedHeaders::new_with_capacity(3)
        .insert(Header {
            key: crate::traceparent::TRACEPARENT,
            value: Some(&trace.traceparent()),
        })
        .insert(Header {
            key: headers::CANCEL_KIND,
            value: Some(kind.as_str()),
        })
        .insert(Header {
            key: headers::CANCEL_BY,
            value: Some(by),
        })
}

/// The value of a cancellation-topic entry: where the inbox read it.
pub fn entry_value(at: InboxPosition) -> Vec<u8> {
    at.to_string().into_bytes()
}

/// The key of a cancellation-topic entry: `<partition>:<id>`, the inbox
/// partition that read the cancel and the id. The topic is compacted by
/// key, so an id's entries of two partitions are both kept.
pub fn entry_key(partition: i32, id: &str) -> Vec<u8> {
    format!("{partition}:{id}").into_bytes()
}

/// The inbox partition and the id of an entry's key, or `None` for a key
/// that is not `<partition>:<id>` (a partition in plain decimal digits, an
/// id of at least one byte).
pub fn entry_key_partition(key: &[u8]) -> Option<(i32, &[u8])> {
    let colon = key.iter().position(|b| *b == b':')?;
    let (digits, id) = (&key[..colon], &key[colon + 1..]);
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let partition = std::str::from_utf8(digits).ok()?.parse::<i32>().ok()?;
    (!id.is_empty()).then_some((partition, id))
}

/// The id of an entry's key, when the key names `partition` (the one its
/// value says read it).
pub fn entry_key_id(key: &[u8], partition: i32) -> Option<&[u8]> {
    entry_key_partition(key).and_then(|(p, id)| (p == partition).then_some(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::Reason;

    fn headers(pairs: &[(&str, &str)]) -> OwnedHeaders {
        let mut h = OwnedHeaders::new();
        for (k, v) in pairs {
            h = h.insert(Header {
                key: k,
                value: Some(*v),
            });
        }
        h
    }

    fn intent(pairs: &[(&str, &str)]) -> Result<Intent, Rejected> {
        parse_intent(Some(&headers(pairs)))
    }

    #[test]
    fn a_record_is_a_schedule_a_replace_or_a_cancel() {
        assert_eq!(
            intent(&[("hopper-target", "t")]),
            Ok(Intent::Schedule { replace: false })
        );
        assert_eq!(
            intent(&[("hopper-replace", "true"), ("hopper-target", "t")]),
            Ok(Intent::Schedule { replace: true })
        );
        assert_eq!(
            intent(&[("hopper-cancel", "false"), ("hopper-target", "t")]),
            Ok(Intent::Schedule { replace: false })
        );
        assert_eq!(
            intent(&[("hopper-cancel", "true"), ("hopper-id", "o-1")]),
            Ok(Intent::Cancel)
        );
    }

    #[test]
    fn bad_combinations_name_the_problem() {
        let cases: [(&[(&str, &str)], &str); 5] = [
            (
                &[("hopper-cancel", "true"), ("hopper-target", "t")],
                "cannot carry hopper-target",
            ),
            (
                &[("hopper-cancel", "true"), ("hopper-delay", "5s")],
                "cannot carry hopper-delay",
            ),
            (
                &[("hopper-cancel", "true"), ("hopper-deliver-at", "5")],
                "cannot carry hopper-deliver-at",
            ),
            (
                &[("hopper-cancel", "true"), ("hopper-replace", "true")],
                "not both",
            ),
            (
                &[("hopper-cancel", "yes")],
                "header hopper-cancel: `yes` is neither",
            ),
        ];
        for (pairs, expected) in cases {
            let err = intent(pairs).unwrap_err();
            assert_eq!(err.reason, Reason::InvalidEnvelope);
            assert!(err.error.contains(expected), "{pairs:?}: {}", err.error);
        }
    }

    #[test]
    fn an_entry_key_names_its_partition_and_its_id() {
        assert_eq!(entry_key(3, "inv:42"), b"3:inv:42");
        assert_eq!(entry_key_partition(b"3:inv:42"), Some((3, &b"inv:42"[..])));
        assert_eq!(entry_key_id(b"3:inv:42", 3), Some(&b"inv:42"[..]));
        assert_eq!(entry_key_id(b"3:inv:42", 0), None);
        for bad in [
            &b"inv-42"[..],
            b":x",
            b"3:",
            b"-1:x",
            b"+1:x",
            b" 1:x",
            b"99999999999:x",
            b"2147483648:x",
            b"\xff:x",
        ] {
            assert_eq!(entry_key_partition(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_key_must_be_the_id() {
        let h = headers(&[("hopper-id", "o-1")]);
        let id = |key: Option<&[u8]>| cancelled_id(Some(&h), key, CancelKind::Cancel);
        assert_eq!(id(Some(b"o-1")).unwrap(), "o-1");
        let err = id(Some(b"o-2")).unwrap_err();
        assert!(
            err.error.contains("key must be its hopper-id (`o-1`)")
                && err.error.contains("key `o-2`"),
            "{}",
            err.error
        );
        assert!(id(None).unwrap_err().error.contains("it has no key"));
        let none = OwnedHeaders::new();
        let err = cancelled_id(Some(&none), Some(b"x"), CancelKind::Replace).unwrap_err();
        assert_eq!(err.error, "a replace needs hopper-id");
        let long = "x".repeat(300);
        let h = headers(&[("hopper-id", &long)]);
        let err = cancelled_id(Some(&h), Some(long.as_bytes()), CancelKind::Cancel).unwrap_err();
        assert!(
            err.error.contains("1 to 256 bytes, not 300"),
            "{}",
            err.error
        );
    }
}
