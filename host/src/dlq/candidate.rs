//! Trying a candidate handler on dead letters before it ships (`hopper dlq
//! try`, `POST /api/dlq/try`): each selected record is handed to the new
//! version in the sandbox, as its replay would hand it, and the verdict is
//! routed by the route's own ladder. Nothing is produced: the records a
//! call emits are counted and dropped, and the report says, per record and
//! in total, how many would now succeed, retry or be dead-lettered again,
//! and why.
//!
//! The candidate sees what a replay delivers: the record's id, key, payload
//! and headers, its origin topic, partition and offset, and attempt 1 (a
//! replay starts the attempts again). Its HTTP goes nowhere unless asked
//! ([`HttpMode`]), and it reads no secret unless asked: a candidate is code
//! that has not shipped, and its verdict's reason comes back to whoever
//! tried it, so a secret it read could come back too, encoded past
//! redaction. Only `hopper dlq try --with-secrets` asks; the admin API
//! never does.

use super::record::{RecordRef, envelope_of};
use crate::config::{Route, Secrets};
use crate::egress::AllowList;
use crate::headers;
use crate::plugin::{Delivery, Handler};
use crate::retry::{Decision, decide};
use futures::StreamExt as _;
use rdkafka::message::{Headers, Message, OwnedMessage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a candidate's HTTP requests go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HttpMode {
    /// Nowhere: every request is denied, as for a route that grants no
    /// hosts. The default: a try must not call a service on the records'
    /// behalf unless an operator says so.
    #[default]
    Deny,
    /// To the hosts the route grants, as `hopper run` would send them.
    Live,
}

impl HttpMode {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMode::Deny => "deny",
            HttpMode::Live => "live",
        }
    }
}

/// Why a candidate's request is refused when it is tried with HTTP denied:
/// the try's mode, not the route's grants.
pub const HTTP_DENIED_BY_THE_TRY: &str = "this try denies every request (HTTP mode `deny`, the default; `live` sends them to the hosts the route grants)";

/// `route` as a candidate runs under it: with no hosts granted unless
/// `http` is live, and no secrets unless `with_secrets` (a secret asked
/// for is then "not granted", as for a handler without the grant).
pub fn candidate_route(route: &Route, http: HttpMode, with_secrets: bool) -> Route {
    let mut route = route.clone();
    if http == HttpMode::Deny {
        route.grants.allowed_hosts = AllowList::default();
        route.grants.http_off = Some(HTTP_DENIED_BY_THE_TRY.to_string());
    }
    if !with_secrets {
        route.grants.secrets = Secrets::default();
    }
    route
}

/// Compiles the candidate whose file `path` held `bytes` for `route`,
/// under `http` and `with_secrets` ([`candidate_route`]): its own engine,
/// sized for the route, with the artifact cache in `cache` when given.
/// Returns the handler and the route it runs under.
pub fn load_candidate(
    path: &std::path::Path,
    bytes: &[u8],
    route: &Route,
    http: HttpMode,
    with_secrets: bool,
    cache: Option<std::path::PathBuf>,
) -> anyhow::Result<(Handler, Route)> {
    let route = candidate_route(route, http, with_secrets);
    let mut runtime = crate::plugin::Runtime::for_routes(std::slice::from_ref(&route))?;
    if let Some(dir) = cache {
        runtime = runtime.with_cache(dir)?;
    }
    let handler = runtime.load_bytes(path, bytes, &route)?;
    Ok((handler, route))
}

/// What became of one record, would the candidate handle it.
#[derive(Debug, Clone, Serialize)]
pub struct Tried {
    pub at: RecordRef,
    pub id: Option<String>,
    pub key: Option<String>,
    /// The reason class the record was dead-lettered with.
    pub was: Option<String>,
    /// `ok`, `retry`, `dead` or `skipped`.
    pub outcome: &'static str,
    /// The candidate's verdict: `ok`, `retryable`, `fatal`, `trap`,
    /// `timeout`, `memory`; none when skipped.
    pub verdict: Option<&'static str>,
    /// The reason class the route would record; none for `ok`.
    pub reason_class: Option<&'static str>,
    /// The candidate's reason, or why the record was skipped.
    pub reason: Option<String>,
    /// Records the call emitted: counted, never produced.
    pub emitted: usize,
}

/// One line of the summary: how many records came to the same outcome for
/// the same reason.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Why {
    pub outcome: &'static str,
    pub reason_class: Option<&'static str>,
    pub reason: Option<String>,
    pub count: usize,
}

