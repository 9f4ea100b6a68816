//! Folios: a head page and its tails, handled as one (`struct folio`).
//!
//! [`Folio`] is a handle (the head's PFN); the state lives in the memmap. A
//! folio's references and mapcounts follow the kernel's conventions:
//! `_refcount` counts one reference per mapping PTE/PMD plus transient ones;
//! per-page `_mapcount` and the folio-wide `_large_mapcount` and
//! `_entire_mapcount` start at -1; `_nr_pages_mapped` counts pages mapped by
//! PTEs.

use super::memmap::{pg, Page, PAGE_MAPPING_ANON};
use super::{AllocFlags, Pfn, PhysMem};
use crate::sync::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};
use crate::vmstat::MthpStat;

/// `folio->_large_mapcount` (-1 based), `_entire_mapcount` (-1 based),
/// `_nr_pages_mapped`, and the MM-owner slots of v6.15 (`CONFIG_MM_ID`):
/// `_mm_ids` (two 31-bit mm ids, the bit lock of the large mapcount, the
/// "maybe mapped shared" bit) and `_mm_id_mapcount[2]` (-1 based, slot 0
/// in the low half). See [`crate::rmap`] for how they move.
pub struct FolioCounters<'a> {
    pub large_mapcount: &'a AtomicI32,
    pub entire_mapcount: &'a AtomicI32,
    pub nr_pages_mapped: &'a AtomicI64,
    pub mm_ids: &'a AtomicU64,
    pub mm_id_mapcount: &'a AtomicU64,
}

/// `MM_ID_BITS`: an mm id fills 31 bits of its half of `_mm_ids`; the top
/// bit of each half holds a flag.
pub const MM_ID_BITS: u32 = 31;
pub const MM_ID_MASK: u64 = (1 << MM_ID_BITS) - 1;
/// `MM_ID_DUMMY`: a free slot.
pub const MM_ID_DUMMY: u64 = 0;
/// `FOLIO_MM_IDS_LOCK_BIT`: the bit spinlock over the large mapcount and
/// the slots (top bit of slot 0's id).
pub const FOLIO_MM_IDS_LOCK_BIT: u64 = 1 << MM_ID_BITS;
/// `FOLIO_MM_IDS_SHARED_BIT`: "maybe mapped shared" (top bit of slot 1's).
pub const FOLIO_MM_IDS_SHARED_BIT: u64 = 1 << (2 * MM_ID_BITS + 1);

/// `folio_mm_id`: the id slot `i` of an `_mm_ids` word holds
/// ([`MM_ID_DUMMY`] if free).
#[inline]
pub fn mm_id_of(ids: u64, i: usize) -> u64 {
    (ids >> (32 * i)) & MM_ID_MASK
}

/// Two -1-based slot mapcounts in one word, slot 0 in the low half.
#[inline]
pub fn pack_mm_id_mapcounts(m: [i32; 2]) -> u64 {
    (m[0] as u32 as u64) | ((m[1] as u32 as u64) << 32)
}

#[inline]
pub fn unpack_mm_id_mapcounts(w: u64) -> [i32; 2] {
    [w as u32 as i32, (w >> 32) as u32 as i32]
}

