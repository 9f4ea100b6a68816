//! madvise (mm/madvise.c): MADV_DONTNEED, MADV_FREE, MADV_PAGEOUT,
//! MADV_REMOVE, MADV_HUGEPAGE and MADV_NOHUGEPAGE; MADV_COLLAPSE's work
//! is in [`crate::khugepaged`].
//!
//! DONTNEED, FREE and PAGEOUT run under mmap_lock for reading, so two of
//! them may run on one mm at once; their gathers then end in a full flush
//! (`mm_tlb_flush_nested`). HUGEPAGE and NOHUGEPAGE change VMA flags and take
//! it for writing.

use std::ops::ControlFlow;

use crate::errno::{Errno, KResult};
use crate::huge_memory::{self, split_folio_in_table, FolioPte, PmdPageout, SplitAt};
use crate::machine::OnCpu;
use crate::memory::{self, vm_normal_page};
use crate::mm::vma::*;
use crate::mm::{Mm, Vma};
use crate::mmap::vma_modify_flags;
use crate::mmu_gather::MmuGather;
use crate::pgtable::pagewalk::{walk_page_range, MmWalkOps, WalkAction, WalkLock};
use crate::pgtable::{self, Pmd, PmdSlot, PteRead};
use crate::phys::{pg, PAGE_MASK, PAGE_SIZE};
use crate::pt_reclaim::{self, SwitchBack};
use crate::sync::Arc;
use crate::tunable::PtReclaim;
use crate::vmscan::{self, shrink_lazyfree_ptes, Discard, FolioPtes};

pub const MADV_NORMAL: i32 = 0;
pub const MADV_WILLNEED: i32 = 3;
pub const MADV_DONTNEED: i32 = 4;
pub const MADV_FREE: i32 = 8;
pub const MADV_REMOVE: i32 = 9;
pub const MADV_DONTFORK: i32 = 10;
pub const MADV_DOFORK: i32 = 11;
pub const MADV_HUGEPAGE: i32 = 14;
pub const MADV_NOHUGEPAGE: i32 = 15;
pub const MADV_WIPEONFORK: i32 = 18;
pub const MADV_KEEPONFORK: i32 = 19;
pub const MADV_PAGEOUT: i32 = 21;
pub const MADV_POPULATE_READ: i32 = 22;
pub const MADV_POPULATE_WRITE: i32 = 23;
pub const MADV_COLLAPSE: i32 = 25;

