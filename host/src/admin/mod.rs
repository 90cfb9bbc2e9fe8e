//! The admin HTTP server: health and readiness, Prometheus `/metrics`, the
//! JSON API over routes, handlers and dead-letter topics, replay, and the
//! web console.
//!
//! It listens on 127.0.0.1 unless `admin.listen` says otherwise. Every
//! `/api` call needs a bearer token, reads included: DLQ payloads are data.
//! The server makes a session token at start, which reads only
//! ([`Server::session_token`]; `hopper run` writes it to a file for the CLI
//! and, without a configured token, logs the console's URL with it). A
//! configured token (`admin.token` or `HOPPER_ADMIN_TOKEN`) reads too, and
//! only it changes state (replay, cancel) or runs an uploaded handler
//! (`/api/dlq/try`, which `admin.allow_code_upload` must also allow).
//! A non-loopback listen needs a configured
//! token to start. Tokens are compared in constant time. The API and the
//! console also refuse a `Host` that is not this server's
//! (`auth::host_allowed`), so a web page that rebinds its name to 127.0.0.1
//! reads nothing. `/health`, `/ready` and `/metrics` stay open for probes
//! and scrapers, which name the server by whatever address they reach it
//! at.
//!
//! Handlers cannot reach this server (its address is guarded in every
//! route's allow-list, `egress::OwnEndpoint`), and no handler can obtain a
//! token to read another's on the same host.

mod api;
mod auth;
mod candidate;
mod console;
mod parked;
mod runs;

use crate::config::{Admin, Config};
use crate::dlq::Pacer;
use crate::dlq::live::LiveGroups;
use crate::events::Telemetry;
use crate::kafka::Cluster;
use axum::Router;
use axum::routing::{get, post};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Why the admin server could not start. Names the address.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("admin server: cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("admin server: cannot make a session token from the system's random source: {0}")]
    Random(std::io::Error),
}

/// What the server serves from.
pub struct AdminContext {
    pub config: Arc<Config>,
    pub cluster: Cluster,
    pub telemetry: Telemetry,
    /// The delay relay's cancellation table, when a relay runs.
    pub cancels: Option<Arc<crate::delay::CancelTable>>,
    /// The park tables of the routes with ordered retries, by route.
    pub parked: std::collections::HashMap<String, Arc<crate::parked::Store>>,
}

/// Shared by every request.
struct State {
    context: AdminContext,
    admin: Admin,
    token: auth::Token,
    /// Paces every replay this process makes, together.
    pacer: Arc<Pacer>,
    /// The replay runs started through the API, and their status.
    runs: runs::Runs,
    /// The runs' tasks: [`Server::stop`] waits for them.
    tasks: tokio_util::task::TaskTracker,
    /// Cancelled when the server stops: the server, its readers and its
    /// runs (between two batches) stop.
    stop: CancellationToken,
    /// Bounds the reads of dead-letter topics in flight
    /// ([`api::MAX_DLQ_READS`]).
    dlq_reads: Arc<tokio::sync::Semaphore>,
    /// The dead-letter groups, kept current by following each DLQ topic.
    live: Arc<LiveGroups>,
}

/// A running admin server; stops when hopper stops.
pub struct Server {
    addr: SocketAddr,
    /// The session's read token.
    session: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// The readers of the dead-letter topics for the live groups.
    readers: Vec<tokio::task::JoinHandle<()>>,
    /// The replay runs' tasks.
    runs: tokio_util::task::TaskTracker,
    /// Stops the server, its readers and its runs when it is dropped
    /// without [`Server::stop`].
    _stop_on_drop: tokio_util::sync::DropGuard,
}

/// An admin server bound to its address that serves nothing yet: hopper
/// binds it while it builds everything, and serves once all of it was
/// built. Dropped, it frees the address.
pub struct Bound {
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    session: String,
    state: Arc<State>,
}

