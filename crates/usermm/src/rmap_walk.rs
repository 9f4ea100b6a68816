//! The rmap walks of anonymous folios (mm/rmap.c's `rmap_walk_anon`) and
//! of page-cache folios (`rmap_walk_file`), and
//! the walk of one VMA's entries that may map a folio
//! (mm/page_vma_mapped.c's `page_vma_mapped_walk`): every VMA that may map
//! a folio, with its address space, and in each the PMD-level entries and
//! the locked PTEs where the folio's pages may be. Migration
//! (`try_to_migrate`, `remove_migration_ptes`) and reclaim
//! (`folio_referenced`, `try_to_unmap`) walk with them.
//!
//! The walk holds the anon_vma's lock (the file's `i_mmap` lock) for
//! reading throughout, so that no VMA it finds can be unlinked, and have
//! its page tables freed, under it; the caller holds a reference to the
//! anon_vma ([`crate::rmap::folio_get_anon_vma`]), or the page-cache
//! folio's lock, which keeps the file's address space alive.

use crate::machine::OnCpu;
use crate::mm::{AnonVma, Mm, Vma};
use crate::pgtable::{PmdSlot, PteLocked, PteRead, PMD_SIZE};
use crate::phys::{Folio, PhysMem, PAGE_SHIFT};
use crate::rmap;
use crate::sync::Arc;

/// `rmap_walk_anon`: `f` is called for each VMA chained to `anon_vma`
/// whose range may hold a page of `folio`, with the VMA's mm, the lock
/// held; it returns false to stop the walk.
pub fn rmap_walk_anon(
    oncpu: &OnCpu,
    folio: Folio,
    anon_vma: &AnonVma,
    mut f: impl FnMut(&Arc<Mm>, &Vma) -> bool,
) {
    let mem = oncpu.mem();
    let first = rmap::folio_page_pgoff(mem, folio, folio.pfn());
    let last = first + folio.nr_pages(mem) - 1;
    let g = anon_vma.lock_read();
    for vma in anon_vma.vmas_in_locked(&g, first, last) {
        let Some(mm) = oncpu.m.mm_by_id(vma.mm_id) else {
            continue;
        };
        if !f(&mm, &vma) {
            break;
        }
    }
}

/// Consecutive pages of a folio that one VMA may map through one PTE
/// table: pages `i..i + nr` of the folio, from address `addr`. A walk
/// takes the table's lock once for the run, as `page_vma_mapped_walk`
/// holds it across a folio's PTEs.
#[derive(Clone, Copy, Debug)]
pub struct PteRun {
    pub i: u64,
    pub addr: u64,
    pub nr: u64,
}

impl PteRun {
    /// Each page of the run: (page number in the folio, address).
    pub fn pages(self) -> impl Iterator<Item = (u64, u64)> {
        (0..self.nr).map(move |k| (self.i + k, self.addr + (k << PAGE_SHIFT)))
    }
}

/// The pages of `folio` that `vma` may map, in runs of one PTE table each.
/// The folio's pages in a VMA are consecutive (its linear offsets), so
/// they end only at the VMA's edges and at PMD boundaries.
pub fn folio_pte_runs(mem: &PhysMem, folio: Folio, vma: &Vma) -> impl Iterator<Item = PteRun> {
    let first = rmap::folio_page_pgoff(mem, folio, folio.pfn());
    let lo = vma.pgoff().max(first);
    let hi = (vma.pgoff() + vma.pages()).min(first + folio.nr_pages(mem));
    let (mut i, end) = (lo.saturating_sub(first), hi.saturating_sub(first));
    let (start, pgoff) = (vma.start(), vma.pgoff());
    std::iter::from_fn(move || {
        if lo >= hi || i >= end {
            return None;
        }
        let addr = start + ((first + i - pgoff) << PAGE_SHIFT);
        let to_boundary = (PMD_SIZE - (addr & (PMD_SIZE - 1))) >> PAGE_SHIFT;
        let nr = (end - i).min(to_boundary);
        let run = PteRun { i, addr, nr };
        i += nr;
        Some(run)
    })
}

/// What a [`page_vma_mapped_walk`] caller did with a PMD-level entry (a
/// huge PMD or a PMD migration entry) where a run of the folio may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtPmd {
    /// Dealt with at this level: on to the next run.
    Done,
    /// Look at the PTE table under it (after a split, say); where the PMD
    /// maps none, there is nothing more to see.
    Ptes,
    /// End the walk.
    Stop,
}

