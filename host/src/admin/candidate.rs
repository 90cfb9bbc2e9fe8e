//! `POST /api/dlq/try`: a candidate handler, uploaded as the request body
//! (the `.wasm` bytes), called on a route's dead letters in the sandbox
//! (`crate::dlq::candidate`). Reads only: nothing is written to any topic.
//! It runs code an operator uploads, so it needs the configured admin
//! token, as replay does, and `admin.allow_code_upload = true`: running
//! uploaded code is a permission of its own, off by default. The candidate
//! reads no secret of the route (only the CLI's `--with-secrets` grants
//! them), so its reason, which comes back in the answer, holds none. One
//! try runs at a time.

use super::State;
use super::api::{ApiError, bad_request, instant, with_dlq};
use crate::dlq::{DlqFilter, HttpMode, TryReport, try_candidate};
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Query, State as Shared};
use axum::http::StatusCode;
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

/// The largest candidate accepted: a Python or JavaScript component is
/// 12-21 MB.
pub(super) const MAX_CANDIDATE_BYTES: usize = 64 << 20;

/// Tries running at once; each compiles a component and calls it on up to
/// `max` records.
static TRIES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Calls at once within one try.
const CONCURRENCY: usize = 16;

/// The query of `POST /api/dlq/try`: the route (required), where HTTP goes,
/// the filters of `GET /api/dlq`, and the most records to try.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TryQuery {
    route: String,
    http: Option<HttpMode>,
    reason: Option<String>,
    since: Option<String>,
    until: Option<String>,
    key: Option<String>,
    text: Option<String>,
    /// A group of one cause, as `hopper dlq groups` lists it.
    group: Option<String>,
    /// Only records never replayed.
    not_replayed: Option<bool>,
    max: Option<usize>,
}

pub(super) async fn dlq_try(
    Shared(state): Shared<Arc<State>>,
    query: Result<Query<TryQuery>, axum::extract::rejection::QueryRejection>,
    body: Bytes,
) -> Result<Json<TryReport>, ApiError> {
    if !state.admin.allow_code_upload {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "uploading a candidate handler to run is off: set admin.allow_code_upload = true to allow it, or run `hopper dlq try` where the config is".into(),
        ));
    }
    let Query(q) = query.map_err(|e| bad_request(e.body_text()))?;
    let route = state
        .context
        .config
        .routes
        .iter()
        .find(|r| r.name == q.route)
        .cloned()
        .ok_or_else(|| bad_request(format!("route `{}` is not in the config", q.route)))?;
    if body.is_empty() {
        return Err(bad_request(
            "the body is empty: send the candidate's .wasm as the request body",
        ));
    }
    let empty = |v: Option<String>| v.filter(|v| !v.is_empty());
    let filter = DlqFilter {
        route: Some(route.name.clone()),
        reason: empty(q.reason),
        since: instant("since", q.since)?,
        until: instant("until", q.until)?,
        key: empty(q.key),
        text: empty(q.text),
        group: empty(q.group),
        not_replayed: q.not_replayed.unwrap_or(false),
    };
    filter.check().map_err(bad_request)?;
    let _running = TRIES.try_acquire().map_err(|_| {
        ApiError(
            StatusCode::TOO_MANY_REQUESTS,
            "a try is running already; try again when it is done".into(),
        )
    })?;
    let http = q.http.unwrap_or_default();
    let candidate_route = route.clone();
    // Compiling is CPU work of seconds for a large component.
    let (handler, tried_route) = tokio::task::spawn_blocking(move || {
        crate::dlq::candidate::load_candidate(
            Path::new("candidate.wasm"),
            &body,
            &candidate_route,
            http,
            false,
            None,
        )
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e| bad_request(format!("{e:#}")))?;
    let max = q.max.unwrap_or(state.context.config.replay.max_records);
    let selected = with_dlq(&state, move |dlq| dlq.select(&filter, max)).await?;
    let report = try_candidate(&handler, &tried_route, http, selected, CONCURRENCY, |_| {}).await;
    tracing::info!(
        route = report.route,
        version = crate::events::short(&report.version),
        http = http.as_str(),
        tried = report.total,
        ok = report.ok,
        retry = report.retry,
        dead = report.dead,
        skipped = report.skipped,
        "Candidate handler tried on dead letters through the admin API."
    );
    Ok(Json(report))
}
