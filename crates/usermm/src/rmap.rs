//! Layer 4: reverse mapping of anonymous folios (mm/rmap.c).
//!
//! A folio's `mapping` names its anon_vma; its counters say how it is
//! mapped: per page `_mapcount`, and for large folios `_large_mapcount` (all
//! mappings), `_entire_mapcount` (PMD mappings) and `_nr_pages_mapped` (pages
//! with a PTE mapping, plus [`ENTIRELY_MAPPED`] while a PMD maps the folio).
//! The batched functions take `nr` consecutive pages of one folio: the
//! per-page loop is unavoidable, but the folio-wide counters and the
//! statistics are updated once per call.
//!
//! All changes are made under the page-table lock of the entries that
//! gain or lose the mapping.

use crate::mm::Vma;
use crate::phys::folio::{set_page_anon_exclusive, Folio};
use crate::phys::memmap::{pg, PAGE_MAPPING_ANON};
use crate::phys::{Pfn, PhysMem, HPAGE_PMD_ORDER};
use crate::sync::Ordering;
use crate::vmstat::{Event, MthpStat, NodeStat};

/// Added to `_nr_pages_mapped` while a PMD maps the whole folio.
pub const ENTIRELY_MAPPED: i32 = 0x80_0000;
pub const FOLIO_PAGES_MAPPED: i32 = ENTIRELY_MAPPED - 1;

/// `__folio_set_anon`: attach a new folio to the VMA's anon_vma.
fn folio_set_anon(mem: &PhysMem, folio: Folio, vma: &Vma, addr: u64) {
    let anon_vma = vma
        .anon_vma()
        .expect("anon_vma_prepare before mapping anon folios");
    let ptr = std::sync::Arc::as_ptr(anon_vma) as u64;
    let head = folio.head(mem);
    head.mapping
        .store(ptr | PAGE_MAPPING_ANON, Ordering::Relaxed);
    head.index
        .store(vma.linear_page_index(addr), Ordering::Relaxed);
    head.set(pg::SWAPBACKED);
}

/// `folio_add_new_anon_rmap`: map a folio just allocated by a fault, all of
/// it, by `nr` PTEs (a PTE-mapped folio) or by one PMD (`pmd`).
pub fn folio_add_new_anon_rmap(
    mem: &PhysMem,
    folio: Folio,
    vma: &Vma,
    addr: u64,
    exclusive: bool,
    pmd: bool,
) {
    folio_set_anon(mem, folio, vma, addr);
    let nr = folio.nr_pages(mem) as i32;
    let head = folio.head(mem);
    if !folio.is_large(mem) {
        head.mapcount.store(0, Ordering::Relaxed);
    } else if pmd {
        head.entire_mapcount.store(0, Ordering::Relaxed);
        head.large_mapcount.store(0, Ordering::Relaxed);
        head.nr_pages_mapped
            .store(ENTIRELY_MAPPED, Ordering::Relaxed);
        mem.vmstat.mod_node(NodeStat::NR_ANON_THPS, nr as i64);
    } else {
        for i in 0..nr as u64 {
            mem.page(folio.pfn() + i)
                .mapcount
                .store(0, Ordering::Relaxed);
        }
        head.large_mapcount.store(nr - 1, Ordering::Relaxed);
        head.nr_pages_mapped.store(nr, Ordering::Relaxed);
    }
    if exclusive {
        for i in 0..nr as u64 {
            set_page_anon_exclusive(mem, folio.pfn() + i);
        }
    }
    if folio.is_large(mem) {
        mem.vmstat.mod_mthp(folio.order(mem), MthpStat::NR_ANON, 1);
    }
    mem.vmstat.mod_node(NodeStat::NR_ANON_MAPPED, nr as i64);
}

/// `folio_add_anon_rmap_ptes`: `nr` more PTE mappings of pages
/// `page..page+nr` of an anon folio that is already anon.
pub fn folio_add_anon_rmap_ptes(mem: &PhysMem, folio: Folio, page: Pfn, nr: u64, exclusive: bool) {
    debug_assert!(
        page >= folio.pfn() && page + nr <= folio.pfn() + folio.nr_pages(mem),
        "rmap batch leaves its folio"
    );
    let mut first = 0;
    for p in page..page + nr {
        if mem.page(p).mapcount.fetch_add(1, Ordering::Relaxed) == -1 {
            first += 1;
        }
        if exclusive {
            set_page_anon_exclusive(mem, p);
        }
    }
    if folio.is_large(mem) {
        let head = folio.head(mem);
        head.large_mapcount.fetch_add(nr as i32, Ordering::Relaxed);
        let before = head.nr_pages_mapped.fetch_add(first, Ordering::Relaxed);
        if before >= ENTIRELY_MAPPED {
            first = 0; // already counted as mapped through the PMD
        }
    }
    mem.vmstat.mod_node(NodeStat::NR_ANON_MAPPED, first as i64);
}

