//! The delay relay: any producer schedules a message for an exact time by
//! producing it to the inbox with plain-text headers.
//!
//! A message cascades down a ladder of tier topics. Each hop uses the
//! largest tier that still fits the remaining time (less a small margin), so
//! a delay is never rounded to a tier. When less than the smallest tier
//! remains, the in-memory [`crate::scheduler`] holds it until its exact
//! deliver-at. Tiers wait through the same hold-until-due mechanism as retry
//! tiers ([`crate::hold`]), and the Kafka offset is the durable record until
//! the message is forwarded, so a crash loses nothing.

mod cancel;
mod entries;
mod relay;
mod schedule;
mod send;
mod table;

pub use cancel::{Intent, cancelled_id, entry_key, entry_key_partition, parse_intent};
pub use relay::{DelayProcessor, Lookup, TARGET_TRUSTED_FOR};
pub use schedule::{HOP_MARGIN, Rejected, Schedule, Step, parse_instant, parse_schedule, step};
pub use send::{DelayedMessage, InboxSendError, cancel};
pub use table::{CEILING_ROOM, CancelTable, CancelView, LoadedTable, SWEEP_SLICE, lookup};
