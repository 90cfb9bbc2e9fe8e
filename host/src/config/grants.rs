//! What a route's handler may touch beyond computing a verdict: outbound
//! HTTP to `allowed_hosts`, records to `emit_topics`, cancels of the delayed
//! messages in `cancel_ids`, and `[route.secrets]`.
//! Everything is off unless the route grants it (docs/config.md, grants).

use super::check_name;
use super::secrets::{Secrets, read_secret};
use crate::egress::{AllowList, HostLimit, Rate};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `[route.http]` as written: limits of the route's outbound HTTP.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Requests one handler call may make, redirects included. Default 16.
    pub max_requests: Option<u32>,
    /// Largest response body a handler may read, in bytes. Default 1 MiB.
    pub max_response_bytes: Option<u64>,
    /// Longest wait for a TCP connection. Default 2s.
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    /// Longest wait from sending a request to its response head. Default:
    /// whatever is left of the call's `timeout`.
    #[serde(default, with = "humantime_serde")]
    pub first_byte_timeout: Option<Duration>,
    /// Idle keep-alive connections kept per host. Default 16.
    pub max_idle_per_host: Option<usize>,
    /// How long an idle connection is kept. Default 30s.
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// PEM file of extra CA certificates to trust besides the system's
    /// roots, relative to the config file.
    pub ca_file: Option<PathBuf>,
    /// `[route.http.hosts."ENTRY"]`: limits of the requests to one
    /// `allowed_hosts` entry, keyed by the entry as written there.
    #[serde(default)]
    pub hosts: BTreeMap<String, HostLimitConfig>,
}

/// `[route.http.hosts."ENTRY"]` as written. Numbers are read signed and
/// wide so that a negative or absurd one gets a message naming the route
/// and the entry, not serde's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostLimitConfig {
    /// Requests to the entry's hosts in flight at once from this process,
    /// response bodies included.
    pub max_concurrent: Option<i64>,
    /// Requests per second to the entry's hosts from this process.
    pub rate: Option<Number>,
    /// Requests that may go at once after a quiet spell. Default 1.
    pub burst: Option<i64>,
}

/// A TOML number, integer or float.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum Number {
    Integer(i64),
    Float(f64),
}

impl Number {
    fn value(self) -> f64 {
        match self {
            Number::Integer(n) => n as f64,
            Number::Float(x) => x,
        }
    }
}

/// `[route.emit]` as written: limits of the records one call may emit.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmitConfig {
    /// Records one call may emit. Default 100.
    pub max_records: Option<u32>,
    /// Bytes one call may emit: keys, payloads, header names and values.
    /// Default 1 MiB.
    pub max_bytes: Option<u64>,
}

pub const DEFAULT_MAX_REQUESTS: u32 = 16;
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 1 << 20;
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_EMIT_RECORDS: u32 = 100;
pub const DEFAULT_MAX_EMIT_BYTES: u64 = 1 << 20;
/// Upper bounds of the limits, so one call cannot be granted unbounded
/// memory in the host.
const MAX_RESPONSE_BYTES: u64 = 1 << 30;
const MAX_EMIT_RECORDS: u32 = 10_000;
const MAX_EMIT_BYTES: u64 = 64 << 20;
/// Bounds of `http.hosts` limits: past them a value is a typo, not a limit.
const MAX_CONCURRENT: i64 = 100_000;
const MAX_RATE: f64 = 1_000_000.0;
const MIN_RATE: f64 = 0.001;
const MAX_BURST: i64 = 100_000;

/// A route's grants, resolved: what its handler may do besides computing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grants {
    /// Hosts the handler may call. Empty: no outbound HTTP at all.
    pub allowed_hosts: AllowList,
    pub http: HttpLimits,
    /// Topics the handler may emit records to. Empty: no emits.
    pub emit_topics: Vec<String>,
    pub emit: EmitLimits,
    /// Ids of delayed messages the handler may cancel or replace. Empty:
    /// none.
    pub cancel_ids: CancelIds,
    /// Where delayed emits go: the delay relay of the same config, if any.
    pub delay: Option<DelayGrant>,
    pub secrets: Secrets,
    /// Why every HTTP request is refused whatever `allowed_hosts` says:
    /// set for a candidate tried with HTTP denied
    /// (`crate::dlq::candidate_route`), whose refusals are the try's own
    /// mode, expected, and so not warned about. `None` for a route.
    pub http_off: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    pub max_requests: u32,
    pub max_response_bytes: u64,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Option<Duration>,
    pub max_idle_per_host: usize,
    pub idle_timeout: Duration,
    pub ca_file: Option<PathBuf>,
    /// `http.hosts`: the limits of the `allowed_hosts` entries that have
    /// any, in the order of the entries.
    pub hosts: Vec<HostLimit>,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_requests: DEFAULT_MAX_REQUESTS,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            first_byte_timeout: None,
            max_idle_per_host: super::DEFAULT_MAX_INSTANCES,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            ca_file: None,
            hosts: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmitLimits {
    pub max_records: u32,
    pub max_bytes: u64,
}

