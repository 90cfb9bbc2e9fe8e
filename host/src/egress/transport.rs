//! One route's HTTP client: pooled keep-alive connections, rustls with the
//! system's roots plus an optional CA file, name resolution that never
//! hands out a guarded address, and a check of every new connection's peer
//! (which catches hopper's own admin server, guarded by address *and* port,
//! whatever name led there).
//!
//! A connection-per-request client opens a TCP connection and a TLS
//! handshake for every request and leaves a socket in TIME_WAIT behind each;
//! under load that caps a host at a few hundred requests a second. This
//! client keeps up to `max_idle_per_host` idle connections per host and
//! reuses them, so a partition calling one service holds one connection.

use super::allow::{AllowList, Guard};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::error::Error as StdError;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

/// How a route's client connects and pools.
#[derive(Clone)]
pub struct TransportSettings {
    pub connect_timeout: Duration,
    pub max_idle_per_host: usize,
    pub idle_timeout: Duration,
    pub ca_file: Option<PathBuf>,
    /// Resolves host names; `None`: the system's resolver. Tests give their
    /// own, to point a name at any address.
    pub resolver: Option<Arc<dyn Resolve>>,
}

impl std::fmt::Debug for TransportSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportSettings")
            .field("connect_timeout", &self.connect_timeout)
            .field("max_idle_per_host", &self.max_idle_per_host)
            .field("idle_timeout", &self.idle_timeout)
            .field("ca_file", &self.ca_file)
            .field("resolver", &self.resolver.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// A name resolver: the addresses of a host name.
pub trait Resolve: Send + Sync + 'static {
    fn resolve(
        &self,
        host: &str,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>;
}

/// A route's HTTP client, generic over the request body type. Cheap to
/// share: clones of the inner client share one pool.
pub struct Transport<B> {
    client: Client<HttpsConnector<GuardedConnector>, B>,
}

/// Why a route's client could not be built. Each variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot read CA file {path}: {detail}")]
    CaFile { path: PathBuf, detail: String },
    #[error("CA file {path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("cannot set up TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// Why a request got no response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// The name resolved only to guarded addresses (link-local or
    /// metadata, which no entry of the allow-list names), or the connection
    /// reached hopper's own admin server.
    Guarded {
        host: String,
        addresses: Vec<IpAddr>,
        guard: Guard,
    },
    /// The name did not resolve.
    Dns { host: String, detail: String },
    /// No TCP connection within the route's `connect_timeout`.
    ConnectTimeout,
    /// The connection was refused, reset or could not be made.
    Connect {
        kind: std::io::ErrorKind,
        detail: String,
    },
    /// The server's certificate was not trusted.
    TlsCertificate(String),
    /// Any other TLS failure.
    Tls(String),
    /// No response head within the time allowed.
    Timeout,
    /// The server broke the protocol or closed the connection.
    Protocol(String),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Guarded {
                host,
                addresses,
                guard,
            } => write!(
                f,
                "{host} leads only to {guard} ({}), and no allowed_hosts entry names it",
                addresses
                    .iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            SendError::Dns { host, detail } => write!(f, "cannot resolve {host}: {detail}"),
            SendError::ConnectTimeout => f.write_str("connect timed out"),
            SendError::Connect { detail, .. } => write!(f, "cannot connect: {detail}"),
            SendError::TlsCertificate(detail) => write!(f, "untrusted certificate: {detail}"),
            SendError::Tls(detail) => write!(f, "TLS failed: {detail}"),
            SendError::Timeout => f.write_str("no response in time"),
            SendError::Protocol(detail) => write!(f, "HTTP failed: {detail}"),
        }
    }
}

