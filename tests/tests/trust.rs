//! What a handler cannot do to the host, and what the network does to a
//! handler, each pinned by the bug it was: reaching hopper's own admin
//! server, flooding the log with refused requests and emits, secrets that
//! escaped redaction, and the addresses and failures the docs promise
//! (guarded names, TLS to a test CA, `connection-timeout`, `DNS-error`).
//!
//! The handler is the `acting` fixture, called in-process; log lines are
//! read from what was logged on the test's own thread.

use hopper::egress::Resolve;
use hopper::events::{self, Event};
use hopper::metrics::series;
use hopper::plugin::Verdict;
use hopper_tests::http_server::TestServer;
use hopper_tests::*;
use serde_json::json;
use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs `steps` with verdict `fatal`, and returns the report.
async fn report(handler: &InProcess, steps: serde_json::Value) -> String {
    report_of(handler, json!({"steps": steps, "verdict": "fatal"})).await
}

/// [`report`], with each URL and topic reported as `…`: a report of long
/// ones is cut, like any reason, to 1 KiB.
async fn brief_report(handler: &InProcess, steps: serde_json::Value) -> String {
    report_of(
        handler,
        json!({"steps": steps, "verdict": "fatal", "brief": true}),
    )
    .await
}

async fn report_of(handler: &InProcess, script: serde_json::Value) -> String {
    match handler
        .handler
        .call(handler.delivery("m-1", &script.to_string()))
        .await
    {
        Verdict::Fatal { reason } => reason,
        other => panic!("expected the report in a fatal verdict, got {other:?}"),
    }
}

/// The `acting` fixture, allowed to reach `hosts`.
fn acting(hosts: &[&str]) -> RouteTable {
    RouteTable::new(&plugin("acting")).allowed_hosts(hosts)
}

fn port_of(server: &TestServer) -> u16 {
    server.origin().rsplit(':').next().unwrap().parse().unwrap()
}

/// Every log line written on this thread while it lives, at debug level.
///
/// One global subscriber writes each line to the buffer of the thread that
/// logged it. A scoped subscriber per test (`set_default`) lost lines when
/// the tests of this file ran in parallel: tracing caches each callsite's
/// interest and the global level filter across all threads, and a test that
/// dropped its subscriber could turn a callsite off for another test.
struct Logs {
    text: Arc<Mutex<Vec<u8>>>,
}

thread_local! {
    static CAPTURE: std::cell::RefCell<Option<Arc<Mutex<Vec<u8>>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Writes to the capturing buffer of the current thread, if any.
struct ThreadSink;

impl Write for ThreadSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some(text) = c.borrow().as_ref() {
                text.lock().unwrap().extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        CAPTURE.with(|c| c.borrow_mut().take());
    }
}

impl Logs {
    fn capture() -> Logs {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_ansi(false)
                .with_writer(|| ThreadSink)
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in this test binary");
        });
        let text = Arc::new(Mutex::new(Vec::new()));
        CAPTURE.with(|c| *c.borrow_mut() = Some(text.clone()));
        Logs { text }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap()).into_owned()
    }

    fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }
}

/// Names the test points at chosen addresses; any other name fails to
/// resolve. Counts lookups, so a test can show a name was looked up.
#[derive(Default)]
struct Names {
    known: HashMap<String, Vec<IpAddr>>,
    lookups: AtomicU64,
}

impl Names {
    fn with(entries: &[(&str, &str)]) -> Arc<Names> {
        Arc::new(Names {
            known: entries
                .iter()
                .map(|(name, ip)| (name.to_string(), vec![ip.parse().unwrap()]))
                .collect(),
            lookups: AtomicU64::new(0),
        })
    }
}

impl Resolve for Names {
    fn resolve(
        &self,
        host: &str,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let found = self.known.get(host).cloned().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no address for {host}"),
            )
        });
        Box::pin(std::future::ready(found))
    }
}

