//! A loopback HTTP server that records which message each handler call was
//! for, in the order the calls arrived, and how many were open at once: what
//! the ordering, concurrency and shutdown tests read.
//!
//! The `fetch` fixture with `append-payload = "true"` appends the message's
//! payload to its `url`; with `url = ".../track/"` and a payload `ID/MS`:
//!
//! | path               | answer                                                |
//! |--------------------|-------------------------------------------------------|
//! | `/track/ID/MS`     | 200 after MS milliseconds; ID recorded on arrival and on completion |
//! | `/track/ID/hang`   | 200 after an hour (the call's timeout ends it first)  |
//!
//! It runs on a thread and runtime of its own and stops when dropped.

use crate::http_server::Loopback;
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Calls {
    /// IDs in the order their requests arrived.
    arrived: Vec<String>,
    /// IDs in the order their responses were sent.
    completed: Vec<String>,
    open: usize,
    high_water: usize,
    /// Calls open now per key (an ID's text before its first `.`).
    open_keys: std::collections::HashMap<String, usize>,
    /// Calls that arrived while a call of the same key was open.
    overlaps: usize,
}

pub struct TrackServer {
    pub addr: SocketAddr,
    calls: Arc<Mutex<Calls>>,
    _server: Loopback,
}

impl TrackServer {
    /// Starts a server on 127.0.0.1 and a free port.
    pub fn start() -> TrackServer {
        let calls = Arc::new(Mutex::new(Calls::default()));
        let shared = calls.clone();
        let server = Loopback::start("track-server", 2, move |stream| {
            let calls = shared.clone();
            async move {
                let service = service_fn(move |request| answer(request, calls.clone()));
                let _ = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            }
        });
        TrackServer {
            addr: server.addr,
            calls,
            _server: server,
        }
    }

    /// The `url` config value for the `fetch` fixture.
    pub fn url(&self) -> String {
        format!("http://{}/track/", self.addr)
    }

    /// The `allowed_hosts` entry for this server.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// IDs in the order their calls arrived.
    pub fn arrived(&self) -> Vec<String> {
        self.calls.lock().unwrap().arrived.clone()
    }

    /// IDs in the order their calls were answered.
    pub fn completed(&self) -> Vec<String> {
        self.calls.lock().unwrap().completed.clone()
    }

    /// Calls open now.
    pub fn open(&self) -> usize {
        self.calls.lock().unwrap().open
    }

    /// Calls that arrived while another call of the same key (an ID's
    /// text before its first `.`) was still open.
    pub fn key_overlaps(&self) -> usize {
        self.calls.lock().unwrap().overlaps
    }

    /// The most calls that were open at once.
    pub fn high_water(&self) -> usize {
        self.calls.lock().unwrap().high_water
    }

    /// Waits until `done` holds of the server's calls, failing after
    /// `timeout` with `what`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&TrackServer) -> bool,
    ) {
        let until = std::time::Instant::now() + timeout;
        while !done(self) {
            assert!(
                std::time::Instant::now() < until,
                "timed out waiting for {what}: {} arrived, {} completed, {} open",
                self.arrived().len(),
                self.completed().len(),
                self.open()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Counts a call open until dropped, so a call the client abandons (its
/// timeout) is closed too.
struct Open(Arc<Mutex<Calls>>, String);

impl Drop for Open {
    fn drop(&mut self) {
        let mut c = self.0.lock().unwrap();
        c.open -= 1;
        if let Some(n) = c.open_keys.get_mut(&self.1) {
            *n -= 1;
        }
    }
}

async fn answer(
    request: Request<hyper::body::Incoming>,
    calls: Arc<Mutex<Calls>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_string();
    let rest = path.strip_prefix("/track/").unwrap_or("");
    let (id, wait) = rest.rsplit_once('/').unwrap_or((rest, "0"));
    let wait = match wait {
        "hang" => Duration::from_secs(3600),
        ms => Duration::from_millis(ms.parse().unwrap_or(0)),
    };
    let key = id.split('.').next().unwrap_or(id).to_string();
    {
        let mut c = calls.lock().unwrap();
        c.arrived.push(id.to_string());
        c.open += 1;
        c.high_water = c.high_water.max(c.open);
        let same_key = c.open_keys.entry(key.clone()).or_default();
        *same_key += 1;
        if *same_key > 1 {
            c.overlaps += 1;
        }
    }
    let open = Open(calls.clone(), key);
    tokio::time::sleep(wait).await;
    calls.lock().unwrap().completed.push(id.to_string());
    drop(open);
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}