impl<B> Transport<B>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    /// A client for a route whose handler may call `allow`. Connections go
    /// only to addresses `allow` accepts ([`AllowList::refuses`]).
    pub fn new(allow: AllowList, settings: &TransportSettings) -> Result<Self, TransportError> {
        let mut roots = RootCertStore::empty();
        roots.extend(system_roots().roots.iter().cloned());
        if let Some(path) = &settings.ca_file {
            add_ca_file(&mut roots, path)?;
        }
        if roots.is_empty() {
            tracing::warn!(
                "No trusted CA certificates: no system roots were found and no ca_file is set, so every HTTPS request will fail."
            );
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let guarded = GuardedConnector {
            allow: Arc::new(allow),
            resolver: settings.resolver.clone(),
            connect_timeout: settings.connect_timeout,
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(guarded);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(settings.max_idle_per_host)
            .pool_idle_timeout(settings.idle_timeout)
            .build(connector);
        Ok(Transport { client })
    }

    /// Sends `request` (its URI absolute) on a pooled connection, and waits
    /// up to `head_timeout` for the response head, the connect included.
    /// The body is read later, through the response.
    pub async fn send(
        &self,
        request: http::Request<B>,
        head_timeout: Duration,
    ) -> Result<http::Response<Incoming>, SendError> {
        match tokio::time::timeout(head_timeout, self.client.request(request)).await {
            Err(_) => Err(SendError::Timeout),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(classify(&e)),
        }
    }
}

/// The system's root certificates, read once per process: reading them
/// takes milliseconds, and every route's client starts from them.
fn system_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::debug!(%error, "A system root certificate could not be read.");
        }
        let mut roots = RootCertStore::empty();
        let (added, ignored) = roots.add_parsable_certificates(found.certs);
        tracing::debug!(added, ignored, "System root certificates loaded.");
        roots
    })
}

fn add_ca_file(roots: &mut RootCertStore, path: &Path) -> Result<(), TransportError> {
    let ca_error = |detail: String| TransportError::CaFile {
        path: path.to_path_buf(),
        detail,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| ca_error(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| ca_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(TransportError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    for (i, cert) in certs.into_iter().enumerate() {
        roots
            .add(cert)
            .map_err(|e| ca_error(format!("certificate {} is not valid: {e}", i + 1)))?;
    }
    Ok(())
}

/// Connects a route's client: resolves the name (the system's resolver,
/// or the route's own), drops every address the allow-list refuses at the
/// request's port, and connects only to those left. So a name pointing at a
/// metadata address, or at hopper's own admin server, reaches nothing, and
/// neither does an IP literal in any of its forms.
#[derive(Clone)]
struct GuardedConnector {
    allow: Arc<AllowList>,
    resolver: Option<Arc<dyn Resolve>>,
    connect_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
enum ResolveError {
    #[error("{host} leads only to {guard}")]
    Guarded {
        host: String,
        addresses: Vec<IpAddr>,
        guard: Guard,
    },
    #[error("cannot resolve {host}: {source}")]
    Lookup {
        host: String,
        source: std::io::Error,
    },
}

type BoxError = Box<dyn StdError + Send + Sync>;

impl GuardedConnector {
    async fn lookup(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        match &self.resolver {
            Some(resolver) => resolver.resolve(host).await,
            None => Ok(tokio::net::lookup_host((host, 0))
                .await?
                .map(|a| a.ip())
                .collect()),
        }
    }
}

impl tower_service::Service<http::Uri> for GuardedConnector {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or("the URL has no host")?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let https = uri.scheme_str() == Some("https");
            let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
            let found = match host.parse::<IpAddr>() {
                Ok(ip) => vec![ip],
                Err(_) => match this.lookup(&host).await {
                    Ok(found) => found,
                    Err(source) => return Err(ResolveError::Lookup { host, source }.into()),
                },
            };
            let addresses = usable(host, found, port, &this.allow)?;
            let mut tcp = HttpConnector::new_with_resolver(Resolved(addresses));
            tcp.enforce_http(false);
            tcp.set_nodelay(true);
            tcp.set_connect_timeout(Some(this.connect_timeout));
            tcp.call(uri).await.map_err(Into::into)
        })
    }
}

/// The addresses [`GuardedConnector`] already resolved and checked, handed
/// to hyper's connector as its resolver (which sets the port).
#[derive(Clone)]
struct Resolved(Vec<SocketAddr>);

impl tower_service::Service<Name> for Resolved {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, std::io::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _name: Name) -> Self::Future {
        std::future::ready(Ok(self.0.clone().into_iter()))
    }
}

