//! A loopback HTTP/1.1 server for tests and benchmarks: keep-alive on, and
//! it counts the TCP connections it accepts, so a test can tell a pooled
//! client from one that connects per request.
//!
//! | path                | answer                                                   |
//! |---------------------|----------------------------------------------------------|
//! | `/hello`            | 200 `hello`                                              |
//! | `/status/N`         | status N, body `status N`                                |
//! | `/redirect?to=URL`  | 302 to URL                                               |
//! | `/slow/MS`          | 200 `slow` after MS milliseconds                         |
//! | `/big/N`            | 200 with N zero bytes and a `content-length`             |
//! | `/chunked/N`        | 200 with N zero bytes, chunked (no length up front)      |
//! | `/auth`             | 200 `seen`; the `authorization` header is kept           |
//! | `/flaky`            | 503 while [`TestServer::set_down`] is on, else 200 `up`  |
//! | `/echo-length`      | 200 `received N bytes`, N the request body's length      |
//! | `/echo`             | 200 with the request's body, and `x-echo: yes`; the request is kept ([`TestServer::echoed`]) |
//! | anything else       | 404                                                      |
//!
//! Every `traceparent` header it receives is kept ([`TestServer::traceparents`]),
//! and so are when each request arrived ([`TestServer::arrivals`]) and the
//! most it answered at once ([`TestServer::max_in_flight`]).
//!
//! It runs on a thread and runtime of its own, so a busy test runtime never
//! slows it, and stops when dropped.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// What the server has seen.
#[derive(Default)]
pub struct Seen {
    connections: AtomicU64,
    requests: AtomicU64,
    authorizations: Mutex<Vec<String>>,
    /// The `traceparent` header of every request that had one.
    traceparents: Mutex<Vec<String>>,
    /// `/flaky` answers 503 while set.
    down: AtomicBool,
    /// Every request to `/echo`, in order.
    echoed: Mutex<Vec<Echoed>>,
    /// Requests being answered now, and the most there ever were at once.
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// When each request arrived, in order.
    arrivals: Mutex<Vec<Instant>>,
}

/// Counts a request in flight until it is dropped, when its answer is made.
struct InFlight(Arc<Seen>);

