//! Freeing emptied user PTE tables: the seed's `pte_ref` design (mm/pte_ref.c
//! of the April 2022 RFC). The upstream design (mm/pt_reclaim.c) lives in
//! `zap_pte_range`, where the kernel puts it.
//!
//! With `pte_ref`, every PTE table made while it is selected counts its
//! non-none entries and the walkers that hold it ([`crate::pgtable::pte_ref`]).
//! After MADV_DONTNEED and MADV_FREE, `try_to_free_user_pte` looks at each
//! table of the range: it holds the table, makes its count exact (atomic
//! mode, a grace period), drops its hold, and frees the table if that was
//! the last reference. MADV_DONTNEED then returns the count to per-CPU
//! mode; MADV_FREE leaves it atomic, so that the table dies with the put
//! that clears its last entry when reclaim discards the lazyfree pages.
//!
//! The seed frees the table in the release callback of that last put. The
//! model's puts happen when a page-table guard is dropped, in the layer
//! below; they mark the table dead (walkers are refused it), and the table
//! is unhooked and freed by the first to meet it with no lock held: the
//! madvise that emptied it ([`free_dead_user_ptes`] after MADV_PAGEOUT's
//! discards), a fault on its range, or munmap.

use crate::machine::OnCpu;
use crate::mm::Mm;
use crate::mmu_gather::MmuGather;
use crate::pgtable::{PmdSlot, Ptdesc, Tracking, PMD_MASK, PMD_SIZE};
use crate::phys::PAGE_SIZE;
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
