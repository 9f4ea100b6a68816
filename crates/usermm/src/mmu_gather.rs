//! Gathering what an unmap frees until the TLB flush that must precede the
//! free (mm/mmu_gather.c, include/asm-generic/tlb.h).
//!
//! The rule is *unhook, invalidate, free*: a page or a page table leaves
//! the page tables, every CPU that may cache a translation to it is flushed,
//! and only then does it go back to the allocator. An [`MmuGather`] collects
//! the range to invalidate and the pages and tables to free, and flushes when
//! its batches fill up or when the caller finishes.
//!
//! Pages are kept as encoded entries, as in the kernel: a page's PFN shifted
//! left by two with [`ENCODED_PAGE_BIT_DELAY_RMAP`] and
//! [`ENCODED_PAGE_BIT_NR_PAGES_NEXT`] in the low bits; when the latter is set
//! the next slot holds `nr_pages << 2`, so one entry can stand for a run of
//! pages of one folio. Batches hold [`MAX_GATHER_BATCH`] slots (one page of
//! pointers in the kernel), at most [`MAX_GATHER_BATCH_COUNT`] of them beyond
//! the on-stack bundle of [`MMU_GATHER_BUNDLE`].
//!
//! Page tables go to a table batch and are freed after the flush *and* after
//! an epoch grace period, because lockless walkers may still be reading them
//! (the kernel's `MMU_GATHER_RCU_TABLE_FREE`).

use crate::cpu::{FlushRange, TLB_FLUSH_ALL};
use crate::machine::OnCpu;
use crate::mm::Mm;
use crate::pgtable::Ptdesc;
use crate::phys::{Pfn, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::Arc;
use crate::vmstat::Event;

pub const ENCODED_PAGE_BIT_DELAY_RMAP: u64 = 1;
pub const ENCODED_PAGE_BIT_NR_PAGES_NEXT: u64 = 2;
/// `MAX_GATHER_BATCH`: (PAGE_SIZE - header) / sizeof(pointer).
pub const MAX_GATHER_BATCH: usize = ((PAGE_SIZE as usize) - 16) / 8;
/// `MAX_GATHER_BATCH_COUNT`: about 10 000 entries in all.
pub const MAX_GATHER_BATCH_COUNT: usize = 10000 / MAX_GATHER_BATCH;
/// `MMU_GATHER_BUNDLE`: the embedded first batch.
pub const MMU_GATHER_BUNDLE: usize = 8;
/// `MAX_TABLE_BATCH`.
pub const MAX_TABLE_BATCH: usize = ((PAGE_SIZE as usize) - 24) / 8;
/// `MAX_NR_FOLIOS_PER_FREE`: entries freed per chunk.
pub const MAX_NR_FOLIOS_PER_FREE: usize = 512;

struct Batch {
    entries: Vec<u64>,
    max: usize,
}

impl Batch {
    fn new(max: usize) -> Batch {
        Batch {
            entries: Vec::with_capacity(max),
            max,
        }
    }
}

/// `struct mmu_gather`.
pub struct MmuGather<'a> {
    pub mm: &'a Arc<Mm>,
    pub fullmm: bool,
    pub need_flush_all: bool,
    pub freed_tables: bool,
    pub cleared_ptes: bool,
    pub cleared_pmds: bool,
    pub delayed_rmap: bool,
    /// The flags of the VMA being zapped (`tlb_start_vma`): the rmap
    /// removals of a `VM_LOCKED` VMA's pages munlock them.
    pub vm_flags: crate::mm::vma::VmFlags,
    pub start: u64,
    pub end: u64,
    /// `local` is batches[0]; `active` indexes the batch being filled.
    batches: Vec<Batch>,
    active: usize,
    tables: Vec<Ptdesc>,
    /// Page tables given to this gather so far (`freed_tables` is reset by
    /// every flush; this is not): whether the operation freed any.
    pub nr_tables_freed: usize,
    /// Huge PMD entries given to this gather so far (`cleared_pmds` is
    /// reset by every flush; this is not).
    pub nr_pmds_cleared: usize,
    /// Set by [`MmuGather::finish`]; a gather dropped without it is a bug.
    finished: bool,
}

