//! `wasi:http/outgoing-handler` for handlers: every request a guest sends
//! (each redirect hop is a new request from the guest's own client) is
//! checked against its route's grants here, then sent on the route's pooled
//! [`Transport`](crate::egress::Transport).
//!
//! A refused request fails `outgoing-handler.handle` itself with
//! `HTTP-request-denied` (or, past the per-call limit,
//! `connection-limit-reached`): nothing is spawned and the guest waits on
//! nothing ([`HttpHooks::refuse`], called by `GuestState::outgoing_handle`,
//! which stands in front of wasmtime-wasi-http's `handle`). A name that
//! resolves to a guarded address is refused when it is resolved, through
//! `future-incoming-response.get`. A refused request is logged with the
//! route and handler version within the handler's log budget, and counted.
//! Every request
//! counts against `http.max_requests`, denied ones too, so a handler looping
//! on a denied URL stops being served after that many. Logged URLs and
//! reasons are cut to [`MAX_LOGGED`] bytes (and room for a secret that
//! starts before the cut), then have secrets redacted.
//! Time waiting here counts against the call's `timeout`: a response head is
//! awaited at most until the call's deadline.
//!
//! `hopper:handler/http.fetch` (plugin/fetch.rs) sends through the same
//! functions, [`HttpHooks::admit`] and [`HttpHooks::send`]: only how a
//! request is built and how its outcome reaches the guest differ
//! ([`Failure`]).

use super::GuestInfo;
use super::bindings::hopper::handler::http::FetchError;
use crate::egress::{BodyError, Holding, LimitedBody, Refused, Scheme, SendError};
use crate::events;
use http_body_util::BodyExt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::p2::types::HostOutgoingRequest;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// Bytes of a URL or a reason kept in a log line or an event; a guest may
/// send a URL of 64 KiB.
pub(super) const MAX_LOGGED: usize = 256;

/// How long before its call's deadline a request stops waiting for its
/// host's limits (`http.hosts`): the guest's time to act on the refusal,
/// say by returning `retryable`, before the call is cut.
const LIMIT_RESERVE: Duration = Duration::from_millis(200);

/// The per-store side of a guest's HTTP: its route's grants (through the
/// guest info) and the current call's deadline and request count.
pub(super) struct HttpHooks {
    guest: Arc<GuestInfo>,
    deadline: Instant,
    requests: u32,
    /// The id of the message being handled, for events; its capacity kept
    /// from call to call.
    message_id: String,
}

type SendResult = Result<
    (
        http::Response<WasiBody>,
        Box<dyn Future<Output = Result<(), Error>> + Send>,
    ),
    Error,
>;

impl HttpHooks {
    pub(super) fn new(guest: Arc<GuestInfo>) -> HttpHooks {
        HttpHooks {
            guest,
            deadline: Instant::now(),
            requests: 0,
            message_id: String::new(),
        }
    }

    /// When the call in progress must end.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Arms the hooks for a new call.
    pub(super) fn begin(&mut self, message_id: &str, deadline: Instant) {
        self.message_id.clear();
        self.message_id.push_str(message_id);
        self.deadline = deadline;
        self.requests = 0;
    }

    /// Why a request to `target` may not be sent, if it may not. Every
    /// request counts against the call's limit, refused or not.
    fn refusal(&mut self, target: &Target) -> Option<Refusal> {
        let limit = self.guest.grants.config.http.max_requests;
        self.requests = self.requests.saturating_add(1);
        if self.requests > limit {
            return Some(Refusal::TooMany(limit));
        }
        self.outside_grants(target)
    }

    /// Why the route's grants refuse a request to `target`, if they do.
    fn outside_grants(&self, target: &Target) -> Option<Refusal> {
        if let Some(why) = &self.guest.grants.config.http_off {
            return Some(Refusal::Off(why.clone()));
        }
        let allowed = &self.guest.grants.config.allowed_hosts;
        if allowed.is_empty() {
            return Some(Refusal::NoHosts);
        }
        let Some((scheme, host, port)) = target.endpoint() else {
            return Some(Refusal::NoEndpoint);
        };
        if !allowed.allows(scheme, host, port) {
            return Some(Refusal::NotAllowed);
        }
        if let Ok(ip) = host.parse::<IpAddr>()
            && let Some(guard) = allowed.refuses(SocketAddr::new(ip, port))
        {
            return Some(Refusal::Guarded(ip, guard));
        }
        None
    }
}