/// `madvise(2)`.
pub fn do_madvise(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    start: u64,
    len_in: u64,
    advice: i32,
) -> KResult<()> {
    if ![
        MADV_NORMAL,
        MADV_WILLNEED,
        MADV_DONTNEED,
        MADV_FREE,
        MADV_REMOVE,
        MADV_HUGEPAGE,
        MADV_NOHUGEPAGE,
        MADV_PAGEOUT,
        MADV_DONTFORK,
        MADV_DOFORK,
        MADV_WIPEONFORK,
        MADV_KEEPONFORK,
        MADV_POPULATE_READ,
        MADV_POPULATE_WRITE,
        MADV_COLLAPSE,
    ]
    .contains(&advice)
    {
        return Err(Errno::EINVAL);
    }
    if start & !PAGE_MASK != 0 {
        return Err(Errno::EINVAL);
    }
    let len = len_in
        .checked_add(PAGE_SIZE - 1)
        .map(|l| l & PAGE_MASK)
        .ok_or(Errno::EINVAL)?;
    if len_in != 0 && len == 0 {
        return Err(Errno::EINVAL);
    }
    let end = start.checked_add(len).ok_or(Errno::EINVAL)?;
    if end == start {
        return Ok(());
    }
    match advice {
        // madvise_populate: not a walk of the VMAs; the fault-in looks
        // each up and reports what it finds.
        MADV_POPULATE_READ | MADV_POPULATE_WRITE => {
            crate::gup::faultin_page_range(oncpu, mm, start, end, advice == MADV_POPULATE_WRITE)
        }
        // Each VMA's whole PMDs collapsed in turn; the first VMA that
        // fails ends the walk with its error (khugepaged.rs).
        MADV_COLLAPSE => {
            let vmas: Vec<Arc<Vma>> = {
                let _g = mm.mmap_lock.read();
                let guard = crate::sync::epoch::pin();
                mm.vma_tree(&guard).range(start, end).cloned().collect()
            };
            for vma in &vmas {
                let (s, e) = (start.max(vma.start()), end.min(vma.end()));
                crate::khugepaged::madvise_collapse(oncpu, mm, vma, s, e)?;
            }
            if has_hole(&vmas, start, end) {
                Err(Errno::ENOMEM)
            } else {
                Ok(())
            }
        }
        // Each VMA's range punched out of its file in turn, with mmap_lock
        // dropped (the kernel drops it around `vfs_fallocate`); the first
        // VMA that fails ends the walk with its error.
        MADV_REMOVE => {
            let vmas: Vec<Arc<Vma>> = {
                let _g = mm.mmap_lock.read();
                let guard = crate::sync::epoch::pin();
                mm.vma_tree(&guard).range(start, end).cloned().collect()
            };
            for vma in &vmas {
                madvise_remove(oncpu, vma, start.max(vma.start()), end.min(vma.end()))?;
            }
            if has_hole(&vmas, start, end) {
                Err(Errno::ENOMEM)
            } else {
                Ok(())
            }
        }
        MADV_WILLNEED => {
            let vmas: Vec<Arc<Vma>> = {
                let _g = mm.mmap_lock.read();
                let guard = crate::sync::epoch::pin();
                mm.vma_tree(&guard).range(start, end).cloned().collect()
            };
            let unmapped = has_hole(&vmas, start, end);
            for vma in &vmas {
                madvise_willneed(oncpu, vma, start.max(vma.start()), end);
            }
            if unmapped {
                Err(Errno::ENOMEM)
            } else {
                Ok(())
            }
        }
        MADV_DONTNEED | MADV_FREE | MADV_PAGEOUT => {
            let _g = mm.mmap_lock.read();
            let vmas: Vec<Arc<Vma>> = {
                let guard = crate::sync::epoch::pin();
                mm.vma_tree(&guard).range(start, end).cloned().collect()
            };
            let unmapped = has_hole(&vmas, start, end);
            let mut freed_ptes = false;
            for vma in &vmas {
                if vma.flags() & VM_LOCKED != 0 {
                    return Err(Errno::EINVAL);
                }
                // madvise_free_single_vma: lazyfree is for anonymous
                // memory only (the VMAs before this one were done).
                if advice == MADV_FREE && !vma.is_anonymous() {
                    return Err(Errno::EINVAL);
                }
                let s = start.max(vma.start());
                let e = end.min(vma.end());
                freed_ptes |= match advice {
                    MADV_DONTNEED => madvise_dontneed_single_vma(oncpu, mm, s, e),
                    MADV_FREE => madvise_free_single_vma(oncpu, mm, s, e),
                    _ => madvise_pageout(oncpu, mm, s, e),
                };
            }
            let free_pmds = freed_ptes
                && oncpu.m.tunables.pt_reclaim_pmd()
                && pt_reclaim::any_empty_pmd_table(mm, start, end);
            drop(_g);
            if free_pmds {
                pt_reclaim::try_to_free_pmd_tables(oncpu, mm, start, end);
            }
            if unmapped {
                Err(Errno::ENOMEM)
            } else {
                Ok(())
            }
        }
        _ => {
            let _g = mm.mmap_lock.write();
            let mut tree = mm.vma_tree_draft();
            let mut addr = start;
            let mut result = Ok(());
            while addr < end {
                let Some(vma) = tree.find_vma(addr).cloned().filter(|v| v.start() < end) else {
                    result = Err(Errno::ENOMEM);
                    break;
                };
                if vma.start() > addr {
                    result = Err(Errno::ENOMEM);
                }
                let s = addr.max(vma.start());
                let e = end.min(vma.end());
                let flags = match advice {
                    MADV_HUGEPAGE => (vma.flags() & !VM_NOHUGEPAGE) | VM_HUGEPAGE,
                    MADV_NOHUGEPAGE => (vma.flags() & !VM_HUGEPAGE) | VM_NOHUGEPAGE,
                    MADV_DONTFORK => vma.flags() | VM_DONTCOPY,
                    MADV_DOFORK => vma.flags() & !VM_DONTCOPY,
                    // Anonymous private memory only; the VMAs before this
                    // one keep their change.
                    MADV_WIPEONFORK if vma.file().is_some() || vma.flags() & VM_SHARED != 0 => {
                        result = Err(Errno::EINVAL);
                        break;
                    }
                    MADV_WIPEONFORK => vma.flags() | VM_WIPEONFORK,
                    MADV_KEEPONFORK => vma.flags() & !VM_WIPEONFORK,
                    _ => vma.flags(),
                };
                if flags != vma.flags() {
                    if let Err(err) = vma_modify_flags(oncpu, mm, &mut tree, s, e, flags) {
                        result = Err(err);
                        break;
                    }
                }
                addr = e;
            }
            mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
            result
        }
    }
}