/// `page_vma_mapped_walk` over one VMA of `mm`: for each run of `folio`'s
/// pages that `vma` may map ([`folio_pte_runs`]), `at_pmd` is asked first
/// where the PMD entry is a leaf (a huge PMD or a PMD migration entry);
/// then, with the PTE table's lock held once for the run, as the kernel's
/// walk holds it across a folio's PTEs, `at_pte` is called for each page
/// (its number in the folio and its address), returning false to stop.
/// Returns false if either stopped the walk.
pub fn page_vma_mapped_walk(
    mem: &PhysMem,
    mm: &Mm,
    vma: &Vma,
    folio: Folio,
    mut at_pmd: impl FnMut(PmdSlot, PteRun) -> AtPmd,
    mut at_pte: impl FnMut(&mut PteLocked<'_>, u64, u64) -> bool,
) -> bool {
    for run in folio_pte_runs(mem, folio, vma) {
        let Some(slot) = mm.pmd_lookup(run.addr) else {
            continue;
        };
        let pmd = mm.pmd_get(slot);
        if pmd.trans_huge() || pmd.is_migration() {
            match at_pmd(slot, run) {
                AtPmd::Done => continue,
                AtPmd::Stop => return false,
                AtPmd::Ptes => {}
            }
        }
        let Some(mut pt) = mm.pte_offset_map_lock(slot) else {
            continue;
        };
        for (i, addr) in run.pages() {
            if !at_pte(&mut pt, i, addr) {
                return false;
            }
        }
    }
    true
}

/// `rmap_walk_file`: `f` is called for each VMA in the file's `i_mmap`
/// whose range may hold a page of `folio` (cached at `index`), with the
/// VMA's mm, the `i_mmap` lock held; it returns false to stop the walk.
pub fn rmap_walk_file(
    oncpu: &OnCpu,
    mapping: &crate::fs::AddressSpace,
    folio: Folio,
    index: u64,
    mut f: impl FnMut(&Arc<Mm>, &Vma) -> bool,
) {
    let last = index + folio.nr_pages(oncpu.mem()) - 1;
    mapping.for_each_vma_in(index, last, |vma| match oncpu.m.mm_by_id(vma.mm_id) {
        Some(mm) => f(&mm, vma),
        None => true,
    });
}

/// `folio_mkclean`: every shared mapping of a locked page-cache folio
/// becomes clean and read-only, flushed from the TLBs, so that the next
/// store through it faults (and dirties the folio again). Returns how
/// many entries were dirty or writable.
pub fn folio_mkclean(
    oncpu: &OnCpu,
    mapping: &crate::fs::AddressSpace,
    folio: Folio,
    index: u64,
) -> u64 {
    use crate::pgtable::entry::{_PAGE_DIRTY, _PAGE_RW};
    let mem = oncpu.mem();
    let mut cleaned = 0;
    rmap_walk_file(oncpu, mapping, folio, index, |mm, vma| {
        // invalid_mkclean_vma: only shared mappings write the file.
        if vma.flags() & crate::mm::vma::VM_SHARED == 0 {
            return true;
        }
        let at_pmd = |slot, run: PteRun| {
            let mut ptl = mm.pmd_lock(slot);
            let pmd = ptl.get();
            if pmd.trans_huge() && pmd.pfn() == folio.pfn() && run.i == 0 {
                if pmd.write() || pmd.dirty() {
                    let old = ptl.invalidate();
                    ptl.set(old.wrprotect().mkclean());
                    drop(ptl);
                    oncpu.flush_tlb_range(
                        mm,
                        run.addr,
                        run.addr + PMD_SIZE,
                        crate::pgtable::PMD_SHIFT,
                    );
                    cleaned += 1;
                }
                return AtPmd::Done;
            }
            AtPmd::Ptes
        };
        let mut flushes = Vec::new();
        page_vma_mapped_walk(mem, mm, vma, folio, at_pmd, |pt, i, addr| {
            let idx = crate::pgtable::pte_index(addr);
            let pte = pt.pte(idx);
            if pte.present() && pte.pfn() == folio.pfn() + i && (pte.write() || pte.dirty()) {
                pt.clear_bits(idx, _PAGE_RW | _PAGE_DIRTY);
                flushes.push(addr);
            }
            true
        });
        for addr in flushes {
            oncpu.flush_tlb_page(mm, addr);
            cleaned += 1;
        }
        true
    });
    cleaned
}
