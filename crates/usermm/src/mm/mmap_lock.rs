//! `mmap_lock`, the sequence count beside it, and the per-VMA locks
//! (include/linux/mmap_lock.h and mm/mmap_lock.c, in their v6.15 form).
//!
//! # Protocol
//!
//! * **mmap_lock** is a reader-writer semaphore. Writers (mmap, munmap,
//!   mprotect, fork, madvise that changes flags) take it for writing;
//!   faults under `fault_lock=mmap_lock`, madvise zaps and `/proc` readers
//!   take it for reading.
//! * **`mm_lock_seq`** ([`MmLockSeq`]) is a sequence count that every write
//!   section bumps twice: to odd when the writer has the lock
//!   (`mm_lock_seqcount_begin` in `mmap_write_lock`), back to even as it
//!   downgrades or unlocks (`vma_end_write_all`). It is both the seed's
//!   `mmap_seq`, which a speculative fault reads at its start and checks
//!   again before it commits, and the kernel's `mm_lock_seq`, the value a
//!   write-locked VMA's `vm_lock_seq` equals.
//! * **The VMA lock** ([`VmaLock`]) is the v6.15 reference count
//!   `vm_refcnt`: 0 while the VMA is detached (not in the tree), 1 while it
//!   is attached and unlocked, 1 + n with n readers, plus
//!   [`VMA_LOCK_OFFSET`] while a writer waits for readers to leave. A VMA is
//!   write-locked while its `vm_lock_seq` equals the mm's `mm_lock_seq`:
//!   [`VmaLock::start_write`] (mmap_lock held for writing) waits for the
//!   readers to drain and sets it; nothing unlocks it but the end of the
//!   write section, which moves `mm_lock_seq` on and so unlocks every VMA
//!   at once. This works only because every writer holds mmap_lock for
//!   writing.
//! * A reader ([`VmaLock::start_read`]) fails if the VMA looks write-locked,
//!   takes a reference unless the count is 0 (detached: the caller looks
//!   again) or a writer holds the offset, and then checks `vm_lock_seq`
//!   against `mm_lock_seq` again, now that its reference keeps a writer
//!   from locking the VMA unseen.
//!
//! # What the model does differently
//!
//! A writer waiting for readers spins with backoff ([`crate::sync::spin_until`])
//! where the kernel sleeps on `mm->vma_writer_wait` and the last reader wakes
//! it. A model VMA never changes its bounds or flags (a change makes a new
//! VMA, see [`super::vma`]), so the lock protects what the kernel's also
//! protects beyond the fields: that no fault works in the VMA's range while a
//! writer zaps it, changes its protection, copies it for fork or frees its
//! tables.
//!
//! # Orderings
//!
//! `mm_lock_seq`: the writer's begin is a store followed by a release fence
//! (the kernel's `smp_wmb`), so that anyone who sees a later store of the
//! write section sees the odd count; its end is a release store, so that a
//! reader that sees the even count sees the section's writes. A reader's
//! first load is acquire; its check is an acquire fence and a load (the
//! kernel's `smp_rmb` + `READ_ONCE`).
//!
//! `vm_refcnt`: a reader's increment is acquire and its decrement release; a
//! writer's wait loads with acquire, so what readers did under the lock
//! happens before what the writer does once they are gone. The writer's
//! removal of the offset is a release, so a reader whose increment reads the
//! value after it sees the `vm_lock_seq` the writer stored.