/// `madvise_remove`: free `[start, end)` of a shared, writable file
/// mapping's file (a hole punched: shmem's pages, or a disk file's
/// blocks and cached pages), unmapping them from every mapping of the
/// file. EINVAL for a locked VMA or one without a file, EACCES for a
/// mapping that is not shared and may-write.
fn madvise_remove(oncpu: &OnCpu, vma: &Vma, start: u64, end: u64) -> KResult<()> {
    if vma.flags() & VM_LOCKED != 0 {
        return Err(Errno::EINVAL);
    }
    let Some(file) = vma.file() else {
        return Err(Errno::EINVAL);
    };
    if vma.flags() & (VM_SHARED | VM_MAYWRITE) != VM_SHARED | VM_MAYWRITE {
        return Err(Errno::EACCES);
    }
    let offset = (start - vma.start()) + (vma.pgoff() << crate::phys::PAGE_SHIFT);
    crate::filemap::punch_hole(oncpu, file, offset, end - start)
}

fn has_hole(vmas: &[Arc<Vma>], start: u64, end: u64) -> bool {
    let mut at = start;
    for v in vmas {
        if v.start() > at {
            return true;
        }
        at = v.end();
    }
    at < end
}

/// `madvise_dontneed_single_vma`: zap `[start, end)` of one VMA. PTE
/// markers (guard regions) stay. With PT reclaim (`upstream`), the PTE
/// tables the zap empties over their whole range are freed; with `pte_ref`,
/// every table of the range that nothing holds any more. Returns whether a
/// page table was freed or a huge PMD cleared.
fn madvise_dontneed_single_vma(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, end: u64) -> bool {
    let design = oncpu.m.tunables.pt_reclaim();
    let details = memory::ZapDetails {
        drop_markers: false,
        reclaim_pt: design == PtReclaim::Upstream,
        mapping: None,
    };
    let freed = zap_page_range_single(oncpu, mm, start, end, &details);
    if design == PtReclaim::PteRef {
        return pt_reclaim::try_to_free_user_ptes(oncpu, mm, start, end, SwitchBack::Percpu)
            || freed;
    }
    freed
}

/// `zap_page_range_single`. Returns whether a page table was freed (PT
/// reclaim) or a huge PMD cleared: either may have left a PMD table empty.
/// It drains no per-CPU LRU batch: since madvise shares one mmu_gather
/// across its VMAs (`zap_page_range_single_batched`), the kernel no longer
/// calls `lru_add_drain` here, and a folio MADV_FREE queued stays queued,
/// uncounted, as on the host.
pub fn zap_page_range_single(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    start: u64,
    end: u64,
    details: &memory::ZapDetails,
) -> bool {
    let mut tlb = MmuGather::new(mm);
    memory::unmap_page_range(oncpu, &mut tlb, start, end, details);
    let freed = tlb.nr_tables_freed > 0 || tlb.nr_pmds_cleared > 0;
    tlb.finish(oncpu);
    freed
}

