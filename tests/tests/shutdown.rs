//! Stopping the `hopper` binary: SIGTERM drains (the calls in flight finish,
//! their hops are produced, the offsets committed, exit 0), a second signal
//! forces a non-zero exit, a drain past its deadline exits non-zero, and
//! kill -9 with hundreds of calls in flight loses nothing.

use hopper_tests::track_server::TrackServer;
use hopper_tests::*;
use rdkafka::producer::FutureRecord;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A config file for a one-partition route around the `fetch` fixture
/// calling `server`, with what `more` adds to the route.
async fn config(
    server: &TrackServer,
    more: impl FnOnce(RouteTable) -> RouteTable,
) -> (tempfile::TempDir, PathBuf, String) {
    let name = rand_name("stop");
    let input = format!("{name}.in");
    create_topics_with(&[&input], 1).await;
    let route = RouteTable::named(&name, &plugin("fetch"))
        .allowed_hosts(&[server.origin()])
        .timeout("30s")
        .config("url", server.url())
        .config("append-payload", "true");
    let TestConfig { dir, path } = ConfigBuilder::new()
        .partitions(1)
        .route(more(route))
        .write();
    (dir, path, input)
}

/// Starts `hopper run` on `config`, its log in `log`.
fn start(config: &Path, log: &Path, extra: &[&str]) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new(hopper_bin())
        .args(["run", "--config"])
        .arg(config)
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("hopper starts")
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name}");
}

