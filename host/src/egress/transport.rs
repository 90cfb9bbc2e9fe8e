//! One route's HTTP client: pooled keep-alive connections, rustls with the
//! system's roots plus an optional CA file, and name resolution that never
//! hands out a guarded address.
//!
//! A connection-per-request client opens a TCP connection and a TLS
//! handshake for every request and leaves a socket in TIME_WAIT behind each;
//! under load that caps a host at a few hundred requests a second. This
//! client keeps up to `max_idle_per_host` idle connections per host and
//! reuses them, so a partition calling one service holds one connection.

use super::allow::AllowList;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::{TokioExecutor, TokioTimer};
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
#[derive(Debug, Clone)]
pub struct TransportSettings {
    pub connect_timeout: Duration,
    pub max_idle_per_host: usize,
    pub idle_timeout: Duration,
    pub ca_file: Option<PathBuf>,
}

/// A route's HTTP client, generic over the request body type. Cheap to
/// share: clones of the inner client share one pool.
pub struct Transport<B> {
    client: Client<HttpsConnector<HttpConnector<GuardedResolver>>, B>,
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
    /// The name resolved only to link-local or metadata addresses, which
    /// no entry of the allow-list names.
    Guarded {
        host: String,
        addresses: Vec<IpAddr>,
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
            SendError::Guarded { host, addresses } => write!(
                f,
                "{host} resolves only to guarded addresses ({})",
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
    /// only to addresses `allow` accepts ([`AllowList::allows_address`]).
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
        let mut http = HttpConnector::new_with_resolver(GuardedResolver {
            allow: Arc::new(allow),
        });
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(settings.connect_timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
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

/// Resolves names like the system does, then drops every address the
/// allow-list refuses, so a name pointing at a metadata address reaches
/// nothing. IP literals skip resolution; they are checked before the
/// request is sent.
#[derive(Clone)]
struct GuardedResolver {
    allow: Arc<AllowList>,
}

#[derive(Debug, thiserror::Error)]
enum ResolveError {
    #[error("{host} resolves only to guarded addresses")]
    Guarded {
        host: String,
        addresses: Vec<IpAddr>,
    },
    #[error("cannot resolve {host}: {source}")]
    Lookup {
        host: String,
        source: std::io::Error,
    },
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = ResolveError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ResolveError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ResolveError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let allow = self.allow.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let lookup = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map(|found| found.collect::<Vec<_>>());
            let found = match lookup {
                Ok(found) => found,
                Err(source) => return Err(ResolveError::Lookup { host, source }),
            };
            usable(host, found.into_iter(), &allow).map(Vec::into_iter)
        })
    }
}

/// The addresses of `host` that `allow` lets a handler connect to; an error
/// when every address it resolved to is guarded.
fn usable(
    host: String,
    found: impl Iterator<Item = SocketAddr>,
    allow: &AllowList,
) -> Result<Vec<SocketAddr>, ResolveError> {
    let (usable, guarded): (Vec<SocketAddr>, Vec<SocketAddr>) =
        found.partition(|addr| allow.allows_address(addr.ip()));
    if usable.is_empty() && !guarded.is_empty() {
        return Err(ResolveError::Guarded {
            host,
            addresses: guarded.iter().map(SocketAddr::ip).collect(),
        });
    }
    Ok(usable)
}

/// What went wrong, from the client's error and its chain of causes.
fn classify(error: &hyper_util::client::legacy::Error) -> SendError {
    let mut cause: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(resolve) = e.downcast_ref::<ResolveError>() {
            return match resolve {
                ResolveError::Guarded { host, addresses } => SendError::Guarded {
                    host: host.clone(),
                    addresses: addresses.clone(),
                },
                ResolveError::Lookup { host, source } => SendError::Dns {
                    host: host.clone(),
                    detail: source.to_string(),
                },
            };
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
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

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter()
            .map(|ip| SocketAddr::new(ip.parse().unwrap(), 80))
            .collect()
    }

    #[test]
    fn a_name_never_resolves_to_a_guarded_address() {
        let any = AllowList::parse(&["*://*:*"]).unwrap();
        let mixed = addrs(&["169.254.169.254", "10.1.2.3", "fd00:ec2::254"]);
        let kept = usable("mixed.example".into(), mixed.into_iter(), &any).unwrap();
        assert_eq!(kept, addrs(&["10.1.2.3"]), "only the open address is kept");

        let metadata = addrs(&["169.254.169.254", "fe80::1"]);
        match usable(
            "metadata.example".into(),
            metadata.clone().into_iter(),
            &any,
        ) {
            Err(ResolveError::Guarded { host, addresses }) => {
                assert_eq!(host, "metadata.example");
                assert_eq!(addresses.len(), 2);
            }
            other => panic!("expected a refusal, got {other:?}"),
        }

        let named = AllowList::parse(&["*://*:*", "http://169.254.169.254"]).unwrap();
        let kept = usable("metadata.example".into(), metadata.into_iter(), &named).unwrap();
        assert_eq!(
            kept,
            addrs(&["169.254.169.254"]),
            "an entry naming the address lets a name reach it"
        );
    }
}