/// Regression: a handler granted `*://*:*` (or a loopback port range) could
/// GET hopper's own admin API and read every route's dead letters. A test
/// server stands at the admin server's port; only an entry naming its
/// address and port exactly reaches it.
#[tokio::test]
async fn a_handler_granted_everything_reaches_no_admin_server() {
    let admin = TestServer::start();
    let other = TestServer::start();
    let port = port_of(&admin);
    let rest =
        ConfigBuilder::new().admin(AdminTable::listen(format!("127.0.0.1:{port}")).token("t"));
    let names = Names::with(&[("admin.test", "127.0.0.1")]);
    let wide = InProcess::with_resolver(
        acting(&["*://*:*", "http://127.0.0.1:1-65535"]),
        rest.clone(),
        names.clone(),
    );
    let through = [
        admin.url("/hello"),
        format!("http://admin.test:{port}/hello"),
        format!("http://0.0.0.0:{port}/hello"),
        format!("http://[::ffff:127.0.0.1]:{port}/hello"),
        format!("http://[::1]:{port}/hello"),
    ];
    let mut steps: Vec<_> = through.iter().map(|u| json!({"get": u})).collect();
    steps.push(json!({"get": other.url("/hello")}));
    let got = report(&wide, json!(steps)).await;
    let mut expected: Vec<String> = through
        .iter()
        .map(|u| {
            // An address is refused by `handle` itself; a name only once
            // it resolves to one.
            let when = if u.contains("admin.test") {
                ""
            } else {
                " at handle"
            };
            format!("GET {u} -> error ErrorCode::HttpRequestDenied{when}")
        })
        .collect();
    expected.push(format!("GET {} -> 200 hello", other.url("/hello")));
    assert_eq!(got, expected.join(" | "));
    assert_eq!(admin.connections(), 0, "the admin port was connected to");
    assert_eq!(
        names.lookups.load(Ordering::SeqCst),
        1,
        "admin.test looked up"
    );

    let exact = InProcess::with_config(acting(&[admin.origin().as_str()]), rest);
    let got = report(&exact, json!([{"get": admin.url("/hello")}])).await;
    assert_eq!(got, format!("GET {} -> 200 hello", admin.url("/hello")));
    assert_eq!(admin.connections(), 1, "an exact entry reaches it");
}

/// Regression: denied requests did not count against `http.max_requests`,
/// and each wrote a WARN line, outside the handler's log budget, with a URL
/// of up to 64 KiB.
#[tokio::test]
async fn denied_requests_count_against_max_requests_and_their_urls_are_cut() {
    let logs = Logs::capture();
    let handler = InProcess::new(acting(&["http://granted.example"]).http("max_requests", 5));
    let url = format!("http://denied.example/{}", "x".repeat(60 << 10));
    let steps: Vec<_> = (0..8).map(|_| json!({"get": url})).collect();
    let got = brief_report(&handler, json!(steps)).await;
    let errors: Vec<&str> = got
        .split(" | ")
        .map(|l| l.split_once(" -> error ").unwrap().1)
        .collect();
    assert_eq!(
        errors,
        [
            ["ErrorCode::HttpRequestDenied at handle"; 5].as_slice(),
            &["ErrorCode::ConnectionLimitReached at handle"; 3]
        ]
        .concat()
    );
    assert_eq!(
        handler.count(&series::HttpRequests {
            route: "inproc",
            result: "denied"
        }),
        8
    );
    let lines = logs.lines_with("HTTP request denied.");
    assert_eq!(lines.len(), 8, "{lines:?}");
    for line in &lines {
        assert!(line.len() < 2048, "a line of {} bytes", line.len());
        assert!(line.contains("http://denied.example/xxx"), "{line}");
    }
}