/// `madvise_free_single_vma`: let the pages of `[start, end)` be discarded
/// instead of swapped: each PTE is made clean and old, and its folio lazily
/// freeable (no longer swap-backed). Reclaim is not modelled, so the pages
/// are never actually discarded and keep their contents, as on a host with
/// no memory pressure.
fn madvise_free_single_vma(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, end: u64) -> bool {
    crate::swap::lru_add_drain(oncpu.mem(), oncpu.id());
    let mut tlb = MmuGather::new(mm);
    let mut walk = MadviseFreeWalk {
        oncpu,
        tlb: &mut tlb,
    };
    let flow = walk_page_range(oncpu.mem(), &mm.pgd, start, end, WalkLock::Ptl, &mut walk);
    debug_assert!(flow.is_continue());
    tlb.finish(oncpu);
    // The seed's MADV_FREE leaves the counts atomic: a table dies when
    // reclaim discards its last lazyfree page.
    oncpu.m.tunables.pt_reclaim() == PtReclaim::PteRef
        && pt_reclaim::try_to_free_user_ptes(oncpu, mm, start, end, SwitchBack::StayAtomic)
}

/// `madvise_free_walk_ops`: all the work is in `pmd_entry`, which takes
/// the locks itself.
struct MadviseFreeWalk<'a, 'g> {
    oncpu: &'a OnCpu<'a>,
    tlb: &'a mut MmuGather<'g>,
}

impl MmWalkOps for MadviseFreeWalk<'_, '_> {
    type Break = std::convert::Infallible;

    /// `madvise_free_pte_range`: a huge PMD goes to `madvise_free_huge_pmd`
    /// first; one still huge after it is left alone, as the kernel's PTE
    /// map of it fails.
    fn pmd_entry(
        &mut self,
        slot: PmdSlot,
        pmd: Pmd,
        addr: u64,
        next: u64,
    ) -> ControlFlow<Self::Break, WalkAction> {
        let (oncpu, mm) = (self.oncpu, self.tlb.mm);
        if pmd.trans_huge()
            && crate::huge_memory::madvise_free_huge_pmd(oncpu, self.tlb, mm, slot, addr, next)
        {
            return ControlFlow::Continue(WalkAction::Continue);
        }
        if !mm.pmd_get(slot).trans_huge() {
            madvise_free_pte_range(oncpu, self.tlb, mm, slot, addr, next);
        }
        ControlFlow::Continue(WalkAction::Continue)
    }
}

/// Whether every mapping of `folio` is a PTE of this table: then it is
/// split in place ([`split_folio_in_table`]), the table's lock held.
fn in_this_table_only(
    mem: &crate::phys::PhysMem,
    folio: crate::phys::Folio,
    pt: &impl crate::pgtable::PteRead,
    at: FolioPte,
) -> bool {
    folio.entire_mapcount(mem) == 0
        && folio.mapcount(mem) == huge_memory::folio_ptes_in_table(mem, folio, pt, at)
}

/// Split a large anon folio that madvise locked and holds, with no table
/// locked (`split_folio`, through the rmap), then let go of it; whether
/// it split.
fn split_and_release(oncpu: &OnCpu, folio: crate::phys::Folio) -> bool {
    let split = crate::migrate::split_anon_folio(oncpu, folio).is_ok();
    folio.unlock(oncpu.mem());
    folio.put(oncpu.mem(), oncpu.id());
    split
}

