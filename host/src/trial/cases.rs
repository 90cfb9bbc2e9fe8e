//! The cases file of `hopper plugin test`, as written (TOML, or JSON with
//! the same shape), and its loading: every problem of every case found and
//! reported at once, each naming the case and the field.

use crate::config::{ConfigFile, HumanDuration, Route};
use crate::plugin::Delivery;
use crate::plugin::canned::{Answer, CannedError, Reply};
use base64::Engine as _;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bytes a cases file may have: large payloads belong in files of their own.
pub const MAX_CASES_FILE: u64 = 32 << 20;
/// Bytes a case's payload (or a canned body) may have, however it is given.
pub const MAX_PAYLOAD: u64 = 16 << 20;

/// The name a route gets in a cases file that does not name one.
pub const DEFAULT_ROUTE: &str = "test";

/// A cases file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CasesFile {
    /// The route the handler runs under: the keys of a config's `[[route]]`
    /// table (`timeout`, `memory_mib`, `allowed_hosts`, `emit_topics`,
    /// `cancel_ids`, `[route.config]`, ...); `name`, `topics` and `handler`
    /// may be left out.
    pub route: Option<toml::Table>,
    /// Secrets every case gets, by name, as literal values.
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    #[serde(default, rename = "case")]
    pub cases: Vec<CaseSpec>,
}

/// One case as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseSpec {
    pub name: String,
    pub id: Option<String>,
    pub topic: Option<String>,
    pub key: Option<String>,
    pub key_base64: Option<String>,
    pub payload: Option<String>,
    pub payload_base64: Option<String>,
    /// Relative to the cases file.
    pub payload_file: Option<PathBuf>,
    /// No payload at all (a Kafka tombstone).
    #[serde(default)]
    pub tombstone: bool,
    /// Header values as text.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Header values as base64, for bytes that are not text.
    #[serde(default)]
    pub headers_base64: BTreeMap<String, String>,
    pub attempt: Option<u32>,
    pub timestamp: Option<i64>,
    /// Secrets of this case, over the file's.
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    /// Route config values of this case, over the route's.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Canned answers to the handler's outbound HTTP.
    #[serde(default)]
    pub http: Vec<HttpSpec>,
    pub expect: ExpectSpec,
}

/// A canned answer as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSpec {
    /// Any method when left out.
    pub method: Option<String>,
    /// The full URL; a trailing `*` matches by prefix.
    pub url: String,
    pub status: Option<u16>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub body: Option<String>,
    pub body_base64: Option<String>,
    /// A JSON body; `content-type: application/json` unless headers say
    /// otherwise.
    pub json: Option<serde_json::Value>,
    /// No response: `connection-refused`, `connect-timeout`, `timeout`,
    /// `dns`, `reset` or `tls`.
    pub error: Option<String>,
    /// How long the answer takes.
    pub delay: Option<HumanDuration>,
}

/// What a case expects, as written. Anything left out is not checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectSpec {
    /// `ok`, `retryable`, `fatal`, `trap`, `timeout` or `memory`.
    pub verdict: String,
    /// The reason class the route would record, on the retry record or the
    /// dead letter: `RETRYABLE`, `RETRIES_EXHAUSTED`, `FATAL`,
    /// `HANDLER_TRAP`, `HANDLER_TIMEOUT`, `HANDLER_MEMORY`; `none` for `ok`.
    pub reason_class: Option<String>,
    /// Text the reason (or the trap's error) contains.
    pub reason: Option<String>,
    /// The records published, in order (none: `emit = []`).
    pub emit: Option<Vec<EmitSpec>>,
    /// The ids scheduled, in order.
    pub scheduled: Option<Vec<String>>,
    /// The ids cancelled, in order.
    pub cancelled: Option<Vec<String>>,
    /// The requests made, in order, each `METHOD URL`.
    pub requests: Option<Vec<String>>,
}

/// An expected published record. Fields left out are not checked.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EmitSpec {
    pub topic: String,
    pub key: Option<String>,
    /// Headers the record has (others may be there too).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The payload, exactly, as text.
    pub payload: Option<String>,
    /// A JSON value the payload contains: every key given has this value,
    /// recursively; others may be there too.
    pub json: Option<serde_json::Value>,
}

/// A case ready to run.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub delivery: Delivery,
    pub answers: Vec<Answer>,
    pub secrets: BTreeMap<String, String>,
    pub config: BTreeMap<String, String>,
    pub expect: Expect,
}