impl InFlight {
    fn start(seen: &Arc<Seen>) -> InFlight {
        let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(seen.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request as `/echo` received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Echoed {
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Every header, in order, names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

pub struct TestServer {
    pub addr: SocketAddr,
    seen: Arc<Seen>,
    _server: Loopback,
}

/// A listener on 127.0.0.1 and a free port, served on a thread and runtime
/// of its own: each accepted connection (with `TCP_NODELAY`) is handed to
/// `connection`, whose future runs on that runtime. Dropping it stops the
/// server and drops the connections still open.
pub struct Loopback {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Loopback {
    pub fn start<F, Fut>(name: &str, threads: usize, connection: F) -> Loopback
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads)
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    loop {
                        let (stream, _) = tokio::select! {
                            _ = &mut stopped => return,
                            accepted = listener.accept() => match accepted {
                                Ok(accepted) => accepted,
                                Err(_) => continue,
                            },
                        };
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(connection(stream));
                    }
                });
                // Connections still open are dropped with the runtime.
                runtime.shutdown_timeout(Duration::from_millis(100));
            })
            .unwrap();
        Loopback {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl TestServer {
    /// Starts a server on 127.0.0.1 and a free port.
    pub fn start() -> TestServer {
        Self::start_with_threads(1)
    }

    /// Starts a server whose runtime has `threads` worker threads.
    pub fn start_with_threads(threads: usize) -> TestServer {
        let seen = Arc::new(Seen::default());
        let counters = seen.clone();
        let server = Loopback::start("test-http-server", threads, move |stream| {
            counters.connections.fetch_add(1, Ordering::SeqCst);
            let seen = counters.clone();
            async move {
                let service = service_fn(move |request| answer(request, seen.clone()));
                // Errors are the client going away mid-response: expected
                // when a test cuts a body short.
                let _ = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            }
        });
        TestServer {
            addr: server.addr,
            seen,
            _server: server,
        }
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The `allowed_hosts` entry for this server.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.seen.connections.load(Ordering::SeqCst)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.seen.requests.load(Ordering::SeqCst)
    }

    /// Makes `/flaky` answer 503 (`true`) or 200 (`false`) from now on.
    pub fn set_down(&self, down: bool) {
        self.seen.down.store(down, Ordering::SeqCst);
    }

    /// Every `traceparent` header received, on any path, in order.
    pub fn traceparents(&self) -> Vec<String> {
        self.seen.traceparents.lock().unwrap().clone()
    }

    /// Every request `/echo` received, in order.
    pub fn echoed(&self) -> Vec<Echoed> {
        self.seen.echoed.lock().unwrap().clone()
    }

    /// The most requests the server was answering at once.
    pub fn max_in_flight(&self) -> u64 {
        self.seen.max_in_flight.load(Ordering::SeqCst)
    }

    /// When each request arrived, in order of arrival.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.seen.arrivals.lock().unwrap().clone()
    }

    /// Every `authorization` header `/auth` received, in order.
    pub fn authorizations(&self) -> Vec<String> {
        self.seen.authorizations.lock().unwrap().clone()
    }
}

type AnyBody = BoxBody<Bytes, Infallible>;

async fn answer(
    request: Request<hyper::body::Incoming>,
    seen: Arc<Seen>,
) -> Result<Response<AnyBody>, Infallible> {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    seen.arrivals.lock().unwrap().push(Instant::now());
    let _in_flight = InFlight::start(&seen);
    for value in request.headers().get_all("traceparent") {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        seen.traceparents.lock().unwrap().push(value);
    }
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or("").to_string();
    let text = |status: u16, body: String| {
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::from(body)).boxed())
            .unwrap()
    };
    let (verb, arg) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or((path.trim_start_matches('/'), ""));
    let response = match verb {
        "hello" => text(200, "hello".into()),
        "flaky" if seen.down.load(Ordering::SeqCst) => text(503, "down".into()),
        "flaky" => text(200, "up".into()),
        "status" => match arg
            .parse::<u16>()
            .ok()
            .and_then(|s| StatusCode::from_u16(s).ok())
        {
            Some(status) => text(status.as_u16(), format!("status {}", status.as_u16())),
            None => text(400, "bad status".into()),
        },
        "redirect" => {
            let to = query.strip_prefix("to=").unwrap_or("/hello");
            Response::builder()
                .status(302)
                .header("location", to)
                .body(Full::new(Bytes::new()).boxed())
                .unwrap()
        }
        "slow" => {
            let ms: u64 = arg.parse().unwrap_or(1000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            text(200, "slow".into())
        }
        "big" | "chunked" => {
            let bytes: u64 = arg.parse().unwrap_or(0);
            let body = Zeros {
                left: bytes,
                exact: verb == "big",
            };
            Response::builder().status(200).body(body.boxed()).unwrap()
        }
        "echo" => {
            let method = request.method().to_string();
            let target = request
                .uri()
                .path_and_query()
                .map_or(String::new(), |p| p.to_string());
            let headers = request
                .headers()
                .iter()
                .map(|(k, v)| {
                    let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
                    (k.as_str().to_string(), value)
                })
                .collect();
            let body = match request.into_body().collect().await {
                Ok(body) => body.to_bytes().to_vec(),
                Err(e) => return Ok(text(400, format!("body failed: {e}"))),
            };
            seen.echoed.lock().unwrap().push(Echoed {
                method,
                target,
                headers,
                body: body.clone(),
            });
            Response::builder()
                .status(200)
                .header("x-echo", "yes")
                .body(Full::new(Bytes::from(body)).boxed())
                .unwrap()
        }
        "echo-length" => match request.into_body().collect().await {
            Ok(body) => text(200, format!("received {} bytes", body.to_bytes().len())),
            Err(e) => text(400, format!("body failed: {e}")),
        },
        "auth" => {
            let value = request
                .headers()
                .get("authorization")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            seen.authorizations.lock().unwrap().push(value);
            text(200, "seen".into())
        }
        _ => text(404, format!("no such path {path}")),
    };
    Ok(response)
}

/// `left` zero bytes in 64 KiB frames, with an exact size (so a
/// `content-length`) or without (so chunked).
struct Zeros {
    left: u64,
    exact: bool,
}

static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

impl Body for Zeros {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(ZEROS.len() as u64) as usize;
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&ZEROS[..n])))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact {
            SizeHint::with_exact(self.left)
        } else {
            SizeHint::default()
        }
    }
}
