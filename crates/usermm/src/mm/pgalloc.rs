//! An address space's page tables: populating and locking them (the parts
//! of mm/memory.c and include/linux/mm.h that take an `mm`).
//!
//! Population follows the kernel: allocate a zeroed table outside the lock,
//! take the lock that guards the parent entry, and install the table only if
//! the entry is still empty; otherwise free ours (someone raced us). PUD and
//! PMD tables are installed under `mm->page_table_lock`; PTE tables under the
//! PMD lock, which lives in the PMD table frame's descriptor (split PMD
//! locks, as on x86-64). The guards that reach the entries are the page-table
//! layer's ([`crate::pgtable::generic`]); these methods add the address
//! space's accounting (`pgtables_bytes`).

use super::Mm;
use crate::errno::{Errno, KResult};
use crate::pgtable::{Pmd, PmdLocked, PmdSlot, PteLocked, PteMapped, Tracking};

impl Mm {
    /// `pmd_alloc`: the PMD entry covering `addr`, allocating tables as
    /// needed.
    pub fn pmd_alloc(&self, addr: u64, cpu: usize) -> KResult<PmdSlot> {
        let (slot, installed) = self
            .pgd
            .pmd_alloc(&self.mem, &self.page_table_lock, addr, cpu)
            .ok_or(Errno::ENOMEM)?;
        for _ in 0..installed {
            self.inc_nr_tables();
        }
        Ok(slot)
    }

    /// `pud_alloc`: the PUD level for `addr`, allocating it if needed.
    pub fn pud_alloc(&self, addr: u64, cpu: usize) -> KResult<()> {
        let installed = self
            .pgd
            .pud_alloc(&self.mem, &self.page_table_lock, addr, cpu)
            .ok_or(Errno::ENOMEM)?;
        for _ in 0..installed {
            self.inc_nr_tables();
        }
        Ok(())
    }

    /// `move_normal_pud`'s move of the PMD table under `old_addr`'s PUD
    /// entry to `new_addr`'s, which must be empty (see
    /// [`crate::pgtable::Pgd::move_pud_entry`]); the tables' count is
    /// unchanged. False: not moved.
    ///
    /// # Safety
    ///
    /// As [`crate::pgtable::Pgd::move_pud_entry`]: mmap_lock held for
    /// writing, the entry's range inside one VMA being moved.
    pub unsafe fn move_pud_entry(&self, old_addr: u64, new_addr: u64) -> bool {
        // SAFETY: the caller's contract is the table layer's.
        unsafe {
            self.pgd
                .move_pud_entry(&self.mem, &self.page_table_lock, old_addr, new_addr)
        }
    }

    /// Whether a PUD table covers `addr`.
    pub fn pud_present(&self, addr: u64) -> bool {
        self.pgd.pud_present(&self.mem, addr)
    }

    /// The PMD entry covering `addr`, if its tables exist (`mm_find_pmd`).
    pub fn pmd_lookup(&self, addr: u64) -> Option<PmdSlot> {
        self.pgd.pmd_lookup(&self.mem, addr)
    }

    /// `pmdp_get_lockless`.
    #[inline]
    pub fn pmd_get(&self, slot: PmdSlot) -> Pmd {
        slot.get(&self.mem)
    }

    /// `pmd_lock`.
    #[inline]
    pub fn pmd_lock(&self, slot: PmdSlot) -> PmdLocked<'_> {
        slot.lock(&self.mem)
    }

    /// `__pte_alloc`: give the PMD entry a PTE table unless it has one (or
    /// a huge leaf, which the caller must handle).
    pub fn pte_alloc(&self, slot: PmdSlot, cpu: usize, tracking: Tracking) -> KResult<()> {
        if slot
            .pte_alloc(&self.mem, cpu, tracking)
            .ok_or(Errno::ENOMEM)?
        {
            self.inc_nr_tables();
        }
        Ok(())
    }

    /// `pte_offset_map_lock`: the PTE table under `slot`, locked, or None
    /// if the entry holds no table.
    #[inline]
    pub fn pte_offset_map_lock(&self, slot: PmdSlot) -> Option<PteLocked<'_>> {
        slot.pte_offset_map_lock(&self.mem)
    }

    /// `pte_offset_map`: the PTE table under `slot` for a lockless reader.
    #[inline]
    pub fn pte_offset_map(&self, slot: PmdSlot) -> Option<PteMapped<'_>> {
        slot.pte_offset_map(&self.mem)
    }
}
