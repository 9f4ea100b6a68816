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

/// Where a walk starts: at the root, or at a lower table that a
/// paging-structure cache named for the address (x86's PDPTE cache gives
/// the PMD table, its PDE cache the PTE table), skipping the levels above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkStart {
    Pgd(Pfn),
    PmdTable(Pfn),
    PteTable(Pfn),
}

/// The tables a successful walk read entries from memory to reach, for
/// the paging-structure caches to fill: the PMD table (only when the walk
/// started at the root), and the PTE table (unless the walk started there,
/// or a huge PMD was the leaf). A level a cache gave is not filled again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkPath {
    pub pmd_table: Option<Pfn>,
    pub pte_table: Option<Pfn>,
}

/// Walk `pgd` for `addr`. `write` asks for write permission and sets dirty.
pub fn hw_walk(mem: &PhysMem, pgd: Pfn, addr: u64, write: bool) -> Result<Translation, WalkFault> {
    hw_walk_from(mem, WalkStart::Pgd(pgd), addr, write).map(|(t, _)| t)
}

/// Walk for `addr` from `start`, and say which tables the walk read.
///
/// # Panics
///
/// If `start` names a frame that is no page table any more: a table was
/// freed while a CPU's paging-structure cache still held it, which the
/// TLB flush with `freed_tables` that precedes every table free must
/// prevent. Hardware would walk garbage; the model stops.
pub fn hw_walk_from(
    mem: &PhysMem,
    start: WalkStart,
    addr: u64,
    write: bool,
) -> Result<(Translation, WalkPath), WalkFault> {
    if let WalkStart::PmdTable(t) | WalkStart::PteTable(t) = start {
        assert!(
            mem.page(t).test(crate::phys::memmap::pg::TABLE),
            "a paging-structure cache entry for {addr:#x} names frame {t:#x}, which is no page table any more: a table was freed without a TLB flush that reached this CPU"
        );
    }
    'again: loop {
        let (slot, leaf, size, path) = match start {
            WalkStart::PteTable(t) => {
                let (slot, e) = load_entry(mem, t, pte_index(addr))?;
                (slot, e, PAGE_SIZE, WalkPath::default())
            }
            WalkStart::PmdTable(t) => walk_pmd_table(mem, t, addr)?,
            WalkStart::Pgd(pgd) => {
                let (_, pgde) = load_entry(mem, pgd, pgd_index(addr))?;
                let (_, pude) = load_entry(mem, (pgde & PTE_PFN_MASK) >> 12, pud_index(addr))?;
                let t = (pude & PTE_PFN_MASK) >> 12;
                let (slot, leaf, size, path) = walk_pmd_table(mem, t, addr)?;
                let path = WalkPath {
                    pmd_table: Some(t),
                    ..path
                };
                (slot, leaf, size, path)
            }
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
        let pfn_mask = if size == PMD_SIZE {
            PMD_PFN_MASK
        } else {
            PTE_PFN_MASK
        };
        let t = Translation {
            pfn: (leaf & pfn_mask) >> 12,
            size,
            writable: leaf & _PAGE_RW != 0,
            dirty: want & _PAGE_DIRTY != 0,
        };
        return Ok((t, path));
    }
}

/// The rest of a walk from PMD table `t`: the leaf entry's slot, its value
/// and size, and the PTE table it went through (none for a huge PMD).
#[inline]
fn walk_pmd_table(
    mem: &PhysMem,
    t: Pfn,
    addr: u64,
) -> Result<(&crate::sync::AtomicU64, u64, u64, WalkPath), WalkFault> {
    let (pmd_slot, pmde) = load_entry(mem, t, pmd_index(addr))?;
    if pmde & _PAGE_PSE != 0 {
        return Ok((pmd_slot, pmde, PMD_SIZE, WalkPath::default()));
    }
    let pte_tbl = (pmde & PTE_PFN_MASK) >> 12;
    let (slot, ptee) = load_entry(mem, pte_tbl, pte_index(addr))?;
    let path = WalkPath {
        pmd_table: None,
        pte_table: Some(pte_tbl),
    };
    Ok((slot, ptee, PAGE_SIZE, path))
}

/// Entry `i` of table `t`, if present.
#[inline]
fn load_entry(
    mem: &PhysMem,
    t: Pfn,
    i: usize,
) -> Result<(&crate::sync::AtomicU64, u64), WalkFault> {
    let slot = &table(mem, t)[i];
    let e = slot.load(Ordering::Acquire);
    if e & _PAGE_PRESENT == 0 {
        return Err(WalkFault::NotPresent);
    }
    Ok((slot, e))
}

/// The PMD and PTE tables the page tables of `pgd` hold for `addr` now,
/// as far as they go (for the invariant checker, on a quiescent machine).
pub fn table_path(mem: &PhysMem, pgd: Pfn, addr: u64) -> (Option<Pfn>, Option<Pfn>) {
    let next = |t: Pfn, i: usize| {
        let e = table(mem, t)[i].load(Ordering::Acquire);
        (e & _PAGE_PRESENT != 0 && e & _PAGE_PSE == 0).then_some((e & PTE_PFN_MASK) >> 12)
    };
    let Some(pud_tbl) = next(pgd, pgd_index(addr)) else {
        return (None, None);
    };
    let Some(pmd_tbl) = next(pud_tbl, pud_index(addr)) else {
        return (None, None);
    };
    (Some(pmd_tbl), next(pmd_tbl, pmd_index(addr)))
}
