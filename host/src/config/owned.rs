//! hopper's own topics: every topic hopper writes for itself, from one
//! list.
//!
//! A kind of topic hopper owns is a variant of [`OwnedKind`], and
//! [`OwnedTopics::of`] derives every topic of every kind from the resolved
//! config. Every check that asks "is this topic hopper's?" reads that one
//! list: the relay's target check, the replay's destination check, the
//! handlers' emit grants, `hopper send`, topic creation, `hopper topics` and
//! `hopper acls`. A new kind that is not added there fails to compile
//! ([`OwnedKind::index`]) or fails `every_kind_is_listed_once`, not in
//! production.

use super::{DelayRelay, RELAY_ROUTE, Route, replay_journal};
use std::collections::BTreeMap;

/// A kind of topic hopper writes for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OwnedKind {
    /// A route's retry tier, `<retry_topic_prefix>.<wait>`.
    RetryTier,
    /// A route's or the relay's dead-letter topic.
    DeadLetter,
    /// A dead-letter topic's replay journal, `<dlq>.replays`.
    ReplayJournal,
    /// A route's park topic (`retry_order = "key"`), compacted.
    Parked,
    /// The relay's inbox. Producers write schedules and cancels to it, but
    /// hopper forwards nothing into it.
    DelayInbox,
    /// A tier of the relay's cascade, `<tier_prefix>.<wait>`.
    DelayTier,
    /// The relay's cancellation topic, compacted.
    Cancels,
}

impl OwnedKind {
    /// Every kind, in the order of [`OwnedKind::index`].
    pub const ALL: [OwnedKind; 7] = [
        OwnedKind::RetryTier,
        OwnedKind::DeadLetter,
        OwnedKind::ReplayJournal,
        OwnedKind::Parked,
        OwnedKind::DelayInbox,
        OwnedKind::DelayTier,
        OwnedKind::Cancels,
    ];

    /// The kind's place in [`OwnedKind::ALL`]. The match has no wildcard, so
    /// a new kind does not compile until it is given a place.
    pub const fn index(self) -> usize {
        match self {
            OwnedKind::RetryTier => 0,
            OwnedKind::DeadLetter => 1,
            OwnedKind::ReplayJournal => 2,
            OwnedKind::Parked => 3,
            OwnedKind::DelayInbox => 4,
            OwnedKind::DelayTier => 5,
            OwnedKind::Cancels => 6,
        }
    }

    /// What the kind is called in problems, logs and `hopper topics`.
    pub const fn name(self) -> &'static str {
        match self {
            OwnedKind::RetryTier => "retry tier",
            OwnedKind::DeadLetter => "dead-letter topic",
            OwnedKind::ReplayJournal => "replay journal",
            OwnedKind::Parked => "park topic",
            OwnedKind::DelayInbox => "delay inbox",
            OwnedKind::DelayTier => "delay tier",
            OwnedKind::Cancels => "cancellation topic",
        }
    }

    /// Whether hopper creates the topic compacted (a table it reads whole).
    pub const fn compacted(self) -> bool {
        matches!(self, OwnedKind::Parked | OwnedKind::Cancels)
    }

    /// The kind's topics in `routes` and `relay`, each with the pipeline
    /// that owns it (a route's name, or [`RELAY_ROUTE`]).
    fn topics(self, routes: &[Route], relay: Option<&DelayRelay>) -> Vec<(String, String)> {
        let relay_owned = |topic: &str| (topic.to_string(), RELAY_ROUTE.to_string());
        match self {
            OwnedKind::RetryTier => routes
                .iter()
                .flat_map(|r| r.tiers().into_iter().map(|(_, t)| (t, r.name.clone())))
                .collect(),
            OwnedKind::DeadLetter => routes
                .iter()
                .map(|r| (r.dlq.clone(), r.name.clone()))
                .chain(relay.map(|d| relay_owned(&d.dlq)))
                .collect(),
            OwnedKind::ReplayJournal => routes
                .iter()
                .map(|r| (replay_journal(&r.dlq), r.name.clone()))
                .chain(relay.map(|d| relay_owned(&replay_journal(&d.dlq))))
                .collect(),
            OwnedKind::Parked => routes
                .iter()
                .filter_map(|r| {
                    r.parking
                        .as_ref()
                        .map(|p| (p.topic.clone(), r.name.clone()))
                })
                .collect(),
            OwnedKind::DelayInbox => relay.map(|d| relay_owned(&d.inbox)).into_iter().collect(),
            OwnedKind::DelayTier => relay
                .iter()
                .flat_map(|d| d.tiers.iter().map(|(_, t)| relay_owned(t)))
                .collect(),
            OwnedKind::Cancels => relay.map(|d| relay_owned(&d.cancels)).into_iter().collect(),
        }
    }
}

