//! The config file: routes, their topics and handlers, and the broker.
//!
//! Everything is validated before anything runs, and validation reports every
//! problem at once, each naming the route it belongs to. See docs/config.md.

use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
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

/// The config file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub kafka: KafkaConfig,
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteConfig>,
    /// The delay relay; runs when this table is present.
    pub delay: Option<DelayConfig>,
}

/// Default delay ladder: 1s up to 1d.
pub const DEFAULT_DELAY_TIERS: [Duration; 8] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(2 * 60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(60 * 60),
    Duration::from_secs(6 * 60 * 60),
    Duration::from_secs(24 * 60 * 60),
];

/// The delay relay as written: where delayed messages come in, and the
/// ladder of tiers they cascade down.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelayConfig {
    /// The topic producers send delayed messages to. Default `hopper.delay`.
    #[serde(default = "default_inbox")]
    pub inbox: String,
    /// Tier waits, shortest first. Default 1s, 5s, 30s, 2m, 10m, 1h, 6h, 1d.
    pub tiers: Option<Vec<HumanDuration>>,
    /// Longest delay accepted. Default 30 days.
    #[serde(default = "default_max_delay", with = "humantime_serde")]
    pub max_delay: Duration,
    /// Dead-letter topic for messages that cannot be scheduled. Default
    /// `<inbox>.dlq`.
    pub dlq: Option<String>,
    /// Consumer group. Default `hopper.delay`.
    pub group: Option<String>,
    /// Prefix of tier topics. Default `<inbox>`, giving `hopper.delay.30m`.
    pub tier_prefix: Option<String>,
}

fn default_inbox() -> String {
    "hopper.delay".into()
}
fn default_max_delay() -> Duration {
    Duration::from_secs(30 * 24 * 60 * 60)
}

/// The delay relay with every default filled in.
#[derive(Debug, Clone)]
pub struct DelayRelay {
    pub inbox: String,
    /// (wait, topic), shortest first.
    pub tiers: Vec<(Duration, String)>,
    pub max_delay: Duration,
    pub dlq: String,
    pub group: String,
}

impl DelayRelay {
    pub fn all_topics(&self) -> Vec<String> {
        let mut topics = vec![self.inbox.clone(), self.dlq.clone()];
        topics.extend(self.tiers.iter().map(|(_, t)| t.clone()));
        topics
    }
}

impl DelayConfig {
    fn resolve(&self, problems: &mut Vec<String>) -> Option<DelayRelay> {
        let before = problems.len();
        let waits: Vec<Duration> = match &self.tiers {
            Some(t) => t.iter().map(|d| d.0).collect(),
            None => DEFAULT_DELAY_TIERS.to_vec(),
        };
        if waits.is_empty() {
            problems.push("delay: tiers is empty; give at least one tier".into());
        }
        if waits.iter().any(|d| *d < Duration::from_secs(1)) {
            problems.push("delay: tiers must be at least 1s".into());
        }
        for pair in waits.windows(2) {
            if pair[1] <= pair[0] {
                problems.push(format!(
                    "delay: invalid tier ladder: {} follows {}; tiers must get longer",
                    compact_duration(pair[1]),
                    compact_duration(pair[0])
                ));
            }
        }
        if self.max_delay.is_zero() {
            problems.push("delay: max_delay must be more than 0s".into());
        }
        let dlq = self
            .dlq
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", self.inbox));
        let group = self.group.clone().unwrap_or_else(|| "hopper.delay".into());
        let prefix = self
            .tier_prefix
            .clone()
            .unwrap_or_else(|| self.inbox.clone());
        for (what, name) in [
            ("inbox", &self.inbox),
            ("dlq", &dlq),
            ("group", &group),
            ("tier_prefix", &prefix),
        ] {
            if let Err(e) = check_name(name) {
                problems.push(format!("delay: {what} `{name}` {e}"));
            }
        }
        if problems.len() > before {
            return None;
        }
        Some(DelayRelay {
            tiers: waits
                .into_iter()
                .map(|d| (d, format!("{prefix}.{}", compact_duration(d))))
                .collect(),
            inbox: self.inbox.clone(),
            max_delay: self.max_delay,
            dlq,
            group,
        })
    }
}

