//! The hardware page walker: what the MMU does on a TLB miss.
//!
//! It reads each level with a single atomic load and no lock, exactly as a
//! CPU's walker does, so it may race with the kernel changing or freeing the
//! tables. The caller must keep the tables it may reach from being freed
//! (it holds an epoch guard, standing in for the kernel's RCU-deferred table
//! freeing that lockless walkers rely on).
//!
//! Like x86, it sets the accessed bit on the leaf of every successful walk and
//! the dirty bit on a write, with a compare-and-exchange; if the entry changed
//! under it, it walks again.

use super::entry::*;
use super::{pgd_index, pmd_index, pte_index, pud_index, table, PMD_SIZE};
use crate::phys::{Pfn, PhysMem, PAGE_SIZE};
use crate::sync::Ordering;

/// A successful translation, ready to be cached in a TLB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// Frame of the first page of the leaf (a 2 MiB leaf's head frame).
    pub pfn: Pfn,
    /// 4 KiB or 2 MiB.
    pub size: u64,
    pub writable: bool,
    /// Whether the leaf's dirty bit is set, so a store needs no new walk.
    pub dirty: bool,
}

impl Translation {
    /// The frame holding `addr`, and the offset inside it.
    #[inline]
    pub fn frame_of(&self, addr: u64) -> (Pfn, u64) {
        let off = addr & (self.size - 1);
        (self.pfn + off / PAGE_SIZE, off % PAGE_SIZE)
    }
}

/// Why the walker raised a page fault (`X86_PF_PROT` or not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkFault {
    NotPresent,
    Protection,
}

/// Walk `pgd` for `addr`. `write` asks for write permission and sets dirty.
pub fn hw_walk(mem: &PhysMem, pgd: Pfn, addr: u64, write: bool) -> Result<Translation, WalkFault> {
    'again: loop {
        let pgde = table(mem, pgd)[pgd_index(addr)].load(Ordering::Acquire);
        if pgde & _PAGE_PRESENT == 0 {
            return Err(WalkFault::NotPresent);
        }
        let pud_tbl = (pgde & PTE_PFN_MASK) >> 12;
        let pude = table(mem, pud_tbl)[pud_index(addr)].load(Ordering::Acquire);
        if pude & _PAGE_PRESENT == 0 {
            return Err(WalkFault::NotPresent);
        }
        let pmd_tbl = (pude & PTE_PFN_MASK) >> 12;
        let pmd_slot = &table(mem, pmd_tbl)[pmd_index(addr)];
        let pmde = pmd_slot.load(Ordering::Acquire);
        if pmde & _PAGE_PRESENT == 0 {
            return Err(WalkFault::NotPresent);
        }
        let (slot, leaf, size, pfn) = if pmde & _PAGE_PSE != 0 {
            (pmd_slot, pmde, PMD_SIZE, (pmde & PMD_PFN_MASK) >> 12)
        } else {
            let slot = &table(mem, (pmde & PTE_PFN_MASK) >> 12)[pte_index(addr)];
            let ptee = slot.load(Ordering::Acquire);
            if ptee & _PAGE_PRESENT == 0 {
                return Err(WalkFault::NotPresent);
            }
            (slot, ptee, PAGE_SIZE, (ptee & PTE_PFN_MASK) >> 12)
        };
        if leaf & _PAGE_USER == 0 || (write && leaf & _PAGE_RW == 0) {
            return Err(WalkFault::Protection);
        }
        let want = leaf | _PAGE_ACCESSED | if write { _PAGE_DIRTY } else { 0 };
        if want != leaf
            && slot
                .compare_exchange(leaf, want, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            // The kernel changed the entry while we walked: walk again, as
            // the MMU's locked A/D update would see the new value.
            continue 'again;
        }
        return Ok(Translation {
            pfn,
            size,
            writable: leaf & _PAGE_RW != 0,
            dirty: want & _PAGE_DIRTY != 0,
        });
    }
}