/// Why the grants refuse a request. Its text, which allocates, is made
/// only when the refusal is logged or observed.
pub(super) enum Refusal {
    /// The call has made `http.max_requests` requests already.
    TooMany(u32),
    /// Every request, by the mode of a candidate's try
    /// (`Grants::http_off`), for this reason: expected, so not warned about.
    Off(String),
    NoHosts,
    NoEndpoint,
    NotAllowed,
    /// An IP address the allow-list names only through a wider entry.
    Guarded(IpAddr, crate::egress::Guard),
}

impl Refusal {
    fn error(&self) -> ErrorCode {
        match self {
            Refusal::TooMany(_) => ErrorCode::ConnectionLimitReached,
            _ => ErrorCode::HttpRequestDenied,
        }
    }

    pub(super) fn text(&self, target: &Target) -> String {
        const NO_ENDPOINT: &str = "the URL has no http or https scheme and host";
        match self {
            Refusal::TooMany(limit) => format!(
                "the call has made the {limit} requests a call may make, denied ones included (http.max_requests)"
            ),
            Refusal::Off(why) => why.clone(),
            Refusal::NoHosts => "the route grants no hosts (allowed_hosts is empty)".into(),
            Refusal::NoEndpoint => NO_ENDPOINT.into(),
            // The endpoint is read again only for the refusals that name it.
            Refusal::NotAllowed => match target.endpoint() {
                Some((scheme, host, port)) => {
                    format!(
                        "{}://{host}:{port} is not in allowed_hosts",
                        scheme.as_str()
                    )
                }
                None => NO_ENDPOINT.into(),
            },
            Refusal::Guarded(ip, guard) => match target.endpoint() {
                Some((_, _, port)) => {
                    format!("{ip}:{port} is {guard}, and no allowed_hosts entry names it")
                }
                None => NO_ENDPOINT.into(),
            },
        }
    }
}

impl HttpHooks {
    /// Checks a request of either API against the call's limit and the
    /// route's grants, and reports it when they refuse it: logged, counted,
    /// and recorded by `hopper plugin test`.
    pub(super) fn admit(&mut self, target: &Target) -> Result<(), Refusal> {
        let Some(refusal) = self.refusal(target) else {
            return Ok(());
        };
        if let Some(canned) = &self.guest.grants.canned {
            canned.denied(&target.method, &target.uri, refusal.text(target));
        }
        let expected = matches!(refusal, Refusal::Off(_));
        denied(&self.guest, &self.message_id, target, expected, || {
            refusal.text(target)
        });
        Err(refusal)
    }

    /// Checks a request the guest passes to `outgoing-handler.handle`
    /// against its grants: the error code to fail `handle` with, reported,
    /// when they refuse it. A request whose URL does not parse passes, for
    /// wasmtime-wasi-http's `handle` to give its own error.
    pub(super) fn refuse(&mut self, request: &HostOutgoingRequest) -> Option<ErrorCode> {
        let target = Target::of(request)?;
        self.admit(&target).err().map(|refusal| refusal.error())
    }
}