/// Regression: refused emits did not count against `emit.max_records`, and
/// each logged its topic name whole, however long.
#[tokio::test]
async fn refused_emits_count_against_max_records_and_their_topics_are_cut() {
    let logs = Logs::capture();
    let handler =
        InProcess::new(RouteTable::new(&plugin("acting")).table_key("emit", "max_records", 3));
    let topic = "t".repeat(60 << 10);
    let steps: Vec<_> = (0..5)
        .map(|_| json!({"emit": {"topic": topic, "payload": "p"}}))
        .collect();
    let got = brief_report(&handler, json!(steps)).await;
    let errors: Vec<&str> = got
        .split(" -> error ")
        .skip(1)
        .map(|e| e.split(' ').next().unwrap())
        .collect();
    let errors: Vec<String> = errors.iter().map(|e| headers_cut(e)).collect();
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert!(
        errors[..3]
            .iter()
            .all(|e| e.starts_with("EmitError::TopicNotGranted")),
        "{errors:?}"
    );
    assert!(
        errors[3..]
            .iter()
            .all(|e| *e == "EmitError::TooManyRecords(3)"),
        "{errors:?}"
    );
    let lines = logs.lines_with("Emit refused.");
    assert_eq!(lines.len(), 5);
    for line in &lines {
        assert!(line.len() < 2048, "a line of {} bytes", line.len());
    }
}

/// The first 40 characters of `text`, for assertion messages.
fn headers_cut(text: &str) -> String {
    text.chars().take(40).collect()
}

/// Regression: a handler that loops on denied requests and refused emits
/// wrote a WARN line for each, outside its log budget. The budget (a burst
/// of 500 lines, then 100 a second) now holds them.
#[tokio::test]
async fn a_handler_looping_on_refusals_stays_within_its_log_budget() {
    let logs = Logs::capture();
    let handler = InProcess::new(
        RouteTable::new(&plugin("acting"))
            .timeout("20s")
            .http("max_requests", 100000)
            .table_key("emit", "max_records", 10000),
    );
    let mut steps: Vec<_> = (0..600)
        .map(|i| json!({"get": format!("http://denied.example/{i}")}))
        .collect();
    steps.extend((0..600).map(|_| json!({"emit": {"topic": "not-granted"}})));
    let started = std::time::Instant::now();
    report(&handler, json!(steps)).await;
    let took = started.elapsed().as_secs_f64();
    assert_eq!(
        handler.count(&series::HttpRequests {
            route: "inproc",
            result: "denied"
        }),
        600
    );
    assert_eq!(
        handler.count(&series::EmittedRecords {
            route: "inproc",
            result: "refused"
        }),
        600
    );
    let logged =
        logs.lines_with("HTTP request denied.").len() + logs.lines_with("Emit refused.").len();
    let budget = 500 + (took * 100.0).ceil() as usize;
    assert!(logged >= 500, "the burst of 500 lines is used: {logged}");
    assert!(
        logged <= budget,
        "{logged} lines in {took:.2}s; the budget allows {budget}"
    );
}

/// A handler's lines at a level the log leaves out (here trace, under a
/// debug log) take nothing from its log budget: after 600 of them, its
/// refused requests still get the whole burst of 500 WARN lines. They took
/// the burst before, and the refusals were not logged.
#[tokio::test]
async fn lines_the_log_leaves_out_take_nothing_from_the_log_budget() {
    let logs = Logs::capture();
    let handler = InProcess::new(
        RouteTable::new(&plugin("acting"))
            .timeout("20s")
            .http("max_requests", 100000),
    );
    let mut steps: Vec<_> = (0..600)
        .map(|i| json!({"trace": format!("left out {i}")}))
        .collect();
    steps.extend((0..600).map(|i| json!({"get": format!("http://after-trace.example/{i}")})));
    report(&handler, json!(steps)).await;
    assert!(
        logs.lines_with("left out").is_empty(),
        "trace lines are left out of a debug log"
    );
    let denied = logs.lines_with("after-trace.example").len();
    assert!(
        denied >= 500,
        "the refusals get the burst of 500 lines: {denied}"
    );
}