impl<'a> MmuGather<'a> {
    /// `tlb_gather_mmu`.
    pub fn new(mm: &'a Arc<Mm>) -> Self {
        Self::init(mm, false)
    }

    /// `tlb_gather_mmu_fullmm`: the whole address space goes (exit).
    pub fn new_fullmm(mm: &'a Arc<Mm>) -> Self {
        Self::init(mm, true)
    }

    fn init(mm: &'a Arc<Mm>, fullmm: bool) -> Self {
        // The kernel calls update_hiwater_rss right after tlb_gather_mmu on
        // each path that lowers RSS (unmap_region, the madvise zaps,
        // try_to_unmap); every such path of the model starts here.
        mm.update_hiwater_rss();
        mm.inc_tlb_flush_pending();
        MmuGather {
            mm,
            fullmm,
            need_flush_all: false,
            freed_tables: false,
            cleared_ptes: false,
            cleared_pmds: false,
            delayed_rmap: false,
            vm_flags: 0,
            start: TLB_FLUSH_ALL,
            end: 0,
            batches: vec![Batch::new(MMU_GATHER_BUNDLE)],
            active: 0,
            tables: Vec::new(),
            nr_tables_freed: 0,
            nr_pmds_cleared: 0,
            finished: false,
        }
    }

    fn reset_range(&mut self) {
        if self.fullmm {
            self.start = 0;
            self.end = TLB_FLUSH_ALL;
        } else {
            self.start = TLB_FLUSH_ALL;
            self.end = 0;
        }
        self.freed_tables = false;
        self.cleared_ptes = false;
        self.cleared_pmds = false;
    }

    /// `__tlb_adjust_range`.
    #[inline]
    pub fn adjust_range(&mut self, addr: u64, size: u64) {
        self.start = self.start.min(addr);
        self.end = self.end.max(addr + size);
    }

    /// `tlb_remove_tlb_entries`: `nr` PTEs from `addr` were cleared.
    #[inline]
    pub fn remove_tlb_entries(&mut self, addr: u64, nr: u64) {
        self.adjust_range(addr, nr << PAGE_SHIFT);
        self.cleared_ptes = true;
    }

    /// `tlb_remove_pmd_tlb_entry`.
    pub fn remove_pmd_tlb_entry(&mut self, addr: u64) {
        self.adjust_range(addr, crate::pgtable::PMD_SIZE);
        self.cleared_pmds = true;
        self.nr_pmds_cleared += 1;
    }

    /// `tlb_next_batch`: move to (or allocate) the next batch; false if the
    /// gather is full and must be flushed first.
    fn next_batch(&mut self) -> bool {
        // Delayed rmaps are processed under the PTL: bound them to the local
        // batch and one more.
        if self.delayed_rmap && self.active > 0 {
            return false;
        }
        if self.active + 1 < self.batches.len() {
            self.active += 1;
            return true;
        }
        if self.batches.len() > MAX_GATHER_BATCH_COUNT {
            return false;
        }
        self.batches.push(Batch::new(MAX_GATHER_BATCH));
        self.active += 1;
        true
    }

    /// `__tlb_remove_folio_pages_size`: queue `nr` pages starting at `page`
    /// (all of one folio) to be freed after the flush. Returns true when the
    /// gather is full and the caller must flush before adding more.
    #[must_use = "a full gather must be flushed"]
    pub fn remove_folio_pages(&mut self, page: Pfn, nr: u64, delay_rmap: bool) -> bool {
        let flags = if delay_rmap {
            ENCODED_PAGE_BIT_DELAY_RMAP
        } else {
            0
        };
        self.delayed_rmap |= delay_rmap;
        let batch = &mut self.batches[self.active];
        if nr == 1 {
            batch.entries.push((page << 2) | flags);
        } else {
            batch
                .entries
                .push((page << 2) | flags | ENCODED_PAGE_BIT_NR_PAGES_NEXT);
            batch.entries.push(nr << 2);
        }
        // Keep room for a two-slot entry at all times.
        if batch.entries.len() + 1 >= batch.max {
            return !self.next_batch();
        }
        false
    }

