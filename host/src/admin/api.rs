//! The admin API's handlers. Reads of dead-letter topics block on the
//! brokers, so they run on the blocking pool.

use super::State;
use crate::breaker::BreakerState;
use crate::config::{Config, RELAY_ROUTE};
use crate::dlq::{Dlq, DlqError, DlqFilter, DlqPage, DlqRecord, RecordRef};
use crate::health::{HandlerInfo, Pending, PipelineState};
use crate::kafka::Cluster;
use crate::metrics::Format;
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State as Shared};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;

/// Records one list page holds at most.
const MAX_PAGE: usize = 500;

/// An API error: a status and a message that names the problem.
#[derive(Debug)]
pub(super) struct ApiError(pub(super) StatusCode, pub(super) String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.0, Json(json!({ "error": self.1 }))).into_response();
        if self.0 == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

impl From<DlqError> for ApiError {
    fn from(e: DlqError) -> Self {
        let status = match &e {
            DlqError::UnknownRoute(_) | DlqError::TooMany { .. } => StatusCode::BAD_REQUEST,
            DlqError::NotDeadLetterTopic(_) | DlqError::NotFound(_) => StatusCode::NOT_FOUND,
            _ => StatusCode::BAD_GATEWAY,
        };
        ApiError(status, e.to_string())
    }
}

pub(super) fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// How many reads of the dead-letter topics may run at once. Each opens a
/// consumer and may scan up to [`crate::dlq::browse::MAX_SCAN`] records on a
/// blocking thread; a read past this is answered 429 with `Retry-After`.
pub(super) const MAX_DLQ_READS: usize = 2;

/// Runs `read` against the config's dead-letter topics on the blocking pool,
/// when fewer than [`MAX_DLQ_READS`] are in flight.
pub(super) async fn with_dlq<T: Send + 'static>(
    state: &State,
    read: impl FnOnce(&Dlq<'_>) -> Result<T, DlqError> + Send + 'static,
) -> Result<T, ApiError> {
    let permit = state.dlq_reads.clone().try_acquire_owned().map_err(|_| {
        ApiError(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{MAX_DLQ_READS} reads of the dead-letter topics are already in flight; try again when one is done"
            ),
        )
    })?;
    let (config, cluster) = (state.context.config.clone(), state.context.cluster.clone());
    tokio::task::spawn_blocking(move || {
        // Held until the scan ends, even if the caller went away.
        let _permit = permit;
        read(&Dlq {
            cluster: &cluster,
            config: &config,
        })
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(ApiError::from)
}

pub(super) async fn health() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// 200 when every pipeline consumes, else 503; lists every pipeline's state.
pub(super) async fn ready(
    Shared(state): Shared<Arc<State>>,
) -> (StatusCode, Json<serde_json::Value>) {
    let health = state.context.telemetry.health();
    let ready = health.ready();
    let pipelines: Vec<_> = health
        .states()
        .into_iter()
        .map(|(name, state)| json!({ "pipeline": name, "status": state }))
        .collect();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    // Why the connection fails, while it does: an authentication or TLS
    // failure after start (the cause names no secret).
    let kafka = health.connection().failing();
    // What the config turns off of the connection's security: it does not
    // stop readiness, but whoever probes sees it.
    let warnings = state.context.config.kafka.weakened_security();
    (
        status,
        Json(json!({
            "ready": ready,
            "pipelines": pipelines,
            "kafka": kafka,
            "undecodable": health.undecodables(),
            "warnings": warnings,
        })),
    )
}

/// The Prometheus exposition; OpenMetrics when the scraper asks for it.
pub(super) async fn metrics(Shared(state): Shared<Arc<State>>, headers: HeaderMap) -> Response {
    let metrics = state.context.telemetry.metrics();
    if !metrics.enabled() {
        let error = "metrics are off (admin.metrics = false)";
        return (StatusCode::NOT_FOUND, Json(json!({ "error": error }))).into_response();
    }
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .unwrap_or_default();
    let format = if accept.contains("application/openmetrics-text") {
        Format::OpenMetrics
    } else {
        Format::Prometheus
    };
    let body = metrics.encode(format);
    ([(header::CONTENT_TYPE, format.content_type())], body).into_response()
}

/// A held tier partition, as the API shows it.
#[derive(Serialize)]
struct Held {
    topic: String,
    partition: i32,
    due_in_ms: i64,
}

/// A route or the delay relay, with its live state.
#[derive(Serialize)]
pub(super) struct PipelineView {
    name: String,
    /// `route` or `relay`.
    kind: &'static str,
    group: String,
    inputs: Vec<String>,
    tiers: Vec<String>,
    dlq: String,
    status: PipelineState,
    /// The route's circuit breaker, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    breaker: Option<BreakerState>,
    pending: Vec<Pending>,
    held: Vec<Held>,
}

fn pipelines(state: &State) -> Vec<PipelineView> {
    let config: &Config = &state.context.config;
    let health = state.context.telemetry.health();
    let states = health.states();
    let sample = health.pending();
    let held = health.held();
    let now = crate::clock::now_ms();
    let view =
        |name: &str, kind, group: &str, inputs: Vec<String>, tiers: Vec<String>, dlq: &str| {
            PipelineView {
                name: name.to_string(),
                kind,
                group: group.to_string(),
                inputs,
                tiers,
                dlq: dlq.to_string(),
                status: states
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, s)| s.clone())
                    .unwrap_or(PipelineState::Starting),
                breaker: health.breaker(name),
                pending: sample
                    .topics
                    .iter()
                    .filter(|p| p.pipeline == name)
                    .cloned()
                    .collect(),
                held: held
                    .iter()
                    .filter(|(p, _, _)| p == name)
                    .map(|(_, tp, due)| Held {
                        topic: tp.topic.clone(),
                        partition: tp.partition,
                        due_in_ms: due - now,
                    })
                    .collect(),
            }
        };
    let mut out: Vec<PipelineView> = config
        .routes
        .iter()
        .map(|r| {
            let tiers = r.tiers().into_iter().map(|t| t.1).collect();
            view(&r.name, "route", &r.group, r.topics.clone(), tiers, &r.dlq)
        })
        .collect();
    if let Some(relay) = &config.delay {
        let tiers = relay.tiers.iter().map(|t| t.1.clone()).collect();
        let inbox = vec![relay.inbox.clone()];
        out.push(view(
            RELAY_ROUTE,
            "relay",
            &relay.group,
            inbox,
            tiers,
            &relay.dlq,
        ));
    }
    out
}

