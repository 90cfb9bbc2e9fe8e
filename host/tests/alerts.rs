//! The example alert rules in docs/operations.md: promtool accepts them,
//! and every metric they name is one hopper exports.
//!
//! promtool comes from Debian's prometheus package: `cargo xtask test` finds
//! or unpacks it and passes its path in `HOPPER_PROMTOOL`.

use hopper::config::ConfigFile;
use hopper::health::Health;
use hopper::metrics::{Format, Metrics};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The YAML block after "Example rules" in docs/operations.md.
fn rules() -> String {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let after = &text[text
        .find("Example rules")
        .expect("docs/operations.md has example rules")..];
    let start = after.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let end = after[start..].find("```").unwrap();
    after[start..start + end].to_string()
}

fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os("HOPPER_PROMTOOL") {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let unpacked = target.join("tools/prometheus/usr/bin/promtool");
    if unpacked.is_file() {
        return unpacked;
    }
    PathBuf::from("promtool")
}

#[test]
fn promtool_accepts_the_example_alert_rules() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hopper.rules.yml");
    std::fs::write(&file, rules()).unwrap();
    let out = std::process::Command::new(promtool())
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e}; `cargo xtask promtool` unpacks it",
                promtool().display()
            )
        });
    assert!(
        out.status.success(),
        "promtool rejects the rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_metric_the_rules_name_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("h.wasm"), b"not loaded here").unwrap();
    let config = ConfigFile::parse(
        "[[route]]\nname = \"orders\"\ntopics = [\"orders\"]\nhandler = \"h.wasm\"\n\n[delay]\n",
    )
    .unwrap()
    .resolve(dir.path())
    .unwrap();
    let metrics = Metrics::new(Some(&config), Arc::new(Health::default()), true);
    hopper::events::Calls::register(&metrics, "orders");
    let exposition = metrics.encode(Format::Prometheus);
    let mut exported = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        exported.insert(name.to_string());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                exported.insert(format!("{name}{suffix}"));
            }
        }
    }
    let rules = rules();
    let named: BTreeSet<String> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("hopper_"))
        .map(str::to_string)
        .collect();
    assert!(named.len() >= 5, "{named:?}");
    let missing: Vec<_> = named.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the rules name metrics hopper does not export: {missing:?}\nexported: {exported:?}"
    );
}
