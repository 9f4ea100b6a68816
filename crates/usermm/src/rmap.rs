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
//!
//! # MM-owner slots (v6.15, `CONFIG_MM_ID`)
//!
//! A large folio also remembers up to two address spaces that map it, each
//! with its count of mappings, and whether it is "maybe mapped shared":
//! set when a second mm takes a slot or an mm finds none free, cleared when
//! one slot holds every mapping again. So a PTE-mapped large folio that
//! fork shared is known to be exclusive again once the child has unmapped
//! it (`__wp_can_reuse_large_anon_folio` reuses it in place), and
//! `folio_maybe_mapped_shared` needs no per-page mapcounts. With three mms
//! at once the third takes no slot and the folio may stay "maybe shared"
//! after the others have gone, as in the kernel. The large mapcount and
//! the slots change together under a bit spinlock in `_mm_ids`
//! ([`LargeMapcountGuard`]); lock-free readers read each word alone.

use crate::mm::interval_tree::AnonVmaWriteGuard;
use crate::mm::{AnonVma, Mm, Vma};
use crate::phys::folio::{
    clear_page_anon_exclusive, mm_id_of, pack_mm_id_mapcounts, set_page_anon_exclusive,
    unpack_mm_id_mapcounts, Folio, FolioCounters, FOLIO_MM_IDS_LOCK_BIT, FOLIO_MM_IDS_SHARED_BIT,
    MM_ID_DUMMY, MM_ID_MASK,
};
use crate::phys::memmap::{pg, PAGE_MAPPING_ANON};
use crate::phys::{Pfn, PhysMem, HPAGE_PMD_ORDER};
use crate::sync::Arc;
use crate::sync::Ordering;
use crate::vmstat::{Event, MthpStat, NodeStat};

/// `anon_vma_prepare`: give the VMA an anon_vma before its first anon folio:
/// a compatible neighbour's, if it has one of its own alone
/// (`find_mergeable_anon_vma`), so that the two may merge later; else a new
/// one. Called with mmap_lock held (for reading, by faults): two faults of
/// one VMA may race, and the OnceLock lets exactly one of them set it.
pub fn anon_vma_prepare<'v>(mm: &Mm, vma: &'v Arc<Vma>) -> &'v Arc<AnonVma> {
    vma.anon_vma.get_or_init(|| {
        let av = find_mergeable_anon_vma(mm, vma).unwrap_or_else(|| AnonVma::new(None));
        anon_vma_chain_link(vma, &av);
        av
    })
}

/// `find_mergeable_anon_vma`: the anon_vma of the VMA just after `vma`, or
/// else of the one just before, if it is compatible and reusable.
fn find_mergeable_anon_vma(mm: &Mm, vma: &Vma) -> Option<Arc<AnonVma>> {
    let guard = crate::sync::epoch::pin();
    let tree = mm.vma_tree(&guard);
    let next = tree.next_vma(vma.end()).filter(|n| n.start() == vma.end());
    if let Some(av) = next.and_then(|n| reusable_anon_vma(n, vma, n)) {
        return Some(av);
    }
    let prev = tree.prev_vma(vma.start())?;
    reusable_anon_vma(prev, prev, vma)
}

/// `reusable_anon_vma`: `old`'s anon_vma, if `a` and `b` (one of them `old`)
/// could share one and `old` is chained to it alone (`list_is_singular`:
/// no parents whose folios it may still share).
fn reusable_anon_vma(old: &Vma, a: &Vma, b: &Vma) -> Option<Arc<AnonVma>> {
    if !anon_vma_compatible(a, b) {
        return None;
    }
    let av = old.anon_vma()?;
    (old.anon_vma_chain.lock().len() == 1).then(|| av.clone())
}

/// `anon_vma_compatible`: `a` just before `b`, with flags that differ at
/// most in access rights, and linear page offsets (the model's VMAs are
/// anonymous, with the default memory policy).
fn anon_vma_compatible(a: &Vma, b: &Vma) -> bool {
    use crate::mm::vma::VM_ACCESS_FLAGS;
    a.end() == b.start()
        && (a.flags() ^ b.flags()) & !VM_ACCESS_FLAGS == 0
        && b.pgoff() == a.pgoff() + ((b.start() - a.start()) >> crate::phys::PAGE_SHIFT)
}