impl HttpHooks {
    /// Sends a request the grants allow through the route's transport: the
    /// response head, or why there is none. The future holds the guest info
    /// and the route's transport by `Arc`, never the store; dropped
    /// mid-request (the guest dropped its future-incoming-response, or the
    /// store went with a call that ran out of time), it closes that
    /// connection instead of pooling it.
    pub(super) fn send(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> impl Future<Output = Result<http::Response<WasiBody>, Failure>> + Send + 'static {
        // The call's trace continues in the service it calls.
        crate::trace::propagate(request.headers_mut());
        let target = Target {
            method: request.method().clone(),
            uri: request.uri().clone(),
        };
        let report = Report {
            guest: self.guest.clone(),
            message_id: Arc::from(self.message_id.as_str()),
            target,
        };
        // `outgoing-handler.handle` refused and counted the request already
        // if the grants refuse it ([`HttpHooks::refuse`]); checked again
        // here, uncounted, so that nothing outside the grants is ever sent.
        let refused = self
            .outside_grants(&report.target)
            .map(|refusal| refusal.text(&report.target));
        let limits = &self.guest.grants.config.http;
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let head_timeout = [
            Some(remaining),
            limits.first_byte_timeout,
            options.and_then(|o| o.first_byte_timeout),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(remaining);
        let between_bytes = options.and_then(|o| o.between_bytes_timeout);
        let max_body = limits.max_response_bytes;
        let deadline = tokio::time::Instant::from_std(self.deadline);
        // A request waits for its host's limits until shortly before the
        // call's deadline, so the guest has time to act on the refusal.
        let wait_until = deadline.checked_sub(LIMIT_RESERVE).unwrap_or(deadline);
        async move {
            if let Some(reason) = refused {
                report.denied(reason.clone());
                return Err(Failure::Denied(reason));
            }
            if let Some(canned) = &report.guest.grants.canned {
                return canned
                    .answer(request, head_timeout, max_body)
                    .await
                    .map_err(Failure::Canned);
            }
            // The host's limits (`http.hosts`): the request waits its turn
            // here, within the call's deadline, holding no thread.
            let (permit, waited, head_timeout) = match report.limiter() {
                None => (None, None, head_timeout),
                Some(limiter) => match limiter.turn(wait_until).await {
                    Ok(turn) => {
                        report.waited(turn.waited);
                        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                        (turn.permit, Some(turn.waited), head_timeout.min(left))
                    }
                    Err(refused) => {
                        report.waited(refused.waited);
                        report.limited(&refused);
                        return Err(Failure::Limited(refused));
                    }
                },
            };
            let started = Instant::now();
            let transport = report
                .guest
                .grants
                .transport
                .as_ref()
                .expect("a route with allowed hosts has a transport");
            match transport.send(request, head_timeout).await {
                Ok(response) => {
                    report.answered(Ok(response.status().as_u16()), started.elapsed(), waited);
                    let length = response
                        .headers()
                        .get(http::header::CONTENT_LENGTH)
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                    if length.is_some_and(|n| n > max_body) {
                        // Refused before a byte of the body is read; the
                        // connection closes with the response.
                        return Err(Failure::TooLarge(max_body));
                    }
                    Ok(response.map(|body| {
                        let body = LimitedBody::new(body, max_body, between_bytes)
                            .map_err(body_error)
                            .boxed_unsync();
                        match permit {
                            // In flight until its body is read or dropped.
                            Some(permit) => Holding::new(body, Some(permit)).boxed_unsync(),
                            None => body,
                        }
                    }))
                }
                Err(e @ SendError::Guarded { .. }) => {
                    let reason = e.to_string();
                    report.denied(reason.clone());
                    Err(Failure::Denied(reason))
                }
                Err(SendError::Timeout) => {
                    report.answered(Err(&SendError::Timeout), started.elapsed(), waited);
                    Err(Failure::Timeout(head_timeout))
                }
                Err(e) => {
                    report.answered(Err(&e), started.elapsed(), waited);
                    Err(Failure::Send(e))
                }
            }
        }
    }

    /// A request the grants allow, on its way: what `outgoing-handler.handle`
    /// hands the guest as its `future-incoming-response`.
    pub(super) fn pending(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> PendingResponse {
        let streams_body = !http_body::Body::is_end_stream(request.body());
        let send = self.send(request, options);
        let send = async move { send.await.map_err(Failure::code) };
        if streams_body {
            // The guest may write the body after `handle`, more than its
            // buffer holds: the send must run without waiting for the guest.
            return PendingResponse::Spawned(wasmtime_wasi::runtime::spawn(send));
        }
        let mut pending = PendingResponse::Sending(Box::pin(send));
        // Under way at once: on a pooled connection this hands the request
        // to its connection's task.
        pending.poll_once();
        pending
    }
}

/// Why a request the grants let through got no response head, for each
/// API to tell its guest in its own terms ([`Failure::code`] for
/// `wasi:http`, [`Failure::fetch_error`] for `fetch`).
pub(super) enum Failure {
    /// Refused on the way: the name resolved only to guarded addresses, or
    /// the connection reached hopper's own admin server. The text says
    /// which.
    Denied(String),
    /// No response head within this long (the route's
    /// `http.first_byte_timeout`, or what was left of the call's time).
    Timeout(Duration),
    /// A `content-length` above `http.max_response_bytes` (given).
    TooLarge(u64),
    /// The transport's error.
    Send(SendError),
    /// A canned answer's error (`hopper plugin test`).
    Canned(Error),
    /// Held by the host's limits (`http.hosts`) until the call's deadline
    /// came, or its turn under `rate` would have come after it; not sent.
    Limited(Refused),
}

impl Failure {
    /// The `wasi:http` error, as wasmtime-wasi-http gives it for the same
    /// failure.
    fn code(self) -> Error {
        match self {
            Failure::Denied(_) => Error::HttpRequestDenied,
            Failure::Timeout(_) => Error::HttpResponseTimeout,
            Failure::TooLarge(max_body) => Error::HttpResponseBodySize(Some(max_body)),
            Failure::Send(e) => send_error(e),
            Failure::Canned(e) => e,
            // Given by `future-incoming-response.get`, where `handle`'s
            // `connection-limit-reached` is `http.max_requests`'s.
            Failure::Limited(_) => Error::ConnectionLimitReached,
        }
    }

    /// The `fetch-error` of `hopper:handler/http.fetch`, its text naming
    /// what went wrong.
    pub(super) fn fetch_error(self) -> FetchError {
        match self {
            Failure::Denied(reason) => FetchError::Denied(reason),
            Failure::Timeout(waited) => FetchError::Timeout(format!(
                "no response head within {waited:?} (http.first_byte_timeout, or what was left of the call's timeout)"
            )),
            Failure::TooLarge(max_body) => FetchError::TooLarge(max_body),
            Failure::Send(e) => {
                let text = e.to_string();
                match e {
                    SendError::Guarded { .. } => FetchError::Denied(text),
                    SendError::Dns { .. } => FetchError::Dns(text),
                    SendError::ConnectTimeout => {
                        FetchError::Timeout("no connection within http.connect_timeout".into())
                    }
                    SendError::Timeout => FetchError::Timeout(text),
                    SendError::Connect { .. } => FetchError::Connection(text),
                    SendError::TlsCertificate(_) | SendError::Tls(_) => FetchError::Tls(text),
                    SendError::Protocol(_) => FetchError::Protocol(text),
                }
            }
            Failure::Canned(e) => fetch_error_of(e),
            // `timeout`, its text starting `waited`: fetch-error has no case
            // of its own for it (docs/wit.md).
            Failure::Limited(refused) => FetchError::Timeout(refused.to_string()),
        }
    }
}

/// The `fetch-error` for a `wasi:http` error: a canned answer's, or a
/// response body's.
pub(super) fn fetch_error_of(e: Error) -> FetchError {
    let text = e.to_string();
    match e {
        Error::HttpRequestDenied => FetchError::Denied(text),
        Error::HttpResponseBodySize(limit) => FetchError::TooLarge(limit.unwrap_or_default()),
        Error::DnsError { .. } | Error::DnsTimeout => FetchError::Dns(text),
        Error::ConnectionTimeout
        | Error::ConnectionReadTimeout
        | Error::ConnectionWriteTimeout
        | Error::HttpResponseTimeout => FetchError::Timeout(text),
        Error::ConnectionRefused
        | Error::ConnectionTerminated
        | Error::DestinationUnavailable
        | Error::DestinationNotFound => FetchError::Connection(text),
        Error::TlsCertificateError | Error::TlsProtocolError | Error::TlsAlertReceived { .. } => {
            FetchError::Tls(text)
        }
        _ => FetchError::Protocol(text),
    }
}

/// A request's send, polled by its guest's wait.
type Sending = Pin<Box<dyn Future<Output = Result<http::Response<WasiBody>, Error>> + Send>>;

/// hopper's `future-incoming-response`, in place of wasmtime-wasi-http's.
///
/// wasmtime-wasi-http runs each request as a task of its own, which the
/// guest's pollable waits on, and spawns a second task once the response
/// arrives. The response then went from hyper's connection task to the send
/// task to the partition's task, each hand-off a wake-up, and tokio woke the
/// other worker thread for some of them (BENCHMARKS.md, "The HTTP path's
/// hand-offs"). A request without a body is sent here by the guest's own
/// wait, in the partition's task, so the response wakes that task
/// directly; it is polled once when it is made, and by `get`, so it is on
/// its way before the guest waits and a guest that loops on `get` makes
/// progress. A request with a body keeps a task of its own: the guest may
/// write the body after `handle`, and the body's buffer drains only while
/// the request is sent. Dropped, the send stops and its connection closes.
pub(crate) enum PendingResponse {
    Sending(Sending),
    Spawned(wasmtime_wasi::runtime::AbortOnDropJoinHandle<Result<http::Response<WasiBody>, Error>>),
    Ready(Result<http::Response<WasiBody>, Error>),
    Consumed,
}

impl PendingResponse {
    /// Polls the send once, without a waker: `get` and `handle` look, the
    /// guest's wait waits.
    fn poll_once(&mut self) {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let polled = match self {
            PendingResponse::Sending(send) => send.as_mut().poll(&mut cx),
            PendingResponse::Spawned(task) if task.is_finished() => Pin::new(task).poll(&mut cx),
            _ => return,
        };
        if let std::task::Poll::Ready(result) = polled {
            *self = PendingResponse::Ready(result);
        }
    }

    /// The response once it is there, taken: `None` while it is on its
    /// way, `Some(None)` when it was taken already.
    pub(super) fn take(&mut self) -> Option<Option<Result<http::Response<WasiBody>, ErrorCode>>> {
        self.poll_once();
        match std::mem::replace(self, PendingResponse::Consumed) {
            PendingResponse::Ready(result) => Some(Some(result.map_err(error_code))),
            PendingResponse::Consumed => Some(None),
            on_its_way => {
                *self = on_its_way;
                None
            }
        }
    }
}

#[async_trait::async_trait]
impl wasmtime_wasi::p2::Pollable for PendingResponse {
    async fn ready(&mut self) {
        let result = match self {
            PendingResponse::Sending(send) => send.await,
            PendingResponse::Spawned(task) => task.await,
            PendingResponse::Ready(_) | PendingResponse::Consumed => return,
        };
        *self = PendingResponse::Ready(result);
    }
}

/// The `wasi:http` error code for an error of [`HttpHooks::send`], as
/// wasmtime-wasi-http gives it for the same error.
fn error_code(e: Error) -> ErrorCode {
    use wasmtime_wasi_http::p2::bindings::http::types::DnsErrorPayload;
    match e {
        Error::HttpRequestDenied => ErrorCode::HttpRequestDenied,
        Error::HttpResponseBodySize(limit) => ErrorCode::HttpResponseBodySize(limit),
        Error::DnsError { rcode, info_code } => {
            ErrorCode::DnsError(DnsErrorPayload { rcode, info_code })
        }
        Error::ConnectionTimeout => ErrorCode::ConnectionTimeout,
        Error::ConnectionTerminated => ErrorCode::ConnectionTerminated,
        Error::DestinationUnavailable => ErrorCode::DestinationUnavailable,
        Error::ConnectionRefused => ErrorCode::ConnectionRefused,
        Error::TlsCertificateError => ErrorCode::TlsCertificateError,
        Error::TlsProtocolError => ErrorCode::TlsProtocolError,
        Error::HttpResponseTimeout => ErrorCode::HttpResponseTimeout,
        Error::HttpProtocolError => ErrorCode::HttpProtocolError,
        Error::ConnectionLimitReached => ErrorCode::ConnectionLimitReached,
        other => ErrorCode::InternalError(Some(other.to_string())),
    }
}

/// The request a guest built, as wasmtime-wasi-http's `handle` converts it
/// (50.0.1): a `content-length` checked against the body, a missing scheme
/// taken as https, a `host` header from the authority, then the guest's
/// headers. An authority with user information (`user:pass@host`) is
/// refused with `HTTP-request-URI-invalid`.
pub(super) fn outgoing(request: HostOutgoingRequest) -> Result<http::Request<WasiBody>, ErrorCode> {
    use wasmtime_wasi_http::p2::bindings::http::types::Scheme as WasiScheme;
    let length = content_length(&request.headers)?;
    if request.body.is_none() && length.is_some_and(|n| n != 0) {
        return Err(ErrorCode::HttpRequestBodySize(Some(0)));
    }
    let method = method_of(&request.method).ok_or(ErrorCode::HttpRequestMethodInvalid)?;
    let scheme = match request.scheme {
        None | Some(WasiScheme::Https) => http::uri::Scheme::HTTPS,
        Some(WasiScheme::Http) => http::uri::Scheme::HTTP,
        Some(WasiScheme::Other(other)) => {
            let scheme = http::uri::Scheme::try_from(other.as_str())
                .map_err(|_| ErrorCode::HttpProtocolError)?;
            if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
                return Err(ErrorCode::HttpProtocolError);
            }
            scheme
        }
    };
    let authority = request.authority.unwrap_or_default();
    // `user:pass@host` would go out as the `host` header and into the
    // logged URL; credentials belong in a header, which secrets redact.
    if authority.contains('@') {
        return Err(ErrorCode::HttpRequestUriInvalid);
    }
    let mut uri = http::Uri::builder()
        .scheme(scheme)
        .authority(authority.as_str());
    if let Some(path) = request.path_with_query {
        uri = uri.path_and_query(path);
    }
    let uri = uri
        .build()
        .map_err(wasmtime_wasi_http::p2::http_request_error)?;
    let mut builder = http::Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::HOST, authority.as_str());
    for (name, value) in request.headers.iter() {
        builder = builder.header(name, value);
    }
    let body = request.body.unwrap_or_else(|| {
        http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync()
    });
    builder
        .body(body)
        .map_err(|e| ErrorCode::InternalError(Some(e.to_string())))
}

