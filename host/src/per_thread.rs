//! A value kept once per thread, each on its own cache line.
//!
//! Every message of a route reads its handler slot and its instance pool.
//! One lock shared by the partition tasks on both cores cost a no-op route
//! 4% of its time per structure: not waiting, but moving the lock's cache
//! line from one core to the other on every message. [`PerThread`] gives
//! each thread its own copy; a thread writes only its own line, and a writer
//! that must reach every thread (a reload) visits each copy.

use std::sync::atomic::{AtomicUsize, Ordering};

/// `T` once per thread, for threads that each mostly touch their own.
/// Threads past the number of copies share one, which costs only sharing.
pub struct PerThread<T> {
    copies: Box<[Line<T>]>,
}

/// One copy, alone on its cache line (two lines: adjacent-line prefetch).
#[repr(align(128))]
struct Line<T>(T);

impl<T> PerThread<T> {
    /// Enough copies for the runtime's worker threads and a few more.
    pub fn new(mut make: impl FnMut() -> T) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let copies = (cores * 2).clamp(2, 64);
        PerThread {
            copies: (0..copies).map(|_| Line(make())).collect(),
        }
    }

    /// This thread's copy.
    pub fn mine(&self) -> &T {
        &self.copies[thread_index() % self.copies.len()].0
    }

    /// Every copy, this thread's first.
    pub fn all(&self) -> impl Iterator<Item = &T> {
        let first = thread_index() % self.copies.len();
        let (before, after) = self.copies.split_at(first);
        after.iter().chain(before).map(|line| &line.0)
    }
}

/// A small number, fixed per thread, handed out in turn, so the first
/// threads get distinct copies.
fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|index| *index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn threads_get_their_own_copy_and_all_sees_every_copy() {
        let counts = PerThread::new(|| Mutex::new(0u32));
        let threads = 4;
        let indices: Vec<usize> = std::thread::scope(|scope| {
            let spawned: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        *counts.mine().lock().unwrap() += 1;
                        thread_index() % counts.copies.len()
                    })
                })
                .collect();
            spawned.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(counts.all().count(), counts.copies.len());
        let total: u32 = counts.all().map(|c| *c.lock().unwrap()).sum();
        assert_eq!(total, threads as u32);
        for (index, copy) in counts.copies.iter().enumerate() {
            let users = indices.iter().filter(|&&i| i == index).count();
            assert_eq!(
                *copy.0.lock().unwrap() as usize,
                users,
                "each thread counts in its own copy: {indices:?}"
            );
        }
        // `all` starts with this thread's copy.
        *counts.mine().lock().unwrap() += 10;
        assert!(*counts.all().next().unwrap().lock().unwrap() >= 10);
    }

    #[test]
    fn each_copy_sits_on_its_own_cache_line() {
        let copies = PerThread::new(|| 0u8);
        let addresses: Vec<usize> = copies.all().map(|c| c as *const u8 as usize).collect();
        for pair in addresses.windows(2) {
            assert!(pair[0].abs_diff(pair[1]) >= 128);
        }
    }
}
