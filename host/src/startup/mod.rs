//! Start-up: build everything, then start everything.
//!
//! [`start`] first builds all of a hopper: it loads every handler, makes
//! sure every topic exists, creates each pipeline's consumer and producer
//! (subscribed to nothing, so no group is joined and nothing is consumed or
//! committed), loads the delay relay's cancellation table, binds the admin
//! server and starts watching the handler files. A failure at any of those
//! steps returns it, and what was built goes with it: nothing ran. Only when
//! all of it was built does it start: each pipeline subscribes and its loop
//! is spawned, the relay's table follows its topic, the admin server
//! serves. A failure there (a subscription refused) stops what had started
//! and waits for it before returning.

mod pipelines;

pub(crate) use pipelines::Supervision;

use crate::config::{Config, ConfigError};
use crate::error::{Error, HandlerError};
use crate::events::Telemetry;
use crate::kafka::{Cluster, Doing as _, KafkaError};
use crate::{admin, delay, health, lag, parked, plugin, reload, renewable, route};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Runtime knobs of a hopper process that are not part of the pipeline
/// (command-line flags, not config keys).
#[derive(Debug, Clone)]
pub struct Options {
    /// Where compiled handlers are cached (`None`: compile every time).
    pub cache_dir: Option<PathBuf>,
    /// How long [`crate::Hopper::stop`] may take to drain: finish the calls
    /// in flight, have their hops acknowledged and commit. Default 30 s, at
    /// most [`MAX_SHUTDOWN_TIMEOUT`].
    pub shutdown_timeout: std::time::Duration,
    /// What compiles the handlers (`plugin/compiler.rs`): Cranelift, or
    /// Winch for the development loop.
    pub compiler: plugin::Compiler,
}

/// The longest drain [`Options::shutdown_timeout`] may ask for: a day, far
/// past a route's longest call (an hour). The drain's end is computed as
/// now plus the timeout, which a larger value could overflow.
pub const MAX_SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Options {
    /// Checks the options on their own: the shutdown timeout is at most
    /// [`MAX_SHUTDOWN_TIMEOUT`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.shutdown_timeout > MAX_SHUTDOWN_TIMEOUT {
            return Err(ConfigError::ShutdownTimeout {
                max: MAX_SHUTDOWN_TIMEOUT,
                asked: self.shutdown_timeout,
            });
        }
        Ok(())
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_dir: None,
            shutdown_timeout: std::time::Duration::from_secs(30),
            compiler: plugin::Compiler::default(),
        }
    }
}

/// How a hopper stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// Every pipeline drained: its calls finished, its hops were
    /// acknowledged, its offsets committed.
    Cleanly,
    /// The shutdown deadline came before every pipeline drained. What was
    /// done is committed; the rest is re-delivered after a restart.
    Incomplete(String),
    /// A pipeline stopped on its own (a dead-letter record refused for good,
    /// a panic), and every other one was stopped with it. Nothing past the
    /// failure was committed.
    Failed(String),
}

/// Everything a started hopper runs; [`crate::Hopper`] is its face.
pub(crate) struct Running {
    pub telemetry: Telemetry,
    /// Cancelled by [`Running::stop`]; every pipeline's loop, the relay's
    /// table and the lag sampler watch it.
    pub shutdown: CancellationToken,
    /// Every pipeline's supervisor.
    pub loops: TaskTracker,
    pub slots: HashMap<String, Arc<plugin::HandlerSlot>>,
    /// Swaps new handler versions into the slots; dropped with hopper.
    pub reloader: reload::Reloader,
    /// The admin server, when the config has an `[admin]` table; stopped
    /// after the routes.
    pub admin: Option<admin::Server>,
    pub supervision: Supervision,
    pub engine: plugin::EngineWatch,
    /// The delay relay's cancellation table, followed until shutdown.
    pub cancels: Option<Arc<delay::CancelTable>>,
    /// The delay relay's producer of the entries it awaits; weak, so that
    /// it goes with the relay's pipeline.
    pub relay_entries: Option<std::sync::Weak<renewable::AwaitedProducer>>,
    /// Per route with ordered retries: its park store; weak, so that it
    /// goes with the route's pipeline.
    pub park_stores: HashMap<String, std::sync::Weak<parked::Store>>,
    /// Cancels `shutdown` when a hopper is dropped without [`Running::stop`]
    /// (an embedder's panic): its loops stop rather than run on unowned,
    /// and a runtime shutting down does not wait on them for ever.
    pub _stop_on_drop: tokio_util::sync::DropGuard,
}