/// The request's one `content-length`, as wasmtime-wasi-http reads it: only
/// digits, and not given twice.
fn content_length(headers: &http::HeaderMap) -> Result<Option<u64>, ErrorCode> {
    let invalid = |why: String| ErrorCode::InternalError(Some(why));
    let mut values = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid("multiple `content-length` header values".into()));
    }
    let text = value.to_str().unwrap_or_default();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(format!(
            "invalid `content-length` header value: {text:?}"
        )));
    }
    text.parse()
        .map(Some)
        .map_err(|e| invalid(format!("invalid `content-length` header value: {e}")))
}

/// wasmtime-wasi-http's own `handle` sends through this hook. hopper's
/// `handle` stands in front of it (`GuestState::outgoing_handle`), so it is
/// reached only if that ever changes; it sends the same way.
impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _request_done: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        let send = self.send(request, options);
        Box::new(async move {
            let response = send.await.map_err(Failure::code)?;
            let done: Box<dyn Future<Output = Result<(), Error>> + Send> =
                Box::new(std::future::ready(Ok(())));
            Ok((response, done))
        })
    }
}

/// Where a request goes, as far as checks and logs need it. Cheap to make
/// (the URI's parts are shared, not copied); the text for logs and events is
/// built only when a line is logged or someone observes.
pub(super) struct Target {
    pub(super) method: http::Method,
    pub(super) uri: http::Uri,
}