use crate::cacheline::LineWriters;
use crate::sync::checked::{fence, AtomicU32};
use crate::sync::{Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `mm->mmap_lock` with `mm->mm_lock_seq`: taking it for writing makes the
/// count odd, and giving it up (or downgrading) makes it even again.
#[derive(Default)]
pub struct MmapLock {
    sem: RwLock<()>,
    pub seq: MmLockSeq,
    /// Who writes the semaphore's word (every lock and unlock does).
    line: LineWriters,
}

impl MmapLock {
    pub fn new() -> MmapLock {
        MmapLock::default()
    }

    /// `mmap_read_trylock`.
    pub fn try_read(&self) -> Option<MmapReadGuard<'_>> {
        self.sem.try_read().map(|held| self.read_held(held))
    }

    /// `mmap_read_lock`.
    pub fn read(&self) -> MmapReadGuard<'_> {
        self.read_held(self.sem.read())
    }

    /// The guard of a read lock just taken (its write of the lock's line
    /// noted).
    fn read_held<'a>(&'a self, held: RwLockReadGuard<'a, ()>) -> MmapReadGuard<'a> {
        self.line.write();
        MmapReadGuard {
            line: &self.line,
            _held: held,
        }
    }

    /// `mmap_write_lock`: the lock, then the count made odd.
    pub fn write(&self) -> MmapWriteGuard<'_> {
        let held = self.sem.write();
        self.line.write();
        self.seq.write_begin();
        MmapWriteGuard {
            lock: self,
            held: Some(held),
        }
    }

    pub fn is_locked_exclusive(&self) -> bool {
        self.sem.is_locked_exclusive()
    }
}

/// mmap_lock held for writing; `mmap_write_unlock` when dropped.
#[must_use = "mmap_lock is released as soon as the guard is dropped"]
pub struct MmapWriteGuard<'a> {
    lock: &'a MmapLock,
    held: Option<RwLockWriteGuard<'a, ()>>,
}

impl<'a> MmapWriteGuard<'a> {
    /// The count of this write section: what `vm_lock_seq` of a VMA it
    /// write-locks is set to.
    pub fn seq(&self) -> u32 {
        self.lock.seq.raw()
    }

    /// `mmap_write_downgrade`: every VMA is unlocked, the lock stays held
    /// for reading.
    pub fn downgrade(mut self) -> MmapReadGuard<'a> {
        let held = self.held.take().expect("held until dropped");
        self.lock.seq.write_end();
        self.lock.line.write();
        MmapReadGuard {
            line: &self.lock.line,
            _held: RwLockWriteGuard::downgrade(held),
        }
    }
}

impl Drop for MmapWriteGuard<'_> {
    /// `mmap_write_unlock`: `vma_end_write_all`, then the lock.
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            self.lock.seq.write_end();
            self.lock.line.write();
            drop(held);
        }
    }
}

/// mmap_lock held for reading; `mmap_read_unlock` when dropped.
#[must_use = "mmap_lock is released as soon as the guard is dropped"]
pub struct MmapReadGuard<'a> {
    line: &'a LineWriters,
    _held: RwLockReadGuard<'a, ()>,
}

impl Drop for MmapReadGuard<'_> {
    fn drop(&mut self) {
        self.line.write();
    }
}

/// `mm->mm_lock_seq`: a sequence count, odd while a writer holds mmap_lock
/// for writing.
#[derive(Debug, Default)]
pub struct MmLockSeq(AtomicU32);

impl MmLockSeq {
    pub fn new() -> MmLockSeq {
        MmLockSeq(AtomicU32::new(0))
    }