impl Default for EmitLimits {
    fn default() -> Self {
        EmitLimits {
            max_records: DEFAULT_MAX_EMIT_RECORDS,
            max_bytes: DEFAULT_MAX_EMIT_BYTES,
        }
    }
}

/// `cancel_ids`: the delayed messages a handler may cancel or replace, by
/// id. A cancel reaches every schedule of its id, whoever produced it, so it
/// is granted by id rather than by topic: a route that schedules
/// `timeout-*` and one that cancels them share those ids and no others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CancelIds {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl CancelIds {
    /// Whether `id` is granted: it is one of the exact ids, or starts with
    /// one of the prefixes.
    pub fn allows(&self, id: &str) -> bool {
        self.exact.iter().any(|e| e == id) || self.prefixes.iter().any(|p| id.starts_with(p))
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    /// Reads the entries as written: an exact id, or a prefix ending in
    /// `*`. Every entry that is neither is a problem.
    fn parse(entries: &[String], label: &str, problems: &mut Vec<String>) -> CancelIds {
        let mut ids = CancelIds::default();
        for entry in entries {
            let (text, prefix) = match entry.strip_suffix('*') {
                Some(head) => (head, true),
                None => (entry.as_str(), false),
            };
            if text.contains('*') {
                problems.push(format!(
                    "{label}: cancel_ids entry `{entry}` has `*` before its end; only a trailing `*` (a prefix) is allowed"
                ));
            } else if !prefix && text.is_empty() {
                problems.push(format!(
                    "{label}: cancel_ids entry is empty; write `*` to grant every id"
                ));
            } else if text.len() > crate::headers::MAX_ID_BYTES {
                problems.push(format!(
                    "{label}: cancel_ids entry `{}` is longer than an id may be ({} bytes)",
                    crate::headers::shorten(entry, 64),
                    crate::headers::MAX_ID_BYTES
                ));
            } else if prefix {
                ids.prefixes.push(text.to_string());
            } else {
                ids.exact.push(text.to_string());
            }
        }
        ids
    }
}

impl fmt::Display for CancelIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let exact = self.exact.iter().cloned();
        let prefixes = self.prefixes.iter().map(|p| format!("{p}*"));
        f.write_str(&exact.chain(prefixes).collect::<Vec<_>>().join(", "))
    }
}

/// The delay relay, as far as a delayed emit needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayGrant {
    pub inbox: String,
    pub max_delay: Duration,
}

/// The grant keys of a route as written.
pub(super) struct RawGrants<'a> {
    pub allowed_hosts: &'a [String],
    pub http: &'a HttpConfig,
    pub emit_topics: &'a [String],
    pub emit: &'a EmitConfig,
    pub cancel_ids: &'a [String],
    pub secrets: &'a BTreeMap<String, String>,
    /// The route's `max_instances`: the default of `http.max_idle_per_host`.
    pub max_instances: usize,
}

