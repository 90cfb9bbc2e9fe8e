//! The `hopper` binary's edges: config errors and `plugin check`. These need
//! no broker; everything that moves messages is in the workspace's tests/.

use std::path::{Path, PathBuf};
use std::process::Command;

fn hopper() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hopper"))
}

/// `hopper run --config CONFIG ARGS...`: its exit code and its stderr.
fn run(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = hopper()
        .arg("run")
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn plugin(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/dist")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask build-plugins`",
        path.display()
    );
    path
}

#[test]
fn an_invalid_config_fails_listing_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hopper.toml");
    std::fs::write(
        &config,
        r#"
[kafka]
brokers = "127.0.0.1:1"
properties = { "enable.auto.commit" = "false" }

[[route]]
name = "orders"
topics = ["orders"]
handler = "nowhere.wasm"
retry = ["5m", "30s"]

[[route]]
name = "orders"
topics = []
handler = "nowhere.wasm"
timeout = "0s"
"#,
    )
    .unwrap();
    let (code, stderr) = run(&config, &[]);
    assert_eq!(code, Some(2));
    for expected in [
        "has 7 problem(s)",
        "kafka.properties.\"enable.auto.commit\" is set by hopper itself",
        "route `orders`: handler",
        "nowhere.wasm does not exist or is not a file",
        "route `orders`: invalid retry ladder: 30s follows 5m",
        "route `orders`: name is used by route #1 as well",
        "route `orders`: no input topics",
        "route `orders`: timeout must be more than 0s",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
}

/// The largest durations TOML can carry: a call's deadline and a retry's
/// due time are computed from them, so each is refused at load with its
/// bound, and the smallest that is not zero is accepted.
#[test]
fn a_timeout_or_retry_rung_past_its_bound_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hopper.toml");
    let handler = plugin("noop");
    std::fs::write(
        &config,
        format!(
            r#"
[kafka]
brokers = "127.0.0.1:1"

[[route]]
name = "huge"
topics = ["huge"]
handler = "{handler}"
retry = ["1s", "18446744073709551615s"]
timeout = "18446744073709551615s"

[[route]]
name = "tiny"
topics = ["tiny"]
handler = "{handler}"
retry = ["1ns"]
timeout = "1ns"
"#,
            handler = handler.display()
        ),
    )
    .unwrap();
    let (code, stderr) = run(&config, &[]);
    assert_eq!(code, Some(2));
    for expected in [
        "has 2 problem(s)",
        "route `huge`: timeout must be at most 1h, not ",
        "route `huge`: invalid retry ladder: a rung of ",
        "rungs may be at most 30days",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    assert!(!stderr.contains("route `tiny`"), "{stderr}");
}

#[test]
fn a_shutdown_timeout_past_its_bound_is_refused_by_name() {
    // A config that fails to load, so that an accepted flag shows as the
    // config's error and a refused one as the flag's.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hopper.toml");
    std::fs::write(&config, "[kafka]\nbrokers = \"127.0.0.1:1\"\n").unwrap();
    let with_timeout = |timeout: &str| run(&config, &["--shutdown-timeout", timeout]);
    for refused in ["18446744073709551615s", "24h 1s"] {
        let (code, stderr) = with_timeout(refused);
        assert_eq!(code, Some(2), "{refused}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "invalid value '{refused}' for '--shutdown-timeout"
            )) && stderr.contains("must be at most 1day"),
            "{refused}: {stderr}"
        );
    }
    let (code, stderr) = with_timeout("24h");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(!stderr.contains("--shutdown-timeout"), "{stderr}");
    assert!(stderr.contains("route"), "{stderr}");
}

#[test]
fn a_config_with_a_typo_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hopper.toml");
    std::fs::write(
        &config,
        "[[route]]\nname = \"a\"\ntopic = [\"a\"]\nhandler = \"h.wasm\"\n",
    )
    .unwrap();
    let (code, stderr) = run(&config, &[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("unknown field `topic`"), "{stderr}");
    assert!(stderr.contains("hopper.toml"), "{stderr}");
}

