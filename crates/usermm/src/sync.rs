//! Atomics and locks used by the engine, in one place.
//!
//! Everything that is shared between the threads that play CPUs takes its
//! atomics and locks from here, so that a model checker can replace them (the
//! way crossbeam swaps in loom's primitives) without touching the algorithms.
//!
//! The kernel's spinlocks (the split page-table lock, `mm->page_table_lock`,
//! the zone lock) map onto [`SpinLock`], a one-byte lock from `parking_lot`
//! that spins briefly and then parks: the threads that play CPUs outnumber the
//! host's cores, and a pure spinlock would burn the time slice of the holder.

pub use std::sync::atomic::{
    fence, AtomicBool, AtomicI32, AtomicI64, AtomicU16, AtomicU32, AtomicU64, AtomicU8,
    AtomicUsize, Ordering,
};
pub use std::sync::Arc;

/// The atomics of the protocols that are model-checked (the TLB shootdown
/// handshake): loom's when built with `--cfg loom`, std's otherwise.
pub mod checked {
    #[cfg(loom)]
    pub use loom::sync::atomic::{fence, AtomicBool, AtomicU64};
    #[cfg(not(loom))]
    pub use std::sync::atomic::{fence, AtomicBool, AtomicU64};
}

pub use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use parking_lot::lock_api::RawMutex as _;

/// A lock without data, as the kernel's `spinlock_t` is used for the split
/// page-table lock: the data it guards lives elsewhere (in the table frame).
pub struct SpinLock(parking_lot::RawMutex);

impl SpinLock {
    pub const fn new() -> Self {
        SpinLock(parking_lot::RawMutex::INIT)
    }

    pub fn lock(&self) -> SpinGuard<'_> {
        self.0.lock();
        SpinGuard(self)
    }

    pub fn try_lock(&self) -> Option<SpinGuard<'_>> {
        self.0.try_lock().then_some(SpinGuard(self))
    }

    pub fn is_locked(&self) -> bool {
        self.0.is_locked()
    }
}

impl Default for SpinLock {
    fn default() -> Self {
        Self::new()
    }
}

/// Held while the lock is held; unlocks on drop.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct SpinGuard<'a>(&'a SpinLock);

impl Drop for SpinGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: a SpinGuard exists only while this thread holds the lock,
        // and it is dropped exactly once.
        unsafe { self.0 .0.unlock() }
    }
}

/// Spin with backoff while `cond` is false; yields the host CPU after a few
/// rounds, because the thread we wait for may need this very core.
#[inline]
pub fn spin_until(mut cond: impl FnMut() -> bool) {
    let backoff = crossbeam_utils::Backoff::new();
    while !cond() {
        if backoff.is_completed() {
            std::thread::yield_now();
        } else {
            backoff.snooze();
        }
    }
}
