//! `pte_ref`: the reference count of a user PTE table, from the F4 seed
//! (Qi Zheng, "Try to free user PTE page table pages", RFC of April 2022,
//! `mm/pte_ref.c`; not merged). The kernel's `percpu_ref`, modelled.
//!
//! A tracked table's count is the number of its entries that are not none
//! (`track_pte_set` / `track_pte_clear`, done by the entry writers of
//! [`super::generic`]) plus the walkers that hold it (`pte_tryget_map` and
//! `pte_tryget_map_lock`, which are [`super::PmdSlot::pte_offset_map`] and
//! [`super::PmdSlot::pte_offset_map_lock`] on a tracked table, and the put
//! when their guard goes). When it reaches zero the table is dead: no
//! walker gets it any more, and the layers above unhook and free it
//! (`free_user_pte`).
//!
//! # Protocol
//!
//! Like a `percpu_ref`, the count has two modes:
//!
//! * **per-CPU** (the normal one): a get or put adds to the calling CPU's
//!   own counter, touching no shared cache line; the sum is unknown, so the
//!   count never reaches zero. The atomic counter holds [`BIAS`].
//! * **atomic**: gets and puts go to the shared counter, which is exact;
//!   a put that takes it to zero kills the ref (the table is dead while the
//!   count is zero in this mode), and a try-get of zero fails.
//!
//! Every get and put in per-CPU mode runs inside an epoch pin (the walkers'
//! guards hold one; `percpu_ref` uses `rcu_read_lock_sched`). The switch to
//! atomic mode ([`PteRef::switch_to_atomic_sync`]) stores the mode, waits
//! for a grace period so that every per-CPU operation that missed the store
//! has finished, and then folds the per-CPU counters into the atomic one,
//! taking the bias out. The switch back adds the bias before it stores the
//! mode, so an atomic-mode put racing with it never sees zero. Switches are
//! serialised by a mutex of the ref (the kernel's `percpu_ref_switch_lock`).
//!
//! A table made while another design was selected is not tracked (it has
//! no `PteRef`), and `pte_ref` never frees it.

use crate::sync::{self, AtomicI64, AtomicU8, CachePadded, Mutex, Ordering};

/// Per-CPU mode: the atomic counter holds the bias.
const PERCPU: u8 = 0;
/// Atomic mode: the atomic counter is the count. Zero there is final (the
/// table is dead): a try-get never raises it, a switch back never revives
/// it.
const ATOMIC: u8 = 1;

/// Keeps the atomic counter far from zero in per-CPU mode
/// (`PERCPU_COUNT_BIAS`).
const BIAS: i64 = 1 << 62;

/// One table's count (`ptdesc->pte_ref`).
pub struct PteRef {
    /// The machine whose CPUs own the per-CPU counters
    /// ([`crate::phys::PhysMem::machine_id`]).
    machine: usize,
    mode: AtomicU8,
    count: AtomicI64,
    percpu: Box<[CachePadded<AtomicI64>]>,
    switching: Mutex<()>,
}

impl PteRef {
    /// `pte_ref_init`: per-CPU mode, count zero (a new table is empty and
    /// no walker holds it yet).
    pub fn new(machine: usize, nr_cpus: usize) -> PteRef {
        PteRef {
            machine,
            mode: AtomicU8::new(PERCPU),
            count: AtomicI64::new(BIAS),
            percpu: (0..nr_cpus.max(1))
                .map(|_| CachePadded::new(AtomicI64::new(0)))
                .collect(),
            switching: Mutex::new(()),
        }
    }

