//! `hopper:handler/http.fetch` (WIT 0.1.3): outbound HTTP in one call.
//!
//! Only the two ends are its own: the WIT request checked and turned into
//! the request `wasi:http` would have built ([`Checked`]), and the response
//! read whole into the WIT response. In between a request takes the path
//! of a `wasi:http` one, through the same functions ([`HttpHooks::admit`]
//! and [`HttpHooks::send`]): the call's `http.max_requests`, the route's
//! grants and guarded addresses, the pooled transport (or the canned
//! answers of `hopper plugin test`), the timeouts and the call's deadline,
//! the trace context, and the same log lines, events and counters.

use super::bindings::hopper::handler::http::{FetchError, Request, Response};
use super::http::{HttpHooks, MAX_LOGGED, Refusal, Target, fetch_error_of};
use bytes::Bytes;
use http_body_util::BodyExt;
use wasmtime_wasi_http::{WasiBody, WasiHttpHooks};

impl HttpHooks {
    /// Sends `request` and reads the whole response, or says why not.
    pub(super) async fn fetch(&mut self, request: Request) -> Result<Response, FetchError> {
        let checked = self.check(request)?;
        self.admit(&checked.target)
            .map_err(|refusal| match refusal {
                Refusal::TooMany(limit) => FetchError::TooManyRequests(limit),
                other => FetchError::Denied(other.text(&checked.target)),
            })?;
        // Built only once the grants allow it: a refused request costs its
        // checks and no more.
        let request = checked.build()?;
        let deadline = self.deadline();
        let forbidden = self.forbidden_header_filter();
        let response = self
            .send(request, None)
            .await
            .map_err(|failure| failure.fetch_error())?;
        let (parts, body) = response.into_parts();
        // The body is read within the call's time, as a `wasi:http` guest's
        // reads are; its size is cut at `max_response_bytes` by the body.
        let body = match tokio::time::timeout_at(deadline.into(), body.collect()).await {
            Err(_) => {
                return Err(FetchError::Timeout(
                    "the response body was not read whole before the call's timeout".into(),
                ));
            }
            Ok(Err(e)) => return Err(fetch_error_of(e)),
            Ok(Ok(collected)) => collected.to_bytes(),
        };
        // The headers a `wasi:http` guest sees: the transport's own left out.
        let headers = parts
            .headers
            .iter()
            .filter(|&(name, _)| !forbidden(name))
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_string(), value)
            })
            .collect();
        Ok(Response {
            status: parts.status.as_u16(),
            headers,
            // The collected body is usually one buffer: taken, not copied.
            body: Vec::from(body),
        })
    }

    /// The request checked as `wasi:http`'s `handle` would check the same
    /// parts (plugin/http.rs, `outgoing`): an absolute http or https URL
    /// without user information, then the guest's headers, none of them
    /// one the transport owns. Each refusal names what is wrong; none
    /// counts against `max_requests`, as a request `wasi:http` cannot
    /// build does not.
    fn check(&mut self, request: Request) -> Result<Checked, FetchError> {
        let method = http::Method::from_bytes(request.method.as_bytes())
            .map_err(|_| invalid(format!("method {:?} is not an HTTP method", request.method)))?;
        let uri = http::Uri::try_from(request.url.as_str())
            .map_err(|e| invalid(format!("URL {:?} does not parse: {e}", request.url)))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => {
                return Err(invalid(format!(
                    "URL {:?} is not an absolute http:// or https:// URL",
                    request.url
                )));
            }
        }
        let Some(authority) = uri.authority().map(|a| a.as_str().to_string()) else {
            return Err(invalid(format!("URL {:?} has no host", request.url)));
        };
        // `user:pass@host` would go out in the `host` header and into the
        // logged URL; credentials belong in a header, which secrets redact.
        if authority.contains('@') {
            return Err(invalid(
                "the URL has user information: credentials go in a header".into(),
            ));
        }
        let forbidden = self.forbidden_header_filter();
        let length = request.body.as_ref().map_or(0, Vec::len);
        let mut has_length = false;
        let mut headers = Vec::with_capacity(request.headers.len());
        for (name, value) in &request.headers {
            let name = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| invalid(format!("header name {name:?} is not a valid name")))?;
            if forbidden(&name) {
                return Err(invalid(format!(
                    "header {name} is set by the transport, not the handler"
                )));
            }
            let value = http::HeaderValue::from_str(value).map_err(|_| {
                invalid(format!(
                    "the value of header {name} has a byte a header may not carry (a newline, say)"
                ))
            })?;
            if name == http::header::CONTENT_LENGTH {
                if has_length || value.to_str().ok() != Some(length.to_string().as_str()) {
                    return Err(invalid(format!(
                        "header content-length does not match the body's {length} bytes"
                    )));
                }
                has_length = true;
            }
            headers.push((name, value));
        }
        Ok(Checked {
            target: Target { method, uri },
            authority,
            headers,
            has_length,
            body: request.body,
        })
    }
}

/// A request whose parts are valid, not yet built.
struct Checked {
    target: Target,
    authority: String,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The guest gave a `content-length` (checked against the body).
    has_length: bool,
    body: Option<Vec<u8>>,
}

impl Checked {
    /// The request as `wasi:http`'s `handle` would build it from the same
    /// parts: a `host` header from its authority, then the guest's headers.
    fn build(self) -> Result<http::Request<WasiBody>, FetchError> {
        let Target { method, uri } = self.target;
        let mut builder = http::Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::HOST, self.authority.as_str());
        for (name, value) in self.headers {
            builder = builder.header(name, value);
        }
        // A body given whole goes out with its length, never chunked, in
        // the place a `wasi:http` guest that sets it puts it.
        if let Some(body) = &self.body
            && !self.has_length
        {
            builder = builder.header(http::header::CONTENT_LENGTH, body.len());
        }
        let body = match self.body {
            Some(body) => http_body_util::Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed_unsync(),
            None => http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed_unsync(),
        };
        builder
            .body(body)
            .map_err(|e| invalid(format!("the request cannot be built: {e}")))
    }
}

/// An `invalid-request` error, its text cut to what a log line keeps.
fn invalid(text: String) -> FetchError {
    FetchError::InvalidRequest(crate::headers::shorten(&text, MAX_LOGGED))
}
