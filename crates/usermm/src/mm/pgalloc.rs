//! Allocating and locking page tables of an address space (the parts of
//! mm/memory.c and include/linux/mm.h that populate and map tables).
//!
//! Population follows the kernel: allocate a zeroed table outside the lock,
//! take the lock that guards the parent entry, and install the table only if
//! the entry is still empty; otherwise free ours (someone raced us). PUD and
//! PMD tables are installed under `mm->page_table_lock`; PTE tables under the
//! PMD lock, which lives in the PMD table frame's descriptor (split PMD
//! locks, as on x86-64).

use super::Mm;
use crate::errno::{Errno, KResult};
use crate::pgtable::entry::{Pmd, _PAGE_PRESENT, _PAGE_PSE, _PAGE_TABLE, PTE_PFN_MASK};
use crate::pgtable::{
    entry_get, entry_set, pgd_index, pmd_index, pud_index, table_alloc, table_free,
};
use crate::phys::{Pfn, PAGE_SHIFT};
use crate::sync::SpinGuard;

#[inline]
fn next_table(entry: u64) -> Pfn {
    (entry & PTE_PFN_MASK) >> PAGE_SHIFT
}

/// Where a PMD entry lives: its table and its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PmdSlot {
    pub table: Pfn,
    pub idx: usize,
}

/// A locked PTE table (`pte_offset_map_lock`): the PTL stays held while this
/// lives.
pub struct PteLocked<'a> {
    pub table: Pfn,
    _ptl: SpinGuard<'a>,
}

impl Mm {
    /// Install a table at `(parent, idx)` under `lock` unless one is there.
    fn populate(
        &self,
        parent: Pfn,
        idx: usize,
        lock: &crate::sync::SpinLock,
        cpu: usize,
    ) -> KResult<Pfn> {
        let new = table_alloc(&self.mem, self.mem.cpu_to_node(cpu), cpu).ok_or(Errno::ENOMEM)?;
        let _g = lock.lock();
        let cur = entry_get(&self.mem, parent, idx);
        if cur != 0 {
            drop(_g);
            table_free(&self.mem, new, cpu);
            return Ok(next_table(cur));
        }
        self.inc_nr_tables();
        // Release (in entry_set): the zeroed table is visible to any walker
        // that sees the pointer.
        entry_set(&self.mem, parent, idx, (new << PAGE_SHIFT) | _PAGE_TABLE);
        Ok(new)
    }

    /// `pud_alloc`: the PUD table covering `addr`, allocating it if needed.
    pub fn pud_alloc(&self, addr: u64, cpu: usize) -> KResult<Pfn> {
        let e = entry_get(&self.mem, self.pgd, pgd_index(addr));
        if e & _PAGE_PRESENT != 0 {
            return Ok(next_table(e));
        }
        self.populate(self.pgd, pgd_index(addr), &self.page_table_lock, cpu)
    }

    /// `pmd_alloc`: the PMD slot covering `addr`, allocating tables as needed.
    pub fn pmd_alloc(&self, addr: u64, cpu: usize) -> KResult<PmdSlot> {
        let pud = self.pud_alloc(addr, cpu)?;
        let e = entry_get(&self.mem, pud, pud_index(addr));
        let table = if e & _PAGE_PRESENT != 0 {
            next_table(e)
        } else {
            self.populate(pud, pud_index(addr), &self.page_table_lock, cpu)?
        };
        Ok(PmdSlot {
            table,
            idx: pmd_index(addr),
        })
    }

    /// The PUD table covering `addr`, if there is one.
    pub fn pud_lookup(&self, addr: u64) -> Option<Pfn> {
        let e = entry_get(&self.mem, self.pgd, pgd_index(addr));
        (e & _PAGE_PRESENT != 0).then(|| next_table(e))
    }

    /// Find the PMD slot covering `addr` without allocating (`mm_find_pmd`).
    pub fn pmd_lookup(&self, addr: u64) -> Option<PmdSlot> {
        let e = entry_get(&self.mem, self.pgd, pgd_index(addr));
        if e & _PAGE_PRESENT == 0 {
            return None;
        }
        let e = entry_get(&self.mem, next_table(e), pud_index(addr));
        if e & _PAGE_PRESENT == 0 {
            return None;
        }
        Some(PmdSlot {
            table: next_table(e),
            idx: pmd_index(addr),
        })
    }

    #[inline]
    pub fn pmd_get(&self, slot: PmdSlot) -> Pmd {
        Pmd(entry_get(&self.mem, slot.table, slot.idx))
    }

    #[inline]
    pub fn pmd_set(&self, slot: PmdSlot, pmd: Pmd) {
        entry_set(&self.mem, slot.table, slot.idx, pmd.0)
    }

    /// `pmd_lock`: the split PMD lock of the table holding `slot`.
    pub fn pmd_lock(&self, slot: PmdSlot) -> SpinGuard<'_> {
        self.mem.page(slot.table).ptl.lock()
    }

    /// `__pte_alloc`: give the PMD slot a PTE table unless it has one (or a
    /// huge leaf, which the caller must handle).
    pub fn pte_alloc(&self, slot: PmdSlot, cpu: usize) -> KResult<()> {
        if !self.pmd_get(slot).none() {
            return Ok(());
        }
        let new = table_alloc(&self.mem, self.mem.cpu_to_node(cpu), cpu).ok_or(Errno::ENOMEM)?;
        let ptl = self.pmd_lock(slot);
        if self.pmd_get(slot).none() {
            self.inc_nr_tables();
            self.pmd_set(slot, Pmd::table(new));
            return Ok(());
        }
        drop(ptl);
        table_free(&self.mem, new, cpu);
        Ok(())
    }

    /// `pte_offset_map_lock`: lock the PTE table that `slot` points to, or
    /// None if the slot holds no table (none, or a huge leaf). Rechecks the
    /// PMD after taking the PTL and retries if it changed underneath.
    pub fn pte_offset_map_lock(&self, slot: PmdSlot) -> Option<PteLocked<'_>> {
        loop {
            let pmd = self.pmd_get(slot);
            if pmd.none() || pmd.0 & _PAGE_PSE != 0 || pmd.0 & _PAGE_PRESENT == 0 {
                return None;
            }
            let table = pmd.table_pfn();
            let ptl = self.mem.page(table).ptl.lock();
            if self.pmd_get(slot) == pmd {
                return Some(PteLocked { table, _ptl: ptl });
            }
        }
    }
}
