//! Secured clusters for the connection tests, started by the tests
//! themselves on 127.0.0.1:
//! - [`SecuredBroker`]: a Nisshi that serves TLS and SCRAM-SHA-256/512, on a
//!   SQLite store whose users were made while it ran without
//!   authentication;
//! - [`MtlsBroker`]: a Nisshi behind a proxy that terminates TLS and
//!   demands a client certificate (Nisshi does not verify clients);
//! - [`TokenEndpoint`]: an OIDC token endpoint that records the
//!   client-credentials requests librdkafka makes;
//! - [`Pki`]: a CA, a server certificate for 127.0.0.1, client
//!   certificates (one expired) and a CA that signed none of them.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The password of the SCRAM users the secured broker knows.
pub const PASSWORD: &str = "s3cret-Password-of-hopper";
/// The SCRAM-SHA-512 user, and the SCRAM-SHA-256 one.
pub const USER_512: &str = "hopper512";
pub const USER_256: &str = "hopper256";

/// The Nisshi binary: `HOPPER_NISSHI` (set by `cargo xtask test`), else
/// cargo's bin directory, else `nisshi` on PATH.
pub fn nisshi() -> PathBuf {
    if let Some(path) = std::env::var_os("HOPPER_NISSHI") {
        return PathBuf::from(path);
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    home.map(|h| h.join("bin/nisshi"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nisshi"))
}

/// A free port on 127.0.0.1 (free when this returns).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Test certificates, as PEM files in a directory of their own.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub expired_cert: PathBuf,
    pub expired_key: PathBuf,
    /// A CA that signed none of the certificates.
    pub other_ca: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = authority("hopper test CA");
        let other = authority("another CA");
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let leaf = |names: Vec<String>, expired: bool| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(names).unwrap();
            if expired {
                params.not_before = rcgen::date_time_ymd(2020, 1, 1);
                params.not_after = rcgen::date_time_ymd(2021, 1, 1);
            }
            let cert = params.signed_by(&key, &*ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()], false);
        let (client_cert, client_key) = leaf(vec!["hopper-client".into()], false);
        let (expired_cert, expired_key) = leaf(vec!["hopper-client".into()], true);
        Pki {
            ca: write("ca.pem", &ca.pem()),
            other_ca: write("other-ca.pem", &other.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            expired_cert: write("expired.pem", &expired_cert),
            expired_key: write("expired.key", &expired_key),
            dir,
        }
    }
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}

fn authority(name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
}

/// A Nisshi process, run from a clean directory of its own (it reads a
/// `.env` in its working directory). Killed on drop.
pub struct Nisshi {
    child: Child,
    pub port: u16,
    log: PathBuf,
}

impl Nisshi {
    /// Starts `nisshi broker` on 127.0.0.1:`port`, advertised as
    /// `advertised`, with `extra` arguments, and waits until it accepts.
    pub fn start(dir: &Path, port: u16, advertised: u16, storage: &str, extra: &[&str]) -> Nisshi {
        let log = dir.join(format!("nisshi-{port}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(nisshi())
            .current_dir(dir)
            .arg("broker")
            .args(["--listener-url", &format!("tcp://127.0.0.1:{port}")])
            .args([
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{advertised}"),
            ])
            .args(["--storage-engine", storage])
            .args(["--group-initial-rebalance-delay", "0s"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("nisshi runs (cargo xtask test installs it)");
        let mut broker = Nisshi { child, port, log };
        broker.wait_listening();
        broker
    }

    fn wait_listening(&mut self) {
        let addr: SocketAddr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("nisshi exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "nisshi did not listen on {addr} within 30s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The broker's process id, for reading its CPU time.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Nisshi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Nisshi that serves only TLS, and requires SCRAM from every client.
pub struct SecuredBroker {
    pub pki: Pki,
    pub address: String,
    dir: tempfile::TempDir,
    storage: String,
    broker: Option<Nisshi>,
}

impl SecuredBroker {
    /// Makes the users on a SQLite store while a broker runs on it without
    /// authentication, then serves the store with TLS and SCRAM.
    pub fn start() -> SecuredBroker {
        let pki = Pki::new();
        let dir = tempfile::tempdir().unwrap();
        // Relative to the broker's working directory, `dir`.
        let storage = "sqlite://nisshi.db".to_string();
        let open = free_port();
        {
            let plain = Nisshi::start(dir.path(), open, open, &storage, &[]);
            for (user, mechanism) in [(USER_512, "scram512"), (USER_256, "scram256")] {
                user_command(
                    dir.path(),
                    &plain,
                    &["create", "--mechanism", mechanism, user, PASSWORD],
                );
            }
        }
        let mut secured = SecuredBroker {
            pki,
            address: String::new(),
            dir,
            storage,
            broker: None,
        };
        secured.serve(free_port());
        secured
    }

    /// Starts (again) the broker with TLS and SCRAM on `port`.
    fn serve(&mut self, port: u16) {
        let cert = self.pki.server_cert.to_str().unwrap().to_string();
        let key = self.pki.server_key.to_str().unwrap().to_string();
        self.broker = Some(Nisshi::start(
            self.dir.path(),
            port,
            port,
            &self.storage,
            &["--authentication", "--cert", &cert, "--key", &key],
        ));
        self.address = format!("127.0.0.1:{port}");
    }

    /// Stops the broker, deletes `user` from its store, and serves the
    /// store again on the same port: the credential is rotated away.
    pub fn delete_user(&mut self, user: &str, mechanism: &str) {
        let port = self.broker.take().map(|b| b.port).unwrap();
        {
            let open = free_port();
            let plain = Nisshi::start(self.dir.path(), open, open, &self.storage, &[]);
            user_command(
                self.dir.path(),
                &plain,
                &["delete", "--mechanism", mechanism, user],
            );
        }
        self.serve(port);
    }

    /// librdkafka properties of a SCRAM-SHA-512 client of this broker.
    pub fn client_properties(&self) -> Vec<(&'static str, String)> {
        vec![
            ("security.protocol", "sasl_ssl".into()),
            ("sasl.mechanism", "SCRAM-SHA-512".into()),
            ("sasl.username", USER_512.into()),
            ("sasl.password", PASSWORD.into()),
            ("ssl.ca.location", self.pki.ca.display().to_string()),
        ]
    }

    /// A client config for the test's own producers and readers.
    pub fn client_config(&self) -> rdkafka::ClientConfig {
        let mut config = rdkafka::ClientConfig::new();
        config.set("bootstrap.servers", &self.address);
        for (key, value) in self.client_properties() {
            config.set(key, value);
        }
        config
    }

    pub fn log(&self) -> String {
        self.broker.as_ref().map(Nisshi::log).unwrap_or_default()
    }
}

impl Default for SecuredBroker {
    fn default() -> Self {
        SecuredBroker::start()
    }
}

fn user_command(dir: &Path, broker: &Nisshi, args: &[&str]) {
    let (verb, rest) = args.split_first().unwrap();
    let out = Command::new(nisshi())
        .current_dir(dir)
        .args(["user", verb])
        .args(["--broker", &format!("tcp://127.0.0.1:{}", broker.port)])
        .args(rest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nisshi user {verb} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Nisshi that serves only TLS, with no authentication and in-memory
/// storage, like the plaintext test broker: the same broker, encrypted.
pub struct TlsBroker {
    pub pki: Pki,
    pub address: String,
    pub broker: Nisshi,
    _dir: tempfile::TempDir,
}

impl TlsBroker {
    pub fn start() -> TlsBroker {
        let pki = Pki::new();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let broker = Nisshi::start(
            dir.path(),
            port,
            port,
            "memory://nisshi/",
            &[
                "--cert",
                pki.server_cert.to_str().unwrap(),
                "--key",
                pki.server_key.to_str().unwrap(),
            ],
        );
        TlsBroker {
            address: format!("127.0.0.1:{port}"),
            pki,
            broker,
            _dir: dir,
        }
    }

    /// librdkafka properties of a client of this broker: TLS, verified
    /// against the test CA.
    pub fn client_properties(&self) -> Vec<(String, String)> {
        vec![
            ("security.protocol".into(), "ssl".into()),
            ("ssl.ca.location".into(), self.pki.ca.display().to_string()),
        ]
    }
}

/// A plaintext Nisshi whose only way in is a TLS proxy, which may demand a
/// client certificate signed by the test CA: mutual TLS.
pub struct MtlsBroker {
    pub pki: Pki,
    /// The proxy's address, which the broker advertises.
    pub address: String,
    _broker: Nisshi,
    _dir: tempfile::TempDir,
    /// TLS handshakes the proxy refused, with the reason; not those the
    /// client left part way.
    pub refused: Arc<Mutex<Vec<String>>>,
}

impl MtlsBroker {
    /// The broker behind a TLS proxy that demands a client certificate
    /// when `client_certificate`, and only verifies itself otherwise.
    pub async fn start(client_certificate: bool) -> MtlsBroker {
        use tokio_rustls::rustls;
        let pki = Pki::new();
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = listener.local_addr().unwrap().port();
        let inner = free_port();
        let broker = Nisshi::start(dir.path(), inner, proxy, "memory://nisshi/", &[]);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in pem_certs(&pki.ca) {
            roots.add(cert).unwrap();
        }
        let verifier = if client_certificate {
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                provider.clone(),
            )
            .build()
            .unwrap()
        } else {
            rustls::server::WebPkiClientVerifier::no_client_auth()
        };
        let key = std::fs::read_to_string(&pki.server_key).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
            pem_blocks(&key, "PRIVATE KEY").remove(0).into(),
        );
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(pem_certs(&pki.server_cert), key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let refused: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = refused.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut tls = match acceptor.accept(stream).await {
                        Ok(tls) => tls,
                        // The client hung up part way (a process that
                        // stopped while its client was connecting): not
                        // a handshake the proxy refused.
                        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return,
                        Err(e) => return seen.lock().unwrap().push(e.to_string()),
                    };
                    let Ok(mut upstream) =
                        tokio::net::TcpStream::connect(("127.0.0.1", inner)).await
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut upstream).await;
                });
            }
        });
        MtlsBroker {
            pki,
            address: format!("127.0.0.1:{proxy}"),
            _broker: broker,
            _dir: dir,
            refused,
        }
    }
}

/// The base64 bodies of the PEM blocks labelled `label` in `pem`, decoded.
pub fn pem_blocks(pem: &str, label: &str) -> Vec<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find(&begin) {
        let body = &rest[start + begin.len()..];
        let stop = body.find(&end).unwrap();
        let text: String = body[..stop]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        out.push(base64_decode(&text));
        rest = &body[stop + end.len()..];
    }
    out
}

fn pem_certs(path: &Path) -> Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>> {
    let text = std::fs::read_to_string(path).unwrap();
    pem_blocks(&text, "CERTIFICATE")
        .into_iter()
        .map(Into::into)
        .collect()
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).expect("base64") as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// base64url without padding, as JWTs write their parts.
pub fn base64url(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |acc, b| acc << 8 | *b as u32) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out.replace('+', "-").replace('/', "_")
}

/// An OIDC token endpoint on 127.0.0.1 that answers every POST with a
/// bearer token (an unsigned JWT for subject `hopper`), and keeps each
/// request's head and body.
pub struct TokenEndpoint {
    pub url: String,
    pub requests: Arc<Mutex<Vec<String>>>,
}

impl TokenEndpoint {
    pub async fn start() -> TokenEndpoint {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/oauth2/token", listener.local_addr().unwrap());
        let requests: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    // The head, then as many body bytes as Content-Length says.
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                        let text = String::from_utf8_lossy(&request).to_string();
                        if let Some(head_end) = text.find("\r\n\r\n") {
                            let length = text[..head_end]
                                .lines()
                                .find_map(|l| {
                                    let (name, value) = l.split_once(':')?;
                                    name.eq_ignore_ascii_case("content-length")
                                        .then(|| value.trim().parse::<usize>().ok())?
                                })
                                .unwrap_or(0);
                            if request.len() >= head_end + 4 + length {
                                break;
                            }
                        }
                    }
                    seen.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&request).into_owned());
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_secs();
                    let header = base64url(br#"{"alg":"none","typ":"JWT"}"#);
                    let claims = base64url(
                        format!(r#"{{"sub":"hopper","iat":{now},"exp":{}}}"#, now + 3600)
                            .as_bytes(),
                    );
                    let body = format!(
                        r#"{{"access_token":"{header}.{claims}.c2lnbmF0dXJl","token_type":"bearer","expires_in":3600}}"#
                    );
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        TokenEndpoint { url, requests }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_as_pem_and_jwts_write_it() {
        assert_eq!(base64url(b"hopper"), "aG9wcGVy");
        assert_eq!(base64url(b"hop"), "aG9w");
        assert_eq!(base64url(b"ho"), "aG8");
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
        assert_eq!(base64_decode("aG9wcGVy"), b"hopper");
        assert_eq!(base64_decode("aG8="), b"ho");
    }
}

/// Writes one record batch of `count` records to `topic`[`partition`] at
/// `broker` with a raw Produce request (v3), its compression attribute set
/// to `codec` and its records replaced by bytes no codec decodes. Its
/// CRC is right, so a broker that does not decompress takes it, and the
/// damage shows only when a consumer decompresses: a batch corrupted at
/// rest. Returns the broker's error code (0: taken).
pub fn produce_corrupt_batch(
    broker: &str,
    topic: &str,
    partition: i32,
    count: i32,
    codec: i16,
) -> i16 {
    use std::io::{Read, Write};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // The part of the batch the CRC covers: attributes to the end.
    let mut covered = Vec::new();
    covered.extend(codec.to_be_bytes());
    covered.extend((count - 1).to_be_bytes());
    covered.extend(now.to_be_bytes());
    covered.extend(now.to_be_bytes());
    covered.extend((-1i64).to_be_bytes());
    covered.extend((-1i16).to_be_bytes());
    covered.extend((-1i32).to_be_bytes());
    covered.extend(count.to_be_bytes());
    covered.extend([0xab; 64]);
    let mut after_length = Vec::new();
    after_length.extend(0i32.to_be_bytes()); // partition leader epoch
    after_length.push(2); // magic
    after_length.extend(crc32c(&covered).to_be_bytes());
    after_length.extend(&covered);
    let mut batch = Vec::new();
    batch.extend(0i64.to_be_bytes()); // base offset: the broker assigns it
    batch.extend((after_length.len() as i32).to_be_bytes());
    batch.extend(after_length);

    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as i16).to_be_bytes());
        out.extend(s.as_bytes());
    };
    let mut request = Vec::new();
    request.extend(0i16.to_be_bytes()); // Produce
    request.extend(3i16.to_be_bytes()); // v3
    request.extend(7i32.to_be_bytes()); // correlation id
    string(&mut request, "hopper-tests");
    request.extend((-1i16).to_be_bytes()); // no transactional id
    request.extend(1i16.to_be_bytes()); // acks
    request.extend(10_000i32.to_be_bytes());
    request.extend(1i32.to_be_bytes());
    string(&mut request, topic);
    request.extend(1i32.to_be_bytes());
    request.extend(partition.to_be_bytes());
    request.extend((batch.len() as i32).to_be_bytes());
    request.extend(batch);

    let mut stream = TcpStream::connect(broker).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
        .write_all(&(request.len() as i32).to_be_bytes())
        .unwrap();
    stream.write_all(&request).unwrap();
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).unwrap();
    let mut response = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut response).unwrap();
    // correlation id, topics (1), name, partitions (1), index, error code.
    let name_end = 4 + 4 + 2 + topic.len();
    let at = name_end + 4 + 4;
    i16::from_be_bytes([response[at], response[at + 1]])
}

/// CRC-32C (Castagnoli), as record batches carry it.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in bytes {
        crc ^= *byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                crc >> 1 ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod crc_tests {
    #[test]
    fn crc32c_matches_its_check_value() {
        assert_eq!(super::crc32c(b"123456789"), 0xe306_9283);
    }
}