/// Resolves a route's grants, adding every problem to `problems`.
pub(super) fn resolve(
    raw: RawGrants<'_>,
    label: &str,
    base: &Path,
    problems: &mut Vec<String>,
) -> Grants {
    let allowed_hosts = AllowList::parse(raw.allowed_hosts).unwrap_or_else(|found| {
        problems.extend(found.into_iter().map(|p| format!("{label}: {p}")));
        AllowList::default()
    });
    let mut http = resolve_http(raw.http, raw.max_instances, label, base, problems);
    http.hosts = host_limits(&raw.http.hosts, &allowed_hosts, label, problems);
    let mut emit_topics: Vec<String> = Vec::new();
    for topic in raw.emit_topics {
        if let Err(e) = check_name(topic) {
            problems.push(format!("{label}: emit topic `{topic}` {e}"));
        } else if emit_topics.contains(topic) {
            problems.push(format!("{label}: emit topic `{topic}` is listed twice"));
        } else {
            emit_topics.push(topic.clone());
        }
    }
    let emit = EmitLimits {
        max_records: bounded(
            raw.emit.max_records,
            DEFAULT_MAX_EMIT_RECORDS,
            MAX_EMIT_RECORDS,
            &format!("{label}: emit.max_records"),
            problems,
        ),
        max_bytes: bounded(
            raw.emit.max_bytes,
            DEFAULT_MAX_EMIT_BYTES,
            MAX_EMIT_BYTES,
            &format!("{label}: emit.max_bytes"),
            problems,
        ),
    };
    let cancel_ids = CancelIds::parse(raw.cancel_ids, label, problems);
    let mut secrets = Secrets::default();
    for (name, source) in raw.secrets {
        match read_secret(name, source, base) {
            Ok(value) => secrets.insert(name, value),
            Err(problem) => problems.push(format!("{label}: secret `{name}`: {problem}")),
        }
    }
    Grants {
        allowed_hosts,
        http,
        emit_topics,
        emit,
        cancel_ids,
        delay: None,
        secrets,
        http_off: None,
    }
}

fn resolve_http(
    raw: &HttpConfig,
    max_instances: usize,
    label: &str,
    base: &Path,
    problems: &mut Vec<String>,
) -> HttpLimits {
    let max_requests = bounded(
        raw.max_requests,
        DEFAULT_MAX_REQUESTS,
        u32::MAX,
        &format!("{label}: http.max_requests"),
        problems,
    );
    let max_response_bytes = bounded(
        raw.max_response_bytes,
        DEFAULT_MAX_RESPONSE_BYTES,
        MAX_RESPONSE_BYTES,
        &format!("{label}: http.max_response_bytes"),
        problems,
    );
    for (key, value) in [
        ("connect_timeout", raw.connect_timeout),
        ("first_byte_timeout", raw.first_byte_timeout),
        ("idle_timeout", raw.idle_timeout),
    ] {
        if value.is_some_and(|d| d.is_zero()) {
            problems.push(format!("{label}: http.{key} must be more than 0s"));
        }
    }
    let ca_file = raw.ca_file.as_ref().map(|f| base.join(f));
    if let Some(file) = &ca_file
        && !file.is_file()
    {
        problems.push(format!(
            "{label}: http.ca_file {} does not exist or is not a file",
            file.display()
        ));
    }
    HttpLimits {
        max_requests,
        max_response_bytes,
        connect_timeout: raw.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        first_byte_timeout: raw.first_byte_timeout,
        // Every call running at once may hold a connection; keeping fewer
        // idle would close and reopen connections (and TLS sessions) all the
        // time.
        max_idle_per_host: raw.max_idle_per_host.unwrap_or(max_instances),
        idle_timeout: raw.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT),
        ca_file,
        hosts: Vec::new(),
    }
}

/// Resolves `http.hosts`: each key an entry of `allowed_hosts` (however
/// spelled there, but only once), each limit within its bounds.
fn host_limits(
    raw: &BTreeMap<String, HostLimitConfig>,
    allowed: &AllowList,
    label: &str,
    problems: &mut Vec<String>,
) -> Vec<HostLimit> {
    let mut limits: Vec<HostLimit> = Vec::new();
    let mut seen: Vec<(usize, &str)> = Vec::new();
    for (name, limit) in raw {
        let what = format!("{label}: http.hosts.\"{name}\"");
        let entry = match allowed.index_of(name) {
            Ok(Some(entry)) => entry,
            Ok(None) => {
                problems.push(format!(
                    "{what} is not an allowed_hosts entry; limits are set per entry, written as in allowed_hosts"
                ));
                continue;
            }
            Err(e) => {
                problems.push(format!("{what}: {e}"));
                continue;
            }
        };
        if let Some((_, other)) = seen.iter().find(|(e, _)| *e == entry) {
            problems.push(format!(
                "{what} is the same allowed_hosts entry as http.hosts.\"{other}\""
            ));
            continue;
        }
        seen.push((entry, name));
        let before = problems.len();
        let max_concurrent = limit.max_concurrent.and_then(|n| {
            if (1..=MAX_CONCURRENT).contains(&n) {
                Some(n as u32)
            } else {
                problems.push(format!(
                    "{what}.max_concurrent must be between 1 and {MAX_CONCURRENT}, not {n}"
                ));
                None
            }
        });
        let burst = match limit.burst {
            None => 1,
            Some(n) if (1..=MAX_BURST).contains(&n) => n as u32,
            Some(n) => {
                problems.push(format!(
                    "{what}.burst must be between 1 and {MAX_BURST}, not {n}"
                ));
                1
            }
        };
        if limit.burst.is_some() && limit.rate.is_none() {
            problems.push(format!("{what}.burst is set without a rate"));
        }
        let rate = limit.rate.and_then(|rate| {
            let per_second = rate.value();
            if (MIN_RATE..=MAX_RATE).contains(&per_second) {
                Some(Rate {
                    interval: Duration::from_secs_f64(1.0 / per_second),
                    burst,
                })
            } else {
                problems.push(format!(
                    "{what}.rate must be between {MIN_RATE} and {MAX_RATE} requests a second, not {per_second}"
                ));
                None
            }
        });
        if limit.max_concurrent.is_none() && limit.rate.is_none() {
            problems.push(format!(
                "{what} sets no limit: give max_concurrent, rate, or both"
            ));
        }
        if problems.len() == before {
            limits.push(HostLimit {
                entry,
                name: name.clone(),
                max_concurrent,
                rate,
            });
        }
    }
    limits.sort_by_key(|l| l.entry);
    limits
}

