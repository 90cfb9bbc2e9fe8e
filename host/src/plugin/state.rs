//! What a store holds for one guest, and the host functions the guest may
//! call: logging and its route's config values. Emitting records and
//! reading secrets are refused until a route grants them.

use super::GuestInfo;
use super::bindings::hopper::handler::{
    config as wit_config, emit as wit_emit, log as wit_log, secrets as wit_secrets, types,
};
use super::output::GuestOutput;
use std::sync::Arc;
use std::time::Instant;
use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxView, WasiView};

/// Per-store state: the (empty) WASI context, the limits, the captured
/// output, the current call's deadline, and the guest info the host
/// functions tag their output with.
pub(super) struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(super) limits: Limits,
    guest: Arc<GuestInfo>,
    /// When the call in progress must stop. Read by the epoch callback, and
    /// set again before every call, since a warm store serves many calls.
    pub(super) deadline: Instant,
    pub(super) stdout: GuestOutput,
    pub(super) stderr: GuestOutput,
}

impl GuestState {
    pub(super) fn new(guest: &Arc<GuestInfo>, memory_bytes: usize) -> GuestState {
        let stdout = GuestOutput::new(guest.clone(), "stdout");
        let stderr = GuestOutput::new(guest.clone(), "stderr");
        // No args, environment, preopened directories, network or clock
        // grants: only stdout and stderr, and both go to the log.
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build();
        GuestState {
            wasi,
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
            stdout,
            stderr,
        }
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
    fn log(&mut self, level: wit_log::Level, message: String) {
        let g = &self.guest;
        if !g.budget.take() {
            return;
        }
        let message = crate::headers::shorten(&message, 4096);
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
    /// No route grants a topic yet: every record is refused.
    fn publish(&mut self, emitted: wit_emit::Outgoing) -> Result<String, wit_emit::EmitError> {
        Err(wit_emit::EmitError::TopicNotGranted(emitted.topic))
    }
}

impl wit_secrets::Host for GuestState {
    /// No route grants a secret yet.
    fn get(&mut self, _name: String) -> Option<String> {
        None
    }
}
