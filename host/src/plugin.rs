//! The only module that knows about WebAssembly.
//!
//! It owns the wasmtime `Engine`, the `Linker` and the generated bindings,
//! and gives the rest of hopper one plain type: a [`Handler`] that turns a
//! [`Message`] (or its owned form, a [`Delivery`]) into a [`Verdict`].
//! Everything a guest can do to the host — trap, spin, hoard memory, flood
//! stdout — comes back as a `Verdict`, never as a host error.

mod cache;
pub mod canned;
mod compiler;
mod emit;
mod fetch;
mod fit;
mod functions;
mod grants;
mod handler;
mod http;
mod instance;
mod output;
mod state;

pub use cache::{ArtifactCache, CacheError};
pub use compiler::Compiler;
pub use emit::Emitted;
pub use fit::{Fit, Grant};
pub use functions::{FunctionCache, FunctionStats};
pub use handler::{Answer, Handler, HandlerSlot};

use crate::config::DEFAULT_MAX_INSTANCES;
use crate::config::Route;
use crate::egress::TransportError;
use crate::events::Telemetry;
use crate::headers::Reason;
use crate::types::VerdictKind;
use handler::GuestInfo;
use output::LineBudget;
use sha2::{Digest, Sha256};
use state::GuestState;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};
use wasmtime::StoreContextMut;
use wasmtime::component::{Component, HasSelf, Linker, Resource, ResourceType};
use wasmtime::{Config, Engine, PoolingAllocationConfig};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler",
        imports: { "hopper:handler/http.fetch": async },
        exports: { default: async },
    });
}

/// The `wasi:http/outgoing-handler` wasmtime-wasi-http links, whose
/// `handle` hopper puts its own in front of. A test checks that a refused
/// request fails `handle` itself, so a wasmtime upgrade that moves this
/// version does not go unnoticed.
const OUTGOING_HANDLER: &str = "wasi:http/outgoing-handler@0.2.12";
/// The `wasi:http/types` wasmtime-wasi-http links, whose
/// `future-incoming-response` hopper replaces with its own. Were this to
/// stop matching, `handle` would return a resource of another type and no
/// component importing `wasi:http` would instantiate: every HTTP test would
/// fail at once.
const HTTP_TYPES: &str = "wasi:http/types@0.2.12";

/// The world every handler must target.
pub const WORLD: &str = "hopper:handler/handler@0.1.3";

/// How often the engine's epoch advances. At each tick a running guest
/// checks its deadline and yields to the async runtime, so a call is
/// stopped within a tick of its timeout and a spinning guest never starves
/// the other partitions. The thread that ticks wakes whether or not a guest
/// runs: at 1 ms it woke 1,000 times a second, a quarter of a context
/// switch per HTTP request on the clients' CPU (BENCHMARKS.md, "The HTTP
/// path's context switches").
const EPOCH_TICK: Duration = Duration::from_millis(10);
/// A running guest yields to the async runtime every this many ticks.
const YIELD_EVERY_TICKS: u64 = 1;
/// How long past its timeout a call that waits on a host call is given
/// before it is stopped from outside: guest code is stopped by the epoch
/// first.
const TIMEOUT_GRACE: Duration = Duration::from_millis(50);

/// One delivery of a message, borrowed from wherever it lives: the WIT
/// `message` record, field for field, which a call lowers straight into the
/// guest's memory without copying it first. A route builds one from the
/// Kafka message it read; [`Delivery`] lends one.
#[derive(Debug, Clone, Copy, wasmtime::component::ComponentType, wasmtime::component::Lower)]
#[component(record)]
pub struct Message<'a> {
    pub id: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub headers: &'a [Header<'a>],
    pub timestamp: Option<i64>,
    pub attempt: u32,
    pub route: &'a str,
}

/// One record header of a [`Message`]: the WIT `header` record.
#[derive(Debug, Clone, Copy, wasmtime::component::ComponentType, wasmtime::component::Lower)]
#[component(record)]
pub struct Header<'a> {
    pub key: &'a str,
    pub value: &'a [u8],
}

