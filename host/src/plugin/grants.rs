//! A route's grants at run time: its resolved [`Grants`], its HTTP client,
//! and the counters of what its handler did with them.
//!
//! They belong to the route, not to a handler version: every version of a
//! route's handler shares them, so a reload keeps the pooled connections.
//! The [`Registry`] hands each load the route's grants, built on first use.

use super::canned::CannedHttp;
use crate::config::{Grants, Route};
use crate::egress::{HostLimiter, Resolve, Scheme, Transport, TransportError, TransportSettings};
use crate::events::{HttpCounters, Telemetry};
use crate::metrics::{Counter, Histogram, series};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wasmtime_wasi_http::WasiBody;

/// What a route's handler may do, and where it is reported.
pub(super) struct RouteGrants {
    pub(super) config: Grants,
    /// `None` when the route grants no hosts: every request is denied
    /// without a client ever being built.
    pub(super) transport: Option<Transport<WasiBody>>,
    /// Answers requests the grants allow in place of the transport, for
    /// `hopper plugin test`; `None`: requests go out.
    pub(super) canned: Option<Arc<CannedHttp>>,
    pub(super) telemetry: Telemetry,
    /// Its handler's HTTP requests.
    pub(super) http: HttpCounters,
    /// `hopper_emitted_records_total{route,result=refused}`.
    pub(super) emits_refused: Counter,
    /// One per `http.hosts` entry, in the order of `config.http.hosts`.
    /// Held here, so every version of the route's handler and every
    /// partition's calls wait in the same line.
    pub(super) limiters: Vec<HostLimiter>,
    /// `hopper_http_wait_seconds{route}`: each limited request's wait for
    /// its turn; made only for a route with limits.
    pub(super) http_wait: Option<Histogram>,
}

impl RouteGrants {
    /// The limiter of the `allowed_hosts` entry that lets a request to
    /// `scheme://host:port` through, if that entry has limits. A route
    /// without limits looks nothing up.
    pub(super) fn limiter(&self, scheme: Scheme, host: &str, port: u16) -> Option<&HostLimiter> {
        if self.limiters.is_empty() {
            return None;
        }
        let entry = self.config.allowed_hosts.entry_for(scheme, host, port)?;
        self.limiters.iter().find(|l| l.limit().entry == entry)
    }
}

impl RouteGrants {
    fn new(
        route: &Route,
        telemetry: &Telemetry,
        resolver: Option<Arc<dyn Resolve>>,
        canned: Option<Arc<CannedHttp>>,
    ) -> Result<RouteGrants, TransportError> {
        let config = route.grants.clone();
        let transport = if config.allowed_hosts.is_empty() || canned.is_some() {
            None
        } else {
            let limits = &config.http;
            Some(Transport::new(
                config.allowed_hosts.clone(),
                &TransportSettings {
                    connect_timeout: limits.connect_timeout,
                    max_idle_per_host: limits.max_idle_per_host,
                    idle_timeout: limits.idle_timeout,
                    ca_file: limits.ca_file.clone(),
                    resolver,
                },
            )?)
        };
        let (route, metrics) = (route.name.as_str(), telemetry.metrics());
        let limiters: Vec<HostLimiter> = config
            .http
            .hosts
            .iter()
            .cloned()
            .map(HostLimiter::new)
            .collect();
        let http_wait = (!limiters.is_empty()).then(|| metrics.http_wait(route));
        if !limiters.is_empty() {
            let limits: Vec<String> = limiters.iter().map(|l| l.limit().to_string()).collect();
            // hopper reads its config once: the limits hold until a restart
            // with a new config, across every reload of the handler.
            tracing::info!(
                route,
                limits = limits.join("; "),
                "Outbound HTTP limits set; they change when hopper restarts with a new config, not on a handler reload."
            );
        }
        Ok(RouteGrants {
            limiters,
            http_wait,
            config,
            transport,
            canned,
            telemetry: telemetry.clone(),
            http: HttpCounters::register(metrics, route),
            emits_refused: metrics.handle(&series::EmittedRecords {
                route,
                result: "refused",
            }),
        })
    }
}

/// Every route's grants, by route name.
#[derive(Default)]
pub(super) struct Registry {
    // std Mutex: held to look up or insert, never across an .await.
    routes: Mutex<HashMap<String, Arc<RouteGrants>>>,
    /// Resolves names for every route's client; `None`: the system's.
    resolver: Option<Arc<dyn Resolve>>,
    /// Answers every route's requests instead of a client, when set.
    canned: Option<Arc<CannedHttp>>,
}

impl Registry {
    pub(super) fn with_resolver(resolver: Arc<dyn Resolve>) -> Registry {
        Registry {
            routes: Mutex::default(),
            resolver: Some(resolver),
            canned: None,
        }
    }

    /// A registry whose routes' requests are answered by `canned`.
    pub(super) fn with_canned(canned: Arc<CannedHttp>) -> Registry {
        Registry {
            routes: Mutex::default(),
            resolver: None,
            canned: Some(canned),
        }
    }

    /// The grants of `route`: the ones already built for it when its grants
    /// are unchanged, so a reload keeps the route's connections; else new.
    pub(super) fn for_route(
        &self,
        route: &Route,
        telemetry: &Telemetry,
    ) -> Result<Arc<RouteGrants>, TransportError> {
        let mut routes = self.routes.lock().unwrap();
        if let Some(grants) = routes.get(&route.name)
            && grants.config == route.grants
        {
            return Ok(grants.clone());
        }
        let grants = Arc::new(RouteGrants::new(
            route,
            telemetry,
            self.resolver.clone(),
            self.canned.clone(),
        )?);
        routes.insert(route.name.clone(), grants.clone());
        Ok(grants)
    }
}