fn anon_vma_chain_link(vma: &Arc<Vma>, av: &Arc<AnonVma>) {
    let avc = av.interval_tree_insert(vma, &mut av.lock_write());
    vma.anon_vma_chain.lock().push(avc);
}

/// `lock_anon_vma_root`: hold `av`'s family lock, keeping the one `held` if
/// it is the same family's (the anon_vmas of one chain usually are).
fn lock_anon_vma_root<'g>(
    held: &'g mut Option<AnonVmaWriteGuard>,
    av: &AnonVma,
) -> &'g mut AnonVmaWriteGuard {
    if !held.as_ref().is_some_and(|g| av.is_locked_by(g)) {
        // The kernel too unlocks the old root before it locks the new.
        *held = None;
        *held = Some(av.lock_write());
    }
    held.get_or_insert_with(|| unreachable!("locked above"))
}

/// Chain `dst` to every anon_vma `src` is chained to, oldest first.
fn anon_vma_chain_copy(dst: &Arc<Vma>, src: &Vma) {
    let chain = src.anon_vma_chain.lock();
    let mut links = dst.anon_vma_chain.lock();
    links.reserve(chain.len() + 1);
    let mut held = None;
    for c in chain.iter() {
        let g = lock_anon_vma_root(&mut held, &c.anon_vma);
        links.push(c.anon_vma.interval_tree_insert(dst, g));
    }
}

/// `anon_vma_clone`: chain `dst` to every anon_vma `src` is chained to, and
/// share its anon_vma (a split, or the first half of a fork).
pub fn anon_vma_clone(dst: &Arc<Vma>, src: &Vma) {
    anon_vma_chain_copy(dst, src);
    if let Some(av) = src.anon_vma() {
        let _ = dst.anon_vma.set(av.clone());
    }
}

/// `anon_vma_fork`: the child's VMA is chained to the parent's anon_vmas
/// (so the folios they share are found from either side) and gets an
/// anon_vma of its own, a child of the parent's, for the folios it will
/// allocate itself. mmap_lock of both mms held for writing.
pub fn anon_vma_fork(child: &Arc<Vma>, parent: &Vma) {
    let Some(pav) = parent.anon_vma() else {
        return;
    };
    anon_vma_chain_copy(child, parent);
    let av = AnonVma::new(Some(pav.clone()));
    anon_vma_chain_link(child, &av);
    let _ = child.anon_vma.set(av);
}

/// How many links ahead [`unlink_anon_vmas`] prefetches.
const UNLINK_PREFETCH: usize = 8;

/// `unlink_anon_vmas`: the VMA is gone; take it out of every anon_vma's
/// tree, O(log n) each, under the family's lock taken once; the references
/// the links held go after the lock, as the kernel frees its chains and
/// puts its anon_vmas after unlocking.
pub fn unlink_anon_vmas(vma: &Vma) {
    let chain = std::mem::take(&mut *vma.anon_vma_chain.lock());
    let mut weak = Vec::with_capacity(chain.len());
    let mut held = None;
    for (k, avc) in chain.iter().enumerate() {
        let g = lock_anon_vma_root(&mut held, &avc.anon_vma);
        if let Some(ahead) = chain.get(k + 3 * UNLINK_PREFETCH) {
            ahead.prefetch_anon_vma();
        }
        if let Some(ahead) = chain.get(k + 2 * UNLINK_PREFETCH) {
            ahead.prefetch_tree(g);
        }
        if let Some(ahead) = chain.get(k + UNLINK_PREFETCH) {
            ahead.prefetch_slot(vma, g);
        }
        let was = avc.unlink(vma, g);
        debug_assert!(
            was.is_some(),
            "{vma:?} was not in anon_vma {}",
            avc.anon_vma.id
        );
        weak.extend(was);
    }
    drop(held);
    drop(weak);
    // The anon_vmas themselves go after a grace period (the kernel frees
    // them SLAB_TYPESAFE_BY_RCU): an rmap walker that saw a folio mapped
    // under an epoch pin may still be reading its anon_vma
    // ([`folio_get_anon_vma`]).
    crate::rcu::call_rcu(move || drop(chain));
}