/// The PTE half of `madvise_free_pte_range` (v6.10 and later: large folios
/// covered whole are batched; those covered in part are split unless maybe
/// shared).
fn madvise_free_pte_range(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    mm: &Arc<Mm>,
    slot: PmdSlot,
    addr: u64,
    end: u64,
) {
    let mem = oncpu.mem();
    let Some(mut pt) = mm.pte_offset_map_lock(slot) else {
        return;
    };
    crate::tlbbatch::flush_tlb_batched_pending(oncpu, mm);
    let mut a = addr;
    while a < end {
        let idx = pgtable::pte_index(a);
        let pte = pt.pte(idx);
        if pte.is_swap() {
            // A poisoned page's marker goes (its contents were lost
            // anyway); migration entries and guard markers stay.
            use crate::pgtable::swapops::{SwpKind, PTE_MARKER_POISONED};
            if matches!(pte.swp_entry().kind(), SwpKind::Marker(b) if b & PTE_MARKER_POISONED != 0)
            {
                pt.get_and_clear(idx);
            }
            a += PAGE_SIZE;
            continue;
        }
        let Some(page) = vm_normal_page(pte).filter(|_| pte.present()) else {
            a += PAGE_SIZE;
            continue;
        };
        let folio = mem.page_folio(page);
        let (mut nr, mut young, mut dirty) = (1usize, pte.young(), pte.dirty());
        if folio.is_large(mem) {
            let max_nr = ((end - a) / PAGE_SIZE) as usize;
            let flags = memory::FPB_IGNORE_DIRTY | memory::FPB_IGNORE_SOFT_DIRTY;
            let b = memory::folio_pte_batch(mem, folio, &pt, idx, pte, max_nr, flags);
            nr = b.nr;
            if (nr as u64) < folio.nr_pages(mem) {
                // Covered in part: split it, unless it may be mapped by
                // another process too; then leave these entries alone.
                let at = FolioPte { idx, page };
                if crate::rmap::folio_maybe_mapped_shared(mem, folio) {
                    a += nr as u64 * PAGE_SIZE;
                    continue;
                }
                let split = if in_this_table_only(mem, folio, &pt, at) {
                    let mut split_at = SplitAt {
                        mm,
                        pt: &mut pt,
                        table_addr: a & crate::pgtable::PMD_MASK,
                    };
                    split_folio_in_table(oncpu, folio, &mut split_at, at).is_ok()
                } else if folio.trylock(mem) {
                    // Mapped from other tables too: split through the
                    // rmap, with this table's lock dropped, as the kernel
                    // always splits here.
                    folio.get(mem);
                    drop(pt);
                    let split = split_and_release(oncpu, folio);
                    pt = match mm.pte_offset_map_lock(slot) {
                        Some(pt) => pt,
                        None => return,
                    };
                    crate::tlbbatch::flush_tlb_batched_pending(oncpu, mm);
                    split
                } else {
                    false
                };
                if !split {
                    a += nr as u64 * PAGE_SIZE;
                }
                continue; // split: this entry again, its folio small now
            }
            young |= b.any_young;
            dirty |= b.any_dirty;
        }
        // A dirty folio (PG_dirty: migration and reclaim set it from a
        // dirty PTE) is made clean only if this process alone maps it: a
        // large folio here is mapped whole, so exclusive if its mapcount
        // is its size. Otherwise it is left as it is, PTEs and all.
        if folio.head(mem).test(pg::DIRTY) {
            if folio.mapcount(mem) != folio.nr_pages(mem) as i32 {
                a += nr as u64 * PAGE_SIZE;
                continue;
            }
            // folio_clear_dirty: the data need not be written anywhere now.
            folio.head(mem).clear(pg::DIRTY);
        }
        if young || dirty {
            // clear_young_dirty_ptes; the bits are cleared atomically, so a
            // walker setting them meanwhile is not lost either way.
            pt.clear_young_dirty_ptes(idx, nr);
            tlb.remove_tlb_entries(a, nr as u64);
        }
        crate::swap::folio_mark_lazyfree(mem, folio, oncpu.id());
        a += nr as u64 * PAGE_SIZE;
    }
}

/// `madvise_pageout`: reclaim the folios of `[start, end)` that this
/// process alone maps, now. Without swap that discards the clean lazyfree
/// ones (see [`crate::vmscan`]); the rest stay, made old.
///
/// Without swap, reclaim splits a large swap-backed folio it cannot swap
/// out, which maps its zero-filled pages to the shared zero page; a THP is
/// split at the PMD first (`pageout_huge_pmd`), as reclaim splits it.
fn madvise_pageout(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, end: u64) -> bool {
    crate::swap::lru_add_drain(oncpu.mem(), oncpu.id());
    let mut tlb = MmuGather::new(mm);
    let mut walk = PageoutWalk {
        oncpu,
        tlb: &mut tlb,
    };
    let flow = walk_page_range(oncpu.mem(), &mm.pgd, start, end, WalkLock::Ptl, &mut walk);
    debug_assert!(flow.is_continue());
    tlb.finish(oncpu);
    // With `pte_ref`, a discard may have put the last reference of a table
    // left atomic by MADV_FREE (the seed frees it in that put's release).
    pt_reclaim::free_dead_user_ptes(oncpu, mm, start, end)
}