impl FolioCounters<'_> {
    /// `prep_compound_head`'s part for `CONFIG_MM_ID`: both slots free,
    /// their mapcounts -1, mapped exclusively.
    pub fn init_mm_ids(&self) {
        self.mm_ids.store(0, Ordering::Relaxed);
        self.mm_id_mapcount
            .store(pack_mm_id_mapcounts([-1, -1]), Ordering::Relaxed);
    }

    /// The id slot `i` holds ([`MM_ID_DUMMY`] if free), and its mapcount
    /// (-1 based), as read without the lock (for the invariant checker).
    pub fn mm_id_slot(&self, i: usize) -> (u64, i32) {
        let id = mm_id_of(self.mm_ids.load(Ordering::Relaxed), i);
        let counts = unpack_mm_id_mapcounts(self.mm_id_mapcount.load(Ordering::Relaxed));
        (id, counts[i])
    }

    /// `folio_test_large_maybe_mapped_shared`.
    #[inline]
    pub fn maybe_mapped_shared_bit(&self) -> bool {
        self.mm_ids.load(Ordering::Relaxed) & FOLIO_MM_IDS_SHARED_BIT != 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Folio(pub Pfn);

impl Folio {
    #[inline]
    pub fn pfn(self) -> Pfn {
        self.0
    }

    #[inline]
    pub fn head(self, mem: &PhysMem) -> &Page {
        mem.page(self.0)
    }

    #[inline]
    pub fn order(self, mem: &PhysMem) -> u32 {
        self.head(mem).order()
    }

    #[inline]
    pub fn nr_pages(self, mem: &PhysMem) -> u64 {
        1 << self.order(mem)
    }

    #[inline]
    pub fn is_large(self, mem: &PhysMem) -> bool {
        self.head(mem).test(pg::HEAD)
    }

    #[inline]
    pub fn test_anon(self, mem: &PhysMem) -> bool {
        self.head(mem).mapping.load(Ordering::Relaxed) & PAGE_MAPPING_ANON != 0
    }

    #[inline]
    pub fn is_zero(self, mem: &PhysMem) -> bool {
        self.head(mem).test(pg::ZERO)
    }

    #[inline]
    pub fn ref_count(self, mem: &PhysMem) -> i32 {
        self.head(mem).refcount.load(Ordering::Relaxed)
    }

    /// `folio_trylock`: take PG_locked if no one holds it.
    #[inline]
    pub fn trylock(self, mem: &PhysMem) -> bool {
        // Acquire: what the last holder did under the lock is seen.
        self.head(mem).flags.fetch_or(pg::LOCKED, Ordering::Acquire) & pg::LOCKED == 0
    }

    /// `folio_unlock`.
    #[inline]
    pub fn unlock(self, mem: &PhysMem) {
        // Release: what was done under the lock is seen by the next holder.
        let old = self
            .head(mem)
            .flags
            .fetch_and(!pg::LOCKED, Ordering::Release);
        debug_assert!(old & pg::LOCKED != 0, "folio {:#x} unlocked twice", self.0);
    }

    /// `folio_nid`: the node the folio's memory is on.
    #[inline]
    pub fn nid(self) -> usize {
        PhysMem::nid(self.0)
    }

    /// `folio_get`.
    #[inline]
    pub fn get(self, mem: &PhysMem) {
        self.ref_add(mem, 1)
    }

    /// `folio_ref_add`.
    #[inline]
    pub fn ref_add(self, mem: &PhysMem, nr: i32) {
        let old = self.head(mem).refcount.fetch_add(nr, Ordering::Relaxed);
        debug_assert!(
            old > 0,
            "folio {:#x}: reference taken on a free folio",
            self.0
        );
    }

    /// `folio_put`.
    #[inline]
    pub fn put(self, mem: &PhysMem, cpu: usize) {
        self.put_refs(mem, 1, cpu)
    }

    /// `folio_put_refs`: drop `nr` references at once and free the folio when
    /// they were the last ones.
    pub fn put_refs(self, mem: &PhysMem, nr: i32, cpu: usize) {
        if self.ref_sub_and_test(mem, nr) {
            self.free(mem, cpu);
        }
    }

    /// `folio_put` whose last reference frees the folio straight to the
    /// buddy lists (MIGRC's release of a kept source).
    pub fn put_nopcp(self, mem: &PhysMem, cpu: usize) {
        if self.ref_sub_and_test(mem, 1) {
            self.free_to(mem, cpu, false);
        }
    }

    /// `folio_ref_sub_and_test`: drop `nr` references; true if they were
    /// the last (the caller frees the folio).
    #[inline]
    pub fn ref_sub_and_test(self, mem: &PhysMem, nr: i32) -> bool {
        // Release: our earlier accesses to the folio happen before whoever
        // frees it; Acquire on the last drop: we see everyone else's.
        let old = self.head(mem).refcount.fetch_sub(nr, Ordering::AcqRel);
        debug_assert!(
            old >= nr,
            "folio {:#x}: refcount {old} dropped by {nr}",
            self.0
        );
        old == nr
    }

    /// `__folio_put`: the last reference is gone. Off the LRU, then back to
    /// the allocator.
    fn free(self, mem: &PhysMem, cpu: usize) {
        self.free_to(mem, cpu, true)
    }

    /// [`Folio::free`], to the per-CPU lists or straight to the buddy's.
    fn free_to(self, mem: &PhysMem, cpu: usize, use_pcp: bool) {
        let mut lruvec = None;
        mem.page_cache_release(&mut lruvec, self);
        drop(lruvec);
        self.free_frozen_to(mem, cpu, use_pcp);
    }

    /// `free_frozen_pages` of a folio with no references left and off the
    /// LRU (`folios_put_refs` releases a batch of them under one lruvec
    /// lock first).
    pub fn free_frozen(self, mem: &PhysMem, cpu: usize) {
        self.free_frozen_to(mem, cpu, true)
    }

    fn free_frozen_to(self, mem: &PhysMem, cpu: usize, use_pcp: bool) {
        let order = self.order(mem);
        let head = self.head(mem);
        debug_assert!(!head.test(pg::ZERO), "freeing the zero page");
        debug_assert!(
            !head.test(pg::LRU),
            "folio {:#x} freed while on an LRU list",
            self.0
        );
        // free_pages_prepare: an mlock the munlocks missed (a race the
        // kernel tolerates) ends here.
        if head.test_and_clear(pg::MLOCKED) {
            let nr = self.nr_pages(mem);
            mem.mod_node_state(crate::vmstat::NodeStat::NR_MLOCK, -(nr as i64));
            mem.vmstat
                .count(cpu, crate::vmstat::Event::UNEVICTABLE_PGCLEARED, nr);
        }
        if self.test_anon(mem) && order > 1 {
            mem.vmstat.mod_mthp(order, MthpStat::NR_ANON, -1);
            if head.test(pg::PARTIALLY_MAPPED) {
                mem.vmstat
                    .mod_mthp(order, MthpStat::NR_ANON_PARTIALLY_MAPPED, -1);
            }
        }
        mem.free_pages_to(self.0, order, cpu, use_pcp);
    }

    /// The folio-wide counters of a large folio, which live in its first
    /// tail page's descriptor as in the kernel.
    #[inline]
    pub fn counters(self, mem: &PhysMem) -> FolioCounters<'_> {
        debug_assert!(self.is_large(mem), "folio {:#x} has no page[1]", self.0);
        let p1 = mem.page(self.0 + 1);
        // SAFETY: AtomicU32/AtomicI32 and AtomicU64/AtomicI64 have the same
        // size, alignment and bit validity; while the folio is allocated these
        // page[1] fields (free-list links, buddy order) are not used otherwise,
        // and every access to them goes through these typed views.
        let (large_mapcount, entire_mapcount, nr_pages_mapped) = unsafe {
            (
                &*(&p1.lru_next as *const AtomicU32 as *const AtomicI32),
                &*(&p1.lru_prev as *const AtomicU32 as *const AtomicI32),
                &*(&p1.private as *const AtomicU64 as *const AtomicI64),
            )
        };
        // A tail page has no mapping or index of its own: page[1]'s hold
        // the MM-owner slots, as the kernel's folio keeps them in page[1].
        FolioCounters {
            large_mapcount,
            entire_mapcount,
            nr_pages_mapped,
            mm_ids: &p1.mapping,
            mm_id_mapcount: &p1.index,
        }
    }

    /// `folio_mapcount`: how many page-table entries map some page of it.
    pub fn mapcount(self, mem: &PhysMem) -> i32 {
        let head = self.head(mem);
        if self.is_large(mem) {
            self.counters(mem).large_mapcount.load(Ordering::Relaxed) + 1
        } else {
            head.mapcount.load(Ordering::Relaxed) + 1
        }
    }

    #[inline]
    pub fn mapped(self, mem: &PhysMem) -> bool {
        self.mapcount(mem) > 0
    }

    pub fn entire_mapcount(self, mem: &PhysMem) -> i32 {
        if !self.is_large(mem) {
            return 0;
        }
        self.counters(mem).entire_mapcount.load(Ordering::Relaxed) + 1
    }
}

