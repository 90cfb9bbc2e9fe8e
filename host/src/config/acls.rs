//! The Kafka ACLs a config needs, derived from the same lists that create
//! its topics ([`Config::topic_specs`]) and name its consumer groups: what
//! `hopper acls` prints, and what docs/connecting.md's script is generated
//! from.

use super::{Config, OwnedKind, TopicRole};
use std::collections::{BTreeMap, BTreeSet};

/// The group id `hopper status` reads committed offsets with (it never
/// joins it).
pub const STATUS_GROUP: &str = "hopper-status";
/// The group id the DLQ reader reads with (by assignment; it never joins).
pub const DLQ_READER_GROUP: &str = "hopper-dlq-reader";

/// The group id of the reader of a whole compacted table topic (the
/// cancellation topic, a park topic): `<topic>.reader`. It reads by
/// assignment and never joins, but librdkafka looks up its coordinator.
pub fn table_reader_group(topic: &str) -> String {
    format!("{topic}.reader")
}

/// A Kafka ACL operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Operation {
    Read,
    Write,
    Create,
    Describe,
}

/// What an ACL is on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(tag = "resource_type", content = "name", rename_all = "kebab-case")]
pub enum Resource {
    /// A topic, by its literal name.
    Topic(String),
    /// Every topic whose name starts with this (a `[delay] targets` pattern
    /// ending in its only `*`).
    TopicPrefix(String),
    /// A consumer group, by its literal id.
    Group(String),
}

/// Whose ACLs: `hopper run`'s, or an operator's CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AclsFor {
    /// `hopper run`: routes, the relay, topic creation, and the admin API's
    /// reads and replays.
    Run,
    /// The CLI against the same config: `status`, `dlq`, `parked`, `skip`,
    /// `delay`, `send`.
    Cli,
}

/// One ACL: operations on a resource, with why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Acl {
    #[serde(flatten)]
    pub resource: Resource,
    pub operations: BTreeSet<Operation>,
    /// What needs them, one entry a use.
    pub why: Vec<String>,
}

/// The ACLs, merged by resource, in a stable order.
#[derive(Debug, Default)]
struct Needs(BTreeMap<Resource, (BTreeSet<Operation>, Vec<String>)>);

impl Needs {
    fn add(&mut self, resource: Resource, ops: &[Operation], why: impl Into<String>) {
        let entry = self.0.entry(resource).or_default();
        entry.0.extend(ops.iter().copied());
        let why = why.into();
        if !entry.1.contains(&why) {
            entry.1.push(why);
        }
    }

    fn topic(&mut self, topic: &str, ops: &[Operation], why: impl Into<String>) {
        self.add(Resource::Topic(topic.to_string()), ops, why);
    }

    fn group(&mut self, group: &str, ops: &[Operation], why: impl Into<String>) {
        self.add(Resource::Group(group.to_string()), ops, why);
    }

    /// The ACLs, `Describe` left out where `Read` or `Write` implies it.
    fn done(self, describe_why: &str) -> Vec<Acl> {
        self.0
            .into_iter()
            .map(|(resource, (mut operations, mut why))| {
                if operations.contains(&Read) || operations.contains(&Write) {
                    operations.remove(&Describe);
                    why.retain(|w| w != describe_why);
                }
                Acl {
                    resource,
                    operations,
                    why,
                }
            })
            .collect()
    }
}

use Operation::{Create, Describe, Read, Write};

/// Why every topic needs `Describe`, for `hopper run` and for the CLI.
const fn describe_why(who: AclsFor) -> &'static str {
    match who {
        AclsFor::Run => "the startup check reads its metadata",
        AclsFor::Cli => "`hopper status` reads its metadata and size",
    }
}

