//! `[admin]` (the admin HTTP server and metrics) and `[replay]` (how DLQ
//! records are replayed).

use crate::egress::OwnEndpoint;
use serde::Deserialize;
use std::net::SocketAddr;

/// The environment variable that may hold the admin token instead of
/// `admin.token`.
pub const TOKEN_ENV: &str = "HOPPER_ADMIN_TOKEN";

/// The admin server as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Where the admin server listens. Default `127.0.0.1:9464`: loopback
    /// only.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// The bearer token that every `/api` call must present (reads too:
    /// DLQ payloads are data). Default: `HOPPER_ADMIN_TOKEN` from the
    /// environment; without either, nothing can change state through the
    /// server, and reads need the session token the server makes at start.
    pub token: Option<String>,
    /// Host names, besides the listen address and loopback names, that
    /// browsers may use to reach the server (`Host` header), such as the
    /// name of a proxy in front of it. Others are refused, so a page that
    /// rebinds its own name to 127.0.0.1 reads nothing.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Time handler calls, sample lag and serve `/metrics`. Default true.
    #[serde(default = "default_true")]
    pub metrics: bool,
    /// Let `POST /api/dlq/try` run a candidate handler uploaded with the
    /// admin token. Default false: uploading code to run is a permission of
    /// its own, apart from replay's, and `hopper dlq try` on the operator's
    /// own machine needs no server at all.
    #[serde(default)]
    pub allow_code_upload: bool,
}

fn default_listen() -> String {
    "127.0.0.1:9464".into()
}
fn default_true() -> bool {
    true
}

/// The admin server, resolved.
#[derive(Debug, Clone)]
pub struct Admin {
    pub listen: SocketAddr,
    /// From `admin.token`, else from `HOPPER_ADMIN_TOKEN`.
    pub token: Option<String>,
    pub metrics: bool,
    /// `admin.allow_code_upload`: `POST /api/dlq/try` runs uploaded code.
    pub allow_code_upload: bool,
    /// `admin.hosts`, lowercased.
    pub hosts: Vec<String>,
    /// Where the server listens once bound, shared with every route's
    /// allow-list so that no handler reaches it through a wildcard grant.
    /// Set here for a fixed port, by the server when it binds port 0.
    pub own: OwnEndpoint,
}

impl Admin {
    /// Reachable from other hosts: then a token is required to start.
    pub fn remote(&self) -> bool {
        !self.listen.ip().is_loopback()
    }
}

impl AdminConfig {
    pub(super) fn resolve(&self, problems: &mut Vec<String>) -> Option<Admin> {
        let before = problems.len();
        let listen = match self.listen.parse::<SocketAddr>() {
            Ok(listen) => Some(listen),
            Err(_) => {
                problems.push(format!(
                    "admin.listen `{}` is not an address and port such as 127.0.0.1:9464",
                    self.listen
                ));
                None
            }
        };
        let token = match &self.token {
            Some(token) if token.trim().is_empty() => {
                problems.push("admin.token is empty; remove it or give a token".into());
                None
            }
            Some(token) => Some(token.clone()),
            None => std::env::var(TOKEN_ENV)
                .ok()
                .filter(|t| !t.trim().is_empty()),
        };
        if let Some(listen) = listen
            && !listen.ip().is_loopback()
            && token.is_none()
        {
            problems.push(format!(
                "admin.listen `{listen}` is reachable from other hosts; set admin.token (or {TOKEN_ENV}) so that every call needs it"
            ));
        }
        let mut hosts = Vec::new();
        for host in &self.hosts {
            let valid = !host.is_empty()
                && host.len() <= 253
                && host.split('.').all(|l| {
                    !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                });
            if valid {
                hosts.push(host.to_ascii_lowercase());
            } else {
                problems.push(format!(
                    "admin.hosts entry `{host}` is not a host name such as hopper.example.com (no port, scheme or wildcard)"
                ));
            }
        }
        if problems.len() > before {
            return None;
        }
        let listen = listen?;
        let own = OwnEndpoint::default();
        if listen.port() != 0 {
            own.set(listen);
        }
        Some(Admin {
            listen,
            token,
            metrics: self.metrics,
            allow_code_upload: self.allow_code_upload,
            hosts,
            own,
        })
    }
}

