//! The config file: routes, their topics and handlers, the delay relay and
//! the broker.
//!
//! Everything is validated before anything runs, and validation reports every
//! problem at once, each naming the route it belongs to. [`Config::load`]
//! returns the one resolved value the rest of hopper runs from. See
//! docs/config.md.

mod acls;
mod admin;
mod breaker;
mod delay;
mod grants;
mod groups;
mod kafka;
mod limits;
mod owned;
mod route;
mod secrets;
mod tracing;

pub use acls::{
    Acl, AclsFor, DLQ_READER_GROUP, Operation, Resource, STATUS_GROUP, kafka_acls_script,
    table_reader_group,
};
pub use admin::{Admin, AdminConfig, ReplayConfig, TOKEN_ENV};
pub use breaker::{BreakerConfig, BreakerSettings};
pub use delay::{DEFAULT_DELAY_TIERS, DelayConfig, DelayRelay, RELAY_ROUTE};
pub use grants::{CancelIds, DelayGrant, EmitConfig, EmitLimits, Grants, HttpConfig, HttpLimits};
pub use kafka::{KafkaConfig, PROTECTED_PROPERTIES, is_secret_property};
pub use limits::{DEFAULT_CACHE_MAX_MIB, Limits};
pub use owned::{Owned, OwnedKind, OwnedTopics, TopicRole, TopicSpec, owners_text};
pub use route::{
    Concurrency, DEFAULT_IO_TIMEOUT, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_INSTANCES,
    DEFAULT_ORDERING, DEFAULT_RETRY_LADDER, DEFAULT_TIMEOUT, DEFAULT_WARM_MAX_CALLS, InstanceMode,
    InstancePolicy, KeyDeadLetter, MAX_INSTANCES, MAX_WARM_MAX_CALLS, MessageOrder, Parking,
    RetryOrder, Route, RouteConfig, TrapPolicy,
};
pub use secrets::{Secret, Secrets};
pub use tracing::{TRACE_ID_PLACEHOLDER, TracingConfig};

use serde::Deserialize;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The config file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub kafka: KafkaConfig,
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteConfig>,
    /// The delay relay; runs when this table is present.
    pub delay: Option<DelayConfig>,
    /// The admin server; runs when this table is present.
    pub admin: Option<AdminConfig>,
    #[serde(default)]
    pub replay: ReplayConfig,
    #[serde(default)]
    pub limits: Limits,
    /// Span export and trace links; off without it.
    pub tracing: Option<TracingConfig>,
}

/// A config with every default filled in, every path resolved and every
/// problem ruled out: what hopper runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub kafka: KafkaConfig,
    pub routes: Vec<Route>,
    /// The delay relay, when the file has a `[delay]` table.
    pub delay: Option<DelayRelay>,
    /// The admin server, when the file has an `[admin]` table.
    pub admin: Option<Admin>,
    pub replay: ReplayConfig,
    pub limits: Limits,
    /// `[tracing]`, when the file has one.
    pub tracing: Option<TracingConfig>,
}

impl Config {
    /// Reads, parses and validates a config file. Relative handler paths are
    /// resolved against the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let file = ConfigFile::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        file.resolve(base).map_err(|problems| ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        })
    }

    /// Every topic hopper reads or writes for this config: each route's
    /// inputs and emit topics, and hopper's own topics
    /// ([`Config::owned`]).
    pub fn all_topics(&self) -> BTreeSet<String> {
        let mut topics: BTreeSet<String> = self
            .routes
            .iter()
            .flat_map(|r| r.topics.iter().chain(&r.grants.emit_topics).cloned())
            .collect();
        topics.extend(self.owned().iter().map(|o| o.topic.clone()));
        topics
    }

    /// Every topic hopper writes for itself in this config: the one list
    /// that target, emit and replay checks and topic creation read.
    pub fn owned(&self) -> OwnedTopics {
        OwnedTopics::of(&self.routes, self.delay.as_ref())
    }

    /// Every dead-letter topic, once each (routes may share one).
    pub fn dead_letter_topics(&self) -> BTreeSet<String> {
        let mut topics: BTreeSet<String> = self.routes.iter().map(|r| r.dlq.clone()).collect();
        topics.extend(self.delay.iter().map(|d| d.dlq.clone()));
        topics
    }
}