    /// `mm_lock_seqcount_begin`: the caller just took mmap_lock for writing.
    pub fn write_begin(&self) {
        // Relaxed: only the writer, which holds the lock, stores the count.
        let s = self.0.load(Ordering::Relaxed);
        debug_assert!(s & 1 == 0, "mm_lock_seq odd at a write lock");
        self.0.store(s.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd count before every store of the write section.
        fence(Ordering::Release);
    }

    /// `mm_lock_seqcount_end` (`vma_end_write_all`): the writer is about to
    /// downgrade or release mmap_lock; every VMA it write-locked is unlocked.
    pub fn write_end(&self) {
        let s = self.0.load(Ordering::Relaxed);
        debug_assert!(s & 1 == 1, "mm_lock_seq even at a write unlock");
        // Release: a reader that sees the even count sees the section.
        self.0.store(s.wrapping_add(1), Ordering::Release);
    }

    /// `raw_read_seqcount`: the count now, odd or not.
    #[inline]
    pub fn raw(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }

    /// `mmap_seq_read_start` (the seed), `mmap_lock_speculate_try_begin`
    /// (v6.13): the count, or None while a writer is inside.
    #[inline]
    pub fn read_start(&self) -> Option<u32> {
        let s = self.0.load(Ordering::Acquire);
        (s & 1 == 0).then_some(s)
    }

    /// `mmap_seq_read_check`: no write section began since `start` was read.
    #[inline]
    pub fn read_check(&self, start: u32) -> bool {
        // Orders the caller's reads before the count's (the kernel's
        // smp_rmb): if the count is unchanged, what they read was stable.
        fence(Ordering::Acquire);
        self.0.load(Ordering::Relaxed) == start
    }
}

/// `VMA_LOCK_OFFSET`: added to `vm_refcnt` by a writer that excludes readers.
pub const VMA_LOCK_OFFSET: u32 = 0x4000_0000;
/// `VMA_REF_LIMIT`: readers never raise the count past it, so an increment
/// fails while a writer holds the offset.
pub const VMA_REF_LIMIT: u32 = VMA_LOCK_OFFSET - 1;

/// A `vm_lock_seq` that no `mm_lock_seq` equals before it wraps.
const VM_LOCK_SEQ_NONE: u32 = u32::MAX;

/// The per-VMA lock: `vm_refcnt` and `vm_lock_seq` of `struct
/// vm_area_struct` (v6.15). See the module doc for the protocol.
#[derive(Debug)]
pub struct VmaLock {
    vm_refcnt: AtomicU32,
    vm_lock_seq: AtomicU32,
    /// Who writes `vm_refcnt` (each reader's lock and unlock do).
    line: LineWriters,
    /// Model checking only: take the reference without checking
    /// `vm_lock_seq` again after it, to show that the checker catches a
    /// reader inside a write section.
    #[cfg(loom)]
    pub broken_no_recheck: bool,
    /// Model checking only: take the reference even from 0 (a plain
    /// `refcount_inc` where the kernel has `inc_not_zero`), to show that
    /// the checker catches a reader that revives a detached VMA.
    #[cfg(loom)]
    pub broken_inc_from_zero: bool,
}

impl Default for VmaLock {
    fn default() -> Self {
        Self::new()
    }
}

/// Why [`VmaLock::start_read`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartReadError {
    /// The VMA is write-locked, or a writer is draining its readers: fall
    /// back to mmap_lock (`NULL`).
    Locked,
    /// The VMA left the tree after the lookup found it: look again
    /// (`-EAGAIN`).
    Detached,
}

/// A read lock on a VMA (`vma_start_read` .. `vma_end_read`).
#[must_use = "the VMA is unlocked as soon as the guard is dropped"]
#[derive(Debug)]
pub struct VmaReadGuard<'a>(&'a VmaLock);

impl Drop for VmaReadGuard<'_> {
    /// `vma_end_read` (`vma_refcount_put`).
    fn drop(&mut self) {
        self.0.refcount_put();
    }
}

impl VmaLock {
    /// `vma_lock_init`: detached (count 0), locked by no write section.
    pub fn new() -> VmaLock {
        VmaLock {
            vm_refcnt: AtomicU32::new(0),
            vm_lock_seq: AtomicU32::new(VM_LOCK_SEQ_NONE),
            line: LineWriters::new(),
            #[cfg(loom)]
            broken_no_recheck: false,
            #[cfg(loom)]
            broken_inc_from_zero: false,
        }
    }

    /// `vma_mark_attached`: the VMA goes into the tree.
    pub fn mark_attached(&self) {
        debug_assert_eq!(
            self.vm_refcnt.load(Ordering::Relaxed),
            0,
            "attaching an attached VMA"
        );
        // Release: a reader whose increment sees 1 sees the VMA whole.
        self.vm_refcnt.store(1, Ordering::Release);
    }

    /// Whether the VMA is out of the tree (`vm_refcnt` 0).
    pub fn is_detached(&self) -> bool {
        self.vm_refcnt.load(Ordering::Acquire) == 0
    }

    /// `__is_vma_write_locked`: locked by the write section whose count is
    /// `mm_lock_seq`.
    pub fn is_write_locked(&self, mm_lock_seq: u32) -> bool {
        self.vm_lock_seq.load(Ordering::Relaxed) == mm_lock_seq
    }

    /// The readers now (for tests and assertions).
    pub fn readers(&self) -> u32 {
        let c = self.vm_refcnt.load(Ordering::Relaxed) & VMA_REF_LIMIT;
        c.saturating_sub(1)
    }