    /// `tlb_remove_table` (and `pte_free_tlb` & co): a table that was
    /// unhooked, to be freed after the flush and a grace period.
    pub fn remove_table(&mut self, oncpu: &OnCpu, table: Ptdesc) {
        self.freed_tables = true;
        self.nr_tables_freed += 1;
        self.tables.push(table);
        if self.tables.len() >= MAX_TABLE_BATCH {
            self.flush_mmu_tlbonly(oncpu);
            self.table_batch_free(oncpu);
        }
    }

    /// `tlb_flush_mmu_tlbonly`: invalidate the gathered range now.
    pub fn flush_mmu_tlbonly(&mut self, oncpu: &OnCpu) {
        if !(self.cleared_ptes || self.cleared_pmds || self.freed_tables || self.fullmm)
            || self.end == 0
        {
            return;
        }
        // x86's tlb_flush: everything for a whole-mm or forced flush, the
        // gathered range otherwise; `freed_tables` either way.
        let range = if self.fullmm || self.need_flush_all {
            FlushRange::all(self.freed_tables)
        } else {
            FlushRange {
                start: self.start,
                end: self.end,
                stride_shift: if self.cleared_pmds && !self.cleared_ptes {
                    crate::pgtable::PMD_SHIFT
                } else {
                    PAGE_SHIFT
                },
                freed_tables: self.freed_tables,
            }
        };
        oncpu.flush_tlb_mm_range(self.mm, range);
        self.reset_range();
    }

    /// `tlb_flush_rmaps`: remove the rmaps that waited for the flush. Must be
    /// called with the PTL still held, after [`Self::flush_mmu_tlbonly`].
    pub fn flush_rmaps(&mut self, oncpu: &OnCpu) {
        if !self.delayed_rmap {
            return;
        }
        let mem = oncpu.mem();
        for b in self.batches.iter_mut().take(self.active + 1) {
            let mut i = 0;
            while i < b.entries.len() {
                let e = b.entries[i];
                let (page, nr, step) = decode(&b.entries, i);
                if e & ENCODED_PAGE_BIT_DELAY_RMAP != 0 {
                    let folio = mem.page_folio(page);
                    crate::rmap::folio_remove_rmap_ptes(
                        mem,
                        folio,
                        page,
                        nr,
                        self.mm.id,
                        oncpu.id(),
                    );
                    crate::mlock::munlock_vma_folio(mem, folio, self.vm_flags, oncpu.id());
                    b.entries[i] &= !ENCODED_PAGE_BIT_DELAY_RMAP;
                }
                i += step;
            }
        }
        self.delayed_rmap = false;
    }

    fn table_batch_free(&mut self, oncpu: &OnCpu) {
        if self.tables.is_empty() {
            return;
        }
        let tables = std::mem::take(&mut self.tables);
        let mem = oncpu.mem().clone();
        oncpu
            .vmstat()
            .count(oncpu.id(), Event::PT_FREED, tables.len() as u64);
        let n = tables.len() as i64;
        mem.rcu_pending_add(n);
        // The tables are unreachable and flushed from every TLB; walkers
        // that found them before they were unhooked are pinned, and the
        // callback runs only after they unpin.
        crate::rcu::call_rcu(move || {
            for t in tables {
                t.free(&mem, mem.vmstat.no_cpu());
            }
            mem.rcu_pending_add(-n);
        });
    }