impl Target {
    /// The target of a request a guest made, as wasmtime-wasi-http will
    /// send it (a request without a scheme is https); `None` when its URL
    /// does not parse or has a scheme of another spelling.
    fn of(request: &HostOutgoingRequest) -> Option<Target> {
        use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
        let method = method_of(&request.method)?;
        let scheme = match &request.scheme {
            None | Some(Scheme::Https) => http::uri::Scheme::HTTPS,
            Some(Scheme::Http) => http::uri::Scheme::HTTP,
            // wasmtime-wasi-http's error for it, or its http(s) spelled
            // another way, which `send_request` checks.
            Some(Scheme::Other(_)) => return None,
        };
        let mut uri = http::Uri::builder()
            .scheme(scheme)
            .authority(request.authority.as_deref().unwrap_or_default());
        if let Some(path) = &request.path_with_query {
            uri = uri.path_and_query(path.as_str());
        }
        Some(Target {
            method,
            uri: uri.build().ok()?,
        })
    }

    /// Scheme, host (without IPv6 brackets) and port, when the URI is an
    /// http or https one with a host.
    fn endpoint(&self) -> Option<(Scheme, &str, u16)> {
        let scheme = match self.uri.scheme_str()? {
            s if s.eq_ignore_ascii_case("http") => Scheme::Http,
            s if s.eq_ignore_ascii_case("https") => Scheme::Https,
            _ => return None,
        };
        let host = self.uri.host()?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = self.uri.port_u16().unwrap_or(scheme.default_port());
        Some((scheme, host, port))
    }