/// What a case expects, checked.
#[derive(Debug, Clone)]
pub struct Expect {
    pub verdict: String,
    pub reason_class: Option<String>,
    pub reason: Option<String>,
    pub emit: Option<Vec<EmitSpec>>,
    pub scheduled: Option<Vec<String>>,
    pub cancelled: Option<Vec<String>>,
    pub requests: Option<Vec<String>>,
}

/// The verdicts a case may expect.
pub const VERDICTS: [&str; 6] = ["ok", "retryable", "fatal", "trap", "timeout", "memory"];
/// The reason classes a case may expect.
pub const CLASSES: [&str; 7] = [
    "none",
    "RETRYABLE",
    "RETRIES_EXHAUSTED",
    "FATAL",
    "HANDLER_TRAP",
    "HANDLER_TIMEOUT",
    "HANDLER_MEMORY",
];

/// Why a cases file cannot run. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum CasesError {
    #[error("cannot read cases file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cases file {path} is {size} bytes; a cases file may have at most {MAX_CASES_FILE} (32 MiB): put a large payload in a file of its own (`payload_file`)"
    )]
    TooLarge { path: PathBuf, size: u64 },
    #[error(
        "cases file {path} is not UTF-8 text (byte {at}): write bytes that are not text as base64 (`payload_base64`, `key_base64`, `headers_base64`, `body_base64`)"
    )]
    NotText { path: PathBuf, at: usize },
    #[error("cases file {path} does not parse: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cases file {path}:\n  - {}", problems.join("\n  - "))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

/// A cases file, loaded: its route and its cases.
#[derive(Debug)]
pub struct Suite {
    pub path: PathBuf,
    pub route: Route,
    pub cases: Vec<Case>,
}