#[test]
fn plugin_check_accepts_a_handler_and_names_what_is_wrong_with_others() {
    let ok = hopper()
        .args(["plugin", "check"])
        .arg(plugin("order_timeout"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(stdout.starts_with("ok: "), "{stdout}");
    assert!(
        stdout.contains("fits hopper:handler/handler@0.1.3"),
        "{stdout}"
    );
    assert!(stdout.contains("exports: handle"), "{stdout}");

    let wrong = plugin("wrong_world");
    let bad = hopper()
        .args(["plugin", "check"])
        .arg(&wrong)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let both = format!(
        "{}{}",
        String::from_utf8_lossy(&bad.stdout),
        String::from_utf8_lossy(&bad.stderr)
    );
    assert!(both.contains(&wrong.display().to_string()), "{both}");
    assert!(both.contains("exports: greet"), "{both}");
    assert!(both.contains("missing: export `handle`"), "{both}");
}

/// `hopper ARGS --help`, as text.
fn help(args: &[&str]) -> String {
    // clap shows an option's environment variable's value when it is set.
    let mut command = hopper();
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("HOPPER_") {
            command.env_remove(name);
        }
    }
    let out = command.args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "hopper {args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a help text lists, `help` aside.
fn subcommands(help: &str) -> Vec<String> {
    let Some((_, rest)) = help.split_once("Commands:\n") else {
        return Vec::new();
    };
    rest.lines()
        .take_while(|l| l.starts_with("  "))
        // A command's name is indented by two; its description, in the
        // long help, further.
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// docs/cli.md as the clap definitions make it: every command's `--help`.
fn cli_reference() -> String {
    let mut doc = String::from(
        "# The `hopper` command line\n\nEvery command's `--help`, generated from its clap definitions by\n`host/tests/cli.rs::docs_cli_md_is_the_help_of_every_command`, which fails\nwhen this file and the binary disagree; `HOPPER_WRITE_CLI_DOCS=1 cargo test\n-p hopper --test cli docs_cli_md` writes it again.\n",
    );
    let mut queue: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = queue.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        let title = if path.is_empty() {
            "hopper".to_string()
        } else {
            format!("hopper {}", path.join(" "))
        };
        doc.push_str(&format!(
            "\n## `{title}`\n\n```text\n{}\n```\n",
            text.trim_end()
        ));
        let mut children: Vec<Vec<String>> = subcommands(&text)
            .into_iter()
            .map(|c| path.iter().cloned().chain([c]).collect())
            .collect();
        children.reverse();
        queue.extend(children);
    }
    doc
}

#[test]
fn docs_cli_md_is_the_help_of_every_command() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
    let expected = cli_reference();
    if std::env::var_os("HOPPER_WRITE_CLI_DOCS").is_some() {
        std::fs::write(&path, &expected).unwrap();
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        written == expected,
        "docs/cli.md is not the binary's help: run `HOPPER_WRITE_CLI_DOCS=1 cargo test -p hopper --test cli docs_cli_md`"
    );
}

#[test]
fn the_long_version_names_the_commit_the_wit_and_the_libraries() {
    let out = hopper().arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for part in [
        concat!("hopper ", env!("CARGO_PKG_VERSION"), " (commit "),
        "handler WIT: hopper:handler/handler@0.1.3",
        "wasmtime 50.",
        "librdkafka 2.",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
}

/// `hopper config check --config CONFIG`, with `env` set and
/// HOPPER_BROKERS unset: its exit code, stdout and stderr.
fn config_check(config: &Path, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut command = hopper();
    command
        .args(["config", "check", "--config"])
        .arg(config)
        .env_remove("HOPPER_BROKERS");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every problem at once, as `hopper run` would find them at start: the
/// file's keys, the `env:` and `file:` values it cannot read (named, never
/// a value), and no broker needed to say so.
#[test]
fn config_check_names_every_problem_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hopper.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[kafka]
brokers = "127.0.0.1:1"

[kafka.properties]
"security.protocol" = "sasl_ssl"
"sasl.mechanism" = "SCRAM-SHA-512"
"sasl.username" = "env:HOPPER_CHECK_USER"
"sasl.password" = "env:HOPPER_CHECK_MISSING"
"ssl.key.password" = "file:nowhere/key.pass"

[[route]]
name = "orders"
topics = ["orders"]
handler = "{handler}"
retry = ["5m", "30s"]

[[route]]
name = "orders"
topics = ["other"]
handler = "missing.wasm"
"#,
            handler = plugin("noop").display()
        ),
    )
    .unwrap();
    let secret = "s3cret-user-value";
    let (code, stdout, stderr) = config_check(&config, &[("HOPPER_CHECK_USER", secret)]);
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    let count: usize = stderr
        .split_once(" has ")
        .and_then(|(_, rest)| rest.split_once(" problem(s)"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of problems in:\n{stderr}"));
    assert!(count >= 5, "{stderr}");
    for expected in [
        "kafka.properties.\"sasl.password\": environment variable HOPPER_CHECK_MISSING is not set",
        "kafka.properties.\"ssl.key.password\": cannot read file ",
        "nowhere/key.pass",
        "route `orders`: invalid retry ladder: 30s follows 5m",
        "route `orders`: name is used by route #1 as well",
        "missing.wasm does not exist or is not a file",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    assert!(!stdout.contains(secret) && !stderr.contains(secret));
}

/// A config that would start passes, saying what it runs; a handler that
/// does not fit the world, and a config without brokers, are problems.
#[test]
fn config_check_passes_a_config_that_would_start_and_checks_its_handlers() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hopper.toml");
    let write = |brokers: &str, handler: &Path| {
        std::fs::write(
            &config,
            format!(
                "[kafka]\n{brokers}\n\n[[route]]\nname = \"orders\"\ntopics = [\"orders\"]\nhandler = \"{}\"\n\n[delay]\n",
                handler.display()
            ),
        )
        .unwrap();
    };
    write("brokers = \"127.0.0.1:1\"", &plugin("noop"));
    let (code, stdout, stderr) = config_check(&config, &[]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("ok: ")
            && stdout.contains("1 route(s) (orders), the delay relay")
            && stdout.contains(&format!("every handler fits {}", hopper::plugin::WORLD)),
        "{stdout}"
    );

    let wrong = plugin("wrong_world");
    write("", &wrong);
    let (code, stdout, stderr) = config_check(&config, &[]);
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("has 2 problem(s)"), "{stderr}");
    assert!(stderr.contains("kafka.brokers is not set"), "{stderr}");
    assert!(
        stderr.contains(&format!("route `orders`: handler {}", wrong.display())),
        "{stderr}"
    );
    // --brokers, as `hopper run` would be given, stands in for the key.
    let out = hopper()
        .args(["config", "check", "--brokers", "127.0.0.1:1", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has 1 problem(s)"), "{stderr}");
}

#[test]
fn completions_and_man_pages_cover_every_command() {
    let top = subcommands(&help(&[]));
    assert!(top.contains(&"dlq".to_string()), "{top:?}");
    for shell in ["bash", "zsh", "fish"] {
        let out = hopper().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).unwrap();
        for command in &top {
            assert!(
                script.contains(command.as_str()),
                "{shell} lacks `{command}`"
            );
        }
    }
    // A shell it does not know is named with the ones it does.
    let out = hopper().args(["completions", "tcsh"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.contains("invalid value 'tcsh'") && stderr.contains("bash"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man1");
    let out = hopper().arg("manpages").arg(&man).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let page = |name: &str| {
        std::fs::read_to_string(man.join(format!("{name}.1")))
            .unwrap_or_else(|e| panic!("{name}.1: {e}"))
    };
    assert!(page("hopper").contains(".TH hopper 1"));
    for command in &top {
        assert!(
            page(&format!("hopper-{command}")).contains(".SH SYNOPSIS"),
            "{command}"
        );
    }
    assert!(page("hopper-dlq-replay").contains("dry"));
    // `manpages` is for packaging: not in the help a user reads.
    assert!(!top.contains(&"manpages".to_string()), "{top:?}");
}