    /// `scheme://authority/path`, without the query (which may carry
    /// tokens), every secret value redacted (percent-encoded ones too),
    /// then cut to [`MAX_LOGGED`] bytes: redacting first, so no cut leaves
    /// the start of a secret behind.
    fn url(&self, guest: &GuestInfo) -> String {
        // Never user information: [`outgoing`] refuses it, and this would
        // not show it.
        let authority = self.uri.authority().map_or("", |a| a.as_str());
        let url = format!(
            "{}://{}{}",
            self.uri.scheme_str().unwrap_or(""),
            authority.rsplit('@').next().unwrap_or_default(),
            self.uri.path()
        );
        redacted(guest, &url)
    }
}

/// Logs, counts and broadcasts what became of one request.
struct Report {
    guest: Arc<GuestInfo>,
    message_id: Arc<str>,
    target: Target,
}

/// A guest's request method as `http`'s; `None` for a custom method that
/// is not a valid token.
fn method_of(
    method: &wasmtime_wasi_http::p2::bindings::http::types::Method,
) -> Option<http::Method> {
    use wasmtime_wasi_http::p2::bindings::http::types::Method;
    Some(match method {
        Method::Get => http::Method::GET,
        Method::Head => http::Method::HEAD,
        Method::Post => http::Method::POST,
        Method::Put => http::Method::PUT,
        Method::Delete => http::Method::DELETE,
        Method::Connect => http::Method::CONNECT,
        Method::Options => http::Method::OPTIONS,
        Method::Trace => http::Method::TRACE,
        Method::Patch => http::Method::PATCH,
        Method::Other(m) => http::Method::from_bytes(m.as_bytes()).ok()?,
    })
}