/// One of hopper's own topics.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Owned {
    pub topic: String,
    pub kind: OwnedKind,
    /// The pipelines that own it: route names, or [`RELAY_ROUTE`] (routes
    /// may share a dead-letter topic).
    pub owners: Vec<String>,
}

/// Every topic hopper writes for itself in one config, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnedTopics {
    by_topic: BTreeMap<String, Owned>,
    /// Topics that two kinds claim (a config problem, reported by
    /// [`OwnedTopics::clashes`]).
    clashes: Vec<(String, OwnedKind, OwnedKind)>,
}

impl OwnedTopics {
    /// Every topic of every kind in `routes` and `relay`.
    pub fn of(routes: &[Route], relay: Option<&DelayRelay>) -> OwnedTopics {
        let mut owned = OwnedTopics::default();
        for kind in OwnedKind::ALL {
            for (topic, owner) in kind.topics(routes, relay) {
                match owned.by_topic.get_mut(&topic) {
                    Some(have) if have.kind == kind => {
                        if !have.owners.contains(&owner) {
                            have.owners.push(owner);
                        }
                    }
                    Some(have) => owned.clashes.push((topic, have.kind, kind)),
                    None => {
                        owned.by_topic.insert(
                            topic.clone(),
                            Owned {
                                topic,
                                kind,
                                owners: vec![owner],
                            },
                        );
                    }
                }
            }
        }
        owned
    }

    /// The owned topic `topic`, if it is one.
    pub fn get(&self, topic: &str) -> Option<&Owned> {
        self.by_topic.get(topic)
    }

    /// Whether `topic` is one of hopper's own.
    pub fn contains(&self, topic: &str) -> bool {
        self.by_topic.contains_key(topic)
    }

    /// Every owned topic, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Owned> {
        self.by_topic.values()
    }

    /// The owned topics of one kind, by name.
    pub fn of_kind(&self, kind: OwnedKind) -> impl Iterator<Item = &Owned> {
        self.iter().filter(move |o| o.kind == kind)
    }

    /// Topics that two kinds claim: `(topic, first kind, second kind)`.
    pub fn clashes(&self) -> &[(String, OwnedKind, OwnedKind)] {
        &self.clashes
    }

    /// Why a record may not be written to `topic` on someone else's behalf
    /// (a delayed message's target, a handler's emit), or `None` when it is
    /// not hopper's.
    pub fn refusal(&self, topic: &str) -> Option<String> {
        self.get(topic).map(|owned| {
            format!(
                "`{topic}` is hopper's own {} ({}), which only hopper writes",
                owned.kind.name(),
                owners_text(&owned.owners)
            )
        })
    }
}

/// `route `a``, `the delay relay`, joined with "and".
pub fn owners_text(owners: &[String]) -> String {
    owners
        .iter()
        .map(|o| match o.as_str() {
            RELAY_ROUTE => "the delay relay".to_string(),
            name => format!("route `{name}`"),
        })
        .collect::<Vec<_>>()
        .join(" and ")
}

