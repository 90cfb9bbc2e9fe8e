//! A small order service for hopper's demo and tests: a real HTTP/1.1 server
//! on 127.0.0.1 that knows a set of orders, closes them, and fails on cue.
//!
//! The order-timeout handlers (plugins/order-timeout*) call it through
//! hopper's outbound HTTP, so `retryable`, `fatal` and emitted events come
//! from real responses rather than from fields of the payload.
//!
//! The API (every body is JSON):
//! - `GET /orders`: every order, `[{"order_id":…,"status":…}, …]`.
//! - `GET /orders/{id}`: the order, or 404.
//! - `POST /orders/{id}/close`: closes a pending order and answers 200 with
//!   the closed order. Closing is idempotent: an order that is already
//!   closed answers 200 the same way, so a handler that retries after a
//!   lost response gets the answer it missed. An order that is paid,
//!   cancelled or refunded cannot be closed: 409 with the order, so the
//!   caller sees its status. An unknown order: 404. An order with a
//!   [`Fault`]: 503 while the fault lasts.
//!
//! `{id}` is one path segment, percent-encoded (`o%2F1` is the order `o/1`).
//! The service lives as long as its [`OrderService`]; dropping it stops the
//! listener and every open connection.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// Where an order stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Not paid yet: the only status that closing changes.
    Pending,
    Paid,
    Cancelled,
    Refunded,
    /// Closed unpaid.
    Closed,
}

/// How the service misbehaves for one order's close requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// 503 for this many close requests, then fine.
    Flaky { failures: u32 },
    /// 503 for every close request.
    Down,
}

/// An order the service knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub id: String,
    pub status: Status,
    pub fault: Option<Fault>,
}

impl Order {
    pub fn new(id: impl Into<String>, status: Status) -> Order {
        Order {
            id: id.into(),
            status,
            fault: None,
        }
    }

    /// The same order, with close requests failing with 503 `failures`
    /// times before they succeed.
    pub fn flaky(self, failures: u32) -> Order {
        Order {
            fault: Some(Fault::Flaky { failures }),
            ..self
        }
    }

    /// The same order, with every close request failing with 503.
    pub fn down(self) -> Order {
        Order {
            fault: Some(Fault::Down),
            ..self
        }
    }
}

/// One request the service answered, in the order they arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub method: String,
    /// The path as requested (still percent-encoded).
    pub path: String,
    pub status: u16,
}

/// A running order service. Dropping it stops the service.
pub struct OrderService {
    address: SocketAddr,
    state: Arc<State>,
    /// The accept loop; it owns every connection task in a `JoinSet`, so
    /// aborting it (on drop) closes every connection too.
    server: JoinHandle<()>,
}

/// What the connections share. std Mutex: every handler takes it, reads or
/// writes a map entry and lets go; nothing awaits under it.
#[derive(Default)]
struct State {
    orders: Mutex<BTreeMap<String, Order>>,
    served: Mutex<Vec<Served>>,
}

impl OrderService {
    /// Starts the service on an ephemeral port of 127.0.0.1, on the current
    /// tokio runtime, knowing `orders`.
    pub async fn start(orders: impl IntoIterator<Item = Order>) -> std::io::Result<OrderService> {
        Self::bind(SocketAddr::from(([127, 0, 0, 1], 0)), orders).await
    }

    /// Starts the service on `address`. Loopback addresses only: the
    /// service has no authentication, so it must not be reachable from
    /// other machines.
    pub async fn bind(
        address: SocketAddr,
        orders: impl IntoIterator<Item = Order>,
    ) -> std::io::Result<OrderService> {
        if !address.ip().is_loopback() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("the order service binds only loopback addresses, not {address}"),
            ));
        }
        let listener = TcpListener::bind(address).await?;
        let address = listener.local_addr()?;
        let state = Arc::new(State::default());
        state
            .orders
            .lock()
            .unwrap()
            .extend(orders.into_iter().map(|o| (o.id.clone(), o)));
        let server = tokio::spawn(serve(listener, state.clone()));
        Ok(OrderService {
            address,
            state,
            server,
        })
    }

    /// `http://127.0.0.1:PORT`, the base URL handlers are configured with.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The order's status now, or `None` for an unknown order.
    pub fn status(&self, id: &str) -> Option<Status> {
        self.state.orders.lock().unwrap().get(id).map(|o| o.status)
    }

    /// Every request answered so far.
    pub fn served(&self) -> Vec<Served> {
        self.state.served.lock().unwrap().clone()
    }
}

impl Drop for OrderService {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors or the like: the next accept may
                // work; the listener itself is still fine.
                Err(_) => continue,
            },
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let state = state.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(answer(&state, request)) }
            });
            // A connection that fails (reset, bad request line) ends here;
            // hyper has already answered what it could.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(state: &State, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_string();
    let response = route(state, request.method(), &path);
    state.served.lock().unwrap().push(Served {
        method: request.method().to_string(),
        path,
        status: response.status().as_u16(),
    });
    response
}

fn route(state: &State, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let (allowed, id, close) = match segments.as_slice() {
        ["orders"] => {
            if method != Method::GET {
                return not_allowed("GET");
            }
            let orders = state.orders.lock().unwrap();
            let list: Vec<OrderBody> = orders.values().map(OrderBody::of).collect();
            return json(StatusCode::OK, &list);
        }
        ["orders", id] => ("GET", *id, false),
        ["orders", id, "close"] => ("POST", *id, true),
        _ => return error(StatusCode::NOT_FOUND, format!("no resource at {path}")),
    };
    if method.as_str() != allowed {
        return not_allowed(allowed);
    }
    let Some(id) = percent_decode(id) else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("order id `{id}` is not valid percent-encoded UTF-8"),
        );
    };
    let mut orders = state.orders.lock().unwrap();
    let Some(order) = orders.get_mut(&id) else {
        return error(StatusCode::NOT_FOUND, format!("no order {id}"));
    };
    if !close {
        return json(StatusCode::OK, &OrderBody::of(order));
    }
    match &mut order.fault {
        Some(Fault::Down) => return unavailable(),
        Some(Fault::Flaky { failures }) if *failures > 0 => {
            *failures -= 1;
            return unavailable();
        }
        _ => {}
    }
    match order.status {
        Status::Pending | Status::Closed => {
            order.status = Status::Closed;
            json(StatusCode::OK, &OrderBody::of(order))
        }
        Status::Paid | Status::Cancelled | Status::Refunded => {
            json(StatusCode::CONFLICT, &OrderBody::of(order))
        }
    }
}

/// An order as the API writes it.
#[derive(Serialize)]
struct OrderBody<'a> {
    order_id: &'a str,
    status: Status,
}

impl<'a> OrderBody<'a> {
    fn of(order: &'a Order) -> OrderBody<'a> {
        OrderBody {
            order_id: &order.id,
            status: order.status,
        }
    }
}

fn json(status: StatusCode, body: &impl Serialize) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).expect("order bodies always serialize");
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    json(status, &BTreeMap::from([("error", message)]))
}

fn unavailable() -> Response<Full<Bytes>> {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "order service unavailable".into(),
    )
}

fn not_allowed(allowed: &'static str) -> Response<Full<Bytes>> {
    let mut response = error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("only {allowed} is allowed here"),
    );
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allowed));
    response
}

/// `o%2F1` → `o/1`; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests;