/// Builds every part of a hopper, then starts them all (the module's doc).
pub(crate) async fn start(config: Config, options: Options) -> Result<Running, Error> {
    build(config, options).await?.start().await
}

/// Every part of a hopper, built and not started.
struct Built {
    cluster: Cluster,
    telemetry: Telemetry,
    deadline: std::time::Duration,
    routes: Vec<pipelines::Built<route::RouteProcessor>>,
    relay: Option<Relay>,
    slots: HashMap<String, Arc<plugin::HandlerSlot>>,
    engine: plugin::EngineWatch,
    /// The topics the lag sampler watches, when metrics are on.
    lag: Option<Vec<lag::Watched>>,
    admin: Option<admin::Bound>,
    reloader: reload::Reloader,
    /// The park tables of the routes with ordered retries, loaded but not
    /// yet following their topics.
    parked: Vec<parked::LoadedTable>,
}

/// The delay relay, built: its pipeline, and its cancellation table loaded
/// but not yet following the topic.
struct Relay {
    pipeline: pipelines::Built<delay::DelayProcessor>,
    table: delay::LoadedTable,
    entries: std::sync::Weak<renewable::AwaitedProducer>,
    settings: crate::config::DelayRelay,
}

/// Builds every part of a hopper; nothing of it consumes, commits, follows
/// or serves until [`Built::start`]. A failure names every handler that
/// could not be loaded.
async fn build(config: Config, options: Options) -> Result<Built, Error> {
    options.validate()?;
    // Legal, so hopper starts; loud, once, and in `/ready` too.
    let weakened = config.kafka.weakened_security();
    if !weakened.is_empty() {
        tracing::warn!(
            weakened = weakened.len(),
            "INSECURE KAFKA CONNECTION: {}.",
            weakened.join("; ")
        );
    }
    let cluster = Cluster::of(&config.kafka)?;
    // Nothing starts unless a broker answers and takes the credentials:
    // a wrong password or CA fails here, by name, within seconds.
    let check = cluster.clone();
    tokio::task::spawn_blocking(move || check.check_connection())
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
    let metrics_on = config.admin.as_ref().is_some_and(|a| a.metrics);
    let telemetry =
        Telemetry::for_config(&config, metrics_on).with_tracing(config.tracing.as_ref())?;
    telemetry.health().set_connection(cluster.watch().clone());
    let mut runtime = plugin::Runtime::for_routes_with(&config.routes, options.compiler)
        .map_err(HandlerError::Runtime)?
        .with_telemetry(telemetry.clone());
    if options.compiler == plugin::Compiler::Winch {
        tracing::warn!(
            compiler = %options.compiler,
            "Handlers are compiled by Winch: quick to compile, slower to run. Use it to develop, not in production."
        );
    }
    if let Some(dir) = &options.cache_dir {
        runtime = runtime
            .with_cache(dir.clone())?
            .with_cache_limit(config.limits.cache_max_bytes());
    }

    let engine = runtime.watch();
    let mut handlers = Vec::new();
    let mut failures = Vec::new();
    for route in &config.routes {
        match runtime.load(&route.handler, route) {
            Ok(handler) => {
                tracing::info!(
                    route = route.name,
                    handler = handler.name(),
                    version = handler.version(),
                    cached = handler.load_stats().0,
                    "Handler loaded."
                );
                handlers.push(handler);
            }
            Err(e) => failures.push((route.name.clone(), e)),
        }
    }
    if !failures.is_empty() {
        return Err(HandlerError::Load(failures).into());
    }

    // The compacted tables (the cancellation topic, the park topics) are
    // created with their settings before the check that creates the rest.
    for spec in config.topic_specs().iter().filter(|s| s.compacted()) {
        let what = spec.role.name();
        let retention = spec.retention_ms.map(std::time::Duration::from_millis);
        if crate::kafka::compacted::ensure_topic(&cluster, what, &spec.topic, retention).await? {
            tracing::info!(topic = spec.topic, kind = what, "Compacted topic created.");
        }
    }
    let created = cluster.ensure_topics(&config.all_topics()).await?;
    if !created.is_empty() {
        tracing::info!(topics = created.join(","), "Topics created.");
    }

    let mut slots = HashMap::new();
    let mut routes = Vec::new();
    let mut reload_targets = Vec::new();
    let mut park_tables = Vec::new();
    for (route, handler) in config.routes.iter().zip(handlers) {
        let route = Arc::new(route.clone());
        let slot = Arc::new(plugin::HandlerSlot::new(handler));
        slots.insert(route.name.clone(), slot.clone());
        let mut processor =
            route::RouteProcessor::new(route.clone(), slot.clone(), telemetry.clone());
        if route.parking.is_some() {
            // Read to its end before the route handles anything, so a key
            // parked before a crash or a rebalance is still parked.
            let loaded = parked::load(&cluster, &route, telemetry.clone())
                .await
                .map_err(|e| match e {
                    parked::ParkError::Kafka(e) => KafkaError::ParkTable {
                        route: route.name.clone(),
                        source: Box::new(e),
                    },
                    other => unreachable!("a route with parking loads: {other}"),
                })?;
            processor = processor.with_parking(loaded.0.clone());
            park_tables.push(loaded);
        }
        reload_targets.push(reload::Target {
            route: route.clone(),
            slot: slot.clone(),
        });
        let mut topics: Vec<String> = route.topics.clone();
        topics.extend(processor.tiers.keys().cloned());
        let built = pipelines::build(&cluster, &telemetry, &route.group, &topics, processor, None)
            .map_err(|e| starting(format!("route `{}`", route.name), e))?;
        routes.push(built);
    }

    let relay = match &config.delay {
        None => None,
        Some(relay) => {
            let metadata = cluster
                .consumer_config(&relay.group)
                .create_with_context(cluster.watched("the delay relay's metadata"))
                .doing(|| "creating the delay relay's metadata client".into())?;
            // Read to its end before the relay forwards anything, so a
            // cancel recorded before a crash or a rebalance still holds.
            let table = delay::CancelTable::load(
                &cluster,
                &relay.cancels,
                relay.cancel_lifetime(),
                relay.max_cancellations,
                telemetry.clone(),
            )
            .await
            .map_err(|e| KafkaError::CancelTable(Box::new(e)))?;
            let entries = Arc::new(
                renewable::AwaitedProducer::new(
                    cluster.producer_config(),
                    "the delay relay's cancellation entries",
                )
                .doing(|| "creating the delay relay's cancellation producer".into())?,
            );
            let processor = delay::DelayProcessor::new(
                Arc::new(relay.clone()),
                metadata,
                telemetry.clone(),
                table.table.clone(),
                entries.clone(),
            );
            let mut topics = vec![relay.inbox.clone()];
            topics.extend(relay.tiers.iter().map(|(_, t)| t.clone()));
            let veto: Arc<dyn crate::produce::Veto> = table.table.clone();
            let pipeline = pipelines::build(
                &cluster,
                &telemetry,
                &relay.group,
                &topics,
                processor,
                Some(veto),
            )
            .map_err(|e| starting("the delay relay".into(), e))?;
            Some(Relay {
                pipeline,
                table,
                entries: Arc::downgrade(&entries),
                settings: relay.clone(),
            })
        }
    };

    let lag = metrics_on.then(|| lag::watched(&config));
    let admin = match config.admin.clone() {
        None => None,
        Some(settings) => {
            let context = admin::AdminContext {
                config: Arc::new(config),
                cluster: cluster.clone(),
                telemetry: telemetry.clone(),
                cancels: relay.as_ref().map(|r| r.table.table.clone()),
                parked: park_tables
                    .iter()
                    .map(|t| (t.0.table.route().to_string(), t.0.clone()))
                    .collect(),
            };
            Some(admin::Server::bind(context, settings).await?)
        }
    };
    // Last, as it starts its task: nothing after it can fail.
    let reloader = reload::Reloader::start(runtime, reload_targets, telemetry.clone())?;
    Ok(Built {
        cluster,
        telemetry,
        deadline: options.shutdown_timeout,
        routes,
        relay,
        slots,
        engine,
        lag,
        admin,
        reloader,
        parked: park_tables,
    })
}