/// `rmap_walk_anon`: every (VMA, address) where page `pfn` of an anon folio
/// may be mapped: the VMAs chained to the folio's anon_vma whose linear
/// range covers the page's index.
pub fn rmap_walk_anon(mem: &PhysMem, folio: Folio, pfn: Pfn) -> Vec<(Arc<Vma>, u64)> {
    let Some(av) = folio_anon_vma(mem, folio) else {
        return Vec::new();
    };
    let pgoff = folio_page_pgoff(mem, folio, pfn);
    av.vmas_in(pgoff, pgoff)
        .into_iter()
        .filter_map(|v| v.address_of(pgoff).map(|a| (v, a)))
        .collect()
}

/// `folio_anon_vma`: the anon_vma an anon folio is attached to.
pub fn folio_anon_vma(mem: &PhysMem, folio: Folio) -> Option<&AnonVma> {
    let mapping = folio.head(mem).mapping.load(Ordering::Relaxed);
    if mapping & PAGE_MAPPING_ANON == 0 {
        return None;
    }
    // SAFETY: a mapped anon folio's mapping points to an AnonVma kept alive
    // by the VMAs chained to it (each holds an Arc in its anon_vma_chain),
    // and those outlive the folio's mappings; callers look with the mapping
    // stable (page tables locked, or the machine quiescent).
    Some(unsafe { &*((mapping & !PAGE_MAPPING_ANON) as *const AnonVma) })
}

/// `folio_get_anon_vma`: a reference to an anon folio's anon_vma, which
/// keeps it (and the rmap walks it allows) valid after the folio's last
/// mapping is gone: migration holds one from unmap to remap, reclaim while
/// it looks at a folio. None if the folio is not mapped.
///
/// As the kernel does under RCU: the mapping is read under an epoch pin,
/// then the folio is seen mapped. A mapping means a VMA still chained to
/// the anon_vma (a zap removes the mapping before the VMA is unlinked),
/// and an unlinked VMA's references to its anon_vmas are dropped only
/// after a grace period ([`unlink_anon_vmas`]): so the anon_vma is alive,
/// with a strong count above zero, until the pin is dropped.
pub fn folio_get_anon_vma(mem: &PhysMem, folio: Folio) -> Option<Arc<AnonVma>> {
    // The caller holds the folio (a reference, or the lock of a table
    // that maps it): it cannot be freed and reused as another's meanwhile.
    debug_assert!(
        folio.ref_count(mem) > 0,
        "folio_get_anon_vma of a free folio"
    );
    let _pin = crate::sync::epoch::pin();
    let av = folio_anon_vma(mem, folio)? as *const AnonVma;
    if !folio.mapped(mem) {
        return None;
    }
    // SAFETY: `av` came from `Arc::as_ptr` of a live Arc (folio_set_anon,
    // folio_move_anon_rmap), and by the argument above it is alive and
    // strongly held until `_pin` goes: one more strong count, then an Arc
    // owning it.
    unsafe {
        Arc::increment_strong_count(av);
        Some(Arc::from_raw(av))
    }
}

/// The linear index of page `pfn` of an anon folio (`page_pgoff`).
pub fn folio_page_pgoff(mem: &PhysMem, folio: Folio, pfn: Pfn) -> u64 {
    folio.head(mem).index.load(Ordering::Relaxed) + (pfn - folio.pfn())
}

/// Added to `_nr_pages_mapped` while a PMD maps the whole folio.
pub const ENTIRELY_MAPPED: i64 = 0x80_0000;
pub const FOLIO_PAGES_MAPPED: i64 = ENTIRELY_MAPPED - 1;

/// `__folio_set_anon`: attach a new folio to the VMA's anon_vma.
fn folio_set_anon(mem: &PhysMem, folio: Folio, vma: &Vma, addr: u64) {
    let anon_vma = vma
        .anon_vma()
        .expect("anon_vma_prepare before mapping anon folios");
    let ptr = crate::sync::Arc::as_ptr(anon_vma) as u64;
    let head = folio.head(mem);
    head.mapping
        .store(ptr | PAGE_MAPPING_ANON, Ordering::Relaxed);
    head.index
        .store(vma.linear_page_index(addr), Ordering::Relaxed);
    head.set(pg::SWAPBACKED);
}

/// `rmap_t`: how a folio is being mapped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmapFlags(u32);

impl RmapFlags {
    pub const NONE: RmapFlags = RmapFlags(0);
    /// `RMAP_EXCLUSIVE`: the pages are PageAnonExclusive to this mapping.
    pub const EXCLUSIVE: RmapFlags = RmapFlags(1 << 0);

