//! `hopper plugin test`: a handler run on cases (a message, canned answers
//! to its HTTP, secrets, and what it should do), with no broker.
//!
//! A case runs in the same sandbox as `hopper run`: the engine, limits and
//! grants of a route, resolved by the config code from the cases file's
//! `[route]` table or taken from a hopper config. Only two things differ:
//! the handler's requests that the grants allow are answered from the
//! case's canned answers ([`crate::plugin::canned`]) instead of the network,
//! and the records it emits are compared, never produced. The verdict is
//! routed by the route's own ladder ([`crate::retry::decide`]), so a case
//! can expect the reason class the route would record.

pub mod cases;
pub mod junit;

pub use cases::{Case, CasesError, Suite, load};

use crate::config::Route;
use crate::plugin::canned::{CannedHttp, Seen, SeenRequest};
use crate::plugin::{Answer, Compiler, Emitted, Handler, LoadError, Runtime, Verdict};
use crate::retry::{Decision, decide};
use crate::types::EmitKind;
use cases::EmitSpec;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A handler loaded for a suite's route, with canned HTTP.
pub struct Trial {
    runtime: Runtime,
    canned: Arc<CannedHttp>,
    handler: Handler,
    route: Route,
    /// How long reading and compiling the handler took.
    pub startup: Duration,
}

/// What one case came to.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub name: String,
    /// Empty when the case passed; else one block per field that differs,
    /// expected (`-`) against actual (`+`).
    pub diff: Vec<String>,
    /// The verdict in a few words: `ok`, `fatal: told to fail`.
    pub summary: String,
    pub took: Duration,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        self.diff.is_empty()
    }
}

/// What a handler did with one message, for a case to be checked against.
#[derive(Debug, Clone)]
pub struct Actual {
    pub handled: Answer,
    pub decision: Decision,
    pub requests: Vec<SeenRequest>,
}

impl Trial {
    /// Compiles `handler` with `compiler` (through the artifact cache in
    /// `cache`, when given) for `route`.
    pub fn new(
        handler: &Path,
        route: Route,
        cache: Option<PathBuf>,
        compiler: Compiler,
    ) -> anyhow::Result<Trial> {
        let started = Instant::now();
        let canned = Arc::new(CannedHttp::default());
        let mut runtime = Runtime::for_routes_with(std::slice::from_ref(&route), compiler)?
            .with_canned_http(canned.clone());
        if let Some(dir) = cache {
            runtime = runtime.with_cache(dir)?;
        }
        let loaded = runtime.load(handler, &route)?;
        Ok(Trial {
            runtime,
            canned,
            handler: loaded,
            route,
            startup: started.elapsed(),
        })
    }

    pub fn handler(&self) -> &Handler {
        &self.handler
    }

    /// What compiled the handler.
    pub fn compiler(&self) -> Compiler {
        self.runtime.compiler()
    }

    /// Runs one case and checks it.
    pub async fn run(&self, case: &Case) -> Result<CaseResult, LoadError> {
        let started = Instant::now();
        let (actual, route) = self.call(case).await?;
        let took = started.elapsed();
        Ok(CaseResult {
            name: case.name.clone(),
            diff: check(case, &actual, &route),
            summary: summary(&actual.handled.verdict),
            took,
        })
    }

    /// Calls the handler with the case's message, answers and secrets.
    pub async fn call(&self, case: &Case) -> Result<(Actual, Route), LoadError> {
        let route = self.route_for(case);
        let handler = if route.grants == self.route.grants && route.config == self.route.config {
            self.handler.clone()
        } else {
            self.runtime.rebind(&self.handler, &route)?
        };
        self.canned.arm(case.answers.clone());
        let handled = handler.run(case.delivery.clone()).await;
        let requests = self.canned.take_seen();
        let decision = decide(&route, case.delivery.attempt, &handled.verdict);
        Ok((
            Actual {
                handled,
                decision,
                requests,
            },
            route,
        ))
    }

    /// The suite's route with the case's secrets and config values.
    fn route_for(&self, case: &Case) -> Route {
        let mut route = self.route.clone();
        for (name, value) in &case.secrets {
            route.grants.secrets.insert(name, value.clone());
        }
        route.config.extend(case.config.clone());
        route
    }
}

/// The verdict in a few words, for the one line a case prints.
pub fn summary(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Ok => "ok".into(),
        Verdict::Retryable { reason, .. } => format!("retryable: {}", one_line(reason, 120)),
        Verdict::Fatal { reason } => format!("fatal: {}", one_line(reason, 120)),
        Verdict::Failed { class, error } => {
            format!("{}: {}", class.as_str(), one_line(error, 120))
        }
    }
}