/// What [`pageout_file_ptes`] did.
enum FilePageout {
    /// Done with these bytes of the range.
    Passed(u64),
    /// A large folio covered in part, locked and held: split it (which
    /// unmaps it everywhere), then go on from the same address; if it
    /// cannot be split, past these bytes of its entries.
    Split(crate::fs::CachedFolio, u64),
    /// Leave the rest of this table (a folio another process may map).
    Stop,
}

/// MADV_PAGEOUT of the page-cache folio whose page the PTE at `idx`
/// (address `a`) maps: if this table maps it whole and no other mapping
/// has it, reclaim it ([`vmscan::shrink_file_ptes`]); a large folio
/// covered in part is split first (a split unmaps a file folio
/// everywhere, and its pieces are left to faults), unless another process
/// may map it, which ends the walk of this table.
#[allow(clippy::too_many_arguments)]
fn pageout_file_ptes(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    pt: &mut crate::pgtable::PteLocked<'_>,
    folio: crate::phys::Folio,
    pte: crate::pgtable::Pte,
    idx: usize,
    a: u64,
    end: u64,
    full: &mut bool,
) -> FilePageout {
    let mem = oncpu.mem();
    let mut nr = 1usize;
    if folio.is_large(mem) {
        let max_nr = ((end - a) / PAGE_SIZE) as usize;
        let flags = memory::FPB_IGNORE_DIRTY | memory::FPB_IGNORE_SOFT_DIRTY;
        nr = memory::folio_pte_batch(mem, folio, &*pt, idx, pte, max_nr, flags).nr;
        if (nr as u64) < folio.nr_pages(mem) {
            if crate::rmap::folio_maybe_mapped_shared(mem, folio) || !folio.trylock(mem) {
                return FilePageout::Stop;
            }
            folio.get(mem);
            let index = mem
                .page(folio.pfn())
                .index
                .load(crate::sync::Ordering::Relaxed);
            return FilePageout::Split(
                crate::fs::CachedFolio { folio, index },
                nr as u64 * PAGE_SIZE,
            );
        }
    }
    if !folio.head(mem).test(pg::LRU) || folio.mapcount(mem) != folio.nr_pages(mem) as i32 {
        return FilePageout::Passed(nr as u64 * PAGE_SIZE);
    }
    let ptes = FolioPtes {
        folio,
        page: pte.pfn(),
        idx,
        nr,
        addr: a,
    };
    *full = vmscan::shrink_file_ptes(oncpu, tlb, pt, ptes) == Discard::FreedGatherFull;
    FilePageout::Passed(nr as u64 * PAGE_SIZE)
}

/// `madvise_willneed`: for a file mapping (shmem's excepted, whose pages
/// would come from swap), readahead of the file from the range's offset
/// (`vfs_fadvise(POSIX_FADV_WILLNEED)`); anonymous memory has nothing to
/// read without swap, but drains this CPU's LRU batches as the kernel's
/// swap-in path does. The readahead's cap (`force_page_cache_ra`) bounds
/// a long range.
fn madvise_willneed(oncpu: &OnCpu, vma: &Vma, start: u64, end: u64) {
    // Anonymous and shmem memory: the swap-in walk, which finds nothing
    // swapped, then "push any new pages onto the LRU now".
    let file = match vma.file() {
        Some(f) if !f.mapping().is_shmem() => f,
        _ => {
            crate::swap::lru_add_drain(oncpu.mem(), oncpu.id());
            return;
        }
    };
    let offset = (start - vma.start()) + (vma.pgoff() << crate::phys::PAGE_SHIFT);
    let len = (end - start).max(1);
    let first = offset >> crate::phys::PAGE_SHIFT;
    let last = (offset + len - 1) >> crate::phys::PAGE_SHIFT;
    crate::filemap::force_page_cache_readahead(oncpu, file, first, last - first + 1);
}

