//! Who may call the admin server: the bearer token, and the `Host` a
//! request names.
//!
//! Every `/api` call needs a token. The server makes a session token when
//! it starts ([`Token::new`]): 32 random bytes that exist only in this
//! process's memory, a file only its user can read (for `hopper run`) and,
//! without a configured token, the console URL it logs. A handler can obtain
//! none of these (no file system, no environment, not this process's log),
//! so no handler of this or another hopper on the same host reads a dead
//! letter, whatever ports it is granted. A session token reads; it never
//! changes state (replay, cancel, a candidate's upload), which needs the
//! configured token. So a client that only reads (`hopper status`) sends
//! the session token and never the configured one.
//!
//! Tokens are compared as sha256 digests with a constant-time equality, so
//! neither the position of the first wrong byte nor the token's length shows
//! in the response time.

use super::State;
use crate::config::TOKEN_ENV;
use axum::extract::{Request, State as Shared};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The tokens calls must present, as digests.
pub(super) struct Token {
    /// This session's read token ([`Token::new`]): it reads, never
    /// changes state.
    session: [u8; 32],
    /// The configured token (`admin.token`, `HOPPER_ADMIN_TOKEN`), when
    /// there is one: it reads, and it is the only one that changes state.
    configured: Option<[u8; 32]>,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    NoneConfigured,
    Missing,
    Wrong,
}

impl Token {
    /// A token for this session, and its text: 32 bytes from the operating
    /// system's random source, as 64 hex digits; with the configured token,
    /// when there is one. Both read; only the configured one writes.
    pub(super) fn new(configured: Option<&str>) -> std::io::Result<(Token, String)> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
        let text = hex::encode(bytes);
        let token = Token {
            session: Sha256::digest(text.as_bytes()).into(),
            configured: configured.map(|c| Sha256::digest(c.as_bytes()).into()),
        };
        Ok((token, text))
    }

    /// Checks the `Authorization` header of a call that changes state:
    /// only a configured token may.
    pub(super) fn check_write(&self, authorization: Option<&HeaderValue>) -> Result<(), Refusal> {
        let Some(configured) = &self.configured else {
            return Err(Refusal::NoneConfigured);
        };
        let presented = presented(authorization)?;
        if bool::from(presented.ct_eq(configured)) {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }

    /// Checks the `Authorization` header of a read: the session's token or
    /// the configured one. Both are compared, whichever matches.
    pub(super) fn check(&self, authorization: Option<&HeaderValue>) -> Result<(), Refusal> {
        let presented = presented(authorization)?;
        let session = presented.ct_eq(&self.session);
        let configured = match &self.configured {
            Some(configured) => presented.ct_eq(configured),
            None => subtle::Choice::from(0),
        };
        if bool::from(session | configured) {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }
}

/// The digest of the bearer token `authorization` presents.
fn presented(authorization: Option<&HeaderValue>) -> Result<[u8; 32], Refusal> {
    let presented = authorization
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or(Refusal::Missing)?;
    Ok(Sha256::digest(presented.as_bytes()).into())
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let error = match self {
            Refusal::NoneConfigured => format!(
                "this call changes state and needs a bearer token, but none is configured: set admin.token or {TOKEN_ENV}"
            ),
            Refusal::Missing => "this call needs `Authorization: Bearer <admin token>`: admin.token, or without one the session token in the console URL that hopper logs at start".into(),
            Refusal::Wrong => "the bearer token is wrong".into(),
        };
        let mut response = (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({ "error": error })),
        )
            .into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"hopper\""),
        );
        response
    }
}

/// Refuses a call that changes state without the configured token.
pub(super) async fn require_token(
    Shared(state): Shared<Arc<State>>,
    request: Request,
    next: Next,
) -> Response {
    let checked = state
        .token
        .check_write(request.headers().get(header::AUTHORIZATION));
    pass_or_refuse(checked, request, next).await
}

/// Refuses a read without the configured or the session token.
pub(super) async fn require_token_for_reads(
    Shared(state): Shared<Arc<State>>,
    request: Request,
    next: Next,
) -> Response {
    let checked = state
        .token
        .check(request.headers().get(header::AUTHORIZATION));
    pass_or_refuse(checked, request, next).await
}

async fn pass_or_refuse(checked: Result<(), Refusal>, request: Request, next: Next) -> Response {
    match checked {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            tracing::warn!(
                path = crate::headers::shorten(request.uri().path(), 100),
                refusal = ?refusal,
                "Admin call refused."
            );
            refusal.into_response()
        }
    }
}