/// How hopper reaches Kafka.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers. When absent, hopper starts an embedded in-process
    /// broker on 127.0.0.1 (for demos and trials, not production).
    pub brokers: Option<String>,
    /// Create missing topics at startup. When false, startup fails naming
    /// every missing topic instead.
    #[serde(default = "default_true")]
    pub create_topics: bool,
    /// Partitions of each topic hopper creates.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Replication factor of each topic hopper creates.
    #[serde(default = "default_replication")]
    pub replication: i32,
    /// Extra librdkafka properties for every client, for example
    /// `"security.protocol" = "ssl"`. Hopper's own delivery guarantees
    /// (acks, idempotence, manual offset storage) cannot be overridden.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: None,
            create_topics: true,
            partitions: default_partitions(),
            replication: default_replication(),
            properties: BTreeMap::new(),
        }
    }
}

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
    /// Wall-clock limit of one handler call. Default 1s.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
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
}

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

/// A duration written in humantime (`5s`, `30m`) inside a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text)
            .map(HumanDuration)
            .map_err(|e| serde::de::Error::custom(format!("invalid duration `{text}`: {e}")))
    }
}

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

fn default_true() -> bool {
    true
}
fn default_partitions() -> i32 {
    3
}
fn default_replication() -> i32 {
    1
}
fn default_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_memory_mib() -> u64 {
    64
}

/// Every problem found in a config, each naming the route it belongs to.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path} has {} problem(s):\n{}", problems.len(), Problems(problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

struct Problems<'a>(&'a [String]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  - {problem}")?;
        }
        Ok(())
    }
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

    /// Every topic this route reads or writes.
    pub fn all_topics(&self) -> Vec<String> {
        let mut topics = self.topics.clone();
        topics.extend(self.tiers().into_iter().map(|(_, t)| t));
        topics.push(self.dlq.clone());
        topics
    }
}

/// `Duration` as a topic-safe humantime string: `90s` → `1m30s`.
pub fn compact_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string().replace(' ', "")
}

impl Config {
    /// Reads, parses and validates a config file. Relative handler paths are
    /// resolved against the file's directory.
    pub fn load(path: &Path) -> Result<(Config, Vec<Route>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config = Config::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let routes = config
            .resolve(base)
            .map_err(|problems| ConfigError::Invalid {
                path: path.to_path_buf(),
                problems,
            })?;
        Ok((config, routes))
    }

