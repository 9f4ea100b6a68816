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
//! # The seed (`pt_reclaim=pte_ref`)
//!
use crate::machine::OnCpu;
use crate::mm::Mm;
use crate::mmu_gather::MmuGather;
use crate::pgtable::{PmdSlot, Ptdesc, PteLocked, Tracking, PMD_MASK, PMD_SIZE};
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
/// reading) and no page-table lock or epoch pin.
pub fn try_to_free_user_ptes(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    start: u64,
    end: u64,
    switch_back: SwitchBack,
) {
    let mut tlb = MmuGather::new(mm);
    for_each_pmd(mm, start, end, |slot, addr| {
        try_to_free_user_pte(oncpu, &mut tlb, slot, addr, switch_back)
    });
    tlb.finish(oncpu);
}

/// Free the dead tables of `[start, end)`: those whose last reference went
/// while a walker of this range (MADV_PAGEOUT's discards) held them.
pub fn free_dead_user_ptes(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, end: u64) {
    let mut tlb = MmuGather::new(mm);
    for_each_pmd(mm, start, end, |slot, addr| {
        if slot.pte_table_is_dead(oncpu.mem()) {
            free_user_pte(oncpu, &mut tlb, slot, addr);
        }
    });
    tlb.finish(oncpu);
}

/// Each PMD entry that covers part of `[start, end)` and exists.
fn for_each_pmd(mm: &Mm, start: u64, end: u64, mut f: impl FnMut(PmdSlot, u64)) {
    let mut addr = start & PMD_MASK;
    while addr < end {
        if let Some(slot) = mm.pmd_lookup(addr) {
            f(slot, addr);
        }
        addr = match addr.checked_add(PMD_SIZE) {
            Some(a) => a,
            None => break,
        };
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
fn free_user_pte(oncpu: &OnCpu, tlb: &mut MmuGather, slot: PmdSlot, addr: u64) {
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