    #[inline]
    pub const fn contains(self, other: RmapFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// `folio_lock_large_mapcount` held: the large mapcount and the MM-owner
/// slots as they were when it was taken, written back (and the lock
/// dropped, Release) when it is dropped.
struct LargeMapcountGuard<'a> {
    c: FolioCounters<'a>,
    ids: u64,
    mapcount: [i32; 2],
    /// `_large_mapcount`, -1 based.
    large: i32,
}

/// `folio_lock_large_mapcount`: spin on the lock bit of `_mm_ids`.
fn folio_lock_large_mapcount(c: FolioCounters<'_>) -> LargeMapcountGuard<'_> {
    loop {
        // Acquire: what the last holder wrote before its Release store.
        let ids = c.mm_ids.fetch_or(FOLIO_MM_IDS_LOCK_BIT, Ordering::Acquire);
        if ids & FOLIO_MM_IDS_LOCK_BIT == 0 {
            let mapcount = unpack_mm_id_mapcounts(c.mm_id_mapcount.load(Ordering::Relaxed));
            let large = c.large_mapcount.load(Ordering::Relaxed);
            return LargeMapcountGuard {
                c,
                ids,
                mapcount,
                large,
            };
        }
        crate::sync::spin_until(|| c.mm_ids.load(Ordering::Relaxed) & FOLIO_MM_IDS_LOCK_BIT == 0);
    }
}

impl LargeMapcountGuard<'_> {
    /// `folio_mm_id`.
    fn mm_id(&self, i: usize) -> u64 {
        mm_id_of(self.ids, i)
    }

    /// `folio_set_mm_id`.
    fn set_mm_id(&mut self, i: usize, id: u64) {
        self.ids = (self.ids & !(MM_ID_MASK << (32 * i))) | (id << (32 * i));
    }

    fn set_shared(&mut self, shared: bool) {
        if shared {
            self.ids |= FOLIO_MM_IDS_SHARED_BIT;
        } else {
            self.ids &= !FOLIO_MM_IDS_SHARED_BIT;
        }
    }

    /// The slot `mm_id` holds.
    fn slot_of(&self, mm_id: u64) -> Option<usize> {
        (0..2).find(|&i| self.mm_id(i) == mm_id)
    }

    /// `__folio_large_mapcount_sanity_checks` (the mm id is checked by
    /// [`slot_id`]).
    fn sanity_checks(&self, diff: i32) {
        debug_assert!(diff > 0, "mapcount change of {diff}");
        for i in 0..2 {
            debug_assert_eq!(
                self.mm_id(i) == MM_ID_DUMMY,
                self.mapcount[i] == -1,
                "slot {i}: id {} with mapcount {}",
                self.mm_id(i),
                self.mapcount[i]
            );
            debug_assert!(self.mapcount[i] >= -1);
        }
    }
}

impl Drop for LargeMapcountGuard<'_> {
    /// `folio_unlock_large_mapcount`: the counts first, then the ids word
    /// without the lock bit (Release: the holder's writes before it).
    fn drop(&mut self) {
        self.c.large_mapcount.store(self.large, Ordering::Relaxed);
        self.c
            .mm_id_mapcount
            .store(pack_mm_id_mapcounts(self.mapcount), Ordering::Relaxed);
        self.c
            .mm_ids
            .store(self.ids & !FOLIO_MM_IDS_LOCK_BIT, Ordering::Release);
    }
}

/// The id an mm's mappings are counted under in the slots
/// (`mm->mm_id`). The kernel allocates them from an IDA and reuses them
/// once an mm is freed; the model's mm ids are never reused.
#[inline]
fn slot_id(mm_id: u64) -> u64 {
    debug_assert!(
        mm_id != MM_ID_DUMMY && mm_id <= MM_ID_MASK,
        "mm id {mm_id} does not fit a slot"
    );
    mm_id & MM_ID_MASK
}

/// `folio_set_large_mapcount`: a new folio's first `mapcount` mappings,
/// all `mm_id`'s. No lock: no one else can see the folio yet, as in the
/// kernel.
fn folio_set_large_mapcount(mem: &PhysMem, folio: Folio, mapcount: i32, mm_id: u64) {
    let c = folio.counters(mem);
    debug_assert_eq!(
        c.mm_ids.load(Ordering::Relaxed),
        0,
        "a new folio's slots are free"
    );
    c.large_mapcount.store(mapcount - 1, Ordering::Relaxed);
    c.mm_id_mapcount
        .store(pack_mm_id_mapcounts([mapcount - 1, -1]), Ordering::Relaxed);
    c.mm_ids.store(slot_id(mm_id), Ordering::Relaxed);
}