/// Adds a problem for every place a producer's topic is one of hopper's
/// own: a route's input (another route's dead-letter topic excepted: a
/// route may handle what another dead-lettered), an emit topic, and a
/// topic two kinds claim. Clashes between two routes' tiers, dead-letter
/// and park topics, and a route's own topics among its inputs, are
/// `route::check_topic_overlap`'s.
fn check_owned(routes: &[Route], owned: &OwnedTopics, problems: &mut Vec<String>) {
    let routes_kind = |kind: OwnedKind| {
        matches!(
            kind,
            OwnedKind::RetryTier | OwnedKind::DeadLetter | OwnedKind::Parked
        )
    };
    for (topic, first, second) in owned.clashes() {
        if !(routes_kind(*first) && routes_kind(*second)) {
            problems.push(format!(
                "topic `{topic}` is both a {} and a {} of hopper's: give each its own name",
                first.name(),
                second.name()
            ));
        }
    }
    for dlq in owned.of_kind(OwnedKind::DeadLetter) {
        if dlq.owners.len() > 1 && dlq.owners.iter().any(|o| o == RELAY_ROUTE) {
            problems.push(format!(
                "dead-letter topic `{}` is shared by {}: the delay relay's is its own",
                dlq.topic,
                owners_text(&dlq.owners)
            ));
        }
    }
    for route in routes {
        for topic in &route.topics {
            let Some(own) = owned.get(topic) else {
                continue;
            };
            let mine = own.owners.contains(&route.name);
            if (mine && routes_kind(own.kind))
                || (own.kind == OwnedKind::DeadLetter
                    && !own.owners.iter().any(|o| o == RELAY_ROUTE))
            {
                continue;
            }
            problems.push(format!(
                "route `{}`: input topic `{topic}` is the {} of {}; hopper writes it itself",
                route.name,
                own.kind.name(),
                owners_text(&own.owners)
            ));
        }
        // A record emitted into one of hopper's topics would skip the
        // headers hopper writes there, or steer what hopper reads back.
        for topic in &route.grants.emit_topics {
            let Some(why) = owned.refusal(topic) else {
                continue;
            };
            let hint = match owned.get(topic).map(|o| o.kind) {
                Some(OwnedKind::DelayInbox) => {
                    "; emit with a delay instead, which goes through the inbox"
                }
                _ => "",
            };
            problems.push(format!("route `{}`: emit topic {why}{hint}", route.name));
        }
    }
}

/// The topic that records each replay of a dead-letter topic's records:
/// `<dlq>.replays`. The dead-letter topic itself is never written to by a
/// replay, except for REPLAY_LOOP records.
pub fn replay_journal(dlq: &str) -> String {
    format!("{dlq}.replays")
}

impl ConfigFile {
    pub fn parse(text: &str) -> Result<ConfigFile, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())
    }

    /// Fills in defaults and checks everything, returning every problem.
    pub fn resolve(&self, base: &Path) -> Result<Config, Vec<String>> {
        let mut problems = Vec::new();
        if self.routes.is_empty() && self.delay.is_none() {
            problems.push("nothing to run: add a [[route]] table or a [delay] table".to_string());
        }
        let kafka = self.kafka.resolve(base, &mut problems);
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
            if let Some(route) = route::resolve_route(raw, &label, base, &mut problems) {
                routes.push(route);
            }
        }
        route::check_topic_overlap(&routes, &mut problems);
        self.limits.check(&routes, &mut problems);
        let mut delay = self.delay.as_ref().and_then(|d| d.resolve(&mut problems));
        groups::check_groups(&routes, delay.as_ref(), &mut problems);
        let admin = self.admin.as_ref().and_then(|a| a.resolve(&mut problems));
        if let Some(admin) = &admin {
            // No handler reaches the admin server through a wildcard grant.
            for route in &mut routes {
                route.grants.allowed_hosts.guard_own(admin.own.clone());
            }
        }
        self.replay.check(&mut problems);
        let tracing = self.tracing.as_ref().and_then(|t| t.resolve(&mut problems));
        if delay.is_some() && routes.iter().any(|r| r.name == RELAY_ROUTE) {
            problems.push(format!(
                "route `{}`: the name is the delay relay's in dead-letter records and metrics; choose another",
                RELAY_ROUTE
            ));
        }
        let owned = OwnedTopics::of(&routes, delay.as_ref());
        check_owned(&routes, &owned, &mut problems);
        if let Some(relay) = &mut delay {
            relay.internal = owned;
            for route in &mut routes {
                route.grants.delay = Some(DelayGrant {
                    inbox: relay.inbox.clone(),
                    max_delay: relay.max_delay,
                });
            }
        }
        if delay.is_none() {
            for route in routes.iter().filter(|r| !r.grants.cancel_ids.is_empty()) {
                problems.push(format!(
                    "route `{}`: cancel_ids needs a [delay] table: a cancel goes to the delay relay's inbox",
                    route.name
                ));
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Config {
            kafka,
            routes,
            delay,
            admin,
            replay: self.replay.clone(),
            limits: self.limits,
            tracing,
        })
    }
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
    #[error("no brokers: set kafka.brokers in the config or pass --brokers")]
    NoBrokers,
    /// `Options::shutdown_timeout` past `MAX_SHUTDOWN_TIMEOUT`.
    #[error(
        "the shutdown timeout must be at most {}, not {}",
        humantime::format_duration(*max),
        humantime::format_duration(*asked)
    )]
    ShutdownTimeout { max: Duration, asked: Duration },
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