    pub fn parse(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())
    }

    /// Fills in defaults and checks everything, returning every problem.
    pub fn resolve(&self, base: &Path) -> Result<Vec<Route>, Vec<String>> {
        let mut problems = Vec::new();
        if self.routes.is_empty() && self.delay.is_none() {
            problems.push("nothing to run: add a [[route]] table or a [delay] table".to_string());
        }
        if self.kafka.partitions < 1 {
            problems.push(format!(
                "kafka.partitions must be at least 1, not {}",
                self.kafka.partitions
            ));
        }
        if self.kafka.replication < 1 {
            problems.push(format!(
                "kafka.replication must be at least 1, not {}",
                self.kafka.replication
            ));
        }
        for key in self.kafka.properties.keys() {
            if crate::kafka::PROTECTED_PROPERTIES.contains(&key.as_str()) {
                problems.push(format!(
                    "kafka.properties.\"{key}\" is set by hopper itself and cannot be overridden"
                ));
            }
        }
        let mut routes = Vec::new();
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (index, raw) in self.routes.iter().enumerate() {
            let label = if raw.name.is_empty() {
                format!("route #{}", index + 1)
            } else {
                format!("route `{}`", raw.name)
            };
            if let Some(first) = names.insert(raw.name.as_str(), index)
                && !raw.name.is_empty()
            {
                problems.push(format!(
                    "{label}: name is used by route #{} as well",
                    first + 1
                ));
            }
            if let Some(route) = resolve_route(raw, &label, base, &mut problems) {
                routes.push(route);
            }
        }
        check_topic_overlap(&routes, &mut problems);
        if let Some(relay) = self.delay.as_ref().and_then(|d| d.resolve(&mut problems)) {
            for route in &routes {
                for topic in route.all_topics() {
                    if relay.all_topics().contains(&topic) {
                        problems.push(format!(
                            "route `{}`: topic `{topic}` is also a topic of the delay relay",
                            route.name
                        ));
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(routes)
        } else {
            Err(problems)
        }
    }

    /// The delay relay, resolved; `None` when the config has no `[delay]`.
    /// Call after [`Config::resolve`] succeeded.
    pub fn delay_relay(&self) -> Option<DelayRelay> {
        let mut problems = Vec::new();
        self.delay.as_ref().and_then(|d| d.resolve(&mut problems))
    }
}

fn resolve_route(
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
    let max_attempts = raw.max_attempts.unwrap_or(ladder.len() as u32 + 1);
    if max_attempts == 0 {
        problems.push(format!("{label}: max_attempts must be at least 1"));
    }
    if max_attempts > 1 && ladder.is_empty() {
        problems.push(format!(
            "{label}: max_attempts is {max_attempts} but the retry ladder is empty"
        ));
    }
    if raw.timeout.is_zero() {
        problems.push(format!("{label}: timeout must be more than 0s"));
    }
    if raw.memory_mib == 0 || raw.memory_mib > 4096 {
        problems.push(format!(
            "{label}: memory_mib must be between 1 and 4096, not {}",
            raw.memory_mib
        ));
    }
    let instance = resolve_instance(raw, label, problems);
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
    // Names derived from a bad route name would only repeat its problem.
    let name_ok = check_name(&raw.name).is_ok();
    for (what, name, explicit) in [
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
        timeout: raw.timeout,
        memory_bytes: (raw.memory_mib as usize) << 20,
        instance,
        config: raw.config.clone(),
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

/// Kafka's rule for topic names, which also serves for route and group names.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name.len() > 249 {
        return Err(format!(
            "is {} characters long; the limit is 249",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err("cannot be `.` or `..`".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "has `{c}`; only ASCII letters, digits, `.`, `_` and `-` are allowed"
        ));
    }
    Ok(())
}

/// A topic hopper writes for one route must not be another route's input or
/// tier, or messages would loop between routes.
fn check_topic_overlap(routes: &[Route], problems: &mut Vec<String>) {
    let mut owners: HashMap<String, (String, &'static str)> = HashMap::new();
    for route in routes {
        let mut owned: Vec<(String, &'static str)> = route
            .tiers()
            .into_iter()
            .map(|(_, t)| (t, "retry tier"))
            .collect();
        owned.push((route.dlq.clone(), "dead-letter topic"));
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
    for route in routes {
        for topic in &route.topics {
            if let Some((other, kind)) = owners.get(topic)
                && *kind == "retry tier"
            {
                problems.push(format!(
                    "route `{}`: input topic `{topic}` is the {kind} of route `{other}`",
                    route.name
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_handler(dir: &Path) {
        std::fs::write(dir.join("h.wasm"), b"not checked here").unwrap();
    }

    #[test]
    fn defaults_fill_in() {
        let dir = tempfile::tempdir().unwrap();
        write_handler(dir.path());
        let config = Config::parse(
            r#"
            [[route]]
            name = "orders"
            topics = ["orders"]
            handler = "h.wasm"
            "#,
        )
        .unwrap();
        let routes = config.resolve(dir.path()).unwrap();
        let route = &routes[0];
        assert_eq!(route.retry_ladder, DEFAULT_RETRY_LADDER.to_vec());
        assert_eq!(route.max_attempts, 6);
        assert_eq!(route.dlq, "orders.dlq");
        assert_eq!(route.group, "hopper.orders");
        assert_eq!(route.tier_topic(Duration::from_secs(5)), "orders.retry.5s");
        assert_eq!(
            route.tier_topic(Duration::from_secs(90)),
            "orders.retry.1m30s"
        );
        assert_eq!(route.memory_bytes, 64 << 20);
        assert!(config.kafka.brokers.is_none());
    }

    #[test]
    fn equal_rungs_share_a_tier() {
        let dir = tempfile::tempdir().unwrap();
        write_handler(dir.path());
        let config = Config::parse(
            r#"
            [[route]]
            name = "r"
            topics = ["in"]
            handler = "h.wasm"
            retry = ["1s", "1s", "5s"]
            "#,
        )
        .unwrap();
        let route = &config.resolve(dir.path()).unwrap()[0];
        let tiers: Vec<String> = route.tiers().into_iter().map(|(_, t)| t).collect();
        assert_eq!(tiers, vec!["r.retry.1s", "r.retry.5s"]);
        assert_eq!(route.max_attempts, 4);
    }

    #[test]
    fn every_problem_is_reported_with_its_route() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::parse(
            r#"
            [kafka]
            partitions = 0

            [[route]]
            name = "orders"
            topics = []
            handler = "missing.wasm"
            retry = ["5m", "30s"]
            max_attempts = 0

            [[route]]
            name = "bad name!"
            topics = ["ok", "not ok"]
            handler = "missing.wasm"
            memory_mib = 0
            "#,
        )
        .unwrap();
        let problems = config.resolve(dir.path()).unwrap_err();
        let text = problems.join("\n");
        for expected in [
            "kafka.partitions must be at least 1",
            "route `orders`: no input topics",
            "route `orders`: handler",
            "route `orders`: invalid retry ladder: 30s follows 5m",
            "route `orders`: max_attempts must be at least 1",
            "route `bad name!`: name has ` `",
            "route `bad name!`: input topic `not ok` has ` `",
            "route `bad name!`: memory_mib must be between 1 and 4096",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        assert_eq!(problems.len(), 9, "{text}");
    }

    #[test]
    fn instance_policy_defaults_and_problems_name_the_route() {
        let dir = tempfile::tempdir().unwrap();
        write_handler(dir.path());
        let config = Config::parse(
            r#"
            [[route]]
            name = "default"
            topics = ["a"]
            handler = "h.wasm"

            [[route]]
            name = "fresh"
            topics = ["b"]
            handler = "h.wasm"
            instance = "fresh"

            [[route]]
            name = "warm"
            topics = ["c"]
            handler = "h.wasm"
            instance = "warm"
            warm_max_calls = 10
            "#,
        )
        .unwrap();
        let routes = config.resolve(dir.path()).unwrap();
        let policies: Vec<InstancePolicy> = routes.iter().map(|r| r.instance).collect();
        assert_eq!(
            policies,
            vec![
                InstancePolicy::Warm {
                    max_calls: DEFAULT_WARM_MAX_CALLS
                },
                InstancePolicy::Fresh,
                InstancePolicy::Warm { max_calls: 10 },
            ]
        );

        let config = Config::parse(
            r#"
            [[route]]
            name = "zero"
            topics = ["a"]
            handler = "h.wasm"
            warm_max_calls = 0

            [[route]]
            name = "mixed"
            topics = ["b"]
            handler = "h.wasm"
            instance = "fresh"
            warm_max_calls = 5
            "#,
        )
        .unwrap();
        let problems = config.resolve(dir.path()).unwrap_err();
        assert_eq!(
            problems,
            vec![
                "route `zero`: warm_max_calls must be between 1 and 1000000, not 0",
                "route `mixed`: warm_max_calls is set but instance is \"fresh\"; it only applies to instance = \"warm\"",
            ]
        );
        let err = Config::parse(
            "[[route]]\nname = \"r\"\ntopics = [\"a\"]\nhandler = \"h.wasm\"\ninstance = \"hot\"\n",
        )
        .unwrap_err();
        assert!(err.contains("unknown variant `hot`"), "{err}");
    }

    #[test]
    fn unknown_fields_are_rejected_by_name() {
        let err = Config::parse(
            r#"
            [[route]]
            name = "orders"
            topics = ["orders"]
            handler = "h.wasm"
            max_attempt = 3
            "#,
        )
        .unwrap_err();
        assert!(err.contains("unknown field `max_attempt`"), "{err}");
    }

    #[test]
    fn a_route_cannot_write_into_another_routes_tier() {
        let dir = tempfile::tempdir().unwrap();
        write_handler(dir.path());
        let config = Config::parse(
            r#"
            [[route]]
            name = "a"
            topics = ["in"]
            handler = "h.wasm"
            retry = ["5s"]

            [[route]]
            name = "b"
            topics = ["a.retry.5s"]
            handler = "h.wasm"
            "#,
        )
        .unwrap();
        let problems = config.resolve(dir.path()).unwrap_err();
        assert_eq!(
            problems,
            vec!["route `b`: input topic `a.retry.5s` is the retry tier of route `a`"]
        );
    }
}
