//! Instances and the two instance policies.
//!
//! A [`Guest`] is one store with (once the first call instantiates it) one
//! instance of the handler. Under the fresh policy a guest serves one call
//! and is dropped. Under the warm policy it goes back to its handler's
//! [`Pool`] after a call that returned, and serves up to `max_calls` calls;
//! after a trap, a timeout or a refused memory grow it is dropped, because an
//! instance that did not return cleanly can never be entered again.
//!
//! A store is not `Sync`, so a guest is used by one call at a time: a call
//! takes it out of the pool, owns it while it runs, and puts it back. Two
//! partitions calling at once each get their own.

use super::bindings::{HandlerPre, hopper::handler::types};
use super::state::GuestState;
use super::{GuestInfo, Message, YIELD_EVERY_TICKS};
use crate::per_thread::PerThread;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use wasmtime::component::{Func, TypedFunc};
use wasmtime::{Engine, Store, UpdateDeadline};

/// The `handle` export, called with a borrowed [`Message`].
type Handle<'a> = TypedFunc<(&'a Message<'a>,), (types::Outcome,)>;

/// A store and the handler instance in it.
pub(super) struct Guest {
    pub(super) store: Store<GuestState>,
    /// The instance's `handle` export, its type checked against
    /// [`Message`]; `None` until the first call instantiates the component.
    handle: Option<Func>,
    /// Calls this guest has served, the current one included.
    pub(super) calls: u32,
}

impl Guest {
    pub(super) fn new(engine: &Engine, guest: &Arc<GuestInfo>, memory_bytes: usize) -> Guest {
        let mut store = Store::new(engine, GuestState::new(guest, memory_bytes));
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_callback(|state| {
            if Instant::now() >= state.data().deadline {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(YIELD_EVERY_TICKS))
            }
        });
        Guest {
            store,
            handle: None,
            calls: 0,
        }
    }

    /// Resets the per-call state a previous call may have left behind, and
    /// arms the deadline. Guest output was already taken by the previous
    /// call's flush.
    pub(super) fn begin(&mut self, deadline: Instant, message_id: &str) {
        self.calls += 1;
        self.store.data_mut().begin(message_id, deadline);
        self.store.set_epoch_deadline(YIELD_EVERY_TICKS);
    }

    /// Instantiates on first use, then calls the export.
    pub(super) async fn call(
        &mut self,
        pre: &HandlerPre<GuestState>,
        message: &Message<'_>,
    ) -> wasmtime::Result<types::Outcome> {
        let handle = match self.handle {
            Some(handle) => handle,
            None => {
                // Boxed: once per guest, and inline its state would grow
                // every call's future.
                let instantiate = Box::pin(pre.instance_pre().instantiate_async(&mut self.store));
                let instance = instantiate.await?;
                let typed: Handle<'_> = instance.get_typed_func(&mut self.store, "handle")?;
                *self.handle.insert(*typed.func())
            }
        };
        // SAFETY: `handle` was type-checked above as a `Handle`, the same
        // type but for its lifetime, which the component model's types do
        // not see.
        let handle: Handle<'_> = unsafe { TypedFunc::new_unchecked(handle) };
        let (outcome,) = handle.call_async(&mut self.store, (message,)).await?;
        Ok(outcome)
    }
}

/// Idle warm guests of one handler version. Dropped with the version, so
/// after a reload the old version's instances go once its last call ends.
///
/// Each thread keeps its own idle guests ([`PerThread`]), so a call that
/// takes and returns a guest on one thread touches no other thread's cache
/// lines. A call finding none on its thread takes one from another's before
/// it makes a new one: a guest is made only when no thread has one idle, so
/// the guests of a version stay as many as its calls ever ran at once.
pub(super) struct Pool {
    // std Mutex: held only to push or pop, never across an .await.
    idle: PerThread<Mutex<Vec<Guest>>>,
    /// Idle guests a thread keeps at most: the route's `max_instances`, the
    /// most calls it runs at once, so a route at full concurrency never
    /// drops a guest only to instantiate another for its next call.
    max_idle: usize,
}

impl Pool {
    pub(super) fn new(max_idle: usize) -> Pool {
        Pool {
            idle: PerThread::new(Mutex::default),
            max_idle,
        }
    }

    /// An idle guest: this thread's, else any thread's.
    pub(super) fn take(&self) -> Option<Guest> {
        self.idle.all().find_map(|idle| idle.lock().unwrap().pop())
    }

    /// Keeps `guest` for a later call, unless this thread keeps enough.
    pub(super) fn put(&self, guest: Guest) {
        let mut idle = self.idle.mine().lock().unwrap();
        if idle.len() < self.max_idle {
            idle.push(guest);
            return;
        }
        drop(idle);
        // Dropped outside the lock: freeing an instance resets its memory.
        drop(guest);
    }
}
