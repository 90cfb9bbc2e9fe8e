//! hopper: delay, retry and dead-letter plumbing for Kafka, around sandboxed
//! WebAssembly handlers.
//!
//! A message's path through the code, always down the layers
//! (docs/architecture.md): [`pipeline`] (the consumer loop: tier messages
//! wait in [`hold`], due ones are queued on their partition and started as
//! calls as the route's ordering allows) → a
//! [`hop::Processor`]: [`route`] (reads the [`headers`] envelope, calls the
//! [`plugin`] handler, and asks [`retry`] for the next hop, or [`dlq`]) or
//! [`delay`] (the next tier, or the [`scheduler`] for the last stretch) → the
//! planned [`hop`] goes to [`produce`] → on its acknowledgement the source
//! offset is marked done in [`offsets`], and the loop stores it for commit.

pub mod admin;
pub mod breaker;
pub mod clock;
pub mod config;
pub mod delay;
pub mod dlq;
pub mod egress;
pub mod embedded;
pub mod events;
pub mod headers;
pub mod health;
pub mod hold;
pub mod hop;
pub mod kafka;
pub mod lag;
pub mod metrics;
pub mod offsets;
pub mod per_thread;
pub mod pipeline;
pub mod plugin;
pub mod produce;
pub mod reload;
pub mod renewable;
pub mod retry;
pub mod route;
pub mod scheduler;
pub mod spans;
pub mod trace;
pub mod traceparent;
pub mod trial;
pub mod types;

/// The memory allocator of hopper's binaries and benchmarks. A hop makes
/// many small allocations on several threads (the calls, the
/// producer's callback thread); glibc's malloc spends a third of the hop
/// path growing and trimming its per-thread heaps (BENCHMARKS.md).
///
/// With mimalloc's `override` feature it also serves the C code's `malloc`
/// and `free`: librdkafka allocates each header of a record it produces, and
/// frees it on its own thread once the record is acknowledged, which cost
/// glibc's malloc a fifth of the dead-letter path.
pub use mimalloc::MiMalloc as Allocator;

/// Tunes [`Allocator`]; binaries call it first thing. Freed pages are kept
/// for a second before they go back to the OS, instead of 10 ms: librdkafka
/// frees and refills its fetch buffers many times a second, and returning
/// them at once made a fifth of the no-op path page faults (BENCHMARKS.md).
pub fn tune_allocator() {
    // SAFETY: sets a process-wide option, which mimalloc allows from any
    // thread at any time; `MI_OPTION_PURGE_DELAY` is checked to be the
    // purge delay by the test below.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 1000) };
}

/// `mi_option_purge_delay` in mimalloc's `mi_option_e`, for which the sys
/// crate names no constant. `purge_delay_is_the_option_mimalloc_reads_from_its_env`
/// proves the number against the name mimalloc itself gives it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

#[cfg(test)]
mod allocator_tests {
    /// mimalloc reads each option from `MIMALLOC_<NAME>` in the environment
    /// when it first reads the option. So a process started with
    /// `MIMALLOC_PURGE_DELAY` set reads that value back from option 15 only
    /// if option 15 is the purge delay.
    #[test]
    fn purge_delay_is_the_option_mimalloc_reads_from_its_env() {
        const PROBE: &str = "HOPPER_PURGE_DELAY_PROBE";
        if std::env::var_os(PROBE).is_some() {
            // SAFETY: reads a process-wide option.
            let value = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
            assert_eq!(value, 4321, "option 15 is not MIMALLOC_PURGE_DELAY");
            return;
        }
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "allocator_tests::purge_delay_is_the_option_mimalloc_reads_from_its_env",
            ])
            .env(PROBE, "1")
            .env("MIMALLOC_PURGE_DELAY", "4321")
            .status()
            .unwrap();
        assert!(status.success(), "the probe process failed: {status}");
    }
}

use anyhow::Context as _;
use config::Config;
use events::Telemetry;
use kafka::Cluster;
use rdkafka::consumer::Consumer;
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
    /// How long [`Hopper::stop`] may take to drain: finish the calls in
    /// flight, have their hops acknowledged and commit. Default 30 s, at
    /// most [`MAX_SHUTDOWN_TIMEOUT`].
    pub shutdown_timeout: std::time::Duration,
}