/// How DLQ records are replayed, by the admin API and `hopper dlq replay`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayConfig {
    /// A record whose message was already replayed this many times is not
    /// replayed again: it goes back to its DLQ with reason REPLAY_LOOP.
    #[serde(default = "default_max_replays")]
    pub max_replays: u32,
    /// Records replayed per second, at most.
    #[serde(default = "default_rate")]
    pub rate: u32,
    /// Records one admin API replay may name one by one, at most; a
    /// filter's selection is of any size, streamed as a run.
    #[serde(default = "default_max_records")]
    pub max_records: usize,
}

fn default_max_replays() -> u32 {
    3
}
fn default_rate() -> u32 {
    50
}
fn default_max_records() -> usize {
    10_000
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            max_replays: default_max_replays(),
            rate: default_rate(),
            max_records: default_max_records(),
        }
    }
}

impl ReplayConfig {
    pub(super) fn check(&self, problems: &mut Vec<String>) {
        if self.rate == 0 || self.rate > 100_000 {
            problems.push(format!(
                "replay.rate must be between 1 and 100000 records per second, not {}",
                self.rate
            ));
        }
        if self.max_records == 0 {
            problems.push("replay.max_records must be at least 1".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> Result<Admin, Vec<String>> {
        let admin: AdminConfig = toml::from_str(text).map_err(|e| vec![e.to_string()])?;
        let mut problems = Vec::new();
        let resolved = admin.resolve(&mut problems);
        if problems.is_empty() {
            Ok(resolved.unwrap())
        } else {
            Err(problems)
        }
    }

    #[test]
    fn the_default_listens_on_loopback_only() {
        let admin = resolve("").unwrap();
        assert_eq!(admin.listen.to_string(), "127.0.0.1:9464");
        assert!(!admin.remote());
        assert!(admin.metrics);
        assert!(!admin.allow_code_upload, "uploading code is off by default");
        assert!(
            resolve("allow_code_upload = true")
                .unwrap()
                .allow_code_upload
        );
    }

    #[test]
    fn bad_settings_are_named() {
        let problems = resolve("listen = \"localhost\"\ntoken = \" \"\n").unwrap_err();
        assert_eq!(
            problems,
            vec![
                "admin.listen `localhost` is not an address and port such as 127.0.0.1:9464",
                "admin.token is empty; remove it or give a token",
            ]
        );
        let remote = resolve("listen = \"0.0.0.0:9464\"\ntoken = \"t\"\n").unwrap();
        assert!(remote.remote(), "reachable from other hosts, with a token");
        let problems =
            resolve("hosts = [\"ok.example\", \"*.example\", \"a.example:80\"]").unwrap_err();
        assert_eq!(
            problems,
            vec![
                "admin.hosts entry `*.example` is not a host name such as hopper.example.com (no port, scheme or wildcard)",
                "admin.hosts entry `a.example:80` is not a host name such as hopper.example.com (no port, scheme or wildcard)",
            ]
        );
        let err = toml::from_str::<AdminConfig>("listne = \"x\"").unwrap_err();
        assert!(err.to_string().contains("unknown field `listne`"), "{err}");
    }

    #[test]
    fn replay_limits_are_checked() {
        let replay: ReplayConfig = toml::from_str("rate = 0\nmax_records = 0").unwrap();
        let mut problems = Vec::new();
        replay.check(&mut problems);
        assert_eq!(
            problems,
            vec![
                "replay.rate must be between 1 and 100000 records per second, not 0",
                "replay.max_records must be at least 1",
            ]
        );
    }
}
