//! `[limits]`: bounds over every route together.

use super::route::{MAX_INSTANCES, Route};
use serde::Deserialize;

/// `[limits]` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The most linear memory every route's handler instances may take
    /// together, in MiB: the sum over routes of `max_instances ×
    /// memory_mib` must not exceed it. Default: the memory hopper may use,
    /// the container's limit (cgroup v2 `memory.max`, or v1
    /// `memory.limit_in_bytes`) where it is lower than the machine's
    /// (`MemTotal` in /proc/meminfo), else 8192.
    pub instance_memory_mib: Option<u64>,
    /// The most the compiled-handler cache may hold on disk, in MiB: past
    /// it, the entries used least recently are removed. Default
    /// [`DEFAULT_CACHE_MAX_MIB`].
    pub cache_max_mib: Option<u64>,
}

/// `cache_max_mib`'s default: 1 GiB.
pub const DEFAULT_CACHE_MAX_MIB: u64 = 1024;

/// The memory this process may use, in MiB: its cgroup's limit under
/// `cgroup_root` (`/sys/fs/cgroup`), v2 or v1, where it is lower than
/// `meminfo`'s `MemTotal`; `None` when neither says.
pub fn available_memory_mib(cgroup_root: &std::path::Path, meminfo: &str) -> Option<u64> {
    let total = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|kib| kib / 1024);
    let read = |path: &str| {
        let text = std::fs::read_to_string(cgroup_root.join(path)).ok()?;
        // "max" (v2) and a near-`i64::MAX` page-rounded value (v1) mean no
        // limit.
        let bytes: u64 = text.trim().parse().ok()?;
        (bytes < 1 << 60).then_some(bytes >> 20)
    };
    let limit = read("memory.max").or_else(|| read("memory/memory.limit_in_bytes"));
    match (limit, total) {
        (Some(limit), Some(total)) => Some(limit.min(total)),
        (limit, total) => limit.or(total),
    }
}

/// The memory this process may use, in MiB, read now.
fn machine_memory_mib() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    available_memory_mib(std::path::Path::new("/sys/fs/cgroup"), &meminfo)
}

impl Limits {
    /// `cache_max_mib`, or its default, in bytes.
    pub fn cache_max_bytes(&self) -> u64 {
        self.cache_max_mib
            .unwrap_or(DEFAULT_CACHE_MAX_MIB)
            .saturating_mul(1 << 20)
    }

    /// `instance_memory_mib`, or its default.
    pub fn instance_memory_mib(&self) -> u64 {
        self.instance_memory_mib
            .or_else(machine_memory_mib)
            .unwrap_or(8192)
    }

    /// Checks that the routes' instances fit: in `instance_memory_mib`, and
    /// in the runtime's instance slots.
    pub(super) fn check(&self, routes: &[Route], problems: &mut Vec<String>) {
        if self.cache_max_mib == Some(0) {
            problems.push(
                "limits.cache_max_mib must be more than 0: a cache that holds nothing is `--no-cache`".into(),
            );
        }
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
    use crate::config::resolve_with_handler;

    #[test]
    fn instances_that_could_take_more_memory_than_the_limit_are_refused() {
        let problems = resolve_with_handler(
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
        .unwrap_err();
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

#[cfg(test)]
mod memory_tests {
    use super::available_memory_mib;

    const MEMINFO: &str = "MemTotal:       24576000 kB\nMemFree:        1000 kB\n";

    fn root(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    #[test]
    fn the_containers_limit_wins_when_it_is_lower_than_the_machines_memory() {
        let v2 = root(&[("memory.max", "536870912\n")]);
        assert_eq!(available_memory_mib(v2.path(), MEMINFO), Some(512));
        let v1 = root(&[("memory/memory.limit_in_bytes", "1073741824\n")]);
        assert_eq!(available_memory_mib(v1.path(), MEMINFO), Some(1024));
        // No limit: v2's `max`, v1's page-rounded i64::MAX.
        let unlimited = root(&[("memory.max", "max\n")]);
        assert_eq!(available_memory_mib(unlimited.path(), MEMINFO), Some(24000));
        let unlimited = root(&[("memory/memory.limit_in_bytes", "9223372036854771712\n")]);
        assert_eq!(available_memory_mib(unlimited.path(), MEMINFO), Some(24000));
        // A limit above the machine's memory: the machine's.
        let above = root(&[("memory.max", "68719476736\n")]);
        assert_eq!(available_memory_mib(above.path(), MEMINFO), Some(24000));
        // Neither says: the caller's default.
        let none = root(&[]);
        assert_eq!(available_memory_mib(none.path(), ""), None);
        assert_eq!(available_memory_mib(v2.path(), ""), Some(512));
    }
}