impl Built {
    /// Starts every part: the pipelines subscribe and their loops run, the
    /// relay's table follows its topic, the admin server serves. A pipeline
    /// that cannot subscribe stops every part started before it, and the
    /// start waits for them to end before it returns the error.
    async fn start(self) -> Result<Running, Error> {
        let Built {
            cluster,
            telemetry,
            deadline,
            routes,
            relay,
            slots,
            engine,
            lag,
            admin,
            reloader,
            parked,
        } = self;
        let shutdown = CancellationToken::new();
        // Followed before any partition starts: a partition's task waits
        // until its route's table has read the topic's end.
        let mut park_stores = HashMap::new();
        for table in parked {
            let store = table.follow(shutdown.clone());
            park_stores.insert(store.table.route().to_string(), Arc::downgrade(&store));
        }
        let loops = TaskTracker::new();
        let supervision = Supervision::default();
        let start = pipelines::Start {
            telemetry: &telemetry,
            shutdown: &shutdown,
            loops: &loops,
            supervision: &supervision,
            deadline,
        };
        let started = start_pipelines(&start, routes, relay);
        loops.close();
        let (cancels, relay_entries) = match started {
            Ok(relay) => relay,
            Err(e) => {
                shutdown.cancel();
                loops.wait().await;
                reloader.stop().await;
                return Err(e.into());
            }
        };
        cluster.follow_recovery(shutdown.clone());
        // Health outlives the routes (the admin server, the telemetry in
        // every route's grants), so it reads the handler versions through a
        // weak handle: a strong one would keep every handler, and with them
        // the engine, alive for as long as any of those.
        let status = reloader.status_reader();
        telemetry.health().set_handlers(Box::new(move || {
            status()
                .into_iter()
                .map(|s| health::HandlerInfo {
                    route: s.route,
                    file: s.handler.display().to_string(),
                    version: s.version,
                    last_reload_error: s.last_reload_error,
                })
                .collect()
        }));
        if let Some(watched) = lag {
            let health = telemetry.health().clone();
            lag::spawn_sampler(cluster, watched, health, shutdown.clone());
        }
        let admin = admin.map(admin::Bound::serve);
        Ok(Running {
            telemetry,
            _stop_on_drop: shutdown.clone().drop_guard(),
            shutdown,
            loops,
            slots,
            reloader,
            admin,
            supervision,
            engine,
            cancels,
            relay_entries,
            park_stores,
        })
    }
}

