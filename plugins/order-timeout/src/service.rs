//! One call to the order service through `wasi:http/outgoing-handler`, with
//! the `wasip2` crate's bindings. The export is synchronous, so the call
//! blocks on the response's pollable; the host counts that wait against the
//! call's timeout.

use std::io::Read as _;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, IncomingBody, Method, OutgoingRequest, Scheme};

/// Where to send the close request.
pub struct Url {
    https: bool,
    authority: String,
    path: String,
}

/// The service's answer.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// `{base}/orders/{order}/close`, with the order id percent-encoded as one
/// path segment. `base` is `http://host[:port][/prefix]` or `https://…`.
pub fn close_url(base: &str, order: &str) -> Result<Url, String> {
    let invalid = || format!("`order-service` is not an http(s) URL: `{base}`");
    let (https, rest) = if let Some(rest) = base.strip_prefix("http://") {
        (false, rest)
    } else if let Some(rest) = base.strip_prefix("https://") {
        (true, rest)
    } else {
        return Err(invalid());
    };
    let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.is_empty() || rest.contains(['?', '#']) {
        return Err(invalid());
    }
    Ok(Url {
        https,
        authority: authority.to_string(),
        path: format!(
            "{}/orders/{}/close",
            prefix.trim_end_matches('/'),
            percent_encode(order)
        ),
    })
}

/// Every byte but the URL's unreserved characters as `%XX`.
fn percent_encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `POST url` with an empty body; `Err` with the transport's error when no
/// answer came (refused, timed out, denied by the route's grants).
pub fn post(url: &Url) -> Result<Answer, String> {
    let request = OutgoingRequest::new(Fields::new());
    let scheme = if url.https {
        Scheme::Https
    } else {
        Scheme::Http
    };
    let valid = request.set_method(&Method::Post).is_ok()
        && request.set_scheme(Some(&scheme)).is_ok()
        && request.set_authority(Some(&url.authority)).is_ok()
        && request.set_path_with_query(Some(&url.path)).is_ok();
    if !valid {
        return Err(format!("invalid request to {}{}", url.authority, url.path));
    }
    let pending = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(format!("{code:?}")),
        Some(Err(())) | None => return Err("the response was lost".into()),
    };
    let status = response.status();
    let incoming = response.consume().map_err(|()| "no response body")?;
    let mut body = Vec::new();
    {
        // The stream is a child of the body: it must go first.
        let mut stream = incoming.stream().map_err(|()| "no response body")?;
        stream
            .read_to_end(&mut body)
            .map_err(|e| format!("reading the response: {e}"))?;
    }
    IncomingBody::finish(incoming);
    Ok(Answer { status, body })
}
