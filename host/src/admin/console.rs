//! The web console: three static files built into the binary, served by the
//! admin server. The page renders every value with `textContent`, never as
//! HTML, and its Content-Security-Policy allows no inline script, so a
//! payload can never run as code.

use super::State;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use std::sync::Arc;

const INDEX: &str = include_str!("console/index.html");
const APP: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/style.css");

/// No inline script or style, nothing from elsewhere, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

fn file(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
}

pub(super) fn routes() -> Router<Arc<State>> {
    Router::new()
        .route(
            "/",
            get(|| async { file("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/console/app.js",
            get(|| async { file("text/javascript; charset=utf-8", APP) }),
        )
        .route(
            "/console/style.css",
            get(|| async { file("text/css; charset=utf-8", STYLE) }),
        )
}
