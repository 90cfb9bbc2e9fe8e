//! `[[route]]`: a route as written, and resolved with every default filled
//! in.

use super::breaker::{BreakerConfig, BreakerSettings};
use super::grants::{self, EmitConfig, Grants, HttpConfig, RawGrants};
use super::{HumanDuration, check_name, compact_duration};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default retry ladder: the wait before attempt 2, 3, ... of a message.
pub const DEFAULT_RETRY_LADDER: [Duration; 5] = [
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 60 * 60),
];

/// One route: input topics, a handler, a retry ladder and a dead-letter topic.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub name: String,
    /// Input topics; a route reads all of them with one consumer group.
    pub topics: Vec<String>,
    /// Path of the handler component, relative to the config file.
    pub handler: PathBuf,
    /// Wait before attempt 2, 3, ... . When a message needs more attempts
    /// than the ladder has rungs, the last rung repeats.
    #[serde(default, rename = "retry")]
    pub retry_ladder: Option<Vec<HumanDuration>>,
    /// Deliveries a message gets in all, the first included. Defaults to one
    /// more than the rungs of the retry ladder.
    pub max_attempts: Option<u32>,
    /// Dead-letter topic. Default: `<name>.dlq`.
    pub dlq: Option<String>,
    /// Consumer group. Default: `hopper.<name>`.
    pub group: Option<String>,
    /// Prefix of the retry tier topics. Default: `<name>.retry`, giving
    /// topics such as `orders.retry.5s`.
    pub retry_topic_prefix: Option<String>,
    /// What a guest trap does: `dead-letter` (default) or `retry`.
    #[serde(default)]
    pub on_trap: TrapPolicy,
    /// Wall-clock limit of one handler call, time waiting on HTTP included.
    /// Default 1s, or 5s when the route grants `allowed_hosts`.
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// Linear-memory limit of one handler instance, in MiB. Default 64.
    #[serde(default = "default_memory_mib")]
    pub memory_mib: u64,
    /// Instance policy: `warm` (default) reuses an instance for up to
    /// `warm_max_calls` calls; `fresh` instantiates for every call.
    #[serde(default)]
    pub instance: InstanceMode,
    /// Calls a warm instance serves before it is retired. Default 1000.
    pub warm_max_calls: Option<u32>,
    /// Values the handler reads through the `config` import.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Hosts the handler may call over HTTP, in Spin's syntax
    /// (`https://api.example.com`, `http://127.0.0.1:8080`). Default none.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Limits of the route's outbound HTTP.
    #[serde(default)]
    pub http: HttpConfig,
    /// Topics the handler may emit records to. Default none.
    #[serde(default)]
    pub emit_topics: Vec<String>,
    /// Limits of the records one call may emit.
    #[serde(default)]
    pub emit: EmitConfig,
    /// Ids of delayed messages the handler may cancel or replace through
    /// emit: exact ids, or prefixes ending in `*` (`"timeout-*"`, `"*"`
    /// for any). Default none.
    #[serde(default)]
    pub cancel_ids: Vec<String>,
    /// Secrets the handler may read, by name: `env:VARIABLE` or
    /// `file:PATH` (relative to the config file). Read once at startup.
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    /// Which messages of one partition may be handled at the same time:
    /// `key` (default: one at a time per key, different keys at once),
    /// `partition` (one at a time) or `unordered`.
    pub ordering: Option<MessageOrder>,
    /// Messages of one partition handled at once, at most. Default 16.
    pub max_in_flight: Option<usize>,
    /// `key`: a message sent to a retry tier parks its key, and later
    /// messages of the key wait behind it, in the park topic, until it
    /// resolves (docs/ordered-retries.md). Only with `ordering = "key"`.
    /// Default `none`: a retried message leaves its key's order.
    #[serde(default)]
    pub retry_order: RetryOrder,
    /// What a parked key's head being dead-lettered does to the rest of the
    /// key: `continue` (default) or `dead-letter-key`.
    #[serde(default)]
    pub on_key_dead_letter: KeyDeadLetter,
    /// The compacted topic that holds parked keys and their messages.
    /// Default: `<name>.parked`.
    pub parked_topic: Option<String>,
    /// The most bytes of parked messages the route holds in memory (every
    /// process of the route holds them all); past it, a message that would
    /// be parked waits, and with it its partition. Default 64.
    pub max_parked_mib: Option<u64>,
    /// The most bytes of parked messages one key may hold; past it, the
    /// key's next messages are dead-lettered as `KEY_PARK_FULL`. Default an
    /// eighth of `max_parked_mib`.
    pub max_parked_key_mib: Option<u64>,
    /// Handler instances the route may have at once (one per running call).
    /// Default 64. `max_instances × memory_mib` is the most linear memory
    /// the route's handlers can take; see `[limits]`.
    pub max_instances: Option<usize>,
    /// The route's circuit breaker; off without the table.
    #[serde(default)]
    pub breaker: Option<BreakerConfig>,
}