/// The longest drain [`Options::shutdown_timeout`] may ask for: a day, far
/// past a route's longest call (an hour). The drain's end is computed as
/// now plus the timeout, which a larger value could overflow.
pub const MAX_SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Options {
    /// Checks the options on their own: the shutdown timeout is at most
    /// [`MAX_SHUTDOWN_TIMEOUT`].
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.shutdown_timeout > MAX_SHUTDOWN_TIMEOUT {
            anyhow::bail!(
                "the shutdown timeout must be at most {}, not {}",
                humantime::format_duration(MAX_SHUTDOWN_TIMEOUT),
                humantime::format_duration(self.shutdown_timeout)
            );
        }
        Ok(())
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_dir: None,
            shutdown_timeout: std::time::Duration::from_secs(30),
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

/// What every pipeline's supervisor shares with [`Hopper`].
#[derive(Clone, Default)]
struct Supervision {
    /// Cancelled when a pipeline fails.
    failed: CancellationToken,
    /// How each pipeline ended, by name.
    ends: Arc<std::sync::Mutex<Vec<(String, pipeline::Ended)>>>,
}

/// What every pipeline is started with.
struct Start<'a> {
    cluster: &'a Cluster,
    telemetry: &'a Telemetry,
    shutdown: &'a CancellationToken,
    loops: &'a TaskTracker,
    supervision: &'a Supervision,
    deadline: std::time::Duration,
}

/// Creates the consumer and producer of a pipeline and spawns its loop,
/// under a supervisor that notices when it ends: a pipeline that fails (or
/// whose loop panics) stops the whole hopper, non-zero.
fn start_pipeline<P: hop::Processor>(
    start: &Start<'_>,
    group: &str,
    topics: &[String],
    processor: P,
    gate: Option<Arc<dyn produce::Gate>>,
) -> anyhow::Result<()> {
    let Start {
        cluster,
        telemetry,
        shutdown,
        loops,
        supervision,
        deadline,
    } = *start;
    let pipeline::Connected {
        consumer,
        rebalances: rx,
        trackers,
    } = pipeline::connect(
        &cluster.consumer_config(group),
        processor.name(),
        cluster.watch().clone(),
    )
    .context("creating the consumer")?;
    let subscription: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&subscription).context("subscribing")?;
    let name = processor.name().to_string();
    let assigned = Arc::downgrade(&consumer);
    telemetry.health().set_assignment_probe(
        &name,
        Box::new(move || {
            assigned
                .upgrade()
                .and_then(|c| c.assignment().ok())
                .map_or(0, |a| a.count())
        }),
    );
    let acks = TaskTracker::new();
    let halt = Arc::new(hop::Halt::default());
    let producer = produce::HopProducer::new(
        &cluster.producer_config(),
        cluster.hops_held().unwrap_or(kafka::HOPS_HELD),
        processor.name(),
        processor.dlq_topic(),
        telemetry.clone(),
        acks.clone(),
        halt.clone(),
    )
    .context("creating the producer")?;
    if let Some(gate) = gate {
        producer.set_gate(gate).map_err(anyhow::Error::msg)?;
    }
    // Metadata for the topics it will produce to, fetched off the async
    // start (it may block seconds per topic); a hop before it is done
    // fetches its own.
    let warming = producer.clone();
    let topics = processor.hop_topics();
    tokio::task::spawn_blocking(move || warming.warm_up(&topics));
    let shared = Arc::new(pipeline::Shared {
        processor,
        producer,
        consumer,
        telemetry: telemetry.clone(),
        acks,
        halt,
        trackers,
    });
    let (health, shutdown) = (telemetry.health().clone(), shutdown.clone());
    let supervision = supervision.clone();
    loops.spawn(async move {
        let run = tokio::spawn(pipeline::run(shared, rx, shutdown.clone(), deadline));
        let ended = match run.await {
            Ok(ended) => ended,
            Err(e) if e.is_panic() => pipeline::Ended::Failed(format!(
                "the consumer loop of `{name}` panicked; nothing past its last commit was committed"
            )),
            Err(_) => {
                pipeline::Ended::Failed(format!("the consumer loop of `{name}` was cancelled"))
            }
        };
        if let pipeline::Ended::Failed(why) = &ended {
            health.stop(&name, why.clone());
            supervision.failed.cancel();
        } else if !shutdown.is_cancelled() {
            health.stop(&name, "its consumer loop ended");
            supervision.failed.cancel();
        }
        supervision.ends.lock().unwrap().push((name, ended));
    });
    Ok(())
}