fn one_line(text: &str, max: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    crate::headers::shorten(&line, max)
}

/// The reason class the route records for `decision` (on the retry record
/// or the dead letter: RETRYABLE, or HANDLER_TIMEOUT for a timeout it
/// retries), `none` for a commit.
pub fn class_of(decision: &Decision) -> &'static str {
    match decision {
        Decision::Commit => "none",
        Decision::Retry { reason, .. } | Decision::DeadLetter { reason, .. } => reason.as_str(),
    }
}

/// What the route does next, in a few words.
pub fn next_hop(decision: &Decision, route: &Route) -> String {
    match decision {
        Decision::Commit => "commit".into(),
        Decision::Retry { topic, .. } => format!("retry via {topic}"),
        Decision::DeadLetter { reason, .. } => format!("dead-letter to {} ({reason})", route.dlq),
    }
}

/// Every difference between what `case` expects and what happened, one
/// block each: the field, then `- expected` and `+ actual` lines.
pub fn check(case: &Case, actual: &Actual, route: &Route) -> Vec<String> {
    let expect = &case.expect;
    let mut diff = Vec::new();
    let verdict = &actual.handled.verdict;
    let kind = verdict.kind().as_str();
    if expect.verdict != kind {
        diff.push(block(
            "verdict",
            std::slice::from_ref(&expect.verdict),
            &[format!("{kind} ({})", summary(verdict))],
        ));
    }
    let class = class_of(&actual.decision);
    if let Some(want) = &expect.reason_class
        && want != class
    {
        diff.push(block(
            "reason class",
            std::slice::from_ref(want),
            &[format!("{class} ({})", next_hop(&actual.decision, route))],
        ));
    }
    if let Some(want) = &expect.reason {
        let got = match verdict {
            Verdict::Ok => None,
            Verdict::Retryable { reason, .. } | Verdict::Fatal { reason } => Some(reason),
            Verdict::Failed { error, .. } => Some(error),
        };
        if !got.is_some_and(|g| g.contains(want.as_str())) {
            diff.push(block(
                "reason contains",
                &[format!("{want:?}")],
                &[got.map_or("(no reason: the verdict is ok)".into(), |g| {
                    format!("{g:?}")
                })],
            ));
        }
    }
    let records = |kind: fn(EmitKind) -> bool| -> Vec<&Emitted> {
        actual
            .handled
            .emitted
            .iter()
            .filter(|e| kind(e.kind))
            .collect()
    };
    let discarded = if actual.handled.discarded > 0 {
        format!(
            " ({} dropped: the verdict is not ok)",
            actual.handled.discarded
        )
    } else {
        String::new()
    };
    if let Some(want) = &expect.emit {
        let got = records(|k| k == EmitKind::Publish);
        let same =
            want.len() == got.len() && want.iter().zip(&got).all(|(w, g)| emit_matches(w, g));
        if !same {
            let mut got_lines: Vec<String> = got.iter().map(|g| show_emitted(g)).collect();
            if got_lines.is_empty() {
                got_lines.push(format!("(none){discarded}"));
            }
            let mut want_lines: Vec<String> = want.iter().map(show_expected).collect();
            if want_lines.is_empty() {
                want_lines.push("(none)".into());
            }
            diff.push(block("emitted records", &want_lines, &got_lines));
        }
    }
    let ids = |kind: fn(EmitKind) -> bool| -> Vec<String> {
        records(kind).iter().map(|e| e.id.clone()).collect()
    };
    let lists = [
        (
            "scheduled ids",
            &expect.scheduled,
            ids(|k| matches!(k, EmitKind::Schedule { .. })),
        ),
        (
            "cancelled ids",
            &expect.cancelled,
            ids(|k| k == EmitKind::Cancel),
        ),
    ];
    for (field, want, got) in lists {
        if let Some(want) = want
            && *want != got
        {
            let mut got = got;
            if got.is_empty() {
                got.push(format!("(none){discarded}"));
            }
            diff.push(block(field, &or_none(want), &got));
        }
    }
    if let Some(want) = &expect.requests {
        let got: Vec<String> = actual
            .requests
            .iter()
            .map(|r| format!("{} {}", r.method, r.url))
            .collect();
        let want_norm: Vec<String> = want
            .iter()
            .map(|w| {
                let (method, url) = w.split_once(' ').unwrap_or((w, ""));
                format!("{} {}", method.to_ascii_uppercase(), url.trim())
            })
            .collect();
        if want_norm != got {
            let got: Vec<String> = actual.requests.iter().map(show_request).collect();
            diff.push(block("requests", &or_none(&want_norm), &or_none(&got)));
        }
    }
    // A request no answer matched is a mistake in the case, whatever it
    // expects: the handler saw a refused connection no service would give.
    for r in &actual.requests {
        if r.result == Seen::Unanswered {
            diff.push(format!(
                "request {} {} had no canned answer (the handler saw a refused connection): add a [[case.http]] for it",
                r.method, r.url
            ));
        }
    }
    diff
}