/// What a topic is to hopper: one of its own, or a producer's topic a
/// route reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopicRole {
    /// A route's input: hopper reads it (and writes it on a replay).
    Input,
    /// A topic a route's handler may emit to (`emit_topics`).
    Emit,
    /// One of hopper's own.
    Own(OwnedKind),
}

impl TopicRole {
    pub const fn name(self) -> &'static str {
        match self {
            TopicRole::Input => "input",
            TopicRole::Emit => "emit topic",
            TopicRole::Own(kind) => kind.name(),
        }
    }
}

/// A topic of a config as hopper creates it when it is missing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TopicSpec {
    pub topic: String,
    /// What it is; a topic both read and emitted to is an input.
    pub role: TopicRole,
    /// The pipelines that use it (route names, or [`RELAY_ROUTE`]).
    pub users: Vec<String>,
    pub partitions: i32,
    pub replication: i32,
    /// `cleanup.policy`.
    pub cleanup_policy: &'static str,
    /// `retention.ms` when hopper sets it; otherwise the broker's default.
    pub retention_ms: Option<u64>,
}

impl TopicSpec {
    /// Whether the topic is a compacted table hopper reads whole.
    pub fn compacted(&self) -> bool {
        self.cleanup_policy.starts_with("compact")
    }
}

impl super::Config {
    /// Every topic the config reads, writes or creates, by name, with the
    /// settings startup creates it with: the same list startup's topic
    /// creation, `hopper topics` and `hopper acls` read.
    pub fn topic_specs(&self) -> Vec<TopicSpec> {
        let mut specs: BTreeMap<String, TopicSpec> = BTreeMap::new();
        let spec = |topic: &str, role, users: Vec<String>| TopicSpec {
            topic: topic.to_string(),
            role,
            users,
            partitions: self.kafka.partitions,
            replication: self.kafka.replication,
            cleanup_policy: "delete",
            retention_ms: None,
        };
        for own in self.owned().iter() {
            let mut made = spec(&own.topic, TopicRole::Own(own.kind), own.owners.clone());
            match own.kind {
                OwnedKind::Cancels => {
                    let relay = self
                        .delay
                        .as_ref()
                        .expect("a cancellation topic has a relay");
                    made.cleanup_policy = "compact,delete";
                    made.retention_ms = Some(relay.cancel_lifetime().as_millis() as u64);
                }
                OwnedKind::Parked => made.cleanup_policy = "compact",
                OwnedKind::RetryTier
                | OwnedKind::DeadLetter
                | OwnedKind::ReplayJournal
                | OwnedKind::DelayInbox
                | OwnedKind::DelayTier => {}
            }
            specs.insert(own.topic.clone(), made);
        }
        for route in &self.routes {
            for (topics, role) in [
                (&route.topics, TopicRole::Input),
                (&route.grants.emit_topics, TopicRole::Emit),
            ] {
                for topic in topics {
                    let entry = specs
                        .entry(topic.clone())
                        .or_insert_with(|| spec(topic, role, Vec::new()));
                    if !matches!(entry.role, TopicRole::Own(_)) {
                        entry.role = entry.role.min(role);
                    }
                    if !entry.users.contains(&route.name) {
                        entry.users.push(route.name.clone());
                    }
                }
            }
        }
        specs.into_values().collect()
    }
}

/// A config with every kind of owned topic: two routes sharing a DLQ, one
/// with ordered retries, and the relay (handlers at `h.wasm`).
#[cfg(test)]
pub(crate) const EVERY_KIND: &str = r#"
[delay]
tiers = ["1s", "1m"]

[[route]]
name = "orders"
topics = ["orders.in"]
handler = "h.wasm"
retry = ["5s", "30s"]
dlq = "shared.dlq"
ordering = "key"
retry_order = "key"