/// Whether a retried message keeps its key's order (`retry_order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryOrder {
    /// A retried message leaves its key's order: later messages of the key
    /// are handled while it waits in its tier.
    #[default]
    None,
    /// A retried message parks its key until it resolves.
    Key,
}

/// What a parked key's head being dead-lettered does to the rest of the key
/// (`on_key_dead_letter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyDeadLetter {
    /// The key's parked messages are handled, in order.
    #[default]
    Continue,
    /// The key's parked messages, and those that arrive until an operator
    /// releases the key, are dead-lettered with `KEY_BLOCKED`.
    DeadLetterKey,
}

/// Default `max_parked_mib`.
pub const DEFAULT_MAX_PARKED_MIB: u64 = 64;
/// Upper bound of `max_parked_mib`.
pub const MAX_PARKED_MIB: u64 = 64 * 1024;

/// A route's ordered retries (`retry_order = "key"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parking {
    /// The compacted park topic.
    pub topic: String,
    pub on_dead_letter: KeyDeadLetter,
    /// Bytes of parked messages held in memory, at most.
    pub max_bytes: usize,
    /// Bytes of parked messages one key may hold, at most.
    pub max_key_bytes: usize,
}

/// How a pipeline runs the messages of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    pub ordering: MessageOrder,
    /// Messages of one partition being processed at once, at most.
    pub max_in_flight: usize,
}

impl Concurrency {
    /// One message of a partition at a time, in offset order.
    pub const ONE_AT_A_TIME: Concurrency = Concurrency {
        ordering: MessageOrder::Partition,
        max_in_flight: 1,
    };
}

/// Which messages of one partition may be processed at the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageOrder {
    /// One at a time, in offset order.
    Partition,
    /// Messages of one key in offset order; different keys at once. A
    /// message without a key is a key of its own.
    Key,
    /// Any message at any time.
    Unordered,
}

impl MessageOrder {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageOrder::Partition => "partition",
            MessageOrder::Key => "key",
            MessageOrder::Unordered => "unordered",
        }
    }
}

/// Default `ordering`: what a Kafka user expects of a keyed topic (records
/// of one key in order), with room for handlers that wait on I/O.
pub const DEFAULT_ORDERING: MessageOrder = MessageOrder::Key;
/// Default `max_in_flight`: 16 calls per partition turn a 20 ms HTTP call
/// from 50 into about 800 messages a second per partition, while a crash or
/// rebalance re-delivers at most 16 messages per partition.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 16;
/// Upper bound of `max_in_flight`.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Default `max_instances`: 64 instances of the default 64 MiB are 4 GiB of
/// linear memory at most, and serve 4 partitions at the default
/// `max_in_flight`; a route with more partitions waits for an instance
/// rather than growing without bound.
pub const DEFAULT_MAX_INSTANCES: usize = 64;