    /// `tlb_batch_pages_flush`: drop the gathered references.
    fn batch_pages_flush(&mut self, oncpu: &OnCpu) {
        let mem = oncpu.mem();
        for b in self.batches.iter_mut().take(self.active + 1) {
            // Chunks of MAX_NR_FOLIOS_PER_FREE entries (never splitting a
            // page/count pair) mark where the kernel would cond_resched().
            // `free_pages_and_swap_cache`: the references go in batches,
            // each under one lruvec lock (`folios_put_refs`).
            let mut i = 0;
            let entries = std::iter::from_fn(|| {
                (i < b.entries.len()).then(|| {
                    let (page, nr, step) = decode(&b.entries, i);
                    debug_assert!(
                        b.entries[i] & ENCODED_PAGE_BIT_DELAY_RMAP == 0,
                        "freeing a page whose rmap removal was delayed"
                    );
                    i += step;
                    (mem.page_folio(page), nr as i32)
                })
            });
            crate::swap::folios_put_refs(mem, entries, oncpu.id());
            b.entries.clear();
        }
        self.active = 0;
    }

    /// `tlb_flush_mmu`: invalidate, then free tables and pages.
    pub fn flush_mmu(&mut self, oncpu: &OnCpu) {
        self.flush_mmu_tlbonly(oncpu);
        self.table_batch_free(oncpu);
        self.batch_pages_flush(oncpu);
    }

    /// `tlb_finish_mmu`.
    pub fn finish(mut self, oncpu: &OnCpu) {
        // Another gather on this mm may have cleared PTEs we then skipped as
        // none, while its flush is still to come: flush everything we may
        // have raced with (mm_tlb_flush_nested).
        if self.mm.tlb_flush_nested() {
            self.fullmm_flush_for_nested();
        }
        self.flush_mmu(oncpu);
        self.mm.dec_tlb_flush_pending();
        // Drop then frees the (now empty) batches and checks nothing else.
        self.finished = true;
    }

    fn fullmm_flush_for_nested(&mut self) {
        self.need_flush_all = true;
        self.freed_tables = true;
        self.start = 0;
        self.end = TLB_FLUSH_ALL;
    }

    /// Entries queued (slots, counting count slots): for tests.
    pub fn nr_entries(&self) -> usize {
        self.batches.iter().map(|b| b.entries.len()).sum()
    }

    pub fn nr_batches(&self) -> usize {
        self.batches.len()
    }
}

impl Drop for MmuGather<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // A gather dropped without finish() would leak its pages and leave
        // stale TLB entries; that is a bug in the caller.
        debug_assert!(
            std::thread::panicking(),
            "MmuGather dropped without tlb_finish_mmu"
        );
        self.mm.dec_tlb_flush_pending();
    }
}

