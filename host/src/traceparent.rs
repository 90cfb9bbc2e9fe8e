//! W3C trace context (<https://www.w3.org/TR/trace-context/>): reading a
//! `traceparent` strictly, writing one into a fixed buffer, and new ids.
//!
//! Reading never fails a message: a header that is missing, malformed or
//! from an unknown future version that cannot be read starts a new trace.
//! Nothing here allocates.

use rdkafka::message::Headers;
use std::fmt;

/// The header that carries the trace id, parent span and flags.
pub const TRACEPARENT: &str = "traceparent";
/// Vendor state that travels with the trace, copied as it is.
pub const TRACESTATE: &str = "tracestate";
/// Length of a version-00 `traceparent`:
/// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`.
pub const TRACEPARENT_LEN: usize = 55;

/// The sampled bit of the trace flags; the only flag hopper passes on.
pub const SAMPLED: u8 = 0x01;

/// Whether a header name is `traceparent` or `tracestate`, in any case: a
/// record never leaves hopper with a second one under another spelling.
pub fn is_trace_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(TRACEPARENT) || name.eq_ignore_ascii_case(TRACESTATE)
}

/// A 16-byte trace id, never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id, never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    /// A new random trace id.
    pub fn random() -> TraceId {
        loop {
            let id = fastrand::u128(..).to_be_bytes();
            if id != [0; 16] {
                return TraceId(id);
            }
        }
    }

    /// The id as 32 lowercase hex digits, written into `out`.
    pub fn write_hex(&self, out: &mut [u8; 32]) {
        hex_into(&self.0, out);
    }
}

impl SpanId {
    /// A new random span id (a fast thread-local generator: span ids need
    /// to be unique within a trace, not unpredictable).
    pub fn random() -> SpanId {
        loop {
            let id = fastrand::u64(..).to_be_bytes();
            if id != [0; 8] {
                return SpanId(id);
            }
        }
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0; 32];
        hex_into(&self.0, &mut out);
        f.write_str(std::str::from_utf8(&out).expect("hex is ASCII"))
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0; 16];
        hex_into(&self.0, &mut out);
        f.write_str(std::str::from_utf8(&out).expect("hex is ASCII"))
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What a valid `traceparent` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traceparent {
    pub trace_id: TraceId,
    /// The span that wrote the record.
    pub span_id: SpanId,
    pub flags: u8,
}

/// Reads a `traceparent` value strictly:
/// - version `00`: exactly 55 bytes;
/// - a later version: at least 55 bytes, the first 55 read as version 00
///   (and a 56th, if any, must be `-`), as the specification asks;
/// - version `ff` is invalid;
/// - lowercase hex only, `-` between the fields;
/// - an all-zero trace id or span id is invalid.
pub fn parse_traceparent(value: &[u8]) -> Option<Traceparent> {
    if value.len() < TRACEPARENT_LEN {
        return None;
    }
    let version = hex_byte(value[0], value[1])?;
    match version {
        0xff => return None,
        0x00 if value.len() != TRACEPARENT_LEN => return None,
        0x00 => {}
        _ if value.len() > TRACEPARENT_LEN && value[TRACEPARENT_LEN] != b'-' => return None,
        _ => {}
    }
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let mut trace_id = [0; 16];
    for (i, byte) in trace_id.iter_mut().enumerate() {
        *byte = hex_byte(value[3 + 2 * i], value[4 + 2 * i])?;
    }
    let mut span_id = [0; 8];
    for (i, byte) in span_id.iter_mut().enumerate() {
        *byte = hex_byte(value[36 + 2 * i], value[37 + 2 * i])?;
    }
    let flags = hex_byte(value[53], value[54])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Traceparent {
        trace_id: TraceId(trace_id),
        span_id: SpanId(span_id),
        flags,
    })
}

/// The trace context of one hop: the trace a record belongs to, and the
/// span of the hop that handles it now. Every record the hop writes
/// carries `traceparent` = this trace id with [`Context::span_id`] as its
/// parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    pub trace_id: TraceId,
    /// This hop's span: the parent of every record it writes.
    pub span_id: SpanId,
    /// The span that wrote the record this hop read (its `traceparent`'s
    /// parent): for a record from a producer, the producer's span, which
    /// stays reachable as a link rather than as another header. `None`
    /// when the record started a new trace here.
    pub parent: Option<SpanId>,
    /// The trace flags passed on; only the sampled bit is kept.
    pub flags: u8,
}

impl Context {
    /// The context of a hop reading a record with `headers`: it continues
    /// the trace of the record's last `traceparent` when that one is
    /// valid, and starts a new trace otherwise. Never fails.
    pub fn continue_from<H: Headers>(headers: Option<&H>) -> Context {
        match headers.and_then(last_traceparent) {
            Some(parent) => Context::child_of(parent),
            None => Context::root(),
        }
    }

    /// A hop continuing the trace of `parent`.
    pub fn child_of(parent: Traceparent) -> Context {
        Context {
            trace_id: parent.trace_id,
            span_id: SpanId::random(),
            parent: Some(parent.span_id),
            flags: parent.flags & SAMPLED,
        }
    }

    /// A hop that starts a new trace.
    pub fn root() -> Context {
        Context {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            parent: None,
            flags: 0,
        }
    }

