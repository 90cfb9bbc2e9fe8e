//! The only module that knows about WebAssembly.
//!
//! It owns the wasmtime `Engine`, the `Linker` and the generated bindings,
//! and gives the rest of hopper one plain type: a [`Handler`] that turns a
//! [`Delivery`] into a [`Verdict`]. Everything a guest can do to the host —
//! trap, spin, hoard memory, flood stdout — comes back as a `Verdict`, never as
//! a host error.

mod fit;
mod output;

pub use fit::Fit;

use crate::config::Route;
use crate::headers::Reason;
use output::{GuestOutput, LineBudget};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, PoolingAllocationConfig, ResourceLimiter, Store, StoreLimits};
use wasmtime::{StoreLimitsBuilder, Trap, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler",
        exports: { default: async },
    });
}

use bindings::hopper::handler::{config as wit_config, log as wit_log, types};

/// The world every handler must target.
pub const WORLD: &str = "hopper:handler/handler@0.1.0";

/// How often the engine's epoch advances. Deadlines are counted in ticks.
const EPOCH_TICK: Duration = Duration::from_millis(1);
/// A running guest yields to the async runtime every this many ticks, so a
/// spinning guest never starves the other partitions.
const YIELD_EVERY_TICKS: u64 = 10;

/// One delivery of a message, as the handler sees it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp: Option<i64>,
    pub attempt: u32,
    pub route: String,
}

/// What came of one handler call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Retryable {
        reason: String,
        retry_after: Option<Duration>,
    },
    Fatal {
        reason: String,
    },
    /// The call did not return: the guest trapped, ran out of time or hit its
    /// memory cap. `class` is one of HANDLER_TRAP, HANDLER_TIMEOUT or
    /// HANDLER_MEMORY.
    Failed {
        class: Reason,
        error: String,
    },
}

impl Verdict {
    /// A short label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Retryable { .. } => "retryable",
            Verdict::Fatal { .. } => "fatal",
            Verdict::Failed { class, .. } => match class {
                Reason::HandlerTimeout => "timeout",
                Reason::HandlerMemory => "memory",
                _ => "trap",
            },
        }
    }
}

/// Why a handler file could not be loaded. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read handler {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("handler {path} is not a WebAssembly file ({detail})")]
    NotWasm { path: PathBuf, detail: String },
    #[error(
        "handler {path} is a core WebAssembly module, not a component; build it for a component target (for Rust: --target wasm32-wasip2)"
    )]
    CoreModule { path: PathBuf },
    #[error("handler {path} does not compile: {detail}")]
    Compile { path: PathBuf, detail: String },
    #[error("handler {path} does not fit the {WORLD} world: {detail}")]
    WrongWorld { path: PathBuf, detail: String },
}

/// The per-process WebAssembly runtime: one engine, one linker.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<GuestState>>,
}

impl Runtime {
    /// Builds the engine with the pooling allocator sized for
    /// `max_memory_bytes` per linear memory, and starts the epoch ticker.
    pub fn new(max_memory_bytes: usize) -> anyhow::Result<Runtime> {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(1000)
            .total_core_instances(5000)
            .total_memories(2000)
            .total_tables(2000)
            .max_memory_size(max_memory_bytes.max(16 << 20))
            // Keep a little of each slot resident so a fresh instance does not
            // fault in its first pages again.
            .linear_memory_keep_resident(64 << 10)
            .table_keep_resident(16 << 10);
        let mut config = Config::new();
        config
            .allocation_strategy(pool)
            .epoch_interruption(true)
            .memory_init_cow(true)
            .max_wasm_stack(1 << 20);
        let engine = Engine::new(&config).map_err(wasm_error)?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(wasm_error)?;
        bindings::Handler::add_to_linker::<_, HasSelf<_>>(&mut linker, |s: &mut GuestState| s)
            .map_err(wasm_error)?;

        let weak = engine.weak();
        std::thread::Builder::new()
            .name("hopper-epoch".into())
            .spawn(move || {
                // Ends when the last clone of the engine is dropped.
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })?;
        Ok(Runtime {
            engine,
            linker: Arc::new(linker),
        })
    }