/// `folio_add_large_mapcount`: `diff` more mappings by `mm_id`.
fn folio_add_large_mapcount(mem: &PhysMem, folio: Folio, diff: i32, mm_id: u64) {
    let id = slot_id(mm_id);
    let mut g = folio_lock_large_mapcount(folio.counters(mem));
    g.sanity_checks(diff);
    g.large += diff;
    let new = g.large;
    if let Some(i) = g.slot_of(id) {
        g.mapcount[i] += diff;
    } else if let Some(i) = g.slot_of(MM_ID_DUMMY) {
        g.set_mm_id(i, id);
        g.mapcount[i] = diff - 1;
        // Slot 0 free but mappings already: they are an mm's without a
        // slot. Slot 1 taken: slot 0's mm maps it too.
        if i == 1 || new != diff - 1 {
            g.set_shared(true);
        }
    }
    // No slot free: the mappings are counted in the total alone, and the
    // bit is already set (two other mms hold the slots).
}

/// `folio_sub_return_large_mapcount`: `diff` fewer mappings by `mm_id`;
/// returns the large mapcount after (-1 based).
fn folio_sub_large_mapcount(mem: &PhysMem, folio: Folio, diff: i32, mm_id: u64) -> i32 {
    let id = slot_id(mm_id);
    let mut g = folio_lock_large_mapcount(folio.counters(mem));
    g.sanity_checks(diff);
    g.large -= diff;
    let new = g.large;
    if let Some(i) = g.slot_of(id) {
        g.mapcount[i] -= diff;
        if g.mapcount[i] >= 0 {
            return new;
        }
        // Some mappings were counted before the mm had the slot: free it.
        g.mapcount[i] = -1;
        g.set_mm_id(i, MM_ID_DUMMY);
    }
    // One slot holds every mapping (or none is left): exclusive.
    if g.mapcount.contains(&new) {
        g.set_shared(false);
    }
    new
}

/// Run `f` with the folio's "maybe mapped shared" bit and its mapcount
/// as they stand under `folio_lock_large_mapcount`, which no rmap change
/// can pass (the stable recheck of `__wp_can_reuse_large_anon_folio`).
pub fn with_large_mapcount_locked<R>(
    mem: &PhysMem,
    folio: Folio,
    f: impl FnOnce(bool, i32) -> R,
) -> R {
    let g = folio_lock_large_mapcount(folio.counters(mem));
    f(g.ids & FOLIO_MM_IDS_SHARED_BIT != 0, g.large + 1)
}

/// `folio_maybe_mapped_shared`: might another address space map some page
/// of the folio? For a small folio, whether it is mapped twice; for a large
/// one, the MM-owner slots' bit, unless it is mapped once at most.
pub fn folio_maybe_mapped_shared(mem: &PhysMem, folio: Folio) -> bool {
    let mapcount = folio.mapcount(mem);
    if !folio.is_large(mem) {
        return mapcount > 1;
    }
    mapcount > 1 && folio.counters(mem).maybe_mapped_shared_bit()
}

/// `folio_add_new_anon_rmap`: map a folio just allocated by a fault, all of
/// it: by one PMD if it is PMD-sized (`folio_test_pmd_mappable`), else by
/// one PTE per page.
pub fn folio_add_new_anon_rmap(
    mem: &PhysMem,
    folio: Folio,
    vma: &Vma,
    addr: u64,
    flags: RmapFlags,
) {
    folio_set_anon(mem, folio, vma, addr);
    let nr = folio.nr_pages(mem) as i32;
    let pmd = folio.order(mem) == crate::phys::HPAGE_PMD_ORDER;
    let exclusive = flags.contains(RmapFlags::EXCLUSIVE);
    if !folio.is_large(mem) {
        folio.head(mem).mapcount.store(0, Ordering::Relaxed);
    } else if pmd {
        let head = folio.counters(mem);
        head.entire_mapcount.store(0, Ordering::Relaxed);
        folio_set_large_mapcount(mem, folio, 1, vma.mm_id);
        head.nr_pages_mapped
            .store(ENTIRELY_MAPPED, Ordering::Relaxed);
        mem.mod_node_state(NodeStat::NR_ANON_THPS, nr as i64);
    } else {
        for i in 0..nr as u64 {
            mem.page(folio.pfn() + i)
                .mapcount
                .store(0, Ordering::Relaxed);
        }
        folio_set_large_mapcount(mem, folio, nr, vma.mm_id);
        let head = folio.counters(mem);
        head.nr_pages_mapped.store(nr as i64, Ordering::Relaxed);
    }
    if exclusive {
        // A PMD mapping's flag is its head's alone (folio_add_anon_rmap_pmd).
        let flagged = if pmd { 1 } else { nr as u64 };
        for i in 0..flagged {
            set_page_anon_exclusive(mem, folio.pfn() + i);
        }
    }
    if folio.is_large(mem) {
        mem.vmstat.mod_mthp(folio.order(mem), MthpStat::NR_ANON, 1);
    }
    mem.mod_node_state(NodeStat::NR_ANON_MAPPED, nr as i64);
}