/// Refuses a request whose `Host` (or HTTP/2 authority) is not one this
/// server answers to ([`host_allowed`]): a page whose name was rebound to
/// 127.0.0.1 sends its own name, and reads nothing.
pub(super) async fn require_known_host(
    Shared(state): Shared<Arc<State>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            request
                .headers()
                .get(header::HOST)
                .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        });
    match host {
        Some(host) if host_allowed(&host, &state.admin) => next.run(request).await,
        host => {
            let shown = host
                .as_deref()
                .map(|h| crate::headers::shorten(h, 100))
                .unwrap_or_else(|| "(none)".into());
            tracing::warn!(
                path = crate::headers::shorten(request.uri().path(), 100),
                host = shown,
                "Admin call refused: unknown Host."
            );
            let error = format!(
                "Host `{shown}` is not this server's address, a loopback name or one of admin.hosts"
            );
            (
                StatusCode::FORBIDDEN,
                axum::Json(serde_json::json!({ "error": error })),
            )
                .into_response()
        }
    }
}

/// Whether `host` (a `Host` header value, port optional) names this server:
/// - an IP literal that is the listen address, a loopback address, or any
///   address when the server listens on every address (an IP literal is
///   never a rebound name);
/// - `localhost` or a name under `.localhost`, which browsers resolve to
///   loopback themselves;
/// - a name listed in `admin.hosts`.
///
/// The port is not compared: a port-forward (`kubectl port-forward 8080:9464`)
/// changes it.
pub(super) fn host_allowed(host: &str, admin: &crate::config::Admin) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((ip, rest)) if rest.is_empty() || rest.starts_with(':') => ip,
            _ => return false,
        },
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    if let Ok(ip) = name.parse::<std::net::IpAddr>() {
        let listen = admin.listen.ip();
        return ip == listen || ip.is_loopback() || listen.is_unspecified();
    }
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost") || admin.hosts.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin(listen: &str, hosts: &[&str]) -> crate::config::Admin {
        crate::config::Admin {
            listen: listen.parse().unwrap(),
            token: None,
            metrics: true,
            allow_code_upload: false,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            own: Default::default(),
        }
    }

    #[test]
    fn only_this_servers_own_names_pass_the_host_check() {
        let local = admin("127.0.0.1:9464", &["hopper.internal"]);
        for ok in [
            "127.0.0.1:9464",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]:9464",
            "localhost:9464",
            "LOCALHOST",
            "localhost.:9464",
            "console.localhost:9464",
            "hopper.internal",
            "Hopper.Internal:443",
        ] {
            assert!(host_allowed(ok, &local), "{ok}");
        }
        // Regression: any Host passed, so a page that rebound its own name
        // to 127.0.0.1 could read /api/dlq.
        for refused in [
            "evil.example:9464",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:9464",
            "10.0.0.1:9464",
            "[::1",
            "[::1]x",
            "",
            "hopper.internal.evil.example",
        ] {
            assert!(!host_allowed(refused, &local), "{refused}");
        }
        let everywhere = admin("0.0.0.0:9464", &[]);
        assert!(host_allowed("10.0.0.1:9464", &everywhere));
        assert!(!host_allowed("evil.example:9464", &everywhere));
        let one = admin("10.0.0.7:9464", &[]);
        assert!(host_allowed("10.0.0.7:9464", &one));
        assert!(!host_allowed("10.0.0.8:9464", &one));
    }

    #[test]
    fn only_the_configured_token_writes() {
        let (token, session) = Token::new(Some("s3cret")).unwrap();
        let header = |v: &str| HeaderValue::from_str(v).unwrap();
        assert_eq!(token.check(Some(&header("Bearer s3cret"))), Ok(()));
        assert_eq!(token.check(None), Err(Refusal::Missing));
        assert_eq!(token.check(Some(&header("s3cret"))), Err(Refusal::Missing));
        assert_eq!(
            token.check(Some(&header("Bearer s3cre"))),
            Err(Refusal::Wrong)
        );
        assert_eq!(
            token.check(Some(&header("Bearer s3crets"))),
            Err(Refusal::Wrong)
        );
        assert_eq!(token.check_write(Some(&header("Bearer s3cret"))), Ok(()));
        // The session's token reads beside a configured one, and never
        // writes.
        let read = header(&format!("Bearer {session}"));
        assert_eq!(token.check(Some(&read)), Ok(()));
        assert_eq!(token.check_write(Some(&read)), Err(Refusal::Wrong));
    }

    #[test]
    fn a_session_token_is_random_and_reads_but_never_writes() {
        let (token, text) = Token::new(None).unwrap();
        let (_, other) = Token::new(None).unwrap();
        assert_eq!(text.len(), 64);
        assert_ne!(text, other, "each session has its own token");
        let header = |v: &str| HeaderValue::from_str(v).unwrap();
        let right = header(&format!("Bearer {text}"));
        assert_eq!(token.check(Some(&right)), Ok(()));
        assert_eq!(token.check(None), Err(Refusal::Missing));
        assert_eq!(
            token.check(Some(&header(&format!("Bearer {other}")))),
            Err(Refusal::Wrong)
        );
        assert_eq!(
            token.check_write(Some(&right)),
            Err(Refusal::NoneConfigured)
        );
    }
}