/// Decode the entry at `i`: (page, nr_pages, slots used).
#[inline]
fn decode(entries: &[u64], i: usize) -> (Pfn, u64, usize) {
    let e = entries[i];
    if e & ENCODED_PAGE_BIT_NR_PAGES_NEXT != 0 {
        (e >> 2, entries[i + 1] >> 2, 2)
    } else {
        (e >> 2, 1, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trip_and_pairs() {
        let e = vec![
            (0x1234 << 2) | ENCODED_PAGE_BIT_NR_PAGES_NEXT,
            16 << 2,
            0x99 << 2 | ENCODED_PAGE_BIT_DELAY_RMAP,
        ];
        assert_eq!(decode(&e, 0), (0x1234, 16, 2));
        assert_eq!(decode(&e, 2), (0x99, 1, 1));
        // A count slot can never look like a flagged page.
        assert_eq!((512u64 << 2) & 3, 0);
    }

    use crate::mm::MmCounter;
    use crate::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
    use crate::pgtable::{pte_index, PteRead};
    use crate::{Machine, MachineConfig};

    /// Zap `nr` present PTEs from `addr` (one PTE table) into `tlb` with
    /// delayed rmap removal, as a dirty file folio would be; flush as
    /// zap_pte_range does when the gather fills. Returns how many PTEs were
    /// queued before the gather first reported full.
    fn zap_delayed(oncpu: &OnCpu, tlb: &mut MmuGather, addr: u64, nr: u64) -> Option<u64> {
        let mm = tlb.mm;
        let slot = mm.pmd_lookup(addr).unwrap();
        let mut pt = mm.pte_offset_map_lock(slot).unwrap();
        let mut first_full = None;
        for i in 0..nr {
            let idx = pte_index(addr) + i as usize;
            let pte = pt.get_and_clear(idx);
            tlb.remove_tlb_entries(addr + i * PAGE_SIZE, 1);
            mm.add_rss(MmCounter::AnonPages, -1);
            if tlb.remove_folio_pages(pte.pfn(), 1, true) {
                first_full.get_or_insert(i + 1);
                // Under the PTL: invalidate, then the delayed rmaps.
                tlb.flush_mmu_tlbonly(oncpu);
                tlb.flush_rmaps(oncpu);
                assert!(!tlb.delayed_rmap);
                tlb.batch_pages_flush(oncpu);
            }
        }
        tlb.flush_mmu_tlbonly(oncpu);
        tlb.flush_rmaps(oncpu);
        drop(pt);
        first_full
    }

    #[test]
    fn delayed_rmap_is_removed_only_after_the_flush() {
        let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        m.thp.only_order(4);
        let a = c
            .mmap(
                0,
                1 << 20,
                PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS,
            )
            .unwrap();
        c.touch_pages(a, a + (64 << 10), 1).unwrap();
        let mem = c.mem();
        let slot = mm.pmd_lookup(a).unwrap();
        let pfn = mm.pte_offset_map(slot).unwrap().pte(pte_index(a)).pfn();
        let folio = mem.page_folio(pfn);
        let mut tlb = MmuGather::new(&mm);
        {
            let mut pt = mm.pte_offset_map_lock(slot).unwrap();
            pt.clear_full_ptes(pte_index(a), 16);
            tlb.remove_tlb_entries(a, 16);
            mm.add_rss(MmCounter::AnonPages, -16);
            assert!(!tlb.remove_folio_pages(pfn, 16, true));
            assert_eq!(folio.mapcount(mem), 16, "the rmap waits for the flush");
            tlb.flush_mmu_tlbonly(&c);
            assert_eq!(folio.mapcount(mem), 16);
            tlb.flush_rmaps(&c);
            assert_eq!(folio.mapcount(mem), 0, "removed once flushed");
            assert_eq!(
                folio.ref_count(mem),
                16,
                "references go only with the pages"
            );
        }
        tlb.finish(&c);
        m.rcu_barrier();
        crate::check::check_invariants(&m).unwrap();
    }

    #[test]
    fn delayed_rmaps_bound_the_gather_to_local_plus_one_batch() {
        let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let a = c
            .mmap(
                0,
                4 << 20,
                PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS,
            )
            .unwrap();
        assert_eq!(a % (2 << 20), 0);
        c.touch_pages(a, a + (4 << 20), 1).unwrap();
        let mut tlb = MmuGather::new(&mm);
        // Single-page entries, one slot each, room for a two-slot entry kept
        // free: the local bundle and one batch page hold 7 + 509, never a
        // third batch (without delayed rmaps the gather grows to 19 more).
        assert_eq!(zap_delayed(&c, &mut tlb, a, 512), None);
        let limit = (MMU_GATHER_BUNDLE - 1 + MAX_GATHER_BATCH - 1) as u64;
        assert_eq!(
            zap_delayed(&c, &mut tlb, a + (2 << 20), 512),
            Some(limit - 512)
        );
        assert_eq!(tlb.nr_batches(), 2);
        tlb.finish(&c);
        assert_eq!(mm.get_rss(MmCounter::AnonPages), 0);
        m.rcu_barrier();
        crate::check::check_invariants(&m).unwrap();
    }

    #[test]
    fn constants_match_x86_64() {
        assert_eq!(MAX_GATHER_BATCH, 510);
        assert_eq!(MAX_GATHER_BATCH_COUNT, 19);
    }
}