    /// Reads, compiles and validates a handler for `route`.
    pub fn load(&self, path: &Path, route: &Route) -> Result<Handler, LoadError> {
        let (_, pre, version) = self.prepare(path)?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "handler".into());
        Ok(Handler {
            inner: Arc::new(HandlerInner {
                engine: self.engine.clone(),
                pre,
                guest: Arc::new(GuestInfo {
                    route: route.name.clone(),
                    handler: name,
                    short_version: version[..12].to_string(),
                    version,
                    config: route.config.clone(),
                    budget: LineBudget::new(),
                }),
                timeout: route.timeout,
                memory_bytes: route.memory_bytes,
            }),
        })
    }

    /// Compiles a file and checks it against the world; returns the
    /// component, its pre-instance and its sha256.
    fn prepare(
        &self,
        path: &Path,
    ) -> Result<(Component, bindings::HandlerPre<GuestState>, String), LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let version = hex::encode(Sha256::digest(&bytes));
        let component = self.compile(path, &bytes)?;
        let wrong_world = |e: wasmtime::Error| LoadError::WrongWorld {
            path: path.to_path_buf(),
            detail: format!("{}; {}", root_cause(&e), describe(&self.engine, &component)),
        };
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let pre = bindings::HandlerPre::new(pre).map_err(wrong_world)?;
        Ok((component, pre, version))
    }

    /// One line on whether `path` fits the handler world, with what it
    /// imports and exports.
    pub fn check(&self, path: &Path) -> Result<String, LoadError> {
        let (component, _, version) = self.prepare(path)?;
        Ok(format!(
            "ok: {} fits {WORLD} (sha256 {version}); {}",
            path.display(),
            describe(&self.engine, &component)
        ))
    }

    fn compile(&self, path: &Path, bytes: &[u8]) -> Result<Component, LoadError> {
        let path = path.to_path_buf();
        match bytes.get(0..8) {
            Some([0, b'a', b's', b'm', 0x01, 0, 0, 0]) => {
                return Err(LoadError::CoreModule { path });
            }
            Some([0, b'a', b's', b'm', ..]) => {}
            _ => {
                return Err(LoadError::NotWasm {
                    path,
                    detail: if bytes.len() < 8 {
                        format!("only {} bytes long", bytes.len())
                    } else {
                        "it does not start with the \\0asm magic".into()
                    },
                });
            }
        }
        Component::new(&self.engine, bytes).map_err(|e| LoadError::Compile {
            path,
            detail: root_cause(&e),
        })
    }
}

/// A compiled, validated handler version, cheap to clone. Calls made through
/// a clone keep using this version even after a newer one is loaded.
#[derive(Clone)]
pub struct Handler {
    inner: Arc<HandlerInner>,
}

struct HandlerInner {
    engine: Engine,
    pre: bindings::HandlerPre<GuestState>,
    guest: Arc<GuestInfo>,
    timeout: Duration,
    memory_bytes: usize,
}

/// What the host functions know about the guest they serve.
struct GuestInfo {
    route: String,
    handler: String,
    version: String,
    short_version: String,
    config: BTreeMap<String, String>,
    budget: LineBudget,
}

impl Handler {
    /// File stem of the handler, for example `order_timeout`.
    pub fn name(&self) -> &str {
        &self.inner.guest.handler
    }

    /// sha256 of the component file, in hex.
    pub fn version(&self) -> &str {
        &self.inner.guest.version
    }