    /// `vma_start_read`: read-lock the VMA unless a writer has it.
    pub fn start_read(&self, seq: &MmLockSeq) -> Result<VmaReadGuard<'_>, StartReadError> {
        // A lockless early look; the check that counts is below.
        if self.vm_lock_seq.load(Ordering::Relaxed) == seq.0.load(Ordering::Relaxed) {
            return Err(StartReadError::Locked);
        }
        self.inc_not_zero_limited()?;
        let guard = VmaReadGuard(self);
        #[cfg(loom)]
        if self.broken_no_recheck {
            return Ok(guard);
        }
        // With our reference held, a writer cannot lock the VMA unseen:
        // it stored vm_lock_seq before removing its offset, and our
        // increment (acquire) read the count after that removal.
        if self.vm_lock_seq.load(Ordering::Relaxed) == seq.raw() {
            return Err(StartReadError::Locked);
        }
        Ok(guard)
    }

    /// `__refcount_inc_not_zero_limited_acquire(&vm_refcnt, .., VMA_REF_LIMIT)`.
    fn inc_not_zero_limited(&self) -> Result<(), StartReadError> {
        let mut old = self.vm_refcnt.load(Ordering::Relaxed);
        loop {
            #[cfg(loom)]
            let detached = old == 0 && !self.broken_inc_from_zero;
            #[cfg(not(loom))]
            let detached = old == 0;
            if detached {
                return Err(StartReadError::Detached);
            }
            if old >= VMA_REF_LIMIT {
                return Err(StartReadError::Locked);
            }
            // Acquire: orders the checks of vm_lock_seq and of the VMA
            // after the reference is held.
            match self.vm_refcnt.compare_exchange_weak(
                old,
                old + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.line.write();
                    return Ok(());
                }
                Err(cur) => old = cur,
            }
        }
    }

    /// `vma_refcount_put`. The kernel wakes a waiting writer when the
    /// offset is set; the model's writer spins on the count.
    fn refcount_put(&self) {
        // Release: what the reader did happens before a writer that sees
        // the count drop.
        let old = self.vm_refcnt.fetch_sub(1, Ordering::Release);
        self.line.write();
        debug_assert!(old & VMA_REF_LIMIT != 0, "vm_refcnt underflow");
    }

    /// `vma_start_write`: write-lock the VMA for the write section whose
    /// count is `mm_lock_seq` (the caller holds mmap_lock for writing),
    /// waiting for its readers to leave. A detached VMA is only marked.
    pub fn start_write(&self, mm_lock_seq: u32) {
        debug_assert!(
            mm_lock_seq & 1 == 1,
            "vma_start_write outside a write section"
        );
        if self.is_write_locked(mm_lock_seq) {
            return;
        }
        let locked = self.enter_locked(false);
        self.vm_lock_seq.store(mm_lock_seq, Ordering::Relaxed);
        if locked {
            let detached = self.exit_locked();
            debug_assert!(!detached, "a VMA detached while write-locked");
        }
    }

    /// `vma_mark_detached`: the VMA, write-locked, left the tree. Waits for
    /// readers that took a reference just before they saw it locked.
    pub fn mark_detached(&self) {
        let old = self.vm_refcnt.fetch_sub(1, Ordering::AcqRel);
        self.line.write();
        debug_assert!(old != 0, "a VMA detached twice");
        if old != 1 && self.enter_locked(true) {
            let detached = self.exit_locked();
            debug_assert!(detached, "readers of a detached VMA");
        }
    }

    /// `__vma_enter_locked`: add the offset (unless detached) and wait until
    /// only the tree's reference (none if `detaching`) is left.
    fn enter_locked(&self, detaching: bool) -> bool {
        let target = VMA_LOCK_OFFSET + u32::from(!detaching);
        let mut old = self.vm_refcnt.load(Ordering::Relaxed);
        loop {
            if old == 0 {
                return false;
            }
            match self.vm_refcnt.compare_exchange_weak(
                old,
                old + VMA_LOCK_OFFSET,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(cur) => old = cur,
            }
        }
        self.line.write();
        // Acquire: pairs with the readers' release in refcount_put.
        crate::sync::spin_until(|| self.vm_refcnt.load(Ordering::Acquire) == target);
        true
    }

    /// `__vma_exit_locked`: drop the offset; whether the count is now 0.
    fn exit_locked(&self) -> bool {
        // Release: a reader whose increment reads the result sees the
        // vm_lock_seq stored before.
        let old = self.vm_refcnt.fetch_sub(VMA_LOCK_OFFSET, Ordering::AcqRel);
        self.line.write();
        old == VMA_LOCK_OFFSET
    }
}