/// Waits for `child` to exit, up to `timeout`.
fn wait(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

async fn produce_ids(topic: &str, ids: impl Iterator<Item = String>) {
    let producer = producer();
    for id in ids {
        producer
            .send(
                FutureRecord::<str, str>::to(topic).payload(&id),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
    }
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_calls_in_flight_commits_them_and_exits_0() {
    let server = TrackServer::start();
    let (dir, config, input) = config(&server, |r| r.ordering("unordered").max_in_flight(16)).await;
    produce_ids(&input, (0..40).map(|i| format!("m{i}/1500"))).await;
    let log = dir.path().join("first.log");
    let mut hopper = start(&config, &log, &[]);
    server
        .wait_for("16 calls in flight", PATIENCE, |s| s.open() >= 16)
        .await;
    signal(&hopper, "TERM");
    let status = wait(&mut hopper, Duration::from_secs(30)).expect("hopper drains and exits");
    let first_log = log_of(&log);
    assert_eq!(
        status.code(),
        Some(0),
        "a clean drain exits 0:\n{first_log}"
    );
    let arrived = server.arrived();
    let mut completed = server.completed();
    completed.sort();
    let mut started = arrived.clone();
    started.sort();
    assert_eq!(
        started, completed,
        "every call that started finished before the exit"
    );
    assert!(arrived.len() >= 16 && arrived.len() < 40);

    // A second run handles the rest, and nothing the first run finished
    // comes again: its offsets were committed in the drain.
    let log = dir.path().join("second.log");
    let mut again = start(&config, &log, &[]);
    server
        .wait_for("every message", PATIENCE, |s| s.completed().len() >= 40)
        .await;
    signal(&again, "TERM");
    let status = wait(&mut again, Duration::from_secs(30)).expect("hopper exits");
    assert_eq!(status.code(), Some(0), "{}", log_of(&log));
    let all = server.arrived();
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), 40, "every message handled");
    assert_eq!(
        all.len(),
        40,
        "no message handled twice after a clean drain:\n{first_log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_forces_a_non_zero_exit_and_a_late_drain_exits_non_zero() {
    let server = TrackServer::start();
    let (dir, config, input) = config(&server, |r| r.ordering("unordered").max_in_flight(4)).await;
    produce_ids(&input, (0..4).map(|i| format!("m{i}/20000"))).await;

    // A drain that would take 20 s: the second SIGTERM ends it at once.
    let log = dir.path().join("forced.log");
    let mut hopper = start(&config, &log, &["--shutdown-timeout", "60s"]);
    server
        .wait_for("4 calls in flight", PATIENCE, |s| s.open() >= 4)
        .await;
    signal(&hopper, "TERM");
    // The first signal is taken: hopper says it is draining, and it is.
    let until = Instant::now() + Duration::from_secs(10);
    while !log_of(&log).contains("Stopping: finishing the calls in flight") {
        assert!(
            Instant::now() < until,
            "the first SIGTERM is not logged within 10s: {}",
            log_of(&log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        hopper.try_wait().unwrap().is_none(),
        "still draining after the first signal"
    );
    signal(&hopper, "TERM");
    let status =
        wait(&mut hopper, Duration::from_secs(10)).expect("the second signal forces the exit");
    let text = log_of(&log);
    assert_eq!(status.code(), Some(128 + 15), "{text}");
    assert!(text.contains("SIGTERM again"), "{text}");

    // The same calls (never committed) against a 2 s deadline.
    let log = dir.path().join("late.log");
    let mut hopper = start(&config, &log, &["--shutdown-timeout", "2s"]);
    server
        .wait_for("the calls again", PATIENCE, |s| s.open() >= 4)
        .await;
    let stopping = Instant::now();
    signal(&hopper, "INT");
    let status = wait(&mut hopper, Duration::from_secs(15)).expect("the deadline ends the drain");
    let took = stopping.elapsed();
    let text = log_of(&log);
    assert_eq!(
        status.code(),
        Some(1),
        "a drain past its deadline is not clean: {text}"
    );
    assert!(text.contains("stopped before draining"), "{text}");
    eprintln!("the 2 s drain deadline ended the process after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_256_calls_in_flight_loses_nothing_and_redelivers_at_most_the_window() {
    let server = TrackServer::start();
    let (dir, config, input) = config(&server, |r| {
        r.ordering("unordered")
            .max_in_flight(256)
            .key("max_instances", 256)
            .memory_mib(16)
    })
    .await;
    let total = 1000;
    produce_ids(&input, (0..total).map(|i| format!("m{i}/3000"))).await;
    let log = dir.path().join("killed.log");
    let mut hopper = start(&config, &log, &[]);
    server
        .wait_for("256 calls in flight", Duration::from_secs(120), |s| {
            s.open() >= 256
        })
        .await;
    hopper.kill().unwrap(); // SIGKILL
    hopper.wait().unwrap();
    let before_kill = server.arrived().len();

    let log = dir.path().join("after.log");
    let mut again = start(&config, &log, &[]);
    server
        .wait_for("every message", Duration::from_secs(180), |s| {
            s.completed().iter().collect::<HashSet<_>>().len() >= total
        })
        .await;
    signal(&again, "TERM");
    let status = wait(&mut again, PATIENCE).expect("hopper exits");
    assert_eq!(status.code(), Some(0), "{}", log_of(&log));
    let all = server.arrived();
    let unique: HashSet<&String> = all.iter().collect();
    let duplicates = all.len() - unique.len();
    eprintln!(
        "kill -9 with {before_kill} calls started: {} calls for {} messages, {duplicates} duplicates",
        all.len(),
        unique.len()
    );
    assert_eq!(unique.len(), total, "nothing lost");
    assert!(
        duplicates <= before_kill.min(256),
        "only calls in flight at the kill ran again: {duplicates} duplicates"
    );
}

/// Regression: after a kill -9, about a second of work was done again (the
/// offsets of done messages waited for librdkafka's 1 s auto-commit). Now
/// the pipeline commits what it stores every 50 ms tick, and only the calls
/// in flight at the kill and a few hundred ms of done calls run again
/// (the aim is 200 ms, 4 calls; measured: 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_redoes_only_the_calls_in_flight_and_at_most_400_ms_of_done_calls() {
    /// Each call's service time, and the window of done work it may redo.
    const SERVICE_MS: u64 = 50;
    const WINDOW_MS: u64 = 400;
    let server = TrackServer::start();
    let (dir, config, input) = config(&server, |r| r.ordering("partition")).await;
    let total = 2_000;
    produce_ids(&input, (0..total).map(|i| format!("m{i}/{SERVICE_MS}"))).await;
    let log = dir.path().join("killed.log");
    let mut hopper = start(&config, &log, &[]);
    // Well past the first commit: 3 s of work.
    server
        .wait_for("60 calls done", Duration::from_secs(120), |s| {
            s.completed().len() >= 60
        })
        .await;
    hopper.kill().unwrap(); // SIGKILL
    hopper.wait().unwrap();
    let done_before: HashSet<String> = server.completed().into_iter().collect();
    let in_flight: Vec<String> = server
        .arrived()
        .into_iter()
        .filter(|id| !done_before.contains(id))
        .collect();

    let log = dir.path().join("after.log");
    let mut again = start(&config, &log, &[]);
    let past = done_before.len() + in_flight.len() + 20;
    server
        .wait_for(
            "20 new calls done after the restart",
            Duration::from_secs(120),
            |s| s.completed().iter().collect::<HashSet<_>>().len() >= past,
        )
        .await;
    signal(&again, "TERM");
    let status = wait(&mut again, PATIENCE).expect("hopper exits");
    assert_eq!(status.code(), Some(0), "{}", log_of(&log));
    let completed = server.completed();
    // The restart reads from the last commit: it runs again the calls in
    // flight at the kill (never committed), which shows the count below
    // sees what a restart does again.
    for id in &in_flight {
        assert!(
            completed.contains(id),
            "{id}, in flight at the kill, is done after the restart"
        );
    }
    // Each call done before the kill was answered once then: any further
    // answer is work done again.
    let redone = completed
        .iter()
        .filter(|id| done_before.contains(*id))
        .count()
        - done_before.len();
    let bound = (WINDOW_MS / SERVICE_MS) as usize;
    eprintln!(
        "kill -9 after {} calls done, {} in flight: {redone} done calls ran again (bound {bound})",
        done_before.len(),
        in_flight.len()
    );
    assert!(
        redone <= bound,
        "{redone} calls done before the kill ran again: more than {WINDOW_MS} ms of {SERVICE_MS} ms calls"
    );
}
