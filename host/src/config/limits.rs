//! `[limits]`: bounds over every route together.

use super::route::{MAX_INSTANCES, Route};
use serde::Deserialize;

/// `[limits]` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The most linear memory every route's handler instances may take
    /// together, in MiB: the sum over routes of `max_instances ×
    /// memory_mib` must not exceed it. Default 8192 (8 GiB).
    #[serde(default = "default_instance_memory_mib")]
    pub instance_memory_mib: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            instance_memory_mib: default_instance_memory_mib(),
        }
    }
}

fn default_instance_memory_mib() -> u64 {
    8192
}

impl Limits {
    /// Checks that the routes' instances fit: in `instance_memory_mib`, and
    /// in the runtime's instance slots.
    pub(super) fn check(&self, routes: &[Route], problems: &mut Vec<String>) {
        let share = |r: &Route| r.max_instances as u64 * (r.memory_bytes as u64 >> 20);
        let total: u64 = routes.iter().map(share).sum();
        if total > self.instance_memory_mib {
            let each: Vec<String> = routes
                .iter()
                .map(|r| {
                    format!(
                        "`{}` {} × {} MiB",
                        r.name,
                        r.max_instances,
                        r.memory_bytes >> 20
                    )
                })
                .collect();
            problems.push(format!(
                "handler instances may take {total} MiB of linear memory ({}), more than limits.instance_memory_mib = {}: lower a route's max_instances or memory_mib, or raise the limit",
                each.join(", "),
                self.instance_memory_mib
            ));
        }
        let instances: usize = routes.iter().map(|r| r.max_instances).sum();
        if instances > MAX_INSTANCES {
            problems.push(format!(
                "the routes' max_instances add up to {instances}, more than the {MAX_INSTANCES} instances the runtime holds"
            ));
        }
    }
}
