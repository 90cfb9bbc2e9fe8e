//! A loopback HTTP server standing for the service a keyed stream's handler
//! calls: `GET /<key>/<seq>` is recorded in the order requests arrive, with
//! the status it got, and answered 200 unless the test chose to fail that
//! `(key, seq)`: 503 its first N times, or 503 until the test heals it.
//! Any other path gets 404.
//!
//! With the `scripted` fixture, a message whose payload is
//! [`KeyRecorder::command`] makes one such request per call: 200 is `ok`,
//! 503 `retryable`, 404 `fatal`. The key in the path is a label the test
//! chooses (the message's Kafka key may be empty or binary).
//!
//! It runs on a thread and runtime of its own and stops when dropped.

use crate::http_server::Loopback;
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request, as it arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub key: String,
    pub seq: u64,
    /// What it was answered: 200 or 503.
    pub status: u16,
}

#[derive(Default)]
struct State {
    /// Every request to `/<key>/<seq>`, in arrival order.
    calls: Vec<Call>,
    /// 503s still to answer, per `(key, seq)`.
    failures: HashMap<(String, u64), u32>,
    /// `(key, seq)` answered 503 until healed.
    down: HashSet<(String, u64)>,
    /// `(key, seq)` that had a 200.
    ok: HashSet<(String, u64)>,
}

pub struct KeyRecorder {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    _server: Loopback,
}

impl KeyRecorder {
    /// Starts a server on 127.0.0.1 and a free port.
    pub fn start() -> KeyRecorder {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let server = Loopback::start("key-recorder", 2, move |stream| {
            let state = shared.clone();
            async move {
                let service = service_fn(move |request| answer(request, state.clone()));
                let _ = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            }
        });
        KeyRecorder {
            addr: server.addr,
            state,
            _server: server,
        }
    }

    /// The `allowed_hosts` entry for this server.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The URL of `(key, seq)`.
    pub fn url(&self, key: &str, seq: u64) -> String {
        format!("http://{}/{key}/{seq}", self.addr)
    }

    /// The `scripted` fixture's payload that GETs `(key, seq)`.
    pub fn command(&self, key: &str, seq: u64) -> String {
        format!("get:{}", self.url(key, seq))
    }

    /// `(key, seq)` is answered 503 its next `times` calls.
    pub fn fail(&self, key: &str, seq: u64, times: u32) {
        let mut state = self.state.lock().unwrap();
        state.failures.insert((key.to_string(), seq), times);
    }

    /// `(key, seq)` is answered 503 until [`KeyRecorder::heal`].
    pub fn fail_until_healed(&self, key: &str, seq: u64) {
        let mut state = self.state.lock().unwrap();
        state.down.insert((key.to_string(), seq));
    }

    /// `(key, seq)` is answered 200 from now on.
    pub fn heal(&self, key: &str, seq: u64) {
        let mut state = self.state.lock().unwrap();
        state.down.remove(&(key.to_string(), seq));
        state.failures.remove(&(key.to_string(), seq));
    }

    /// Every `(key, seq)` is answered 200 from now on.
    pub fn heal_all(&self) {
        let mut state = self.state.lock().unwrap();
        state.down.clear();
        state.failures.clear();
    }

    /// Every request so far, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    /// The requests for `key`, in arrival order.
    pub fn calls_of(&self, key: &str) -> Vec<Call> {
        let state = self.state.lock().unwrap();
        state
            .calls
            .iter()
            .filter(|c| c.key == key)
            .cloned()
            .collect()
    }

    /// Requests so far.
    pub fn requests(&self) -> usize {
        self.state.lock().unwrap().calls.len()
    }

    /// 503s answered so far.
    pub fn failures_answered(&self) -> usize {
        let state = self.state.lock().unwrap();
        state.calls.iter().filter(|c| c.status == 503).count()
    }

    /// Distinct `(key, seq)` that had a 200.
    pub fn oks(&self) -> usize {
        self.state.lock().unwrap().ok.len()
    }

    /// Whether `(key, seq)` had a 200.
    pub fn has_ok(&self, key: &str, seq: u64) -> bool {
        let state = self.state.lock().unwrap();
        state.ok.contains(&(key.to_string(), seq))
    }

    /// How many calls `(key, seq)` had.
    pub fn calls_to(&self, key: &str, seq: u64) -> usize {
        let state = self.state.lock().unwrap();
        state
            .calls
            .iter()
            .filter(|c| c.key == key && c.seq == seq)
            .count()
    }

    /// The calls that broke key order, described: for each key whose
    /// sequence numbers start at 0, a call of seq `m` that arrived before
    /// every seq below `m` of that key had its first 200. Empty when every
    /// key kept its order.
    pub fn order_breaks(&self) -> Vec<String> {
        order_breaks(&self.calls())
    }

    /// Polls until `done` holds of the server; fails after `timeout`,
    /// saying it waited for `what`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&KeyRecorder) -> bool,
    ) {
        let until = Instant::now() + timeout;
        while !done(self) {
            assert!(
                Instant::now() < until,
                "waited {timeout:?} for {what}, in vain: {} requests, {} distinct 200s, {} 503s",
                self.requests(),
                self.oks(),
                self.failures_answered()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// [`KeyRecorder::order_breaks`] of a call log.
pub fn order_breaks(calls: &[Call]) -> Vec<String> {
    // Per key: the seqs that had a 200, and the lowest seq without one.
    let mut keys: HashMap<&str, (HashSet<u64>, u64)> = HashMap::new();
    let mut breaks = Vec::new();
    for (index, call) in calls.iter().enumerate() {
        let (done, next) = keys.entry(&call.key).or_default();
        if call.seq > *next {
            breaks.push(format!(
                "key {}: call #{index} of seq {} came before seq {} had a 200",
                call.key, call.seq, next
            ));
        }
        if call.status == 200 {
            done.insert(call.seq);
            while done.contains(next) {
                *next += 1;
            }
        }
    }
    breaks
}

async fn answer(
    request: Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path();
    let parsed = path
        .strip_prefix('/')
        .and_then(|rest| rest.rsplit_once('/'))
        .and_then(|(key, seq)| Some((key.to_string(), seq.parse::<u64>().ok()?)));
    let Some((key, seq)) = parsed else {
        let response = Response::builder()
            .status(404)
            .body(Full::new(Bytes::from(format!("no such path {path}"))))
            .unwrap();
        return Ok(response);
    };
    let status = {
        let mut state = state.lock().unwrap();
        let pair = (key.clone(), seq);
        let fail = if state.down.contains(&pair) {
            true
        } else if let Some(left) = state.failures.get_mut(&pair)
            && *left > 0
        {
            *left -= 1;
            true
        } else {
            false
        };
        let status = if fail { 503 } else { 200 };
        if status == 200 {
            state.ok.insert(pair);
        }
        state.calls.push(Call { key, seq, status });
        status
    };
    let response = Response::builder()
        .status(status)
        .body(Full::new(Bytes::from_static(b"recorded")))
        .unwrap();
    Ok(response)
}