/// `value`, or `default` when unset; a problem when it is 0 or above `max`.
fn bounded<T>(value: Option<T>, default: T, max: T, what: &str, problems: &mut Vec<String>) -> T
where
    T: Copy + PartialOrd + From<u8> + fmt::Display,
{
    let value = value.unwrap_or(default);
    if value < T::from(1) || value > max {
        problems.push(format!("{what} must be between 1 and {max}, not {value}"));
    }
    value
}

#[cfg(test)]
mod tests {
    use crate::config::{ConfigFile, DEFAULT_IO_TIMEOUT, DEFAULT_TIMEOUT, Route};
    use std::path::Path;
    use std::time::Duration;

    fn resolve(dir: &Path, text: &str) -> Result<Vec<Route>, Vec<String>> {
        crate::config::resolve_in(dir, text).map(|c| c.routes)
    }

    #[test]
    fn grants_resolve_with_their_defaults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "s3cr3t-value\n").unwrap();
        let routes = resolve(
            dir.path(),
            r#"
            [[route]]
            name = "plain"
            topics = ["a"]
            handler = "h.wasm"

            [[route]]
            name = "acting"
            topics = ["b"]
            handler = "h.wasm"
            allowed_hosts = ["http://127.0.0.1:8080", "https://*.example.com"]
            emit_topics = ["closed"]

            [route.secrets]
            token = "file:token"
            path = "env:PATH"

            [route.http]
            max_requests = 4
            first_byte_timeout = "300ms"

            [route.emit]
            max_records = 3

            [delay]
            "#,
        )
        .unwrap();
        let (plain, acting) = (&routes[0], &routes[1]);
        assert!(plain.grants.allowed_hosts.is_empty());
        assert!(plain.grants.emit_topics.is_empty() && plain.grants.secrets.is_empty());
        assert_eq!(plain.timeout, DEFAULT_TIMEOUT);
        assert_eq!(acting.timeout, DEFAULT_IO_TIMEOUT, "a route that calls out");

        let g = &acting.grants;
        assert_eq!(
            g.allowed_hosts.to_string(),
            "http://127.0.0.1:8080, https://*.example.com:443"
        );
        assert_eq!(g.http.max_requests, 4);
        assert_eq!(g.http.first_byte_timeout, Some(Duration::from_millis(300)));
        assert_eq!(g.http.connect_timeout, super::DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(g.http.max_response_bytes, super::DEFAULT_MAX_RESPONSE_BYTES);
        assert_eq!(g.emit_topics, vec!["closed"]);
        assert_eq!(g.emit.max_records, 3);
        assert_eq!(g.emit.max_bytes, super::DEFAULT_MAX_EMIT_BYTES);
        let relay = g.delay.as_ref().expect("the config's relay");
        assert_eq!(relay.inbox, "hopper.delay");
        assert!(acting.all_topics().contains(&"closed".to_string()));

        let token = g.secrets.get("token").unwrap();
        assert_eq!(
            token.expose(),
            "s3cr3t-value",
            "the file's newline is not part of it"
        );
        assert_eq!(
            g.secrets.get("path").unwrap().expose(),
            std::env::var("PATH").unwrap()
        );
        assert!(!format!("{acting:?}").contains("s3cr3t-value"));
        assert_eq!(
            g.secrets.redact("token s3cr3t-value sent"),
            "token [secret token] sent"
        );
    }

    #[test]
    fn every_grant_problem_is_reported_with_its_route() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("empty"), "").unwrap();
        let problems = resolve(
            dir.path(),
            r#"
            [[route]]
            name = "orders"
            topics = ["in"]
            handler = "h.wasm"
            retry = ["5s"]

            [[route]]
            name = "sneaky"
            topics = ["in2"]
            handler = "h.wasm"
            emit_topics = ["orders.retry.5s", "hopper.delay"]

            [[route]]
            name = "bad"
            topics = ["in3"]
            handler = "h.wasm"
            allowed_hosts = ["example.com", "http://127.0.0.1:8080"]
            emit_topics = ["closed", "closed", "bad topic"]

            [route.secrets]
            missing = "env:HOPPER_TEST_SURELY_UNSET_VARIABLE"
            gone = "file:no-such-file"
            blank = "file:empty"
            odd = "vault:kv/token"

            [route.http]
            max_requests = 0
            connect_timeout = "0s"
            ca_file = "no-ca.pem"

            [route.emit]
            max_bytes = 0

            [delay]
            "#,
        )
        .unwrap_err();
        let text = problems.join("\n");
        for expected in [
            "route `bad`: allowed_hosts entry `example.com`: no scheme",
            "route `bad`: emit topic `closed` is listed twice",
            "route `bad`: emit topic `bad topic` has ` `",
            "route `sneaky`: emit topic `orders.retry.5s` is hopper's own retry tier (route `orders`), which only hopper writes",
            "route `sneaky`: emit topic `hopper.delay` is hopper's own delay inbox (the delay relay), which only hopper writes; emit with a delay instead",
            "route `bad`: secret `missing`: environment variable HOPPER_TEST_SURELY_UNSET_VARIABLE is not set",
            "route `bad`: secret `gone`: cannot read file",
            "route `bad`: secret `blank`: file:empty is empty",
            "route `bad`: secret `odd`: source `vault:kv/token` is neither",
            "route `bad`: http.max_requests must be between 1 and",
            "route `bad`: http.connect_timeout must be more than 0s",
            "route `bad`: http.ca_file",
            "route `bad`: emit.max_bytes must be between 1 and",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        assert_eq!(problems.len(), 13, "{text}");
    }

    #[test]
    fn cancel_ids_grant_exact_ids_and_prefixes_and_need_a_relay() {
        let dir = tempfile::tempdir().unwrap();
        let route = |name: &str, ids: &str| {
            format!(
                "[[route]]\nname = \"{name}\"\ntopics = [\"{name}.in\"]\nhandler = \"h.wasm\"\ncancel_ids = {ids}\n"
            )
        };
        let routes = resolve(
            dir.path(),
            &format!(
                "{}{}{}[delay]\n",
                route("payments", r#"["timeout-*", "reminder-o-1"]"#),
                route("admin", r#"["*"]"#),
                route("plain", "[]"),
            ),
        )
        .unwrap();
        let ids = &routes[0].grants.cancel_ids;
        assert!(ids.allows("timeout-o-1") && ids.allows("timeout-"));
        assert!(ids.allows("reminder-o-1"));
        assert!(!ids.allows("reminder-o-10"), "an exact id is not a prefix");
        assert!(!ids.allows("timeout") && !ids.allows("order-o-1"));
        assert_eq!(ids.to_string(), "reminder-o-1, timeout-*");
        assert!(routes[1].grants.cancel_ids.allows("anything at all"));
        assert!(routes[2].grants.cancel_ids.is_empty());
        assert!(!routes[2].grants.cancel_ids.allows(""));

        let long = "x".repeat(300);
        let problems = resolve(
            dir.path(),
            &format!(
                "{}{}",
                route("bad", &format!(r#"["time*out-*", "", "{long}*"]"#)),
                route("relayless", r#"["timeout-*"]"#),
            ),
        )
        .unwrap_err();
        let text = problems.join("\n");
        for expected in [
            "route `bad`: cancel_ids entry `time*out-*` has `*` before its end",
            "route `bad`: cancel_ids entry is empty; write `*` to grant every id",
            "route `bad`: cancel_ids entry `xxxx",
            "route `relayless`: cancel_ids needs a [delay] table",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        assert_eq!(problems.len(), 4, "{text}");
    }

    #[test]
    fn host_limits_resolve_per_allowed_hosts_entry() {
        let dir = tempfile::tempdir().unwrap();
        let routes = resolve(
            dir.path(),
            r#"
            [[route]]
            name = "calls"
            topics = ["a"]
            handler = "h.wasm"
            allowed_hosts = ["https://api.example.com", "http://127.0.0.1:8080", "https://*.pay.example"]

            [route.http.hosts."https://api.example.com:443"]
            max_concurrent = 4

            [route.http.hosts."https://*.pay.example"]
            rate = 2.5
            burst = 5

            [route.http.hosts."http://127.0.0.1:8080"]
            max_concurrent = 1
            rate = 100
            "#,
        )
        .unwrap();
        let hosts = &routes[0].grants.http.hosts;
        let shown: Vec<String> = hosts
            .iter()
            .map(|h| {
                format!(
                    "{} {} {:?} {}",
                    h.entry,
                    h.name,
                    h.max_concurrent,
                    h.rate.map(|r| r.to_string()).unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                "0 https://api.example.com:443 Some(4) ",
                "1 http://127.0.0.1:8080 Some(1) rate = 100/s, burst 1",
                "2 https://*.pay.example None rate = 2.5/s, burst 5",
            ],
            "in the order of allowed_hosts, an entry however spelled"
        );
        assert_eq!(hosts[2].rate.unwrap().interval, Duration::from_millis(400));
    }

    #[test]
    fn hostile_host_limits_are_named_with_their_route_and_entry() {
        let dir = tempfile::tempdir().unwrap();
        let problems = resolve(
            dir.path(),
            r#"
            [[route]]
            name = "calls"
            topics = ["a"]
            handler = "h.wasm"
            allowed_hosts = ["https://a.example", "https://b.example", "https://c.example", "https://d.example"]

            [route.http.hosts."https://a.example"]
            max_concurrent = 0
            rate = -1

            [route.http.hosts."https://b.example"]
            max_concurrent = -5
            rate = 1e12
            burst = 0

            [route.http.hosts."https://c.example"]
            burst = 3

            [route.http.hosts."https://d.example"]

            [route.http.hosts."https://d.example:443"]
            max_concurrent = 2

            [route.http.hosts."https://e.example"]
            max_concurrent = 2

            [route.http.hosts."e.example"]
            rate = 1

            [route.http.hosts."https://a.example:8443"]
            rate = nan
            "#,
        )
        .unwrap_err();
        let text = problems.join("\n");
        for expected in [
            r#"route `calls`: http.hosts."https://a.example".max_concurrent must be between 1 and 100000, not 0"#,
            r#"route `calls`: http.hosts."https://a.example".rate must be between 0.001 and 1000000 requests a second, not -1"#,
            r#"route `calls`: http.hosts."https://b.example".max_concurrent must be between 1 and 100000, not -5"#,
            r#"route `calls`: http.hosts."https://b.example".rate must be between 0.001 and 1000000 requests a second, not 1000000000000"#,
            r#"route `calls`: http.hosts."https://b.example".burst must be between 1 and 100000, not 0"#,
            r#"route `calls`: http.hosts."https://c.example".burst is set without a rate"#,
            r#"route `calls`: http.hosts."https://c.example" sets no limit"#,
            r#"route `calls`: http.hosts."https://d.example" sets no limit"#,
            r#"route `calls`: http.hosts."https://d.example:443" is the same allowed_hosts entry as http.hosts."https://d.example""#,
            r#"route `calls`: http.hosts."https://e.example" is not an allowed_hosts entry"#,
            r#"route `calls`: http.hosts."e.example": no scheme"#,
            r#"route `calls`: http.hosts."https://a.example:8443" is not an allowed_hosts entry"#,
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        assert_eq!(problems.len(), 12, "{text}");
    }

    #[test]
    fn unknown_grant_keys_are_rejected_by_name() {
        let err = ConfigFile::parse(
            "[[route]]\nname = \"r\"\ntopics = [\"a\"]\nhandler = \"h.wasm\"\n[route.http]\nmax_request = 3\n",
        )
        .unwrap_err();
        assert!(err.contains("unknown field `max_request`"), "{err}");
    }
}
