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
pub use std::sync::{Arc, OnceLock, Weak};

/// Epoch-based reclamation, the model's RCU: readers pin an epoch
/// (`rcu_read_lock`), writers defer frees until every pin taken before them
/// is gone (`call_rcu` / `kfree_rcu`).
pub use crossbeam_epoch as epoch;

/// Pads a per-CPU counter to its own cache line.
pub use crossbeam_utils::CachePadded;

/// `synchronize_rcu`: wait until every epoch pin taken before the call has
/// been dropped (a grace period). The caller must not hold a pin itself.
/// A deferred function runs only once the epoch has advanced past every
/// pin that could have seen the world before it was deferred, so its
/// running is the end of the grace period.
pub fn synchronize_rcu() {
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    {
        let g = epoch::pin();
        // Release: pairs with the Acquire below.
        g.defer(move || flag.store(true, Ordering::Release));
        g.flush();
    }
    while !done.load(Ordering::Acquire) {
        epoch::pin().flush();
        std::thread::yield_now();
    }
}

std::thread_local! {
    static THIS_CPU: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, NO_CPU)) };
}

/// What [`this_cpu`] says on a thread that plays no CPU of the machine
/// asked about.
pub const NO_CPU: usize = usize::MAX;

/// `smp_processor_id`: the CPU the calling thread plays on the machine
/// whose identity is `machine` (any value unique to it while it lives),
/// or [`NO_CPU`]; for per-CPU counters, which only the thread playing a
/// CPU may write as that CPU. A thread that plays CPUs of two machines is
/// a CPU of the one it bound last.
#[inline]
pub fn this_cpu(machine: usize) -> usize {
    match THIS_CPU.with(|c| c.get()) {
        (m, cpu) if m == machine => cpu,
        _ => NO_CPU,
    }
}

/// Record the CPU the calling thread now plays on `machine` ([`NO_CPU`]:
/// none).
pub fn set_this_cpu(machine: usize, id: usize) {
    THIS_CPU.with(|c| c.set((machine, id)));
}

/// Reader-writer lock guards that own an `Arc` of their lock, for guards
/// that outlive the borrow they were taken from (the anon_vma lock).
pub use parking_lot::lock_api::{ArcRwLockReadGuard, ArcRwLockWriteGuard};
pub use parking_lot::RawRwLock;

/// The atomics and locks of the protocols that are model-checked (the TLB
/// shootdown handshake, with the CPUs' mailboxes, TLBs and loaded mm):
/// loom's when built with `--cfg loom`, std's and parking_lot's otherwise.
/// The CPU layer takes all of its shared state from here, so that the loom
/// tests run the engine's own shootdown code.
pub mod checked {
    #[cfg(loom)]
    pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8};
    #[cfg(not(loom))]
    pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8};

    #[cfg(loom)]
    type Inner<T> = loom::sync::Mutex<T>;
    #[cfg(not(loom))]
    type Inner<T> = parking_lot::Mutex<T>;
    #[cfg(loom)]
    pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;
    #[cfg(not(loom))]
    pub type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    /// A mutex whose every acquisition the model checker sees.
    #[derive(Default)]
    pub struct Mutex<T>(Inner<T>);

    impl<T> Mutex<T> {
        pub fn new(t: T) -> Self {
            Mutex(Inner::new(t))
        }

        #[inline]
        pub fn lock(&self) -> MutexGuard<'_, T> {
            #[cfg(loom)]
            return self.0.lock().expect("no thread panics holding it");
            #[cfg(not(loom))]
            return self.0.lock();
        }
    }

    /// A condition variable over [`Mutex`], whose waits and wakeups the
    /// model checker sees (a lost wakeup is a deadlock it reports).
    #[derive(Default)]
    pub struct Condvar(
        #[cfg(loom)] loom::sync::Condvar,
        #[cfg(not(loom))] parking_lot::Condvar,
    );

    impl Condvar {
        /// Release the guard's lock, wait to be woken (or spuriously), and
        /// take the lock again.
        pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            #[cfg(loom)]
            return self.0.wait(guard).expect("no thread panics holding it");
            #[cfg(not(loom))]
            {
                let mut guard = guard;
                self.0.wait(&mut guard);
                guard
            }
        }

        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