/// Writes `value` to a file of `dir`, for a `file:` secret.
/// Writes `value` to the file `name` in `dir`; the route's secret `name`
/// reads it.
fn secret_file(route: RouteTable, dir: &std::path::Path, name: &str, value: &str) -> RouteTable {
    let path = dir.join(name);
    std::fs::write(&path, format!("{value}\n")).unwrap();
    route.secret(name, format!("file:{}", path.display()))
}

fn random(len: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)]))
        .collect()
}

/// Regressions: redaction replaced exact copies line by line, so it missed
/// a multi-line `file:` secret, a secret cut by the 16 KiB capture limit, a
/// secret percent-encoded into a URL, and secrets in denial reasons and DNS
/// errors.
#[tokio::test]
async fn secrets_are_redacted_across_lines_cuts_encodings_and_errors() {
    let logs = Logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\nMIIE{}\nQUJD{}\n-----END PRIVATE KEY-----",
        random(40),
        random(40)
    );
    let big = random(20 << 10);
    let token = format!("tok+en/{}==", random(16));
    let label = format!("label{}", random(12));
    let mut route = acting(&["http://*.test:*"]).timeout("20s");
    for (name, value) in [
        ("pem", &pem),
        ("big", &big),
        ("token", &token),
        ("label", &label),
    ] {
        route = secret_file(route, dir.path(), name, value);
    }
    let handler = InProcess::with_resolver(route, ConfigBuilder::new(), Names::with(&[]));
    let mut events = handler.telemetry.subscribe();
    let encoded: String = token
        .bytes()
        .map(|b| match b {
            b'+' | b'/' | b'=' => format!("%{b:02X}"),
            b => char::from(b).to_string(),
        })
        .collect();
    assert_ne!(encoded, token);
    let denied_host = format!("http://{label}.example:81/x");
    let unresolved = format!("http://{label}.test/x");
    let got = report(
        &handler,
        json!([
            {"leak": "pem"},
            {"leak": "big"},
            {"get": format!("http://denied.example/p/{encoded}")},
            {"get": denied_host},
            {"get": unresolved},
        ]),
    )
    .await;
    assert!(got.contains("ErrorCode::DnsError"), "{got}");

    let mut denied = Vec::new();
    let error = wait_for_event(&mut events, "the HTTP request that failed", |e| {
        if let Event::HttpDenied(events::HttpDenied { url, reason, .. }) = e {
            denied.push((url.clone(), reason.clone()));
        }
        match e {
            Event::HttpRequest(events::HttpRequest { error, .. }) => error.clone(),
            _ => None,
        }
    })
    .await;
    assert_eq!(
        denied,
        vec![
            (
                "http://denied.example/p/[secret token]".to_string(),
                "http://denied.example:80 is not in allowed_hosts".to_string()
            ),
            (
                "http://[secret label].example:81/x".to_string(),
                "http://[secret label].example:81 is not in allowed_hosts".to_string()
            ),
        ]
    );
    assert!(
        error.starts_with("cannot resolve [secret label].test: "),
        "{error}"
    );

    let log = logs.text();
    assert!(log.contains("stdout has the secret [secret pem]"), "{log}");
    assert!(log.contains("stdout has the secret [secret big]"), "{log}");
    for (name, fragment) in [
        ("pem", &pem[28..60]),
        ("big", &big[..40]),
        ("token", token.as_str()),
        ("token", encoded.as_str()),
        ("label", label.as_str()),
    ] {
        assert!(!log.contains(fragment), "secret {name} is in the log");
    }
}

/// A TLS server on 127.0.0.1 with a certificate for `name`, signed by a CA
/// of its own: the CA's PEM, and the port.
async fn tls_server(name: &str) -> (String, u16) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &*ca)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // An untrusting client breaks off the handshake: expected.
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsecure",
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (ca.pem(), port)
}