/// How a route's handler calls get their instance, as written in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceMode {
    /// Reuse an instance for many calls: several times cheaper per call (see
    /// docs/operations.md), at the price of guest globals surviving between
    /// messages.
    #[default]
    Warm,
    /// A new instance for every call: nothing a call leaves behind is seen
    /// by the next one.
    Fresh,
}

/// The resolved instance policy of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstancePolicy {
    Fresh,
    /// An instance serves at most `max_calls` calls, and is dropped at once
    /// after a call that trapped, timed out or hit the memory cap.
    Warm {
        max_calls: u32,
    },
}

/// Default `warm_max_calls`: long enough to amortise instantiation, short
/// enough that a slow leak in a guest is reset regularly.
pub const DEFAULT_WARM_MAX_CALLS: u32 = 1000;
/// Upper bound of `warm_max_calls`, so an instance is retired eventually.
pub const MAX_WARM_MAX_CALLS: u32 = 1_000_000;

/// What happens to a message whose handler call trapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrapPolicy {
    /// Straight to the dead-letter topic with reason HANDLER_TRAP: a trap is
    /// almost always a bug that the same input will hit again.
    #[default]
    DeadLetter,
    /// Count it as a failed attempt and retry up the ladder, which lets a
    /// hot-reloaded fix pick the message up.
    Retry,
}

/// Default `timeout` of a handler that only computes: a no-op call takes
/// microseconds, so a second means a bug, and a partition is not held up
/// for long by one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default `timeout` of a route that grants `allowed_hosts`: room for a
/// connect (2s at most by default) and a slow answer from a service under
/// load, short enough that a hung service holds a partition for seconds,
/// not minutes; the retry ladder is the place to wait longer.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Upper bound of `timeout`: a call that long holds its partition's
/// place for an hour, and a deadline past it is only arithmetic that can
/// overflow (a call's deadline is its start plus the timeout).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Upper bound of a retry rung: a message's due time is computed in
/// milliseconds from it, and a tier must keep its messages longer than its
/// wait (docs/scaling.md): a month is past any retention set for retries.
pub const MAX_RETRY_RUNG: Duration = Duration::from_secs(30 * 24 * 3600);
/// Upper bound of `max_instances`, and of all routes' together: the
/// runtime's instance slots.
pub const MAX_INSTANCES: usize = 1000;

fn default_memory_mib() -> u64 {
    64
}

/// A route with every default filled in and every path resolved.
#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    pub topics: Vec<String>,
    pub handler: PathBuf,
    pub retry_ladder: Vec<Duration>,
    pub max_attempts: u32,
    pub dlq: String,
    pub group: String,
    pub retry_topic_prefix: String,
    pub on_trap: TrapPolicy,
    pub timeout: Duration,
    pub memory_bytes: usize,
    pub instance: InstancePolicy,
    pub config: BTreeMap<String, String>,
    /// What the handler may do besides computing: HTTP, emits, secrets.
    pub grants: Grants,
    /// How many messages of one partition run at once, and in what order.
    pub concurrency: Concurrency,
    /// Handler instances at once, at most.
    pub max_instances: usize,
    /// The circuit breaker, when `[route.breaker]` is there.
    pub breaker: Option<BreakerSettings>,
    /// Ordered retries, with `retry_order = "key"`.
    pub parking: Option<Parking>,
}

impl Route {
    /// The retry tier topic for one rung of the ladder: `<prefix>.<duration>`,
    /// the duration in compact humantime (`5s`, `1m30s`, `2h`). Rungs of equal
    /// duration share one topic, because every message in a tier waits the
    /// same time.
    pub fn tier_topic(&self, delay: Duration) -> String {
        format!("{}.{}", self.retry_topic_prefix, compact_duration(delay))
    }