pub(super) async fn routes(Shared(state): Shared<Arc<State>>) -> Json<Vec<PipelineView>> {
    Json(pipelines(&state))
}

pub(super) async fn handlers(Shared(state): Shared<Arc<State>>) -> Json<Vec<HandlerInfo>> {
    Json(state.context.telemetry.health().handlers())
}

/// Everything the console's overview shows, in one call.
pub(super) async fn status(Shared(state): Shared<Arc<State>>) -> Json<serde_json::Value> {
    let telemetry = &state.context.telemetry;
    let sample = telemetry.health().pending();
    let lateness = telemetry.metrics().lateness().map(|h| {
        let ms = |q| h.quantile(q).map(|s| s * 1000.0);
        json!({ "count": h.count(), "p50_ms": ms(0.5), "p99_ms": ms(0.99), "p999_ms": ms(0.999) })
    });
    Json(json!({
        "ready": telemetry.health().ready(),
        "metrics": telemetry.metrics().enabled(),
        "pipelines": pipelines(&state),
        "handlers": telemetry.health().handlers(),
        "pending_sampled_at_ms": (sample.at_ms > 0).then_some(sample.at_ms),
        "pending_error": sample.error,
        "delay_lateness": lateness,
        "parked": parked(&state),
        // Whether `POST /api/dlq/try` runs an uploaded candidate: the
        // console says so beside "Try a fix" rather than offer it in vain.
        "code_upload": state.admin.allow_code_upload,
    }))
}

/// The parked keys of each route with ordered retries, oldest first, at
/// most [`PARKED_SHOWN`] per route.
fn parked(state: &State) -> Vec<serde_json::Value> {
    let mut routes: Vec<_> = state.context.parked.iter().collect();
    routes.sort_by_key(|(route, _)| route.as_str());
    routes
        .into_iter()
        .map(|(route, store)| {
            let summary = store.table.summary();
            let keys: Vec<_> = store.table.list().into_iter().take(PARKED_SHOWN).collect();
            json!({
                "route": route,
                "parked_keys": summary.parked_keys,
                "blocked_keys": summary.blocked_keys,
                "messages": summary.messages,
                "keys": keys,
            })
        })
        .collect()
}