/// Reads the cases file at `path` for the handler at `handler`. The route
/// is `from_config` when given (a route of a hopper config; the file may
/// then have no `[route]` table), else the file's `[route]` table.
pub fn load(path: &Path, handler: &Path, from_config: Option<Route>) -> Result<Suite, CasesError> {
    let read = |source| CasesError::Read {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read)?.len();
    if size > MAX_CASES_FILE {
        return Err(CasesError::TooLarge {
            path: path.to_path_buf(),
            size,
        });
    }
    let bytes = std::fs::read(path).map_err(read)?;
    let text = String::from_utf8(bytes).map_err(|e| CasesError::NotText {
        path: path.to_path_buf(),
        at: e.utf8_error().valid_up_to(),
    })?;
    let json = path.extension().is_some_and(|e| e == "json");
    let parsed: Result<CasesFile, String> = if json {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    } else {
        toml::from_str(&text).map_err(|e| e.to_string().trim_end().to_string())
    };
    let file = parsed.map_err(|message| CasesError::Parse {
        path: path.to_path_buf(),
        message,
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut problems = Vec::new();
    let route = match (from_config, &file.route) {
        (Some(_), Some(_)) => {
            problems.push(
                "it has a [route] table, and a route was given from a config (--config): give one"
                    .to_string(),
            );
            None
        }
        (Some(route), None) => Some(route),
        (None, table) => route_of(
            table.clone().unwrap_or_default(),
            handler,
            base,
            &mut problems,
        ),
    };
    if file.cases.is_empty() {
        problems.push("it has no cases: add a [[case]] table".into());
    }
    let mut names = std::collections::HashSet::new();
    let mut cases = Vec::new();
    for (index, spec) in file.cases.into_iter().enumerate() {
        let label = if spec.name.is_empty() {
            format!("case #{}", index + 1)
        } else {
            format!("case `{}`", spec.name)
        };
        if spec.name.is_empty() {
            problems.push(format!("{label}: name is empty"));
        } else if !names.insert(spec.name.clone()) {
            problems.push(format!("{label}: the name is used twice"));
        }
        let route_name = route.as_ref().map_or(DEFAULT_ROUTE, |r| r.name.as_str());
        let input = route
            .as_ref()
            .and_then(|r| r.topics.first().cloned())
            .unwrap_or_else(|| format!("{DEFAULT_ROUTE}.in"));
        if let Some(case) = case_of(
            spec,
            &file.secrets,
            route_name,
            &input,
            base,
            &label,
            &mut problems,
        ) {
            cases.push(case);
        }
    }
    match route {
        Some(route) if problems.is_empty() => Ok(Suite {
            path: path.to_path_buf(),
            route,
            cases,
        }),
        _ => Err(CasesError::Invalid {
            path: path.to_path_buf(),
            problems,
        }),
    }
}

/// The route of a `[route]` table, resolved as `hopper run` resolves a
/// config's, with a `[delay]` table of defaults so that delayed emits,
/// schedules and cancels can be granted.
fn route_of(
    mut table: toml::Table,
    handler: &Path,
    base: &Path,
    problems: &mut Vec<String>,
) -> Option<Route> {
    let name = table
        .get("name")
        .and_then(|n| n.as_str())
        .unwrap_or(DEFAULT_ROUTE)
        .to_string();
    table
        .entry("name")
        .or_insert_with(|| toml::Value::String(name.clone()));
    table
        .entry("topics")
        .or_insert_with(|| toml::Value::Array(vec![toml::Value::String(format!("{name}.in"))]));
    if table.contains_key("handler") {
        problems
            .push("[route]: handler is the file given on the command line; leave it out".into());
    }
    let handler = std::path::absolute(handler).unwrap_or_else(|_| handler.to_path_buf());
    table.insert(
        "handler".into(),
        toml::Value::String(handler.to_string_lossy().into_owned()),
    );
    let mut document = toml::Table::new();
    document.insert(
        "route".into(),
        toml::Value::Array(vec![toml::Value::Table(table)]),
    );
    document.insert("delay".into(), toml::Value::Table(toml::Table::new()));
    let file = match ConfigFile::deserialize(toml::Value::Table(document)) {
        Ok(file) => file,
        Err(e) => {
            problems.push(format!("[route]: {}", e.to_string().trim_end()));
            return None;
        }
    };
    match file.resolve(base) {
        Ok(mut config) => config.routes.pop(),
        Err(found) => {
            problems.extend(found.into_iter().map(|p| format!("[route]: {p}")));
            None
        }
    }
}

fn case_of(
    spec: CaseSpec,
    file_secrets: &BTreeMap<String, String>,
    route: &str,
    input: &str,
    base: &Path,
    label: &str,
    problems: &mut Vec<String>,
) -> Option<Case> {
    let before = problems.len();
    let mut problem = |text: String| problems.push(format!("{label}: {text}"));
    let key = match (spec.key, spec.key_base64) {
        (Some(_), Some(_)) => {
            problem("give key or key_base64, not both".into());
            None
        }
        (Some(text), None) => Some(text.into_bytes()),
        (None, Some(b64)) => decode(&b64, "key_base64", &mut problem),
        (None, None) => None,
    };
    let given = [
        spec.payload.is_some(),
        spec.payload_base64.is_some(),
        spec.payload_file.is_some(),
        spec.tombstone,
    ]
    .iter()
    .filter(|g| **g)
    .count();
    if given != 1 {
        problem(
            "give exactly one of payload, payload_base64, payload_file or tombstone = true".into(),
        );
    }
    let payload = if let Some(text) = spec.payload {
        Some(text.into_bytes())
    } else if let Some(b64) = spec.payload_base64 {
        decode(&b64, "payload_base64", &mut problem)
    } else if let Some(file) = spec.payload_file {
        read_payload(&base.join(&file), &mut problem)
    } else {
        None
    };
    if payload
        .as_ref()
        .is_some_and(|p| p.len() as u64 > MAX_PAYLOAD)
    {
        problem(format!(
            "the payload is {} bytes; a case's payload may have at most {MAX_PAYLOAD} (16 MiB)",
            payload.as_ref().map_or(0, Vec::len)
        ));
    }
    let mut headers = Vec::new();
    for (name, value) in spec.headers {
        check_header_name(&name, &mut problem);
        headers.push((name, value.into_bytes()));
    }
    for (name, b64) in spec.headers_base64 {
        check_header_name(&name, &mut problem);
        if let Some(value) = decode(&b64, &format!("headers_base64.{name}"), &mut problem) {
            headers.push((name, value));
        }
    }
    let attempt = spec.attempt.unwrap_or(1);
    if attempt == 0 {
        problem("attempt is 0; the first delivery is attempt 1".into());
    }
    let mut answers = Vec::new();
    for (i, http) in spec.http.into_iter().enumerate() {
        if let Some(answer) = answer_of(http, &mut |text| {
            problem(format!("http #{}: {text}", i + 1))
        }) {
            answers.push(answer);
        }
    }
    let expect = expect_of(spec.expect, &mut problem);
    if problems.len() > before {
        return None;
    }
    let mut secrets = file_secrets.clone();
    secrets.extend(spec.secrets);
    Some(Case {
        delivery: Delivery {
            id: spec.id.unwrap_or_else(|| format!("case-{}", spec.name)),
            topic: spec.topic.unwrap_or_else(|| input.to_string()),
            partition: 0,
            offset: 0,
            key,
            payload,
            headers,
            timestamp: spec.timestamp,
            attempt,
            route: route.to_string(),
        },
        name: spec.name,
        answers,
        secrets,
        config: spec.config,
        expect: expect?,
    })
}

fn decode(b64: &str, field: &str, problem: &mut impl FnMut(String)) -> Option<Vec<u8>> {
    match base64::engine::general_purpose::STANDARD.decode(b64.trim()) {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            problem(format!("{field} is not base64: {e}"));
            None
        }
    }
}

fn read_payload(path: &Path, problem: &mut impl FnMut(String)) -> Option<Vec<u8>> {
    let size = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) => {
            problem(format!("cannot read payload_file {}: {e}", path.display()));
            return None;
        }
    };
    if size > MAX_PAYLOAD {
        problem(format!(
            "payload_file {} is {size} bytes; a case's payload may have at most {MAX_PAYLOAD} (16 MiB)",
            path.display()
        ));
        return None;
    }
    match std::fs::read(path) {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            problem(format!("cannot read payload_file {}: {e}", path.display()));
            None
        }
    }
}