    /// Calls the guest once, in a fresh store and instance.
    pub async fn call(&self, delivery: Delivery) -> Verdict {
        let inner = &*self.inner;
        let stdout = GuestOutput::new(inner.guest.clone(), "stdout");
        let stderr = GuestOutput::new(inner.guest.clone(), "stderr");
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build();
        let mut store = Store::new(
            &inner.engine,
            GuestState {
                wasi,
                table: ResourceTable::new(),
                limits: Limits {
                    inner: StoreLimitsBuilder::new()
                        .memory_size(inner.memory_bytes)
                        .instances(64)
                        .build(),
                    cap: inner.memory_bytes,
                    denied: None,
                },
                guest: inner.guest.clone(),
            },
        );
        store.limiter(|s| &mut s.limits);
        let deadline = Instant::now() + inner.timeout;
        store.set_epoch_deadline(YIELD_EVERY_TICKS);
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(YIELD_EVERY_TICKS))
            }
        });

        let message = to_wit(delivery);
        let call = async {
            let instance = inner.pre.instantiate_async(&mut store).await?;
            instance.call_handle(&mut store, &message).await
        };
        // The epoch deadline stops guest code; this timeout also covers time
        // spent inside host calls, which epochs do not interrupt.
        let result = tokio::time::timeout(inner.timeout + EPOCH_TICK * 50, call).await;
        // Read before the flush empties it: a panicking guest says why here.
        let stderr_summary = stderr.summary();
        stdout.flush_to_log();
        stderr.flush_to_log();
        match result {
            Err(_) => Verdict::Failed {
                class: Reason::HandlerTimeout,
                error: format!("handler ran past its {:?} limit", inner.timeout),
            },
            Ok(Ok(outcome)) => from_wit(outcome),
            Ok(Err(error)) => classify(&error, &store, stderr_summary, inner.timeout),
        }
    }
}

fn classify(
    error: &wasmtime::Error,
    store: &Store<GuestState>,
    stderr_summary: Option<String>,
    timeout: Duration,
) -> Verdict {
    if let Some(denied) = store.data().limits.denied {
        return Verdict::Failed {
            class: Reason::HandlerMemory,
            error: format!(
                "handler tried to grow its memory to {denied} bytes; the route's cap is {} bytes",
                store.data().limits.cap
            ),
        };
    }
    let trap = error.downcast_ref::<Trap>();
    if trap == Some(&Trap::Interrupt) {
        return Verdict::Failed {
            class: Reason::HandlerTimeout,
            error: format!("handler ran past its {timeout:?} limit"),
        };
    }
    let mut text = match trap {
        Some(trap) => format!("trap: {trap}"),
        None => root_cause(error),
    };
    if let Some(line) = stderr_summary {
        text.push_str("; guest stderr: ");
        text.push_str(&line);
    }
    Verdict::Failed {
        class: Reason::HandlerTrap,
        error: text,
    }
}

fn to_wit(d: Delivery) -> types::Message {
    types::Message {
        id: d.id,
        topic: d.topic,
        partition: d.partition,
        offset: d.offset,
        key: d.key,
        payload: d.payload,
        headers: d
            .headers
            .into_iter()
            .map(|(key, value)| types::Header { key, value })
            .collect(),
        timestamp: d.timestamp,
        attempt: d.attempt,
        route: d.route,
    }
}

fn from_wit(outcome: types::Outcome) -> Verdict {
    match outcome {
        types::Outcome::Ok => Verdict::Ok,
        types::Outcome::Retryable(f) => Verdict::Retryable {
            reason: f.reason,
            retry_after: f.retry_after_ms.map(Duration::from_millis),
        },
        types::Outcome::Fatal(f) => Verdict::Fatal { reason: f.reason },
    }
}

/// wasmtime's error type is its own; the host's edges speak anyhow.
fn wasm_error(e: wasmtime::Error) -> anyhow::Error {
    anyhow::anyhow!("{e:#}")
}

/// The innermost message of an error chain, on one line.
fn root_cause(e: &wasmtime::Error) -> String {
    let text = format!("{e:#}");
    text.lines().next().unwrap_or_default().to_string()
}

/// What a component imports and exports, for error messages and
/// `hopper plugin check`.
pub fn describe(engine: &Engine, component: &Component) -> String {
    let ty = component.component_type();
    let imports: Vec<String> = ty
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    format!(
        "it exports [{}] and imports [{}]",
        exports.join(", "),
        imports.join(", ")
    )
}

/// Per-store state: the (empty) WASI context, the limits, and the guest info
/// the host functions tag their output with.
struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: Limits,
    guest: Arc<GuestInfo>,
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
struct Limits {
    inner: StoreLimits,
    cap: usize,
    denied: Option<usize>,
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