/// The parked keys `/api/status` shows per route; `/api/parked` has all.
pub(super) const PARKED_SHOWN: usize = 100;

/// `GET /api/dlq` query: the filter, and the page.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    route: Option<String>,
    reason: Option<String>,
    /// Epoch ms or RFC 3339.
    since: Option<String>,
    until: Option<String>,
    key: Option<String>,
    text: Option<String>,
    /// A group of one cause, as `hopper dlq groups` lists it.
    group: Option<String>,
    /// Only records never replayed.
    not_replayed: Option<bool>,
    skip: Option<usize>,
    limit: Option<usize>,
}

pub(super) fn instant(name: &str, value: Option<String>) -> Result<Option<i64>, ApiError> {
    match value.filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(v) => crate::delay::parse_instant(v.trim())
            .map(Some)
            .map_err(|e| bad_request(format!("{name}: {e}"))),
    }
}

pub(super) async fn dlq_list(
    Shared(state): Shared<Arc<State>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<DlqPage>, ApiError> {
    let Query(q) = query.map_err(|e| bad_request(e.body_text()))?;
    let empty = |v: Option<String>| v.filter(|v| !v.is_empty());
    let filter = DlqFilter {
        since: instant("since", q.since)?,
        until: instant("until", q.until)?,
        route: empty(q.route),
        reason: empty(q.reason),
        key: empty(q.key),
        text: empty(q.text),
        group: empty(q.group),
        not_replayed: q.not_replayed.unwrap_or(false),
    };
    filter.check().map_err(bad_request)?;
    let (skip, limit) = (q.skip.unwrap_or(0), q.limit.unwrap_or(50).min(MAX_PAGE));
    with_dlq(&state, move |dlq| dlq.list(&filter, skip, limit))
        .await
        .map(Json)
}

/// `GET /api/dlq/groups` query.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GroupsQuery {
    route: Option<String>,
    /// Groups to return, the most recently failed first (default 100, at
    /// most [`MAX_GROUPS_SHOWN`]).
    limit: Option<usize>,
}

/// Groups one answer holds at most.
const MAX_GROUPS_SHOWN: usize = 1_000;

/// The dead-letter groups as the admin server keeps them (dlq/live.rs):
/// read from memory, never by scanning a topic.
pub(super) async fn dlq_groups(
    Shared(state): Shared<Arc<State>>,
    query: Result<Query<GroupsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<crate::dlq::live::LivePage>, ApiError> {
    let Query(q) = query.map_err(|e| bad_request(e.body_text()))?;
    let route = q.route.filter(|r| !r.is_empty());
    if let Some(route) = &route {
        Dlq {
            cluster: &state.context.cluster,
            config: &state.context.config,
        }
        .topics(Some(route))?;
    }
    let limit = q.limit.unwrap_or(100).min(MAX_GROUPS_SHOWN);
    Ok(Json(state.live.page(route.as_deref(), limit)))
}

pub(super) async fn dlq_show(
    Shared(state): Shared<Arc<State>>,
    Path((topic, partition, offset)): Path<(String, i32, i64)>,
) -> Result<Json<DlqRecord>, ApiError> {
    let at = RecordRef {
        topic,
        partition,
        offset,
    };
    with_dlq(&state, move |dlq| dlq.show(&at)).await.map(Json)
}

/// `POST /api/replay`: `records` (as `topic:partition:offset`) or a
/// `filter`, `dry_run`, and with a filter, `resume` (a run's id).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplayBody {
    records: Option<Vec<String>>,
    filter: Option<DlqFilter>,
    #[serde(default)]
    dry_run: bool,
    resume: Option<String>,
}