/// `folio_remove_rmap_ptes`: `nr` PTE mappings of `page..page+nr` are gone.
pub fn folio_remove_rmap_ptes(mem: &PhysMem, folio: Folio, page: Pfn, nr: u64, cpu: usize) {
    debug_assert!(
        page >= folio.pfn() && page + nr <= folio.pfn() + folio.nr_pages(mem),
        "rmap batch leaves its folio"
    );
    let mut last = 0;
    for p in page..page + nr {
        let old = mem.page(p).mapcount.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(old >= 0, "page {p:#x}: mapcount underflow");
        if old == 0 {
            last += 1;
        }
    }
    let mut unmapped = last as i64;
    if folio.is_large(mem) {
        let head = folio.head(mem);
        let lm = head.large_mapcount.fetch_sub(nr as i32, Ordering::Relaxed) - nr as i32;
        let mapped = head.nr_pages_mapped.fetch_sub(last, Ordering::Relaxed) - last;
        if mapped >= ENTIRELY_MAPPED {
            unmapped = 0;
        }
        // Some pages left mapped, some not: queue for deferred split.
        if folio.test_anon(mem)
            && lm >= 0
            && mapped & FOLIO_PAGES_MAPPED < folio.nr_pages(mem) as i32
            && mapped < ENTIRELY_MAPPED
        {
            deferred_split_folio(mem, folio, cpu);
        }
    }
    mem.vmstat.mod_node(NodeStat::NR_ANON_MAPPED, -unmapped);
}

/// `folio_add_anon_rmap_pmd`.
pub fn folio_add_anon_rmap_pmd(mem: &PhysMem, folio: Folio, exclusive: bool) {
    let head = folio.head(mem);
    head.large_mapcount.fetch_add(1, Ordering::Relaxed);
    let nr = folio.nr_pages(mem) as i32;
    if head.entire_mapcount.fetch_add(1, Ordering::Relaxed) == -1 {
        let before = head
            .nr_pages_mapped
            .fetch_add(ENTIRELY_MAPPED, Ordering::Relaxed);
        mem.vmstat.mod_node(
            NodeStat::NR_ANON_MAPPED,
            (nr - (before & FOLIO_PAGES_MAPPED)) as i64,
        );
        mem.vmstat.mod_node(NodeStat::NR_ANON_THPS, nr as i64);
    }
    if exclusive {
        for i in 0..nr as u64 {
            set_page_anon_exclusive(mem, folio.pfn() + i);
        }
    }
}

/// `folio_remove_rmap_pmd`.
pub fn folio_remove_rmap_pmd(mem: &PhysMem, folio: Folio, cpu: usize) {
    let head = folio.head(mem);
    head.large_mapcount.fetch_sub(1, Ordering::Relaxed);
    let nr = folio.nr_pages(mem) as i32;
    if head.entire_mapcount.fetch_sub(1, Ordering::Relaxed) == 0 {
        let after = head
            .nr_pages_mapped
            .fetch_sub(ENTIRELY_MAPPED, Ordering::Relaxed)
            - ENTIRELY_MAPPED;
        mem.vmstat
            .mod_node(NodeStat::NR_ANON_MAPPED, -((nr - after) as i64));
        mem.vmstat.mod_node(NodeStat::NR_ANON_THPS, -(nr as i64));
        if after > 0 && folio.test_anon(mem) {
            deferred_split_folio(mem, folio, cpu);
        }
    }
}

/// `deferred_split_folio`: note a partially mapped large anon folio. The
/// model keeps the flag and the counters; the shrinker that splits such
/// folios under memory pressure is not modelled.
fn deferred_split_folio(mem: &PhysMem, folio: Folio, cpu: usize) {
    let head = folio.head(mem);
    if head.flags.fetch_or(pg::PARTIALLY_MAPPED, Ordering::Relaxed) & pg::PARTIALLY_MAPPED == 0 {
        let order = folio.order(mem);
        mem.vmstat.mod_mthp(order, MthpStat::SPLIT_DEFERRED, 1);
        mem.vmstat
            .mod_mthp(order, MthpStat::NR_ANON_PARTIALLY_MAPPED, 1);
        if order == HPAGE_PMD_ORDER {
            mem.vmstat.count(cpu, Event::THP_DEFERRED_SPLIT_PAGE, 1);
        }
    }
}

/// `__split_huge_pmd_locked`'s rmap part: the PMD mapping becomes 512 PTE
/// mappings. Called with the PMD lock held.
pub fn folio_split_pmd_mapping(mem: &PhysMem, folio: Folio, cpu: usize) {
    let nr = folio.nr_pages(mem);
    let exclusive: Vec<bool> = (0..nr)
        .map(|i| crate::phys::folio::page_anon_exclusive(mem, folio.pfn() + i))
        .collect();
    folio_add_anon_rmap_ptes(mem, folio, folio.pfn(), nr, false);
    for (i, e) in exclusive.into_iter().enumerate() {
        if e {
            set_page_anon_exclusive(mem, folio.pfn() + i as u64);
        }
    }
    folio_remove_rmap_pmd(mem, folio, cpu);
}