/// `lock_vma_under_rcu`: the VMA that contains `addr`, read-locked, or None
/// (`vma_lock_abort` counted) if there is none or it is being changed: the
/// caller falls back to mmap_lock. A VMA that left the tree between the
/// lookup and the lock (`vma_lock_miss`) sends the lookup round again.
/// The VMA is borrowed from the tree version `guard` pins (the kernel's
/// RCU read section ends here; the model's pin lasts for the fault, so that
/// no count is taken on the VMA beyond its lock).
pub fn lock_vma_under_rcu<'g>(
    mm: &super::Mm,
    addr: u64,
    guard: &'g crate::sync::epoch::Guard,
    vmstat: &crate::vmstat::VmStat,
    cpu: usize,
) -> Option<(&'g std::sync::Arc<super::Vma>, VmaReadGuard<'g>)> {
    use crate::vmstat::Event;
    loop {
        let Some(vma) = mm.vma_tree(guard).vma_lookup(addr) else {
            vmstat.count(cpu, Event::VMA_LOCK_ABORT, 1);
            return None;
        };
        match vma.vm_lock.start_read(&mm.mmap_lock.seq) {
            Ok(locked) => {
                // The kernel checks the bounds again: its VMAs change in
                // place. A model VMA's never do.
                debug_assert!(vma.contains(addr));
                return Some((vma, locked));
            }
            Err(StartReadError::Detached) => {
                vmstat.count(cpu, Event::VMA_LOCK_MISS, 1);
                // The writer publishes the tree without it next: give it
                // the core if it needs this one.
                std::thread::yield_now();
            }
            Err(StartReadError::Locked) => {
                vmstat.count(cpu, Event::VMA_LOCK_ABORT, 1);
                return None;
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn attached() -> VmaLock {
        let l = VmaLock::new();
        l.mark_attached();
        l
    }

    #[test]
    fn a_write_section_locks_until_it_ends() {
        let seq = MmLockSeq::new();
        let l = attached();
        assert!(l.start_read(&seq).is_ok());
        seq.write_begin();
        l.start_write(seq.raw());
        assert_eq!(l.start_read(&seq).unwrap_err(), StartReadError::Locked);
        seq.write_end();
        let g = l.start_read(&seq).expect("unlocked by the section's end");
        assert_eq!(l.readers(), 1);
        drop(g);
        assert_eq!(l.readers(), 0);
    }

    #[test]
    fn a_detached_vma_asks_for_another_look() {
        let seq = MmLockSeq::new();
        let l = attached();
        seq.write_begin();
        l.start_write(seq.raw());
        l.mark_detached();
        seq.write_end();
        assert!(l.is_detached());
        assert_eq!(l.start_read(&seq).unwrap_err(), StartReadError::Detached);
    }

    #[test]
    fn a_writer_waits_for_readers() {
        let seq = std::sync::Arc::new(MmLockSeq::new());
        let l = std::sync::Arc::new(attached());
        let g = l.start_read(&seq).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (seq, l, done) = (seq.clone(), l.clone(), done.clone());
            std::thread::spawn(move || {
                seq.write_begin();
                l.start_write(seq.raw());
                done.store(true, Ordering::SeqCst);
                seq.write_end();
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!done.load(Ordering::SeqCst), "the writer did not wait");
        drop(g);
        writer.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    #[test]
    fn speculation_sees_a_write_section() {
        let seq = MmLockSeq::new();
        let s = seq.read_start().unwrap();
        assert!(seq.read_check(s));
        seq.write_begin();
        assert!(seq.read_start().is_none(), "odd: a writer is inside");
        assert!(!seq.read_check(s));
        seq.write_end();
        assert!(!seq.read_check(s), "a whole section ran since");
    }
}
