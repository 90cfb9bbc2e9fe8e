//! `hopper plugin test`, as a user runs it: the `hopper` binary on real
//! components and cases files, no broker. The scripted fixture covers every
//! verdict, a trap, a timeout, running out of memory, canned HTTP (an
//! answer, an error, a slow answer), a denied host, an emit, a schedule and
//! a cancel; the four order-timeout builds pass the same contract's cases,
//! compiled by Cranelift and by Winch;
//! a wrong expectation fails with a diff; hostile cases files get an error
//! that names the problem.

use hopper_tests::{ORDER_TIMEOUT_BUILDS, hopper_bin, plugin};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn plugin_test(handler: &Path, cases: &Path, extra: &[&str]) -> (Output, String, String) {
    let out = Command::new(hopper_bin())
        .args(["plugin", "test"])
        .arg(handler)
        .arg(cases)
        .args(extra)
        .env("HOPPER_CACHE_DIR", hopper_tests::cache_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

#[test]
fn the_scripted_fixture_passes_every_case_and_writes_junit() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("results.xml");
    let cases = repo("plugins/fixtures/scripted/cases.toml");
    let (out, stdout, stderr) = plugin_test(
        &plugin("scripted"),
        &cases,
        &["--junit", junit.to_str().unwrap()],
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(", compiled by cranelift) on 22 cases"),
        "{stdout}"
    );
    for line in [
        "ok   ok commits  (ok,",
        "ok   fatal is dead-lettered  (fatal: told to fail,",
        "ok   retryable on the last attempt is exhausted  (retryable: told to retry,",
        "ok   a trap  (HANDLER_TRAP: trap:",
        "ok   a timeout  (HANDLER_TIMEOUT: handler ran past its 300ms limit,",
        "ok   out of memory  (HANDLER_MEMORY:",
        "ok   a canned answer  (ok,",
        "ok   a slow answer runs out of time  (retryable: unreachable:",
        "ok   a host the route does not grant is denied  (retryable: unreachable:",
        "ok   an emit  (ok,",
        "ok   a schedule  (ok,",
        "ok   a cancel  (ok,",
    ] {
        assert!(stdout.contains(line), "no `{line}` in:\n{stdout}");
    }
    assert!(
        stdout.contains("22 cases: 22 passed, 0 failed."),
        "{stdout}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"22\" failures=\"0\""), "{xml}");
    assert_eq!(xml.matches("<testcase ").count(), 22, "{xml}");
}

#[test]
fn a_wrong_expectation_fails_with_a_diff_and_exit_code_1() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("wrong.toml");
    std::fs::write(
        &cases,
        r#"
[route]
allowed_hosts = ["https://api.example.com"]
emit_topics = ["out"]

[[case]]
name = "fatal expected ok"
payload = "fatal"
[case.expect]
verdict = "ok"
reason_class = "none"

[[case]]
name = "wrong emit"
key = "k"
payload = "emit:out"
[case.expect]
verdict = "ok"
[[case.expect.emit]]
topic = "out"
payload = "something else"

[[case]]
name = "wrong requests"
payload = "get:https://api.example.com/a"
[[case.http]]
url = "https://api.example.com/a"
status = 204
[case.expect]
verdict = "ok"
requests = ["GET https://api.example.com/b"]

[[case]]
name = "no canned answer"
payload = "get:https://api.example.com/unlisted"
[case.expect]
verdict = "retryable"

[[case]]
name = "right"
payload = "ok"
[case.expect]
verdict = "ok"
"#,
    )
    .unwrap();
    let junit = dir.path().join("results.xml");
    let (out, stdout, stderr) = plugin_test(
        &plugin("scripted"),
        &cases,
        &["--junit", junit.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let expected_blocks = [
        "FAIL fatal expected ok  (fatal: told to fail,",
        "       verdict:\n         - ok\n         + fatal (fatal: told to fail)\n       reason class:\n         - none\n         + FATAL (dead-letter to test.dlq (FATAL))\n",
        "FAIL wrong emit  (ok,",
        "       emitted records:\n         - topic=out payload=\"something else\"\n         + topic=out key=\"k\" headers={from=\"scripted\"} payload=\"emitted\"\n",
        "       requests:\n         - GET https://api.example.com/b\n         + GET https://api.example.com/a -> 204\n",
        "FAIL no canned answer  (retryable: unreachable: ErrorCode::ConnectionRefused,",
        "       request GET https://api.example.com/unlisted had no canned answer (the handler saw a refused connection): add a [[case.http]] for it\n",
        "ok   right  (ok,",
        "5 cases: 1 passed, 4 failed.",
    ];
    for block in expected_blocks {
        assert!(stdout.contains(block), "no\n{block}\nin:\n{stdout}");
    }
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"5\" failures=\"4\""), "{xml}");
    assert!(
        xml.contains("<failure message=\"fatal: told to fail\">verdict:&#10;  - ok&#10;  + fatal"),
        "{xml}"
    );
}

