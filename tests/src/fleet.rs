//! `hopper run` processes against the test broker, stopped cleanly or killed
//! with SIGKILL, and a ledger of every record they produced to the topics
//! where messages end: what the scale-out test and the crash loop count.

use crate::{cache_dir, client_config, now_ms, rand_name};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use std::borrow::BorrowMut;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The signal a clean stop sends (`kill -s <this>`). Hopper drains and
/// commits on it, then exits 0.
pub const STOP_SIGNAL: &str = "TERM";

/// One `hopper run` child process, its stderr in a log file. Dropping it
/// kills it with SIGKILL, so a failing test leaves no hopper behind.
pub struct HopperProcess {
    pub label: String,
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
    /// Whether the test ended it ([`HopperProcess::kill9`],
    /// [`HopperProcess::stop`]).
    ended: bool,
}

impl HopperProcess {
    /// Starts `hopper run --config config`, logging at `warn` to
    /// `log_dir/<label>.log`.
    pub fn spawn(label: &str, config: &Path, log_dir: &Path) -> HopperProcess {
        let log = log_dir.join(format!("{label}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(crate::hopper_bin())
            .args(["run", "--config"])
            .arg(config)
            .arg("--cache-dir")
            .arg(cache_dir())
            .env(
                "HOPPER_LOG",
                std::env::var("HOPPER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("hopper runs");
        HopperProcess {
            label: label.to_string(),
            child,
            log,
            exited: None,
            ended: false,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has ended on its own.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// SIGKILL, then reaps it: when this returns, the process is gone and
    /// produces nothing more.
    pub fn kill9(&mut self) {
        self.ended = true;
        if self.exited().is_none() {
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
    }

    /// Sends [`STOP_SIGNAL`] and waits up to `deadline` for the process to
    /// exit; the status, or an error naming the process (then killed).
    pub async fn stop(&mut self, deadline: Duration) -> Result<ExitStatus, String> {
        if let Some(status) = self.exited() {
            return Err(format!(
                "{} had already exited ({status}) before it was stopped",
                self.label
            ));
        }
        self.ended = true;
        let sent = Command::new("kill")
            .args(["-s", STOP_SIGNAL])
            .arg(self.pid().to_string())
            .status()
            .map_err(|e| format!("kill -s {STOP_SIGNAL}: {e}"))?;
        if !sent.success() {
            return Err(format!("kill -s {STOP_SIGNAL} {} failed", self.pid()));
        }
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if let Some(status) = self.exited() {
                return Ok(status);
            }
            if tokio::time::Instant::now() > until {
                self.kill9();
                return Err(format!(
                    "{} did not exit within {deadline:?} of SIG{STOP_SIGNAL}",
                    self.label
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last `lines` lines of its log, to explain a failure.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// Polls `done` every 100 ms until it holds, within `patience`: whether it
/// did. Fails at once, with its log, when one of `procs` has exited on its
/// own (not [`HopperProcess::stop`]ped or [`HopperProcess::kill9`]ed) or
/// with a failure code.
pub async fn wait_until<P: BorrowMut<HopperProcess>>(
    what: &str,
    procs: &mut [P],
    patience: Duration,
    mut done: impl FnMut() -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + patience;
    while !done() {
        for p in procs.iter_mut() {
            let p: &mut HopperProcess = p.borrow_mut();
            if let Some(status) = p.exited()
                && (!p.ended || (status.code().is_some() && !status.success()))
            {
                panic!(
                    "{} exited with {status} while waiting until {what}:\n{}",
                    p.label,
                    p.log_tail(30)
                );
            }
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

impl Drop for HopperProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One record read back from a topic where messages end, reduced to what
/// the counts need (a full header map per record would cost hundreds of MB
/// in a 100,000-message run).
#[derive(Clone, Debug)]
pub struct Seen {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// `hopper-id`.
    pub id: String,
    pub attempt: Option<u32>,
    pub reason: Option<String>,
    pub trail: Option<String>,
    pub version: Option<String>,
    /// The first 64 bytes of the payload, as text.
    pub payload: String,
    /// The record's timestamp, epoch ms.
    pub timestamp: i64,
    /// When this reader received it, epoch ms.
    pub received: i64,
}

/// Reads `topics` from the beginning in a group of its own, in the
/// background, and keeps every record as a [`Seen`].
pub struct Ledger {
    topics: Vec<String>,
    records: Arc<Mutex<Vec<Seen>>>,
    error: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Ledger {
    /// Starts reading. The topics must exist.
    pub fn start(topics: &[String]) -> Ledger {
        let consumer: StreamConsumer = client_config()
            .set("group.id", rand_name("ledger"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "50")
            .create()
            .expect("ledger consumer");
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&names).expect("ledger subscribes");
        let records = Arc::new(Mutex::new(Vec::new()));
        let error = Arc::new(Mutex::new(None));
        let task = tokio::spawn({
            let records = records.clone();
            let error = error.clone();
            async move {
                loop {
                    match consumer.recv().await {
                        Ok(m) => {
                            let seen = seen(&m);
                            // std Mutex: held for a push, never across an await.
                            records.lock().unwrap().push(seen);
                        }
                        Err(e) => {
                            *error.lock().unwrap() = Some(e.to_string());
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
        });
        Ledger {
            topics: topics.to_vec(),
            records,
            error,
            task,
        }
    }

    /// Runs `f` over every record read so far, in the order read.
    pub fn with<R>(&self, f: impl FnOnce(&[Seen]) -> R) -> R {
        f(&self.records.lock().unwrap())
    }

    pub fn len(&self) -> usize {
        self.records.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until every record on the ledger's topics now, by their high
    /// watermarks, has been read, within `timeout`.
    pub async fn read_all(&self, timeout: Duration) {
        let written = crate::records_on(&self.topics);
        let deadline = tokio::time::Instant::now() + timeout;
        while (self.len() as i64) < written {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the ledger read {} of the {written} records on {:?} within {timeout:?}",
                self.len(),
                self.topics
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The reader's last error, if it had one (it keeps reading after it).
    pub fn last_error(&self) -> Option<String> {
        self.error.lock().unwrap().clone()
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn seen(m: &rdkafka::message::BorrowedMessage<'_>) -> Seen {
    let mut out = Seen {
        topic: m.topic().to_string(),
        partition: m.partition(),
        offset: m.offset(),
        id: String::new(),
        attempt: None,
        reason: None,
        trail: None,
        version: None,
        payload: String::from_utf8_lossy(m.payload().unwrap_or_default())
            .chars()
            .take(64)
            .collect(),
        timestamp: m.timestamp().to_millis().unwrap_or(-1),
        received: now_ms(),
    };
    if let Some(headers) = m.headers() {
        for h in headers.iter() {
            let value = || String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned();
            match h.key {
                "hopper-id" => out.id = value(),
                "hopper-attempt" => out.attempt = value().parse().ok(),
                "hopper-reason" => out.reason = Some(value()),
                "hopper-trail" => out.trail = Some(value()),
                "hopper-handler-version" => out.version = Some(value()),
                _ => {}
            }
        }
    }
    out
}

/// A script for the `acting` fixture: `verdict`, and on `ok` one record
/// emitted to `emit_topic` whose payload is the message's `id`.
pub fn acting_script(id: &str, verdict: &str, emit_topic: &str) -> String {
    let steps = if verdict == "ok" {
        serde_json::json!([{"emit": {"topic": emit_topic, "payload": id}}])
    } else {
        serde_json::json!([])
    };
    serde_json::json!({"steps": steps, "verdict": verdict}).to_string()
}

/// Every id among `records` that came out more than once, with the number
/// of copies beyond the first.
pub fn duplicates<'a>(
    records: impl IntoIterator<Item = &'a Seen>,
) -> std::collections::BTreeMap<String, usize> {
    let mut copies = std::collections::BTreeMap::<String, usize>::new();
    for r in records {
        *copies.entry(r.id.clone()).or_default() += 1;
    }
    copies.retain(|_, n| *n > 1);
    copies.values_mut().for_each(|n| *n -= 1);
    copies
}

/// A record to produce: topic, key, payload and headers.
pub struct Outgoing {
    pub topic: String,
    pub key: String,
    pub payload: String,
    pub headers: Vec<(&'static str, String)>,
}

/// Produces `count` records, `make(i)` for i in 0..count, at about `rate`
/// per second, in batches of up to 100 whose deliveries are awaited
/// together. `make` is called at the moment its record is sent. Panics on a
/// failed delivery: the counts would mean nothing.
pub async fn produce_paced(count: usize, rate: u32, mut make: impl FnMut(usize) -> Outgoing) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::FutureRecord;
    let producer = crate::producer();
    let batch = 100.min(rate.max(1) as usize);
    let every = Duration::from_secs_f64(batch as f64 / f64::from(rate.max(1)));
    let mut tick = tokio::time::interval(every);
    let mut i = 0;
    while i < count {
        tick.tick().await;
        let mut pending = Vec::with_capacity(batch);
        for _ in 0..batch.min(count - i) {
            let out = make(i);
            let mut headers = OwnedHeaders::new();
            for (k, v) in &out.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v.as_str()),
                });
            }
            let record = FutureRecord::to(&out.topic)
                .key(out.key.as_str())
                .payload(out.payload.as_str())
                .headers(headers);
            let future = producer
                .send_result(record)
                .map_err(|(e, _)| e)
                .expect("enqueue a record");
            pending.push(future);
            i += 1;
        }
        for future in pending {
            future
                .await
                .expect("a delivery report")
                .map_err(|(e, _)| e)
                .expect("the broker acknowledges the record");
        }
    }
}