/// The addresses of `host` that `allow` lets a handler connect to at
/// `port`; an error when every address it resolved to is refused.
fn usable(
    host: String,
    found: Vec<IpAddr>,
    port: u16,
    allow: &AllowList,
) -> Result<Vec<SocketAddr>, ResolveError> {
    let mut usable = Vec::new();
    let mut refused = Vec::new();
    for ip in found {
        let addr = SocketAddr::new(ip, port);
        match allow.refuses(addr) {
            None => usable.push(addr),
            Some(guard) => refused.push((ip, guard)),
        }
    }
    match refused.first() {
        Some(&(_, guard)) if usable.is_empty() => Err(ResolveError::Guarded {
            host,
            addresses: refused.iter().map(|(ip, _)| *ip).collect(),
            guard,
        }),
        _ => Ok(usable),
    }
}

/// What went wrong, from the client's error and its chain of causes.
fn classify(error: &hyper_util::client::legacy::Error) -> SendError {
    let mut cause: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(resolve) = e.downcast_ref::<ResolveError>() {
            return match resolve {
                ResolveError::Guarded {
                    host,
                    addresses,
                    guard,
                } => SendError::Guarded {
                    host: host.clone(),
                    addresses: addresses.clone(),
                    guard: *guard,
                },
                ResolveError::Lookup { host, source } => SendError::Dns {
                    host: host.clone(),
                    detail: source.to_string(),
                },
            };
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(tls) = tls_cause(io) {
                return match tls {
                    rustls::Error::InvalidCertificate(reason) => {
                        SendError::TlsCertificate(format!("{reason:?}"))
                    }
                    other => SendError::Tls(other.to_string()),
                };
            }
            if error.is_connect() {
                return if io.kind() == std::io::ErrorKind::TimedOut {
                    SendError::ConnectTimeout
                } else {
                    SendError::Connect {
                        kind: io.kind(),
                        detail: io.to_string(),
                    }
                };
            }
        }
        cause = e.source();
    }
    let detail = chain(error);
    if error.is_connect() {
        SendError::Connect {
            kind: std::io::ErrorKind::Other,
            detail,
        }
    } else {
        SendError::Protocol(detail)
    }
}

/// The TLS error inside `io`, through the io errors that wrap it
/// (hyper-rustls wraps tokio-rustls's io error in one of its own).
fn tls_cause(io: &std::io::Error) -> Option<&rustls::Error> {
    let mut inner: &(dyn StdError + 'static) = io.get_ref()?;
    loop {
        if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        inner = inner.downcast_ref::<std::io::Error>()?.get_ref()?;
    }
}

/// An error and its causes on one line.
fn chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        ips(list)
            .into_iter()
            .map(|ip| SocketAddr::new(ip, 80))
            .collect()
    }

    #[test]
    fn a_name_never_resolves_to_a_guarded_address() {
        let any = AllowList::parse(&["*://*:*"]).unwrap();
        let mixed = ips(&[
            "169.254.169.254",
            "10.1.2.3",
            "fd00:ec2::254",
            "fd00:ec2::23",
        ]);
        let kept = usable("mixed.example".into(), mixed, 80, &any).unwrap();
        assert_eq!(kept, addrs(&["10.1.2.3"]), "only the open address is kept");

        let metadata = ips(&["169.254.169.254", "fe80::1", "64:ff9b::a9fe:a9fe"]);
        match usable("metadata.example".into(), metadata.clone(), 80, &any) {
            Err(ResolveError::Guarded {
                host,
                addresses,
                guard,
            }) => {
                assert_eq!(host, "metadata.example");
                assert_eq!(addresses.len(), 3);
                assert_eq!(guard, Guard::Metadata);
            }
            other => panic!("expected a refusal, got {other:?}"),
        }

        let named = AllowList::parse(&["*://*:*", "http://169.254.169.254"]).unwrap();
        let kept = usable("metadata.example".into(), metadata, 80, &named).unwrap();
        assert_eq!(
            kept,
            addrs(&["169.254.169.254", "64:ff9b::a9fe:a9fe"]),
            "an entry naming the address lets a name reach it, in either form"
        );
    }
}