/// The relay's table, following its topic, and its entries' producer, when
/// a relay runs.
type Followed = (
    Option<Arc<delay::CancelTable>>,
    Option<std::sync::Weak<renewable::AwaitedProducer>>,
);

/// Starts every route's pipeline, then the relay's and its table's
/// following; stops at the first that cannot start.
fn start_pipelines(
    start: &pipelines::Start<'_>,
    routes: Vec<pipelines::Built<route::RouteProcessor>>,
    relay: Option<Relay>,
) -> Result<Followed, KafkaError> {
    for built in routes {
        let route = built.processor().route.clone();
        let topics = built.topics().join(",");
        built
            .start(start)
            .map_err(|e| starting(format!("route `{}`", route.name), e))?;
        tracing::info!(
            route = route.name,
            topics,
            group = route.group,
            dlq = route.dlq,
            "Route started."
        );
    }
    let Some(relay) = relay else {
        return Ok((None, None));
    };
    let settings = relay.settings;
    relay
        .pipeline
        .start(start)
        .map_err(|e| starting("the delay relay".into(), e))?;
    let table = relay.table.follow(start.shutdown.clone());
    tracing::info!(
        inbox = settings.inbox,
        tiers = settings.tiers.len(),
        dlq = settings.dlq,
        "Delay relay started."
    );
    Ok((Some(table), Some(relay.entries)))
}

/// `pipeline` (`route `name`` or `the delay relay`) could not be built or
/// started.
fn starting(pipeline: String, error: KafkaError) -> KafkaError {
    KafkaError::Pipeline {
        pipeline,
        source: Box::new(error),
    }
}

impl Running {
    /// Stops every route: fetching stops, the calls in flight finish, their
    /// hops are acknowledged and the offsets committed, each pipeline within
    /// the shutdown deadline ([`Options::shutdown_timeout`]).
    pub async fn stop(self) -> Stopped {
        self.shutdown.cancel();
        self.loops.wait().await;
        if let Some(admin) = self.admin {
            admin.stop().await;
        }
        // The reload task and any load it started hold the runtime.
        self.reloader.stop().await;
        let ends = std::mem::take(&mut *self.supervision.ends.lock().unwrap());
        let reasons = |failed: bool| -> Vec<String> {
            ends.iter()
                .filter_map(|(name, ended)| match ended {
                    crate::pipeline::Ended::Failed(why) if failed => {
                        Some(format!("`{name}`: {why}"))
                    }
                    crate::pipeline::Ended::Incomplete(why) if !failed => {
                        Some(format!("`{name}`: {why}"))
                    }
                    _ => None,
                })
                .collect()
        };
        let (failed, incomplete) = (reasons(true), reasons(false));
        if !failed.is_empty() {
            Stopped::Failed(failed.join("; "))
        } else if !incomplete.is_empty() {
            Stopped::Incomplete(incomplete.join("; "))
        } else {
            Stopped::Cleanly
        }
    }
}
