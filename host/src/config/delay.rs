//! `[delay]`: the delay relay's inbox, tiers and dead-letter topic.

use super::{HumanDuration, check_name, compact_duration};
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
