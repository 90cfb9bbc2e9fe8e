//! Outbound HTTP for handlers, apart from WebAssembly: which hosts and
//! addresses a route may reach ([`AllowList`]), the route's pooled client
//! ([`Transport`]), the response body a handler reads ([`LimitedBody`]) and
//! the limits of each service a route calls ([`HostLimiter`]).
//! [`crate::plugin`] connects this to `wasi:http`; nothing here knows about
//! guests.

mod allow;
mod body;
mod limit;
mod transport;

pub use allow::{AllowList, Guard, OwnEndpoint, Scheme, is_guarded};
pub use body::{BodyError, LimitedBody};
pub use limit::{Holding, HostLimit, HostLimiter, Rate, Refused, Turn};
pub use transport::{Resolve, SendError, Transport, TransportError, TransportSettings};