fn or_none(lines: &[String]) -> Vec<String> {
    if lines.is_empty() {
        vec!["(none)".into()]
    } else {
        lines.to_vec()
    }
}

fn block(field: &str, want: &[String], got: &[String]) -> String {
    let mut text = format!("{field}:");
    for line in want {
        text.push_str("\n  - ");
        text.push_str(line);
    }
    for line in got {
        text.push_str("\n  + ");
        text.push_str(line);
    }
    text
}

fn show_request(r: &SeenRequest) -> String {
    let result = match &r.result {
        Seen::Answered(status) => format!("-> {status}"),
        Seen::Failed(why) => format!("-> failed: {why}"),
        Seen::Denied(why) => format!("-> denied: {why}"),
        Seen::Unanswered => "-> no canned answer".into(),
    };
    format!("{} {} {result}", r.method, r.url)
}

fn text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(t) => format!("{t:?}"),
        Err(_) => format!("base64:{}", {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(bytes)
        }),
    }
}

fn show_emitted(e: &Emitted) -> String {
    let mut line = format!("topic={}", e.topic);
    if let Some(key) = &e.key {
        line.push_str(&format!(" key={}", text(key)));
    }
    let headers: Vec<String> = e
        .headers
        .iter()
        .map(|(k, v)| format!("{k}={}", text(v)))
        .collect();
    if !headers.is_empty() {
        line.push_str(&format!(" headers={{{}}}", headers.join(", ")));
    }
    match &e.payload {
        Some(p) => line.push_str(&format!(" payload={}", text(p))),
        None => line.push_str(" payload=(none)"),
    }
    line
}

fn show_expected(e: &EmitSpec) -> String {
    let mut line = format!("topic={}", e.topic);
    if let Some(key) = &e.key {
        line.push_str(&format!(" key={key:?}"));
    }
    if !e.headers.is_empty() {
        let headers: Vec<String> = e
            .headers
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        line.push_str(&format!(" headers={{{}}}", headers.join(", ")));
    }
    if let Some(payload) = &e.payload {
        line.push_str(&format!(" payload={payload:?}"));
    }
    if let Some(json) = &e.json {
        line.push_str(&format!(" json contains {json}"));
    }
    line
}

fn emit_matches(want: &EmitSpec, got: &Emitted) -> bool {
    let header = |name: &str| {
        got.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    };
    want.topic == got.topic
        && want
            .key
            .as_ref()
            .is_none_or(|k| got.key.as_deref() == Some(k.as_bytes()))
        && want
            .headers
            .iter()
            .all(|(k, v)| header(k) == Some(v.as_bytes()))
        && want
            .payload
            .as_ref()
            .is_none_or(|p| got.payload.as_deref() == Some(p.as_bytes()))
        && want.json.as_ref().is_none_or(|json| {
            got.payload
                .as_deref()
                .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                .is_some_and(|actual| contains(&actual, json))
        })
}

/// Whether `actual` has everything `want` has: objects by key (extra keys
/// allowed), arrays element by element (same length), the rest equal.
pub fn contains(actual: &serde_json::Value, want: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (actual, want) {
        (Value::Object(a), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| a.get(k).is_some_and(|av| contains(av, wv))),
        (Value::Array(a), Value::Array(w)) => {
            a.len() == w.len() && a.iter().zip(w).all(|(av, wv)| contains(av, wv))
        }
        (a, w) => a == w,
    }
}

#[cfg(test)]
mod tests {
    use super::contains;
    use serde_json::json;

    #[test]
    fn a_json_subset_matches_by_key_and_recurses() {
        let actual = json!({"order_id": "o-1", "status": "closed", "items": [{"n": 1, "x": 2}]});
        assert!(contains(&actual, &json!({"status": "closed"})));
        assert!(contains(&actual, &json!({"items": [{"n": 1}]})));
        assert!(!contains(&actual, &json!({"status": "open"})));
        assert!(!contains(&actual, &json!({"missing": null})));
        assert!(!contains(&actual, &json!({"items": []})));
    }
}
