//! Hold-until-due: how a tier topic waits without sleeping or buffering.
//!
//! Every message in a tier waits the same fixed time, so within a partition
//! messages become due in offset order. When the head of a partition is not
//! due yet, the consumer pauses that partition and seeks back to the head;
//! when the head's time comes, the partition resumes and the head is fetched
//! again. The poll loop never sleeps, and no backlog is held in memory: the
//! Kafka offset is the durable record of what is still waiting.
//!
//! This module keeps the bookkeeping (which partitions are held, until when);
//! the consumer loop that owns the consumer does the pause, seek and resume.
//! Retry tiers and delay tiers both use it.

use crate::clock::now_ms;
use crate::headers;
use crate::health::HeldHeads;
use rdkafka::message::Message;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crate::types::TopicPartition;

/// How far a tier message's due time may lie beyond `now + wait` and
/// still be believed: room for the clocks of two hosts to disagree.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// When a tier message is due: its `hopper-due-at`, else its timestamp plus
/// the tier's wait, else now.
pub fn due_at<M: Message>(message: &M, wait: Duration) -> i64 {
    let header = headers::text(message.headers(), headers::DUE_AT)
        .ok()
        .flatten();
    due_from(header, message.timestamp().to_millis(), wait, now_ms())
}

/// [`due_at`] from its parts. Hopper writes a tier record due at most the
/// tier's wait after it writes it, so a due time further ahead than
/// `now + wait` (plus [`MAX_CLOCK_SKEW`]) is not one hopper wrote: a
/// hostile header or timestamp. Such a message is due at once, and its
/// processor judges it, instead of holding its partition for ever.
pub fn due_from(header: Option<&str>, timestamp: Option<i64>, wait: Duration, now_ms: i64) -> i64 {
    let wait_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
    let due = header
        .and_then(|due| due.parse::<i64>().ok())
        .or_else(|| timestamp.map(|ts| ts.saturating_add(wait_ms)))
        .unwrap_or(now_ms);
    let latest = now_ms
        .saturating_add(wait_ms)
        .saturating_add(MAX_CLOCK_SKEW.as_millis() as i64);
    if due > latest { now_ms } else { due }
}

#[derive(Debug, Default)]
pub struct Hold {
    /// Held partitions, and when each one's head is due (epoch ms). Where
    /// the partition resumes is the pipeline's business (its rewind).
    held: HashMap<TopicPartition, i64>,
    /// The same entries ordered by due time, for the next wake-up.
    by_due: BTreeSet<(i64, TopicPartition)>,
    /// Where held heads are reported, for `hopper_hold_head_due_seconds`.
    /// Touched when a partition is held or released, never per message.
    heads: Option<HeldHeads>,
}

/// What to do with a message read from a tier.
#[derive(Debug, PartialEq, Eq)]
pub enum DueCheck {
    /// Due: hand it on.
    Pass,
    /// Not due: pause the partition, seek back to this offset, and resume at
    /// `due_ms`.
    Hold { due_ms: i64 },
    /// The partition is held already: this message was fetched before the
    /// pause took effect and will be fetched again after the resume. Drop it.
    Discard,
}

impl Hold {
    /// A hold that reports each held partition's due time to `heads`.
    pub fn reporting(heads: HeldHeads) -> Hold {
        Hold {
            heads: Some(heads),
            ..Hold::default()
        }
    }

    /// Decides what to do with a message of `tp` due at `due_ms`, at
    /// `now_ms`. A message is never passed before it is due.
    pub fn check(&mut self, tp: &TopicPartition, due_ms: i64, now_ms: i64) -> DueCheck {
        if self.held.contains_key(tp) {
            return DueCheck::Discard;
        }
        if due_ms <= now_ms {
            return DueCheck::Pass;
        }
        self.held.insert(tp.clone(), due_ms);
        self.by_due.insert((due_ms, tp.clone()));
        if let Some(heads) = &self.heads {
            heads.held(tp, due_ms);
        }
        DueCheck::Hold { due_ms }
    }

    /// When the earliest held partition is due, if any is held.
    pub fn next_due(&self) -> Option<i64> {
        self.by_due.first().map(|(due, _)| *due)
    }