/// `Duration` as a topic-safe humantime string: `90s` → `1m30s`.
pub fn compact_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string().replace(' ', "")
}

/// Kafka's rule for topic names, which also serves for route and group names.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
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

/// Writes a fake handler, `h.wasm`, into `dir`: the configs of tests name
/// it, and nothing loads it.
#[cfg(test)]
pub(crate) fn write_handler(dir: &Path) {
    std::fs::write(dir.join("h.wasm"), b"not loaded here").unwrap();
}

/// `text` resolved in `dir`, beside a fake `h.wasm` ([`write_handler`]);
/// a text that does not parse is a problem too.
#[cfg(test)]
pub(crate) fn resolve_in(dir: &Path, text: &str) -> Result<Config, Vec<String>> {
    write_handler(dir);
    ConfigFile::parse(text).map_err(|e| vec![e])?.resolve(dir)
}

/// [`resolve_in`] a directory of its own.
#[cfg(test)]
pub(crate) fn resolve_with_handler(text: &str) -> Result<Config, Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    resolve_in(dir.path(), text)
}

/// The config text of the route `orders` (topic `orders`, handler
/// `h.wasm`), with `extra` after its keys.
#[cfg(test)]
pub(crate) fn orders_text(extra: &str) -> String {
    format!("[[route]]\nname = \"orders\"\ntopics = [\"orders\"]\nhandler = \"h.wasm\"\n{extra}")
}

