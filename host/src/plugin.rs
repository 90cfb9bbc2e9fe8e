//! The only module that knows about WebAssembly.
//!
//! It owns the wasmtime `Engine`, the `Linker` and the generated bindings,
//! and gives the rest of hopper one plain type: a [`Handler`] that turns a
//! [`Delivery`] into a [`Verdict`]. Everything a guest can do to the host —
//! trap, spin, hoard memory, flood stdout — comes back as a `Verdict`, never as
//! a host error.

mod cache;
mod call;
mod emit;
mod fit;
mod grants;
mod http;
mod instance;
mod output;
mod state;

pub use cache::{ArtifactCache, CacheError};
pub use call::{Handled, Handler, HandlerSlot};
pub use emit::Emitted;
pub use fit::{Fit, Grant};

use crate::config::Route;
use crate::egress::TransportError;
use crate::events::Telemetry;
use crate::headers::Reason;
use call::GuestInfo;
use output::LineBudget;
use sha2::{Digest, Sha256};
use state::GuestState;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, PoolingAllocationConfig};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler",
        exports: { default: async },
    });
}

/// The world every handler must target.
pub const WORLD: &str = "hopper:handler/handler@0.1.1";

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
    /// Every value [`Verdict::label`] returns.
    pub const LABELS: [&'static str; 6] = ["ok", "retryable", "fatal", "trap", "timeout", "memory"];

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
    #[error("cannot set up outbound HTTP: {0}")]
    Transport(#[from] TransportError),
}

/// The per-process WebAssembly runtime: one engine, one linker, the
/// optional cache of compiled artifacts, and every route's grants.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<GuestState>>,
    cache: Option<Arc<ArtifactCache>>,
    grants: Arc<grants::Registry>,
    /// Where handlers' HTTP requests and refused emits are reported.
    telemetry: Telemetry,
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
        // Every handler may import wasi:http; only the route's grants decide
        // whether a request goes anywhere (plugin/http.rs).
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(wasm_error)?;
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
            cache: None,
            grants: Arc::default(),
            telemetry: Telemetry::new(),
        })
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

    /// Keeps compiled artifacts in `dir`, and looks there before compiling.
    /// Fails when the directory cannot be created, or is not safe to run
    /// code from ([`CacheError`]).
    pub fn with_cache(mut self, dir: PathBuf) -> Result<Runtime, CacheError> {
        self.cache = Some(Arc::new(ArtifactCache::open(dir, &self.engine)?));
        Ok(self)
    }

    pub fn cache(&self) -> Option<&ArtifactCache> {
        self.cache.as_deref()
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
            self.engine.clone(),
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
        let component = Component::new(&self.engine, bytes).map_err(|e| LoadError::Compile {
            path,
            detail: root_cause(&e),
        })?;
        if let Some(cache) = &self.cache {
            cache.put(version, &component);
        }
        Ok((component, false))
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
