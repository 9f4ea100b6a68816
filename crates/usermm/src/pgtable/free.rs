//! Unhooking the tables of an unmapped range (`free_pgd_range` and the
//! `free_p*_range` levels below it, mm/memory.c).
//!
//! A table goes only when it lies wholly inside the span between `floor`
//! (the end of the VMA below, or 0) and `ceiling` (the start of the VMA
//! above, or 0 for the top of the address space), rounded in to the span
//! that one entry of its parent covers: a table that a neighbouring VMA may
//! still use stays. Entries are cleared without the PMD lock, as the kernel
//! clears them: the caller guarantees that no one else can reach them.
//! Each unhooked table is handed to the caller, who passes it through the
//! mmu_gather (`pte_free_tlb` & co.): lockless walkers may still read it
//! until a flush and a grace period have passed.

use super::generic::{next_table, Ptdesc};
use super::{
    addr_end, entry_get, entry_set, pgd_index, pmd_index, pud_index, Pgd, PGDIR_MASK, PGDIR_SIZE,
    PMD_MASK, PMD_SIZE, PUD_MASK, PUD_SIZE,
};
use crate::phys::{Pfn, PhysMem};

/// One call of [`free_pgd_range`]: the bounds and what to do with each
/// table it unhooks (`pte_free_tlb` / `pmd_free_tlb` / `pud_free_tlb`,
/// given the table and an address it covered).
pub struct FreePgtables<'a, F: FnMut(Ptdesc, u64)> {
    pub mem: &'a PhysMem,
    pub floor: u64,
    pub ceiling: u64,
    pub free_tlb: F,
}

/// The two table levels walked below the PGD.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    /// A PUD table: its entries point to PMD tables.
    Pud,
    /// A PMD table: its entries point to PTE tables.
    Pmd,
}

impl Level {
    fn entry_size(self) -> u64 {
        match self {
            Level::Pud => PUD_SIZE,
            Level::Pmd => PMD_SIZE,
        }
    }
    fn index(self, addr: u64) -> usize {
        match self {
            Level::Pud => pud_index(addr),
            Level::Pmd => pmd_index(addr),
        }
    }
    /// The span one table of this level covers.
    fn table_mask(self) -> u64 {
        match self {
            Level::Pud => PGDIR_MASK,
            Level::Pmd => PUD_MASK,
        }
    }
}

/// `free_pgd_range`: unhook every table that lies wholly inside the
/// PMD-aligned span between `floor` and `ceiling` and is touched by
/// `[addr, end)`.
///
/// # Safety
///
/// No one else can reach the tables of the range: the VMAs over it are
/// detached from the tree and from the rmap, and the caller holds mmap_lock
/// (for writing, or for reading after munmap's downgrade) or tears the
/// address space down, so no fault or walk can find them.
pub unsafe fn free_pgd_range<F: FnMut(Ptdesc, u64)>(
    pgd: &Pgd,
    f: &mut FreePgtables<'_, F>,
    addr: u64,
    end: u64,
) {
    let mut addr = addr & PMD_MASK;
    if addr < f.floor {
        addr = addr.wrapping_add(PMD_SIZE);
        if addr == 0 {
            return;
        }
    }
    let mut ceiling = f.ceiling;
    let mut end = end;
    if ceiling != 0 {
        ceiling &= PMD_MASK;
        if ceiling == 0 {
            return;
        }
    }
    if end.wrapping_sub(1) > ceiling.wrapping_sub(1) {
        end -= PMD_SIZE;
    }
    if addr > end.wrapping_sub(1) {
        return;
    }
    let mut a = addr;
    loop {
        let next = addr_end(a, end, PGDIR_SIZE);
        let e = entry_get(f.mem, pgd.cr3(), pgd_index(a));
        if e != 0 {
            free_table_range(pgd, f, Level::Pud, next_table(e), a, next);
        }
        a = next;
        if a == end {
            break;
        }
    }
}

/// `free_pud_range` / `free_pmd_range` (with `free_pte_range` inlined):
/// unhook the tables below `table` (a table of `level`) over
/// `[addr, end)`, then `table` itself if the floor/ceiling rule lets it
/// go, clearing its parent's entry.
fn free_table_range<F: FnMut(Ptdesc, u64)>(
    pgd: &Pgd,
    f: &mut FreePgtables<'_, F>,
    level: Level,
    table: Pfn,
    addr: u64,
    end: u64,
) {
    let mem = f.mem;
    let mut a = addr;
    loop {
        let next = addr_end(a, end, level.entry_size());
        let idx = level.index(a);
        let e = entry_get(mem, table, idx);
        if e != 0 {
            match level {
                Level::Pud => free_table_range(pgd, f, Level::Pmd, next_table(e), a, next),
                Level::Pmd => {
                    debug_assert!(
                        e & super::entry::_PAGE_PSE == 0,
                        "free_pte_range on a huge PMD at {a:#x}"
                    );
                    entry_set(mem, table, idx, 0);
                    (f.free_tlb)(Ptdesc::unhooked(next_table(e)), a);
                }
            }
        }
        a = next;
        if a == end {
            break;
        }
    }
    let Some(start) = table_span_free(addr, end, f.floor, f.ceiling, level.table_mask()) else {
        return;
    };
    let (parent, pidx) = match level {
        Level::Pud => (pgd.cr3(), pgd_index(start)),
        Level::Pmd => (
            next_table(entry_get(mem, pgd.cr3(), pgd_index(start))),
            pud_index(start),
        ),
    };
    entry_set(mem, parent, pidx, 0);
    (f.free_tlb)(Ptdesc::unhooked(table), start);
}

/// The floor/ceiling test of `free_pmd_range` / `free_pud_range`: may the
/// table covering `[addr, end)` at the level above (`mask`) go? Returns its
/// aligned start.
fn table_span_free(addr: u64, end: u64, floor: u64, ceiling: u64, mask: u64) -> Option<u64> {
    let start = addr & mask;
    if start < floor {
        return None;
    }
    let mut ceiling = ceiling;
    if ceiling != 0 {
        ceiling &= mask;
        if ceiling == 0 {
            return None;
        }
    }
    if end.wrapping_sub(1) > ceiling.wrapping_sub(1) {
        return None;
    }
    Some(start)
}