/// A filter's selection, of any size, is a run in the background: 202
/// with its id and status path ([`super::runs`]). Records named one by one
/// (at most `replay.max_records`) are replayed before the answer, which is
/// their report.
pub(super) async fn replay(
    Shared(state): Shared<Arc<State>>,
    body: Result<Json<ReplayBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body.map_err(|e| bad_request(e.body_text()))?;
    let max = state.context.config.replay.max_records;
    let selected: Vec<rdkafka::message::OwnedMessage> = match (body.records, body.filter) {
        (Some(_), None) if body.resume.is_some() => {
            return Err(bad_request(
                "resume goes with the filter of the run it resumes, not with records",
            ));
        }
        (Some(records), None) => {
            if records.is_empty() {
                return Err(bad_request("records is empty: select at least one"));
            }
            if records.len() > max {
                return Err(bad_request(format!(
                    "{} records selected; replay.max_records allows {max}; a filter selects any number, as a run",
                    records.len()
                )));
            }
            let refs = records
                .iter()
                .map(|r| r.parse::<RecordRef>().map_err(bad_request))
                .collect::<Result<Vec<_>, _>>()?;
            with_dlq(&state, move |dlq| {
                refs.iter().map(|r| dlq.fetch(r)).collect()
            })
            .await?
        }
        (None, Some(filter)) => {
            let run = super::runs::start(&state, filter, body.dry_run, body.resume).await?;
            let answer =
                json!({ "run": run.as_str(), "status": format!("/api/replay/runs/{run}") });
            return Ok((StatusCode::ACCEPTED, Json(answer)).into_response());
        }
        _ => return Err(bad_request("give either records or filter")),
    };
    let (config, cluster): (Arc<Config>, Cluster) =
        (state.context.config.clone(), state.context.cluster.clone());
    let dry_run = body.dry_run;
    let run = crate::dlq::run::RunId::new();
    if !dry_run {
        // Said before the first record: a server stopped part way leaves
        // the run in the journal, and this line says how to finish it.
        tracing::info!(
            %run,
            records = selected.len(),
            "Replay through the admin API started; if it stops part way, `hopper dlq replay` with the same selection and `--resume {run}` replays the rest, none twice."
        );
    }
    let shared = state.clone();
    // Planning reads the replay journal, which blocks; producing is async.
    let report = tokio::task::spawn_blocking(move || {
        let dlq = Dlq {
            cluster: &cluster,
            config: &config,
        };
        let metrics = shared.context.telemetry.metrics().clone();
        tokio::runtime::Handle::current().block_on(dlq.replay(
            run,
            selected,
            config.replay.max_replays,
            dry_run,
            &shared.pacer,
            shared.context.telemetry.tracer(),
            |outcome| {
                if let (Some(route), None, false) = (&outcome.route, &outcome.failed, dry_run) {
                    let result = match outcome.action {
                        crate::dlq::replay::ReplayAction::Replay { .. } => "replayed",
                        crate::dlq::replay::ReplayAction::Loop { .. } => "loop",
                        crate::dlq::replay::ReplayAction::Skip { .. } => return,
                    };
                    metrics.inc(&crate::metrics::series::Replays { route, result });
                }
            },
        ))
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    tracing::info!(
        dry_run,
        replayed = report.replayed,
        looped = report.looped,
        skipped = report.skipped,
        failed = report.failed,
        "Replay through the admin API."
    );
    Ok(Json(report).into_response())
}

/// The body of `POST /api/delay/cancel`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelBody {
    id: String,
}

/// Cancels every pending delayed message of an id: a cancel record (key =
/// the id) to the relay's inbox, as `hopper delay cancel` sends.
pub(super) async fn delay_cancel(
    Shared(state): Shared<Arc<State>>,
    body: Result<Json<CancelBody>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(body) = body.map_err(|e| bad_request(e.body_text()))?;
    let relay = state.context.config.delay.as_ref().ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            "no delay relay: the config has no [delay] table".into(),
        )
    })?;
    let producer = state
        .context
        .cluster
        .producer()
        .map_err(|e| ApiError(StatusCode::BAD_GATEWAY, format!("{e:#}")))?;
    let (partition, offset) = crate::delay::cancel(&producer, &relay.inbox, &body.id)
        .await
        .map_err(|e| {
            let status = if body.id.is_empty() || body.id.len() > crate::headers::MAX_ID_BYTES {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::BAD_GATEWAY
            };
            ApiError(status, format!("cancelling `{}`: {e:#}", body.id))
        })?;
    Ok(Json(json!({
        "id": body.id,
        "inbox": relay.inbox,
        "partition": partition,
        "offset": offset,
    })))
}

/// The pending cancellations of an id, one per inbox partition that read a
/// cancel of it, as this process's cancellation table has them (`dropped`
/// counts what this process dropped because of each).
pub(super) async fn delay_show(
    Shared(state): Shared<Arc<State>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let table = state.context.cancels.as_ref().ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            "no delay relay: the config has no [delay] table".into(),
        )
    })?;
    Ok(Json(json!({
        "id": id,
        "cancellations": table.get(id.as_bytes()),
        "entries": table.len(),
    })))
}
