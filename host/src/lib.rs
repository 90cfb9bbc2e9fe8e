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
mod allocator;
pub mod breaker;
pub mod clock;
pub mod config;
pub mod delay;
pub mod dlq;
pub mod egress;
pub mod embedded;
mod error;
pub mod events;
pub mod headers;
pub mod health;
pub mod hold;
pub mod hop;
pub mod kafka;
pub mod lag;
pub mod metrics;
pub mod offsets;
pub mod parked;
pub mod per_thread;
pub mod pipeline;
pub mod plugin;
pub mod private_dir;
pub mod produce;
pub mod reload;
pub mod renewable;
pub mod retry;
pub mod route;
pub mod scheduler;
pub mod spans;
mod startup;
pub mod trace;
pub mod traceparent;
pub mod trial;
pub mod types;

pub use allocator::{Allocator, tune_allocator, without_huge_pages};
pub use error::{Error, HandlerError, IoError};
pub use startup::{MAX_SHUTDOWN_TIMEOUT, Options, Stopped};

use config::Config;
use events::Telemetry;
use std::sync::Arc;

/// A running hopper: one consumer loop per route, and one for the delay
/// relay. [`Hopper::start`] builds every part before it starts any
/// (`startup`).
pub struct Hopper {
    running: startup::Running,
}

impl Hopper {
    /// Loads every handler, makes sure every topic exists, and builds every
    /// route, the delay relay (its cancellation table loaded), the admin
    /// server and the reloader; only then starts them. Nothing starts
    /// unless all of that succeeds, and a start that fails stops what it
    /// started before it returns; a failure names every handler that could
    /// not be loaded. The [`Error`]'s kind says what failed (the config,
    /// Kafka, a handler, ...).
    pub async fn start(config: Config, options: Options) -> Result<Hopper, Error> {
        let running = startup::start(config, options).await?;
        Ok(Hopper { running })
    }

    /// The delay relay's cancellation table, when a relay runs.
    pub fn cancellations(&self) -> Option<Arc<delay::CancelTable>> {
        self.running.cancels.clone()
    }

    /// The delay relay's producer of the cancellation entries it awaits,
    /// while a relay runs. For tests of its replacement.
    #[doc(hidden)]
    pub fn relay_entries(&self) -> Option<Arc<renewable::AwaitedProducer>> {
        self.running.relay_entries.as_ref()?.upgrade()
    }

    /// Raises a fatal error in both producers of `route`'s park topic, as a
    /// broker's answers can; false when the route has no ordered retries.
    /// For tests of their replacement.
    #[doc(hidden)]
    pub fn raise_park_fatal(&self, route: &str, reason: &str) -> bool {
        let Some(store) = self.park_store(route) else {
            return false;
        };
        store.raise_fatal(reason);
        true
    }

    /// How many times each producer of `route`'s park topic was replaced,
    /// failed for good: the awaited records' and the parked messages'.
    /// For tests of their replacement.
    #[doc(hidden)]
    pub fn park_producer_renewals(&self, route: &str) -> Option<(u64, u64)> {
        Some(self.park_store(route)?.renewals())
    }

    fn park_store(&self, route: &str) -> Option<Arc<parked::Store>> {
        self.running.park_stores.get(route)?.upgrade()
    }

    /// Whether this hopper's WebAssembly engine is alive. It is freed, with
    /// its pooling reservation and epoch thread, by the time
    /// [`Hopper::stop`] returns.
    pub fn engine(&self) -> plugin::EngineWatch {
        self.running.engine.clone()
    }

    /// Where the admin server listens, when it runs.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.running.admin.as_ref().map(admin::Server::addr)
    }

    /// The admin server's session (read) token, when the server runs
    /// ([`admin::Server::session_token`]).
    pub fn admin_session_token(&self) -> Option<&str> {
        self.running
            .admin
            .as_ref()
            .map(admin::Server::session_token)
    }

    /// Events of every route, from now on.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<events::Event> {
        self.running.telemetry.subscribe()
    }

    pub fn telemetry(&self) -> &Telemetry {
        &self.running.telemetry
    }

    /// The handler version serving `route` now.
    pub fn handler_version(&self, route: &str) -> Option<String> {
        self.running
            .slots
            .get(route)
            .map(|s| s.current().version().to_string())
    }

    /// Per route: the handler file, the serving version (sha256) and the
    /// last reload error, if the file as it is now could not be loaded.
    pub fn status(&self) -> Vec<reload::RouteStatus> {
        self.running.reloader.status()
    }

    /// Stops every route: fetching stops, the calls in flight finish, their
    /// hops are acknowledged and the offsets committed, each pipeline within
    /// the shutdown deadline ([`Options::shutdown_timeout`]).
    pub async fn stop(self) -> Stopped {
        self.running.stop().await
    }

    /// Runs until `shutdown` completes, or until a pipeline fails, then
    /// stops every route.
    pub async fn run_until(self, shutdown: impl std::future::Future<Output = ()>) -> Stopped {
        tokio::select! {
            _ = shutdown => {}
            _ = self.running.supervision.failed.cancelled() => {
                tracing::error!("A pipeline failed; stopping every route.");
            }
        }
        self.stop().await
    }
}