/// A running hopper: one consumer loop per route.
pub struct Hopper {
    telemetry: Telemetry,
    /// Cancelled by [`Hopper::stop`]; every route loop watches it.
    shutdown: CancellationToken,
    loops: TaskTracker,
    slots: HashMap<String, Arc<plugin::HandlerSlot>>,
    /// Swaps new handler versions into the slots; dropped with hopper.
    reloader: reload::Reloader,
    /// The admin server, when the config has an `[admin]` table; stopped
    /// after the routes.
    admin: Option<admin::Server>,
    supervision: Supervision,
    engine: plugin::EngineWatch,
    /// The delay relay's cancellation table, followed until shutdown.
    cancels: Option<Arc<delay::CancelTable>>,
    /// The delay relay's producer of the entries it awaits; weak, so that
    /// it goes with the relay's pipeline.
    relay_entries: Option<std::sync::Weak<renewable::AwaitedProducer>>,
}

impl Hopper {
    /// Loads every handler, makes sure every topic exists, and starts every
    /// route. Nothing starts unless all of that succeeds; a failure names
    /// every handler that could not be loaded.
    pub async fn start(config: Config, options: Options) -> anyhow::Result<Hopper> {
        options.validate()?;
        let cluster = Cluster::of(&config.kafka)?;
        // Nothing starts unless a broker answers and takes the credentials:
        // a wrong password or CA fails here, by name, within seconds.
        let check = cluster.clone();
        tokio::task::spawn_blocking(move || check.check_connection()).await??;
        let metrics_on = config.admin.as_ref().is_some_and(|a| a.metrics);
        let telemetry = Telemetry::for_config(&config, metrics_on)
            .with_tracing(config.tracing.as_ref())
            .map_err(anyhow::Error::msg)
            .context("starting span export")?;
        telemetry.health().set_connection(cluster.watch().clone());
        let mut runtime = plugin::Runtime::for_routes(&config.routes)
            .context("starting the WebAssembly runtime")?
            .with_telemetry(telemetry.clone());
        if let Some(dir) = &options.cache_dir {
            runtime = runtime.with_cache(dir.clone())?;
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
                Err(e) => failures.push(format!("route `{}`: {e}", route.name)),
            }
        }
        if !failures.is_empty() {
            anyhow::bail!("{}", failures.join("\n"));
        }

        // The cancellation topic is compacted: created with its settings
        // before the check that creates the rest.
        if let Some(relay) = &config.delay
            && delay::CancelTable::ensure_topic(&cluster, &relay.cancels, relay.cancel_lifetime())
                .await?
        {
            tracing::info!(topic = relay.cancels, "Cancellation topic created.");
        }
        let created = cluster.ensure_topics(&config.all_topics()).await?;
        if !created.is_empty() {
            tracing::info!(topics = created.join(","), "Topics created.");
        }