/// `folio_add_anon_rmap_ptes`: `nr` more PTE mappings of pages
/// `page..page+nr` of an anon folio that is already anon, in mm `mm_id`.
pub fn folio_add_anon_rmap_ptes(
    mem: &PhysMem,
    folio: Folio,
    page: Pfn,
    nr: u64,
    mm_id: u64,
    flags: RmapFlags,
) {
    folio_add_anon_rmap_ptes_inner(
        mem,
        folio,
        page,
        nr,
        mm_id,
        flags.contains(RmapFlags::EXCLUSIVE),
    );
}

/// `__folio_add_rmap` for `nr` PTEs, anon or file.
fn folio_add_anon_rmap_ptes_inner(
    mem: &PhysMem,
    folio: Folio,
    page: Pfn,
    nr: u64,
    mm_id: u64,
    exclusive: bool,
) {
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
        folio_add_large_mapcount(mem, folio, nr as i32, mm_id);
        let head = folio.counters(mem);
        let before = head.nr_pages_mapped.fetch_add(first, Ordering::Relaxed);
        if before >= ENTIRELY_MAPPED {
            first = 0; // already counted as mapped through the PMD
        }
    }
    mem.mod_node_state(mapped_stat(mem, folio), first);
}

/// `folio_try_dup_anon_rmap_ptes` (fork): the child maps `page..page+nr`
/// too. Each page stops being exclusive to one process; the per-page
/// loop raises `_mapcount`, the folio-wide counter moves once. The kernel's
/// version refuses (EBUSY) when the folio may be pinned for DMA and the
/// pages must be copied instead; the model has no GUP pins, so the dup
/// always succeeds. `dst_mm_id` is the child's. Called under the parent's
/// PTE lock.
pub fn folio_dup_anon_rmap_ptes(mem: &PhysMem, folio: Folio, page: Pfn, nr: u64, dst_mm_id: u64) {
    debug_assert!(
        page >= folio.pfn() && page + nr <= folio.pfn() + folio.nr_pages(mem),
        "rmap batch leaves its folio"
    );
    for (p, d) in (page..).zip(mem.pages(page, nr)) {
        // ClearPageAnonExclusive only where set: no write to a shared line
        // that does not change it.
        if d.test(pg::ANON_EXCLUSIVE) {
            d.clear(pg::ANON_EXCLUSIVE);
        }
        let old = d.mapcount.fetch_add(1, Ordering::Relaxed);
        debug_assert!(old >= 0, "page {p:#x}: dup of an unmapped page");
    }
    if folio.is_large(mem) {
        folio_add_large_mapcount(mem, folio, nr as i32, dst_mm_id);
    }
}

/// `folio_dup_file_rmap_ptes` (fork): the child maps `page..page+nr` of a
/// page-cache folio too.
pub fn folio_dup_file_rmap_ptes(mem: &PhysMem, folio: Folio, page: Pfn, nr: u64, dst_mm_id: u64) {
    for (p, d) in (page..).zip(mem.pages(page, nr)) {
        let old = d.mapcount.fetch_add(1, Ordering::Relaxed);
        debug_assert!(old >= 0, "page {p:#x}: dup of an unmapped page");
    }
    if folio.is_large(mem) {
        folio_add_large_mapcount(mem, folio, nr as i32, dst_mm_id);
    }
}