/// The route of [`orders_text`], resolved; panics on a problem.
#[cfg(test)]
pub(crate) fn orders_route(extra: &str) -> Route {
    match resolve_with_handler(&orders_text(extra)) {
        Ok(mut config) => config.routes.remove(0),
        Err(problems) => panic!("{problems:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_targets_are_checked_and_hoppers_own_topics_are_known() {
        let dir = tempfile::tempdir().unwrap();
        write_handler(dir.path());
        let problems =
            ConfigFile::parse("[delay]\ntargets = [\"\", \"orders.*\", \"a b*\", \"..*\"]\n")
                .unwrap()
                .resolve(dir.path())
                .unwrap_err();
        for bad in ["``", "`a b*`", "`..*`"] {
            assert!(
                problems.contains(&format!(
                    "delay: target pattern {bad} is not a topic name with `*` wildcards"
                )),
                "{bad}: {problems:?}"
            );
        }
        assert_eq!(problems.len(), 3, "{problems:?}");
        let config = ConfigFile::parse(
            "[delay]\n\n[[route]]\nname = \"r\"\ntopics = [\"r.in\"]\nhandler = \"h.wasm\"\nretry = [\"5s\"]\n",
        )
        .unwrap()
        .resolve(dir.path())
        .unwrap();
        let internal = &config.delay.unwrap().internal;
        for own in [
            "r.retry.5s",
            "r.dlq",
            "r.dlq.replays",
            "hopper.delay",
            "hopper.delay.1s",
            "hopper.delay.dlq",
            "hopper.delay.dlq.replays",
        ] {
            assert!(internal.contains(own), "{own}: {internal:?}");
        }
        assert!(!internal.contains("r.in"), "a route's input is a target");
    }

    #[test]
    fn target_lookup_timeout_defaults_to_two_minutes_and_zero_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let resolve = |delay: &str| {
            ConfigFile::parse(&format!("[delay]\n{delay}\n"))
                .unwrap()
                .resolve(dir.path())
        };
        let default = resolve("").unwrap().delay.unwrap();
        assert_eq!(default.target_lookup_timeout, Duration::from_secs(120));
        let set = resolve("target_lookup_timeout = \"30s\"").unwrap();
        assert_eq!(
            set.delay.unwrap().target_lookup_timeout,
            Duration::from_secs(30)
        );
        let problems = resolve("target_lookup_timeout = \"0s\"").unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("delay: target_lookup_timeout must be more than 0s"),
            "{problems:?}"
        );
        let error = ConfigFile::parse("[delay]\ntarget_lookup_timeout = \"soon\"\n").unwrap_err();
        assert!(error.contains("target_lookup_timeout"), "{error}");
    }

    #[test]
    fn concurrency_settings_at_their_extremes_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        write_handler(dir.path());
        let route = |extra: &str| {
            ConfigFile::parse(&format!(
                "[[route]]\nname = \"r\"\ntopics = [\"r\"]\nhandler = \"h.wasm\"\n{extra}\n"
            ))
        };
        for (extra, wanted) in [
            (
                "max_in_flight = 0",
                "max_in_flight must be between 1 and 1024, not 0",
            ),
            ("max_in_flight = 1025", "not 1025"),
            (
                "max_in_flight = 18446744073709551615",
                "not 18446744073709551615",
            ),
            (
                "max_instances = 0",
                "max_instances must be between 1 and 1000, not 0",
            ),
            ("max_instances = 1001", "not 1001"),
        ] {
            let problems = route(extra).unwrap().resolve(dir.path()).unwrap_err();
            assert!(
                problems
                    .iter()
                    .any(|p| p.contains("route `r`") && p.contains(wanted)),
                "{extra}: {problems:?}"
            );
        }
        for extra in [
            "max_in_flight = -1",
            "ordering = \"\"",
            "ordering = \"keys\"",
            "max_instances = 18446744073709551616",
        ] {
            let error = route(extra).unwrap_err();
            let key = extra.split(' ').next().unwrap();
            assert!(error.contains(key), "{extra}: {error}");
        }
        let ok = route(
            "ordering = \"unordered\"\nmax_in_flight = 1024\nmax_instances = 1000\nmemory_mib = 1",
        )
        .unwrap()
        .resolve(dir.path())
        .unwrap();
        assert_eq!(ok.routes[0].concurrency.max_in_flight, 1024);
    }

    #[test]
    fn defaults_fill_in() {
        let dir = tempfile::tempdir().unwrap();
        write_handler(dir.path());
        let config = ConfigFile::parse(
            r#"
            [[route]]
            name = "orders"
            topics = ["orders"]
            handler = "h.wasm"
            "#,
        )
        .unwrap();
        let routes = config.resolve(dir.path()).unwrap().routes;
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
    fn the_producers_bound_is_a_whole_number_of_hops_in_range() {
        let dir = tempfile::tempdir().unwrap();
        write_handler(dir.path());
        let held = |value: &str| {
            let config = ConfigFile::parse(&format!(
                "[kafka.properties]\n\"queue.buffering.max.messages\" = {value:?}\n\
                 [[route]]\nname = \"r\"\ntopics = [\"in\"]\nhandler = \"h.wasm\"\n"
            ))
            .unwrap();
            config.resolve(dir.path()).map(|c| {
                c.kafka.properties["queue.buffering.max.messages"]
                    .trim()
                    .parse::<usize>()
                    .unwrap()
            })
        };
        assert_eq!(held("1"), Ok(1));
        assert_eq!(held(" 5000 "), Ok(5000));
        assert_eq!(held("1073741823"), Ok(1073741823));
        for wrong in [
            "0",
            "-1",
            "",
            "many",
            "1073741824",
            "18446744073709551615",
            "18446744073709551616",
            "1e6",
            "\u{ff10}",
        ] {
            let problems = held(wrong).unwrap_err().join("\n");
            assert!(
                problems.contains(&format!(
                    "\"queue.buffering.max.messages\" must be a whole number of hops from 1 to 1073741823, not {wrong:?}"
                )),
                "{wrong:?}: {problems}"
            );
        }
    }

    #[test]
    fn equal_rungs_share_a_tier() {
        let dir = tempfile::tempdir().unwrap();
        write_handler(dir.path());
        let config = ConfigFile::parse(
            r#"
            [[route]]
            name = "r"
            topics = ["in"]
            handler = "h.wasm"
            retry = ["1s", "1s", "5s"]
            "#,
        )
        .unwrap();
        let route = &config.resolve(dir.path()).unwrap().routes[0];
        let tiers: Vec<String> = route.tiers().into_iter().map(|(_, t)| t).collect();
        assert_eq!(tiers, vec!["r.retry.1s", "r.retry.5s"]);
        assert_eq!(route.max_attempts, 4);
    }

    #[test]
    fn every_problem_is_reported_with_its_route() {
        let dir = tempfile::tempdir().unwrap();
        let config = ConfigFile::parse(
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
        let config = ConfigFile::parse(
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
        let routes = config.resolve(dir.path()).unwrap().routes;
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

        let config = ConfigFile::parse(
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
        let err = ConfigFile::parse(
            "[[route]]\nname = \"r\"\ntopics = [\"a\"]\nhandler = \"h.wasm\"\ninstance = \"hot\"\n",
        )
        .unwrap_err();
        assert!(err.contains("unknown variant `hot`"), "{err}");
    }

    #[test]
    fn unknown_fields_are_rejected_by_name() {
        let err = ConfigFile::parse(
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
        let config = ConfigFile::parse(
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
            vec![
                "route `b`: input topic `a.retry.5s` is the retry tier of route `a`; hopper writes it itself"
            ]
        );
    }
}
