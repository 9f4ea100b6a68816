//! Freeing emptied user PTE tables: the upstream design's per-table state
//! ([`ReclaimPt`], mm/pt_reclaim.c's helpers as `zap_pte_range` calls
//! them) and the seed's `pte_ref` design (mm/pte_ref.c of the April 2022
//! RFC).
//!
//! # Upstream (`pt_reclaim=upstream`, v6.14)
//!
//! A MADV_DONTNEED zap that covers a table's whole PMD range and leaves no
//! entry behind frees the table. If the zap held the table's lock from the
//! first entry to the last, every entry is known to be none, and the PMD is
//! cleared right there, under the PTE lock, if the PMD lock can be had
//! without waiting (`try_get_and_clear_pmd`: the lock order is PMD lock
//! first). If the lock was dropped midway (the gather filled and had to be
//! flushed), a fault may have refilled an entry already zapped, so the slow
//! path (`try_to_free_pte`) takes the PMD lock and the PTE lock and looks at
//! all 512 entries again. Taking the fast path after such a break freed
//! mapped tables until the fix of Feb 2025 ("mm: pgtable: fix incorrect
//! reclaim of non-empty PTE pages"); `tests/loom_pt_reclaim.rs` checks this
//! very code against a racing fault, and that the broken rule is caught.
//!
//! # PMD tables too (`pt_reclaim_pmd=on`, usermm's own)
//!
//! Neither design frees the PMD table that it empties: a process that gives
//! back a whole GiB keeps 4 KiB of PMD table for it. With
//! `pt_reclaim_pmd`, a madvise whose PT reclaim freed a PTE table (or that
//! cleared a huge PMD) then
//! frees every PMD table of its range whose 512 entries are all none
//! ([`try_to_free_pmd_tables`]). It does so under mmap_lock held for
//! writing, taken after the madvise dropped its read lock: faults and
//! software walkers keep a pointer into a PMD table (a
//! [`PmdSlot`]) with only mmap_lock held for reading and no epoch pin, so,
//! as `free_pgtables` does for every table above the PTE level, the table
//! goes only when none of them can be under way. Hardware walkers are kept
//! safe as for PTE tables: the gather flushes the range with `freed_tables`
//! and frees the table after a grace period. Faults under a VMA lock hold
//! a PMD slot too, so the VMAs over each table looked at are write-locked
//! first; a speculative fault reads the table under an epoch pin and checks
//! `mm_lock_seq` before it commits, so it aborts.
//!
//! # The seed (`pt_reclaim=pte_ref`)
//!
//! Every PTE table made while `pte_ref` is selected counts its non-none
//! entries and the walkers that hold it ([`crate::pgtable::pte_ref`]).
//! After MADV_DONTNEED and MADV_FREE, `try_to_free_user_pte` looks at each
//! table of the range: it holds the table, makes its count exact (atomic
//! mode, a grace period), drops its hold, and frees the table if that was
//! the last reference. MADV_DONTNEED then returns the count to per-CPU
//! mode; MADV_FREE leaves it atomic, so that the table dies with the put
//! that clears its last entry when reclaim discards the lazyfree pages.
//!
//! The seed frees the table in the release callback of that last put. The
//! model's puts happen when a page-table guard is dropped, in the layer
//! below; the table is dead from then on (walkers are refused it), and is
//! unhooked and freed by the first to meet it with no page-table lock held:
//! the zap whose guard put last (`zap_pte_range`, for MADV_DONTNEED, munmap
//! and exit), MADV_PAGEOUT after its discards ([`free_dead_user_ptes`]),
//! or the next madvise or fault on its range. A lockless reader whose put
//! is the last (`/proc`, a fault's first look) leaves it to those.

use crate::machine::OnCpu;
use crate::mm::Mm;
use crate::mmu_gather::MmuGather;
use crate::pgtable::{PmdSlot, Ptdesc, PteLocked, Tracking, PMD_MASK, PMD_SIZE, PUD_SIZE};
use crate::phys::{PhysMem, PAGE_SIZE};
use crate::sync::Arc;
use crate::tunable::PtReclaim;
use crate::vmstat::Event;

/// How a PTE table made now is tracked: with a count when `pte_ref` is
/// the design selected.
#[inline]
pub fn new_pte_tracking(oncpu: &OnCpu) -> Tracking {
    if oncpu.m.tunables.pt_reclaim() == PtReclaim::PteRef {
        Tracking::PteRef
    } else {
        Tracking::Untracked
    }
}

/// What `try_to_free_user_pte` does with the count when the table lives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchBack {
    /// Back to per-CPU mode (MADV_DONTNEED: the table is in use).
    Percpu,
    /// Stay atomic, so that the last put frees it (MADV_FREE).
    StayAtomic,
}

