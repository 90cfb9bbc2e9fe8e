//! `[limits]`: bounds over every route together.

use super::route::{MAX_INSTANCES, Route};
use serde::Deserialize;

/// `[limits]` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The most linear memory every route's handler instances may take
    /// together, in MiB: the sum over routes of `max_instances ×
    /// memory_mib` must not exceed it. Default: the machine's memory
    /// (`MemTotal` in /proc/meminfo), else 8192.
    pub instance_memory_mib: Option<u64>,
}

/// The machine's memory in MiB, when /proc/meminfo says.
fn machine_memory_mib() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

impl Limits {
    /// `instance_memory_mib`, or its default.
    pub fn instance_memory_mib(&self) -> u64 {
        self.instance_memory_mib
            .or_else(machine_memory_mib)
            .unwrap_or(8192)
    }

    /// Checks that the routes' instances fit: in `instance_memory_mib`, and
    /// in the runtime's instance slots.
    pub(super) fn check(&self, routes: &[Route], problems: &mut Vec<String>) {
        let share = |r: &Route| r.max_instances as u64 * (r.memory_bytes as u64 >> 20);
        let total: u64 = routes.iter().map(share).sum();
        let limit = self.instance_memory_mib();
        if total > limit {
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
                "handler instances may take {total} MiB of linear memory ({}), more than limits.instance_memory_mib = {limit}{}: lower a route's max_instances or memory_mib, or raise the limit",
                each.join(", "),
                if self.instance_memory_mib.is_none() { " (this machine's memory)" } else { "" },
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

#[cfg(test)]
mod tests {
    use crate::config::ConfigFile;

    #[test]
    fn instances_that_could_take_more_memory_than_the_limit_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("h.wasm"), b"").unwrap();
        let config = ConfigFile::parse(
            r#"
            [limits]
            instance_memory_mib = 1000

            [[route]]
            name = "a"
            topics = ["a"]
            handler = "h.wasm"
            max_instances = 10
            memory_mib = 64

            [[route]]
            name = "b"
            topics = ["b"]
            handler = "h.wasm"
            max_instances = 8
            memory_mib = 64
            "#,
        )
        .unwrap();
        let problems = config.resolve(dir.path()).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("1152 MiB")
                && problems[0].contains("`a` 10 × 64 MiB")
                && problems[0].contains("instance_memory_mib = 1000"),
            "{}",
            problems[0]
        );
    }
}