/// `PageAnonExclusive` and friends, per page.
#[inline]
pub fn page_anon_exclusive(mem: &PhysMem, pfn: Pfn) -> bool {
    mem.page(pfn).test(pg::ANON_EXCLUSIVE)
}

#[inline]
pub fn set_page_anon_exclusive(mem: &PhysMem, pfn: Pfn) {
    mem.page(pfn).set(pg::ANON_EXCLUSIVE)
}

#[inline]
pub fn clear_page_anon_exclusive(mem: &PhysMem, pfn: Pfn) {
    mem.page(pfn).clear(pg::ANON_EXCLUSIVE)
}

/// `page_mapcount`: PTE mappings of this page plus PMD mappings of its folio.
pub fn page_mapcount(mem: &PhysMem, pfn: Pfn) -> i32 {
    let folio = mem.page_folio(pfn);
    let mut n = mem.page(pfn).mapcount.load(Ordering::Relaxed) + 1;
    if folio.is_large(mem) {
        n += folio.entire_mapcount(mem);
    }
    n
}

impl PhysMem {
    /// `__folio_alloc` with a nodemask (MPOL_BIND): a folio of `order` on
    /// `nid` or another node of `nodes`, none outside it.
    pub fn folio_alloc_nodemask(
        &self,
        nid: usize,
        order: u32,
        cpu: usize,
        gfp: AllocFlags,
        nodes: u64,
    ) -> Option<Folio> {
        let gfp = AllocFlags {
            comp: true,
            nodes,
            ..gfp
        };
        self.alloc_pages(nid, order, cpu, gfp).map(Folio)
    }

    /// `folio_alloc`: a folio of `order` on `nid` (or a fallback node,
    /// unless `gfp.this_node`); `__GFP_COMP` is implied.
    pub fn folio_alloc(
        &self,
        nid: usize,
        order: u32,
        cpu: usize,
        gfp: AllocFlags,
    ) -> Option<Folio> {
        let gfp = AllocFlags { comp: true, ..gfp };
        self.alloc_pages(nid, order, cpu, gfp).map(Folio)
    }
}