[[route]]
name = "payments"
topics = ["payments.in"]
handler = "h.wasm"
retry = ["5s"]
dlq = "shared.dlq"
"#;

/// [`EVERY_KIND`] resolved, with its handler file in place.
#[cfg(test)]
pub(crate) fn every_kind_config() -> super::Config {
    crate::config::resolve_with_handler(EVERY_KIND)
        .unwrap_or_else(|problems| panic!("{problems:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_once_in_its_place() {
        for (at, kind) in OwnedKind::ALL.iter().enumerate() {
            assert_eq!(kind.index(), at, "{kind:?}");
        }
        let mut names: Vec<&str> = OwnedKind::ALL.iter().map(|k| k.name()).collect();
        names.dedup();
        assert_eq!(names.len(), OwnedKind::ALL.len());
    }

    #[test]
    fn a_config_with_every_kind_lists_each_topic_under_its_kind() {
        let owned = every_kind_config().owned();
        let kinds = |kind| {
            owned
                .of_kind(kind)
                .map(|o| o.topic.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            kinds(OwnedKind::RetryTier),
            ["orders.retry.30s", "orders.retry.5s", "payments.retry.5s"]
        );
        assert_eq!(
            kinds(OwnedKind::DeadLetter),
            ["hopper.delay.dlq", "shared.dlq"]
        );
        assert_eq!(
            owned.get("shared.dlq").unwrap().owners,
            ["orders", "payments"]
        );
        assert_eq!(
            kinds(OwnedKind::ReplayJournal),
            ["hopper.delay.dlq.replays", "shared.dlq.replays"]
        );
        assert_eq!(kinds(OwnedKind::Parked), ["orders.parked"]);
        assert_eq!(kinds(OwnedKind::DelayInbox), ["hopper.delay"]);
        assert_eq!(
            kinds(OwnedKind::DelayTier),
            ["hopper.delay.1m", "hopper.delay.1s"]
        );
        assert_eq!(kinds(OwnedKind::Cancels), ["hopper.delay.cancels"]);
        for kind in OwnedKind::ALL {
            assert!(owned.of_kind(kind).next().is_some(), "{kind:?}");
        }
        assert!(owned.clashes().is_empty());
        for input in ["orders.in", "payments.in"] {
            assert!(!owned.contains(input), "{input} is a producer's topic");
        }
    }

    /// A handler's emit (and so its `schedule`, whose target is an emit
    /// topic) never names one of hopper's own topics, of any kind; nor does
    /// a route's input, but for another route's dead-letter topic.
    #[test]
    fn no_owned_topic_of_any_kind_is_an_emit_topic_or_an_input() {
        let owned = every_kind_config().owned();
        let all: Vec<&Owned> = owned.iter().collect();
        let list = all
            .iter()
            .map(|o| format!("\"{}\"", o.topic))
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!(
            "{EVERY_KIND}\n[[route]]\nname = \"emitter\"\ntopics = [\"emitter.in\"]\nhandler = \"h.wasm\"\nemit_topics = [{list}]\n\n[[route]]\nname = \"reader\"\ntopics = [{list}]\nhandler = \"h.wasm\"\n"
        );
        let problems = crate::config::resolve_with_handler(&text).unwrap_err();
        for own in &all {
            let emit = format!(
                "route `emitter`: emit topic {}",
                owned.refusal(&own.topic).unwrap()
            );
            assert!(
                problems.iter().any(|p| p.starts_with(&emit)),
                "{emit:?} not in {problems:#?}"
            );
            let input = format!(
                "route `reader`: input topic `{}` is the {}",
                own.topic,
                own.kind.name()
            );
            let refused = problems.iter().any(|p| p.starts_with(&input));
            let another_routes_dlq =
                own.kind == OwnedKind::DeadLetter && !own.owners.iter().any(|o| o == RELAY_ROUTE);
            assert_eq!(refused, !another_routes_dlq, "{input:?} in {problems:#?}");
        }
    }
}
