//! Layer 2: x86-64 four-level page tables held in frames.
//!
//! Every table (PGD, PUD, PMD, PTE) is one 4 KiB frame from [`crate::phys`]
//! holding 512 little-endian 64-bit entries, read and written only as single
//! atomic operations: other CPUs' hardware walkers ([`walk::hw_walk`]) read
//! them without any lock, and set the accessed and dirty bits with a
//! compare-and-exchange, as the MMU does.
//!
//! The five-level layout is folded to four (P4D = PGD), as on x86-64 without
//! LA57.

pub mod entry;
pub mod free;
pub mod generic;
pub mod pagewalk;
pub mod pte_ref;
pub mod swapops;
pub mod walk;

pub use entry::{Pgprot, Pmd, Pte};
pub use generic::{
    pmd_is_table, Pgd, PmdLocked, PmdPairLocked, PmdSlot, Ptdesc, PteLocked, PteMapped, PteRead,
    PteRefHeld, TrylockFail,
};

use crate::phys::{pg, Pfn, PhysMem};
use crate::sync::{AtomicU64, Ordering};

pub const PTRS_PER_TABLE: usize = 512;
pub const PMD_SHIFT: u32 = 21;
pub const PUD_SHIFT: u32 = 30;
pub const PGDIR_SHIFT: u32 = 39;
pub const PMD_SIZE: u64 = 1 << PMD_SHIFT;
pub const PMD_MASK: u64 = !(PMD_SIZE - 1);
pub const PUD_SIZE: u64 = 1 << PUD_SHIFT;
pub const PUD_MASK: u64 = !(PUD_SIZE - 1);
pub const PGDIR_SIZE: u64 = 1 << PGDIR_SHIFT;
pub const PGDIR_MASK: u64 = !(PGDIR_SIZE - 1);

#[inline]
pub fn pgd_index(addr: u64) -> usize {
    ((addr >> PGDIR_SHIFT) & 511) as usize
}
#[inline]
pub fn pud_index(addr: u64) -> usize {
    ((addr >> PUD_SHIFT) & 511) as usize
}
#[inline]
pub fn pmd_index(addr: u64) -> usize {
    ((addr >> PMD_SHIFT) & 511) as usize
}
#[inline]
pub fn pte_index(addr: u64) -> usize {
    ((addr >> crate::phys::PAGE_SHIFT) & 511) as usize
}

/// End of the table-sized block that contains `addr`, clamped to `end`
/// (`pgd_addr_end` and friends). `size` is the block size of the level.
#[inline]
pub fn addr_end(addr: u64, end: u64, size: u64) -> u64 {
    let boundary = addr.wrapping_add(size) & !(size - 1);
    // The "- 1" comparison copes with a boundary that wrapped to zero.
    if boundary.wrapping_sub(1) < end - 1 {
        boundary
    } else {
        end
    }
}

/// The 512 entries of a table frame.
#[inline]
fn table(mem: &PhysMem, pfn: Pfn) -> &[AtomicU64; PTRS_PER_TABLE] {
    debug_assert!(
        mem.page(pfn).test(pg::TABLE),
        "frame {pfn:#x} is not a page table"
    );
    // SAFETY: a table frame is 4096 bytes, page-aligned, inside an arena that
    // lives as long as `mem`; every access to a table frame's bytes is atomic
    // (this is the only way the engine reaches them), and AtomicU64 has the
    // size and alignment of u64.
    unsafe { &*(mem.frame_ptr(pfn) as *const [AtomicU64; PTRS_PER_TABLE]) }
}

/// Read one entry as the kernel's `READ_ONCE(*ptep)` / `ptep_get` does.
/// Acquire: a walker that sees a table pointer also sees the table's zeroed
/// contents written before `pmd_populate` published it.
#[inline]
fn entry_get(mem: &PhysMem, table_pfn: Pfn, idx: usize) -> u64 {
    table(mem, table_pfn)[idx].load(Ordering::Acquire)
}

/// Write one entry (`set_pte`, `WRITE_ONCE`). Release pairs with the
/// walkers' Acquire.
#[inline]
fn entry_set(mem: &PhysMem, table_pfn: Pfn, idx: usize, val: u64) {
    table(mem, table_pfn)[idx].store(val, Ordering::Release)
}

/// Clear an entry and return what it held (`ptep_get_and_clear`): one atomic
/// exchange, so an accessed/dirty bit set by a racing walker is not lost.
#[inline]
fn entry_get_and_clear(mem: &PhysMem, table_pfn: Pfn, idx: usize) -> u64 {
    table(mem, table_pfn)[idx].swap(0, Ordering::AcqRel)
}