pub use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(not(loom))]
use parking_lot::lock_api::RawMutex as _;

/// A lock without data, as the kernel's `spinlock_t` is used for the split
/// page-table lock: the data it guards lives elsewhere (in the table frame).
///
/// Under loom it is loom's mutex, so that the model checker sees (and
/// interleaves at) every acquisition of a page-table lock.
pub struct SpinLock(
    #[cfg(not(loom))] parking_lot::RawMutex,
    #[cfg(loom)] loom::sync::Mutex<()>,
);

#[cfg(not(loom))]
impl SpinLock {
    pub const fn new() -> Self {
        SpinLock(parking_lot::RawMutex::INIT)
    }

    pub fn lock(&self) -> SpinGuard<'_> {
        self.0.lock();
        SpinGuard(self)
    }

    pub fn try_lock(&self) -> Option<SpinGuard<'_>> {
        // Lazily: a guard made when the trylock failed would unlock the
        // holder's lock as it drops.
        self.0.try_lock().then(|| SpinGuard(self))
    }

    pub fn is_locked(&self) -> bool {
        self.0.is_locked()
    }
}

#[cfg(loom)]
impl SpinLock {
    pub fn new() -> Self {
        SpinLock(loom::sync::Mutex::new(()))
    }

    pub fn lock(&self) -> SpinGuard<'_> {
        SpinGuard {
            _held: self.0.lock().expect("no thread panics holding it"),
        }
    }

    pub fn try_lock(&self) -> Option<SpinGuard<'_>> {
        self.0.try_lock().ok().map(|g| SpinGuard { _held: g })
    }

    pub fn is_locked(&self) -> bool {
        self.0.try_lock().is_err()
    }
}

impl Default for SpinLock {
    fn default() -> Self {
        Self::new()
    }
}

/// Held while the lock is held; unlocks on drop.
#[cfg(not(loom))]
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct SpinGuard<'a>(&'a SpinLock);

/// Held while the lock is held; unlocks on drop.
#[cfg(loom)]
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct SpinGuard<'a> {
    _held: loom::sync::MutexGuard<'a, ()>,
}

#[cfg(not(loom))]
impl Drop for SpinGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: a SpinGuard exists only while this thread holds the lock,
        // and it is dropped exactly once.
        unsafe { self.0 .0.unlock() }
    }
}

/// Spin with backoff while `cond` is false; yields the host CPU after a few
/// rounds, because the thread we wait for may need this very core.
///
/// Under loom it yields to the model checker's scheduler at every round,
/// which must run the thread waited for.
#[inline]
pub fn spin_until(cond: impl FnMut() -> bool) {
    #[cfg(loom)]
    {
        let mut cond = cond;
        while !cond() {
            loom::thread::yield_now();
        }
    }
    #[cfg(not(loom))]
    spin_until_backoff(cond)
}

#[cfg(not(loom))]
#[inline]
fn spin_until_backoff(mut cond: impl FnMut() -> bool) {
    let backoff = crossbeam_utils::Backoff::new();
    while !cond() {
        if backoff.is_completed() {
            std::thread::yield_now();
        } else {
            backoff.snooze();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::SpinLock;

    /// A failed trylock leaves the holder's lock held.
    #[test]
    fn failed_try_lock_keeps_the_lock() {
        let l = SpinLock::new();
        let held = l.lock();
        assert!(l.try_lock().is_none());
        assert!(l.is_locked(), "the failed trylock unlocked it");
        drop(held);
        assert!(l.try_lock().is_some());
        assert!(!l.is_locked());
    }
}
