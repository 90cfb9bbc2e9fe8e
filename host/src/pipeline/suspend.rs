//! Breaker suspension: the partitions of the topics a processor suspends
//! (a route's open circuit breaker) stay paused at the broker.

use super::Loop;
use super::context::{partitions, tpl_of};
use crate::clock::now_ms;
use crate::events;
use crate::hold::TopicPartition;
use crate::hop::Processor;
use rdkafka::consumer::Consumer;
use std::collections::HashSet;

impl<P: Processor> Loop<P> {
    /// Pauses the assigned partitions of the topics the processor suspends
    /// now, and resumes those it paused once their topic is no longer
    /// suspended, unless the hold or a rewind keeps them paused. A pause
    /// makes librdkafka fetch from the last message the partition's task
    /// received once resumed, so nothing is skipped; a message received
    /// before the pause is processed as usual (a route's breaker sends a
    /// tier message back to its tier).
    pub(super) fn suspend(&mut self) {
        let topics = self.shared.processor.suspended(now_ms());
        if topics.is_empty() && self.suspended.is_empty() {
            return;
        }
        let assigned: HashSet<TopicPartition> = match self.shared.consumer.assignment() {
            Ok(tpl) => partitions(&tpl).into_iter().collect(),
            Err(_) => return, // tried again on the next tick
        };
        let mut now_suspended = HashSet::new();
        let mut paused = Vec::new();
        for tp in assigned.iter().filter(|tp| topics.contains(&tp.topic)) {
            if self.suspended.contains(tp) {
                now_suspended.insert(tp.clone());
                continue;
            }
            match self.shared.consumer.pause(&tpl_of(tp)) {
                Ok(()) => {
                    now_suspended.insert(tp.clone());
                    paused.push(tp.clone());
                }
                Err(e) => {
                    tracing::warn!(pipeline = self.name, topic = tp.topic, partition = tp.partition, error = %e, "Cannot suspend partition; trying again.")
                }
            }
        }
        let released: Vec<TopicPartition> = std::mem::replace(&mut self.suspended, now_suspended)
            .into_iter()
            .filter(|tp| !self.suspended.contains(tp) && assigned.contains(tp))
            .collect();
        if !paused.is_empty() {
            paused.sort();
            self.shared.telemetry.emit(events::PartitionsSuspended {
                pipeline: self.name.clone(),
                partitions: paused,
            });
        }
        for tp in &released {
            if !self.hold.is_held(tp) && !self.rewinds.contains_key(tp) {
                self.resume(tp);
            }
        }
        if !released.is_empty() {
            let mut partitions = released;
            partitions.sort();
            self.shared.telemetry.emit(events::PartitionsReleased {
                pipeline: self.name.clone(),
                partitions,
            });
        }
    }
}