/// What a candidate would do with the selected records.
#[derive(Debug, Clone, Serialize)]
pub struct TryReport {
    pub route: String,
    pub handler: String,
    /// The candidate's sha256.
    pub version: String,
    pub http: HttpMode,
    /// The candidate could read the route's secrets (`--with-secrets`).
    pub secrets: bool,
    pub total: usize,
    /// The candidate returns `ok`: a replay would be committed.
    pub ok: usize,
    /// It asks for a retry: a replay would go up the retry ladder.
    pub retry: usize,
    /// It fails for good: a replay would be dead-lettered again.
    pub dead: usize,
    /// Not the route's, or not a hopper dead-letter record.
    pub skipped: usize,
    /// Records the candidate emitted in all (none was produced).
    pub emitted: usize,
    /// Outcomes by reason, most frequent first.
    pub why: Vec<Why>,
    pub records: Vec<Tried>,
}

/// Calls `handler` (loaded for `route` by [`load_candidate`]) on each of
/// `messages`, `concurrency` at a time, in their order; `each` sees every
/// record's outcome as it comes.
pub async fn try_candidate(
    handler: &Handler,
    route: &Route,
    http: HttpMode,
    messages: Vec<OwnedMessage>,
    concurrency: usize,
    mut each: impl FnMut(&Tried),
) -> TryReport {
    let mut report = TryReport {
        route: route.name.clone(),
        handler: handler.name().to_string(),
        version: handler.version().to_string(),
        http,
        secrets: !route.grants.secrets.is_empty(),
        total: messages.len(),
        ok: 0,
        retry: 0,
        dead: 0,
        skipped: 0,
        emitted: 0,
        why: Vec::new(),
        records: Vec::with_capacity(messages.len()),
    };
    let mut tried = futures::stream::iter(messages)
        .map(|m| try_one(handler, route, m))
        .buffered(concurrency.max(1));
    let mut why: BTreeMap<(&'static str, Option<&'static str>, Option<String>), usize> =
        BTreeMap::new();
    while let Some(t) = tried.next().await {
        match t.outcome {
            "ok" => report.ok += 1,
            "retry" => report.retry += 1,
            "dead" => report.dead += 1,
            _ => report.skipped += 1,
        }
        report.emitted += t.emitted;
        *why.entry((t.outcome, t.reason_class, t.reason.clone()))
            .or_default() += 1;
        each(&t);
        report.records.push(t);
    }
    report.why = why
        .into_iter()
        .map(|((outcome, reason_class, reason), count)| Why {
            outcome,
            reason_class,
            reason,
            count,
        })
        .collect();
    report.why.sort_by_key(|w| std::cmp::Reverse(w.count));
    report
}

async fn try_one(handler: &Handler, route: &Route, message: OwnedMessage) -> Tried {
    let at = RecordRef {
        topic: message.topic().to_string(),
        partition: message.partition(),
        offset: message.offset(),
    };
    let text = |name| {
        headers::text(message.headers(), name)
            .ok()
            .flatten()
            .map(str::to_string)
    };
    let mut tried = Tried {
        at,
        id: text(headers::ID),
        key: message
            .key()
            .map(|k| String::from_utf8_lossy(k).into_owned()),
        was: text(headers::REASON),
        outcome: "skipped",
        verdict: None,
        reason_class: None,
        reason: None,
        emitted: 0,
    };
    let owner = text(headers::ROUTE);
    if owner.as_deref() != Some(route.name.as_str()) {
        tried.reason = Some(match owner {
            Some(other) => format!(
                "dead-lettered by route `{}`, not `{}`",
                headers::shorten(&other, 64),
                route.name
            ),
            None => format!("header {} is missing", headers::ROUTE),
        });
        return tried;
    }
    let envelope = match envelope_of(&message) {
        Ok(envelope) => envelope,
        Err(e) => {
            tried.reason = Some(format!("not a hopper dead-letter record: {e}"));
            return tried;
        }
    };
    let delivery = Delivery {
        id: envelope.id,
        topic: envelope.origin.topic,
        partition: envelope.origin.partition,
        offset: envelope.origin.offset,
        key: message.key().map(<[u8]>::to_vec),
        payload: message.payload().map(<[u8]>::to_vec),
        headers: message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default(),
        timestamp: envelope.origin.timestamp,
        attempt: 1,
        route: route.name.clone(),
    };
    let handled = handler.run(delivery).await;
    let decision = decide(route, 1, &handled.verdict);
    tried.verdict = Some(handled.verdict.kind().as_str());
    tried.emitted = handled.emitted.len();
    match decision {
        Decision::Commit => tried.outcome = "ok",
        Decision::Retry { reason, error, .. } => {
            tried.outcome = "retry";
            tried.reason_class = Some(reason.as_str());
            tried.reason = Some(error);
        }
        Decision::DeadLetter { reason, error } => {
            tried.outcome = "dead";
            tried.reason_class = Some(reason.as_str());
            tried.reason = Some(error);
        }
    }
    tried
}