    /// `this_cpu_add` in per-CPU mode: only the thread playing a CPU of this
    /// table's machine writes that CPU's counter, so a plain load and store
    /// do (no locked instruction, as the kernel's per-CPU add). A thread
    /// that plays none adds to the shared counter instead, which the sum
    /// counts alike.
    #[inline]
    fn percpu_add(&self, v: i64) {
        match self.percpu.get(sync::this_cpu(self.machine)) {
            Some(c) => c.store(c.load(Ordering::Relaxed) + v, Ordering::Relaxed),
            None => {
                self.count.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    /// `percpu_ref_get`: the caller already holds a reference (a walker's,
    /// while it fills an entry), so the count cannot be zero.
    #[inline]
    pub fn get(&self) {
        // Acquire: a switch's mode store, seen here, comes with its fold;
        // Relaxed counting is enough otherwise (the epoch pin and the
        // switch's grace period order per-CPU counting against the fold).
        if self.mode.load(Ordering::Acquire) == PERCPU {
            self.percpu_add(1);
        } else {
            let old = self.count.fetch_add(1, Ordering::Relaxed);
            debug_assert!(old > 0, "pte_ref get on a dead table");
        }
    }

    /// `percpu_ref_tryget`: a walker's reference, refused once the table is
    /// dead. In per-CPU mode it always succeeds.
    #[inline]
    pub fn tryget(&self) -> bool {
        if self.mode.load(Ordering::Acquire) == PERCPU {
            self.percpu_add(1);
            return true;
        }
        // atomic_long_inc_not_zero.
        self.count
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |c| {
                (c > 0).then_some(c + 1)
            })
            .is_ok()
    }

    /// `percpu_ref_put`. Returns true if this put took the count to zero:
    /// the table is dead, and whoever unhooks it next frees it.
    #[inline]
    #[must_use = "a released table must be freed"]
    pub fn put(&self) -> bool {
        if self.mode.load(Ordering::Acquire) == PERCPU {
            self.percpu_add(-1);
            return false;
        }
        // AcqRel: the last put sees every earlier holder's writes to the
        // table before it is dead; whoever then sees the zero (Acquire in
        // is_dead) sees them too.
        let old = self.count.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(old > 0, "pte_ref put below zero");
        old == 1
    }

    /// `percpu_ref_is_zero` in atomic mode: the table is dead, from the
    /// instant of the last put.
    #[inline]
    pub fn is_dead(&self) -> bool {
        self.mode.load(Ordering::Acquire) == ATOMIC && self.count.load(Ordering::Acquire) == 0
    }

    /// Whether the count is exact now (atomic mode).
    pub fn is_atomic(&self) -> bool {
        self.mode.load(Ordering::Acquire) == ATOMIC
    }

    /// `percpu_ref_switch_to_atomic_sync`: make the count exact. Waits for
    /// an epoch grace period: the caller must not hold an epoch pin.
    pub fn switch_to_atomic_sync(&self) {
        let _g = self.switching.lock();
        if self.mode.load(Ordering::Acquire) != PERCPU {
            return;
        }
        // SeqCst: ordered before the grace period's own SeqCst steps, so
        // a per-CPU operation that starts after the grace period sees it.
        self.mode.store(ATOMIC, Ordering::SeqCst);
        sync::synchronize_rcu();
        let sum: i64 = self
            .percpu
            .iter()
            .map(|c| c.swap(0, Ordering::Relaxed))
            .sum();
        // AcqRel: a put that reads the folded count sees the per-CPU
        // counts folded into it.
        self.count.fetch_add(sum - BIAS, Ordering::AcqRel);
    }

    /// `percpu_ref_switch_to_percpu`: back to cheap counting, unless the
    /// table died meanwhile.
    pub fn switch_to_percpu(&self) {
        let _g = self.switching.lock();
        if self.mode.load(Ordering::Acquire) == PERCPU {
            return;
        }
        let revived = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |c| {
                (c > 0).then_some(c + BIAS)
            });
        if revived.is_ok() {
            self.mode.store(PERCPU, Ordering::Release);
        }
    }

    /// The count, for the invariant checker (no walker may run).
    pub fn quiescent_count(&self) -> i64 {
        let percpu: i64 = self.percpu.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        let bias = if self.is_atomic() { 0 } else { BIAS };
        self.count.load(Ordering::Relaxed) - bias + percpu
    }
}