/// `try_to_free_user_pte` for every PTE table of `[start, end)`, their
/// frees gathered in one mmu_gather. The caller holds mmap_lock (for
/// reading) and no page-table lock or epoch pin. Returns whether a table
/// was freed.
pub fn try_to_free_user_ptes(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    start: u64,
    end: u64,
    switch_back: SwitchBack,
) -> bool {
    gather_table_frees(oncpu, mm, |tlb| {
        for_each_pmd(mm, start, end, |slot, addr| {
            try_to_free_user_pte(oncpu, tlb, slot, addr, switch_back)
        })
    })
}

/// Free the dead tables of `[start, end)`: those whose last reference went
/// while a walker of this range (MADV_PAGEOUT's discards) held them.
/// Returns whether a table was freed.
pub fn free_dead_user_ptes(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, end: u64) -> bool {
    gather_table_frees(oncpu, mm, |tlb| {
        for_each_pmd(mm, start, end, |slot, addr| {
            if slot.pte_table_is_dead(oncpu.mem()) {
                free_user_pte(oncpu, tlb, slot, addr);
            }
        })
    })
}

/// Run `f` with one mmu_gather for the tables it frees; returns whether it
/// freed any.
fn gather_table_frees(oncpu: &OnCpu, mm: &Arc<Mm>, f: impl FnOnce(&mut MmuGather)) -> bool {
    let mut tlb = MmuGather::new(mm);
    f(&mut tlb);
    let freed = tlb.nr_tables_freed > 0;
    tlb.finish(oncpu);
    freed
}

/// The start of each `size`-aligned block (a table's range) that covers
/// part of `[start, end)`, stopping at the top of the address space.
fn table_ranges(start: u64, end: u64, size: u64) -> impl Iterator<Item = u64> {
    std::iter::successors(Some(start & !(size - 1)), move |&a| a.checked_add(size))
        .take_while(move |&a| a < end)
}

/// Each PMD entry that covers part of `[start, end)` and exists.
fn for_each_pmd(mm: &Mm, start: u64, end: u64, mut f: impl FnMut(PmdSlot, u64)) {
    for addr in table_ranges(start, end, PMD_SIZE) {
        if let Some(slot) = mm.pmd_lookup(addr) {
            f(slot, addr);
        }
    }
}

/// `try_to_free_user_pte`: free the table under `slot` if nothing holds it
/// any more: no entry maps anything and no walker has it.
fn try_to_free_user_pte(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    slot: PmdSlot,
    addr: u64,
    switch_back: SwitchBack,
) {
    let mem = oncpu.mem();
    let Some(held) = slot.pte_tryget(mem) else {
        // No table, an untracked one, or one already dead.
        if slot.pte_table_is_dead(mem) {
            free_user_pte(oncpu, tlb, slot, addr);
        }
        return;
    };
    held.switch_to_atomic_sync();
    if held.put() {
        free_user_pte(oncpu, tlb, slot, addr);
        return;
    }
    if switch_back == SwitchBack::Percpu {
        // Held again for the switch back: the count must not die during
        // it. If it died since our put, the last holder left it dead.
        match slot.pte_tryget(mem) {
            Some(again) => {
                again.switch_to_percpu();
                // Switched with our reference held, so the count is
                // per-CPU now (or atomic and alive): not the last put.
                let released = again.put();
                debug_assert!(!released, "switched back a dying table");
            }
            None if slot.pte_table_is_dead(mem) => free_user_pte(oncpu, tlb, slot, addr),
            None => {}
        }
    }
}

/// `free_user_pte`: unhook a dead table under the PMD lock and give it to
/// the gather, which flushes the TLB for its range (paging-structure caches
/// included: `freed_tables`) and frees it after a grace period.
pub(crate) fn free_user_pte(oncpu: &OnCpu, tlb: &mut MmuGather, slot: PmdSlot, addr: u64) {
    let table: Option<Ptdesc> = tlb.mm.pmd_lock(slot).unhook_dead_pte_table();
    if let Some(table) = table {
        oncpu
            .vmstat()
            .count(oncpu.id(), Event::PT_RECLAIM_PTE_REF, 1);
        crate::memory::pt_free_tlb(oncpu, tlb, table, addr & PMD_MASK);
        debug_assert_eq!(addr % PAGE_SIZE, 0);
    }
}

/// How a table that [`ReclaimPt`] frees was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReclaimPath {
    /// Under the PTE lock held since the first entry (`try_get_and_clear_pmd`).
    Fast,
    /// Under the PMD lock and the PTE lock, every entry looked at again
    /// (`try_to_free_pte`).
    Slow,
}

