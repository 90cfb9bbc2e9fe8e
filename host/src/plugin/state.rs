//! What a store holds for one guest, and the host functions the guest may
//! call: logging, its route's config values, and what the route grants:
//! emitting records ([`super::emit`]), reading secrets, and outbound HTTP
//! ([`super::http`], and `fetch` in [`super::fetch`]).

use super::GuestInfo;
use super::bindings::hopper::handler::{
    config as wit_config, emit as wit_emit, http as wit_http, log as wit_log,
    secrets as wit_secrets, types,
};
use super::emit::Emits;
use super::http::HttpHooks;
use super::http::PendingResponse;
use super::output::{GuestOutput, Written};
use std::sync::Arc;
use std::time::Instant;
use wasmtime::component::Resource;
use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::FieldMap;
use wasmtime_wasi_http::p2::bindings::http::types::{ErrorCode, RequestOptions};
use wasmtime_wasi_http::p2::body::HostIncomingBody;
use wasmtime_wasi_http::p2::types::{HostIncomingResponse, HostOutgoingRequest};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

/// Per-store state: the WASI context (stdio, clocks and randomness only),
/// the limits, the captured output, the current call's deadline and
/// emitted records, and the guest info the host functions tag their output
/// with.
pub(super) struct GuestState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: HttpHooks,
    table: ResourceTable,
    pub(super) limits: Limits,
    guest: Arc<GuestInfo>,
    /// When the call in progress must stop. Read by the epoch callback, and
    /// set again before every call, since a warm store serves many calls.
    pub(super) deadline: Instant,
    pub(super) emits: Emits,
    stdout: GuestOutput,
    stderr: GuestOutput,
    written: Written,
}

impl GuestState {
    pub(super) fn new(guest: &Arc<GuestInfo>, memory_bytes: usize) -> GuestState {
        let written = Written::default();
        let stdout = GuestOutput::new(guest.clone(), "stdout", written.clone());
        let stderr = GuestOutput::new(guest.clone(), "stderr", written.clone());
        // No args, environment, preopened directories or sockets: stdout and
        // stderr go to the log, and the clocks and randomness every language
        // runtime expects are the host's (docs/operations.md, grants). HTTP
        // goes through `wasi:http` and the route's allow-list, never through
        // sockets.
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build();
        GuestState {
            wasi,
            http: WasiHttpCtx::new(),
            hooks: HttpHooks::new(guest.clone()),
            table: ResourceTable::new(),
            limits: Limits {
                inner: StoreLimitsBuilder::new()
                    .memory_size(memory_bytes)
                    .instances(64)
                    .build(),
                cap: memory_bytes,
                denied: None,
            },
            guest: guest.clone(),
            deadline: Instant::now(),
            emits: Emits::default(),
            stdout,
            stderr,
            written,
        }
    }

    /// Logs what the call wrote to stdout and stderr, and returns the first
    /// lines of stderr (a Rust guest's panic message arrives there). Takes
    /// no lock when the guest wrote nothing.
    pub(super) fn flush_output(&mut self) -> Option<String> {
        if !self.written.take() {
            return None;
        }
        // Read before the flush empties it.
        let summary = self.stderr.summary();
        self.stdout.flush_to_log();
        self.stderr.flush_to_log();
        summary
    }

