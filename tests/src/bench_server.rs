//! The loopback HTTP server of the HTTP benchmarks, in a child process (the
//! benchmark binary run again with `--serve`), so the benchmark's own CPU
//! time is hopper's side alone; that CPU time; the CPUs each side may run
//! on; and the preloaded input they read.

use crate::http_server::TestServer;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The child process: a test server, answering `stats` on stdin with its
/// connection and request counts, until stdin closes. With `--cpu N` after
/// `--serve`, it runs on CPU N only.
pub fn serve() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(cpu) = args.windows(2).find(|w| w[0] == "--cpu") {
        pin_process(&[cpu[1].parse().expect("--cpu takes a CPU number")]);
    }
    let server = TestServer::start_with_threads(1);
    println!("{}", server.addr);
    for line in std::io::stdin().lock().lines() {
        match line.as_deref() {
            Ok("stats") => println!("{} {}", server.connections(), server.requests()),
            _ => break,
        }
    }
}

/// The server child, seen from here.
pub struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// `http://127.0.0.1:PORT`, for `allowed_hosts`.
    pub origin: String,
    /// What each request GETs.
    pub url: String,
}

impl Server {
    /// Starts the server process, on CPU `cpu` only when given; requests
    /// go to a path answered after `service_ms` milliseconds (at once for
    /// 0).
    pub fn start(service_ms: u64, cpu: Option<usize>) -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.arg("--serve");
        if let Some(cpu) = cpu {
            command.args(["--cpu", &cpu.to_string()]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the server process starts");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut addr = String::new();
        stdout.read_line(&mut addr).unwrap();
        let origin = format!("http://{}", addr.trim());
        let url = match service_ms {
            0 => format!("{origin}/hello"),
            ms => format!("{origin}/slow/{ms}"),
        };
        Server {
            child,
            stdin,
            stdout,
            origin,
            url,
        }
    }

    /// (connections accepted, requests answered) so far.
    pub fn stats(&mut self) -> (u64, u64) {
        writeln!(self.stdin, "stats").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let mut parts = line.split_whitespace().map(|n| n.parse::<u64>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is plain bits; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: the kernel writes at most `size` bytes into `set`.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below `CPU_SETSIZE`, inside the set.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Lets every thread of this process run on `cpus` only. A thread starts
/// with the CPUs of the thread that starts it, so the threads are listed
/// again until a listing finds none it has not pinned: then the whole
/// process keeps to `cpus`.
pub fn pin_process(cpus: &[usize]) {
    // SAFETY: `cpu_set_t` is plain bits; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        assert!(cpu < libc::CPU_SETSIZE as usize, "no CPU {cpu}");
        // SAFETY: `cpu` is below `CPU_SETSIZE`, inside the set.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    let mut pinned = std::collections::HashSet::new();
    loop {
        let tasks =
            std::fs::read_dir("/proc/self/task").expect("/proc/self/task lists the threads");
        let tids: Vec<libc::pid_t> = tasks
            .flatten()
            .filter_map(|task| task.file_name().to_str()?.parse().ok())
            .collect();
        let mut new = false;
        for tid in tids {
            if pinned.insert(tid) {
                new = true;
                // SAFETY: the kernel reads `size` bytes of `set`. A thread
                // that ended since the listing fails with ESRCH: nothing
                // left to pin.
                unsafe { libc::sched_setaffinity(tid, size, &set) };
            }
        }
        if !new {
            return;
        }
    }
}

/// CPU seconds used so far by this process (user + system).
pub fn cpu_seconds() -> f64 {
    // `getrusage`, not `/proc/self/stat`: the latter counts in 10 ms ticks,
    // a quarter of a 10,000-message row that costs 4 µs a message.
    // SAFETY: a `rusage` is plain integers, for which all zeroes is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid `rusage` for the call to fill.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Context switches so far of this process's live threads, voluntary
/// (a thread parked, waiting to be woken) and not, by thread name: on a
/// machine whose wake-ups cost an interrupt each, what a request costs
/// beyond its own work. A thread that ended takes its count with it.
pub fn context_switches() -> std::collections::BTreeMap<String, u64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let mut name = String::new();
        let mut switches = 0;
        for line in status.lines() {
            if let Some(n) = line.strip_prefix("Name:") {
                name = n.trim().to_string();
            } else if line.contains("ctxt_switches:") {
                switches += line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        *by_name.entry(name).or_insert(0) += switches;
    }
    by_name
}

/// With `BENCH_WINDOWS` set, the boot clock now (`/proc/uptime`, seconds),
/// which `perf record -k CLOCK_MONOTONIC` matches on a machine that never
/// slept: a benchmark prints each contender's timed window with it, for
/// `perf report --time START,END`.
pub fn window_clock() -> Option<String> {
    std::env::var_os("BENCH_WINDOWS")?;
    let text = std::fs::read_to_string("/proc/uptime").ok()?;
    Some(text.split(' ').next()?.to_string())
}

/// A fresh topic named `prefix-...` of `partitions` partitions holding `n`
/// records of `payload`, the i-th keyed `key(i)`, every one acknowledged.
pub async fn preload(
    prefix: &str,
    n: u64,
    partitions: i32,
    key: impl Fn(u64) -> String,
    payload: &str,
) -> String {
    let topic = crate::rand_name(prefix);
    crate::create_topics_with(&[&topic], partitions).await;
    fill(&topic, n, key, payload).await;
    topic
}

/// Produces `n` records of `payload` to `topic`, the i-th keyed `key(i)`,
/// and waits until every one is acknowledged.
pub async fn fill(topic: &str, n: u64, key: impl Fn(u64) -> String, payload: &str) {
    use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
    use std::time::Duration;
    let producer: FutureProducer = crate::client_config()
        .set("linger.ms", "10")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .unwrap();
    let mut acks = Vec::new();
    for i in 0..n {
        let key = key(i);
        loop {
            match producer.send_result(FutureRecord::to(topic).key(&key).payload(payload)) {
                Ok(ack) => {
                    acks.push(ack);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
    }
    for ack in acks {
        ack.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// `loops` loops, each making its share of `n` GETs of `url` one after
/// another on one pooled hyper client, reading every body: the bare client
/// the HTTP benchmarks measure hopper against.
pub async fn bare_gets(url: &str, n: u64, loops: u64) {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    let client: Client<_, Empty<bytes::Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let uri: http::Uri = url.parse().unwrap();
    let tasks: Vec<_> = (0..loops)
        .map(|i| {
            let (client, uri) = (client.clone(), uri.clone());
            let share = n / loops + u64::from(i < n % loops);
            tokio::spawn(async move {
                for _ in 0..share {
                    let response = client.get(uri.clone()).await.unwrap();
                    assert!(response.status().is_success());
                    response.into_body().collect().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// A route's own HTTP client (`hopper::egress::Transport`) allowed to reach
/// `origin` only, with the settings the HTTP benchmarks use.
pub fn transport(origin: &str) -> hopper::egress::Transport<http_body_util::Empty<bytes::Bytes>> {
    let allow = hopper::egress::AllowList::parse(&[origin]).unwrap();
    let settings = hopper::egress::TransportSettings {
        connect_timeout: std::time::Duration::from_secs(2),
        max_idle_per_host: 16,
        idle_timeout: std::time::Duration::from_secs(30),
        ca_file: None,
        resolver: None,
    };
    hopper::egress::Transport::new(allow, &settings).unwrap()
}

/// `n` GETs of `uri` one after another through `transport`, reading every
/// body: hopper's transport alone, without a handler.
pub async fn transport_gets(
    transport: &hopper::egress::Transport<http_body_util::Empty<bytes::Bytes>>,
    uri: &http::Uri,
    n: u64,
) {
    use http_body_util::{BodyExt, Empty};
    for _ in 0..n {
        let request = http::Request::get(uri.clone()).body(Empty::new()).unwrap();
        let response = transport
            .send(request, std::time::Duration::from_secs(5))
            .await
            .unwrap();
        assert!(response.status().is_success());
        let body = hopper::egress::LimitedBody::new(response.into_body(), 1 << 20, None);
        body.collect().await.unwrap();
    }
}