/// Each build, compiled by each compiler: Cranelift (the default) and
/// Winch (`hopper dev`'s).
#[test]
fn every_order_timeout_build_passes_the_contracts_cases_with_either_compiler() {
    let failures: Vec<String> = ["cranelift", "winch"]
        .into_iter()
        .flat_map(|compiler| {
            ORDER_TIMEOUT_BUILDS
                .iter()
                .zip([
                    "order-timeout",
                    "order-timeout-py",
                    "order-timeout-js",
                    "order-timeout-c",
                ])
                .map(move |(build, dir)| (compiler, build, dir))
        })
        .filter_map(|(compiler, build, dir)| {
            let cases = repo(&format!("plugins/{dir}/cases.toml"));
            let (out, stdout, stderr) =
                plugin_test(&plugin(build), &cases, &["--compiler", compiler]);
            let all = stdout.contains("9 cases: 9 passed, 0 failed.")
                && stdout.contains(&format!(", compiled by {compiler}) on 9 cases"));
            (!out.status.success() || !all)
                .then(|| format!("{build}, {compiler}:\n{stdout}\n{stderr}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Under Winch, the guards that compiled code must keep hold as under
/// Cranelift: the epoch deadline stops an endless loop, a trap and running
/// out of memory are named, canned HTTP and the grants answer. A compiler
/// hopper does not have is refused by name.
#[test]
fn the_scripted_fixture_passes_every_case_compiled_by_winch() {
    let cases = repo("plugins/fixtures/scripted/cases.toml");
    let (out, stdout, stderr) = plugin_test(&plugin("scripted"), &cases, &["--compiler", "winch"]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(", compiled by winch) on 22 cases"),
        "{stdout}"
    );
    for line in [
        "ok   a trap  (HANDLER_TRAP: trap:",
        "ok   a timeout  (HANDLER_TIMEOUT: handler ran past its 300ms limit,",
        "ok   out of memory  (HANDLER_MEMORY:",
        "ok   a host the route does not grant is denied  (retryable: unreachable:",
    ] {
        assert!(stdout.contains(line), "no `{line}` in:\n{stdout}");
    }
    assert!(
        stdout.contains("22 cases: 22 passed, 0 failed."),
        "{stdout}"
    );

    let (out, stdout, stderr) = plugin_test(&plugin("scripted"), &cases, &["--compiler", "llvm"]);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("unknown compiler `llvm`: use `cranelift` or `winch`"),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
}

/// Runs `plugin test` on a cases file that cannot run: exit code 2, the
/// problem named on stderr, and no panic.
fn refused(cases: &Path) -> String {
    let (out, stdout, stderr) = plugin_test(&plugin("scripted"), cases, &[]);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn hostile_cases_files_get_an_error_that_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };

    // A 100 MB payload file, and a 100 MB cases file.
    let big = dir.path().join("big.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let cases = write(
        "big-payload.toml",
        b"[[case]]\nname = \"big\"\npayload_file = \"big.bin\"\n[case.expect]\nverdict = \"ok\"\n",
    );
    let stderr = refused(&cases);
    assert!(
        stderr.contains("case `big`: payload_file ")
            && stderr.contains(
                "big.bin is 104857600 bytes; a case's payload may have at most 16777216 (16 MiB)"
            ),
        "{stderr}"
    );
    let huge = dir.path().join("huge.toml");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let stderr = refused(&huge);
    assert!(
        stderr.contains("huge.toml is 104857600 bytes; a cases file may have at most"),
        "{stderr}"
    );

    // Bytes that are not UTF-8 in the file itself, as a binary header value
    // pasted in would be.
    let mut binary = b"[[case]]\nname = \"bin\"\npayload = \"ok\"\nheaders = { h = \"".to_vec();
    binary.extend_from_slice(&[0xff, 0xfe, 0x00]);
    binary.extend_from_slice(b"\" }\n[case.expect]\nverdict = \"ok\"\n");
    let cases = write("binary.toml", &binary);
    let stderr = refused(&cases);
    assert!(
        stderr.contains(
            "binary.toml is not UTF-8 text (byte 54): write bytes that are not text as base64"
        ),
        "{stderr}"
    );

    // A header name with control characters, a bad base64 value, and a
    // missing payload file: every problem at once, each naming its case.
    let cases = write(
        "problems.toml",
        b"[[case]]\nname = \"a\"\npayload = \"ok\"\nheaders = { \"x\\u0001\" = \"v\" }\n[case.expect]\nverdict = \"ok\"\n\n\
          [[case]]\nname = \"b\"\npayload = \"ok\"\nheaders_base64 = { h = \"%%%\" }\n[case.expect]\nverdict = \"ok\"\n\n\
          [[case]]\nname = \"c\"\npayload_file = \"missing.json\"\n[case.expect]\nverdict = \"sideways\"\n",
    );
    let stderr = refused(&cases);
    for problem in [
        "case `a`: header name \"x\\u{1}\" is empty or has control characters",
        "case `b`: headers_base64.h is not base64",
        "case `c`: cannot read payload_file ",
        "missing.json: No such file or directory",
        "case `c`: expect.verdict `sideways` is not one of ok, retryable, fatal, trap, timeout, memory",
    ] {
        assert!(stderr.contains(problem), "no `{problem}` in:\n{stderr}");
    }

    // A binary header value written as base64 is fine, and reaches the
    // handler.
    let cases = write(
        "binary-ok.toml",
        b"[[case]]\nname = \"bin\"\npayload = \"ok\"\nheaders_base64 = { h = \"//4A\" }\n[case.expect]\nverdict = \"ok\"\n",
    );
    let (out, stdout, stderr) = plugin_test(&plugin("scripted"), &cases, &[]);
    assert!(out.status.success(), "{stdout}\n{stderr}");

    // A missing cases file, and a missing handler.
    let stderr = refused(&dir.path().join("nowhere.toml"));
    assert!(
        stderr.contains("cannot read cases file ") && stderr.contains("nowhere.toml"),
        "{stderr}"
    );
    let out = Command::new(hopper_bin())
        .args(["plugin", "test", "/nonexistent/h.wasm"])
        .arg(&cases)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot read handler /nonexistent/h.wasm"),
        "{stderr}"
    );
}

#[test]
fn log_lines_sit_under_the_case_that_logged_them() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("logs.toml");
    std::fs::write(
        &cases,
        r#"
[[case]]
name = "first"
payload = "ok"
[case.expect]
verdict = "ok"

[[case]]
name = "second"
payload = "fatal"
[case.expect]
verdict = "fatal"
"#,
    )
    .unwrap();
    // The fixture logs each command at debug level.
    let out = Command::new(hopper_bin())
        .args(["plugin", "test"])
        .arg(plugin("scripted"))
        .arg(&cases)
        .env("HOPPER_CACHE_DIR", hopper_tests::cache_dir())
        .env("HOPPER_LOG", "warn,hopper::plugin=debug")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    let at = |text: &str| {
        lines
            .iter()
            .position(|l| l.contains(text))
            .unwrap_or_else(|| panic!("no `{text}` in:\n{stdout}"))
    };
    let (first, second, summary) = (at("ok   first  (ok,"), at("ok   second  ("), at("2 cases:"));
    let (first_log, second_log) = (
        at("Command ok on attempt 1."),
        at("Command fatal on attempt 1."),
    );
    assert!(first < first_log && first_log < second, "{stdout}");
    assert!(second < second_log && second_log < summary, "{stdout}");
    for log in [first_log, second_log] {
        assert!(lines[log].starts_with("       log: "), "{stdout}");
    }
    assert!(
        !stderr.contains("Command "),
        "logged on stderr too:\n{stderr}"
    );
}
