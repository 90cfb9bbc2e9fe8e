//! One call to the order service through `hopper:handler/http.fetch`: the
//! request in, the whole answer out. The export is synchronous and so is
//! `fetch`; the host counts the wait against the call's timeout.

use crate::hopper::handler::http::{self, Request};

/// Where to send the close request.
pub struct Url(String);

/// The service's answer.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// `{base}/orders/{order}/close`, with the order id percent-encoded as one
/// path segment. `base` is `http://host[:port][/prefix]` or `https://…`.
pub fn close_url(base: &str, order: &str) -> Result<Url, String> {
    let invalid = || format!("`order-service` is not an http(s) URL: `{base}`");
    let rest = base
        .strip_prefix("http://")
        .or_else(|| base.strip_prefix("https://"))
        .ok_or_else(invalid)?;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    if authority.is_empty() || rest.contains(['?', '#']) {
        return Err(invalid());
    }
    Ok(Url(format!(
        "{}/orders/{}/close",
        base.trim_end_matches('/'),
        percent_encode(order)
    )))
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

/// `POST url` with an empty body; `Err` with the host's `fetch-error` when
/// no answer came (refused, timed out, denied by the route's grants).
pub fn post(url: &Url) -> Result<Answer, String> {
    let response = http::fetch(&Request {
        method: "POST".into(),
        url: url.0.clone(),
        headers: Vec::new(),
        body: None,
    })
    .map_err(|e| format!("{e:?}"))?;
    Ok(Answer {
        status: response.status,
        body: response.body,
    })
}
