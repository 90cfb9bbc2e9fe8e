//! `/api/parked`: the parked and blocked keys of a route with ordered
//! retries, and an operator's release of one.

use super::State;
use super::api::{ApiError, bad_request};
use crate::parked::{Lane, ParkError, Store};
use axum::Json;
use axum::extract::{Query, State as Shared};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

#[derive(Debug, Deserialize)]
pub(super) struct RouteQuery {
    route: String,
}

/// Which key to release: `key` as text, or `key_base64`.
#[derive(Debug, Deserialize)]
pub(super) struct KeyQuery {
    route: String,
    topic: String,
    partition: i32,
    key: Option<String>,
    key_base64: Option<String>,
}

fn store(state: &State, route: &str) -> Result<Arc<Store>, ApiError> {
    if !state.context.config.routes.iter().any(|r| r.name == route) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("route `{route}` is not in the config"),
        ));
    }
    state.context.parked.get(route).cloned().ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("route `{route}` has no ordered retries (retry_order = \"key\")"),
        )
    })
}

/// Every parked, blocked or releasing key of the route, oldest first.
pub(super) async fn list(
    Shared(state): Shared<Arc<State>>,
    query: Result<Query<RouteQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Query(q) = query.map_err(|e| bad_request(e.body_text()))?;
    let store = store(&state, &q.route)?;
    let summary = store.table.summary();
    Ok(Json(json!({
        "route": q.route,
        "topic": store.table.topic(),
        "policy": store.table.policy(),
        "parked_keys": summary.parked_keys,
        "blocked_keys": summary.blocked_keys,
        "messages": summary.messages,
        "bytes": summary.bytes,
        "keys": store.table.list(),
    })))
}

/// Releases a parked or blocked key: its waiting messages are handled, and
/// new ones are no longer parked or dead-lettered.
pub(super) async fn release(
    Shared(state): Shared<Arc<State>>,
    query: Result<Query<KeyQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Query(q) = query.map_err(|e| bad_request(e.body_text()))?;
    let store = store(&state, &q.route)?;
    let key = lane_key(q.key, q.key_base64).map_err(bad_request)?;
    let lane = Lane {
        topic: q.topic,
        partition: q.partition,
        key,
    };
    match store.release(&lane).await {
        Ok(head) => Ok(Json(json!({
            "released": true,
            "route": q.route,
            "topic": lane.topic,
            "partition": lane.partition,
            "head": head,
        }))),
        Err(e @ ParkError::NotParked { .. }) => Err(ApiError(StatusCode::NOT_FOUND, e.to_string())),
        Err(e @ ParkError::Stopping) => {
            Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
        }
        Err(e) => Err(ApiError(StatusCode::BAD_GATEWAY, format!("{e:#}"))),
    }
}

/// The key a request names: exactly one of `key` (text) and `key_base64`.
pub(super) fn lane_key(text: Option<String>, base64: Option<String>) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    match (text, base64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| format!("key_base64 is not base64: {e}")),
        (Some(_), Some(_)) => Err("give key or key_base64, not both".into()),
        (None, None) => Err("give the key to release: key=TEXT or key_base64=BASE64".into()),
    }
}