    /// Arms the state for a call on message `message_id` that must end by
    /// `deadline`.
    pub(super) fn begin(&mut self, message_id: &str, deadline: Instant) {
        self.deadline = deadline;
        self.limits.denied = None;
        self.hooks.begin(message_id, deadline);
        self.emits.begin(message_id);
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl GuestState {
    /// `wasi:http/outgoing-handler.handle`: a request the route's grants
    /// refuse fails `handle` itself, with nothing spawned and nothing for
    /// the guest to wait on; one they allow is converted as
    /// wasmtime-wasi-http's `handle` converts it, and becomes hopper's own
    /// `future-incoming-response` ([`PendingResponse`]).
    pub(super) fn outgoing_handle(
        &mut self,
        request: Resource<HostOutgoingRequest>,
        options: Option<Resource<RequestOptions>>,
    ) -> wasmtime::Result<Result<Resource<PendingResponse>, ErrorCode>> {
        if let Some(error) = self.hooks.refuse(self.table.get(&request)?) {
            // Dropped with its body, as a sent request is.
            self.table.delete(request)?;
            return Ok(Err(error));
        }
        // As wasmtime-wasi-http's `handle`: the options are read, not taken.
        let options = options.and_then(|o| self.table.get(&o).ok()).cloned();
        let request = match super::http::outgoing(self.table.delete(request)?) {
            Ok(request) => request,
            Err(code) => return Ok(Err(code)),
        };
        let pending = self.hooks.pending(request, options);
        Ok(Ok(self.table.push(pending)?))
    }

    /// `future-incoming-response.get`: the response head once it is there,
    /// as wasmtime-wasi-http gives it (its forbidden headers stripped).
    #[allow(clippy::type_complexity)]
    pub(super) fn response_get(
        &mut self,
        pending: Resource<PendingResponse>,
    ) -> wasmtime::Result<Option<Result<Result<Resource<HostIncomingResponse>, ErrorCode>, ()>>>
    {
        let Some(taken) = self.table.get_mut(&pending)?.take() else {
            return Ok(None);
        };
        let response = match taken {
            None => return Ok(Some(Err(()))),
            Some(Err(code)) => return Ok(Some(Ok(Err(code)))),
            Some(Ok(response)) => response,
        };
        let (parts, body) = response.into_parts();
        let headers = FieldMap::new_immutable(&mut self.hooks, parts.headers);
        let response = self.table.push(HostIncomingResponse {
            status: parts.status.as_u16(),
            headers,
            body: Some(HostIncomingBody::new(body)),
        })?;
        Ok(Some(Ok(Ok(response))))
    }

    /// `future-incoming-response.subscribe`: ready once `get` has the
    /// response, or why there is none.
    pub(super) fn response_subscribe(
        &mut self,
        pending: Resource<PendingResponse>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, pending)
    }

    /// Drops a `future-incoming-response`, with the send it holds.
    pub(super) fn response_drop(
        &mut self,
        pending: Resource<PendingResponse>,
    ) -> wasmtime::Result<()> {
        self.table.delete(pending)?;
        Ok(())
    }
}

impl WasiHttpView for GuestState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// `StoreLimits` plus a record of a refused memory grow, so a failed grow
/// becomes HANDLER_MEMORY rather than a generic trap.
pub(super) struct Limits {
    inner: StoreLimits,
    pub(super) cap: usize,
    /// The size a grow asked for and was refused, during the current call.
    pub(super) denied: Option<usize>,
}

impl ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if self.inner.memory_growing(current, desired, maximum)? {
            return Ok(true);
        }
        self.denied = Some(desired);
        Err(wasmtime::Error::msg(format!(
            "memory cap of {} bytes reached growing to {desired} bytes",
            self.cap
        )))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }
    fn tables(&self) -> usize {
        self.inner.tables()
    }
    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

impl types::Host for GuestState {}

impl wit_log::Host for GuestState {
    /// A line at a level the log leaves out costs nothing and takes
    /// nothing from the handler's budget, so a guest's debug lines never
    /// crowd out its warnings.
    fn log(&mut self, level: wit_log::Level, message: String) {
        use tracing::Level;
        let shown = match level {
            wit_log::Level::Trace => tracing::enabled!(Level::TRACE),
            wit_log::Level::Debug => tracing::enabled!(Level::DEBUG),
            wit_log::Level::Info => tracing::enabled!(Level::INFO),
            wit_log::Level::Warn => tracing::enabled!(Level::WARN),
            wit_log::Level::Error => tracing::enabled!(Level::ERROR),
        };
        let g = &self.guest;
        if !shown || !g.budget.take() {
            return;
        }
        let message = g.grants.config.secrets.redact_within(&message, 4096);
        let (route, handler, version) = (&g.route, &g.handler, &g.short_version);
        match level {
            wit_log::Level::Trace => {
                tracing::trace!(route, handler, version, "{message}")
            }
            wit_log::Level::Debug => {
                tracing::debug!(route, handler, version, "{message}")
            }
            wit_log::Level::Info => tracing::info!(route, handler, version, "{message}"),
            wit_log::Level::Warn => tracing::warn!(route, handler, version, "{message}"),
            wit_log::Level::Error => {
                tracing::error!(route, handler, version, "{message}")
            }
        }
    }
}

impl wit_config::Host for GuestState {
    fn get(&mut self, key: String) -> Option<String> {
        self.guest.config.get(&key).cloned()
    }

    fn entries(&mut self) -> Vec<(String, String)> {
        self.guest
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

impl wit_emit::Host for GuestState {
    fn publish(&mut self, emitted: wit_emit::Outgoing) -> Result<String, wit_emit::EmitError> {
        self.emits.publish(&self.guest, emitted)
    }

    fn schedule(&mut self, record: wit_emit::Scheduled) -> Result<(), wit_emit::ScheduleError> {
        self.emits.schedule(&self.guest, record)
    }

    fn cancel(&mut self, id: String) -> Result<(), wit_emit::ScheduleError> {
        self.emits.cancel(&self.guest, id)
    }
}

impl wit_secrets::Host for GuestState {
    /// The secret's value, when the route grants one of that name. Never
    /// logged: only the name of a secret that is not granted is.
    fn get(&mut self, name: String) -> Option<String> {
        let g = &self.guest;
        let value = g.grants.config.secrets.get(&name);
        if value.is_none() {
            tracing::debug!(
                route = g.route,
                handler = g.handler,
                version = g.short_version,
                secret = name,
                "Handler asked for a secret the route does not grant."
            );
        }
        value.map(|s| s.expose().to_string())
    }
}

impl wit_http::Host for GuestState {
    /// One request, through the same path as `wasi:http`'s (plugin/fetch.rs).
    async fn fetch(
        &mut self,
        request: wit_http::Request,
    ) -> Result<wit_http::Response, wit_http::FetchError> {
        self.hooks.fetch(request).await
    }
}