impl Config {
    /// The ACLs `hopper run` (`AclsFor::Run`) or the CLI (`AclsFor::Cli`)
    /// needs for this config. A `Read` or `Write` implies `Describe`.
    /// `Create` is listed only with `kafka.create_topics`.
    pub fn acls(&self, who: AclsFor) -> Vec<Acl> {
        let mut needs = Needs::default();
        let create: &[Operation] = if self.kafka.create_topics && who == AclsFor::Run {
            &[Create]
        } else {
            &[]
        };
        let specs = self.topic_specs();
        for spec in &specs {
            needs.topic(&spec.topic, &[Describe], describe_why(who));
            let users = super::owners_text(&spec.users);
            let (ops, why): (&[Operation], String) = match (who, spec.role) {
                (AclsFor::Run, TopicRole::Input) => (
                    &[Read, Write],
                    format!("input of {users}: consumed; written by replays"),
                ),
                (AclsFor::Run, TopicRole::Emit) => {
                    (&[Write], format!("emit topic of {users}: the handler's emits"))
                }
                (AclsFor::Run, TopicRole::Own(kind)) => (
                    match kind {
                        OwnedKind::RetryTier
                        | OwnedKind::ReplayJournal
                        | OwnedKind::Parked
                        | OwnedKind::DelayTier
                        | OwnedKind::Cancels => &[Read, Write],
                        // Read for the admin API's dead-letter view and
                        // replays; Write for dead letters.
                        OwnedKind::DeadLetter => &[Read, Write],
                        OwnedKind::DelayInbox => &[Read, Write],
                    },
                    format!("{} of {users}", kind.name()),
                ),
                (AclsFor::Cli, TopicRole::Input) => (
                    &[Read, Write],
                    "`hopper skip` and a resumed `hopper dlq replay` read it; `hopper dlq replay` writes it".to_string(),
                ),
                (AclsFor::Cli, TopicRole::Emit) => (&[], String::new()),
                (AclsFor::Cli, TopicRole::Own(kind)) => match kind {
                    OwnedKind::DeadLetter => (
                        &[Read, Write],
                        "`hopper dlq ls|show|try|replay` read it; `hopper skip` and REPLAY_LOOP copies write it".into(),
                    ),
                    OwnedKind::ReplayJournal => (
                        &[Read, Write],
                        "`hopper dlq` reads the replay counts; `hopper dlq replay` records each replay".into(),
                    ),
                    OwnedKind::Parked => (
                        &[Read, Write],
                        "`hopper parked list` reads it; `hopper parked release|purge` write it".into(),
                    ),
                    OwnedKind::DelayInbox => (
                        &[Read, Write],
                        "`hopper send`, `hopper delay cancel` and replays of the relay's dead letters write it; a resumed replay of them reads it".into(),
                    ),
                    OwnedKind::Cancels => (&[Read], "`hopper delay show` reads it".into()),
                    OwnedKind::RetryTier | OwnedKind::DelayTier => (&[], String::new()),
                },
            };
            if !ops.is_empty() {
                needs.topic(&spec.topic, ops, why);
            }
            if !create.is_empty() {
                needs.topic(&spec.topic, create, "created at startup when missing");
            }
            if let TopicRole::Own(kind) = spec.role
                && kind.compacted()
            {
                needs.group(
                    &table_reader_group(&spec.topic),
                    &[Describe],
                    format!("the reader of the {} (by assignment)", kind.name()),
                );
            }
        }
        match who {
            AclsFor::Run => {
                for route in &self.routes {
                    needs.group(
                        &route.group,
                        &[Read],
                        format!("consumer group of route `{}`", route.name),
                    );
                }
                if let Some(relay) = &self.delay {
                    needs.group(&relay.group, &[Read], "consumer group of the delay relay");
                    match &relay.targets {
                        Some(patterns) => {
                            for pattern in patterns {
                                let why =
                                    format!("the relay delivers to `[delay] targets` `{pattern}`");
                                match pattern.split_once('*') {
                                    None => needs.topic(pattern, &[Write], why),
                                    Some((prefix, "")) if !prefix.is_empty() => needs.add(
                                        Resource::TopicPrefix(prefix.to_string()),
                                        &[Write],
                                        why,
                                    ),
                                    // A pattern Kafka cannot express: every
                                    // topic it may match.
                                    Some(_) => needs.add(
                                        Resource::TopicPrefix(String::new()),
                                        &[Write],
                                        why,
                                    ),
                                }
                            }
                        }
                        None => needs.add(
                            Resource::TopicPrefix(String::new()),
                            &[Write],
                            "the relay delivers to any topic: set `[delay] targets` to narrow this",
                        ),
                    }
                }
                if self.admin.is_some() {
                    needs.group(DLQ_READER_GROUP, &[Describe], "the admin API's DLQ reader");
                }
            }
            AclsFor::Cli => {
                needs.group(
                    STATUS_GROUP,
                    &[Describe],
                    "`hopper status` reads lag by assignment",
                );
                needs.group(
                    DLQ_READER_GROUP,
                    &[Describe],
                    "`hopper dlq` reads by assignment",
                );
                for route in &self.routes {
                    needs.group(
                        &route.group,
                        &[Read],
                        format!(
                            "`hopper status` reads, `hopper skip` commits, the offsets of route `{}`",
                            route.name
                        ),
                    );
                }
                if let Some(relay) = &self.delay {
                    needs.group(
                        &relay.group,
                        &[Describe],
                        "`hopper status` reads the delay relay's offsets",
                    );
                }
            }
        }
        needs.done(describe_why(who))
    }
}