impl Bound {
    /// Serves until [`Server::stop`].
    pub fn serve(self) -> Server {
        let Bound {
            listener,
            addr,
            session,
            state,
        } = self;
        let stop = state.stop.clone();
        let runs = state.tasks.clone();
        let readers = state.live.follow(
            &state.context.cluster,
            state.context.config.dead_letter_topics(),
            &stop,
        );
        let app = router(state);
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "Admin server failed.");
            }
        });
        tracing::info!(address = %addr, "Admin server listening.");
        Server {
            addr,
            session,
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            task,
            readers,
            runs,
        }
    }
}

impl Server {
    /// Binds `admin.listen`, and makes the session's read token; serves
    /// nothing until [`Bound::serve`].
    pub async fn bind(context: AdminContext, admin: Admin) -> Result<Bound, AdminError> {
        let listener = tokio::net::TcpListener::bind(admin.listen)
            .await
            .map_err(|source| AdminError::Listen {
                addr: admin.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| AdminError::Listen {
            addr: admin.listen,
            source,
        })?;
        // Guards the bound address (the chosen port, for `:0`) from handlers.
        admin.own.set(addr);
        let (token, session) =
            auth::Token::new(admin.token.as_deref()).map_err(AdminError::Random)?;
        let state = Arc::new(State {
            pacer: Arc::new(Pacer::new(context.config.replay.rate)),
            runs: runs::Runs::default(),
            tasks: tokio_util::task::TaskTracker::new(),
            stop: CancellationToken::new(),
            dlq_reads: Arc::new(tokio::sync::Semaphore::new(api::MAX_DLQ_READS)),
            live: LiveGroups::new(),
            token,
            context,
            admin,
        });
        Ok(Bound {
            listener,
            addr,
            session,
            state,
        })
    }

    /// This session's read token: 64 hex digits, made at start. It reads
    /// only; replay, cancels and a candidate's upload need the configured
    /// token.
    pub fn session_token(&self) -> &str {
        &self.session
    }

    /// The address it listens on (with the port the OS chose for `:0`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting requests and waits for those in flight.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
        // A reader stops within a poll, unless it waits on a broker that
        // is gone (metadata, up to its timeout): then it ends by itself.
        let readers = async {
            for reader in self.readers {
                let _ = reader.await;
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), readers).await;
        // A run stops after its batch in flight, whose produces are
        // bounded by their timeout; stopped, it is resumed with its id.
        self.runs.close();
        if tokio::time::timeout(RUNS_STOP, self.runs.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                waited = ?RUNS_STOP,
                "A replay run did not stop in time; its batch in flight goes on, and a resume of the run finds what it replayed."
            );
        }
    }
}

/// How long [`Server::stop`] waits for the replay runs to stop.
const RUNS_STOP: std::time::Duration = std::time::Duration::from_secs(10);

fn router(state: Arc<State>) -> Router {
    let api = Router::new()
        .route("/routes", get(api::routes))
        .route("/handlers", get(api::handlers))
        .route("/status", get(api::status))
        .route("/dlq", get(api::dlq_list))
        .route("/dlq/groups", get(api::dlq_groups))
        .route("/dlq/{topic}/{partition}/{offset}", get(api::dlq_show))
        .route(
            "/replay",
            post(api::replay).route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                auth::require_token,
            )),
        )
        .route("/replay/runs/{run}", get(runs::status))
        .route(
            "/dlq/try",
            post(candidate::dlq_try)
                .layer(axum::extract::DefaultBodyLimit::max(
                    candidate::MAX_CANDIDATE_BYTES,
                ))
                .route_layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    auth::require_token,
                )),
        )
        .route("/parked", get(parked::list))
        .route(
            "/parked/release",
            post(parked::release).route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                auth::require_token,
            )),
        )
        .route("/delay/cancels/{id}", get(api::delay_show))
        .route(
            "/delay/cancel",
            post(api::delay_cancel).route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                auth::require_token,
            )),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token_for_reads,
        ));
    let named = Router::new()
        .nest("/api", api)
        .merge(console::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_known_host,
        ));
    Router::new()
        .route("/health", get(api::health))
        .route("/ready", get(api::ready))
        .route("/metrics", get(api::metrics))
        .merge(named)
        .with_state(state)
}