/// A loopback port whose accept queue is full, so a new connection's SYN
/// goes unanswered and connecting times out: the listener and the
/// connections that fill it, kept open.
async fn unanswered_port() -> (
    tokio::net::TcpListener,
    Vec<std::net::TcpStream>,
    SocketAddr,
) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut filling = Vec::new();
    for _ in 0..16 {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(stream) => filling.push(stream),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                return (listener, filling, addr);
            }
            Err(e) => panic!("filling {addr}: {e}"),
        }
    }
    panic!("{addr} still accepted connections after 16; cannot make a connect time out");
}

/// What the docs claim of a handler's HTTP and no test showed: a name that
/// resolves to a guarded address reaches nothing (while one that resolves
/// to an open address is reached), TLS to a test CA trusted through
/// `ca_file`, `TLS-certificate-error` without it, `connection-timeout`, and
/// `DNS-error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_tls_timeouts_and_dns_errors_reach_the_handler_as_documented() {
    let open = TestServer::start();
    let port = port_of(&open);
    let (ca, tls_port) = tls_server("tls.test").await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let (_listener, _filling, stalled) = unanswered_port().await;
    let names = Names::with(&[
        ("open.test", "127.0.0.1"),
        ("tls.test", "127.0.0.1"),
        ("metadata.test", "169.254.169.254"),
        ("pod-identity.test", "fd00:ec2::23"),
        ("mapped.test", "::ffff:169.254.169.254"),
        ("compatible.test", "::169.254.169.254"),
        ("nat64.test", "64:ff9b::a9fe:a9fe"),
    ]);
    let trusting = InProcess::with_resolver(
        acting(&["*://*:*"])
            .http("connect_timeout", quoted("300ms"))
            .http("ca_file", quoted(ca_file.display())),
        ConfigBuilder::new(),
        names.clone(),
    );
    let guarded = [
        "metadata.test",
        "pod-identity.test",
        "mapped.test",
        "compatible.test",
        "nat64.test",
    ];
    let mut steps: Vec<_> = guarded
        .iter()
        .map(|name| json!({"get": format!("http://{name}:{port}/hello")}))
        .collect();
    steps.extend([
        json!({"get": format!("http://open.test:{port}/hello")}),
        json!({"get": format!("https://tls.test:{tls_port}/")}),
        json!({"get": format!("http://{stalled}/")}),
        json!({"get": "http://missing.test/"}),
    ]);
    let got = report(&trusting, json!(steps)).await;
    let lines: Vec<&str> = got.split(" | ").collect();
    for (name, line) in guarded.iter().zip(&lines) {
        assert!(
            line.ends_with("-> error ErrorCode::HttpRequestDenied"),
            "{name}: {line}"
        );
    }
    assert_eq!(
        lines[5],
        format!("GET http://open.test:{port}/hello -> 200 hello")
    );
    assert_eq!(open.connections(), 1, "only open.test reached the server");
    assert_eq!(
        lines[6],
        format!("GET https://tls.test:{tls_port}/ -> 200 secure")
    );
    assert_eq!(
        lines[7],
        format!("GET http://{stalled}/ -> error ErrorCode::ConnectionTimeout")
    );
    assert!(
        lines[8].starts_with("GET http://missing.test/ -> error ErrorCode::DnsError("),
        "{}",
        lines[8]
    );
    assert_eq!(names.lookups.load(Ordering::SeqCst), 8);

    let untrusting =
        InProcess::with_resolver(acting(&["*://*:*"]), ConfigBuilder::new(), names.clone());
    let got = report(
        &untrusting,
        json!([{"get": format!("https://tls.test:{tls_port}/")}]),
    )
    .await;
    assert_eq!(
        got,
        format!("GET https://tls.test:{tls_port}/ -> error ErrorCode::TlsCertificateError")
    );
}