/// One delivery of a message, as the handler sees it, owned: for tools and
/// tests that make up their own.
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
    /// What kind of verdict this is, for logs, events and metrics.
    pub fn kind(&self) -> VerdictKind {
        match self {
            Verdict::Ok => VerdictKind::Ok,
            Verdict::Retryable { .. } => VerdictKind::Retryable,
            Verdict::Fatal { .. } => VerdictKind::Fatal,
            Verdict::Failed { class, .. } => match class {
                Reason::HandlerTimeout => VerdictKind::Timeout,
                Reason::HandlerMemory => VerdictKind::Memory,
                _ => VerdictKind::Trap,
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
    #[error("cannot set up outbound HTTP: {0}")]
    Transport(#[from] TransportError),
}

/// Why the WebAssembly runtime could not be made (wasmtime's engine or
/// linker refused the settings), in wasmtime's words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RuntimeError(String);

/// The per-process WebAssembly runtime: one engine, one linker, the
/// optional cache of compiled artifacts, and every route's grants.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    /// Advances the engine's epoch while a runtime or a handler of it lives.
    ticker: Arc<EpochTicker>,
    linker: Arc<Linker<GuestState>>,
    cache: Option<Arc<ArtifactCache>>,
    /// Cranelift's compiled functions, kept beside `cache` once it is set:
    /// a new version of a handler compiles only what changed.
    functions: Arc<FunctionCache>,
    grants: Arc<grants::Registry>,
    /// Where handlers' HTTP requests and refused emits are reported.
    telemetry: Telemetry,
    compiler: Compiler,
}

/// Instance slots of a runtime that no config sized (tools, tests, the
/// benchmarks): room for the default route's `max_instances` twice.
pub const STANDALONE_INSTANCES: usize = 2 * DEFAULT_MAX_INSTANCES;

/// Pool slots per instance slot. A component instance holds several core
/// instances (a Rust guest: its module and the WASI shims; Python and
/// JavaScript guests: more), each with at most one memory and table.
const CORE_INSTANCES_PER_INSTANCE: u32 = 5;
const MEMORIES_PER_INSTANCE: u32 = 2;
const TABLES_PER_INSTANCE: u32 = 2;
/// Freed memories whose pages are returned to the OS together. A slot waits
/// in the batch until it is flushed, or until the pool runs short, which
/// flushes it at once.
const DECOMMIT_BATCH: usize = 32;

impl Runtime {
    /// A runtime for the handlers of `routes`: linear memories as large as
    /// the largest route's `memory_mib`, and instance slots for every
    /// route's `max_instances` twice over, because a reload runs two
    /// versions of a handler side by side for a while (the calls still on
    /// the old version, and its idle instances until the last of them ends).
    pub fn for_routes(routes: &[Route]) -> Result<Runtime, RuntimeError> {
        Runtime::for_routes_with(routes, Compiler::default())
    }

    /// [`Runtime::for_routes`], its handlers compiled by `compiler`.
    pub fn for_routes_with(routes: &[Route], compiler: Compiler) -> Result<Runtime, RuntimeError> {
        let memory = routes.iter().map(|r| r.memory_bytes).max();
        let instances: usize = routes.iter().map(|r| r.max_instances).sum();
        Runtime::built(memory.unwrap_or(64 << 20), (2 * instances).max(1), compiler)
    }

    /// A runtime with [`STANDALONE_INSTANCES`] instance slots and linear
    /// memories of up to `max_memory_bytes`.
    pub fn new(max_memory_bytes: usize) -> Result<Runtime, RuntimeError> {
        Runtime::sized(max_memory_bytes, STANDALONE_INSTANCES)
    }

    /// Builds the engine with a pooling allocator of `instances` instance
    /// slots, each linear memory up to `max_memory_bytes`, and starts the
    /// epoch ticker.
    ///
    /// Each memory slot reserves (not commits) 4 GiB of address space plus
    /// its guard, so the pool is sized from the config, not for the most any
    /// config could ask: a fixed 2,000 slots reserved 8 TiB per engine.
    pub fn sized(max_memory_bytes: usize, instances: usize) -> Result<Runtime, RuntimeError> {
        Runtime::built(max_memory_bytes, instances, Compiler::default())
    }

    /// [`Runtime::new`], its handlers compiled by `compiler`.
    pub fn with_compiler(
        max_memory_bytes: usize,
        compiler: Compiler,
    ) -> Result<Runtime, RuntimeError> {
        Runtime::built(max_memory_bytes, STANDALONE_INSTANCES, compiler)
    }

    fn built(
        max_memory_bytes: usize,
        instances: usize,
        compiler: Compiler,
    ) -> Result<Runtime, RuntimeError> {
        let instances = u32::try_from(instances).unwrap_or(u32::MAX);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(instances)
            .total_core_instances(instances.saturating_mul(CORE_INSTANCES_PER_INSTANCE))
            .total_memories(instances.saturating_mul(MEMORIES_PER_INSTANCE))
            .total_tables(instances.saturating_mul(TABLES_PER_INSTANCE))
            // One stack per call running at once, at most one per instance.
            .total_stacks(instances)
            .max_memory_size(max_memory_bytes.max(16 << 20))
            // A freed memory's pages are given back with madvise, batched:
            // each madvise of a multi-threaded process flushes every core's
            // TLB, and one per fresh call was a third of its cost. Keeping
            // pages resident instead (memset on reuse), with or without
            // PAGEMAP_SCAN, was slower for a small guest (BENCHMARKS.md).
            .decommit_batch_size(DECOMMIT_BATCH)
            .table_keep_resident(16 << 10);
        let functions = Arc::new(FunctionCache::default());
        let mut config = Config::new();
        config
            .allocation_strategy(pool)
            .epoch_interruption(true)
            .memory_init_cow(true)
            .max_wasm_stack(1 << 20);
        match compiler {
            // Incremental compilation is Cranelift's.
            Compiler::Cranelift => {
                config
                    .strategy(wasmtime::Strategy::Cranelift)
                    .enable_incremental_compilation(functions.clone())
                    .map_err(wasm_error)?;
            }
            // Winch compiles the wasm functions; the component's adapters
            // and the trampolines into every function a table holds (tens
            // of thousands for an interpreter) are Cranelift's, and took a
            // quarter of a Python handler's compile. Compiled for speed of
            // compiling, as Winch's own code is.
            Compiler::Winch => {
                config
                    .strategy(wasmtime::Strategy::Winch)
                    .cranelift_opt_level(wasmtime::OptLevel::None)
                    .cranelift_regalloc_algorithm(wasmtime::RegallocAlgorithm::SinglePass);
            }
        }
        let engine = Engine::new(&config).map_err(wasm_error)?;

        let mut linker: Linker<GuestState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(wasm_error)?;
        // Every handler may import wasi:http; only the route's grants decide
        // whether a request goes anywhere (plugin/http.rs).
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(wasm_error)?;
        // Its `outgoing-handler.handle` in front of wasmtime-wasi-http's, so
        // that a refused request fails at once (`GuestState::outgoing_handle`),
        // and its own `future-incoming-response`, which the guest's wait
        // polls in the call's task instead of a task per request
        // (`http::PendingResponse`).
        linker.allow_shadowing(true);
        linker
            .instance(OUTGOING_HANDLER)
            .and_then(|mut handler| {
                handler.func_wrap(
                    "handle",
                    |mut store: StoreContextMut<GuestState>, (request, options)| {
                        Ok((store.data_mut().outgoing_handle(request, options)?,))
                    },
                )
            })
            .map_err(wasm_error)?;
        linker
            .instance(HTTP_TYPES)
            .and_then(|mut types| {
                types.resource(
                    "future-incoming-response",
                    ResourceType::host::<http::PendingResponse>(),
                    |mut store, rep| store.data_mut().response_drop(Resource::new_own(rep)),
                )?;
                types.func_wrap(
                    "[method]future-incoming-response.get",
                    |mut store: StoreContextMut<GuestState>, (pending,)| {
                        Ok((store.data_mut().response_get(pending)?,))
                    },
                )?;
                types.func_wrap(
                    "[method]future-incoming-response.subscribe",
                    |mut store: StoreContextMut<GuestState>, (pending,)| {
                        Ok((store.data_mut().response_subscribe(pending)?,))
                    },
                )
            })
            .map_err(wasm_error)?;
        linker.allow_shadowing(false);
        bindings::Handler::add_to_linker::<_, HasSelf<_>>(&mut linker, |s: &mut GuestState| s)
            .map_err(wasm_error)?;

        let ticker =
            Arc::new(EpochTicker::start(engine.clone()).map_err(|e| RuntimeError(e.to_string()))?);
        Ok(Runtime {
            engine,
            ticker,
            linker: Arc::new(linker),
            cache: None,
            functions,
            grants: Arc::default(),
            telemetry: Telemetry::new(),
            compiler,
        })
    }

    /// The compiler of this runtime's handlers.
    pub fn compiler(&self) -> Compiler {
        self.compiler
    }

    /// Tells whether this runtime's engine, and with it its pooling
    /// reservation and epoch thread, is still alive.
    pub fn watch(&self) -> EngineWatch {
        EngineWatch(self.engine.weak())
    }

    /// Reports handlers' HTTP requests and refused emits to `telemetry`
    /// (by default, to a `Telemetry` of the runtime's own).
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Runtime {
        self.telemetry = telemetry;
        self
    }

    /// Resolves the host names of handlers' HTTP requests with `resolver`
    /// instead of the system's (tests point names at chosen addresses).
    /// Guarded addresses stay guarded whatever it answers.
    pub fn with_resolver(mut self, resolver: Arc<dyn crate::egress::Resolve>) -> Runtime {
        self.grants = Arc::new(grants::Registry::with_resolver(resolver));
        self
    }

    /// Answers handlers' HTTP requests from `canned` instead of the network,
    /// once the route's grants allowed them (`hopper plugin test`).
    pub fn with_canned_http(mut self, canned: Arc<canned::CannedHttp>) -> Runtime {
        self.grants = Arc::new(grants::Registry::with_canned(canned));
        self
    }

    /// `handler`, compiled already, under `route`'s grants, limits and
    /// config: what a test needs for each set of secrets, without compiling
    /// again.
    pub fn rebind(&self, handler: &Handler, route: &Route) -> Result<Handler, LoadError> {
        let grants = self.grants.for_route(route, &self.telemetry)?;
        Ok(handler.rebound(grants, route))
    }

    /// Keeps compiled artifacts in `dir`, and looks there before compiling.
    /// Fails when the directory cannot be created, or is not safe to run
    /// code from ([`CacheError`]).
    /// Cranelift's compiled functions go beside them
    /// ([`FunctionCache`]).
    pub fn with_cache(mut self, dir: PathBuf) -> Result<Runtime, CacheError> {
        let cache = ArtifactCache::open(dir, &self.engine)?;
        self.functions.open(cache.dir(), cache.engine_tag());
        self.cache = Some(Arc::new(cache));
        Ok(self)
    }

    /// Bounds the cache, if there is one, to `max_bytes` (`[limits]
    /// cache_max_mib`): a quarter for the compiled functions' pack, the
    /// rest for the compiled handlers.
    pub fn with_cache_limit(mut self, max_bytes: u64) -> Runtime {
        if let Some(cache) = self.cache.take() {
            let functions = max_bytes / 4;
            self.functions.set_max_bytes(functions);
            self.cache = Some(Arc::new(
                (*cache).clone().with_max_bytes(max_bytes - functions),
            ));
        }
        self
    }

    pub fn cache(&self) -> Option<&ArtifactCache> {
        self.cache.as_deref()
    }

    /// What the compiled-function cache did since the runtime was made.
    pub fn function_stats(&self) -> FunctionStats {
        self.functions.stats()
    }

    /// Reads, compiles and validates a handler for `route`.
    pub fn load(&self, path: &Path, route: &Route) -> Result<Handler, LoadError> {
        let bytes = read(path)?;
        self.load_bytes(path, &bytes, route)
    }

    /// Compiles (or takes from the cache) and validates the handler whose
    /// file `path` held `bytes`. Every version of a route's handler shares
    /// the route's grants, its HTTP connections included.
    pub fn load_bytes(
        &self,
        path: &Path,
        bytes: &[u8],
        route: &Route,
    ) -> Result<Handler, LoadError> {
        let started = Instant::now();
        let prepared = self.prepare(path, bytes)?;
        let grants = self.grants.for_route(route, &self.telemetry)?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "handler".into());
        Ok(Handler::new(
            (self.engine.clone(), self.ticker.clone()),
            prepared.pre,
            GuestInfo {
                route: route.name.clone(),
                handler: name,
                short_version: prepared.version[..12].to_string(),
                version: prepared.version,
                config: route.config.clone(),
                budget: LineBudget::new(),
                grants,
            },
            route,
            (prepared.cached, started.elapsed()),
        ))
    }

    /// Compiles a file and checks it against the world.
    fn prepare(&self, path: &Path, bytes: &[u8]) -> Result<Prepared, LoadError> {
        let version = version_of(bytes);
        let (component, cached) = self.compile(path, bytes, &version)?;
        let wrong_world = |e: wasmtime::Error| LoadError::WrongWorld {
            path: path.to_path_buf(),
            detail: format!("{}; {}", root_cause(&e), describe(&self.engine, &component)),
        };
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let pre = bindings::HandlerPre::new(pre).map_err(wrong_world)?;
        Ok(Prepared {
            pre,
            version,
            cached,
        })
    }

    /// The component of `bytes`, from the cache when it holds a sound entry
    /// (then `true`), else compiled now and written to the cache.
    fn compile(
        &self,
        path: &Path,
        bytes: &[u8],
        version: &str,
    ) -> Result<(Component, bool), LoadError> {
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
        if let Some(component) = self
            .cache
            .as_ref()
            .and_then(|c| c.get(&self.engine, version))
        {
            return Ok((component, true));
        }
        let before = self.functions.stats();
        let compiled = Component::new(&self.engine, bytes);
        self.functions.flush();
        let component = compiled.map_err(|e| LoadError::Compile {
            path: path.clone(),
            detail: root_cause(&e),
        })?;
        if let Some(cache) = &self.cache {
            let after = self.functions.stats();
            tracing::debug!(
                handler = %path.display(),
                functions_reused = after.hits - before.hits,
                functions_compiled = after.misses - before.misses,
                "Compiled."
            );
            cache.put(version, &component);
        }
        Ok((component, false))
    }
}

/// Whether an engine still exists: it lives while a [`Runtime`] or a
/// [`Handler`] made by one does, and is freed with the last of them.
#[derive(Clone)]
pub struct EngineWatch(wasmtime::EngineWeak);

impl EngineWatch {
    pub fn alive(&self) -> bool {
        self.0.upgrade().is_some()
    }
}

/// The thread that advances an engine's epoch every [`EPOCH_TICK`]. Shared
/// by a runtime and every handler it loads; dropping the last of them stops
/// the thread and waits for it, so its clone of the engine is gone by then.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> std::io::Result<EpochTicker> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("hopper-epoch".into())
            .spawn(move || {
                while !stopped.load(AtomicOrdering::Acquire) {
                    engine.increment_epoch();
                    std::thread::park_timeout(EPOCH_TICK);
                }
            })?;
        Ok(EpochTicker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, AtomicOrdering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            // The thread ends within one tick; a panic in it was reported.
            let _ = thread.join();
        }
    }
}

struct Prepared {
    pre: bindings::HandlerPre<GuestState>,
    version: String,
    cached: bool,
}

fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The version of a handler file: the sha256 of its bytes, in hex.
pub fn version_of(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// wasmtime's error type is its own: its whole chain, on the runtime's
/// error.
fn wasm_error(e: wasmtime::Error) -> RuntimeError {
    RuntimeError(format!("{e:#}"))
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
