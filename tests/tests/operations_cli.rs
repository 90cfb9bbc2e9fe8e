//! `hopper dlq ls|show|replay`, `hopper status` and the log formats, run
//! as a user runs them: the `hopper` binary against a real broker.

use hopper::kafka::Cluster;
use hopper_tests::*;
use rdkafka::Message;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn hopper(args: &[&str]) -> std::process::Output {
    Command::new(hopper_bin())
        .args(args)
        .env_remove("HOPPER_BROKERS")
        .env_remove("HOPPER_LOG_FORMAT")
        .output()
        .unwrap()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_ls_show_and_status_read_straight_from_the_brokers() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted")).test_route();
    let hopper_run = route.start().await;
    let producer = producer();
    // A hostile key: a terminal escape sequence and a newline.
    let hostile = "\u{1b}[31mred\nkey";
    produce(
        &producer,
        &route.input,
        Some(hostile),
        "fatal",
        &[("hopper-id", "cli-1")],
    )
    .await;
    produce(
        &producer,
        &route.input,
        Some("k2"),
        "trap",
        &[("hopper-id", "cli-2")],
    )
    .await;
    let records = consume(&route.dlq, 2, PATIENCE).await;
    // ls and show need no running hopper.
    hopper_run.stop().await;
    let config = route.config_path.to_str().unwrap();

    let out = hopper(&["dlq", "ls", "--config", config]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.starts_with("RECORD"), "{table}");
    assert!(
        table.contains("cli-1") && table.contains("cli-2"),
        "{table}"
    );
    assert!(
        table.contains("FATAL") && table.contains("HANDLER_TRAP"),
        "{table}"
    );
    assert!(
        !table.contains('\u{1b}'),
        "an escape sequence reached the terminal: {table:?}"
    );
    assert!(table.contains("\\u{1b}[31mred\\nkey"), "{table}");
    assert!(table.contains("2 matching of 2"), "{table}");

    let out = hopper(&[
        "dlq", "ls", "--config", config, "--reason", "FATAL", "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(page["total"], 1);
    assert_eq!(page["records"][0]["id"], "cli-1");
    assert_eq!(page["records"][0]["key"], hostile);

    let fatal = records
        .iter()
        .find(|r| r.key() == Some(hostile.as_bytes()))
        .unwrap();
    let at = format!("{}:{}:{}", fatal.topic(), fatal.partition(), fatal.offset());
    let out = hopper(&["dlq", "show", &at, "--config", config]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stdout(&out);
    for expected in [
        "hopper-reason",
        "FATAL",
        "hopper-last-error",
        "told to fail",
        "payload (5 bytes):\nfatal",
    ] {
        assert!(shown.contains(expected), "missing {expected:?} in {shown}");
    }
    assert!(!shown.contains('\u{1b}'), "{shown:?}");
    let out = hopper(&[
        "dlq",
        "show",
        &format!("{}:0:999999", route.dlq),
        "--config",
        config,
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
    let out = hopper(&["dlq", "show", "nonsense", "--config", config]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`nonsense` is not a record as topic:partition:offset"),
        "{}",
        stderr(&out)
    );

    let out = hopper(&["status", "--config", config]);
    assert!(out.status.success(), "{}", stderr(&out));
    let status = stdout(&out);
    assert!(
        status.contains(&route.input) && status.contains("input"),
        "{status}"
    );
    assert!(status.contains(&format!("{}  2", route.dlq)), "{status}");
    let out = hopper(&["status", "--config", config, "--json"]);
    let status: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let input = status["pending"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["topic"] == route.input.as_str())
        .unwrap();
    assert_eq!(input["messages"], 0, "hopper committed both");

    let out = hopper(&["dlq", "replay", "--config", config]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("nothing selected"),
        "{}",
        stderr(&out)
    );
    let out = hopper(&["dlq", "ls", "--config", config, "--route", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("route `nope` is not in the config"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delay_relays_dead_letters_replay_once_the_target_exists() {
    init_tracing();
    let inbox = rand_name("inbox");
    let config = ConfigBuilder::new()
        .delay(DelayTable::default().inbox(&inbox).tiers(&["1s"]))
        .write();
    let hopper_run = config.start().await;
    let target = rand_name("late-target");
    produce(
        &producer(),
        &inbox,
        Some("d-key"),
        "scheduled payload",
        &[
            ("hopper-target", &target),
            ("hopper-delay", "1s"),
            ("hopper-id", "relay-1"),
        ],
    )
    .await;
    let dead = consume(&format!("{inbox}.dlq"), 1, PATIENCE)
        .await
        .remove(0);
    let (h, _) = header_map(&dead);
    assert!(h["hopper-last-error"].contains("does not exist"), "{h:?}");

    // The cause is fixed: the target exists now.
    create_topics(&[&target]).await;
    let path = config.path.to_str().unwrap();
    let out = hopper(&[
        "dlq",
        "replay",
        "--config",
        path,
        "--route",
        "delay",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("1 of 1 record(s) would be replayed"),
        "{}",
        stdout(&out)
    );
    let out = hopper(&["dlq", "replay", "--config", path, "--route", "delay"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("Replayed 1 of 1"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains(&format!("-> {inbox}")),
        "progress: {}",
        stderr(&out)
    );

    let delivered = consume(&target, 1, PATIENCE).await.remove(0);
    assert_eq!(delivered.payload(), Some(&b"scheduled payload"[..]));
    assert_eq!(delivered.key(), Some(&b"d-key"[..]));
    let (h, _) = header_map(&delivered);
    assert_eq!(h["hopper-id"], "relay-1");
    assert_eq!(h["hopper-replay-count"], "1");
    hopper_run.stop().await;
}

/// Starts `hopper run` with stderr piped and reads its log lines until
/// `until` accepts one; returns every line read. Kills the process.
fn run_until(
    config: &str,
    format: Option<&str>,
    mut until: impl FnMut(&str) -> bool,
) -> Vec<String> {
    let mut command = Command::new(hopper_bin());
    command
        .args(["run", "--config", config])
        .env("HOPPER_CACHE_DIR", cache_dir())
        .env_remove("HOPPER_LOG_FORMAT")
        .env_remove("HOPPER_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(format) = format {
        command.env("HOPPER_LOG_FORMAT", format);
    }
    let mut child = command.spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(line) => {
                let done = until(&line);
                seen.push(line);
                if done {
                    break;
                }
            }
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the expected log line never came; saw:\n{}",
                    seen.join("\n")
                );
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_json_lines_with_message_fields_or_plain_text_without_colour_in_a_pipe() {
    init_tracing();
    let handler = plugin("scripted");
    let route = RouteTable::new(&handler).test_route();
    produce(
        &producer(),
        &route.input,
        None,
        "fatal",
        &[("hopper-id", "log-1")],
    )
    .await;
    let config = route.config_path.to_str().unwrap();
    let lines = run_until(config, Some("json"), |l| {
        l.contains("Message dead-lettered.")
    });
    for line in &lines {
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(line);
        assert!(parsed.is_ok(), "not a JSON line: {line}");
    }
    let dead: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(dead["level"], "WARN");
    assert_eq!(dead["route"], route.name.as_str());
    assert_eq!(dead["id"], "log-1");
    assert_eq!(dead["attempt"], 1);
    let version = sha256_hex(&std::fs::read(&handler).unwrap());
    assert_eq!(dead["version"], &version[..12]);
    assert_eq!(dead["reason"], "FATAL");

    // Text, into a pipe: no colour codes.
    let other = RouteTable::new(&handler).test_route();
    let lines = run_until(other.config_path.to_str().unwrap(), None, |l| {
        l.contains("Route started.")
    });
    assert!(lines.iter().any(|l| l.contains("Route started.")));
    for line in &lines {
        assert!(
            !line.contains('\u{1b}'),
            "an escape code in a piped log line: {line:?}"
        );
    }
}

/// Without a configured admin token, `hopper run` logs the console's URL
/// with its session token, writes the token to a 0600 file in the runtime
/// directory, and `hopper status` reads it to show readiness; the file goes
/// when hopper stops. Another user's runtime directory has no token, and the
/// API refuses the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_token_reaches_the_console_url_and_hopper_status_only() {
    use std::os::unix::fs::PermissionsExt as _;
    init_tracing();
    if std::env::var_os("HOPPER_ADMIN_TOKEN").is_some() {
        return; // the environment gives a token; this case cannot be set up
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")))
        .admin(AdminTable::listen(format!("127.0.0.1:{port}")))
        .test_route();
    let config = route.config_path.to_str().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let mut child = Command::new(hopper_bin())
        .args(["run", "--config", config])
        .env("HOPPER_CACHE_DIR", cache_dir())
        .env("HOPPER_RUNTIME_DIR", runtime.path())
        .env_remove("HOPPER_LOG_FORMAT")
        .env_remove("HOPPER_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let announced = loop {
        let line = lines
            .next()
            .expect("hopper run announces its console")
            .unwrap();
        if line.contains("Admin console ready.") {
            break line;
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    let url_start = format!("http://127.0.0.1:{port}/#token=");
    let token: String = announced
        .split(&url_start)
        .nth(1)
        .unwrap_or_else(|| panic!("no console URL with a token: {announced}"))
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    assert_eq!(token.len(), 64, "{announced}");
    let file = runtime.path().join(format!("admin-127.0.0.1-{port}.token"));
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");

    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (status, _) = http(addr, "GET", "/api/status", None, None).await;
    assert_eq!(status, 401, "a read without the token");
    let (status, _) = http(addr, "GET", "/api/status", Some(&token), None).await;
    assert_eq!(status, 200, "a read with the session token");

    let status_with = |dir: &std::path::Path| {
        Command::new(hopper_bin())
            .args(["status", "--config", config, "--json"])
            .env("HOPPER_RUNTIME_DIR", dir)
            .env_remove("HOPPER_BROKERS")
            .output()
            .unwrap()
    };
    let out = status_with(runtime.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(shown["live"]["ready"].is_boolean(), "{shown}");
    let elsewhere = tempfile::tempdir().unwrap();
    let out = status_with(elsewhere.path());
    let shown: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let error = shown["live"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("it needs a token"), "{shown}");

    // SIGTERM: hopper drains, and its token file goes with it.
    // SAFETY: signals a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert!(child.wait().unwrap().success());
    assert!(!file.exists(), "the token file outlived hopper");
}

/// `hopper send` with a config carries that config's credentials, often
/// hopper's own: it writes only to the relay's inbox, and only a schedule
/// the relay would forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hopper_send_refuses_hoppers_own_topics_as_topic_and_inbox() {
    init_tracing();
    let inbox = rand_name("inbox");
    let route = ConfigBuilder::new()
        .route(
            RouteTable::new(&plugin("noop"))
                .ordering("key")
                .key("retry_order", quoted("key")),
        )
        .delay(DelayTable::default().inbox(&inbox))
        .test_route();
    let config = route.config();
    let owned = config.owned();
    let path = route.config_path.to_str().unwrap();
    create_topics(&[&inbox]).await;
    // The positive control: a schedule for the route's input goes through.
    let sent = hopper(&[
        "send",
        "--config",
        path,
        "--topic",
        &route.input,
        "--delay",
        "1h",
        "--payload",
        "ok",
    ]);
    assert!(sent.status.success(), "{}", stderr(&sent));
    let mut refused = 0;
    for own in owned.iter() {
        let out = hopper(&[
            "send",
            "--config",
            path,
            "--topic",
            &own.topic,
            "--delay",
            "1h",
            "--payload",
            "x",
        ]);
        assert!(!out.status.success(), "{} was accepted", own.topic);
        let why = config
            .delay
            .as_ref()
            .unwrap()
            .check_target(&own.topic)
            .unwrap_err();
        assert!(
            stderr(&out).contains(&format!("--topic: {why}")),
            "{}: {}",
            own.topic,
            stderr(&out)
        );
        if own.topic != inbox {
            let out = hopper(&[
                "send",
                "--config",
                path,
                "--inbox",
                &own.topic,
                "--topic",
                &route.input,
                "--delay",
                "1h",
                "--payload",
                "x",
            ]);
            assert!(!out.status.success(), "--inbox {} was accepted", own.topic);
            assert!(
                stderr(&out).contains("--inbox: ") && stderr(&out).contains(own.kind.name()),
                "{}: {}",
                own.topic,
                stderr(&out)
            );
        }
        refused += 1;
    }
    assert!(refused >= 7, "{refused}");
    // Only the positive control reached the inbox.
    let arrived = consume(&inbox, 1, PATIENCE).await;
    assert_eq!(arrived[0].payload(), Some(&b"ok"[..]));
    assert_eq!(
        hopper::lag::topic_size(&Cluster::of(&config.kafka).unwrap(), &inbox).unwrap(),
        1
    );
}

/// `hopper topics` and `hopper acls` read only the config: every one of
/// hopper's own topics is listed under its kind, and each gets its ACL.
#[test]
fn hopper_topics_and_acls_list_every_topic_of_the_config_without_a_broker() {
    let route = ConfigBuilder::new()
        .route(
            RouteTable::new(&plugin("noop"))
                .ordering("key")
                .key("retry_order", quoted("key")),
        )
        .delay(DelayTable::default())
        .test_route();
    let config = route.config();
    let path = route.config_path.to_str().unwrap();
    let topics = hopper(&["topics", "--config", path, "--json"]);
    assert!(topics.status.success(), "{}", stderr(&topics));
    let listed: serde_json::Value = serde_json::from_str(&stdout(&topics)).unwrap();
    let listed = listed.as_array().unwrap();
    for own in config.owned().iter() {
        let entry = listed
            .iter()
            .find(|t| t["topic"] == own.topic.as_str())
            .unwrap_or_else(|| panic!("{} not listed", own.topic));
        assert_eq!(
            entry["role"]["own"],
            serde_json::to_value(own.kind).unwrap()
        );
    }
    let parked = listed
        .iter()
        .find(|t| t["role"]["own"] == "parked")
        .unwrap();
    assert_eq!(parked["cleanup_policy"], "compact");
    let acls = hopper(&["acls", "--config", path, "--principal", "User:hopper"]);
    assert!(acls.status.success(), "{}", stderr(&acls));
    let script = stdout(&acls);
    for spec in config.topic_specs() {
        assert!(
            script.contains(&format!("--topic {}\n", spec.topic)),
            "{} missing from:\n{script}",
            spec.topic
        );
    }
    let missing = hopper(&[
        "acls",
        "--config",
        "/nonexistent/hopper.toml",
        "--principal",
        "User:x",
    ]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("/nonexistent/hopper.toml"),
        "{}",
        stderr(&missing)
    );
}

/// Regression: `hopper status` sent the configured admin token, the one
/// that replays and cancels, to whatever listened on `admin.listen`; a
/// local user who bound that port while hopper was down received it. It
/// sends only the session's read token `hopper run` wrote, and without one
/// no token at all. A plain listener stands in for the admin server and
/// records what it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hopper_status_never_sends_the_configured_token() {
    use std::io::{Read as _, Write as _};
    init_tracing();
    const WRITE_TOKEN: &str = "write-token-that-replays";
    const READ_TOKEN: &str = "session-read-token";
    // The route's topics, made by a hopper that ran once without the server.
    let table = RouteTable::new(&plugin("scripted"));
    let plain = ConfigBuilder::new().route(table.clone()).test_route();
    plain.start().await.stop().await;

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let route = ConfigBuilder::new()
        .route(table)
        .admin(AdminTable::listen(addr).token(WRITE_TOKEN))
        .test_route();
    let recorder = std::thread::spawn(move || {
        let mut requests = Vec::new();
        for _ in 0..2 {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            let body = r#"{"ready": true, "handlers": [], "pipelines": []}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            requests.push(String::from_utf8_lossy(&request).into_owned());
        }
        requests
    });
    let status = |runtime: &std::path::Path| {
        Command::new(hopper_bin())
            .args(["status", "--json", "--config"])
            .arg(&route.config_path)
            .env("HOPPER_RUNTIME_DIR", runtime)
            .env_remove("HOPPER_BROKERS")
            .env_remove("HOPPER_ADMIN_TOKEN")
            .output()
            .unwrap()
    };
    let with_file = tempfile::tempdir().unwrap();
    std::fs::write(
        with_file
            .path()
            .join(format!("admin-127.0.0.1-{}.token", addr.port())),
        format!("{READ_TOKEN}\n"),
    )
    .unwrap();
    let out = status(with_file.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(shown["live"]["ready"], true, "{shown}");
    let without_file = tempfile::tempdir().unwrap();
    let out = status(without_file.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let requests = recorder.join().unwrap();
    for request in &requests {
        assert!(
            !request.contains(WRITE_TOKEN),
            "the configured token was sent:\n{request}"
        );
    }
    let authorization = |request: &str| {
        request
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
            .map(str::to_string)
    };
    assert_eq!(
        authorization(&requests[0]).as_deref(),
        Some(format!("Authorization: Bearer {READ_TOKEN}").as_str()),
        "{}",
        requests[0]
    );
    assert_eq!(authorization(&requests[1]), None, "{}", requests[1]);
}

/// Three causes among 90 dead letters, each worded with a different id or
/// number per record: `dlq groups` shows three groups, `--group` selects
/// one exactly in `ls` and `replay`, and `--not-replayed` leaves out what a
/// replay took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_groups_gather_dead_letters_by_cause_and_select_one_group() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted")).test_route();
    let hopper_run = route.start().await;
    let producer = producer();
    // 3 causes across 3,000 dead letters.
    const EACH: usize = 1_000;
    for i in 0..EACH {
        for (n, payload) in [
            "fatal".to_string(),
            format!("config:o-{i}=x"),
            "count".to_string(),
        ]
        .into_iter()
        .enumerate()
        {
            let id = format!("g-{n}-{i}");
            let key = format!("k-{i}");
            produce(
                &producer,
                &route.input,
                Some(&key),
                &payload,
                &[("hopper-id", &id)],
            )
            .await;
        }
    }
    consume(&route.dlq, 3 * EACH, PATIENCE).await;
    hopper_run.stop().await;
    let config = route.config_path.to_str().unwrap();

    let json = |args: &[&str]| -> serde_json::Value {
        let out = hopper(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    let page = json(&["dlq", "groups", "--config", config, "--json"]);
    assert_eq!(page["total"], 3 * EACH, "{page:#}");
    let groups = page["groups"].as_array().unwrap();
    let mut causes: Vec<&str> = groups
        .iter()
        .map(|g| g["cause"].as_str().unwrap())
        .collect();
    causes.sort();
    assert_eq!(
        causes,
        ["call <n>", "config o-<n> is None", "told to fail"],
        "{page:#}"
    );
    for g in groups {
        assert_eq!(g["count"], EACH, "{g:#}");
        assert_eq!(g["not_replayed"], EACH, "{g:#}");
        assert_eq!(g["reason"], "FATAL", "{g:#}");
        assert_eq!(g["versions"].as_array().unwrap().len(), 1, "{g:#}");
    }
    let config_group = groups
        .iter()
        .find(|g| g["cause"] == "config o-<n> is None")
        .unwrap()["group"]
        .as_str()
        .unwrap()
        .to_string();

    // The table names each group with its newest error.
    let out = hopper(&["dlq", "groups", "--config", config]);
    let table = stdout(&out);
    assert!(table.starts_with("GROUP"), "{table}");
    assert!(table.contains(&config_group), "{table}");
    assert!(
        table.contains(&format!("3 group(s) of {} matching", 3 * EACH)),
        "{table}"
    );

    // One group, exactly.
    let page = json(&[
        "dlq",
        "ls",
        "--config",
        config,
        "--group",
        &config_group,
        "--limit",
        "100",
        "--json",
    ]);
    assert_eq!(page["total"], EACH, "{page:#}");
    for r in page["records"].as_array().unwrap() {
        assert_eq!(r["group"], config_group.as_str());
        assert!(
            r["error"].as_str().unwrap().starts_with("config o-"),
            "{r:#}"
        );
    }

    // `show --group` shows its newest record; a group of none says so.
    let out = hopper(&["dlq", "show", "--config", config, "--group", &config_group]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(" bytes):\nconfig:o-") && stdout(&out).contains("config o-"),
        "{}",
        stdout(&out)
    );
    let out = hopper(&[
        "dlq",
        "show",
        "--config",
        config,
        "--group",
        "0000000000000000",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no dead letter of group `0000000000000000`"),
        "{}",
        stderr(&out)
    );

    // Replay the group; it is then replayed, the others not.
    let out = hopper(&[
        "dlq",
        "replay",
        "--config",
        config,
        "--group",
        &config_group,
        "--rate",
        "5000",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = json(&[
        "dlq",
        "groups",
        "--config",
        config,
        "--not-replayed",
        "--json",
    ]);
    assert_eq!(page["total"], 2 * EACH, "{page:#}");
    assert!(
        page["groups"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["group"] != config_group.as_str()),
        "{page:#}"
    );
    let page = json(&[
        "dlq",
        "ls",
        "--config",
        config,
        "--group",
        &config_group,
        "--not-replayed",
        "--json",
    ]);
    assert_eq!(page["total"], 0, "{page:#}");
    // ... and it reached the route's input again, once each.
    let replayed = consume(&route.input, 4 * EACH, PATIENCE).await;
    assert_eq!(
        replayed
            .iter()
            .filter(|m| m.payload().is_some_and(|p| p.starts_with(b"config:")))
            .count(),
        2 * EACH
    );

    // A group id that names no group selects nothing, and says so.
    let page = json(&[
        "dlq",
        "ls",
        "--config",
        config,
        "--group",
        "0000000000000000",
        "--json",
    ]);
    assert_eq!(page["total"], 0);
}

/// Dead letters anyone who can write the DLQ could forge: a 100 KB error
/// per group, an error that is not UTF-8, and a `hopper-fingerprint`
/// header naming a group of its choice. Each group keeps a sample
/// cut to the bound the host writes (so ten thousand such groups stay
/// small), and the bytes that are not text show as U+FFFD, not as no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_groups_cut_forged_errors_and_show_one_that_is_not_text() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::FutureRecord;
    init_tracing();
    let route = RouteTable::new(&plugin("scripted")).test_route();
    let hopper_run = route.start().await;
    let producer = producer();
    produce(&producer, &route.input, Some("k"), "fatal", &[]).await;
    consume(&route.dlq, 1, PATIENCE).await;
    hopper_run.stop().await;

    // Near the 1 MB a record may be by default, and a tenth of it.
    let huge = |word: &str, n: usize| format!("{word} failed: {}", "x".repeat(n));
    let errors: [Vec<u8>; 3] = [
        huge("alpha", 900_000).into_bytes(),
        huge("beta", 100_000).into_bytes(),
        b"bad \xff\xfe bytes".to_vec(),
    ];
    for (i, error) in errors.iter().enumerate() {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "hopper-route",
                value: Some(route.name.as_bytes()),
            })
            .insert(Header {
                key: "hopper-reason",
                value: Some(b"FATAL".as_slice()),
            })
            .insert(Header {
                key: "hopper-last-error",
                value: Some(error.as_slice()),
            })
            // Fingerprints are computed, never read from a header.
            .insert(Header {
                key: "hopper-fingerprint",
                value: Some(b"0000000000000000".as_slice()),
            });
        let key = format!("forged-{i}");
        producer
            .send(
                FutureRecord::to(&route.dlq)
                    .key(&key)
                    .payload("forged")
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let config = route.config_path.to_str().unwrap();
    let out = hopper(&["dlq", "groups", "--config", config, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(page["total"], 4, "{page:#}");
    let groups = page["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 4, "{page:#}");
    assert!(
        groups.iter().all(|g| g["group"] != "0000000000000000"),
        "{page:#}"
    );
    let samples: Vec<&str> = groups
        .iter()
        .map(|g| g["sample"].as_str().unwrap())
        .collect();
    for sample in &samples {
        assert!(sample.len() <= 1024, "{} bytes", sample.len());
    }
    for word in ["alpha failed: xxx", "beta failed: xxx", "told to fail"] {
        assert!(samples.iter().any(|s| s.starts_with(word)), "{samples:?}");
    }
    assert!(
        samples.contains(&"bad \u{fffd}\u{fffd} bytes"),
        "{samples:?}"
    );
    // The listing cuts them the same way.
    let out = hopper(&["dlq", "ls", "--config", config, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    for r in page["records"].as_array().unwrap() {
        assert!(r["error"].as_str().unwrap().len() <= 1024, "{r:#}");
    }
    // The export keeps every byte: the 900 KB error whole.
    let (_, lines) = exported(config);
    assert_eq!(lines.len(), 4);
    let alpha = lines
        .iter()
        .find(|l| l["key"]["text"] == "forged-0")
        .expect("the 900 KB record is exported");
    let error = alpha["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "hopper-last-error")
        .map(|h| h["value"]["text"].as_str().unwrap().to_string());
    assert_eq!(error.map(|e| e.len()), Some(errors[0].len()));
    assert!(alpha["error"].as_str().unwrap().len() <= 1024, "{alpha:#}");
}

/// Every dead letter of `config`, as `hopper dlq export` writes them to
/// stdout, one JSON object a line; and the command's output.
fn exported(config: &str) -> (std::process::Output, Vec<serde_json::Value>) {
    let out = hopper(&["dlq", "export", "--config", config]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (out, lines)
}

/// `hopper dlq export` writes every selected dead letter as one JSON line,
/// its key, payload and headers byte for byte (base64 where they are not
/// text, `null` for a null header), to stdout or `--out`; it reads past
/// nothing and writes nothing to Kafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_export_writes_each_record_as_a_json_line_byte_for_byte() {
    use base64::Engine as _;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::FutureRecord;
    init_tracing();
    let route = RouteTable::new(&plugin("scripted")).test_route();
    let hopper_run = route.start().await;
    let producer = producer();
    const EACH: usize = 5;
    for i in 0..EACH {
        for payload in ["fatal".to_string(), format!("config:o-{i}=x")] {
            produce(
                &producer,
                &route.input,
                Some(&format!("k-{i}")),
                &payload,
                &[],
            )
            .await;
        }
    }
    consume(&route.dlq, 2 * EACH, PATIENCE).await;
    hopper_run.stop().await;
    // A record no handler wrote: bytes that are not text everywhere.
    let (key, payload, value) = (b"\xffkey".as_slice(), b"\x00\x9fpay".as_slice(), b"\xfe");
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "hopper-route",
            value: Some(route.name.as_bytes()),
        })
        .insert(Header {
            key: "binary",
            value: Some(value.as_slice()),
        })
        .insert(Header::<&[u8]> {
            key: "null",
            value: None,
        });
    producer
        .send(
            FutureRecord::to(&route.dlq)
                .key(key)
                .payload(payload)
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let dlq_size =
        hopper::lag::topic_size(&Cluster::new(brokers(), Default::default()), &route.dlq).unwrap();
    let config = route.config_path.to_str().unwrap();

    let (out, lines) = exported(config);
    assert_eq!(lines.len(), 2 * EACH + 1, "{}", stdout(&out));
    assert!(
        stderr(&out).contains(&format!("exported {0} of {0} matching", 2 * EACH + 1)),
        "{}",
        stderr(&out)
    );
    let b64 = |v: &serde_json::Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v["base64"].as_str().unwrap())
            .unwrap()
    };
    let forged = lines
        .iter()
        .find(|l| l["key"].get("base64").is_some())
        .expect("the forged record");
    assert_eq!(b64(&forged["key"]), key);
    assert_eq!(b64(&forged["payload"]), payload);
    let headers = forged["headers"].as_array().unwrap();
    assert_eq!(headers[0]["value"]["text"], route.name.as_str());
    assert_eq!(headers[1]["name"], "binary");
    assert_eq!(b64(&headers[1]["value"]), value);
    assert_eq!(
        headers[2],
        serde_json::json!({"name": "null", "value": null})
    );
    // A dead letter hopper wrote: text stays text, hopper's reading beside.
    let genuine = lines.iter().find(|l| l["reason"] == "FATAL").unwrap();
    assert_eq!(genuine["route"], route.name.as_str());
    assert!(genuine["payload"]["text"].is_string(), "{genuine:#}");
    assert!(
        genuine["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["name"] == "hopper-last-error" && h["value"]["text"].is_string()),
        "{genuine:#}"
    );

    // A selection, to a file: one group exactly.
    let group = lines
        .iter()
        .find(|l| {
            l["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("config o-"))
        })
        .unwrap()["group"]
        .as_str()
        .unwrap()
        .to_string();
    let file = route.dir.path().join("group.jsonl");
    let out = hopper(&[
        "dlq",
        "export",
        "--config",
        config,
        "--group",
        &group,
        "--out",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.lines().count(), EACH, "{text}");
    for line in text.lines() {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["group"], group.as_str());
    }
    // Nothing was written to the dead-letter topic.
    assert_eq!(
        hopper::lag::topic_size(&Cluster::new(brokers(), Default::default()), &route.dlq).unwrap(),
        dlq_size
    );
}

/// The ids of the replayed records in `topic` (those with
/// `hopper-replay-count`), each with how often it is there. Reads the
/// topic to its end, as it is now.
async fn replayed_ids(topic: &str) -> std::collections::HashMap<String, usize> {
    let size = hopper::lag::topic_size(&Cluster::new(brokers(), Default::default()), topic).unwrap()
        as usize;
    let mut ids = std::collections::HashMap::new();
    for m in consume(topic, size, PATIENCE).await {
        let (h, _) = header_map(&m);
        if h.contains_key("hopper-replay-count") {
            *ids.entry(h["hopper-id"].clone()).or_insert(0) += 1;
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_killed_halfway_and_resumed_replays_each_record_once() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted")).test_route();
    let hopper_run = route.start().await;
    let producer = producer();
    const N: usize = 300;
    for i in 0..N {
        let id = format!("kill-{i}");
        produce(
            &producer,
            &route.input,
            Some(&id),
            "fatal",
            &[("hopper-id", &id)],
        )
        .await;
    }
    consume(&route.dlq, N, PATIENCE).await;
    // Stopped, so that the replays stay in the input to be counted.
    hopper_run.stop().await;
    let config = route.config_path.to_str().unwrap();
    let out = hopper(&["dlq", "groups", "--config", config, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let group = page["groups"][0]["group"].as_str().unwrap().to_string();
    assert_eq!(page["groups"][0]["count"], N, "{page:#}");

    // A dry run plans all of it.
    let out = hopper(&[
        "dlq",
        "replay",
        "--config",
        config,
        "--group",
        &group,
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("{N} of {N} record(s) would be replayed")),
        "{}",
        stdout(&out)
    );

    // Killed (SIGKILL) once some are replayed.
    let mut child = Command::new(hopper_bin())
        .args([
            "dlq", "replay", "--config", config, "--group", &group, "--rate", "100",
        ])
        .env_remove("HOPPER_BROKERS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut run = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("Replay run ") {
            run = rest.split('.').next().map(str::to_string);
        }
        if line.starts_with("[60] ") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let run = run.expect("the replay names its run");
    let first = replayed_ids(&route.input).await;
    assert!(
        first.len() >= 60 && first.len() < N,
        "{} replayed before the kill",
        first.len()
    );
    assert!(first.values().all(|n| *n == 1), "{first:?}");

    // Resumed: the rest, and none twice.
    let out = hopper(&[
        "dlq", "replay", "--config", config, "--group", &group, "--rate", "1000", "--resume", &run,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("were replayed by run {run} before")),
        "{}",
        stdout(&out)
    );
    let all = replayed_ids(&route.input).await;
    assert_eq!(all.len(), N, "every record replayed");
    let twice: Vec<_> = all.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "replayed more than once: {twice:?}");

    // The journal says so too.
    let out = hopper(&[
        "dlq",
        "ls",
        "--config",
        config,
        "--group",
        &group,
        "--not-replayed",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(page["total"], 0, "{page:#}");
    // A resume of a finished run replays nothing more.
    let out = hopper(&[
        "dlq", "replay", "--config", config, "--group", &group, "--resume", &run,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("Replayed 0 of 0"), "{}", stdout(&out));
    assert_eq!(replayed_ids(&route.input).await.len(), N);

    // An unknown run, and one that is no run id at all.
    let out = hopper(&[
        "dlq", "replay", "--config", config, "--group", &group, "--resume", "r-nope",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!(
            "replay run `r-nope` is not in `{}.replays`",
            route.dlq
        )),
        "{}",
        stderr(&out)
    );
    let out = hopper(&[
        "dlq", "replay", "--config", config, "--all", "--resume", "x;y",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`x;y` is not a replay run id"),
        "{}",
        stderr(&out)
    );
}

/// A run stopped in the middle of a batch (as a kill -9 would leave it),
/// written by hand: the batch's three entries are in the journal, but only
/// two of their replays are in the input. The resume reads the input from
/// the end offsets the entries wrote down, finds those two, and replays
/// exactly the third, once; the entry of an earlier batch of the same
/// attempt is done and skipped. A malformed entry of the run stops a
/// resume with an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_replays_exactly_the_records_of_a_stopped_batch_never_produced() {
    init_tracing();
    let route = RouteTable::new(&plugin("scripted")).test_route();
    let hopper_run = route.start().await;
    let producer = producer();
    const N: usize = 6;
    for i in 0..N {
        let id = format!("cut-{i}");
        produce(
            &producer,
            &route.input,
            Some(&id),
            "fatal",
            &[("hopper-id", &id)],
        )
        .await;
    }
    let dead = consume(&route.dlq, N, PATIENCE).await;
    hopper_run.stop().await;
    let at = |i: usize| {
        let m = dead
            .iter()
            .find(|m| header_map(m).0["hopper-id"] == format!("cut-{i}"))
            .unwrap();
        format!("{}:{}:{}", m.topic(), m.partition(), m.offset())
    };
    let ends: Vec<String> = (0..2)
        .map(|p| {
            let (_, high) = rdkafka::consumer::Consumer::fetch_watermarks(
                &reader(&route.input),
                &route.input,
                p,
                Duration::from_secs(10),
            )
            .unwrap();
            format!("{p}:{high}")
        })
        .collect();
    let journal = format!("{}.replays", route.dlq);
    let entry = |i: usize, n: usize, batch: usize, after: String| {
        let (id, at, attempt, batch) = (
            format!("cut-{i}"),
            at(i),
            format!("a1/{n}"),
            batch.to_string(),
        );
        let (producer, journal, to) = (&producer, &journal, &route.input);
        async move {
            produce(
                producer,
                journal,
                Some(&at),
                "",
                &[
                    ("hopper-id", &id),
                    ("hopper-replay-count", "1"),
                    ("hopper-replayed-to", to),
                    ("hopper-replay-run", "r-cut"),
                    ("hopper-replay-attempt", &attempt),
                    ("hopper-replay-batch", &batch),
                    ("hopper-replay-entry", "replay"),
                    ("hopper-replay-after", &after),
                ],
            )
            .await;
        }
    };
    // Batch 0 of attempt a1: cut-0, replayed (its replay is not looked for).
    entry(0, 0, 0, ends.join(",")).await;
    // Batch 1 (its first entry is number 1): cut-1, cut-2 and cut-3, of
    // which only cut-1's and cut-3's replays were produced.
    for (n, i) in [1, 2, 3].into_iter().enumerate() {
        entry(i, n + 1, 1, ends.join(",")).await;
    }
    for i in [1, 3] {
        let id = format!("cut-{i}");
        produce(
            &producer,
            &route.input,
            Some(&id),
            "fatal",
            &[
                ("hopper-id", &id),
                ("hopper-replay-count", "1"),
                ("hopper-replay-run", "r-cut"),
                ("hopper-replayed-from", &at(i)),
            ],
        )
        .await;
    }
    let config = route.config_path.to_str().unwrap();
    let resume = [
        "dlq",
        "replay",
        "--config",
        config,
        "--route",
        &route.name,
        "--rate",
        "1000",
        "--resume",
        "r-cut",
    ];
    let out = hopper(&resume);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "Resuming run r-cut: 3 record(s) replayed before; 1 recorded but not produced, replayed again"
        ),
        "{}",
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("Replayed 3 of 3 record(s)"),
        "{}",
        stdout(&out)
    );
    let ids = replayed_ids(&route.input).await;
    let mut replayed: Vec<&String> = ids.keys().collect();
    replayed.sort();
    assert_eq!(
        replayed,
        ["cut-1", "cut-2", "cut-3", "cut-4", "cut-5"],
        "{ids:?}"
    );
    assert!(ids.values().all(|n| *n == 1), "{ids:?}");
    // The redo is not a second replay of cut-2.
    let out = hopper(&["dlq", "show", "--config", config, &at(2), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(shown["replayed"], 1, "{shown:#}");

    // An entry of the run listing more partitions than a topic can have:
    // the resume stops, naming the entry and the problem, and replays
    // nothing.
    let long = vec!["0:0"; 100_001].join(",");
    entry(4, 9, 9, long).await;
    let out = hopper(&resume);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains(&format!("journal entry {journal}:"))
            && e.contains("names replay run r-cut, but header hopper-replay-after: more than 100000 partitions"),
        "{e}"
    );
    assert_eq!(replayed_ids(&route.input).await.len(), N - 1);
}

/// A batch in which some records fail: the dead letters of a route's two
/// inputs, one of them deleted before the replay. Each record's outcome
/// says what happened to it (the first input's replayed, the second's
/// failed, naming the topic), the replay fails naming the command to
/// resume it, and once the topic is back the resume replays exactly the
/// failed ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_destination_is_gone_fails_those_records_alone_and_a_resume_replays_them() {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    init_tracing();
    let name = hopper_tests::rand_name("route");
    let (a, b) = (format!("{name}.a"), format!("{name}.b"));
    let route = RouteTable::named(&name, &plugin("scripted"))
        .topics(&[&a, &b])
        .test_route();
    create_topics(&[&a, &b]).await;
    let hopper_run = route.start().await;
    let producer = producer();
    const N: usize = 4;
    for i in 0..N {
        for topic in [&a, &b] {
            let id = format!("{topic}-{i}");
            produce(&producer, topic, Some(&id), "fatal", &[("hopper-id", &id)]).await;
        }
    }
    consume(&route.dlq, 2 * N, PATIENCE).await;
    hopper_run.stop().await;
    let admin: AdminClient<DefaultClientContext> = client_config().create().unwrap();
    let deleted = admin
        .delete_topics(&[&b], &AdminOptions::new())
        .await
        .unwrap();
    assert!(deleted.iter().all(Result::is_ok), "{deleted:?}");
    let metadata: rdkafka::consumer::BaseConsumer = client_config().create().unwrap();
    let gone = Instant::now() + PATIENCE;
    while rdkafka::consumer::Consumer::fetch_metadata(&metadata, Some(&b), Duration::from_secs(5))
        .map(|m| m.topics()[0].error().is_none() && !m.topics()[0].partitions().is_empty())
        .unwrap_or(true)
    {
        assert!(Instant::now() < gone, "`{b}` is still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let config = route.config_path.to_str().unwrap();
    let replay = [
        "dlq", "replay", "--config", config, "--route", &name, "--rate", "1000",
    ];
    let mut args = replay.to_vec();
    args.push("--json");
    let out = hopper(&args);
    assert!(!out.status.success(), "{}", stdout(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["replayed"], N, "{report:#}");
    assert_eq!(report["failed"], N, "{report:#}");
    let run = report["run"].as_str().unwrap().to_string();
    for o in report["outcomes"].as_array().unwrap() {
        let id = o["id"].as_str().unwrap();
        if id.starts_with(&a) {
            assert!(o["failed"].is_null(), "{o:#}");
            assert_eq!(o["to"], a.as_str(), "{o:#}");
        } else {
            let failed = o["failed"].as_str().unwrap_or_default();
            assert!(
                failed.contains(&format!("not replayed: cannot read the end of `{b}`")),
                "{o:#}"
            );
        }
    }
    assert!(
        stderr(&out).contains(&format!(
            "{N} record(s) could not be replayed; to try them again:"
        )) && stderr(&out).contains(&format!("--resume {run}")),
        "{}",
        stderr(&out)
    );

    // The topic back: the resume replays the failed records, and only them.
    create_topics(&[&b]).await;
    let mut args = replay.to_vec();
    args.extend(["--resume", run.as_str()]);
    let out = hopper(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("Replayed {N} of {N} record(s)"))
            && stdout(&out).contains(&format!("{N} more were replayed by run {run} before")),
        "{}",
        stdout(&out)
    );
    for topic in [&a, &b] {
        let ids = replayed_ids(topic).await;
        assert_eq!(ids.len(), N, "{topic}: {ids:?}");
        assert!(
            ids.iter()
                .all(|(id, n)| id.starts_with(topic.as_str()) && *n == 1),
            "{topic}: {ids:?}"
        );
    }
}

/// BENCHMARKS.md, "DLQ replay": `HOPPER_REPLAY_BENCH_N` dead letters
/// (100,000 unless set) replayed at `--rate 100000` (the most
/// `replay.rate` allows), then replayed again by a run killed (SIGKILL)
/// once the input holds half of its replays, and resumed; counts the
/// records of that run in the input by the dead letter they were replayed
/// from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: cargo xtask bench, or run it by name"]
async fn bench_dlq_replay_throughput_and_kill_halfway() {
    init_tracing();
    let n: usize = std::env::var("HOPPER_REPLAY_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let route = RouteTable::new(&plugin("scripted")).test_route();
    let hopper_run = route.start().await;
    hopper_tests::bench_server::fill(&route.input, n as u64, |i| format!("k-{i}"), "fatal").await;
    let cluster = Cluster::new(brokers(), Default::default());
    let deadline = Instant::now() + Duration::from_secs(600);
    while hopper::lag::topic_size(&cluster, &route.dlq).unwrap() < n as i64 {
        assert!(Instant::now() < deadline, "the dead letters did not come");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    hopper_run.stop().await;
    let config = route.config_path.to_str().unwrap();
    let base = [
        "dlq",
        "replay",
        "--config",
        config,
        "--route",
        &route.name,
        "--rate",
        "100000",
    ];

    let start = Instant::now();
    let out = hopper(&base);
    let whole = start.elapsed();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("Replayed {n} of {n}")),
        "{}",
        stdout(&out)
    );
    eprintln!(
        "replay of {n}: {whole:.1?}, {:.0} records/s",
        n as f64 / whole.as_secs_f64()
    );

    // Again, killed halfway and resumed.
    let start = Instant::now();
    let mut child = Command::new(hopper_bin())
        .args(base)
        .env_remove("HOPPER_BROKERS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run's id, from its first line; its stderr read to the end so
    // that it never blocks on it.
    let (id_tx, id_rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("Replay run ") {
                let _ = id_tx.send(rest.split('.').next().map(str::to_string));
            }
        }
    });
    let run = id_rx.recv_timeout(PATIENCE).unwrap();
    // Killed once half of its replays are in the input (which holds the
    // n records and the first run's n replays).
    let half = 2 * n as i64 + n as i64 / 2;
    let deadline = Instant::now() + Duration::from_secs(600);
    let watch = reader(&route.input);
    let input_size = || -> i64 {
        (0..2)
            .map(|p| {
                let (low, high) = rdkafka::consumer::Consumer::fetch_watermarks(
                    &watch,
                    &route.input,
                    p,
                    Duration::from_secs(10),
                )
                .unwrap();
                high - low
            })
            .sum()
    };
    let mut size = 0;
    while size < half {
        assert!(Instant::now() < deadline, "the replay did not get halfway");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the replay ended before it was halfway"
        );
        std::thread::sleep(Duration::from_millis(2));
        size = input_size();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    eprintln!(
        "killed with {} of {n} replayed",
        input_size() - 2 * n as i64
    );
    let run = run.unwrap();
    let mut resume = base.to_vec();
    resume.extend(["--resume", run.as_str()]);
    let out = hopper(&resume);
    let resumed = start.elapsed();
    assert!(out.status.success(), "{}", stderr(&out));
    eprintln!(
        "{}",
        stderr(&out)
            .lines()
            .find(|l| l.starts_with("Resuming"))
            .unwrap_or("")
    );

    let size = hopper::lag::topic_size(&cluster, &route.input).unwrap() as usize;
    let mut from = std::collections::HashMap::new();
    for m in consume(&route.input, size, PATIENCE).await {
        let (h, _) = header_map(&m);
        if h.get("hopper-replay-run") == Some(&run) {
            *from
                .entry(h["hopper-replayed-from"].clone())
                .or_insert(0usize) += 1;
        }
    }
    let twice = from.values().filter(|c| **c > 1).count();
    eprintln!(
        "killed halfway and resumed: {resumed:.1?} in all; {} of {n} replayed by the run, {twice} twice",
        from.len()
    );
    assert_eq!(from.len(), n);
    assert_eq!(twice, 0);
}