        let shutdown = CancellationToken::new();
        let loops = TaskTracker::new();
        let supervision = Supervision::default();
        let start = Start {
            cluster: &cluster,
            telemetry: &telemetry,
            shutdown: &shutdown,
            loops: &loops,
            supervision: &supervision,
            deadline: options.shutdown_timeout,
        };
        let mut slots = HashMap::new();
        let mut cancels: Option<Arc<delay::CancelTable>> = None;
        let mut relay_entries = None;
        let mut reload_targets = Vec::new();
        for (route, handler) in config.routes.iter().zip(handlers) {
            let route = Arc::new(route.clone());
            let slot = Arc::new(plugin::HandlerSlot::new(handler));
            slots.insert(route.name.clone(), slot.clone());
            let processor =
                route::RouteProcessor::new(route.clone(), slot.clone(), telemetry.clone());
            reload_targets.push(reload::Target {
                route: route.clone(),
                slot: slot.clone(),
            });
            let mut subscription: Vec<String> = route.topics.clone();
            subscription.extend(processor.tiers.keys().cloned());
            start_pipeline(&start, &route.group, &subscription, processor, None)
                .with_context(|| format!("starting route `{}`", route.name))?;
            tracing::info!(
                route = route.name,
                topics = subscription.join(","),
                group = route.group,
                dlq = route.dlq,
                "Route started."
            );
        }
        if let Some(relay) = &config.delay {
            let metadata = cluster
                .consumer_config(&relay.group)
                .create_with_context(cluster.watched("the delay relay's metadata"))
                .context("creating the delay relay's metadata client")?;
            // Read to its end before the relay forwards anything, so a
            // cancel recorded before a crash or a rebalance still holds.
            let table = delay::CancelTable::start(
                &cluster,
                &relay.cancels,
                relay.cancel_lifetime(),
                relay.max_cancellations,
                telemetry.clone(),
                shutdown.clone(),
            )
            .await
            .context("loading the delay relay's cancellation table")?;
            let entries = Arc::new(
                renewable::AwaitedProducer::new(
                    cluster.producer_config(),
                    "the delay relay's cancellation entries",
                )
                .context("creating the delay relay's cancellation producer")?,
            );
            let processor = delay::DelayProcessor::new(
                Arc::new(relay.clone()),
                metadata,
                telemetry.clone(),
                table.clone(),
                entries.clone(),
            );
            relay_entries = Some(Arc::downgrade(&entries));
            let mut subscription = vec![relay.inbox.clone()];
            subscription.extend(relay.tiers.iter().map(|(_, t)| t.clone()));
            let gate: Arc<dyn produce::Gate> = table.clone();
            start_pipeline(&start, &relay.group, &subscription, processor, Some(gate))
                .context("starting the delay relay")?;
            cancels = Some(table);
            tracing::info!(
                inbox = relay.inbox,
                tiers = relay.tiers.len(),
                dlq = relay.dlq,
                "Delay relay started."
            );
        }
        loops.close();
        cluster.follow_recovery(shutdown.clone());
        let reloader = reload::Reloader::start(runtime, reload_targets, telemetry.clone());
        let reloader = match reloader {
            Ok(reloader) => reloader,
            Err(e) => {
                shutdown.cancel();
                loops.wait().await;
                return Err(e.into());
            }
        };
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
        if metrics_on {
            let watched = lag::watched(&config);
            let health = telemetry.health().clone();
            lag::spawn_sampler(cluster.clone(), watched, health, shutdown.clone());
        }
        let admin = match config.admin.clone() {
            None => None,
            Some(settings) => {
                let context = admin::Context {
                    config: Arc::new(config),
                    cluster,
                    telemetry: telemetry.clone(),
                    cancels: cancels.clone(),
                };
                match admin::Server::start(context, settings).await {
                    Ok(server) => Some(server),
                    Err(e) => {
                        shutdown.cancel();
                        loops.wait().await;
                        return Err(e.into());
                    }
                }
            }
        };
        Ok(Hopper {
            telemetry,
            shutdown,
            loops,
            slots,
            reloader,
            admin,
            supervision,
            engine,
            cancels,
            relay_entries,
        })
    }

    /// The delay relay's cancellation table, when a relay runs.
    pub fn cancellations(&self) -> Option<Arc<delay::CancelTable>> {
        self.cancels.clone()
    }

    /// The delay relay's producer of the cancellation entries it awaits,
    /// while a relay runs. For tests of its replacement.
    #[doc(hidden)]
    pub fn relay_entries(&self) -> Option<Arc<renewable::AwaitedProducer>> {
        self.relay_entries.as_ref()?.upgrade()
    }

    /// Whether this hopper's WebAssembly engine is alive. It is freed, with
    /// its pooling reservation and epoch thread, by the time
    /// [`Hopper::stop`] returns.
    pub fn engine(&self) -> plugin::EngineWatch {
        self.engine.clone()
    }

    /// Where the admin server listens, when it runs.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().map(admin::Server::addr)
    }

    /// The admin server's session token, when it runs without a configured
    /// token ([`admin::Server::session_token`]).
    pub fn admin_session_token(&self) -> Option<&str> {
        self.admin.as_ref().and_then(admin::Server::session_token)
    }

    /// Events of every route, from now on.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<events::Event> {
        self.telemetry.subscribe()
    }

    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// The handler version serving `route` now.
    pub fn handler_version(&self, route: &str) -> Option<String> {
        self.slots
            .get(route)
            .map(|s| s.current().version().to_string())
    }

    /// Per route: the handler file, the serving version (sha256) and the
    /// last reload error, if the file as it is now could not be loaded.
    pub fn status(&self) -> Vec<reload::RouteStatus> {
        self.reloader.status()
    }

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
                    pipeline::Ended::Failed(why) if failed => Some(format!("`{name}`: {why}")),
                    pipeline::Ended::Incomplete(why) if !failed => Some(format!("`{name}`: {why}")),
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

    /// Runs until `shutdown` completes, or until a pipeline fails, then
    /// stops every route.
    pub async fn run_until(self, shutdown: impl std::future::Future<Output = ()>) -> Stopped {
        tokio::select! {
            _ = shutdown => {}
            _ = self.supervision.failed.cancelled() => {
                tracing::error!("A pipeline failed; stopping every route.");
            }
        }
        self.stop().await
    }
}