/// Clear `bits` in an entry atomically (`ptep_set_wrprotect` and the like):
/// a walker's concurrent accessed/dirty update is kept.
#[inline]
fn entry_clear_bits(mem: &PhysMem, table_pfn: Pfn, idx: usize, bits: u64) -> u64 {
    table(mem, table_pfn)[idx].fetch_and(!bits, Ordering::AcqRel)
}

/// Allocate a zeroed table frame (`pagetable_alloc` + `pagetable_pte_ctor`).
fn table_alloc(mem: &PhysMem, nid: usize, cpu: usize) -> Option<Pfn> {
    let pfn = mem.alloc_pages(
        nid,
        0,
        cpu,
        crate::phys::AllocFlags {
            zero: true,
            ..Default::default()
        },
    )?;
    mem.page(pfn).set(pg::TABLE);
    // `index` of a table frame holds who took its lock (crate::cacheline).
    mem.page(pfn).index.store(0, Ordering::Relaxed);
    mem.mod_node_state(crate::vmstat::NodeStat::NR_PAGETABLE, 1);
    Some(pfn)
}

/// Whether a new PTE table keeps a reference count (`pte_ref`, the F4
/// seed's design) or not (every other design: the kernel's tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracking {
    Untracked,
    PteRef,
}

/// Give a fresh PTE table its count (`pte_ref_init`), in the descriptor
/// slot that the kernel's `struct page` unions with the mapping for table
/// pages. Before the table is published.
fn pte_ref_init(mem: &PhysMem, pfn: Pfn) {
    let r = Box::new(pte_ref::PteRef::new(mem.machine_id(), mem.nr_cpus()));
    // Release: a walker that reads the pointer (after the table's
    // publication) sees the count initialised.
    mem.page(pfn)
        .mapping
        .store(Box::into_raw(r) as u64, Ordering::Release);
}

/// The count of a tracked PTE table, None for an untracked one.
///
/// The caller keeps the table from being freed while it uses the count:
/// it holds an epoch pin under which it saw a PMD point to the table, or
/// owns the detached table.
#[inline]
fn pte_ref_of(mem: &PhysMem, pfn: Pfn) -> Option<&pte_ref::PteRef> {
    let p = mem.page(pfn).mapping.load(Ordering::Acquire);
    // SAFETY: a non-zero `mapping` of a table frame is the Box made by
    // `pte_ref_init`, freed only by `table_free`, which runs after a grace
    // period once the table is unreachable; the caller's pin or ownership
    // keeps that from happening while the reference lives (see above).
    (p != 0).then(|| unsafe { &*(p as *const pte_ref::PteRef) })
}

/// Free a table frame that no walker can reach any more (`pagetable_free`).
/// The caller has waited for the TLB flush and for lockless walkers.
fn table_free(mem: &PhysMem, pfn: Pfn, cpu: usize) {
    let r = mem.page(pfn).mapping.swap(0, Ordering::Acquire);
    if r != 0 {
        // SAFETY: made by `pte_ref_init` with Box::into_raw, and taken out
        // of the descriptor just now by the only thread freeing the table
        // (no walker can reach it any more).
        drop(unsafe { Box::from_raw(r as *mut pte_ref::PteRef) });
    }
    debug_assert!(
        table(mem, pfn)
            .iter()
            .all(|e| e.load(Ordering::Relaxed) == 0),
        "freeing a non-empty table {pfn:#x}"
    );
    let page = mem.page(pfn);
    page.clear(pg::TABLE);
    debug_assert!(
        !page.ptl.is_locked(),
        "freeing table {pfn:#x} with its lock held"
    );
    mem.mod_node_state(crate::vmstat::NodeStat::NR_PAGETABLE, -1);
    crate::phys::Folio(pfn).put(mem, cpu);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_and_boundaries() {
        let a = 0x7f12_3456_7000u64;
        assert_eq!(pgd_index(a), (a >> 39) as usize & 511);
        assert_eq!(pte_index(0x1000), 1);
        assert_eq!(pmd_index(0x20_0000), 1);
        assert_eq!(addr_end(0x1000, 0x40_0000, PMD_SIZE), 0x20_0000);
        assert_eq!(addr_end(0x1000, 0x10_0000, PMD_SIZE), 0x10_0000);
        // The last block of the address space wraps to 0 and is clamped.
        assert_eq!(addr_end(PMD_MASK, u64::MAX, PMD_SIZE), u64::MAX);
    }
}