/// `cold_walk_ops` with `pageout` set: all the work is in `pmd_entry`.
struct PageoutWalk<'a, 'g> {
    oncpu: &'a OnCpu<'a>,
    tlb: &'a mut MmuGather<'g>,
}

impl MmWalkOps for PageoutWalk<'_, '_> {
    type Break = std::convert::Infallible;

    fn pmd_entry(
        &mut self,
        slot: PmdSlot,
        pmd: Pmd,
        addr: u64,
        next: u64,
    ) -> ControlFlow<Self::Break, WalkAction> {
        let (oncpu, mm) = (self.oncpu, self.tlb.mm);
        let ptes = !pmd.trans_huge()
            || match huge_memory::pageout_huge_pmd(oncpu, mm, slot, addr, next) {
                PmdPageout::Ptes => true,
                PmdPageout::Skip => false,
                PmdPageout::SplitFile(folio) => split_file_folio_held(oncpu, folio),
            };
        if ptes {
            madvise_pageout_pte_range(oncpu, self.tlb, slot, addr, next);
        }
        ControlFlow::Continue(WalkAction::Continue)
    }
}

/// `split_folio` of a page-cache folio the caller holds a reference to,
/// given back here: lock it, split it if it is still cached
/// ([`crate::filemap::split_file_folio`]). Whether it split.
fn split_file_folio_held(oncpu: &OnCpu, folio: crate::phys::Folio) -> bool {
    let mem = oncpu.mem();
    let mut split = false;
    // The kernel sleeps on the lock; the model passes a folio someone
    // else has locked, as reclaim's trylock would.
    if folio.trylock(mem) {
        let index = mem
            .page(folio.pfn())
            .index
            .load(crate::sync::Ordering::Relaxed);
        // SAFETY: the folio is locked and held: if cached, its address
        // space is alive.
        let mapping = unsafe { crate::fs::address_space::folio_mapping(mem, folio) };
        let c = crate::fs::CachedFolio { folio, index };
        split = mapping.is_some_and(|m| crate::filemap::split_file_folio(oncpu, m, c));
        folio.unlock(mem);
    }
    folio.put(mem, oncpu.id());
    split
}

