//! The part of reclaim (mm/vmscan.c `shrink_folio_list`, with mm/rmap.c
//! `try_to_unmap_one`) that MADV_PAGEOUT reaches on a machine without swap:
//! discarding clean lazyfree folios.
//!
//! The kernel isolates each folio from its LRU, then `reclaim_pages` walks
//! its rmap to unmap it everywhere. MADV_PAGEOUT collects only folios that
//! this process alone maps, so that walk finds exactly the PTEs the madvise
//! walker holds under its lock: the model unmaps them there, and frees the
//! folio through the caller's mmu_gather, after the TLB flush, as
//! `try_to_unmap_flush` orders it before the free. There is no swap, so a
//! swap-backed anonymous folio cannot be paged out and stays mapped
//! (`add_to_swap` fails and reclaim keeps it).

use crate::machine::OnCpu;
use crate::mm::MmCounter;
use crate::mmu_gather::MmuGather;
use crate::pgtable::PteLocked;
use crate::phys::memmap::pg;
use crate::phys::{Folio, Pfn, PAGE_SIZE};
use crate::rmap;
use crate::vmstat::Event;

/// What [`shrink_lazyfree_ptes`] did with a folio.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discard {
    /// Discarded: its PTEs are clear and it is queued in the gather.
    Freed,
    /// Freed, and the gather is full: flush it before queueing more.
    FreedGatherFull,
    /// Kept: it is swap-backed, was written to since MADV_FREE, or someone
    /// else holds a reference.
    Kept,
}

/// The PTEs that map one folio, all in one locked table: `nr` from index
/// `idx` (user address `addr`), the first mapping `page`.
#[derive(Clone, Copy, Debug)]
pub struct FolioPtes {
    pub folio: Folio,
    pub page: Pfn,
    pub idx: usize,
    pub nr: usize,
    pub addr: u64,
}

/// `shrink_folio_list` + `try_to_unmap_one` for a folio mapped only by
/// `ptes` in the locked table `pt`:
/// a lazyfree folio that is still clean and that nobody else references
/// is unmapped and freed (`pglazyfreed`); one written to again becomes
/// swap-backed again (`folio_set_swapbacked`) and stays mapped.
pub fn shrink_lazyfree_ptes(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    pt: &mut PteLocked<'_>,
    ptes: FolioPtes,
) -> Discard {
    let FolioPtes {
        folio,
        page,
        idx,
        nr,
        addr,
    } = ptes;
    let mem = oncpu.mem();
    let head = folio.head(mem);
    if !folio.test_anon(mem) || head.test(pg::SWAPBACKED) {
        return Discard::Kept;
    }
    // Isolation (`folio_isolate_lru`): a folio on no list (still in a
    // CPU's batch, or taken by someone else) is left alone. The model
    // takes no isolation reference: the folio goes from here to the
    // gather's free, or back onto a list, under the page-table lock.
    if !head.test_and_clear(pg::LRU) {
        return Discard::Kept;
    }
    mem.folio_lruvec_lock(folio).del_folio(folio);
    // Clear the PTEs first and read their dirty bits from the values
    // cleared (`folio_mark_dirty` in try_to_unmap_one): once an entry is
    // clear no CPU can set its dirty bit any more, so a write that lands
    // before this is seen, and one after it faults.
    let old: Vec<_> = (idx..idx + nr).map(|i| pt.get_and_clear(i)).collect();
    // folio_mark_dirty of each dirty PTE, then folio_test_dirty.
    let dirty = old.iter().any(|p| p.dirty()) || head.test(pg::DIRTY);
    // The references are the mappings alone (the kernel counts one more,
    // its isolation reference; an LRU batch holding the folio is one
    // more, and keeps it).
    if dirty || folio.ref_count(mem) != folio.mapcount(mem) {
        for (i, p) in (idx..).zip(old) {
            pt.set(i, p);
        }
        // Written again: swap-backed once more (a folio someone else holds
        // stays lazyfree). Either way activate_locked, then back onto its
        // active list (`move_folios_to_lru`).
        if dirty {
            head.clear(pg::LAZYFREE);
            head.set(pg::SWAPBACKED);
        }
        head.set(pg::ACTIVE);
        oncpu
            .vmstat()
            .count(oncpu.id(), Event::PGACTIVATE, nr as u64);
        mem.folio_lruvec_lock(folio).add_folio(folio);
        head.set(pg::LRU);
        return Discard::Kept;
    }
    tlb.remove_tlb_entries(addr, nr as u64);
    tlb.mm.add_rss(MmCounter::AnonPages, -(nr as i64));
    rmap::folio_remove_rmap_ptes(mem, folio, page, nr as u64, oncpu.id());
    oncpu
        .vmstat()
        .count(oncpu.id(), Event::PGLAZYFREED, nr as u64);
    debug_assert_eq!(addr % PAGE_SIZE, 0);
    if tlb.remove_folio_pages(page, nr as u64, false) {
        Discard::FreedGatherFull
    } else {
        Discard::Freed
    }
}