    /// Takes every partition due at `now_ms`; the caller resumes them.
    pub fn take_due(&mut self, now_ms: i64) -> Vec<TopicPartition> {
        let mut due = Vec::new();
        while let Some((at, _)) = self.by_due.first() {
            if *at > now_ms {
                break;
            }
            let (_, tp) = self.by_due.pop_first().expect("checked above");
            self.held.remove(&tp);
            if let Some(heads) = &self.heads {
                heads.released(&tp);
            }
            due.push(tp);
        }
        due
    }

    /// Forgets a partition, for example when a rebalance takes it away.
    pub fn release(&mut self, tp: &TopicPartition) {
        if let Some(due) = self.held.remove(tp) {
            self.by_due.remove(&(due, tp.clone()));
            if let Some(heads) = &self.heads {
                heads.released(tp);
            }
        }
    }

    /// Whether `tp` is held now.
    pub fn is_held(&self, tp: &TopicPartition) -> bool {
        self.held.contains_key(tp)
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("orders.retry.5s", p)
    }

    #[test]
    fn a_due_time_beyond_the_wait_is_not_believed() {
        let wait = Duration::from_secs(5);
        assert_eq!(due_from(Some("9000"), Some(1), wait, 5_000), 9_000);
        assert_eq!(due_from(None, Some(1_000), wait, 5_000), 6_000);
        assert_eq!(due_from(Some("soon"), Some(1_000), wait, 5_000), 6_000);
        assert_eq!(due_from(None, None, wait, 5_000), 5_000);
        let skew = MAX_CLOCK_SKEW.as_millis() as i64;
        assert_eq!(
            due_from(Some(&(10_000 + skew).to_string()), None, wait, 5_000),
            10_000 + skew,
            "a clock a little ahead is believed"
        );
        for hostile in [i64::MAX.to_string(), (10_001 + skew).to_string()] {
            assert_eq!(
                due_from(Some(&hostile), None, wait, 5_000),
                5_000,
                "{hostile}"
            );
        }
        assert_eq!(due_from(None, Some(i64::MAX), wait, 5_000), 5_000);
        assert_eq!(
            due_from(Some(&i64::MIN.to_string()), None, wait, 5_000),
            i64::MIN,
            "long overdue: passes"
        );
    }

    #[test]
    fn a_message_is_never_passed_early() {
        let mut hold = Hold::default();
        assert_eq!(
            hold.check(&tp(0), 1_000, 999),
            DueCheck::Hold { due_ms: 1_000 }
        );
        assert_eq!(hold.take_due(999), Vec::<TopicPartition>::new());
        assert_eq!(hold.take_due(1_000), vec![tp(0)]);
        assert_eq!(hold.check(&tp(0), 1_000, 1_000), DueCheck::Pass);
    }

    #[test]
    fn a_held_partition_discards_prefetched_messages() {
        let mut hold = Hold::default();
        hold.check(&tp(0), 5_000, 0);
        assert_eq!(hold.check(&tp(0), 5_001, 0), DueCheck::Discard);
        assert_eq!(
            hold.check(&tp(1), 0, 0),
            DueCheck::Pass,
            "other partitions flow"
        );
    }

    #[test]
    fn wakes_for_the_earliest_partition_first() {
        let mut hold = Hold::default();
        hold.check(&tp(0), 3_000, 0);
        hold.check(&tp(1), 2_000, 0);
        assert_eq!(hold.next_due(), Some(2_000));
        assert_eq!(hold.take_due(2_500), vec![tp(1)]);
        assert_eq!(hold.next_due(), Some(3_000));
        hold.release(&tp(0));
        assert_eq!(hold.next_due(), None);
        assert_eq!(hold.held(), 0);
    }

    #[test]
    fn held_heads_are_reported_until_released_or_due() {
        let heads = HeldHeads::default();
        let mut hold = Hold::reporting(heads.clone());
        hold.check(&tp(0), 3_000, 0);
        hold.check(&tp(1), 2_000, 0);
        assert_eq!(heads.snapshot(), vec![(tp(0), 3_000), (tp(1), 2_000)]);
        hold.take_due(2_000);
        assert_eq!(heads.snapshot(), vec![(tp(0), 3_000)]);
        hold.release(&tp(0));
        assert!(heads.snapshot().is_empty());
    }
}