    /// The distinct retry tiers of this route, shortest first.
    pub fn tiers(&self) -> Vec<(Duration, String)> {
        let mut delays = self.retry_ladder.clone();
        delays.sort();
        delays.dedup();
        delays
            .into_iter()
            .map(|d| (d, self.tier_topic(d)))
            .collect()
    }

    /// Every topic this route reads or writes, the topics its handler may
    /// emit to included.
    pub fn all_topics(&self) -> Vec<String> {
        let mut topics = self.topics.clone();
        topics.extend(self.tiers().into_iter().map(|(_, t)| t));
        topics.push(self.dlq.clone());
        if let Some(parking) = &self.parking {
            topics.push(parking.topic.clone());
        }
        for topic in &self.grants.emit_topics {
            if !topics.contains(topic) {
                topics.push(topic.clone());
            }
        }
        topics
    }
}

pub(super) fn resolve_route(
    raw: &RouteConfig,
    label: &str,
    base: &Path,
    problems: &mut Vec<String>,
) -> Option<Route> {
    let before = problems.len();
    if raw.name.is_empty() {
        problems.push(format!("{label}: name is empty"));
    } else if let Err(e) = check_name(&raw.name) {
        problems.push(format!("{label}: name {e}"));
    }
    if raw.topics.is_empty() {
        problems.push(format!("{label}: no input topics"));
    }
    for topic in &raw.topics {
        if let Err(e) = check_name(topic) {
            problems.push(format!("{label}: input topic `{topic}` {e}"));
        }
    }
    let handler = base.join(&raw.handler);
    if raw.handler.as_os_str().is_empty() {
        problems.push(format!("{label}: handler path is empty"));
    } else if !handler.is_file() {
        problems.push(format!(
            "{label}: handler {} does not exist or is not a file",
            handler.display()
        ));
    }
    let ladder: Vec<Duration> = match &raw.retry_ladder {
        Some(rungs) => rungs.iter().map(|d| d.0).collect(),
        None => DEFAULT_RETRY_LADDER.to_vec(),
    };
    for (i, pair) in ladder.windows(2).enumerate() {
        if pair[1] < pair[0] {
            problems.push(format!(
                "{label}: invalid retry ladder: {} follows {} (rung {}); rungs must not get shorter",
                compact_duration(pair[1]),
                compact_duration(pair[0]),
                i + 2
            ));
        }
    }
    if ladder.iter().any(|d| d.is_zero()) {
        problems.push(format!("{label}: invalid retry ladder: a rung of 0s"));
    }
    if let Some(&longest) = ladder.iter().max()
        && longest > MAX_RETRY_RUNG
    {
        problems.push(format!(
            "{label}: invalid retry ladder: a rung of {}; rungs may be at most {}",
            compact_duration(longest),
            compact_duration(MAX_RETRY_RUNG)
        ));
    }
    let max_attempts = raw.max_attempts.unwrap_or(ladder.len() as u32 + 1);
    if max_attempts == 0 {
        problems.push(format!("{label}: max_attempts must be at least 1"));
    }
    if max_attempts > 1 && ladder.is_empty() {
        problems.push(format!(
            "{label}: max_attempts is {max_attempts} but the retry ladder is empty"
        ));
    }
    let timeout = raw.timeout.unwrap_or(if raw.allowed_hosts.is_empty() {
        DEFAULT_TIMEOUT
    } else {
        DEFAULT_IO_TIMEOUT
    });
    if timeout.is_zero() {
        problems.push(format!("{label}: timeout must be more than 0s"));
    }
    if timeout > MAX_TIMEOUT {
        problems.push(format!(
            "{label}: timeout must be at most {}, not {}",
            compact_duration(MAX_TIMEOUT),
            compact_duration(timeout)
        ));
    }
    let max_instances = raw.max_instances.unwrap_or(DEFAULT_MAX_INSTANCES);
    if max_instances == 0 || max_instances > MAX_INSTANCES {
        problems.push(format!(
            "{label}: max_instances must be between 1 and {MAX_INSTANCES}, not {max_instances}"
        ));
    }
    let grants = grants::resolve(
        RawGrants {
            allowed_hosts: &raw.allowed_hosts,
            http: &raw.http,
            emit_topics: &raw.emit_topics,
            emit: &raw.emit,
            cancel_ids: &raw.cancel_ids,
            secrets: &raw.secrets,
            max_instances,
        },
        label,
        base,
        problems,
    );
    if raw.memory_mib == 0 || raw.memory_mib > 4096 {
        problems.push(format!(
            "{label}: memory_mib must be between 1 and 4096, not {}",
            raw.memory_mib
        ));
    }
    let instance = resolve_instance(raw, label, problems);
    let ordering = raw.ordering.unwrap_or(DEFAULT_ORDERING);
    let max_in_flight = match ordering {
        MessageOrder::Partition => raw.max_in_flight.unwrap_or(1),
        _ => raw.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT),
    };
    if max_in_flight == 0 || max_in_flight > MAX_IN_FLIGHT {
        problems.push(format!(
            "{label}: max_in_flight must be between 1 and {MAX_IN_FLIGHT}, not {max_in_flight}"
        ));
    }
    let breaker = raw.breaker.as_ref().map(|b| b.resolve(label, problems));
    if breaker.as_ref().is_some_and(|b| !b.pause_input) && max_attempts == 1 {
        problems.push(format!(
            "{label}: breaker has nothing to pause: max_attempts is 1, so no message waits in a retry tier; set breaker.pause_input = true or allow retries"
        ));
    }
    let dlq = raw
        .dlq
        .clone()
        .unwrap_or_else(|| format!("{}.dlq", raw.name));
    let group = raw
        .group
        .clone()
        .unwrap_or_else(|| format!("hopper.{}", raw.name));
    let retry_topic_prefix = raw
        .retry_topic_prefix
        .clone()
        .unwrap_or_else(|| format!("{}.retry", raw.name));
    let parked_topic = raw
        .parked_topic
        .clone()
        .unwrap_or_else(|| format!("{}.parked", raw.name));
    let parking = resolve_parking(raw, ordering, &parked_topic, label, problems);
    // Names derived from a bad route name would only repeat its problem.
    let name_ok = check_name(&raw.name).is_ok();
    for (what, name, explicit) in [
        ("parked_topic", &parked_topic, raw.parked_topic.is_some()),
        ("dlq", &dlq, raw.dlq.is_some()),
        ("group", &group, raw.group.is_some()),
        (
            "retry_topic_prefix",
            &retry_topic_prefix,
            raw.retry_topic_prefix.is_some(),
        ),
    ] {
        if !(explicit || name_ok) {
            continue;
        }
        if let Err(e) = check_name(name) {
            problems.push(format!("{label}: {what} `{name}` {e}"));
        }
    }
    if problems.len() > before {
        return None;
    }
    Some(Route {
        name: raw.name.clone(),
        topics: raw.topics.clone(),
        handler,
        retry_ladder: ladder,
        max_attempts,
        dlq,
        group,
        retry_topic_prefix,
        on_trap: raw.on_trap,
        timeout,
        memory_bytes: (raw.memory_mib as usize) << 20,
        instance,
        config: raw.config.clone(),
        grants,
        concurrency: Concurrency {
            ordering,
            max_in_flight,
        },
        max_instances,
        breaker,
        parking,
    })
}