impl Acl {
    /// The `kafka-acls.sh` arguments that add this ACL for `principal`,
    /// after `acl` (a shell function that runs `kafka-acls.sh --add
    /// --allow-principal`).
    pub fn kafka_acls_args(&self) -> String {
        let mut line = String::new();
        for op in &self.operations {
            line.push_str(&format!("--operation {op:?} "));
        }
        match &self.resource {
            Resource::Topic(t) => line.push_str(&format!("--topic {}", shell_word(t))),
            Resource::TopicPrefix(p) if p.is_empty() => line.push_str("--topic '*'"),
            Resource::TopicPrefix(p) => line.push_str(&format!(
                "--resource-pattern-type prefixed --topic {}",
                shell_word(p)
            )),
            Resource::Group(g) => line.push_str(&format!("--group {}", shell_word(g))),
        }
        line
    }
}

/// `word`, quoted for a POSIX shell when it needs it.
fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/".contains(&b))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The ACLs as a `kafka-acls.sh` script for `principal`.
pub fn kafka_acls_script(acls: &[Acl], principal: &str, bootstrap: &str) -> String {
    let mut out = String::new();
    out.push_str("acl() {\n");
    out.push_str(&format!(
        "  kafka-acls.sh --bootstrap-server {} --command-config admin.properties \\\n    --add --allow-principal {} \"$@\"\n}}\n",
        shell_word(bootstrap),
        shell_word(principal)
    ));
    for acl in acls {
        out.push_str(&format!("# {}\n", acl.why.join("; ")));
        out.push_str(&format!("acl {}\n", acl.kafka_acls_args()));
    }
    out.push_str("# Only for brokers older than Kafka 2.8 (idempotent writes):\n");
    out.push_str("# acl --operation IdempotentWrite --cluster\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        crate::config::owned::every_kind_config()
    }

    fn ops(acls: &[Acl], resource: Resource) -> Vec<Operation> {
        acls.iter()
            .find(|a| a.resource == resource)
            .map(|a| a.operations.iter().copied().collect())
            .unwrap_or_default()
    }

    #[test]
    fn every_topic_and_group_of_the_config_gets_what_run_needs() {
        let config = config();
        let acls = config.acls(AclsFor::Run);
        let topic = |t: &str| ops(&acls, Resource::Topic(t.into()));
        assert_eq!(topic("orders.in"), [Read, Write, Create]);
        assert_eq!(topic("orders.parked"), [Read, Write, Create]);
        assert_eq!(topic("hopper.delay.cancels"), [Read, Write, Create]);
        for spec in config.topic_specs() {
            assert!(!topic(&spec.topic).is_empty(), "{}", spec.topic);
        }
        let group = |g: &str| ops(&acls, Resource::Group(g.into()));
        assert_eq!(group("hopper.orders"), [Read]);
        assert_eq!(group("hopper.delay"), [Read]);
        assert_eq!(group("orders.parked.reader"), [Describe]);
        assert_eq!(group("hopper.delay.cancels.reader"), [Describe]);
        assert_eq!(
            ops(&acls, Resource::TopicPrefix(String::new())),
            [Write],
            "a relay without targets may deliver anywhere"
        );
    }

    #[test]
    fn the_cli_needs_no_create_and_no_tier() {
        let acls = config().acls(AclsFor::Cli);
        assert!(acls.iter().all(|a| !a.operations.contains(&Create)));
        assert_eq!(
            ops(&acls, Resource::Topic("orders.retry.5s".into())),
            [Describe]
        );
        assert_eq!(
            ops(&acls, Resource::Topic("orders.parked".into())),
            [Read, Write]
        );
        assert_eq!(ops(&acls, Resource::Group(STATUS_GROUP.into())), [Describe]);
    }

    #[test]
    fn a_script_quotes_what_a_shell_would_split() {
        let acl = Acl {
            resource: Resource::Topic("a b".into()),
            operations: [Read].into(),
            why: vec![],
        };
        assert_eq!(acl.kafka_acls_args(), "--operation Read --topic 'a b'");
    }
}