fn check_header_name(name: &str, problem: &mut impl FnMut(String)) {
    if name.is_empty() || name.chars().any(char::is_control) {
        problem(format!(
            "header name {name:?} is empty or has control characters; only a header's value may be bytes (`headers_base64`)"
        ));
    }
}

fn answer_of(spec: HttpSpec, problem: &mut impl FnMut(String)) -> Option<Answer> {
    let before_url = spec.url.clone();
    let parsed = spec.url.trim_end_matches('*').parse::<http::Uri>();
    if !spec.url.starts_with("http://") && !spec.url.starts_with("https://") || parsed.is_err() {
        problem(format!(
            "url `{before_url}` is not an http:// or https:// URL"
        ));
    }
    let bodies = [
        spec.body.is_some(),
        spec.body_base64.is_some(),
        spec.json.is_some(),
    ]
    .iter()
    .filter(|g| **g)
    .count();
    if bodies > 1 {
        problem("give one of body, body_base64 or json".into());
    }
    let delay = spec.delay.map_or(Duration::ZERO, |d| d.0);
    let reply = match (spec.error, spec.status) {
        (Some(_), Some(_)) => {
            problem("give status or error, not both".into());
            return None;
        }
        (Some(error), None) => match CannedError::parse(&error) {
            Some(error) if bodies == 0 => Reply::Error(error),
            Some(_) => {
                problem("an error has no body".into());
                return None;
            }
            None => {
                problem(format!(
                    "error `{error}` is not one of {}",
                    CannedError::NAMES.join(", ")
                ));
                return None;
            }
        },
        (None, status) => {
            let status = status.unwrap_or(200);
            if !(100..=599).contains(&status) {
                problem(format!("status {status} is not an HTTP status"));
            }
            let mut headers: Vec<(String, String)> = spec.headers.into_iter().collect();
            let body = if let Some(text) = spec.body {
                text.into_bytes()
            } else if let Some(b64) = spec.body_base64 {
                decode(&b64, "body_base64", problem)?
            } else if let Some(json) = spec.json {
                if !headers
                    .iter()
                    .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                {
                    headers.push(("content-type".into(), "application/json".into()));
                }
                json.to_string().into_bytes()
            } else {
                Vec::new()
            };
            for (name, value) in &headers {
                if http::HeaderName::try_from(name.as_str()).is_err()
                    || http::HeaderValue::try_from(value.as_str()).is_err()
                {
                    problem(format!("header `{name}` is not a valid HTTP header"));
                }
            }
            Reply::Response {
                status,
                headers,
                body,
            }
        }
    };
    Some(Answer {
        method: spec.method.map(|m| m.to_ascii_uppercase()),
        url: spec.url,
        delay,
        reply,
    })
}

fn expect_of(spec: ExpectSpec, problem: &mut impl FnMut(String)) -> Option<Expect> {
    let mut ok = true;
    if !VERDICTS.contains(&spec.verdict.as_str()) {
        problem(format!(
            "expect.verdict `{}` is not one of {}",
            spec.verdict,
            VERDICTS.join(", ")
        ));
        ok = false;
    }
    if let Some(class) = &spec.reason_class
        && !CLASSES.contains(&class.as_str())
    {
        problem(format!(
            "expect.reason_class `{class}` is not one of {}",
            CLASSES.join(", ")
        ));
        ok = false;
    }
    for request in spec.requests.iter().flatten() {
        if request.split_once(' ').is_none() {
            problem(format!("expect.requests: `{request}` is not `METHOD URL`"));
            ok = false;
        }
    }
    ok.then_some(Expect {
        verdict: spec.verdict,
        reason_class: spec.reason_class,
        reason: spec.reason,
        emit: spec.emit,
        scheduled: spec.scheduled,
        cancelled: spec.cancelled,
        requests: spec.requests,
    })
}