/// The PTE half of `madvise_cold_or_pageout_pte_range` for pageout, with
/// reclaim's step for each folio done in place (the kernel collects them
/// and calls `reclaim_pages` after the walk). A large folio covered in part
/// is split first unless maybe shared; one mapped by another process is
/// left alone. When the gather fills, the lock is dropped, the gather
/// flushed, and the walk goes on from the next entry.
fn madvise_pageout_pte_range(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    slot: PmdSlot,
    addr: u64,
    end: u64,
) {
    let (mm, mem) = (tlb.mm, oncpu.mem());
    let mut a = addr;
    while a < end {
        let Some(mut pt) = mm.pte_offset_map_lock(slot) else {
            return;
        };
        crate::tlbbatch::flush_tlb_batched_pending(oncpu, mm);
        let mut full = false;
        // A page-cache folio covered in part, locked and held, to split
        // with the table's lock dropped; an anon one mapped from other
        // tables too, likewise.
        let mut split = None;
        let mut anon_split = None;
        while a < end && !full {
            let idx = pgtable::pte_index(a);
            let pte = pt.pte(idx);
            let Some(page) = vm_normal_page(pte).filter(|_| pte.present()) else {
                a += PAGE_SIZE;
                continue;
            };
            let folio = mem.page_folio(page);
            let at = FolioPte { idx, page };
            let mut nr = 1usize;
            if !folio.test_anon(mem) {
                match pageout_file_ptes(oncpu, tlb, &mut pt, folio, pte, idx, a, end, &mut full) {
                    FilePageout::Passed(bytes) => a += bytes,
                    FilePageout::Split(c, bytes) => {
                        split = Some((c, bytes));
                        break;
                    }
                    FilePageout::Stop => {
                        a = end;
                        break;
                    }
                }
                continue;
            }
            if folio.is_large(mem) {
                let max_nr = ((end - a) / PAGE_SIZE) as usize;
                let flags = memory::FPB_IGNORE_DIRTY | memory::FPB_IGNORE_SOFT_DIRTY;
                nr = memory::folio_pte_batch(mem, folio, &pt, idx, pte, max_nr, flags).nr;
                if (nr as u64) < folio.nr_pages(mem) {
                    if crate::rmap::folio_maybe_mapped_shared(mem, folio) {
                        a += nr as u64 * PAGE_SIZE;
                        continue;
                    }
                    if !in_this_table_only(mem, folio, &pt, at) {
                        // Mapped from other tables too: split through the
                        // rmap once this table's lock is dropped.
                        if folio.trylock(mem) {
                            folio.get(mem);
                            anon_split = Some((folio, nr as u64 * PAGE_SIZE));
                            break;
                        }
                        a += nr as u64 * PAGE_SIZE;
                        continue;
                    }
                    let mut split_at = SplitAt {
                        mm,
                        pt: &mut pt,
                        table_addr: a & crate::pgtable::PMD_MASK,
                    };
                    if split_folio_in_table(oncpu, folio, &mut split_at, at).is_ok() {
                        continue; // this entry again: its folio is small now
                    }
                    a += nr as u64 * PAGE_SIZE;
                    continue;
                }
            }
            // A folio off the LRU lists (isolated by someone else), or
            // with another mapping, which is another process's: a large
            // folio here is mapped whole by this table, so it is exclusive
            // if its mapcount is its size.
            if !folio.head(mem).test(pg::LRU) || folio.mapcount(mem) != folio.nr_pages(mem) as i32 {
                a += nr as u64 * PAGE_SIZE;
                continue;
            }
            // The young bits stay: reclaim ignores references for pageout
            // ("mm: madvise: pageout: ignore references rather than
            // clearing young", v6.9), where MADV_COLD clears them and
            // flushes; so does the model's discard, which reads none.
            if folio.is_large(mem) && folio.head(mem).test(pg::SWAPBACKED) {
                // shrink_folio_list: with no swap, `add_to_swap` fails for a
                // large swap-backed folio, and reclaim splits it
                // (`split_folio_to_list`) to try its pages one by one; the
                // split maps the pages that hold only zeroes to the shared
                // zero page and frees them. The small folios fail
                // `add_to_swap` too and stay.
                let mut split_at = SplitAt {
                    mm,
                    pt: &mut pt,
                    table_addr: a & crate::pgtable::PMD_MASK,
                };
                let _kept_whole = split_folio_in_table(oncpu, folio, &mut split_at, at);
                a += nr as u64 * PAGE_SIZE;
                continue;
            }
            let ptes = FolioPtes {
                folio,
                page,
                idx,
                nr,
                addr: a,
            };
            full = shrink_lazyfree_ptes(oncpu, tlb, &mut pt, ptes) == Discard::FreedGatherFull;
            a += nr as u64 * PAGE_SIZE;
        }
        drop(pt);
        if full {
            tlb.flush_mmu(oncpu);
        }
        if let Some((folio, bytes)) = anon_split {
            // Split, the walk looks at its entries again; not split, it
            // goes on past them.
            if !split_and_release(oncpu, folio) {
                a += bytes;
            }
        }
        if let Some((c, bytes)) = split {
            // SAFETY: the folio is locked and held: cached, its address
            // space alive.
            let mapping = unsafe { crate::fs::address_space::folio_mapping(mem, c.folio) };
            // Split, it is unmapped: the walk goes on from here over the
            // empty entries. Not split (dirty), it is left mapped, and the
            // walk goes on past its entries.
            if !mapping.is_some_and(|m| crate::filemap::split_file_folio(oncpu, m, c)) {
                a += bytes;
            }
            c.folio.unlock(mem);
            c.folio.put(mem, oncpu.id());
        }
    }
}