/// `text` with the guest's secrets redacted, cut to [`MAX_LOGGED`] bytes
/// (cut first: [`crate::config::Secrets::redact_within`]).
fn redacted(guest: &GuestInfo, text: &str) -> String {
    guest
        .grants
        .config
        .secrets
        .redact_within(text, MAX_LOGGED)
        .into_owned()
}

impl Report {
    fn denied(&self, reason: String) {
        denied(&self.guest, &self.message_id, &self.target, false, || {
            reason
        });
    }

    /// The limits of the request's host, if it has any.
    fn limiter(&self) -> Option<&crate::egress::HostLimiter> {
        let (scheme, host, port) = self.target.endpoint()?;
        self.guest.grants.limiter(scheme, host, port)
    }

    /// Times a limited request's wait (`hopper_http_wait_seconds`).
    fn waited(&self, waited: Duration) {
        if let Some(histogram) = &self.guest.grants.http_wait {
            histogram.observe(waited);
        }
    }

    /// Reports a request its host's limits held past the call's deadline
    /// ([`events::HttpCounters::limited`]).
    fn limited(&self, refused: &Refused) {
        let g = &*self.guest;
        g.grants.http.limited(
            &g.grants.telemetry,
            || g.budget.take(),
            || events::HttpLimited {
                route: g.route.clone(),
                handler: g.handler.clone(),
                id: self.message_id.to_string(),
                version: g.version.clone(),
                method: self.target.method.to_string(),
                url: self.target.url(g),
                reason: refused.to_string(),
                waited: refused.waited,
            },
        );
    }

    /// Reports the request's outcome ([`events::HttpCounters::answered`]).
    fn answered(&self, result: Result<u16, &SendError>, took: Duration, waited: Option<Duration>) {
        let g = &*self.guest;
        let status = result.ok();
        g.grants.http.answered(&g.grants.telemetry, status, || {
            let t = &self.target;
            events::HttpRequest {
                route: g.route.clone(),
                handler: g.handler.clone(),
                id: self.message_id.to_string(),
                version: g.version.clone(),
                method: t.method.to_string(),
                url: t.url(g),
                status,
                // A DNS error names the host, which the guest chose.
                error: result.err().map(|e| redacted(g, &e.to_string())),
                took,
                waited,
            }
        });
    }
}

/// Reports a refused request ([`events::HttpCounters::denied`]), logged
/// within the handler's log budget: as a warning, or at debug when the
/// refusal is `expected` (a try's own mode). The reason is made only when
/// it is logged or observed.
fn denied(
    g: &GuestInfo,
    message_id: &str,
    t: &Target,
    expected: bool,
    reason: impl FnOnce() -> String,
) {
    g.grants.http.denied(
        &g.grants.telemetry,
        expected,
        || g.budget.take(),
        || events::HttpDenied {
            route: g.route.clone(),
            handler: g.handler.clone(),
            id: message_id.to_string(),
            version: g.version.clone(),
            method: t.method.to_string(),
            url: t.url(g),
            // The reason may carry the host, the guest's own text.
            reason: redacted(g, &reason()),
            expected,
        },
    );
}