/// `folio_try_share_anon_rmap_pte` / `_pmd`, for an unmap that leaves a
/// migration entry: page `page` (a PMD mapping's head) stops being
/// PageAnonExclusive, its exclusivity moving into the entry's kind;
/// returns whether it was. The model has no GUP pins, so sharing never
/// fails.
pub fn folio_try_share_anon_rmap(mem: &PhysMem, page: Pfn) -> bool {
    let exclusive = crate::phys::folio::page_anon_exclusive(mem, page);
    if exclusive {
        clear_page_anon_exclusive(mem, page);
    }
    exclusive
}

/// `folio_try_dup_anon_rmap_pmd` (fork of a PMD-mapped THP): the head's
/// PageAnonExclusive, the PMD mapping's, goes. `dst_mm_id` is the child's.
pub fn folio_dup_anon_rmap_pmd(mem: &PhysMem, folio: Folio, dst_mm_id: u64) {
    clear_page_anon_exclusive(mem, folio.pfn());
    let head = folio.counters(mem);
    let old = head.entire_mapcount.fetch_add(1, Ordering::Relaxed);
    debug_assert!(old >= 0, "folio {:#x}: dup of an unmapped PMD", folio.pfn());
    folio_add_large_mapcount(mem, folio, 1, dst_mm_id);
}

/// `folio_remove_rmap_ptes`: `nr` PTE mappings of `page..page+nr` in mm
/// `mm_id` are gone.
pub fn folio_remove_rmap_ptes(
    mem: &PhysMem,
    folio: Folio,
    page: Pfn,
    nr: u64,
    mm_id: u64,
    cpu: usize,
) {
    debug_assert!(
        page >= folio.pfn() && page + nr <= folio.pfn() + folio.nr_pages(mem),
        "rmap batch leaves its folio"
    );
    let mut last = 0;
    for (p, d) in (page..).zip(mem.pages(page, nr)) {
        let old = d.mapcount.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(old >= 0, "page {p:#x}: mapcount underflow");
        if old == 0 {
            last += 1;
        }
    }
    let mut unmapped = last;
    if folio.is_large(mem) {
        let lm = folio_sub_large_mapcount(mem, folio, nr as i32, mm_id);
        let head = folio.counters(mem);
        let mapped = head.nr_pages_mapped.fetch_sub(last, Ordering::Relaxed) - last;
        if mapped >= ENTIRELY_MAPPED {
            unmapped = 0;
        }
        // Some pages left mapped, some not: queue for deferred split.
        if folio.test_anon(mem)
            && lm >= 0
            && mapped & FOLIO_PAGES_MAPPED < folio.nr_pages(mem) as i64
            && mapped < ENTIRELY_MAPPED
        {
            deferred_split_folio(mem, folio, cpu);
        }
    }
    mem.mod_node_state(mapped_stat(mem, folio), -unmapped);
}

/// The node statistic that counts a folio's mapped pages
/// (`__folio_mod_stat`): `NR_ANON_MAPPED` or `NR_FILE_MAPPED`.
#[inline]
fn mapped_stat(mem: &PhysMem, folio: Folio) -> NodeStat {
    if folio.test_anon(mem) {
        NodeStat::NR_ANON_MAPPED
    } else {
        NodeStat::NR_FILE_MAPPED
    }
}

/// The statistic of a folio's PMD mappings: `NR_ANON_THPS`,
/// `NR_SHMEM_PMDMAPPED` (a swap-backed page-cache folio) or
/// `NR_FILE_PMDMAPPED`.
#[inline]
fn pmd_mapped_stat(mem: &PhysMem, folio: Folio) -> NodeStat {
    if folio.test_anon(mem) {
        NodeStat::NR_ANON_THPS
    } else if folio.head(mem).test(crate::phys::pg::SWAPBACKED) {
        NodeStat::NR_SHMEM_PMDMAPPED
    } else {
        NodeStat::NR_FILE_PMDMAPPED
    }
}

/// `folio_add_file_rmap_ptes`: `nr` PTE mappings of pages
/// `page..page+nr` of a page-cache folio, in mm `mm_id` (fault-around,
/// a file fault, fork's copy).
pub fn folio_add_file_rmap_ptes(mem: &PhysMem, folio: Folio, page: Pfn, nr: u64, mm_id: u64) {
    debug_assert!(!folio.test_anon(mem), "file rmap of an anon folio");
    folio_add_anon_rmap_ptes_inner(mem, folio, page, nr, mm_id, false);
}

