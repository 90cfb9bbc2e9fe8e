//! The bearer token: who may change state through the admin server.
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

/// The configured token, as its digest; `None` when none is configured.
pub(super) struct Token(Option<[u8; 32]>);

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    NoneConfigured,
    Missing,
    Wrong,
}

impl Token {
    pub(super) fn new(token: Option<&str>) -> Token {
        Token(token.map(|t| Sha256::digest(t.as_bytes()).into()))
    }

    /// Checks the `Authorization` header of a request.
    pub(super) fn check(&self, authorization: Option<&HeaderValue>) -> Result<(), Refusal> {
        let Some(expected) = &self.0 else {
            return Err(Refusal::NoneConfigured);
        };
        let presented = authorization
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or(Refusal::Missing)?;
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        if bool::from(presented.ct_eq(expected)) {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let error = match self {
            Refusal::NoneConfigured => format!(
                "this call changes state and needs a bearer token, but none is configured: set admin.token or {TOKEN_ENV}"
            ),
            Refusal::Missing => "this call needs `Authorization: Bearer <admin token>`".into(),
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

/// Refuses a request without the right token.
pub(super) async fn require_token(
    Shared(state): Shared<Arc<State>>,
    request: Request,
    next: Next,
) -> Response {
    match state
        .token
        .check(request.headers().get(header::AUTHORIZATION))
    {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            tracing::warn!(path = request.uri().path(), refusal = ?refusal, "Admin call refused.");
            refusal.into_response()
        }
    }
}

/// When the server is reachable from other hosts, refuses API reads without
/// the token too.
pub(super) async fn require_token_for_reads(
    shared: Shared<Arc<State>>,
    request: Request,
    next: Next,
) -> Response {
    if shared.admin.remote() {
        require_token(shared, request, next).await
    } else {
        next.run(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_configured_token_passes() {
        let token = Token::new(Some("s3cret"));
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
        let none = Token::new(None);
        assert_eq!(
            none.check(Some(&header("Bearer s3cret"))),
            Err(Refusal::NoneConfigured)
        );
    }
}
