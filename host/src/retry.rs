//! Where a message goes after its handler call: the retry ladder and the
//! dead-letter rules, as one pure function of the route, the attempt and the
//! verdict.

use crate::config::{Route, TrapPolicy, compact_duration};
use crate::headers::Reason;
use crate::plugin::Verdict;
use std::time::Duration;

/// The next hop of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Done: commit the offset.
    Commit,
    /// Produce to a retry tier, to be handled again after `delay`.
    Retry {
        topic: String,
        delay: Duration,
        reason: Reason,
        error: String,
    },
    /// Produce to the route's dead-letter topic.
    DeadLetter { reason: Reason, error: String },
}

impl Decision {
    /// The `hopper-trail` entry of a retry hop after `delay`: `retry.5s`.
    pub fn retry_trail_entry(delay: Duration) -> String {
        format!("retry.{}", compact_duration(delay))
    }
}

/// Decides the next hop after delivery number `attempt` (1-based) got
/// `verdict`.
///
/// - `retryable` retries while attempts remain, else RETRIES_EXHAUSTED.
/// - `fatal` dead-letters at once with FATAL.
/// - A timeout is treated like `retryable` (slow downstreams recover).
/// - Running out of memory dead-letters at once with HANDLER_MEMORY (the same
///   input will hit the same cap).
/// - A trap follows the route's `on_trap` policy.
pub fn decide(route: &Route, attempt: u32, verdict: &Verdict) -> Decision {
    let (class, error, hint) = match verdict {
        Verdict::Ok => return Decision::Commit,
        Verdict::Fatal { reason } => {
            return Decision::DeadLetter {
                reason: Reason::Fatal,
                error: reason.clone(),
            };
        }
        Verdict::Retryable {
            reason,
            retry_after,
        } => (Reason::Retryable, reason.clone(), *retry_after),
        Verdict::Failed { class, error } => {
            let retry = match class {
                Reason::HandlerTimeout => true,
                Reason::HandlerTrap => route.on_trap == TrapPolicy::Retry,
                _ => false,
            };
            if !retry {
                return Decision::DeadLetter {
                    reason: *class,
                    error: error.clone(),
                };
            }
            (*class, format!("{class}: {error}"), None)
        }
    };
    if attempt >= route.max_attempts || route.retry_ladder.is_empty() {
        return Decision::DeadLetter {
            reason: Reason::RetriesExhausted,
            error,
        };
    }
    let delay = tier_delay(route, attempt, hint);
    Decision::Retry {
        topic: route.tier_topic(delay),
        delay,
        reason: class,
        error,
    }
}

/// The wait before delivery `attempt + 1`: rung `attempt` of the ladder (the
/// last rung repeats), raised to the first tier that honours the handler's
/// retry-after hint. A hint longer than every tier gets the longest tier.
pub fn tier_delay(route: &Route, attempt: u32, hint: Option<Duration>) -> Duration {
    let ladder = &route.retry_ladder;
    let rung = ladder[(attempt.saturating_sub(1) as usize).min(ladder.len() - 1)];
    let wanted = hint.map_or(rung, |h| h.max(rung));
    route
        .tiers()
        .into_iter()
        .map(|(d, _)| d)
        .find(|d| *d >= wanted)
        .unwrap_or_else(|| *ladder.iter().max().expect("ladder is not empty"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::orders_route;

    fn retryable(hint: Option<u64>) -> Verdict {
        Verdict::Retryable {
            reason: "down".into(),
            retry_after: hint.map(Duration::from_millis),
        }
    }

    #[test]
    fn climbs_the_ladder_then_dead_letters() {
        let r = orders_route("retry = [\"5s\", \"30s\"]\nmax_attempts = 4");
        let topics: Vec<Decision> = (1..=4).map(|a| decide(&r, a, &retryable(None))).collect();
        let expect_retry = |secs: u64| Decision::Retry {
            topic: format!("orders.retry.{secs}s"),
            delay: Duration::from_secs(secs),
            reason: Reason::Retryable,
            error: "down".into(),
        };
        assert_eq!(topics[0], expect_retry(5));
        assert_eq!(topics[1], expect_retry(30));
        assert_eq!(topics[2], expect_retry(30), "the last rung repeats");
        assert_eq!(
            topics[3],
            Decision::DeadLetter {
                reason: Reason::RetriesExhausted,
                error: "down".into()
            }
        );
    }

    #[test]
    fn fatal_and_memory_dead_letter_at_once() {
        let r = orders_route("");
        assert!(matches!(
            decide(
                &r,
                1,
                &Verdict::Fatal {
                    reason: "no".into()
                }
            ),
            Decision::DeadLetter {
                reason: Reason::Fatal,
                ..
            }
        ));
        let oom = Verdict::Failed {
            class: Reason::HandlerMemory,
            error: "cap".into(),
        };
        assert!(matches!(
            decide(&r, 1, &oom),
            Decision::DeadLetter {
                reason: Reason::HandlerMemory,
                ..
            }
        ));
    }

    #[test]
    fn traps_follow_the_route_policy_and_timeouts_retry() {
        let trap = Verdict::Failed {
            class: Reason::HandlerTrap,
            error: "unreachable".into(),
        };
        assert!(matches!(
            decide(&orders_route(""), 1, &trap),
            Decision::DeadLetter {
                reason: Reason::HandlerTrap,
                ..
            }
        ));
        assert!(matches!(
            decide(&orders_route("on_trap = \"retry\""), 1, &trap),
            Decision::Retry {
                reason: Reason::HandlerTrap,
                ..
            }
        ));
        let timeout = Verdict::Failed {
            class: Reason::HandlerTimeout,
            error: "slow".into(),
        };
        assert!(matches!(
            decide(&orders_route(""), 1, &timeout),
            Decision::Retry {
                reason: Reason::HandlerTimeout,
                ..
            }
        ));
    }

    #[test]
    fn retry_after_hint_picks_a_longer_tier() {
        let r = orders_route("retry = [\"1s\", \"10s\", \"1m\"]");
        assert_eq!(tier_delay(&r, 1, None), Duration::from_secs(1));
        assert_eq!(
            tier_delay(&r, 1, Some(Duration::from_secs(5))),
            Duration::from_secs(10)
        );
        assert_eq!(
            tier_delay(&r, 1, Some(Duration::from_secs(3600))),
            Duration::from_secs(60)
        );
        assert_eq!(
            tier_delay(&r, 2, Some(Duration::from_millis(1))),
            Duration::from_secs(10)
        );
    }
}
