//! The things hopper talks about, as types of their own: a topic's
//! partition, the kind of a handler's verdict, and what became of a hop the
//! broker did not acknowledge. Every layer may use them; they use nothing.

use std::fmt;

/// A partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.topic, self.partition)
    }
}

/// What a record a handler emitted asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EmitKind {
    /// `publish`: a record to a granted topic, at once or through the delay
    /// relay, with an id derived from the source message's.
    Publish,
    /// `schedule`: a delayed record under the handler's own id, replacing
    /// the earlier schedules of that id when `replace`.
    Schedule { replace: bool },
    /// `cancel`: a cancel of every pending schedule of an id.
    Cancel,
}

impl EmitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EmitKind::Publish => "publish",
            EmitKind::Schedule { replace: false } => "schedule",
            EmitKind::Schedule { replace: true } => "replace",
            EmitKind::Cancel => "cancel",
        }
    }
}

impl fmt::Display for EmitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of a handler's verdict: its label in logs, events and the
/// `verdict` label of `hopper_handler_calls_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerdictKind {
    Ok,
    Retryable,
    Fatal,
    /// The guest trapped (HANDLER_TRAP).
    Trap,
    /// The call ran out of time (HANDLER_TIMEOUT).
    Timeout,
    /// The guest hit its memory cap (HANDLER_MEMORY).
    Memory,
}

// `ALL[kind as usize] == kind`, which `events::Calls` indexes its outcome counters by.
const _: () = {
    let mut i = 0;
    while i < VerdictKind::ALL.len() {
        assert!(VerdictKind::ALL[i] as usize == i);
        i += 1;
    }
};

impl VerdictKind {
    /// Every kind, in declaration order: `ALL[kind as usize] == kind`.
    pub const ALL: [VerdictKind; 6] = [
        VerdictKind::Ok,
        VerdictKind::Retryable,
        VerdictKind::Fatal,
        VerdictKind::Trap,
        VerdictKind::Timeout,
        VerdictKind::Memory,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            VerdictKind::Ok => "ok",
            VerdictKind::Retryable => "retryable",
            VerdictKind::Fatal => "fatal",
            VerdictKind::Trap => "trap",
            VerdictKind::Timeout => "timeout",
            VerdictKind::Memory => "memory",
        }
    }
}

impl fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What became of a hop the broker did not acknowledge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HopFailure {
    /// A transient error: the hop is produced again, with backoff.
    Retried,
    /// Refused for good: its message is dead-lettered instead.
    DeadLettered,
    /// A dead-letter record refused for good: the pipeline stops.
    Halted,
}

impl HopFailure {
    pub const ALL: [HopFailure; 3] = [
        HopFailure::Retried,
        HopFailure::DeadLettered,
        HopFailure::Halted,
    ];

    /// The `outcome` label of `hopper_hop_failures_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            HopFailure::Retried => "retried",
            HopFailure::DeadLettered => "dead_lettered",
            HopFailure::Halted => "halted",
        }
    }
}

impl fmt::Display for HopFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lets tests and logs compare a kind with its label: `kind == "ok"`.
impl PartialEq<&str> for VerdictKind {
    fn eq(&self, label: &&str) -> bool {
        self.as_str() == *label
    }
}

/// What a delay-relay cancellation entry came from: a `hopper-cancel`
/// record, or a schedule with `hopper-replace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CancelKind {
    Cancel,
    Replace,
}

impl CancelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelKind::Cancel => "cancel",
            CancelKind::Replace => "replace",
        }
    }

    pub fn parse(text: &str) -> Option<CancelKind> {
        match text {
            "cancel" => Some(CancelKind::Cancel),
            "replace" => Some(CancelKind::Replace),
            _ => None,
        }
    }
}

impl fmt::Display for CancelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the delay relay's inbox read a record: what a cancellation is
/// compared against (docs/headers.md, "read before it").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct InboxPosition {
    pub partition: i32,
    pub offset: i64,
}

impl InboxPosition {
    /// `<partition>:<offset>`, as in `hopper-inbox-position`.
    pub fn parse(text: &str) -> Option<InboxPosition> {
        let (partition, offset) = text.split_once(':')?;
        let position = InboxPosition {
            partition: partition.parse().ok()?,
            offset: offset.parse().ok()?,
        };
        (position.partition >= 0 && position.offset >= 0).then_some(position)
    }

    /// Whether a cancellation read at `self` covers a schedule read at
    /// `schedule`: same partition, and read before it.
    pub fn covers(self, schedule: InboxPosition) -> bool {
        self.partition == schedule.partition && schedule.offset < self.offset
    }
}

impl fmt::Display for InboxPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.partition, self.offset)
    }
}

/// Why a parked key's head no longer holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseCause {
    /// The head's handler returned `ok`.
    Resolved,
    /// The head was dead-lettered.
    DeadLettered,
    /// An operator released the key.
    Operator,
}

impl ReleaseCause {
    pub const ALL: [ReleaseCause; 3] = [
        ReleaseCause::Resolved,
        ReleaseCause::DeadLettered,
        ReleaseCause::Operator,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseCause::Resolved => "resolved",
            ReleaseCause::DeadLettered => "dead-lettered",
            ReleaseCause::Operator => "operator",
        }
    }
}

/// A key in an input partition: what a parked key is parked in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lane {
    pub topic: String,
    pub partition: i32,
    pub key: Vec<u8>,
}

impl Lane {
    /// The key as text, for logs: UTF-8 as is, anything else as hex.
    pub fn key_text(&self) -> String {
        match std::str::from_utf8(&self.key) {
            Ok(text) => text.to_string(),
            Err(_) => format!("0x{}", hex::encode(&self.key)),
        }
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key `{}` of {}[{}]",
            self.key_text(),
            self.topic,
            self.partition
        )
    }
}

/// Why a record read from the park topic was not taken into the table
/// (docs/ordered-retries.md, "What the table believes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParkRefusal {
    /// Its lane is not one of the route's: a topic that is not one of its
    /// inputs, or a partition the topic does not have.
    UnknownLane,
    /// Its input offset cannot be: negative, or past its partition's end.
    BadOffset,
    /// Its time cannot be: negative, or ahead of the clock by more than
    /// five minutes.
    BadTime,
    /// A waiting message of a key with no head, or a head deleted while
    /// messages wait behind it.
    NoHead,
    /// The table holds its ceiling: twice `max_parked_mib`.
    OverCeiling,
    /// It could not be read at all.
    Unreadable,
}

impl ParkRefusal {
    pub const ALL: [ParkRefusal; 6] = [
        ParkRefusal::UnknownLane,
        ParkRefusal::BadOffset,
        ParkRefusal::BadTime,
        ParkRefusal::NoHead,
        ParkRefusal::OverCeiling,
        ParkRefusal::Unreadable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ParkRefusal::UnknownLane => "unknown-lane",
            ParkRefusal::BadOffset => "bad-offset",
            ParkRefusal::BadTime => "bad-time",
            ParkRefusal::NoHead => "no-head",
            ParkRefusal::OverCeiling => "over-ceiling",
            ParkRefusal::Unreadable => "unreadable",
        }
    }
}
