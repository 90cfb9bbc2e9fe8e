//! `[delay]`: the delay relay's inbox, tiers and dead-letter topic.

use super::{HumanDuration, OwnedTopics, check_name, compact_duration};
use serde::Deserialize;
use std::time::Duration;

/// The route name the delay relay goes by in dead-letter records
/// (`hopper-route`) and metrics.
pub const RELAY_ROUTE: &str = "delay";

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
    /// The topics a delayed message may target, as patterns where `*`
    /// matches any run of characters (`orders.*`). Default: any topic that
    /// is not hopper's own.
    pub targets: Option<Vec<String>>,
    /// Prefix of tier topics. Default `<inbox>`, giving `hopper.delay.30m`.
    pub tier_prefix: Option<String>,
    /// The compacted topic of cancellations every relay process reads.
    /// Default `<inbox>.cancels`.
    pub cancels: Option<String>,
    /// How long a cancellation outlives `max_delay`: the slack for a relay
    /// that was down and forwards overdue messages late. Default 1h.
    #[serde(default = "default_cancel_grace", with = "humantime_serde")]
    pub cancel_grace: Duration,
    /// The most entries a relay's cancellation table holds; a cancel or
    /// replace of a new id past it is dead-lettered as `CANCEL_TABLE_FULL`.
    /// Default 1,000,000.
    #[serde(default = "default_max_cancellations")]
    pub max_cancellations: usize,
    /// How long the relay asks again about a target the cluster answers
    /// with an error for (no leader, no partitions, ...) before it
    /// dead-letters the message as `HOP_FAILED`. Default 2m.
    #[serde(default = "default_target_lookup_timeout", with = "humantime_serde")]
    pub target_lookup_timeout: Duration,
}

impl DelayConfig {
    /// The inbox when the config names none.
    pub const DEFAULT_INBOX: &str = "hopper.delay";
}

fn default_inbox() -> String {
    DelayConfig::DEFAULT_INBOX.into()
}
fn default_cancel_grace() -> Duration {
    Duration::from_secs(60 * 60)
}
/// A million entries: ~65 MB at ids of up to 22 bytes, ~310 MB at ids of
/// 250 bytes (BENCHMARKS.md, `cancel-bound`).
pub const DEFAULT_MAX_CANCELLATIONS: usize = 1_000_000;

fn default_max_cancellations() -> usize {
    DEFAULT_MAX_CANCELLATIONS
}
/// Two minutes: a leader election or a new topic's partitions settle well
/// within it.
pub const DEFAULT_TARGET_LOOKUP_TIMEOUT: Duration = Duration::from_secs(2 * 60);

fn default_target_lookup_timeout() -> Duration {
    DEFAULT_TARGET_LOOKUP_TIMEOUT
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
    /// `[delay] targets`: the patterns a target must match; `None`: any.
    pub targets: Option<Vec<String>>,
    /// hopper's own topics in this config, of every kind: never a target.
    /// Filled in once every route is resolved.
    pub internal: OwnedTopics,
    /// The compacted cancellation topic (docs/headers.md). Startup creates
    /// it compacted before the other missing topics.
    pub cancels: String,
    pub cancel_grace: Duration,
    /// `max_cancellations`: the bound of each relay's cancellation table.
    pub max_cancellations: usize,
    /// `target_lookup_timeout`: how long the cluster may answer a target's
    /// lookups with an error for the topic before the message is
    /// dead-lettered. Time without any answer is not counted.
    pub target_lookup_timeout: Duration,
}

impl DelayRelay {
    /// How long a cancellation entry is kept after its record time: past
    /// it, nothing the entry covers can still be due.
    pub fn cancel_lifetime(&self) -> Duration {
        self.max_delay.saturating_add(self.cancel_grace)
    }

    pub fn all_topics(&self) -> Vec<String> {
        let mut topics = vec![self.inbox.clone(), self.dlq.clone(), self.cancels.clone()];
        topics.extend(self.tiers.iter().map(|(_, t)| t.clone()));
        topics
    }