    /// A span within this hop's trace whose parent is this hop's span.
    pub fn child(&self) -> Context {
        Context {
            trace_id: self.trace_id,
            span_id: SpanId::random(),
            parent: Some(self.span_id),
            flags: self.flags,
        }
    }

    /// Whether this hop's trace is sampled: the flag it came with, or the
    /// one [`crate::trace::Tracer::decide`] set on a new root.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// Whether the record this hop read continued a trace (so its
    /// `tracestate`, if any, belongs to this trace and is passed on).
    pub fn continued(&self) -> bool {
        self.parent.is_some()
    }

    /// The `traceparent` of a record this hop writes, version 00.
    pub fn traceparent(&self) -> [u8; TRACEPARENT_LEN] {
        let mut out = [0u8; TRACEPARENT_LEN];
        out[..3].copy_from_slice(b"00-");
        let (trace, rest) = out[3..].split_at_mut(32);
        hex_into(&self.trace_id.0, trace);
        rest[0] = b'-';
        hex_into(&self.span_id.0, &mut rest[1..17]);
        rest[17] = b'-';
        hex_into(&[self.flags], &mut rest[18..20]);
        out
    }
}

/// The value of the last `traceparent` header (any case) when it is valid.
fn last_traceparent<H: Headers>(headers: &H) -> Option<Traceparent> {
    let mut last = None;
    for header in headers.iter() {
        if header.key.eq_ignore_ascii_case(TRACEPARENT) {
            last = Some(header.value);
        }
    }
    parse_traceparent(last??)
}

/// One byte from two lowercase hex digits.
fn hex_byte(high: u8, low: u8) -> Option<u8> {
    Some((hex_digit(high)? << 4) | hex_digit(low)?)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Writes `bytes` as lowercase hex into `out`, which is twice as long.
fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(byte >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(byte & 0x0f)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, OwnedHeaders};

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&str, &str)]) -> OwnedHeaders {
        let mut h = OwnedHeaders::new();
        for (key, value) in pairs {
            h = h.insert(Header {
                key,
                value: Some(value.as_bytes()),
            });
        }
        h
    }

    #[test]
    fn a_valid_traceparent_is_read() {
        let parent = parse_traceparent(VALID.as_bytes()).unwrap();
        assert_eq!(
            parent.trace_id.to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.span_id.to_string(), "00f067aa0ba902b7");
        assert_eq!(parent.flags, 1);
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        let cases = [
            ("", "empty"),
            (&VALID[..54], "too short"),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
                "version 00 too long",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "uppercase hex",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
                "not hex",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "zero trace id",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "zero span id",
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version ff",
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "separator",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
                "separator",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
                "separator",
            ),
            (
                "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "bad version",
            ),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
                "future, no dash",
            ),
        ];
        for (value, why) in cases {
            assert_eq!(parse_traceparent(value.as_bytes()), None, "{why}: {value}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_55_bytes() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        let parent = parse_traceparent(later.as_bytes()).unwrap();
        assert_eq!(parent.span_id.to_string(), "00f067aa0ba902b7");
        let exact = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(parse_traceparent(exact.as_bytes()).is_some());
    }

    #[test]
    fn a_hop_continues_the_trace_with_its_own_span() {
        let hop = Context::continue_from(Some(&headers(&[(TRACEPARENT, VALID)])));
        assert_eq!(hop.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hop.parent.unwrap().to_string(), "00f067aa0ba902b7");
        assert_ne!(hop.span_id, hop.parent.unwrap());
        let written = hop.traceparent();
        let read = parse_traceparent(&written).unwrap();
        assert_eq!(
            (read.trace_id, read.span_id, read.flags),
            (hop.trace_id, hop.span_id, 1)
        );
        assert_eq!(&written[..36], b"00-4bf92f3577b34da6a3ce929d0e0e4736-");
    }

    #[test]
    fn the_last_traceparent_counts_and_a_bad_one_starts_a_trace() {
        let other = "00-11111111111111111111111111111111-2222222222222222-00";
        let hop = Context::continue_from(Some(&headers(&[
            (TRACEPARENT, VALID),
            ("Traceparent", other),
        ])));
        assert_eq!(hop.trace_id.to_string(), "11111111111111111111111111111111");
        assert_eq!(hop.flags, 0);
        for bad in ["", "garbage", &VALID.replace("4bf", "4BF")] {
            let hop = Context::continue_from(Some(&headers(&[(TRACEPARENT, bad)])));
            assert!(!hop.continued(), "{bad}");
            assert_ne!(hop.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
            assert!(parse_traceparent(&hop.traceparent()).is_some());
        }
        let none = Context::continue_from::<OwnedHeaders>(None);
        assert!(!none.continued());
        let null = OwnedHeaders::new().insert(Header::<&[u8]> {
            key: TRACEPARENT,
            value: None,
        });
        assert!(!Context::continue_from(Some(&null)).continued());
    }

    #[test]
    fn new_traces_differ() {
        let (a, b) = (Context::root(), Context::root());
        assert_ne!(a.trace_id, b.trace_id);
        assert_ne!(a.span_id, b.span_id);
        let child = a.child();
        assert_eq!(
            (child.trace_id, child.parent),
            (a.trace_id, Some(a.span_id))
        );
    }
}