fn resolve_parking(
    raw: &RouteConfig,
    ordering: MessageOrder,
    topic: &str,
    label: &str,
    problems: &mut Vec<String>,
) -> Option<Parking> {
    let mib = raw.max_parked_mib.unwrap_or(DEFAULT_MAX_PARKED_MIB);
    if raw.retry_order == RetryOrder::None {
        let set: Vec<&str> = [
            (
                "on_key_dead_letter",
                raw.on_key_dead_letter != KeyDeadLetter::Continue,
            ),
            ("parked_topic", raw.parked_topic.is_some()),
            ("max_parked_mib", raw.max_parked_mib.is_some()),
            ("max_parked_key_mib", raw.max_parked_key_mib.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect();
        if !set.is_empty() {
            problems.push(format!(
                "{label}: {} only apply with retry_order = \"key\"",
                set.join(", ")
            ));
        }
        return None;
    }
    if ordering != MessageOrder::Key {
        problems.push(format!(
            "{label}: retry_order = \"key\" needs ordering = \"key\", not \"{}\": a key is parked in its partition, which only per-key ordering tracks",
            ordering.as_str()
        ));
    }
    if mib == 0 || mib > MAX_PARKED_MIB {
        problems.push(format!(
            "{label}: max_parked_mib must be between 1 and {MAX_PARKED_MIB}, not {mib}"
        ));
    }
    let max_bytes = (mib as usize) << 20;
    let max_key_bytes = match raw.max_parked_key_mib {
        None => max_bytes / 8,
        Some(key_mib) => {
            if key_mib == 0 || key_mib > mib {
                problems.push(format!(
                    "{label}: max_parked_key_mib must be between 1 and max_parked_mib ({mib}), not {key_mib}"
                ));
            }
            (key_mib as usize) << 20
        }
    };
    Some(Parking {
        topic: topic.to_string(),
        on_dead_letter: raw.on_key_dead_letter,
        max_bytes,
        max_key_bytes,
    })
}

fn resolve_instance(raw: &RouteConfig, label: &str, problems: &mut Vec<String>) -> InstancePolicy {
    match (raw.instance, raw.warm_max_calls) {
        (InstanceMode::Fresh, None) => InstancePolicy::Fresh,
        (InstanceMode::Fresh, Some(_)) => {
            problems.push(format!(
                "{label}: warm_max_calls is set but instance is \"fresh\"; it only applies to instance = \"warm\""
            ));
            InstancePolicy::Fresh
        }
        (InstanceMode::Warm, max_calls) => {
            let max_calls = max_calls.unwrap_or(DEFAULT_WARM_MAX_CALLS);
            if !(1..=MAX_WARM_MAX_CALLS).contains(&max_calls) {
                problems.push(format!(
                    "{label}: warm_max_calls must be between 1 and {MAX_WARM_MAX_CALLS}, not {max_calls}"
                ));
            }
            InstancePolicy::Warm { max_calls }
        }
    }
}

/// A route's tiers, dead-letter and park topic are its own: none is one of
/// its inputs, and none is another route's (routes may share a dead-letter
/// topic). Inputs and emit topics against every kind of hopper's own
/// topics are `check_owned`'s, in config/mod.rs.
pub(super) fn check_topic_overlap(routes: &[Route], problems: &mut Vec<String>) {
    let mut owners: HashMap<String, (String, &'static str)> = HashMap::new();
    for route in routes {
        let mut owned: Vec<(String, &'static str)> = route
            .tiers()
            .into_iter()
            .map(|(_, t)| (t, "retry tier"))
            .collect();
        owned.push((route.dlq.clone(), "dead-letter topic"));
        if let Some(parking) = &route.parking {
            owned.push((parking.topic.clone(), "park topic"));
        }
        for (topic, kind) in owned {
            if route.topics.contains(&topic) {
                problems.push(format!(
                    "route `{}`: {kind} `{topic}` is also one of its input topics",
                    route.name
                ));
            }
            if let Some((other, other_kind)) = owners.get(&topic) {
                if kind == "dead-letter topic" && *other_kind == "dead-letter topic" {
                    continue; // routes may share a dead-letter topic
                }
                problems.push(format!(
                    "route `{}`: {kind} `{topic}` is also the {other_kind} of route `{other}`",
                    route.name
                ));
            } else {
                owners.insert(topic, (route.name.clone(), kind));
            }
        }
    }
}