/// Upstream PT reclaim of the one PTE table a `zap_pte_range` call zaps:
/// its `can_reclaim_pt` and `direct_reclaim`, and the table once unhooked.
/// The zap reports what happens as it goes; [`ReclaimPt::finish`] says
/// what, if anything, to free.
pub struct ReclaimPt {
    /// `can_reclaim_pt`: the zap covers the table's whole range and has
    /// left nothing behind so far.
    can_reclaim: bool,
    /// `direct_reclaim`: the PTE lock has been held since the first entry
    /// (and, once the table is done, the fast path unhooked it).
    direct_reclaim: bool,
    unhooked: Option<Ptdesc>,
    /// Model checking only: keep `direct_reclaim` across a dropped lock,
    /// the rule before the fix of Feb 2025, for the loom test that must
    /// catch it.
    #[cfg(loom)]
    ignore_lock_drops: bool,
}

impl ReclaimPt {
    /// For a zap that `reclaim_pt_is_enabled` allows (`enabled`) or not.
    pub fn new(enabled: bool) -> ReclaimPt {
        ReclaimPt {
            can_reclaim: enabled,
            direct_reclaim: true,
            unhooked: None,
            #[cfg(loom)]
            ignore_lock_drops: false,
        }
    }

    /// Model checking only: take the fast path even after the PTE lock was
    /// dropped midway (the bug of the original series).
    #[cfg(loom)]
    pub fn break_lock_drop_rule(&mut self) {
        self.ignore_lock_drops = true;
    }

    /// The zap dropped the PTE lock before the table was done
    /// (`force_break`): entries already zapped may be refilled meanwhile.
    pub fn lock_dropped(&mut self) {
        #[cfg(loom)]
        if self.ignore_lock_drops {
            return;
        }
        self.direct_reclaim = false;
    }

    /// The zap left an entry behind (`any_skipped`).
    pub fn skipped(&mut self) {
        self.can_reclaim = false;
    }

    /// The zap reached the table's end with `pt`'s lock held: take the fast
    /// path if it may (`try_get_and_clear_pmd`). On failure (the PMD lock
    /// was busy), the slow path will run.
    pub fn table_done(&mut self, pt: &PteLocked<'_>, slot: PmdSlot) {
        if self.can_reclaim && self.direct_reclaim {
            self.unhooked = pt.try_unhook_from(slot);
            self.direct_reclaim = self.unhooked.is_some();
        }
    }

    /// After the PTE lock is dropped: the table to free, if any, and how
    /// it was taken. The slow path runs here, with no page-table lock held.
    pub fn finish(self, mem: &PhysMem, slot: PmdSlot) -> Option<(Ptdesc, ReclaimPath)> {
        if !self.can_reclaim {
            debug_assert!(self.unhooked.is_none());
            return None;
        }
        match self.unhooked {
            Some(table) => Some((table, ReclaimPath::Fast)),
            // `try_to_free_pte`.
            None => slot
                .lock(mem)
                .try_unhook_empty_pte_table()
                .map(|table| (table, ReclaimPath::Slow)),
        }
    }
}

/// Whether a PMD table of `[start, end)` maps nothing now (a lockless
/// look, under the mmap_lock the caller holds): worth taking the write
/// lock for [`try_to_free_pmd_tables`].
pub fn any_empty_pmd_table(mm: &Mm, start: u64, end: u64) -> bool {
    table_ranges(start, end, PUD_SIZE).any(|addr| mm.pgd.pmd_table_is_empty(&mm.mem, addr))
}

/// `pt_reclaim_pmd`: free the PMD tables of `[start, end)` that PT reclaim
/// left with no entry (see the module doc). Takes mmap_lock for writing:
/// the caller holds no lock of `mm`.
pub fn try_to_free_pmd_tables(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, end: u64) {
    let _g = mm.mmap_lock.write();
    // Faults under a VMA lock hold a PMD slot too: lock the VMAs of every
    // PMD table looked at, so that none is under way in them.
    let tree = mm.vma_tree_draft();
    gather_table_frees(oncpu, mm, |tlb| {
        for addr in table_ranges(start, end, PUD_SIZE) {
            let table_start = addr & !(PUD_SIZE - 1);
            tree.start_write_range(table_start, table_start.saturating_add(PUD_SIZE));
            // SAFETY: mmap_lock is held for writing and every VMA over the
            // table is write-locked, so no fault under either lock and no
            // software walker holds an entry of it. A speculative fault may
            // still hold a slot into it, but only reads through it (it
            // never writes a PMD entry), under an epoch pin that keeps the
            // table's memory until the fault is done, and its commit
            // rechecks the entry under the lock and mm_lock_seq, which this
            // write section has moved on: it aborts.
            let table = unsafe {
                mm.pgd
                    .try_unhook_empty_pmd_table(&mm.mem, &mm.page_table_lock, addr)
            };
            if let Some(table) = table {
                oncpu.vmstat().count(oncpu.id(), Event::PT_RECLAIM_PMD, 1);
                crate::memory::pt_free_tlb(oncpu, tlb, table, addr);
            }
        }
    });
}
