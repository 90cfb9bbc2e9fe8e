//! Outbound HTTP for handlers, apart from WebAssembly: which hosts and
//! addresses a route may reach ([`AllowList`]), the route's pooled client
//! ([`Transport`]) and the response body a handler reads ([`LimitedBody`]).
//! [`crate::plugin`] connects this to `wasi:http`; nothing here knows about
//! guests.

mod allow;
mod body;
mod transport;

pub use allow::{AllowList, Guard, OwnEndpoint, Scheme, is_guarded};
pub use body::{BodyError, LimitedBody};
pub use transport::{Resolve, SendError, Transport, TransportError, TransportSettings};