/// The `wasi:http` error code a guest sees for a failed request.
fn send_error(e: SendError) -> Error {
    use std::io::ErrorKind;
    match e {
        SendError::Guarded { .. } => Error::HttpRequestDenied,
        SendError::Dns { detail, .. } => Error::DnsError {
            rcode: Some(detail),
            info_code: None,
        },
        SendError::ConnectTimeout => Error::ConnectionTimeout,
        SendError::Connect { kind, .. } => match kind {
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => {
                Error::ConnectionTerminated
            }
            ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => {
                Error::DestinationUnavailable
            }
            _ => Error::ConnectionRefused,
        },
        SendError::TlsCertificate(_) => Error::TlsCertificateError,
        SendError::Tls(_) => Error::TlsProtocolError,
        SendError::Timeout => Error::HttpResponseTimeout,
        SendError::Protocol(_) => Error::HttpProtocolError,
    }
}

/// The error a guest's body stream fails with. `wasi:io/error`'s
/// `to-debug-string` gives its text.
fn body_error(e: BodyError) -> Error {
    match e {
        BodyError::TooLarge { limit } => Error::HttpResponseBodySize(Some(limit)),
        BodyError::Stalled(_) => Error::ConnectionReadTimeout,
        BodyError::Transport(_) => Error::HttpResponseIncomplete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime_wasi_http::FieldMap;
    use wasmtime_wasi_http::p2::bindings::http::types::{Method, Scheme as WasiScheme};

    fn lengths(values: &[&[u8]]) -> Result<Option<u64>, ErrorCode> {
        let mut headers = http::HeaderMap::new();
        for value in values {
            headers.append(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        content_length(&headers)
    }

    #[test]
    fn a_content_length_is_read_as_wasmtime_wasi_http_reads_it() {
        assert!(matches!(lengths(&[]), Ok(None)));
        assert!(matches!(lengths(&[b"0"]), Ok(Some(0))));
        assert!(matches!(
            lengths(&[b"18446744073709551615"]),
            Ok(Some(u64::MAX))
        ));
        for bad in [
            b"" as &[u8],
            b"+5",
            b"-1",
            b"18446744073709551616",
            b"1 2",
            b"0x10",
            b"\xff\xfe",
        ] {
            assert!(
                matches!(lengths(&[bad]), Err(ErrorCode::InternalError(Some(_)))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            lengths(&[b"1", b"1"]),
            Err(ErrorCode::InternalError(Some(_)))
        ));
    }

    fn request(
        method: Method,
        scheme: Option<WasiScheme>,
        authority: &str,
        path: &str,
    ) -> Result<http::Request<WasiBody>, ErrorCode> {
        outgoing(HostOutgoingRequest {
            method,
            scheme,
            authority: Some(authority.to_string()),
            path_with_query: Some(path.to_string()),
            headers: FieldMap::default(),
            body: None,
        })
    }

    #[test]
    fn a_request_converts_or_gets_the_error_wasmtime_wasi_http_gives() {
        let sent = request(Method::Get, None, "example.com:8080", "/a?b=c").unwrap();
        assert_eq!(sent.method(), http::Method::GET);
        assert_eq!(sent.uri(), "https://example.com:8080/a?b=c");
        assert_eq!(sent.headers()[http::header::HOST], "example.com:8080");
        let plain = request(Method::Post, Some(WasiScheme::Http), "h", "/").unwrap();
        assert_eq!(plain.uri(), "http://h/");
        let spelled = request(
            Method::Get,
            Some(WasiScheme::Other("http".into())),
            "h",
            "/",
        );
        assert_eq!(spelled.unwrap().uri(), "http://h/");

        let method = request(Method::Other("not a token".into()), None, "h", "/");
        assert!(matches!(method, Err(ErrorCode::HttpRequestMethodInvalid)));
        for scheme in ["ftp", "", "ht tp", "HTTP"] {
            let other = request(
                Method::Get,
                Some(WasiScheme::Other(scheme.into())),
                "h",
                "/",
            );
            assert!(
                matches!(other, Err(ErrorCode::HttpProtocolError)),
                "{scheme:?}: {other:?}"
            );
        }
        for (authority, path) in [
            ("", "/"),
            ("h", "no slash"),
            ("h", "/a b"),
            ("h\u{7f}", "/"),
        ] {
            let bad = request(Method::Get, None, authority, path);
            assert!(bad.is_err(), "{authority:?} {path:?}: {bad:?}");
        }
        // Regression: user information reached the `host` header and the
        // logged URL.
        for authority in ["user:pass@h", "user@h:8080", "@h", "a@b@h"] {
            let refused = request(Method::Get, None, authority, "/");
            assert!(
                matches!(refused, Err(ErrorCode::HttpRequestUriInvalid)),
                "{authority:?}: {refused:?}"
            );
        }
    }
}