    /// Whether a delayed message may go to `topic`, or why not. Any producer
    /// can name any topic in `hopper-target`, so a target is never one of
    /// hopper's own topics, and must match `targets` when it is set.
    pub fn check_target(&self, topic: &str) -> Result<(), String> {
        if let Some(why) = self.internal.refusal(topic) {
            return Err(format!("{why}: a delayed message cannot target it"));
        }
        match &self.targets {
            Some(patterns) if !patterns.iter().any(|p| glob_matches(p, topic)) => Err(format!(
                "`{topic}` is not in the delay relay's targets ({})",
                patterns.join(", ")
            )),
            _ => Ok(()),
        }
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of
/// characters (none included) and every other character itself. Linear in
/// the lengths: a pattern is a list of literal pieces, each found in turn.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let mut pieces = pattern.split('*');
    let first = pieces.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    let Some((last, middle)) = pieces.split_last() else {
        // No `*`: the whole text must be the pattern.
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl DelayConfig {
    pub(super) fn resolve(&self, problems: &mut Vec<String>) -> Option<DelayRelay> {
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
        if self.max_cancellations == 0 {
            problems.push(
                "delay: max_cancellations must be at least 1 (cancels would all be refused)".into(),
            );
        }
        if self.target_lookup_timeout.is_zero() {
            problems.push(
                "delay: target_lookup_timeout must be more than 0s (a target the cluster answers with an error for would be dead-lettered at its first lookup)".into(),
            );
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
        let cancels = self
            .cancels
            .clone()
            .unwrap_or_else(|| format!("{}.cancels", self.inbox));
        for (what, name) in [
            ("inbox", &self.inbox),
            ("cancels", &cancels),
            ("dlq", &dlq),
            ("group", &group),
            ("tier_prefix", &prefix),
        ] {
            if let Err(e) = check_name(name) {
                problems.push(format!("delay: {what} `{name}` {e}"));
            }
        }
        for pattern in self.targets.iter().flatten() {
            let literal = pattern.replace('*', "");
            if pattern.is_empty()
                || (!literal.is_empty() && check_name(&literal).is_err())
                || literal.contains("..")
            {
                problems.push(format!(
                    "delay: target pattern `{pattern}` is not a topic name with `*` wildcards"
                ));
            }
        }
        if problems.len() > before {
            return None;
        }
        Some(DelayRelay {
            targets: self.targets.clone(),
            internal: OwnedTopics::default(),
            tiers: waits
                .into_iter()
                .map(|d| (d, format!("{prefix}.{}", compact_duration(d))))
                .collect(),
            inbox: self.inbox.clone(),
            max_delay: self.max_delay,
            dlq,
            group,
            cancels,
            cancel_grace: self.cancel_grace,
            max_cancellations: self.max_cancellations,
            target_lookup_timeout: self.target_lookup_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OwnedKind;

    #[test]
    fn a_glob_matches_runs_of_any_characters_at_its_stars() {
        for (pattern, text, want) in [
            ("orders", "orders", true),
            ("orders", "orders2", false),
            ("orders", "order", false),
            ("orders.*", "orders.created", true),
            ("orders.*", "orders.", true),
            ("orders.*", "orders", false),
            ("*.commands", "payments.commands", true),
            ("*.commands", "payments.commandsx", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("*", "", true),
            ("*", "anything", true),
            ("**", "x", true),
        ] {
            assert_eq!(glob_matches(pattern, text), want, "{pattern} ~ {text}");
        }
    }

    /// The relay of a config with every kind of hopper's own topic, with
    /// `targets`.
    fn relay(targets: Option<&[&str]>) -> DelayRelay {
        let mut relay = crate::config::owned::every_kind_config().delay.unwrap();
        relay.targets = targets.map(|t| t.iter().map(|s| s.to_string()).collect());
        relay
    }

    #[test]
    fn hoppers_own_topics_of_every_kind_are_never_targets_and_targets_narrow_the_rest() {
        let open = relay(None);
        assert!(open.check_target("orders.in").is_ok());
        for kind in OwnedKind::ALL {
            let topics: Vec<String> = open
                .internal
                .of_kind(kind)
                .map(|o| o.topic.clone())
                .collect();
            assert!(!topics.is_empty(), "{kind:?}");
            for topic in topics {
                let why = open.check_target(&topic).unwrap_err();
                assert!(why.contains(kind.name()), "{topic}: {why}");
            }
        }
        assert_eq!(
            open.check_target("orders.parked").unwrap_err(),
            "`orders.parked` is hopper's own park topic (route `orders`), which only hopper writes: a delayed message cannot target it"
        );
        let narrow = relay(Some(&["orders.*", "shared.*"]));
        assert!(narrow.check_target("orders.created").is_ok());
        assert_eq!(
            narrow.check_target("payments").unwrap_err(),
            "`payments` is not in the delay relay's targets (orders.*, shared.*)"
        );
        assert!(
            narrow.check_target("shared.dlq").is_err()
                && narrow.check_target("orders.parked").is_err(),
            "an own topic stays refused even when a pattern names it"
        );
    }
}
