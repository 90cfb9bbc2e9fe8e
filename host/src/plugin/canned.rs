//! Canned HTTP: a handler's requests answered from a table instead of the
//! network, for `hopper plugin test` (crate::trial).
//!
//! Only the last step differs from a live request. The route's grants and
//! limits are checked first, by the same code (plugin/http.rs): a host the
//! route does not grant is denied before the table is looked at, and the
//! call's deadline bounds a slow answer. A request the grants allow is
//! answered by the first matching answer not used yet (the last matching one
//! repeats), or fails as a refused connection when nothing matches. Every
//! request, denied ones included, is written to the log that the test reads
//! back after the call.

use super::http::MAX_LOGGED;
use bytes::Bytes;
use http_body_util::BodyExt;
use std::sync::Mutex;
use std::time::Duration;
use wasmtime_wasi_http::{Error, WasiBody};

/// Request body bytes kept in the log; the rest is read and dropped.
pub const MAX_KEPT_BODY: usize = 1 << 20;

/// The answers for the call about to run, and the requests it made.
#[derive(Default)]
pub struct CannedHttp {
    // std Mutex: held to look up or record, never across an .await.
    script: Mutex<Script>,
}

#[derive(Default)]
struct Script {
    answers: Vec<Answer>,
    used: Vec<bool>,
    seen: Vec<SeenRequest>,
}

/// One canned answer: for a method (any, when `None`) and a URL (a prefix,
/// when it ends in `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub method: Option<String>,
    pub url: String,
    /// How long the answer takes to arrive. The call's deadline (and the
    /// route's `http.first_byte_timeout`) still applies: an answer slower
    /// than either is a timeout, as it would be live.
    pub delay: Duration,
    pub reply: Reply,
}

/// What a canned answer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Response {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// No response at all.
    Error(CannedError),
}

/// The ways a request can fail without a response, as the guest sees them
/// (`wasi:http`'s error codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CannedError {
    ConnectionRefused,
    ConnectionTimeout,
    Timeout,
    Dns,
    Reset,
    Tls,
}

impl CannedError {
    /// Every spelling a cases file may use, for its error messages.
    pub const NAMES: [&'static str; 6] = [
        "connection-refused",
        "connect-timeout",
        "timeout",
        "dns",
        "reset",
        "tls",
    ];

    pub fn parse(name: &str) -> Option<CannedError> {
        Some(match name {
            "connection-refused" => CannedError::ConnectionRefused,
            "connect-timeout" => CannedError::ConnectionTimeout,
            "timeout" => CannedError::Timeout,
            "dns" => CannedError::Dns,
            "reset" => CannedError::Reset,
            "tls" => CannedError::Tls,
            _ => return None,
        })
    }

    fn error(self) -> Error {
        match self {
            CannedError::ConnectionRefused => Error::ConnectionRefused,
            CannedError::ConnectionTimeout => Error::ConnectionTimeout,
            CannedError::Timeout => Error::HttpResponseTimeout,
            CannedError::Dns => Error::DnsError {
                rcode: Some("NXDOMAIN".into()),
                info_code: None,
            },
            CannedError::Reset => Error::ConnectionTerminated,
            CannedError::Tls => Error::TlsCertificateError,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CannedError::ConnectionRefused => "connection-refused",
            CannedError::ConnectionTimeout => "connect-timeout",
            CannedError::Timeout => "timeout",
            CannedError::Dns => "dns",
            CannedError::Reset => "reset",
            CannedError::Tls => "tls",
        }
    }
}

/// A request a handler made, in the order it made them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    pub method: String,
    /// `scheme://authority/path?query`, as the handler built it.
    pub url: String,
    pub headers: Vec<(String, Vec<u8>)>,
    /// The first [`MAX_KEPT_BODY`] bytes of its body.
    pub body: Vec<u8>,
    pub result: Seen,
}

/// What became of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A canned response with this status.
    Answered(u16),
    /// A canned error, or the answer came too late: the text says which.
    Failed(String),
    /// The route's grants refused it; the text says why.
    Denied(String),
    /// No canned answer matched; the handler saw a refused connection.
    Unanswered,
}

impl CannedHttp {
    /// Serves `answers` from now on, and forgets the requests seen so far.
    pub fn arm(&self, answers: Vec<Answer>) {
        let mut script = self.script.lock().unwrap();
        script.used = vec![false; answers.len()];
        script.answers = answers;
        script.seen.clear();
    }

    /// The requests seen since [`CannedHttp::arm`], in order.
    pub fn take_seen(&self) -> Vec<SeenRequest> {
        std::mem::take(&mut self.script.lock().unwrap().seen)
    }

    /// Records a request the grants refused.
    pub(super) fn denied(&self, method: &http::Method, uri: &http::Uri, why: String) {
        let seen = SeenRequest {
            method: method.to_string(),
            url: uri.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
            result: Seen::Denied(crate::headers::shorten(&why, MAX_LOGGED)),
        };
        self.script.lock().unwrap().seen.push(seen);
    }