/// `folio_add_file_rmap_pmd` (`do_set_pmd`): one PMD maps the whole
/// PMD-sized page-cache folio.
pub fn folio_add_file_rmap_pmd(mem: &PhysMem, folio: Folio, mm_id: u64) {
    debug_assert!(!folio.test_anon(mem), "file rmap of an anon folio");
    folio_add_rmap_pmd_inner(mem, folio, mm_id);
}

/// `folio_add_anon_rmap_pmd`. A PMD mapping's PageAnonExclusive lives on
/// the head page alone, as the kernel keeps it; splitting the PMD hands it
/// to every page ([`folio_split_pmd_mapping`]).
pub fn folio_add_anon_rmap_pmd(mem: &PhysMem, folio: Folio, mm_id: u64, flags: RmapFlags) {
    folio_add_rmap_pmd_inner(mem, folio, mm_id);
    if flags.contains(RmapFlags::EXCLUSIVE) {
        set_page_anon_exclusive(mem, folio.pfn());
    }
}

/// `__folio_add_rmap` for a PMD, anon or file.
fn folio_add_rmap_pmd_inner(mem: &PhysMem, folio: Folio, mm_id: u64) {
    folio_add_large_mapcount(mem, folio, 1, mm_id);
    let head = folio.counters(mem);
    let nr = folio.nr_pages(mem) as i64;
    if head.entire_mapcount.fetch_add(1, Ordering::Relaxed) == -1 {
        let before = head
            .nr_pages_mapped
            .fetch_add(ENTIRELY_MAPPED, Ordering::Relaxed);
        mem.mod_node_state(mapped_stat(mem, folio), nr - (before & FOLIO_PAGES_MAPPED));
        mem.mod_node_state(pmd_mapped_stat(mem, folio), nr);
    }
}

/// `folio_remove_rmap_pmd`: mm `mm_id`'s PMD mapping is gone.
pub fn folio_remove_rmap_pmd(mem: &PhysMem, folio: Folio, mm_id: u64, cpu: usize) {
    folio_sub_large_mapcount(mem, folio, 1, mm_id);
    let head = folio.counters(mem);
    let nr = folio.nr_pages(mem) as i64;
    if head.entire_mapcount.fetch_sub(1, Ordering::Relaxed) == 0 {
        let after = head
            .nr_pages_mapped
            .fetch_sub(ENTIRELY_MAPPED, Ordering::Relaxed)
            - ENTIRELY_MAPPED;
        let unmapped = nr - after;
        mem.mod_node_state(mapped_stat(mem, folio), -unmapped);
        mem.mod_node_state(pmd_mapped_stat(mem, folio), -nr);
        // Partially mapped: some page is no longer mapped at all, and some
        // still is (by a PTE). A PMD split that maps every page by a PTE
        // first unmaps nothing, and queues nothing.
        if unmapped > 0 && unmapped < nr && folio.test_anon(mem) {
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
/// mappings, all mm `mm_id`'s. Called with the PMD lock held.
pub fn folio_split_pmd_mapping(mem: &PhysMem, folio: Folio, mm_id: u64, cpu: usize) {
    // The PMD mapping's PageAnonExclusive (the head's) goes to every page,
    // as __split_huge_pmd_locked maps the PTEs with RMAP_EXCLUSIVE.
    let flags = if crate::phys::folio::page_anon_exclusive(mem, folio.pfn()) {
        RmapFlags::EXCLUSIVE
    } else {
        RmapFlags::NONE
    };
    folio_add_anon_rmap_ptes(mem, folio, folio.pfn(), folio.nr_pages(mem), mm_id, flags);
    folio_remove_rmap_pmd(mem, folio, mm_id, cpu);
}

/// `folio_move_anon_rmap`: a folio this VMA alone maps now belongs to the
/// VMA's own anon_vma (it may have come from an ancestor's), so that rmap
/// walks need not look beyond it. Called with the mapping's lock held.
pub fn folio_move_anon_rmap(mem: &PhysMem, folio: Folio, vma: &Vma) {
    let Some(anon_vma) = vma.anon_vma() else {
        debug_assert!(false, "{vma:?} maps an anon folio without an anon_vma");
        return;
    };
    let ptr = crate::sync::Arc::as_ptr(anon_vma) as u64;
    folio
        .head(mem)
        .mapping
        .store(ptr | PAGE_MAPPING_ANON, Ordering::Relaxed);
}
