//! Ordered retries: a route with `retry_order = "key"` parks a key whose
//! message went to a retry tier, and its later messages wait behind that
//! message, its *head*, until it resolves (docs/ordered-retries.md).
//!
//! Kafka is the only store. Each route has a compacted park topic
//! ([`records`]): the key's head, the messages waiting behind it, and the
//! releases of heads. Every process of the route reads the whole topic into
//! a [`ParkTable`] (as the relay reads its cancellations), before its
//! partitions start and then continuously, and every change is written
//! there, and acknowledged, before what depends on it is done:
//!
//! - a head record before the retry record that makes it one, so a key is
//!   never free while its head waits in a tier;
//! - a parked message's record before its input offset is done, so the
//!   input's committed offset moves past a parked key's messages and a
//!   restart reads them back from the table, not from the input;
//! - a waiting message's next hops before its record is deleted.
//!
//! Whoever may write the topic is not trusted: a record read from it is
//! taken in only when the route could have written it
//! ([`ParkTable::read`]), and refused, counted and logged otherwise.
//!
//! A partition's task runs everything of one key one at a time (the key
//! queue), the messages read from the input and the *jobs* the table gives
//! it for a key whose head resolved: the next waiting message, the
//! dead-lettering of a blocked key's, or the deletion of a key's records
//! once none waits. So no two things of one key ever overlap in this
//! process, and a key's order is the order its records reach the topic.

mod records;
mod table;
mod topic;

pub use records::{BadRecord, Head, Lane, Parked, Record, Release};
pub use table::LaneView;
pub use table::{Admission, Inputs, KeyState, KeyView, ParkTable, Refusal, Step};
pub use topic::{
    HeadAck, LoadedTable, NotParked, ParkError, Purged, Refused, Sent, Stopping, Store, Unwritten,
    ensure_topic, list, load, purge, release,
};