    /// Answers a request the grants allow, no later than `head_timeout`.
    pub(super) async fn answer(
        &self,
        request: http::Request<WasiBody>,
        head_timeout: Duration,
        max_body: u64,
    ) -> Result<http::Response<WasiBody>, Error> {
        let (parts, body) = request.into_parts();
        let url = parts.uri.to_string();
        let method = parts.method.to_string();
        let headers: Vec<(String, Vec<u8>)> = parts
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        let body = keep(body).await;
        let (index, answer) = {
            let mut script = self.script.lock().unwrap();
            match pick(&script.answers, &script.used, &method, &url) {
                Some(i) => {
                    script.used[i] = true;
                    (Some(i), Some(script.answers[i].clone()))
                }
                None => (None, None),
            }
        };
        let record = |result: Seen| {
            self.script.lock().unwrap().seen.push(SeenRequest {
                method: method.clone(),
                url: url.clone(),
                headers: headers.clone(),
                body: body.clone(),
                result,
            });
        };
        let (Some(_), Some(answer)) = (index, answer) else {
            record(Seen::Unanswered);
            return Err(Error::ConnectionRefused);
        };
        if answer.delay >= head_timeout {
            tokio::time::sleep(head_timeout).await;
            record(Seen::Failed(format!(
                "no response in time: the answer takes {:?}, the request had {:?}",
                answer.delay, head_timeout
            )));
            return Err(Error::HttpResponseTimeout);
        }
        if !answer.delay.is_zero() {
            tokio::time::sleep(answer.delay).await;
        }
        match answer.reply {
            Reply::Error(error) => {
                record(Seen::Failed(error.as_str().to_string()));
                Err(error.error())
            }
            Reply::Response {
                status,
                headers: reply_headers,
                body: reply_body,
            } => {
                if reply_body.len() as u64 > max_body {
                    record(Seen::Failed(format!(
                        "the canned body of {} bytes is over the route's http.max_response_bytes ({max_body})",
                        reply_body.len()
                    )));
                    return Err(Error::HttpResponseBodySize(Some(max_body)));
                }
                record(Seen::Answered(status));
                let mut response = http::Response::builder().status(status);
                for (name, value) in &reply_headers {
                    response = response.header(name, value);
                }
                let body = http_body_util::Full::new(Bytes::from(reply_body))
                    .map_err(|never| match never {})
                    .boxed_unsync();
                response
                    .body(body)
                    .map_err(|e| Error::InternalError(Some(e.to_string())))
            }
        }
    }
}

/// The first [`MAX_KEPT_BODY`] bytes of a request body, reading it to the
/// end so that a guest writing it is never left waiting.
async fn keep(mut body: WasiBody) -> Vec<u8> {
    let mut kept = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Some(data) = frame.data_ref() {
            let room = MAX_KEPT_BODY.saturating_sub(kept.len());
            kept.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    kept
}

/// The answer for a request: the first matching one not used yet, else the
/// last matching one.
fn pick(answers: &[Answer], used: &[bool], method: &str, url: &str) -> Option<usize> {
    let matching: Vec<usize> = answers
        .iter()
        .enumerate()
        .filter(|(_, a)| matches(a, method, url))
        .map(|(i, _)| i)
        .collect();
    matching
        .iter()
        .copied()
        .find(|&i| !used[i])
        .or(matching.last().copied())
}

fn matches(answer: &Answer, method: &str, url: &str) -> bool {
    let method_ok = answer
        .method
        .as_deref()
        .is_none_or(|m| m.eq_ignore_ascii_case(method));
    let url_ok = match answer.url.strip_suffix('*') {
        Some(prefix) => url.starts_with(prefix),
        None => answer.url == url || answer.url == url.strip_suffix('/').unwrap_or(url),
    };
    method_ok && url_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(method: Option<&str>, url: &str, status: u16) -> Answer {
        Answer {
            method: method.map(str::to_string),
            url: url.into(),
            delay: Duration::ZERO,
            reply: Reply::Response {
                status,
                headers: Vec::new(),
                body: Vec::new(),
            },
        }
    }

    #[test]
    fn answers_are_used_in_order_and_the_last_repeats() {
        let answers = [
            answer(Some("GET"), "https://a.example/x", 503),
            answer(Some("GET"), "https://a.example/x", 200),
            answer(None, "https://a.example/p*", 204),
        ];
        let mut used = vec![false; 3];
        let mut next = |method: &str, url: &str| {
            let i = pick(&answers, &used, method, url)?;
            used[i] = true;
            Some(i)
        };
        assert_eq!(next("GET", "https://a.example/x"), Some(0));
        assert_eq!(next("GET", "https://a.example/x"), Some(1));
        assert_eq!(next("GET", "https://a.example/x"), Some(1));
        assert_eq!(next("POST", "https://a.example/x"), None);
        assert_eq!(next("DELETE", "https://a.example/p/1?q"), Some(2));
        assert_eq!(next("GET", "https://b.example/x"), None);
    }
}
